import contextlib
import time

import numpy as np
import polars as pl

from truthflow import runlog, validate
from truthflow.generation import build_prompt, encode_prompt
from truthflow.models import load_model
from truthflow.pathways import interventions as iv
from truthflow.pathways.experiments import experiment_layer
from truthflow.pathways.saliency import saliency


def main(sm):
    cfg = sm.params.experiments
    name = f"{sm.wildcards.model}/{sm.wildcards.dataset}"
    samples = validate.read_parquet(
        sm.input.samples, ["id", "correct", "eq_positions", "ea_positions", "probe_position"]
    )
    labels = validate.read_parquet(sm.input.labels, ["id", "prompt_ids", "answer_ids", "answer"])
    questions = validate.read_parquet(sm.input.data, ["id", "question"])
    auc = validate.read_parquet(sm.input.auc, ["layer", "auc", "status"])
    table = samples.join(labels, on="id", how="left").join(
        questions.select("id", "question"), on="id", how="left"
    )
    lm = load_model(
        sm.input.model,
        sm.params.dtype,
        gpus=sm.resources.gpu,
        threads=sm.resources.get("torch_threads") or sm.threads,
    )
    n_layers, hidden = lm.info["n_layers"], lm.info["hidden_size"]
    layer, why = experiment_layer(cfg["layer"], auc, n_layers, sm.wildcards.model)
    print(f"{name}: experiments at layer {layer} ({why})", flush=True)
    n = table.height
    bs = sm.resources.batch_size
    ids = table["id"].to_list()
    seqs = [list(p) + list(a) for p, a in zip(table["prompt_ids"], table["answer_ids"], strict=True)]
    prompt_lens = [len(p) for p in table["prompt_ids"]]
    eq = table["eq_positions"].to_list()
    ea = table["ea_positions"].to_list()
    probe = table["probe_position"].to_list()
    ctrl0 = (
        [c[0] if c else None for c in table["control_positions"].to_list()]
        if "control_positions" in table.columns
        else [None] * n
    )
    matched = table["control_matched"].to_list() if "control_matched" in table.columns else [False] * n
    ctrl0 = [c if m and c else None for c, m in zip(ctrl0, matched, strict=True)]
    factors = [float(f) for f in cfg["pr_factors"]]
    scores = pl.DataFrame({"id": ids, "layer": [layer] * n}, schema={"id": pl.String, "layer": pl.Int64})
    timing: dict[str, float] = {}

    @contextlib.contextmanager
    def timed(key):
        t0 = time.perf_counter()
        yield
        timing[key] = dt = time.perf_counter() - t0
        print(f"{name}: {key}: {n} samples in {dt:.1f} s ({n / max(dt, 1e-9):.1f} samples/s)", flush=True)

    shape = (n, hidden)
    with (
        runlog.atomic(sm.output.patch) as t_patch,
        runlog.atomic(sm.output.answer_only) as t_ao,
        runlog.atomic(sm.output.pr) as t_pr,
    ):
        # an experiment switched off writes a zero-row array (its rows are then absent from the tables)
        n_patch = n if cfg["patching"] else 0
        patch = np.lib.format.open_memmap(t_patch, "w+", np.float16, (2, n_patch, hidden))
        ao = np.lib.format.open_memmap(t_ao, "w+", np.float16, shape if cfg["answer_only"] else (0, hidden))
        n_pr = n if cfg["detection"] else 0
        pr = np.lib.format.open_memmap(t_pr, "w+", np.float16, (2 * len(factors), n_pr, hidden))
        if n_patch:
            inputs = iv.patched_inputs(ids, seqs, eq, ctrl0, cfg["patch_seed"])
            with timed("patching (E_Q, control)"):
                iv.resid_conditions(
                    lm,
                    seqs,
                    probe,
                    layer,
                    [{"seqs": inputs["target"]}, {"seqs": inputs["control"]}],
                    bs,
                    desc=f"patching {name}",
                    outs=[patch[0], patch[1]],
                )
            scores = scores.with_columns(
                pl.Series("donor", inputs["donor"], dtype=pl.String),
                pl.Series("donor_length_matched", inputs["length_matched"], dtype=pl.Boolean),
                pl.Series("patch_control_matched", [c is not None for c in ctrl0], dtype=pl.Boolean),
            )
        if n and cfg["answer_only"]:
            bos = lm.tokenizer.bos_token_id
            bos = bos if bos is not None and seqs[0][:1] == [bos] else None
            ao_seqs, ao_pos = iv.answer_only_inputs(seqs, prompt_lens, probe, bos)
            with timed("answer only"):
                iv.resid_at_layer(lm, ao_seqs, ao_pos, layer, bs, desc=f"answer only {name}", out=ao)
        if n_pr:
            # PR edges: every answer token (query) attending an E_Q token (key)
            answer_pos = [list(range(start, p + 1)) for start, p in zip(prompt_lens, probe, strict=True)]
            conds = [{"edges": (answer_pos, eq), "factor": fac} for f in factors for fac in (f, 1.0 / f)]
            with timed(f"PR ({len(conds)} reweightings)"):
                iv.resid_conditions(
                    lm,
                    seqs,
                    probe,
                    layer,
                    conds,
                    bs,
                    desc=f"PR {name}",
                    outs=[pr[c] for c in range(len(conds))],
                )
            with timed("logits"):
                mean, low = iv.answer_logprobs(lm, seqs, ea, bs, desc=f"logits {name}")
            prompts = [
                encode_prompt(
                    lm.tokenizer,
                    build_prompt(
                        lm.tokenizer,
                        iv.P_TRUE_TEMPLATE.format(question=q, answer=a.strip()),
                        sm.params.chat,
                        instruction="",
                        template_kwargs=sm.params.chat_template_kwargs,
                    ),
                    sm.params.chat,
                )
                for q, a in zip(table["question"], table["answer"], strict=True)
            ]
            with timed("P(True)"):
                pt = iv.p_true(lm, prompts, bs, desc=f"P(True) {name}")
            scores = scores.with_columns(
                pl.Series("p_true", pt), pl.Series("logit_mean", mean), pl.Series("logit_min", low)
            )
        if n and cfg["saliency"]:
            with timed("saliency"):
                sal = saliency(
                    lm, seqs, prompt_lens, eq, ea, cfg["saliency_batch_size"], desc=f"saliency {name}"
                )
            scores = scores.with_columns(
                pl.Series("s_eq_ea", sal[:, :, 0].tolist(), dtype=pl.List(pl.Float64)),
                pl.Series("s_eq_all", sal[:, :, 1].tolist(), dtype=pl.List(pl.Float64)),
            )
        for arr in (patch, ao, pr):
            arr.flush()
        del patch, ao, pr
    runlog.write_parquet(scores, sm.output.scores)
    if timing:
        print(f"{name}: " + ", ".join(f"{k} {v:.1f} s" for k, v in timing.items()), flush=True)


runlog.run(snakemake, main)  # noqa: F821
