"""The DepthQA figure (seed 003): depthwise MIN-K% box plots and score-gap densities, one panel per model.

Each function draws one figure from one table and computes no science; an empty or thin table gives panels
that say why, never an exception.
"""

from __future__ import annotations

import textwrap
from pathlib import Path

import matplotlib
import numpy as np
import polars as pl
import seaborn as sns
from matplotlib.figure import Figure

DEPTH_COLOURS = {1: "tab:blue", 2: "tab:orange", 3: "tab:green"}
SIDE_COLOURS = {"lower": "tab:green", "upper": "tab:orange"}
NO_GRAPH_NOTE = "no graph: score gap undefined"
PANEL_W, PANEL_H = 3.4, 3.2  # inches per panel
DPI = 200
STYLE = {"font.size": 9, "axes.titlesize": 10, "axes.labelsize": 9, "legend.fontsize": 8, "pdf.fonttype": 42}


def _letter(i: int) -> str:
    return f"({chr(ord('a') + i)})"


def _figure(n_panels: int, caption: str, sharey: bool, xlabel: bool) -> tuple[Figure, list, list[str]]:
    n_panels = max(1, n_panels)
    width = PANEL_W * n_panels + 0.3
    lines = textwrap.wrap(caption, width=int(width * 15)) if caption else []
    caption_h = 0.14 * len(lines) + (0.15 if lines else 0.0)
    height = PANEL_H + caption_h
    fig = Figure(figsize=(width, height), dpi=DPI)
    axes = fig.subplots(1, n_panels, sharey=sharey, squeeze=False)[0]
    bottom = ((0.55 if xlabel else 0.45) + caption_h) / height
    fig.subplots_adjust(
        left=0.6 / width, right=1 - 0.1 / width, top=1 - 0.35 / height, bottom=bottom, wspace=0.3
    )
    return fig, list(axes), lines


def _finish(fig: Figure, lines: list[str], out_png: str | Path, out_pdf: str | Path) -> None:
    if lines:
        fig.text(0.01, 0.02, "\n".join(lines), ha="left", va="bottom", fontsize=7.5, color="0.25")
    for out in (out_png, out_pdf):
        Path(out).parent.mkdir(parents=True, exist_ok=True)
        fig.savefig(out, dpi=DPI)


def _note(ax, text: str, clear_y: bool = True) -> None:
    if clear_y:  # an empty panel's y scale would suggest values that are not there
        ax.set_yticks([])
    ax.text(0.5, 0.5, text, transform=ax.transAxes, ha="center", va="center", fontsize=8, color="0.35")


def plot_depth_boxes(
    depthwise_df: pl.DataFrame,
    models: list[str],
    titles: dict[str, str],
    out_png: str | Path,
    out_pdf: str | Path,
    caption: str,
) -> None:
    """Box plot per model of the depthwise average MIN-K% (columns model, depth, mink) at Depth 1/2/3."""
    with matplotlib.rc_context(STYLE), sns.axes_style("whitegrid"):
        fig, axes, lines = _figure(len(models), caption, sharey=True, xlabel=False)
        top = 0.0
        for i, (ax, model) in enumerate(zip(axes, models or [""], strict=False)):
            ax.set_title(f"{_letter(i)} {titles.get(model, model)}")
            ax.set_xticks([1, 2, 3], [f"Depth {d}" for d in (1, 2, 3)])
            ax.set_xlim(0.4, 3.6)
            if i == 0:
                ax.set_ylabel("Depthwise Average MIN-K%")
            part = depthwise_df.filter(pl.col("model") == model) if depthwise_df.height else depthwise_df
            values = {
                d: part.filter(pl.col("depth") == d)["mink"].drop_nulls().drop_nans().to_numpy()
                if part.height
                else []
                for d in (1, 2, 3)
            }
            present = [d for d in (1, 2, 3) if len(values[d])]
            if not present:
                _note(ax, "no MIN-K% values for this model", clear_y=False)  # y is shared
                continue
            boxes = ax.boxplot(
                [values[d] for d in present],
                positions=present,
                widths=0.55,
                patch_artist=True,
                manage_ticks=False,
                medianprops={"color": "black", "linewidth": 1.2},
                flierprops={"marker": "o", "markersize": 3, "markeredgecolor": "0.3", "alpha": 0.6},
            )
            for patch, d in zip(boxes["boxes"], present, strict=True):
                patch.set_facecolor(DEPTH_COLOURS[d])
                patch.set_edgecolor("0.2")
            for d in (1, 2, 3):
                if len(values[d]) == 0:
                    ax.text(d, 0.02, "no data", ha="center", va="bottom", fontsize=7, color="0.4",
                            transform=ax.get_xaxis_transform())  # fmt: skip
            ax.set_xticks([1, 2, 3], [f"Depth {d}\n(n={len(values[d])})" for d in (1, 2, 3)])
            top = max(top, max(float(np.max(values[d])) for d in present))
        axes[0].set_ylim(0, top * 1.12 if top > 0 else 1)
        _finish(fig, lines, out_png, out_pdf)


def _density_panel(ax, part: pl.DataFrame) -> None:
    notes = []
    drawn = kde = False
    for side in ("lower", "upper"):
        rows = part.filter(pl.col("side") == side) if part.height else part
        label = rows["subset"][0] if rows.height else {"lower": "25%", "upper": "75%"}[side]
        gaps = rows["gap"].drop_nulls().drop_nans().to_numpy() if rows.height else np.array([])
        colour = SIDE_COLOURS[side]
        if len(np.unique(gaps)) >= 2:
            sns.kdeplot(x=gaps, ax=ax, fill=True, alpha=0.4, color=colour, linewidth=1.2, label=label,
                        warn_singular=False)  # fmt: skip
            drawn = kde = True
        elif len(gaps):
            # a KDE needs spread; a single distinct value is shown as a line at that value
            ax.axvline(gaps[0], color=colour, linewidth=2, alpha=0.8, label=f"{label} (n={len(gaps)})")
            notes.append(f"{label}: one distinct value, no KDE")
            drawn = True
        else:
            notes.append(f"{label}: no groups")
    if not drawn:
        _note(ax, "\n".join(notes))
        return
    if kde:  # headroom so the legend sits above the curves; notes ride in its title so nothing collides
        ax.set_ylim(0, ax.get_ylim()[1] * 1.35)
    else:  # lines alone have no density scale
        ax.set_yticks([])
    legend = ax.legend(loc="upper right", frameon=True, title="\n".join(notes) or None)
    if notes:
        legend.get_title().set_fontsize(7)
        legend.get_title().set_color("0.3")


def plot_score_gap_density(
    subset_df: pl.DataFrame,
    models: list[str],
    titles: dict[str, str],
    out_png: str | Path,
    out_pdf: str | Path,
    caption: str,
    empty_note: str = NO_GRAPH_NOTE,
) -> None:
    """Filled KDE per model of the score gap for the "25%" (green) and "75%" (orange) subsets.

    subset_df: memorization_split output (columns model, subset, side, gap).
    """
    with matplotlib.rc_context(STYLE), sns.axes_style("whitegrid"):
        fig, axes, lines = _figure(len(models), caption, sharey=False, xlabel=True)
        for i, (ax, model) in enumerate(zip(axes, models or [""], strict=False)):
            ax.set_title(f"{_letter(i)} {titles.get(model, model)}")
            ax.set_xlim(-1.5, 1.5)
            ax.set_xticks(np.arange(-1.5, 1.51, 0.5))
            ax.set_xlabel("Score Gap (D3 - D2)")
            ax.set_ylabel("Density")
            if subset_df.height == 0:
                _note(ax, empty_note)
                continue
            part = subset_df.filter(pl.col("model") == model)
            if part.height == 0:
                _note(ax, "no score gaps for this model")
                continue
            _density_panel(ax, part)
        _finish(fig, lines, out_png, out_pdf)
