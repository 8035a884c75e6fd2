"""The shared run (tests/conftest.py `demo_run`: the test config in a copy of this checkout, on the real demo
models): its outputs, a no-op rerun, what reruns after a change, and bad input stopping the run with one clear
message."""

from __future__ import annotations

import re
from pathlib import Path

import polars as pl
import pytest
from conftest import TEST_N, TEST_SETS, checkout_config, small_config, snakemake, write_config

pytestmark = [pytest.mark.workflow, pytest.mark.model]


def test_outputs(demo_run):
    res = demo_run / "results" / "demo"
    acc = pl.read_csv(res / "tables" / "accuracy.tsv", separator="\t")
    assert acc.height == 2 * len(TEST_SETS) and (acc["n"] == TEST_N).all()
    assert acc["n_correct"].sum() > 0
    summary = pl.read_parquet(res / "tables" / "pathways_summary.parquet")
    assert set(summary["anchor"].unique()) <= {"Q-Anchored", "A-Anchored", "all"} and summary.height > 0
    assert set(summary["knockout"].unique()) == {"target", "control"}
    check = pl.read_csv(res / "tables" / "pathways_check.tsv", separator="\t")
    assert check.height == 2 * len(TEST_SETS) and set(check["verdict"]) <= {
        "holds",
        "does not hold",
        "inconclusive",
    }
    # every rule log says something (at least its closing line)
    logs = list((res / "logs").rglob("*.log"))
    assert logs and not [str(p) for p in logs if p.stat().st_size == 0]
    dropped = pl.read_csv(res / "tables" / "dropped_samples.tsv", separator="\t")
    assert "kept" in dropped["reason"].to_list()
    for fig in (
        "pathways_smollm2-135m__gemma3-270m",
        "pathways_control_smollm2-135m__gemma3-270m",
        "pathways_check_smollm2-135m__gemma3-270m",
        "probe_auc_smollm2-135m__gemma3-270m",
        *(
            f"experiment_{f}_smollm2-135m__gemma3-270m"
            for f in ("patching", "answer_only", "boundary", "saliency", "awareness")
        ),
        "depth_mink_boxes",
        "depth_score_gap_density",
    ):
        for ext in ("png", "pdf"):
            assert (res / "figures" / f"{fig}.{ext}").stat().st_size > 10_000
    # the Section 3.2-5 experiments: Table 3 in the paper's layout, every method for both models
    table3 = pl.read_csv(res / "tables" / "pathways_table3.tsv", separator="\t")
    assert table3.height == 16 and {"PopQA", "NQ"} <= set(table3.columns)
    assert set(table3["method"]) >= {"P(True)", "Logits-mean", "Logits-min", "Probing", "MoP", "PR"}
    rows = pl.read_parquet(res / "tables" / "pathways_experiments.parquet")
    assert {"patching", "answer_only", "boundary", "saliency"} <= set(rows["experiment"])
    run = res / "pathways" / "gemma3-270m" / "nq"
    clean = __import__("numpy").load(run / "resid_clean.npy", mmap_mode="r")
    assert clean.dtype == "float32" and (clean.shape[0], clean.shape[2]) == (18, 640)  # stored [L, N, D]
    # the demo keeps its states (pathways.keep_states defaults to true): a re-probe needs no re-extraction
    assert (run / "resid_ko.npy").exists() and (run / "resid_control.npy").exists()
    per_q = pl.read_parquet(res / "tables" / "depth_per_question.parquet")
    assert {"mink_10", "mink_20", "mink_30", "minkpp_20", "score"} <= set(per_q.columns)
    assert (res / "logs" / "generate_answers" / "gemma3-270m" / "nq.log").exists()
    # each model and analysis job's own benchmark: exact CPU time and peaks at its end (Snakemake's sampled
    # figures beside them, never asserted on: what a sample catches depends on timing); a job that held
    # Gemma-3's fp32 weights (1.1 GB) peaks above them
    bench = pl.read_csv(res / "tables" / "benchmarks.tsv", separator="\t", null_values="NA")
    assert bench.columns == [
        *("rule", "model", "dataset", "n", "layers", "hidden", "fits", "threads", "seconds", "cpu_seconds"),
        *("max_rss_mb", "max_gpu_mb", "sampled_cpu_seconds", "sampled_max_rss_mb"),
    ]
    assert (
        bench["seconds"].min() > 0
        and bench["cpu_seconds"].min() > 0
        and bench["max_gpu_mb"].null_count() == len(bench)
    )
    gemma = bench.filter(model="gemma3-270m", rule="extract_pathways")
    assert gemma.height == len(TEST_SETS) and gemma["max_rss_mb"].min() > 1100
    # an analysis job's row carries its shape: Gemma-3's 18 layers of 640 at n 32, 2 seeds x 5 folds
    analysis = bench.filter(pl.col("rule").is_in(["probe_deltap", "pathway_experiments"]))
    assert analysis.height == 2 * 2 * len(TEST_SETS)
    shape = analysis.filter(model="gemma3-270m").select("n", "layers", "hidden", "fits").unique()
    assert shape.rows() == [(TEST_N, 18, 640, 10)]
    assert bench.filter(rule="extract_pathways")["n"].null_count() == 2 * len(TEST_SETS)


def _job_rounds(log: Path) -> dict[tuple[str, str], tuple[int, int]]:
    """(rule, wildcards) -> (the scheduling round that started the job, the rounds made before its end) of
    every job a Snakemake log records. A round is one "Execute N jobs..." line: Snakemake's selection of the
    ready jobs, so counting rounds, not seconds, says what the scheduler chose whatever the machine's load."""
    jobs, started, rounds, rule, job = {}, {}, 0, None, None
    for line in log.read_text().splitlines():
        if re.match(r"Execute \d+ jobs\.\.\.$", line):
            rounds += 1
        elif m := re.match(r"(?:local)?rule (\w+):$", line):
            rule = m.group(1)
        elif m := re.match(r"\s+jobid: (\d+)$", line):
            job = m.group(1)
            started[job] = [rule, "", rounds]
        elif m := re.match(r"\s+wildcards: (.*)$", line):
            started[job][1] = m.group(1)  # after the job's jobid line
        elif m := re.match(r"Finished jobid: (\d+)", line):
            rule_, wildcards, start = started.pop(m.group(1))
            jobs[(rule_, wildcards)] = (start, rounds)
    return jobs


# a one-thread step of a chain and the model job whose output it waits on
STEPS = (
    ("label_answers", "generate_answers"),
    ("probe_deltap", "extract_pathways"),
    ("pathway_experiments", "extract_experiments"),
)


def late_steps(jobs: dict, step: str, parent: str) -> tuple[int, list[tuple[str, int]]]:
    """(how many `step` jobs ran, [(wildcards, rounds passed over)] of those that the first scheduling round
    after their `parent` job's end did not start), from `_job_rounds`."""
    starts = [(wc, start) for (rule, wc), (start, _) in jobs.items() if rule == step]
    passed = [(wc, start - jobs[(parent, wc)][1] - 1) for wc, start in starts]
    return len(starts), [(wc, n) for wc, n in passed if n > 0]


def test_one_thread_steps_never_wait_for_a_model_job(demo_run):
    """The run's order (PRIORITY in workflow/rules/common.smk): a label job starts in the first scheduling
    round after its answers are written, a probe job after its knockout, the experiments' statistics after
    their states, though both model slots have jobs to run (before the priorities, probes of this run waited
    up to 124 s and a label 77 s, each for a model job to end). Rounds, not seconds: the check never depends
    on the machine's load. The negative control: tests/test_scheduling.py."""
    log = min((demo_run / ".snakemake" / "log").glob("*.snakemake.log"))  # the run's own, not later reruns
    jobs = _job_rounds(log)
    for step, parent in STEPS:
        n, late = late_steps(jobs, step, parent)
        assert n == 2 * len(TEST_SETS), (step, sorted(jobs))
        assert not late, f"{step} waited for a model job: {late}"


def test_second_run_does_nothing(demo_run):
    proc = snakemake(demo_run, "-n")
    assert proc.returncode == 0
    assert "Nothing to be done" in proc.stdout + proc.stderr


def _planned(proc) -> dict[str, int]:
    out = proc.stdout + proc.stderr
    jobs, table = {}, False
    for line in out.splitlines():
        if line.startswith("job ") and "count" in line:
            table = True
            continue
        if table:
            parts = line.split()
            if len(parts) == 2 and parts[1].isdigit() and parts[0] != "total":
                jobs[parts[0]] = int(parts[1])
            elif parts and parts[0] == "total":
                break
    return jobs


def test_changing_one_dataset_n_reruns_only_that_dataset(demo_run, tmp_path):
    cfg = checkout_config()
    cfg["datasets"]["nq"]["n"] = 30
    write_config(demo_run, cfg)
    try:
        jobs = _planned(snakemake(demo_run, "-n"))
    finally:
        write_config(demo_run, checkout_config())
    assert jobs.get("download_dataset") == 1
    assert jobs.get("generate_answers") == 2 and jobs.get("extract_pathways") == 2
    assert jobs.get("extract_experiments") == 2
    assert "score_mink" not in jobs and "prepare_model" not in jobs


def test_changing_max_new_tokens_reruns_only_that_model(demo_run):
    cfg = checkout_config()
    cfg["models"]["gemma3-270m"]["max_new_tokens"] = 10
    write_config(demo_run, cfg)
    try:
        proc = snakemake(demo_run, "-n")
        jobs = _planned(proc)
    finally:
        write_config(demo_run, checkout_config())
    assert jobs.get("generate_answers") == len(TEST_SETS)  # gemma × the QA sets
    assert "download_dataset" not in jobs and "prepare_model" not in jobs and "score_mink" not in jobs
    assert "smollm2-135m" not in "\n".join(
        line for line in proc.stdout.splitlines() if line.strip().startswith("output:") and "answers/" in line
    )


def test_model_directory_without_weights(tmp_path):
    (tmp_path / "empty_model").mkdir()
    (tmp_path / "empty_model" / "config.json").write_text("{}")
    cfg = small_config()
    cfg["models"]["broken"] = {"source": {"local": str(tmp_path / "empty_model")}}
    write_config(tmp_path, cfg)
    proc = snakemake(tmp_path, "resources/models/broken", timeout=300)
    out = proc.stdout + proc.stderr
    assert proc.returncode != 0 and "model 'broken'" in out and "no config.json or no weights" in out
    assert not (tmp_path / "resources" / "models" / "broken").exists()


def test_published_vs_reproduced_names_its_checks(demo_run):
    table = pl.read_csv(demo_run / "results/demo/tables/published_vs_reproduced.tsv", separator="\t")
    assert set(table["check"]) >= {"E_Q knockout beats random control", "MIN-K% rises with depth"}
    # the split itself is never reported as evidence
    assert "Q-Anchored ΔP below A-Anchored" not in set(table["check"])
    assert set(table["verdict"]) <= {
        "holds",
        "does not hold",
        "inconclusive",
        "undefined (a depth is empty)",
    }


def test_the_bill_takes_a_finished_runs_analysis_jobs(demo_run, monkeypatch, capsys):
    """The bill of the run's config, beside its benchmark table: every probe_deltap and pathway_experiments
    job ran at the shape the bill prices, so each figure is the run's, labelled measured."""
    from truthflow import bill

    monkeypatch.chdir(demo_run)  # the config's data paths are relative to its checkout
    bill.main(["config.yaml"])  # results/demo/tables/benchmarks.tsv, the default
    out = capsys.readouterr().out
    line = next(x for x in out.splitlines() if "from the finished run" in x)
    jobs = [
        f"{r} {m}/{d}"
        for r in ("pathway_experiments", "probe_deltap")
        for m in ("gemma3-270m", "smollm2-135m")
        for d in sorted(TEST_SETS)
    ]
    assert line.endswith("measured: " + ", ".join(jobs)), line


def test_every_job_asked_for_more_memory_than_it_took(demo_run, monkeypatch):
    """The mem_mb each model and analysis job asks SLURM for (truthflow.job_requests, from the run's config)
    is at least the peak RSS the job reached in this run (its exact peaks file, in tables/benchmarks.tsv)."""
    import yaml

    from truthflow import job_requests, pricing
    from truthflow.preflight import prepare_config

    monkeypatch.chdir(demo_run)  # the config's data paths are relative to its checkout
    config = prepare_config(yaml.safe_load(Path("config.yaml").read_text()), [], {})
    asks = job_requests.asks(config, pricing.job_seconds(config))
    table = pl.read_csv(Path("results/demo/tables/benchmarks.tsv"), separator="\t", null_values="NA")
    checked = 0
    for row in table.iter_rows(named=True):
        ask = asks[(row["rule"], row["model"], row["dataset"])]
        assert ask.mem_mb >= row["max_rss_mb"], row
        checked += 1
    assert checked == table.height > 0


def test_a_finished_run_says_where_its_figures_are(demo_run):
    """The run's last words: each figure's path and the report command."""
    said = (demo_run.parents[1] / "output.txt").read_text()
    figures = sorted((demo_run / "results" / "demo" / "figures").glob("*.png"))
    assert len(figures) >= 8
    assert f"truthflow: {len(figures)} figures in results/demo/figures/" in said
    assert all(f"results/demo/figures/{f.name}" in said for f in figures)
    done = said.rindex("steps (100%) done")
    assert said.index("in one HTML report: snakemake --report report.zip") > done  # after the last job
