import polars as pl

from truthflow.compare import compare
from truthflow.pathways.check import CHECK_SCHEMA


def _check_row(model, verdict, flip_t, flip_c):
    row = dict.fromkeys(CHECK_SCHEMA)
    row.update(
        n_samples=50,
        min_samples=20,
        flip_target=flip_t,
        flip_target_low=flip_t - 1,
        flip_target_high=flip_t + 1,
        flip_control=flip_c,
        flip_control_low=flip_c - 1,
        flip_control_high=flip_c + 1,
        flip_diff=flip_t - flip_c,
        delta_p_target=-20.0,
        delta_p_control=-1.0,
        verdict=verdict,
        reason="why",
    )
    return {"model": model, "dataset": "nq", **row}


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
        [_check_row("m1", "holds", 12.0, 2.0), _check_row("m2", "does not hold", 3.0, 3.5)],
        schema={"model": pl.String, "dataset": pl.String, **CHECK_SCHEMA},
    )
    depthwise = pl.DataFrame({"model": ["m1"] * 3, "depth": [1, 2, 3], "mink": [2.0, 3.0, 4.2]})
    pooled = pl.DataFrame({"model": ["m1"], "depth": [1], "median": [2.0]})
    out = compare(published, pathways, depthwise, pooled, check)
    pub = out.filter(pl.col("check") == "published value")
    # the control rows (-99) never enter the published comparison
    assert pub["reproduced"].to_list() == [-45.0, 4.2] and pub["verdict"].to_list() == ["within range"] * 2
    qual = {(r["model"], r["check"]): r for r in out.iter_rows(named=True) if r["check"] != "published value"}
    m1 = qual[("m1", "E_Q knockout beats random control")]
    assert m1["verdict"] == "holds" and m1["reproduced"] == 10.0 and "12.0%" in m1["detail"]
    assert qual[("m2", "E_Q knockout beats random control")]["verdict"] == "does not hold"
    assert qual[("m1", "MIN-K% rises with depth")]["verdict"] == "holds"
    # the old tautological check is gone
    assert not any("below A-Anchored" in c for c in out["check"].to_list())
