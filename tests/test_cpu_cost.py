"""The analysis jobs' CPU figures (truthflow.sizing, truthflow.pricing): fixed + per-layer cost fitted on
cpu_cost.tsv's rows, scaled to a job's size and labelled estimated; measured only at the job's very shape,
from cpu_cost.tsv or a finished run's benchmark table."""

from __future__ import annotations

import math

import pytest
from conftest import REPO

from truthflow import bill, diskplan, pricing, sizing
from truthflow.memplan import Dims

COLUMNS = ["rule", "n", "layers", "hidden", "fits", "threads", "cpu_seconds", "machine", "date"]
# pathway_experiments at N 2,000, D 4,096, 15 fits: 110 s fixed + 10 s a layer; and at twice the rows (N x D x
# fits twice), 2 layers: 130 x 2 ** 0.5 s, a growth in size of power 0.5
ROWS = [
    ("pathway_experiments", 2000, 2, 4096, 15, 1, 130.0),
    ("pathway_experiments", 2000, 4, 4096, 15, 1, 150.0),
    ("pathway_experiments", 2000, 6, 4096, 15, 1, 170.0),
    ("pathway_experiments", 4000, 2, 4096, 15, 1, 130.0 * math.sqrt(2)),
]
# a 32-layer model of hidden size 8,192
BIG = Dims(layers=32, hidden=8192, heads=64, kv_heads=8, head_dim=128, intermediate=8, vocab=10)


def write_rows(path, rows) -> None:
    lines = ["\t".join(COLUMNS)]
    lines += ["\t".join(map(str, (*row, "here", "2026-12-06"))) for row in rows]
    path.write_text("\n".join(lines) + "\n")


def config(n: int) -> dict:
    return {
        "models": {"m": {"source": {"twin": "llama"}, "dtype": "bfloat16", "gpus": 1}},
        "datasets": {"popqa": {"source": {"hub": "x"}, "n": n}},
        "pathways": {
            "models": ["m"],
            "datasets": ["popqa"],
            "knockout": {"control_draws": 3},
            "experiments": {"pr_factors": [2.0, 4.0]},
            "probe": {"seeds": [0, 1, 2], "test_size": 0.2},
        },
        "depth": {"models": []},
    }


@pytest.fixture
def rows(tmp_path, monkeypatch) -> list[dict]:
    """ROWS as cpu_cost.tsv (the thread requests read it too), and a model of BIG's shape."""
    path = tmp_path / "cpu_cost.tsv"
    write_rows(path, ROWS)
    monkeypatch.setattr(sizing, "CPU_COST", path)
    monkeypatch.setattr(diskplan, "model_dims", lambda name, spec: BIG)
    return sizing.cpu_rows()


def test_fit_layers_through_three_points_on_a_line():
    """(2, 130), (4, 150), (6, 170) lie on 110 + 10 L: least squares gives the line back; one layer count
    gives no line."""
    assert sizing.fit_layers([(2, 130.0), (4, 150.0), (6, 170.0)]) == pytest.approx((110.0, 10.0))
    # off the line by +1, -2, +1: the same slope, the mean moved by 0
    assert sizing.fit_layers([(2, 131.0), (4, 148.0), (6, 171.0)]) == pytest.approx((110.0, 10.0))
    with pytest.raises(ValueError, match="two layer counts"):
        sizing.fit_layers([(4, 150.0), (4, 151.0)])


def test_pathway_experiments_is_fixed_plus_per_layer_scaled_to_the_job(rows):
    """At N 8,000, D 8,192, 32 layers, 15 fits: (110 + 10 x 32) s at the fitted size, times its size over the
    fitted one (8,000 x 8,192 / (2,000 x 4,096) = 8) to the power 0.5 (the row at twice the rows: 130 x
    2 ** 0.5): 430 x 8 ** 0.5 = 1,216.2 CPU-s, estimated, its basis naming the fit and the scaling."""
    cost = sizing.layer_cost("pathway_experiments", rows)
    assert (cost.fixed, cost.per_layer, cost.exponent) == pytest.approx((110.0, 10.0, 0.5))
    probe, experiments = pricing.cpu_costs(config(8000), "m", "popqa", rows)
    assert experiments.cpu_seconds.value == pytest.approx(430 * 8**0.5)
    assert not experiments.cpu_seconds.measured
    text = experiments.cpu_seconds.basis
    assert "110.0 + 10.00 x L" in text and "2, 4, 6 layers" in text and "^ 0.50" in text
    # probe_deltap has no rows at three layer counts here: issue 41's rate, 35 s a layer at N 14,267, D 4,096
    assert probe.cpu_seconds.value == pytest.approx(35.0 * 32 * 8000 * 8192 / (14_267 * 4_096))
    assert not probe.cpu_seconds.measured
    # its thread request follows the estimate: ceil(1,216.2 / 600) = 3 workers
    assert experiments.threads == 3


def test_only_a_row_at_the_jobs_shape_is_measured(rows, tmp_path):
    """A row at the job's N, L, D, fits and threads is the job's figure, labelled measured; the same shape on
    another number of threads is not, nor is any scaled figure."""
    shape = {"n": 8000, "layers": 32, "hidden": 8192, "fits": 15, "threads": 3}
    assert sizing.job_shape(config(8000), "pathway_experiments", "m", "popqa") == shape
    other_threads = ("pathway_experiments", 8000, 32, 8192, 15, 2, 900.0)  # fits use one-thread rows only
    write_rows(tmp_path / "cpu_cost.tsv", [*ROWS, other_threads])
    experiments = pricing.cpu_costs(config(8000), "m", "popqa", sizing.cpu_rows())[1]
    assert experiments.cpu_seconds.value == pytest.approx(430 * 8**0.5)
    assert not experiments.cpu_seconds.measured
    write_rows(tmp_path / "cpu_cost.tsv", [*ROWS, other_threads, (*other_threads[:5], 3, 1000.0)])
    experiments = pricing.cpu_costs(config(8000), "m", "popqa", sizing.cpu_rows())[1]
    assert experiments.cpu_seconds.value == 1000.0
    assert experiments.cpu_seconds.measured
    assert experiments.cpu_seconds.basis.startswith("cpu_cost.tsv at the job's shape")


def test_no_scaled_figure_of_the_paper_configs_is_labelled_measured():
    """The committed rows are synthetic shapes of a few layers: no paper job has one at its shape, so every
    CPU figure of probe_deltap and pathway_experiments is estimated (and says it was fitted)."""
    setting = pricing.Setting.load()
    costs = [
        c
        for path in pricing.PAPER_CONFIGS
        for c in pricing.price(pricing.prepared(path), setting)
        if c.rule in pricing.CPU_STAGES
    ]
    assert {c.rule for c in costs} == set(pricing.CPU_STAGES)
    assert not any(c.cpu_seconds.measured for c in costs)
    assert all("fitted on cpu_cost.tsv" in c.cpu_seconds.basis for c in costs)


def demo_benchmarks(path, config_: dict, model: str, dataset: str) -> None:
    """A finished demo run's benchmark table: probe_deltap of (model, dataset) at its shape, 123.45 CPU-s;
    its pathway_experiments at one row more than the job's."""
    columns = ["rule", "model", "dataset", *sizing.JOB_SHAPE, "seconds", "cpu_seconds"]
    lines = ["\t".join(columns)]
    for rule, extra_rows, cpu in (("probe_deltap", 0, 123.45), ("pathway_experiments", 1, 67.8)):
        shape = sizing.job_shape(config_, rule, model, dataset)
        shape["n"] += extra_rows
        lines.append("\t".join(map(str, (rule, model, dataset, *shape.values(), 60.0, cpu))))
    lines.append("\t".join(("extract_pathways", model, dataset, *["NA"] * 5, "30.0", "40.0")))
    path.write_text("\n".join(lines) + "\n")


def test_a_finished_runs_rows_replace_the_estimates_at_their_shape(tmp_path, capsys):
    """The demo's bill with a finished run's benchmark table: probe_deltap smollm2-135m/popqa, run at the
    shape priced, costs the row's 123.45 CPU-s, labelled measured with the run as its basis; its
    pathway_experiments row, of another N, is not used, and the bill names both."""
    demo = pricing.prepared(REPO / "config.yaml")
    table = tmp_path / "benchmarks.tsv"
    demo_benchmarks(table, demo, "smollm2-135m", "popqa")
    finished = pricing.FinishedRun.load(table, "demo")
    costs = pricing.price(demo, pricing.Setting.load(), finished)
    by_job = {(c.rule, c.model, c.dataset): c.cpu_seconds for c in costs if c.rule in pricing.CPU_STAGES}
    probe = by_job[("probe_deltap", "smollm2-135m", "popqa")]
    assert (probe.value, probe.measured) == (123.45, True)
    assert probe.basis.startswith("finished run demo, benchmarks.tsv, ")
    experiments = by_job[("pathway_experiments", "smollm2-135m", "popqa")]
    assert not experiments.measured and experiments.value != 67.8
    assert not any(f.measured for job, f in by_job.items() if job[1:] != ("smollm2-135m", "popqa"))
    bill.main([str(REPO / "config.yaml"), "--benchmarks", str(table)])
    out = capsys.readouterr().out
    assert f"from the finished run ({table}), measured: probe_deltap smollm2-135m/popqa;" in out
    assert "its rows of another shape, not used: pathway_experiments smollm2-135m/popqa" in out
