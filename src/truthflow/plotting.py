"""The plotting layer of every figure: TrueType PDF fonts, registry names and colours, panels with a legend
and caption below; a group under MIN_LINE_N samples is a point, a line never crosses a layer without rows."""

import textwrap
from collections.abc import Mapping
from pathlib import Path

import matplotlib
import numpy as np
import polars as pl
import seaborn as sns
from matplotlib.figure import Figure
from matplotlib.lines import Line2D
from matplotlib.offsetbox import AnchoredOffsetbox, TextArea, VPacker
from matplotlib.ticker import MaxNLocator

from . import registry
from .stats import MIN_CI_N

# TrueType (Type 42) fonts in PDFs: many venues reject Type 3
matplotlib.rcParams.update({"pdf.fonttype": 42, "ps.fonttype": 42})

DATASETS = {s.name: s.display for s in registry.QA_SETS}
COLOURS = {s.name: s.colour for s in registry.QA_SETS}
DPI = 200
MIN_LINE_N = MIN_CI_N  # a group with fewer samples has no CI: drawn as points
NOTE_COLOUR = "firebrick"
LEGEND = {"loc": "outside lower center", "frameon": False, "fontsize": 8}


def label(ds: str) -> str:
    return DATASETS.get(ds, ds)


def colour(ds: str) -> str:
    if ds not in COLOURS:  # an unregistered dataset: the next tab10 hue
        COLOURS[ds] = sns.color_palette("tab10", 10).as_hex()[len(COLOURS) % 10]
    return COLOURS[ds]


def ordered(datasets) -> list[str]:
    """Datasets in registry order, unregistered ones after them, sorted."""
    present = set(datasets)
    return [d for d in DATASETS if d in present] + sorted(present - set(DATASETS))


def datasets_in(table: pl.DataFrame) -> list[str]:
    return ordered(table["dataset"].unique().to_list()) if table.height else []


def table(df: pl.DataFrame | None, schema: Mapping[str, pl.DataType], optional=()) -> pl.DataFrame:
    """`df`, or an empty table of `schema` if missing, empty or short of a column; absent `optional`s null."""
    optional = [c for c in ("k_layer", *optional) if c in schema]
    required = [c for c in schema if c not in optional]
    if df is None or df.height == 0 or any(c not in df.columns for c in required):
        return pl.DataFrame(schema=dict(schema))
    absent = [c for c in optional if c not in df.columns]
    return df.with_columns(pl.lit(None, dtype=schema[c]).alias(c) for c in absent)


def ylabel(axes_row, text: str) -> None:
    """The y label on the first panel with a scale (a blank panel has no y ticks)."""
    for ax in axes_row:
        if len(ax.get_yticks()):
            return ax.set_ylabel(text)


def legend(pairs, *extras) -> tuple[list, list[str]]:
    """Handles and labels of `pairs`, then of the truthy `extras` (`condition and (handle, text)`)."""
    pairs = [*pairs, *(e for e in extras if e)]
    return [h for h, _ in pairs], [t for _, t in pairs]


def dataset_legend(drawn, *extras) -> tuple[list, list[str]]:
    """The drawn datasets in registry order, then the `extras`."""
    return legend([(line(colour(d)), label(d)) for d in ordered(drawn)], *extras)


def figure(n_cols: int, n_rows: int = 1, height: float = 3.2, width: float = 4.6, **kw):
    """The panels: a subfigure (constrained layout) of the figure that holds finish()'s caption below it."""
    fig = Figure(figsize=(width * max(1, n_cols), height * n_rows), dpi=DPI, layout="constrained")
    panels = fig.subfigures(1, 1)
    return panels, panels.subplots(n_rows, max(1, n_cols), squeeze=False, **kw)


def finish(panels, handles, labels, caption: str, png, pdf, ncol: int = 4) -> None:
    """One legend below all panels, the caption as the figure's x label below it (grown by its height)."""
    fig = panels.figure
    if handles:
        panels.legend(handles, labels, ncol=min(ncol, len(handles)), **LEGEND)
    if caption:
        lines = textwrap.wrap(caption, width=int(fig.get_figwidth() * 15))
        fig.set_size_inches(fig.get_figwidth(), fig.get_figheight() + 0.13 * len(lines) + 0.1)
        fig.supxlabel("\n".join(lines), x=0.01, ha="left", fontsize=7, color="0.3")
    for out in (png, pdf):
        Path(out).parent.mkdir(parents=True, exist_ok=True)
        fig.savefig(out, dpi=DPI, bbox_inches="tight", pad_inches=0.08)


def line(col: str, ls: str = "-", **kw) -> Line2D:
    return Line2D([], [], color=col, ls=ls, lw=kw.pop("lw", 1.6), **kw)


def marker(text: str, m: str = "o", col: str = "0.3", ms: float = 3.5) -> tuple[Line2D, str]:
    """A legend entry: a marker without a line (by default the point of a group below MIN_LINE_N)."""
    return Line2D([], [], color=col, marker=m, ls="none", ms=ms), text


def note(ax, lines: list[tuple[str, str]] | list[str], loc: str = "lower left") -> None:
    """A box of small coloured notes wrapped to the panel's width; a plain string is in NOTE_COLOUR."""
    chars = max(24, int(ax.get_position().width * ax.figure.figure.get_figwidth() * 15))
    pairs = ((x, NOTE_COLOUR) if isinstance(x, str) else x for x in lines)
    rows = [TextArea(textwrap.fill(t, chars), textprops={"fontsize": 6.5, "color": c}) for t, c in pairs]
    if rows:
        align = "right" if loc.endswith("right") else "left"
        child = VPacker(children=rows, align=align, pad=0, sep=2)
        box = AnchoredOffsetbox(loc, child=child, borderpad=0.4, zorder=6)
        box.patch.set(facecolor="white", alpha=0.75, lw=0)
        ax.add_artist(box)


def blank(ax, why: str = "") -> None:
    """A panel with nothing drawn: no ticks (an empty scale would suggest values), only the reason."""
    ax.set(xticks=[], yticks=[], xlabel="")
    ax.grid(False)
    note(ax, [why] if why else [])


def per_model(axes_row, table: pl.DataFrame, models: list[str], why: str):
    """(panel, model, its rows) per model with rows; one without: a blank panel, "`why` for this model"."""
    for ax, model in zip(axes_row, models, strict=False):
        sub = table.filter(pl.col("model") == model)
        if sub.height:
            yield ax, model, sub
        else:
            blank(ax, f"{why} for this model")


def layer_axis(ax) -> None:
    ax.set_xlabel("Layer")
    ax.xaxis.set_major_locator(MaxNLocator(integer=True))
    ax.grid(alpha=0.3)


def panels(models: list[str], names: dict[str, str], **kw):
    """figure() with a panel per model, titled by `names` (no model: one panel that says so)."""
    fig, axes = figure(len(models), **kw)
    for ax, model in zip(axes[0], models, strict=False):
        ax.set_title(names.get(model, model), fontsize=11)
    if not models:
        blank(axes[0][0], "no models in this figure")
    return fig, axes


def draw_series(ax, rows: pl.DataFrame, n_layers: int, col: str, style: str, y: str = "mean_delta_p") -> bool:
    """One series over layers 1..n_layers: a line with its CI band where n >= MIN_LINE_N, points where
    0 < n < MIN_LINE_N, nothing (a break) where a layer has no rows. Returns whether anything was drawn."""
    if rows.height == 0:
        return False
    x = np.arange(1, n_layers + 1)
    full = pl.DataFrame({"layer": x}).join(rows, on="layer", how="left")
    n = full["n"].fill_null(0).to_numpy()
    mean = full[y].cast(pl.Float64).to_numpy()
    as_line = n >= MIN_LINE_N
    as_points = (n > 0) & (n < MIN_LINE_N)
    ax.plot(x, np.where(as_line, mean, np.nan), style, color=col, lw=1.6)
    if "ci_low" in full.columns and y == "mean_delta_p":
        lo = full["ci_low"].cast(pl.Float64).to_numpy()
        hi = full["ci_high"].cast(pl.Float64).to_numpy()
        ok = as_line & np.isfinite(lo) & np.isfinite(hi)
        ax.fill_between(x, np.where(ok, lo, np.nan), np.where(ok, hi, np.nan), color=col, alpha=0.13, lw=0)
    if as_points.any():
        fill = col if style == "-" else "none"  # a dashed or dotted series' points are hollow
        ax.plot(x[as_points], mean[as_points], "o", color=col, ms=3.5, mfc=fill)
    return True


def draw_styles(ax, sub: pl.DataFrame, column: str, styles: dict, ds: str, n_layers: int, drawn: set, **kw):
    """draw_series per value of `column` in its style, (value, ds) into `drawn`; whether any has points."""
    small = False
    for key, style in styles.items():
        rows = sub.filter(pl.col(column) == key)
        if draw_series(ax, rows, n_layers, colour(ds), style, **kw):
            drawn.add((key, ds))
            as_points = (rows["n"] > 0) & (rows["n"] < MIN_LINE_N)
            small |= bool(as_points.any())
    return small


def band_by_layer(ax, sub: pl.DataFrame, col: str, n_layers: int = 0) -> pl.DataFrame:
    """Mean AUC per layer over seeds, a min..max band, over 1..n_layers (a lone layer: a point); the frame."""
    auc = pl.col("auc")
    agg = sub.group_by("layer").agg(m=auc.mean(), lo=auc.min(), hi=auc.max(), seeds=pl.len())
    x = np.arange(1, max(n_layers, int(agg["layer"].max())) + 1)
    full = pl.DataFrame({"layer": x}).join(agg, on="layer", how="left")
    m = full["m"].cast(pl.Float64).to_numpy()
    lo = full["lo"].cast(pl.Float64).to_numpy()
    hi = full["hi"].cast(pl.Float64).to_numpy()
    multi = full["seeds"].fill_null(0).to_numpy() > 1
    ax.plot(x, m, color=col, lw=1.6)
    ax.fill_between(x, np.where(multi, lo, np.nan), np.where(multi, hi, np.nan), color=col, alpha=0.15, lw=0)
    # a layer whose neighbours have no value: the line draws nothing there, so it gets a point
    no_previous = np.isnan(np.r_[np.nan, m[:-1]])
    no_next = np.isnan(np.r_[m[1:], np.nan])
    alone = np.isfinite(m) & no_previous & no_next
    if alone.any():
        ax.plot(x[alone], m[alone], "o", color=col, ms=3)
    return full
