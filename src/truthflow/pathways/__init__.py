"""Two Pathways to Truthfulness: one module per idea, in the order of workflow/rules/pathways.smk: labels
(correct / echo / refusal) -> spans (E_Q, E_A) -> extract (the knockout and experiment states, written as
`activations` lays them out) -> probes (cross-fitted probes, ΔP) -> check (falsification) -> plots. Kept empty
of imports on purpose: a rule's code inputs are the modules it imports, and importing one module of this
package must not pull in the others."""
