"""The Section 3.2-5 experiment figures (pathways/plots_experiments.py) and their Snakemake script: every
figure writes a PNG and a PDF, also from empty tables; legends list only what is drawn; groups with fewer than
MIN_LINE_N samples are points, never bars, boxes or lines."""

import re
import runpy
import zlib
from pathlib import Path
from types import SimpleNamespace

import numpy as np
import polars as pl
import pytest
from matplotlib.text import Text

from truthflow.pathways import plots_experiments
from truthflow.pathways.plots import MIN_LINE_N

REPO = Path(__file__).resolve().parents[1]
MODELS = ["m1", "m2"]
TITLES = {"m1": "Model One", "m2": "Model Two"}
LAYERS = {"m1": 6, "m2": 8}
K = {"m1": 3, "m2": 5}
DATASETS = ["popqa", "triviaqa", "nq"]


def _row(model, ds, experiment, condition, group, layer, n, value, half=5.0):
    ci = (value - half, value + half) if n >= 2 else (float("nan"), float("nan"))
    return {
        "model": model,
        "dataset": ds,
        "experiment": experiment,
        "condition": condition,
        "group": group,
        "layer": layer,
        "n": n,
        "value": value,
        "ci_low": ci[0],
        "ci_high": ci[1],
        "note": "",
        "k_layer": K[model],
    }


def make_rows(control: bool = True, small: tuple | None = None) -> pl.DataFrame:
    """Patching (E_Q and, optionally, the random control), answer-only, boundary at every layer and PopQA
    popularity at K. `small` = (model, dataset, group) whose n is 3 everywhere."""
    rows = []
    for m in MODELS:
        for i, ds in enumerate(DATASETS):
            for group, base in (("Q-Anchored", 50.0), ("A-Anchored", 10.0)):
                n = 3 if small == (m, ds, group) else 40 + 10 * i
                rows.append(_row(m, ds, "patching", "E_Q", group, K[m], n, base + i))
                if control:
                    rows.append(_row(m, ds, "patching", "random", group, K[m], n, 5.0 + i))
                rows.append(_row(m, ds, "answer_only", "-ΔP", group, K[m], n, base - 5))
                for layer in range(1, LAYERS[m] + 1):
                    rows.append(_row(m, ds, "boundary", "accuracy", group, layer, n, base + layer))
                    rows.append(_row(m, ds, "boundary", "refusal", group, layer, n, 2.0 + layer / 2, 1.0))
                if ds == "popqa":
                    rows.append(_row(m, ds, "boundary", "log10 popularity", group, K[m], n, 3.0, 0.2))
                rows.append(_row(m, ds, "saliency", "S(E_Q→E_A)", group, K[m], n, 1e-3, 1e-4))
    return pl.DataFrame(rows, schema=plots_experiments.ROWS_TABLE_SCHEMA)


def make_awareness(undefined: tuple | None = None) -> pl.DataFrame:
    rows = []
    for m in MODELS:
        for ds in DATASETS:
            for layer in range(1, LAYERS[m] + 1):
                if layer == K[m]:
                    continue
                for seed in range(3):
                    bad = undefined == (m, ds)
                    rows.append(
                        {
                            "model": m,
                            "dataset": ds,
                            "k_layer": K[m],
                            "layer": layer,
                            "seed": seed,
                            "auc": None if bad else 0.6 + 0.03 * layer + 0.01 * seed,
                            "n": 60,
                            "n_q": 20,
                            "n_a": 40,
                            "status": "undefined: one group only" if bad else "ok",
                        }
                    )
    return pl.DataFrame(rows, schema=plots_experiments.AWARENESS_TABLE_SCHEMA)


def make_samples(n: int = 60, seed: int = 0) -> pl.DataFrame:
    rng = np.random.default_rng(seed)
    frames = []
    for m in MODELS:
        for ds in DATASETS:
            groups = np.where(np.arange(n) < n // 3, "Q-Anchored", "A-Anchored")
            sal = np.where(groups == "Q-Anchored", 10 ** rng.normal(-4, 0.3, n), 10 ** rng.normal(-2, 0.3, n))
            sal[0] = 0.0  # a non-positive saliency: left out on the log scale, and counted
            pop = 10 ** rng.normal(3, 1, n) if ds == "popqa" else np.full(n, np.nan)
            frames.append(
                pl.DataFrame(
                    {
                        "model": m,
                        "dataset": ds,
                        "id": [f"{ds}-{i}" for i in range(n)],
                        "group": groups,
                        "correct": rng.random(n) > 0.5,
                        "s_eq_ea": sal,
                        "s_eq_all": sal / 2,
                        "s_pop": pop,
                    }
                ).with_columns(pl.col("s_pop").fill_nan(None))
            )
    return pl.concat(frames)


class Spy(list):
    """What each figure hands to finish(): the figure, and the legend's handles and labels (blank padding
    entries dropped). Files are written only when `save` is set: most tests inspect the Axes only."""

    save = False


@pytest.fixture
def spy(monkeypatch):
    calls = Spy()
    orig = plots_experiments._finish

    def finish(fig, handles, labels, *args, **kwargs):
        calls.append(SimpleNamespace(fig=fig, handles=handles, labels=[x for x in labels if x]))
        if calls.save:
            orig(fig, handles, labels, *args, **kwargs)

    monkeypatch.setattr(plots_experiments, "_finish", finish)
    return calls


def _draw_all(tmp_path, rows, awareness, samples, models=MODELS, **kw) -> list[Path]:
    outs = []
    for name, call in (
        (
            "patching",
            lambda png, pdf: plots_experiments.plot_patching(rows, models, TITLES, png, pdf, "cap", **kw),
        ),
        (
            "answer_only",
            lambda png, pdf: plots_experiments.plot_answer_only(rows, models, TITLES, png, pdf, "cap", **kw),
        ),
        (
            "boundary",
            lambda png, pdf: plots_experiments.plot_boundary(rows, samples, models, TITLES, png, pdf, "cap"),
        ),
        (
            "saliency",
            lambda png, pdf: plots_experiments.plot_saliency(samples, models, TITLES, png, pdf, "cap"),
        ),
        (
            "awareness",
            lambda png, pdf: plots_experiments.plot_awareness(
                awareness, rows, models, TITLES, png, pdf, "cap"
            ),
        ),
    ):
        png, pdf = tmp_path / f"{name}.png", tmp_path / f"{name}.pdf"
        call(png, pdf)
        outs += [png, pdf]
    return outs


def _texts(fig) -> str:
    return "\n".join(t.get_text() for ax in fig.axes for t in ax.findobj(Text))


@pytest.mark.parametrize("models", [MODELS, ["m1"], []])
def test_empty_tables_do_not_raise_and_still_write(tmp_path, spy, models):
    spy.save = True
    empty = pl.DataFrame()  # an empty parquet written without columns reads back like this
    for path in _draw_all(tmp_path, empty, empty, empty, models=models):
        assert path.stat().st_size > 1000, path
    for call in spy:
        assert call.labels == []  # nothing drawn, nothing in the legend
        assert "no " in _texts(call.fig)  # every empty panel says why


def test_patching_legend_lists_only_what_is_drawn(tmp_path, spy):
    plots_experiments.plot_patching(
        make_rows(control=False), MODELS, TITLES, tmp_path / "a.png", tmp_path / "a.pdf"
    )
    labels = spy[-1].labels
    assert not any("random" in x or "published" in x for x in labels), labels
    assert sum("patched" in x for x in labels) == 2  # Q- and A-Anchored E_Q bars
    assert "no random-token control rows" in _texts(spy[-1].fig)
    plots_experiments.plot_patching(
        make_rows(),
        MODELS,
        TITLES,
        tmp_path / "b.png",
        tmp_path / "b.pdf",
        published=pl.read_csv(REPO / "workflow" / "report" / "published.tsv", separator="\t").with_columns(
            model=pl.when(pl.col("model") == "llama-3-8b").then(pl.lit("m2")).otherwise("model")
        ),
    )
    labels = spy[-1].labels
    assert sum("random" in x for x in labels) == 2
    assert "published value" in labels and not any("point" in x for x in labels)
    # the published markers are on m2's panel only, and only for the datasets drawn there
    m1, m2 = spy[-1].fig.axes[:2]
    diamonds = [ln for ax in (m1, m2) for ln in ax.lines if ln.get_marker() == "D"]
    assert all(ln.axes is m2 for ln in diamonds)
    assert sum(np.isfinite(ln.get_ydata()).sum() for ln in diamonds) == 2 * len(DATASETS)


def test_a_panel_with_only_the_control_draws_it_as_the_legend_does(tmp_path, spy):
    """A panel without E_Q rows keeps the control's hatched look, the legend's: not the solid look of E_Q."""
    rows = make_rows().filter(~((pl.col("model") == "m1") & (pl.col("condition") == "E_Q")))
    plots_experiments.plot_patching(rows, MODELS, TITLES, tmp_path / "a.png", tmp_path / "a.pdf")
    m1, m2 = spy[-1].fig.axes[:2]
    assert len(m1.patches) == 2 * len(DATASETS) and all(b.get_hatch() == "////" for b in m1.patches)
    bars = 2 * len(DATASETS)  # m2 has both conditions: E_Q solid, the control hatched
    assert sorted(bool(b.get_hatch()) for b in m2.patches) == [False] * bars + [True] * bars


def test_small_groups_are_points_not_bars(tmp_path, spy):
    rows = make_rows(small=("m1", "nq", "A-Anchored"))
    plots_experiments.plot_answer_only(rows, MODELS, TITLES, tmp_path / "a.png", tmp_path / "a.pdf")
    ax = spy[-1].fig.axes[0]
    # 3 datasets x 2 groups, less the small group, are bars; the small group is one point
    assert len(ax.patches) == 2 * len(DATASETS) - 1
    points = [ln for ln in ax.lines if ln.get_marker() == "o"]
    assert len(points) == 1 and list(points[0].get_ydata()) == [5.0]
    assert f"point: n < {MIN_LINE_N} samples (no CI)" in spy[-1].labels
    # m2 has no small group: all bars
    assert len(spy[-1].fig.axes[1].patches) == 2 * len(DATASETS)


def test_boundary_small_groups_are_points_not_lines(tmp_path, spy):
    rows = make_rows(small=("m1", "nq", "A-Anchored"))
    plots_experiments.plot_boundary(
        rows, make_samples(), MODELS, TITLES, tmp_path / "a.png", tmp_path / "a.pdf"
    )
    fig = spy[-1].fig
    acc = fig.axes[0]  # (a) accuracy of m1
    nq = "#d62728"
    dashed = [ln for ln in acc.lines if ln.get_color() == nq and ln.get_linestyle() == "--"]
    assert len(dashed) == 1 and np.isnan(dashed[0].get_ydata()).all()  # no line for the small group
    points = [ln for ln in acc.lines if ln.get_color() == nq and ln.get_marker() == "o"]
    assert len(points) == 1 and len(points[0].get_xdata()) == LAYERS["m1"]
    solid = [ln for ln in acc.lines if ln.get_color() == nq and ln.get_linestyle() == "-"]
    assert np.isfinite(solid[0].get_ydata()).all()  # the Q-Anchored group is a line
    labels = spy[-1].labels
    assert labels[:3] == ["PopQA", "TriviaQA", "NQ"] and "Q-Anchored" in labels and "A-Anchored" in labels
    assert f"point: n < {MIN_LINE_N} samples" in labels
    # (c): the PopQA popularity box plot per group, with n in the tick labels
    ticks = [t.get_text() for t in fig.axes[2].get_xticklabels()]
    assert ticks == ["Q-Anchored\nn = 20", "A-Anchored\nn = 40"]


def test_boundary_without_popularity_says_so(tmp_path, spy):
    samples = make_samples().drop("s_pop")
    plots_experiments.plot_boundary(
        make_rows(), samples, MODELS, TITLES, tmp_path / "a.png", tmp_path / "a.pdf"
    )
    assert "no popularity values (PopQA only)" in _texts(spy[-1].fig)


def test_saliency_drops_non_positive_values_and_counts_them(tmp_path, spy):
    plots_experiments.plot_saliency(make_samples(), MODELS, TITLES, tmp_path / "a.png", tmp_path / "a.pdf")
    call = spy[-1]
    assert call.labels == ["PopQA", "TriviaQA", "NQ", "one sample (rug)"]
    ax = call.fig.axes[0]
    assert ax.get_xscale() == "log"
    assert "PopQA: n = 59 (1 values ≤ 0 left out)" in _texts(call.fig)
    # one density per dataset, all values positive
    curves = [ln for ln in ax.lines if ln.get_linestyle() == "-" and len(ln.get_xdata()) > 100]
    assert len(curves) == len(DATASETS) and all((ln.get_xdata() > 0).all() for ln in curves)


def test_saliency_with_few_samples_is_a_rug_of_points(tmp_path, spy):
    samples = make_samples().filter((pl.col("dataset") != "nq") | (pl.col("id").is_in(["nq-1", "nq-2"])))
    plots_experiments.plot_saliency(samples, MODELS, TITLES, tmp_path / "a.png", tmp_path / "a.pdf")
    ax = spy[-1].fig.axes[0]
    nq = [ln for ln in ax.lines if ln.get_color() == "#d62728"]
    assert len(nq) == 1 and nq[0].get_marker() == "o" and len(nq[0].get_xdata()) == 2
    assert f"point: fewer than {MIN_LINE_N} samples, no density" in spy[-1].labels


def test_experiment_layer_is_the_k_layer_column():
    rows, aw = make_rows(), make_awareness()
    assert plots_experiments.experiment_layers(rows, aw) == {(m, ds): K[m] for m in MODELS for ds in DATASETS}
    assert plots_experiments.experiment_layers(pl.DataFrame(), aw) == {
        (m, ds): K[m] for m in MODELS for ds in DATASETS
    }
    assert plots_experiments.experiment_layers(pl.DataFrame(), aw.drop("k_layer")) == {}
    assert plots_experiments.experiment_layers(pl.DataFrame(), pl.DataFrame()) == {}
    at_k = "3 (PopQA), 3 (TriviaQA), 3 (NQ) for Model One; 5 (PopQA), 5 (TriviaQA), 5 (NQ) for Model Two"
    assert plots_experiments.k_caption(rows, aw, MODELS, TITLES) == f"Experiment layer K: {at_k}."
    assert (
        plots_experiments.k_caption(None, pl.DataFrame(), MODELS, TITLES)
        == "Experiment layer K: none in the tables."
    )


def test_awareness_breaks_at_k_marks_it_and_notes_undefined(tmp_path, spy):
    aw = make_awareness(undefined=("m2", "nq"))
    plots_experiments.plot_awareness(aw, make_rows(), MODELS, TITLES, tmp_path / "a.png", tmp_path / "a.pdf")
    call = spy[-1]
    ax = call.fig.axes[0]
    popqa = [ln for ln in ax.lines if ln.get_color() == "#1f77b4" and ln.get_linestyle() == "-"][0]
    y = popqa.get_ydata()
    assert (
        len(y) == LAYERS["m1"] and np.isnan(y[K["m1"] - 1]) and np.isfinite(np.delete(y, K["m1"] - 1)).all()
    )
    assert np.isclose(y[0], 0.64)  # mean over seeds
    verticals = [ln for ln in ax.lines if ln.get_linestyle() == ":" and list(ln.get_xdata()) == [3, 3]]
    assert len(verticals) == len(DATASETS)
    assert "NQ: undefined: one group only" in "\n".join(t.get_text() for t in call.fig.axes[1].findobj(Text))
    assert call.labels == [
        "PopQA",
        "TriviaQA",
        "NQ",
        "min..max over probe seeds",
        "chance (AUC 0.5)",
        "layer K (defines the groups, not probed)",
    ]


def _pdf_font_subtypes(path: Path) -> set[str]:
    data = path.read_bytes()
    found = set(re.findall(rb"/Subtype\s*/(Type3|TrueType|Type1|CIDFontType2|Type0)", data))
    for stream in re.findall(rb"stream\r?\n(.*?)endstream", data, re.S):
        try:
            found |= set(re.findall(rb"/Subtype\s*/(Type3|TrueType|Type1)", zlib.decompress(stream)))
        except zlib.error:
            pass
    return {f.decode() for f in found}


def _fake_snakemake(tmp_path, tables: dict[str, pl.DataFrame], show_caption: bool):
    class Named(dict):  # a Snakemake NamedList: indexed by name or read by attribute, iterated over its paths
        def __getattr__(self, name):  # a missing name is an AttributeError, as in Snakemake
            try:
                return self[name]
            except KeyError:
                raise AttributeError(name) from None

        def __iter__(self):
            return iter(self.values())

    figs = [f"experiment_{f}" for f in ("patching", "answer_only", "boundary", "saliency", "awareness")]
    inputs = Named({f"{fig}_caption": str(REPO / "workflow" / "report" / f"{fig}.rst") for fig in figs})
    inputs["published"] = str(REPO / "workflow" / "report" / "published.tsv")
    for name, df in tables.items():
        inputs[name] = str(tmp_path / f"{name}.parquet")
        df.write_parquet(inputs[name])

    out = Named(
        {
            f"{fig}_{ext}": str(tmp_path / "figures" / f"{fig}_m1__m2.{ext}")
            for fig in figs
            for ext in ("png", "pdf")
        }
    )
    return SimpleNamespace(
        input=inputs,
        output=out,
        params=SimpleNamespace(models=MODELS, titles=TITLES, show_caption=show_caption),
        log=[str(tmp_path / "logs" / "plot.log")],
        rule="plot_experiments",
    )


@pytest.mark.parametrize("empty", [False, True])
def test_script_writes_every_figure(tmp_path, empty):
    tables = {"rows": make_rows(), "awareness": make_awareness(), "per_sample": make_samples()}
    if empty:
        tables = dict.fromkeys(tables, pl.DataFrame())
    sm = _fake_snakemake(tmp_path, tables, show_caption=not empty)
    runpy.run_path(str(REPO / "workflow" / "scripts" / "plot_experiments.py"), {"snakemake": sm})
    for path in sm.output.values():
        assert Path(path).stat().st_size > (1000 if empty else 5000), path
        assert Path(path).read_bytes()[:4] in (b"\x89PNG", b"%PDF")
    if not empty:  # TrueType (Type 42) fonts, the math text ($E_Q$) included; never Type 3
        fonts = _pdf_font_subtypes(Path(sm.output["experiment_saliency_pdf"]))
        assert "Type3" not in fonts and fonts & {"TrueType", "CIDFontType2"}, fonts
