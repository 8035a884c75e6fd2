"""Caching you can trust, on the shared run (conftest `demo_run`: a copy of this checkout, the Snakefile and
the working directory one directory, as after a clone): a copied or moved checkout is a no-op, editing a
module reruns exactly the jobs whose scripts import it, a display_name edit never prepares a model again,
and the README's `--report` commands work without --cores (the suite's one report build, contents checked)."""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
import zipfile
from pathlib import Path

import pytest
from conftest import REPO, env

pytestmark = [pytest.mark.workflow, pytest.mark.model]
SNAKEMAKE = [sys.executable, "-m", "snakemake"]

# the modules edited below: the rules whose scripts import them (directly or not) and, after them, every
# rule that consumes what those rerun
EDITS = {
    "pathways/labels": (
        {"label_answers"},
        {
            "accuracy_table",
            "extract_pathways",
            "probe_deltap",
            "pathways_tables",
            "plot_pathways",
            "extract_experiments",
            "pathway_experiments",
            "experiment_tables",
            "plot_experiments",
            "compare_published",
            "front_page",
            "benchmark_table",
            "table_html",
        },
    ),
    "depth/mink": (
        {"score_mink"},  # depth_tables no longer imports it (and with it torch): it reruns on new scores
        {"depth_tables", "plot_depth", "compare_published", "front_page", "benchmark_table", "table_html"},
    ),
    "depth/plots": ({"plot_depth"}, set()),
}


def run(ck: Path, *args: str, timeout: int = 600) -> subprocess.CompletedProcess:
    """`snakemake ARGS` typed in the checkout (the Snakefile and config.yaml are found there)."""
    return subprocess.run(
        [*SNAKEMAKE, *args], cwd=ck, capture_output=True, text=True, timeout=timeout, env=env()
    )


def planned(proc) -> dict[str, dict[str, str]]:
    """rule -> {"input": ..., "reason": ...} of the first job a dry run plans for each rule."""
    jobs, rule = {}, None
    for line in proc.stdout.splitlines():
        m = re.match(r"(?:local)?rule (\w+):$", line)
        if m:
            rule = m.group(1) if m.group(1) != "all" else None
            if rule and rule in jobs:
                rule = None
            elif rule:
                jobs[rule] = {}
        elif rule and ":" in line and line.startswith("    "):
            key, _, value = line.strip().partition(":")
            jobs[rule].setdefault(key, value.strip())
        elif not line.strip():
            rule = None
    return jobs


def test_code_inputs_are_relative_and_complete(demo_run):
    proc = run(demo_run, "-n", "--forceall")
    assert proc.returncode == 0, proc.stderr[-3000:]
    inputs = [ln for ln in proc.stdout.splitlines() if ln.strip().startswith("input:")]
    assert inputs and not any(str(demo_run) in ln or str(REPO) in ln for ln in inputs)
    text = proc.stdout
    # the modules the old hand-kept lists missed
    label = text.split("rule label_answers:", 1)[1].split("\n\n", 1)[0]
    assert "src/truthflow/pathways/labels.py" in label and "src/truthflow/runlog.py" in label
    depth = text.split("rule depth_tables:", 1)[1].split("\n\n", 1)[0]
    assert "src/truthflow/depth/tables.py" in depth and "src/truthflow/depth/mink.py" not in depth
    judge = text.split("rule judge_answers:", 1)[1].split("\n\n", 1)[0]
    assert "src/truthflow/text.py" in judge and "src/truthflow/depth/judge.py" in judge


def test_copied_and_moved_checkout_is_a_noop(demo_run, tmp_path):
    proc = run(demo_run, "-n")
    assert proc.returncode == 0 and not planned(proc), proc.stdout[-3000:]
    copy = tmp_path / "copy"
    copy.mkdir()
    for item in demo_run.iterdir():  # cp -a; the model weights hard-linked (same bytes and times)
        flags = "-al" if item.name == "resources" else "-a"
        subprocess.run(["cp", flags, str(item), str(copy)], check=True)
    proc = run(copy, "-n")
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert not planned(proc) and "Nothing to be done" in proc.stdout + proc.stderr, proc.stdout[-3000:]
    moved = tmp_path / "moved"
    copy.rename(moved)
    proc = run(moved, "-n")
    assert proc.returncode == 0 and not planned(proc), proc.stdout[-3000:]


@pytest.mark.parametrize("module", sorted(EDITS), ids=lambda m: m.replace("/", "."))
def test_module_edit_reruns_exactly_its_importers(demo_run, module):
    importers, downstream = EDITS[module]
    path = demo_run / "src" / "truthflow" / f"{module}.py"
    text, st = path.read_text(), path.stat()
    path.write_text(text + "# an edit\n")
    try:
        jobs = planned(run(demo_run, "-n"))
    finally:
        path.write_text(text)
        os.utime(path, ns=(st.st_atime_ns, st.st_mtime_ns))
    edited = f"src/truthflow/{module}.py"
    # the jobs that have the module as an input are exactly its importers; the rest only consume their outputs
    assert {rule for rule, job in jobs.items() if edited in job["input"].split(", ")} == importers, jobs
    assert set(jobs) == importers | downstream, jobs
    assert all(
        edited in jobs[rule]["reason"] or "updated by another job" in jobs[rule]["reason"] for rule in jobs
    )
    assert not planned(run(demo_run, "-n"))  # restored: nothing to do


def test_display_name_edit_never_prepares_a_model(demo_run):
    cfg_path = demo_run / "config.yaml"
    original = cfg_path.read_text()
    cfg_path.write_text(
        original.replace("display_name: SmolLM2-135M-Instruct", "display_name: SmolLM2 (renamed)")
    )
    try:
        assert cfg_path.read_text() != original
        jobs = planned(run(demo_run, "-n"))
    finally:
        cfg_path.write_text(original)
    assert set(jobs) == {"plot_pathways", "plot_experiments", "plot_depth"}, jobs  # figure titles only


@pytest.mark.parametrize(
    "args",
    [("--report", "report.zip"), ("--configfile", "config.yaml", "--report", "report-demo.zip")],
    ids=["report", "configfile-report"],
)
def test_readme_report_command_without_cores(demo_run, args):
    zip_name = args[-1]
    proc = run(demo_run, *args, timeout=900)
    try:
        assert proc.returncode == 0, proc.stderr[-3000:]
        assert (demo_run / zip_name).stat().st_size > 10_000
        if "--configfile" not in args:
            _check_report(demo_run / zip_name)
    finally:
        (demo_run / zip_name).unlink(missing_ok=True)


def _check_report(path: Path) -> None:
    with zipfile.ZipFile(path) as z:
        names = z.namelist()
        html = "".join(z.read(n).decode("utf-8", "ignore") for n in names if n.endswith(".html"))
        main = z.read(next(n for n in names if n.count("/") == 1 and n.endswith("/report.html"))).decode()
    # tables are inline HTML pages in the report
    for page in (
        "published_vs_reproduced.html",
        "pathways_check.html",
        "pathways_table3.html",
        "pathways_smollm2-135m__gemma3-270m.png",
        "pathways_check_smollm2-135m__gemma3-270m.png",
        "experiment_patching_smollm2-135m__gemma3-270m.png",
        "depth_mink_boxes.png",
    ):
        assert any(n.endswith(page) for n in names), page
    assert "knockout.mode=cumulative" in html  # captions name the options
    _check_front_page(main)


def _check_front_page(page: str) -> None:
    """The report opens on the run's headline (rule front_page, in workflow/report/workflow.rst): both papers,
    the falsification verdicts, each row linked to its figure, and the stylesheet (profiles/default) that
    puts it above the workflow graph; tests/test_front_page.py checks the tables themselves."""
    start = page.index("var workflow_desc = ") + len("var workflow_desc = ")
    desc = json.JSONDecoder().raw_decode(page, start)[0]
    assert "System Message" not in desc and "problematic" not in desc
    sections = ["<h1>Two Pathways (", "<strong>Falsification check", "<h1>DepthQA (", "<strong>MIN-K% rises"]
    sections.append("<h1>The workflow")
    order = [desc.index(h) for h in sections]
    assert order == sorted(order)
    assert desc.count('class="verdict-') >= 8 + 2  # a verdict per (model, dataset), one per DepthQA model
    for figure in ("pathways_check_smollm2-135m__gemma3-270m.png", "depth_mink_boxes.png"):
        assert f"javascript:app.showResultInfo('results/demo/figures/{figure}')" in desc, figure
    assert "div:has(> #rulegraph) { flex-direction: column; }" in page
