"""The paper configs plan the whole set of stages on the paper's models (a dry run: nothing is downloaded)."""

import os
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]


def _planned(out: str) -> dict[str, int]:
    jobs, table = {}, False
    for line in out.splitlines():
        if line.startswith("job ") and "count" in line:
            table = True
            continue
        parts = line.split()
        if table and len(parts) == 2 and parts[1].isdigit():
            if parts[0] == "total":
                break
            jobs[parts[0]] = int(parts[1])
    return jobs


@pytest.mark.workflow
def test_paper_pathways_config_plans_every_experiment(tmp_path):
    proc = subprocess.run(
        [
            sys.executable,
            "-m",
            "snakemake",
            "-s",
            str(REPO / "Snakefile"),
            "-d",
            str(tmp_path),
            "--configfile",
            str(REPO / "configs" / "paper-pathways.yaml"),
            "-n",
            "--cores",
            "8",
        ],
        capture_output=True,
        text=True,
        timeout=600,
        env={**os.environ, "HF_HUB_OFFLINE": "1", "HF_DATASETS_OFFLINE": "1"},
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    jobs = _planned(proc.stdout + proc.stderr)
    # 12 models x 4 QA sets: the ΔP stage and every Section 3.2-5 experiment, per (model, dataset)
    for rule in ("extract_pathways", "probe_deltap", "extract_experiments", "pathway_experiments"):
        assert jobs.get(rule) == 48, (rule, jobs)
    assert jobs.get("experiment_tables") == 1 and jobs.get("plot_experiments") == 6, jobs
    assert "llama-3-8b" in proc.stdout  # the published Table 3 model is in the set
    # every model's answers by vLLM, as the dry run says (answer_backend.plan_line)
    answers = next(line for line in proc.stderr.splitlines() if line.startswith("truthflow: answers:"))
    assert (
        answers.startswith("truthflow: answers: vLLM for llama-3-70b, llama-3-8b,")
        and "engine" not in answers
    )


def test_paper_depth_config_runs_the_authors_settings():
    """configs/paper-depth.yaml, filled as the workflow fills it: the authors' sampled answers (their vLLM
    settings and seed, 1,024 new tokens) in their prompt layout, and their sampled judge."""
    import yaml

    from truthflow.config import fill_defaults
    from truthflow.depth import authors
    from truthflow.engine.decoding import Decoding

    cfg = fill_defaults(yaml.safe_load((REPO / "configs" / "paper-depth.yaml").read_text()))
    depth = cfg["depth"]
    assert Decoding.from_config(depth["decoding"]) == Decoding(1.0, 0.9, 1.03, 42)
    assert depth["max_new_tokens"] == 1024
    assert cfg["generation"]["backend"] == "vllm"  # as the authors generated
    # the authors' own prompt text, which rule authors_prompts reads from their repository
    assert Path(depth["prompt"]) == authors.PROMPT_FILES["answer"]
    assert Path(depth["judge"]["prompt"]) == authors.PROMPT_FILES["judge"]
    judge = depth["judge"]
    assert judge["decoding"] == {"mode": "sampled", "temperature": 1.0, "top_p": 0.9, "seed": 42}
    assert judge["judgments"] == 1 and judge["max_new_tokens"] == 1024
    demo = fill_defaults(yaml.safe_load((REPO / "config.yaml").read_text()))
    assert not Decoding.from_config(demo["depth"]["decoding"]).sampled  # the demo stays greedy


def test_paper_configs_set_no_prompt_limit_and_the_demo_keeps_512():
    """The DepthQA authors ran vLLM with max_model_len=None: the paper configs (and their rehearsal) set no
    prompt limit of their own, so only a model's context caps a prompt (generation.prompt_limit); the demo
    keeps the schema's 512."""
    import yaml

    from truthflow.config import fill_defaults

    for name in ("paper-depth", "paper-pathways", "rehearsal"):
        cfg = fill_defaults(yaml.safe_load((REPO / "configs" / f"{name}.yaml").read_text()))
        assert cfg["generation"]["max_prompt_tokens"] is None, name
    demo = fill_defaults(yaml.safe_load((REPO / "config.yaml").read_text()))
    assert demo["generation"]["max_prompt_tokens"] == 512
