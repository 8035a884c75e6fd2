import polars as pl

from truthflow.plots_pathways import plot_pathways, plot_probe_auc


def test_figures_draw_with_an_undefined_probe(tmp_path):
    summary = pl.DataFrame(
        {
            "model": ["a"] * 4,
            "dataset": ["nq"] * 4,
            "anchor": ["Q-Anchored", "Q-Anchored", "A-Anchored", "A-Anchored"],
            "layer": [1, 2, 1, 2],
            "n": [5, 5, 5, 5],
            "mean_delta_p": [-5.0, -40.0, 0.0, -1.0],
            "ci_low": [-9.0, -50.0, -1.0, -3.0],
            "ci_high": [-1.0, -30.0, 1.0, 1.0],
        }
    )
    auc = pl.DataFrame(
        {
            "model": ["a", "a", "b"],
            "dataset": ["nq", "nq", "popqa"],
            "seed": [0, 0, None],
            "layer": [1, 2, None],
            "auc": [0.7, 0.8, None],
            "n_train": [8, 8, 0],
            "n_test": [2, 2, 0],
            "status": ["ok", "ok", "probe undefined: one class only (10 correct, 0 wrong)"],
        }
    )
    titles = {"a": "Model A", "b": "Model B"}
    plot_pathways(summary, auc, ["a", "b"], titles, tmp_path / "p.png", tmp_path / "p.pdf", caption="test")
    plot_probe_auc(auc, ["a", "b"], titles, tmp_path / "a.png", tmp_path / "a.pdf")
    for name in ("p.png", "p.pdf", "a.png", "a.pdf"):
        assert (tmp_path / name).stat().st_size > 5000
