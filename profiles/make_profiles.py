"""Write the model-rule sections of the cluster profiles from the rules themselves: every rule with a `gpu`
resource (workflow/rules/*.smk) gets its threads and as many CPUs for the task, so no list of model rules is
kept by hand (without set-threads a cluster job gets 1 thread).

    python profiles/make_profiles.py          # rewrite the sections
    python profiles/make_profiles.py --check  # exit 1 when they are out of date (tests/test_env_profiles.py)
"""

from __future__ import annotations

import re
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
MARKER = "# --- model rules: written by profiles/make_profiles.py from the rules with a `gpu` resource ---\n"
# per profile: torch threads of a model job, and the SLURM resources it asks for besides its CPUs (its runtime
# and memory come from the rules: truthflow.job_requests)
PROFILES = {
    "slurm": (8, {}),
    "slurm-ci": (2, {}),  # the CI node's 2 CPUs: as a local --cores 2 run, identical results
}


def model_rules(rules_dir: Path = ROOT / "workflow" / "rules") -> list[str]:
    """Rules with a `gpu` resource, in file and definition order."""
    rules = []
    for smk in sorted(rules_dir.glob("*.smk")):
        blocks = re.split(r"^(?:rule|checkpoint) (\w+):", smk.read_text(), flags=re.M)
        for name, body in zip(blocks[1::2], blocks[2::2], strict=True):
            if re.search(r"^\s+gpu\s*=", body, flags=re.M):
                rules.append(name)
    return rules


def section(threads: int, extra: dict, rules: list[str]) -> str:
    resources = ", ".join(f"{k}: {v}" for k, v in {**extra, "cpus_per_task": threads}.items())
    return (
        MARKER
        + "set-threads:\n"
        + "".join(f"  {r}: {threads}\n" for r in rules)
        + "set-resources:\n"
        + "".join(f"  {r}: {{{resources}}}\n" for r in rules)
    )


def main(argv: list[str]) -> int:
    rules, stale = model_rules(), []
    for name, (threads, extra) in PROFILES.items():
        path = ROOT / "profiles" / name / "config.yaml"
        text = path.read_text()
        head = text.split(MARKER)[0]
        new = head + section(threads, extra, rules)
        if new != text:
            stale.append(str(path.relative_to(ROOT)))
            if "--check" not in argv:
                path.write_text(new)
    if stale and "--check" in argv:
        print(f"out of date: {', '.join(stale)}; run: python profiles/make_profiles.py", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
