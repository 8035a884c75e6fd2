"""The Two Pathways figures, one panel per model of a pair (seeds 000-002, 004): the line figure (A11) and its
random-control twin, the falsification figure (E_Q vs control, unsplit), the probe AUC; one table each."""

from functools import partial

import polars as pl
from matplotlib.patches import Patch

from .. import plotting
from ..plotting import MIN_LINE_N, colour, label

STYLES = {"Q-Anchored": "-", "A-Anchored": "--"}
KNOCKOUT_STYLES = {"target": "-", "control": ":"}
TARGETS = {"exact_question": "E_Q knockout", "random": "random-token target (negative control)"}
_finish = plotting.finish  # module attribute: tests replace it to inspect the legend


def _panel_datasets(table: pl.DataFrame, auc: pl.DataFrame, model: str, notes: list[str]):
    """(dataset, its rows, the panel's layers) per dataset of a model; an undefined probe gives a note."""
    mine = table.filter(pl.col("model") == model)
    probes = auc.filter(pl.col("model") == model)
    n_layers = int(mine["layer"].max() or 0)
    for ds in plotting.datasets_in(mine) or plotting.datasets_in(probes):
        bad = probes.filter((pl.col("dataset") == ds) & (pl.col("status") != "ok"))
        if bad.height:
            notes.append(f"{label(ds)}: {bad['status'][0]}")
        else:
            yield ds, mine.filter(pl.col("dataset") == ds), n_layers


def _legend(drawn, styles: dict[str, str], names: dict[str, str], *extras) -> tuple[list, list[str]]:
    """The (series, dataset) pairs drawn, datasets in registry order, then the `extras`."""
    datasets = plotting.ordered(d for _, d in drawn)
    pairs = [(k, ds) for ds in datasets for k in styles if (k, ds) in drawn]
    entries = [(plotting.line(colour(ds), styles[k]), f"{names[k]} ({label(ds)})") for k, ds in pairs]
    return plotting.legend(entries, *extras)


def _legend_columns(models: list[str]) -> int:
    """Two legend columns under one panel, four under a pair."""
    return 2 if len(models) == 1 else 4


def _panels(models, titles, n_rows: int = 1, height: float = 3.2, y: float = 0, ls: str = "-"):
    """Panels over layers with a reference line at `y` (zero ΔP, chance AUC)."""
    fig, axes = plotting.panels(models, titles, n_rows=n_rows, height=height)
    for ax in axes.flat[: len(models) * n_rows]:
        plotting.layer_axis(ax)
        ax.axhline(y, color="0.6", lw=0.8, ls=ls, zorder=0)
    return fig, axes


def _close(ax, notes: list[str], empty: str = "no ΔP rows") -> None:
    """Only the zero line drawn: an empty scale would suggest values that are not there."""
    if len(ax.lines) <= 1:
        ax.set(yticks=[], xticks=[])
        if not notes:
            notes = [empty] if empty else []
    plotting.note(ax, notes)


def plot_anchored(summary, auc, models, titles, out_png, out_pdf, caption: str = "", knockout="target"):
    """Per-layer mean ΔP with its 95% CI, split Q-/A-Anchored: colour = dataset, solid = Q-Anchored, dashed
    = A-Anchored (the seeds' layout). knockout='control' draws the same for the matched random control."""
    summary = summary.filter(pl.col("knockout") == knockout)
    fig, axes = _panels(models, titles)
    drawn = set()
    small = False  # whether any group was drawn as points
    for ax, model in zip(axes[0], models, strict=False):
        notes = []
        for ds, sub, n_layers in _panel_datasets(summary, auc, model, notes):
            small |= plotting.draw_styles(ax, sub, "anchor", STYLES, ds, n_layers, drawn)
        _close(ax, notes)
    axes[0][0].set_ylabel("ΔP" if knockout == "target" else "ΔP (random-token control)")
    point = small and plotting.marker(f"point: n < {MIN_LINE_N} samples at that layer")
    handles, labels = _legend(drawn, STYLES, {a: a for a in STYLES}, point)
    _finish(fig, handles, labels, caption, out_png, out_pdf, ncol=_legend_columns(models))


plot_pathways = partial(plot_anchored, knockout="target")  # the seeds' figure: E_Q knockout, Q-/A-Anchored


def plot_check(
    summary, check, auc, models, titles, out_png, out_pdf, caption: str = "", target: str = "exact_question"
) -> None:
    """The falsification figure (METHOD A11): unsplit mean ΔP (top) and flip rate (bottom) per layer, E_Q
    (solid) vs the matched control (dotted); the verdicts listed, the layers they average shaded."""
    unsplit = summary.filter(pl.col("anchor") == "all").with_columns(pl.col("flip_rate") * 100)
    fig, axes = _panels(models, titles, n_rows=2, height=2.9)
    drawn = set()
    shaded = False
    for top, bottom, model in zip(axes[0], axes[1], models, strict=False):
        notes = []
        verdicts = []
        span = None  # the layers the verdicts average, as the first dataset's check row gives them
        for ds, sub, n_layers in _panel_datasets(unsplit, auc, model, notes):
            plotting.draw_styles(top, sub, "knockout", KNOCKOUT_STYLES, ds, n_layers, drawn)
            plotting.draw_styles(bottom, sub, "knockout", KNOCKOUT_STYLES, ds, n_layers, set(), y="flip_rate")
            for r in check.filter(model=model, dataset=ds).head(1).iter_rows(named=True):
                if r["diff_low"] is not None:
                    ci = f"; E_Q − control {r['diff']:+.2f} [{r['diff_low']:.2f}, {r['diff_high']:.2f}]"
                else:
                    ci = ""
                verdicts.append((f"{label(ds)}: {r['verdict']} (n={r['n_samples']}{ci})", "0.15"))
                if not span and r["layer_from"] is not None:
                    span = (r["layer_from"], r["layer_to"])
        if span:
            for ax in (top, bottom):
                ax.axvspan(span[0] - 0.5, span[1] + 0.5, color="0.92", lw=0, zorder=0)
            shaded = True
        _close(top, notes)
        _close(bottom, [], empty="")
        plotting.note(bottom, verdicts, loc="upper left")
    axes[0][0].set_ylabel("ΔP, all samples")
    axes[1][0].set_ylabel("Flip rate (%)")
    names = {"target": TARGETS[target], "control": "random-token control"}
    shade = shaded and (Patch(color="0.92"), "layers averaged for the verdict")
    handles, labels = _legend(drawn, KNOCKOUT_STYLES, names, shade)
    _finish(fig, handles, labels, caption, out_png, out_pdf, ncol=_legend_columns(models))


def plot_probe_auc(auc, models, titles, out_png, out_pdf, caption: str = "") -> None:
    """Cross-fitted test AUC of the correctness probe by layer: mean over seeds, band = min..max."""
    fig, axes = _panels(models, titles, y=0.5, ls=":")
    drawn = set()
    for ax, model in zip(axes[0], models, strict=False):
        ax.set_ylim(0.3, 1.02)
        notes = []
        for ds, sub, _ in _panel_datasets(auc, auc, model, notes):
            plotting.band_by_layer(ax, sub, colour(ds))
            drawn.add(ds)
        plotting.note(ax, notes)
    axes[0][0].set_ylabel("Probe test AUC")
    handles, labels = plotting.dataset_legend(drawn)
    _finish(fig, handles, labels, caption, out_png, out_pdf, ncol=_legend_columns(models))
