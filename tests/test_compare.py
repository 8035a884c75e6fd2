import polars as pl

from truthflow.compare import compare


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
            "model": ["m1"] * 4 + ["m2"] * 4,
            "dataset": ["nq"] * 8,
            "anchor": ["Q-Anchored", "Q-Anchored", "A-Anchored", "A-Anchored"] * 2,
            "layer": [1, 2, 1, 2] * 2,
            "mean_delta_p": [-10.0, -45.0, 0.0, -2.0, -1.0, 5.0, 0.0, -3.0],
        }
    )
    depthwise = pl.DataFrame({"model": ["m1"] * 3, "depth": [1, 2, 3], "mink": [2.0, 3.0, 4.2]})
    pooled = pl.DataFrame({"model": ["m1"], "depth": [1], "median": [2.0]})
    out = compare(published, pathways, depthwise, pooled)
    pub = out.filter(pl.col("check") == "published value")
    assert pub["reproduced"].to_list() == [-45.0, 4.2] and pub["verdict"].to_list() == ["within range"] * 2
    qual = {
        (r["model"], r["check"]): r["verdict"]
        for r in out.iter_rows(named=True)
        if r["check"] != "published value"
    }
    assert qual[("m1", "Q-Anchored ΔP below A-Anchored")] == "holds"  # layer 2: -45 < -2
    assert qual[("m2", "Q-Anchored ΔP below A-Anchored")] == "does not hold"  # 5 > -3
    assert qual[("m1", "MIN-K% rises with depth")] == "holds"
