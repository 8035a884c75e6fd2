import polars as pl
import pytest

from truthflow.compare import compare
from truthflow.pathways.check import CHECK_SCHEMA


def _check_row(model, verdict, diff, half=4.0):
    row = dict.fromkeys(CHECK_SCHEMA)
    row.update(
        model=model,
        dataset="nq",
        measure="delta_p",
        layers="second_half (16-30)",
        n_samples=50,
        diff=diff,
        sesoi=5.0,
        verdict=verdict,
        verdict_cell=verdict,
        reason="why",
    )
    if half is not None:
        row.update(
            diff_low=diff - half,
            diff_high=diff + half,
            p_value=0.001,
            p_holm=0.004,
            secondary_measure="flip_rate",
            secondary_diff=3.0,
            secondary_low=1.0,
            secondary_high=5.0,
            secondary_p=0.01,
        )
    return row


def test_published_and_qualitative_checks():
    published = pl.DataFrame(
        {
            "kind": ["delta_p", "median_mink"],
            "model": ["m1", "m1"],
            "paper": ["p", "p"],
            "source": ["seed 000", "seed 003"],
            "dataset": ["all", None],
            "anchor": ["Q-Anchored", None],
            "layer": [2, None],
            "depth": [None, 3],
            "published": [-50.0, 4.0],
            "low": [-60.0, 3.5],
            "high": [-40.0, 4.5],
            "note": ["", ""],
        }
    )
    pathways = pl.DataFrame(
        {
            "model": ["m1"] * 6,
            "dataset": ["nq"] * 6,
            "knockout": ["target"] * 4 + ["control"] * 2,
            "anchor": ["Q-Anchored", "Q-Anchored", "A-Anchored", "A-Anchored", "Q-Anchored", "Q-Anchored"],
            "layer": [1, 2, 1, 2, 1, 2],
            "mean_delta_p": [-10.0, -45.0, 0.0, -2.0, -99.0, -99.0],
        }
    )
    check = pl.DataFrame(
        [
            _check_row("m1", "holds", -10.0),
            _check_row("m2", "does not hold", 0.5, 2.0),
            _check_row("m3", "inconclusive", None, None),
        ],
        schema=CHECK_SCHEMA,
    )
    depthwise = pl.DataFrame({"model": ["m1"] * 3, "depth": [1, 2, 3], "mink": [2.0, 3.0, 4.2]})
    pooled = pl.DataFrame({"model": ["m1"], "depth": [1], "median": [2.0]})
    out = compare(published, {"pathways": pathways, "depthwise": depthwise, "pooled": pooled, "check": check})
    pub = out.filter(pl.col("check") == "published value")
    # the control rows (-99) never enter the published comparison
    assert pub["reproduced"].to_list() == [-45.0, 4.2] and pub["verdict"].to_list() == ["within range"] * 2
    qual = {(r["model"], r["check"]): r for r in out.iter_rows(named=True) if r["check"] != "published value"}
    m1 = qual[("m1", "E_Q knockout beats random control")]
    assert m1["verdict"] == "holds" and m1["reproduced"] == -10.0
    assert "delta_p E_Q − control -10.00 [-14.00, -6.00] (Holm-corrected)" in m1["detail"]
    assert "secondary (uncorrected) flip_rate +3.00 [1.00, 5.00]" in m1["detail"]
    assert qual[("m2", "E_Q knockout beats random control")]["verdict"] == "does not hold"
    m3 = qual[("m3", "E_Q knockout beats random control")]
    assert m3["verdict"] == "inconclusive" and m3["reproduced"] is None and m3["detail"].endswith(": why")
    assert qual[("m1", "MIN-K% rises with depth")]["verdict"] == "holds"
    # the old tautological check is gone
    assert not any("below A-Anchored" in c for c in out["check"].to_list())


def test_an_unknown_published_kind_is_one_line():
    from truthflow.compare import reproduced
    from truthflow.errors import TruthflowError

    with pytest.raises(TruthflowError, match="published.tsv: unknown kind 'auroc' \\(known: "):
        reproduced({"kind": "auroc", "model": "m", "dataset": "all", "source": "x"}, {})


def test_depthqa_authors_metrics_against_the_published_tsv_rows():
    """published.tsv's Llama-3-8B-Instruct rows (the authors' released metrics) find their depth_metrics row:
    a mean score by its depth, a discrepancy by its pair's deeper depth (empty: overall); n = 0 (no value) is
    no comparison."""
    from conftest import REPO

    from truthflow import validate
    from truthflow.depth.metrics import METRICS_SCHEMA

    published = validate.read_tsv(
        REPO / "workflow" / "report" / "published.tsv", ["kind", "model", "published"]
    )
    ours = published.filter(pl.col("model") == "llama-3-8b-instruct", pl.col("kind") != "median_mink")
    assert ours.height == 9 and (ours["high"] - ours["low"]).min() > 0
    rows = [
        ("mean_score", "depth 1", 1, 1121, 4.50),
        ("mean_score", "depth 2", 2, 359, 4.0),  # outside 4.451 ± 0.2
        ("mean_score", "depth 3", 3, 91, 4.40),
        ("forward_discrepancy", "1-2", 2, 300, 0.08),
        ("forward_discrepancy", "2-3", 3, 80, 0.10),
        ("forward_discrepancy", "overall", None, 380, 0.085),
        ("backward_discrepancy", "1-2", 2, 0, None),  # n = 0: no value, no row
        ("backward_discrepancy", "2-3", 3, 70, 0.09),
        ("backward_discrepancy", "overall", None, 70, 0.09),
    ]
    blank_row = {**dict.fromkeys(METRICS_SCHEMA), "model": "llama-3-8b-instruct"}
    table = pl.DataFrame(
        [{**blank_row, "metric": m, "scope": s, "depth": d, "n": n, "value": v} for m, s, d, n, v in rows],
        schema=METRICS_SCHEMA,
    )
    out = compare(published, {"depth_metrics": table}).filter(pl.col("model") == "llama-3-8b-instruct")
    got = {
        r["detail"].split(" (")[0]: (r["published"], r["reproduced"], r["verdict"]) for r in out.to_dicts()
    }
    assert len(got) == 8
    assert got["mean score, depth 1, n = 1121 questions"] == (4.56, 4.5, "within range")
    assert got["mean score, depth 2, n = 359 questions"] == (4.451, 4.0, "outside range")
    assert got["forward discrepancy, 2-3, n = 80 counted nodes"] == (0.0947, 0.10, "within range")
    assert got["forward discrepancy, overall, n = 380 counted nodes"] == (0.0868, 0.085, "within range")
    assert got["backward discrepancy, overall, n = 70 counted nodes"][:2] == (0.0711, 0.09)
    assert not any(k.startswith("backward discrepancy, 1-2") for k in got)
    # missed by how much: the distance to the range's nearest bound (4.451 - 0.2), for the report's front page
    missed = out.filter(pl.col("verdict") == "outside range").row(0, named=True)
    assert (missed["paper"], missed["kind"]) == ("DepthQA", "mean_score")
    assert missed["off_range"] == pytest.approx(4.0 - 4.251)
    assert set(out.filter(pl.col("verdict") == "within range")["off_range"]) == {0}
