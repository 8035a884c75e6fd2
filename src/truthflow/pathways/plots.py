"""The Two Pathways figures, one panel per model of a pair (seeds 000-002, 004): the line figure (A11), its
random-control companion in the same layout, the falsification figure (E_Q vs control, unsplit) and the
probe-AUC figure. Each function draws from one table and recomputes nothing.

Honest drawing: a group with fewer than MIN_LINE_N distinct samples at a layer is a point without a band,
never a line with a zero-width band; a line never crosses a layer without rows; legends list only what is
drawn."""

from __future__ import annotations

import numpy as np
import polars as pl
from matplotlib.lines import Line2D
from matplotlib.patches import Patch
from matplotlib.ticker import MaxNLocator

from ..plotting import COLOURS, DATASETS, DPI, colour, datasets_in, label  # noqa: F401
from ..plotting import figure as _figure
from ..plotting import finish as _finish
from ..stats import MIN_CI_N

STYLES = {"Q-Anchored": "-", "A-Anchored": "--"}
KNOCKOUT_STYLES = {"target": "-", "control": ":"}
MIN_LINE_N = MIN_CI_N  # a group with fewer samples has no CI: drawn as points


def _notes(ax, notes: list[str]) -> None:
    """Why a dataset has no curve in this panel (probe undefined, no rows), written in the panel."""
    if notes:
        ax.text(
            0.02, 0.02, "\n".join(notes), transform=ax.transAxes, fontsize=7, color="firebrick", va="bottom"
        )


def _blank_if_empty(ax, notes: list[str]) -> None:
    """Only the zero line drawn: an empty scale would suggest values that are not there."""
    if len(ax.lines) <= 1:
        ax.set_yticks([])
        ax.set_xticks([])
        if not notes:
            notes.append("no ΔP rows")


def _layer_axis(ax) -> None:
    ax.set_xlabel("Layer")
    ax.xaxis.set_major_locator(MaxNLocator(integer=True))
    ax.grid(alpha=0.3)


def draw_series(ax, rows: pl.DataFrame, n_layers: int, col: str, style: str, y: str = "mean_delta_p") -> bool:
    """One series over layers 1..n_layers: a line with its CI band where n >= MIN_LINE_N, points where
    0 < n < MIN_LINE_N, nothing (a break) where a layer has no rows. Returns whether anything was drawn."""
    if rows.height == 0:
        return False
    x = np.arange(1, n_layers + 1)
    full = pl.DataFrame({"layer": x}).join(rows, on="layer", how="left")
    n = full["n"].fill_null(0).to_numpy()
    mean = full[y].cast(pl.Float64).to_numpy()
    big, small = n >= MIN_LINE_N, (n > 0) & (n < MIN_LINE_N)
    ax.plot(x, np.where(big, mean, np.nan), style, color=col, lw=1.6)
    if "ci_low" in full.columns and y == "mean_delta_p":
        lo = full["ci_low"].cast(pl.Float64).to_numpy()
        hi = full["ci_high"].cast(pl.Float64).to_numpy()
        ok = big & np.isfinite(lo) & np.isfinite(hi)
        ax.fill_between(x, np.where(ok, lo, np.nan), np.where(ok, hi, np.nan), color=col, alpha=0.13, lw=0)
    if small.any():
        ax.plot(x[small], mean[small], "o", color=col, ms=3.5, mfc="none" if style != "-" else col, ls="none")
    return True


def _status_notes(auc: pl.DataFrame, model: str, ds: str) -> str | None:
    bad = auc.filter((pl.col("model") == model) & (pl.col("dataset") == ds) & (pl.col("status") != "ok"))
    return f"{label(ds)}: {bad['status'][0]}" if bad.height else None


def _panel_datasets(table: pl.DataFrame, auc: pl.DataFrame, model: str, notes: list[str]):
    """The datasets of one model's panel with their rows; a dataset whose probe is undefined goes to
    `notes` instead."""
    for ds in datasets_in(table.filter(pl.col("model") == model)) or datasets_in(
        auc.filter(pl.col("model") == model)
    ):
        note = _status_notes(auc, model, ds)
        if note:
            notes.append(note)
            continue
        yield ds, table.filter((pl.col("model") == model) & (pl.col("dataset") == ds))


def _legend_entries(drawn, styles: dict[str, str], names: dict[str, str]) -> tuple[list, list[str]]:
    """Legend handles for the (series, dataset) pairs drawn, datasets in registry order."""
    handles, labels = [], []
    for ds in DATASETS | {d: d for _, d in drawn}:
        for key, style in styles.items():
            if (key, ds) in drawn:
                handles.append(Line2D([], [], color=colour(ds), ls=style, lw=1.6))
                labels.append(f"{names[key]} ({label(ds)})")
    return handles, labels


def _n_layers(table: pl.DataFrame, model: str) -> int:
    sub = table.filter(pl.col("model") == model)
    return int(sub["layer"].max()) if sub.height and sub["layer"].max() is not None else 0


def plot_anchored(
    summary: pl.DataFrame,
    auc: pl.DataFrame,
    models: list[str],
    titles: dict[str, str],
    out_png,
    out_pdf,
    caption: str = "",
    knockout: str = "target",
) -> None:
    """Per-layer mean ΔP with its 95% CI, split Q-/A-Anchored: colour = dataset, solid = Q-Anchored, dashed
    = A-Anchored (the seeds' layout). knockout='control' draws the same for the matched random control."""
    summary = summary.filter(pl.col("knockout") == knockout) if "knockout" in summary.columns else summary
    fig, axes = _figure(len(models))
    drawn: list[tuple[str, str]] = []
    small_points = False
    for ax, model in zip(axes[0], models, strict=False):
        ax.set_title(titles.get(model, model), fontsize=11)
        _layer_axis(ax)
        ax.axhline(0, color="0.6", lw=0.8, zorder=0)
        n_layers = _n_layers(summary, model)
        notes = []
        for ds, sub in _panel_datasets(summary, auc, model, notes):
            for anchor, style in STYLES.items():
                s = sub.filter(pl.col("anchor") == anchor)
                if draw_series(ax, s, n_layers, colour(ds), style):
                    drawn.append((anchor, ds))
                    small_points |= bool(((s["n"] > 0) & (s["n"] < MIN_LINE_N)).any())
        _blank_if_empty(ax, notes)
        _notes(ax, notes)
    axes[0][0].set_ylabel("ΔP" if knockout == "target" else "ΔP (random-token control)")
    handles, labels = _legend_entries(drawn, STYLES, {a: a for a in STYLES})
    if small_points:
        handles.append(Line2D([], [], color="0.3", marker="o", ls="none", ms=3.5))
        labels.append(f"point: n < {MIN_LINE_N} samples at that layer")
    _finish(fig, handles, labels, caption, out_png, out_pdf, ncol=2 if len(models) == 1 else 4)


def plot_pathways(summary, auc, models, titles, out_png, out_pdf, caption: str = "") -> None:
    """The seeds' figure: E_Q knockout, Q-/A-Anchored."""
    plot_anchored(summary, auc, models, titles, out_png, out_pdf, caption, knockout="target")


def plot_check(
    summary: pl.DataFrame,
    check: pl.DataFrame,
    auc: pl.DataFrame,
    models: list[str],
    titles: dict[str, str],
    out_png,
    out_pdf,
    caption: str = "",
    target_label: str = "E_Q knockout",
) -> None:
    """The falsification test: unsplit mean ΔP (top) and flip rate (bottom) per layer, E_Q knockout (solid)
    against the matched random control (dotted), over the same samples; each panel lists the verdicts
    (with the primary measure's E_Q − control and its corrected CI) and shades the layers they average."""
    unsplit = summary.filter(pl.col("anchor") == "all")
    fig, axes = _figure(len(models), n_rows=2, height=2.9)
    drawn: set[tuple[str, str]] = set()
    shaded = False
    for col, model in enumerate(models):
        top, bottom = axes[0][col], axes[1][col]
        top.set_title(titles.get(model, model), fontsize=11)
        for ax in (top, bottom):
            _layer_axis(ax)
            ax.axhline(0, color="0.6", lw=0.8, zorder=0)
        n_layers = _n_layers(unsplit, model)
        notes, verdicts, span = [], [], None
        for ds, sub in _panel_datasets(unsplit, auc, model, notes):
            for knockout, style in KNOCKOUT_STYLES.items():
                s = sub.filter(pl.col("knockout") == knockout)
                if draw_series(top, s, n_layers, colour(ds), style):
                    drawn.add((knockout, ds))
                    draw_series(
                        bottom,
                        s.with_columns(pl.col("flip_rate") * 100),
                        n_layers,
                        colour(ds),
                        style,
                        "flip_rate",
                    )
            c = check.filter((pl.col("model") == model) & (pl.col("dataset") == ds))
            if c.height:
                r = c.row(0, named=True)
                ci = (
                    f"; E_Q − control {r['diff']:+.2f} [{r['diff_low']:.2f}, {r['diff_high']:.2f}]"
                    if r["diff_low"] is not None
                    else ""
                )
                verdicts.append(f"{label(ds)}: {r['verdict']} (n={r['n_samples']}{ci})")
                span = span or (r["layer_from"] is not None and (r["layer_from"], r["layer_to"]))
        if span:
            for ax in (top, bottom):
                ax.axvspan(span[0] - 0.5, span[1] + 0.5, color="0.92", lw=0, zorder=0)
            shaded = True
        _blank_if_empty(top, notes)
        _blank_if_empty(bottom, [])
        if verdicts:
            bottom.text(
                0.02,
                0.97,
                "\n".join(verdicts),
                transform=bottom.transAxes,
                fontsize=7,
                va="top",
                color="0.15",
                bbox={"facecolor": "white", "alpha": 0.8, "lw": 0},
            )
        _notes(top, notes)
    axes[0][0].set_ylabel("ΔP, all samples")
    axes[1][0].set_ylabel("Flip rate (%)")
    names = {"target": target_label, "control": "random-token control"}
    handles, labels = _legend_entries(drawn, KNOCKOUT_STYLES, names)
    if shaded:
        handles.append(Patch(color="0.92"))
        labels.append("layers averaged for the verdict")
    _finish(fig, handles, labels, caption, out_png, out_pdf, ncol=2 if len(models) == 1 else 4)


def plot_probe_auc(
    auc: pl.DataFrame, models: list[str], titles: dict[str, str], out_png, out_pdf, caption: str = ""
) -> None:
    """Cross-fitted test AUC of the correctness probe by layer: mean over seeds, band = min..max."""
    fig, axes = _figure(len(models))
    drawn: set[str] = set()
    for ax, model in zip(axes[0], models, strict=False):
        ax.set_title(titles.get(model, model), fontsize=11)
        _layer_axis(ax)
        ax.axhline(0.5, color="0.6", lw=0.8, ls=":", zorder=0)
        ax.set_ylim(0.3, 1.02)
        notes = []
        for ds in datasets_in(auc.filter(pl.col("model") == model)):
            note = _status_notes(auc, model, ds)
            if note:
                notes.append(note)
                continue
            sub = auc.filter((pl.col("model") == model) & (pl.col("dataset") == ds))
            agg = (
                sub.group_by("layer")
                .agg(
                    pl.col("auc").mean().alias("m"),
                    pl.col("auc").min().alias("lo"),
                    pl.col("auc").max().alias("hi"),
                )
                .sort("layer")
            )
            x = agg["layer"].to_numpy()
            ax.plot(x, agg["m"].to_numpy(), color=colour(ds), lw=1.6)
            ax.fill_between(x, agg["lo"].to_numpy(), agg["hi"].to_numpy(), color=colour(ds), alpha=0.15, lw=0)
            drawn.add(ds)
        _notes(ax, notes)
    axes[0][0].set_ylabel("Probe test AUC")
    order = [d for d in DATASETS if d in drawn] + sorted(drawn - set(DATASETS))
    handles = [Line2D([], [], color=colour(d), lw=1.6) for d in order]
    _finish(
        fig, handles, [label(d) for d in order], caption, out_png, out_pdf, ncol=2 if len(models) == 1 else 4
    )
