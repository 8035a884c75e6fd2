"""The DepthQA figures (seed 003), a panel per model; an empty or thin table gives notes, never an error."""

import numpy as np
import polars as pl
import seaborn as sns

from .. import plotting

DEPTH_COLOURS = {1: "tab:blue", 2: "tab:orange", 3: "tab:green"}
SIDE_COLOURS = {"lower": "tab:green", "upper": "tab:orange"}
# the columns each figure draws from tables.depthwise_average's and tables.memorization_split's tables (not
# imported from there: tables imports the MIN-K% pass, and the figures' job would import torch)
MINK_COLUMNS = {"model": pl.String, "depth": pl.Int64, "mink": pl.Float64}
SPLIT_COLUMNS = {"model": pl.String, "side": pl.String, "subset": pl.String, "gap": pl.Float64}
NO_DATA = {"ha": "center", "va": "bottom", "fontsize": 7, "color": "0.4"}
BOXES = {
    "widths": 0.55,
    "patch_artist": True,
    "manage_ticks": False,
    "medianprops": {"color": "black", "linewidth": 1.2},
    "flierprops": {"marker": "o", "markersize": 3, "markeredgecolor": "0.3", "alpha": 0.6},
}


def _panels(models: list[str], titles: dict[str, str], **kw):
    fig, axes = plotting.figure(len(models), width=3.4, **kw)
    for i, (ax, model) in enumerate(zip(axes[0], models or [""], strict=False)):
        ax.set_title(f"({chr(ord('a') + i)}) {titles.get(model, model)}", fontsize=10)
        ax.grid(alpha=0.3)
    return fig, list(axes[0])


def plot_depth_boxes(depthwise_df: pl.DataFrame, models, titles, out_png, out_pdf, caption: str) -> None:
    """Box plot per model of the depthwise average MIN-K% (columns model, depth, mink) at Depth 1/2/3."""
    fig, axes = _panels(models, titles, sharey=True)
    axes[0].set_ylabel("Depthwise Average MIN-K%")
    top = 0.0  # the highest value drawn: the shared y limit
    depthwise_df = plotting.table(depthwise_df, MINK_COLUMNS)
    for ax, model in zip(axes, models or [""], strict=False):
        part = depthwise_df.filter(pl.col("model") == model)
        values = {d: part.filter(depth=d)["mink"].drop_nulls().drop_nans().to_numpy() for d in (1, 2, 3)}
        ax.set_xticks([1, 2, 3], [f"Depth {d}\n(n={len(values[d])})" for d in (1, 2, 3)])
        ax.set_xlim(0.4, 3.6)
        present = [d for d in (1, 2, 3) if len(values[d])]
        if not present:  # y is shared: ticks stay
            plotting.note(ax, [("no MIN-K% values for this model", "0.35")], loc="center")
            continue
        boxes = ax.boxplot([values[d] for d in present], positions=present, **BOXES)
        for patch, d in zip(boxes["boxes"], present, strict=True):
            patch.set(facecolor=DEPTH_COLOURS[d], edgecolor="0.2")
        for d in set((1, 2, 3)) - set(present):
            ax.text(d, 0.02, "no data", transform=ax.get_xaxis_transform(), **NO_DATA)
        top = max(top, *(float(np.max(values[d])) for d in present))
    axes[0].set_ylim(0, top * 1.12 if top > 0 else 1)
    plotting.finish(fig, [], [], caption, out_png, out_pdf)


def _density_panel(ax, part: pl.DataFrame) -> None:
    notes = []
    drawn = False
    kde = False
    for side in ("lower", "upper"):
        rows = part.filter(pl.col("side") == side)
        name = rows["subset"][0] if rows.height else {"lower": "25%", "upper": "75%"}[side]
        gaps = rows["gap"].drop_nulls().drop_nans().to_numpy()
        colour = SIDE_COLOURS[side]
        if len(np.unique(gaps)) >= 2:
            sns.kdeplot(x=gaps, ax=ax, fill=True, alpha=0.4, color=colour, linewidth=1.2, label=name)
            drawn = kde = True
        elif len(gaps):  # a KDE needs spread; a single distinct value is shown as a line at that value
            ax.axvline(gaps[0], color=colour, linewidth=2, alpha=0.8, label=f"{name} (n={len(gaps)})")
            notes.append(f"{name}: one distinct value, no KDE")
            drawn = True
        else:
            notes.append(f"{name}: no groups")
    if not drawn:
        return _empty(ax, "\n".join(notes))
    if kde:  # headroom so the legend sits above the curves; notes ride in its title so nothing collides
        ax.set_ylim(0, ax.get_ylim()[1] * 1.35)
    else:  # lines alone have no density scale
        ax.set_yticks([])
    legend = ax.legend(loc="upper right", title="\n".join(notes) or None, fontsize=8)
    legend.get_title().set(fontsize=7, color="0.3")


def _empty(ax, why: str) -> None:
    ax.set_yticks([])  # an empty panel's y scale would suggest values that are not there
    plotting.note(ax, [(why, "0.35")], loc="center")


def plot_score_gap_density(subset_df: pl.DataFrame, models, titles, out_png, out_pdf, caption: str) -> None:
    """Filled KDE per model of the score gap (memorization_split's table), "25%" green and "75%" orange."""
    fig, axes = _panels(models, titles)
    no_graph = subset_df.height == 0
    subset_df = plotting.table(subset_df, SPLIT_COLUMNS)
    for ax, model in zip(axes, models or [""], strict=False):
        ax.set(xlim=(-1.5, 1.5), xticks=np.arange(-1.5, 1.51, 0.5), xlabel="Score Gap (D3 - D2)")
        ax.set_ylabel("Density")
        part = subset_df.filter(pl.col("model") == model)
        if part.height:
            _density_panel(ax, part)
        else:
            _empty(ax, "no graph: score gap undefined" if no_graph else "no score gaps for this model")
    plotting.finish(fig, [], [], caption, out_png, out_pdf)
