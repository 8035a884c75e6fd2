"""Plot helpers shared by every figure: TrueType fonts in PDFs, the registry's dataset names and colours, a
panel grid, and a finish that places legend and caption after measuring what is drawn (nothing overlaps,
nothing is clipped)."""

from __future__ import annotations

import textwrap
from pathlib import Path

import matplotlib
import numpy as np
import polars as pl
import seaborn as sns
from matplotlib.backends.backend_agg import FigureCanvasAgg
from matplotlib.figure import Figure

from . import registry

# TrueType (Type 42) fonts in PDFs: many venues reject Type 3
matplotlib.rcParams["pdf.fonttype"] = 42
matplotlib.rcParams["ps.fonttype"] = 42

# display names and colours of the registered QA sets, in registry order (legends follow it)
DATASETS = {s.name: s.display for s in registry.QA_SETS}
COLOURS = {s.name: s.colour for s in registry.QA_SETS}
DPI = 200


def label(ds: str) -> str:
    return DATASETS.get(ds, ds)


def colour(ds: str) -> str:
    if ds not in COLOURS:
        extra = sns.color_palette("tab10", 10).as_hex()
        COLOURS[ds] = extra[len(COLOURS) % 10]
    return COLOURS[ds]


def datasets_in(table: pl.DataFrame) -> list[str]:
    present = set(table["dataset"].unique().to_list()) if table.height else set()
    return [d for d in DATASETS if d in present] + sorted(present - set(DATASETS))


def figure(n_cols: int, n_rows: int = 1, height: float = 3.2) -> tuple[Figure, np.ndarray]:
    width = 4.6 * max(1, n_cols)
    fig = Figure(figsize=(width, height * n_rows), dpi=DPI)
    axes = fig.subplots(n_rows, max(1, n_cols), squeeze=False)
    fig.subplots_adjust(
        left=0.75 / width,
        right=1 - 0.15 / width,
        top=1 - 0.35 / (height * n_rows),
        bottom=0.5 / (height * n_rows),
        wspace=0.22,
        hspace=0.35,
    )
    return fig, axes


def finish(fig: Figure, handles, labels, caption: str, png, pdf, ncol: int = 4) -> None:
    """One legend below all panels, the caption below the legend, both placed after measuring what is
    drawn (nothing overlaps), and a 'tight' bounding box on save (nothing is clipped)."""
    canvas = FigureCanvasAgg(fig)
    canvas.draw()
    to_fig = fig.transFigure.inverted()
    axes_bottom = min(
        ax.get_tightbbox(canvas.get_renderer()).transformed(to_fig).y0 for ax in fig.axes if ax.get_visible()
    )
    bottom = axes_bottom - 0.01
    if handles:
        legend = fig.legend(
            handles,
            labels,
            loc="upper center",
            bbox_to_anchor=(0.5, bottom),
            ncol=min(ncol, len(handles)),
            frameon=False,
            fontsize=8,
        )
        canvas.draw()
        bottom = legend.get_window_extent().transformed(to_fig).y0 - 0.01
    if caption:
        width_chars = int(fig.get_figwidth() * 15)
        text = "\n".join(textwrap.wrap(caption, width=width_chars))
        fig.text(0.01, bottom, text, ha="left", va="top", fontsize=7, color="0.3")
    for out in (png, pdf):
        Path(out).parent.mkdir(parents=True, exist_ok=True)
        fig.savefig(out, dpi=DPI, bbox_inches="tight", pad_inches=0.08)
