"""The Two Pathways line figure (A11, seeds 000-002, 004) and the probe-AUC figure, one panel per model.
Each function draws from one table and recomputes nothing."""

from __future__ import annotations

import textwrap
from pathlib import Path

import polars as pl
import seaborn as sns
from matplotlib.figure import Figure
from matplotlib.lines import Line2D
from matplotlib.ticker import MaxNLocator

DATASETS = {"popqa": "PopQA", "triviaqa": "TriviaQA", "hotpotqa": "HotpotQA", "nq": "NQ"}
COLOURS = dict(zip(DATASETS, sns.color_palette("tab10", 4).as_hex(), strict=True))
STYLES = {"Q-Anchored": "-", "A-Anchored": "--"}
DPI = 200


def _figure(n: int, caption: str, legend_rows: int):
    width = 4.6 * max(1, n)
    lines = textwrap.wrap(caption, width=int(width * 16)) if caption else []
    extra = 0.22 * legend_rows + 0.14 * len(lines) + 0.2
    height = 3.4 + extra
    fig = Figure(figsize=(width, height), dpi=DPI)
    axes = fig.subplots(1, max(1, n), squeeze=False)[0]
    fig.subplots_adjust(
        left=0.75 / width,
        right=1 - 0.15 / width,
        top=1 - 0.35 / height,
        bottom=(0.5 + extra) / height,
        wspace=0.22,
    )
    return fig, list(axes), lines, extra, height


def _save(fig: Figure, lines: list[str], png, pdf) -> None:
    if lines:
        fig.text(0.01, 0.015, "\n".join(lines), ha="left", va="bottom", fontsize=7, color="0.3")
    for out in (png, pdf):
        Path(out).parent.mkdir(parents=True, exist_ok=True)
        fig.savefig(out, dpi=DPI)


def _notes(ax, notes: list[str]) -> None:
    """Why a dataset has no curve in this panel (probe undefined, no rows), written in the panel."""
    if notes:
        ax.text(
            0.02, 0.02, "\n".join(notes), transform=ax.transAxes, fontsize=7, color="firebrick", va="bottom"
        )


def plot_pathways(
    summary: pl.DataFrame,
    auc: pl.DataFrame,
    models: list[str],
    titles: dict[str, str],
    out_png,
    out_pdf,
    caption: str = "",
) -> None:
    """Per-layer mean ΔP with its 95% CI: colour = dataset, solid = Q-Anchored, dashed = A-Anchored."""
    fig, axes, lines, extra, height = _figure(len(models), caption, legend_rows=2)
    shown = []
    for ax, model in zip(axes, models, strict=False):
        ax.set_title(titles.get(model, model), fontsize=11)
        ax.set_xlabel("Layer")
        ax.xaxis.set_major_locator(MaxNLocator(integer=True))
        ax.axhline(0, color="0.6", lw=0.8, zorder=0)
        ax.grid(alpha=0.3)
        notes = []
        for ds, label in DATASETS.items():
            sub = summary.filter((pl.col("model") == model) & (pl.col("dataset") == ds))
            status = auc.filter(
                (pl.col("model") == model) & (pl.col("dataset") == ds) & (pl.col("status") != "ok")
            )
            if status.height:
                notes.append(f"{label}: {status['status'][0]}")
                continue
            for anchor, style in STYLES.items():
                s = sub.filter(pl.col("anchor") == anchor).sort("layer")
                if s.height == 0:
                    continue
                x = s["layer"].to_numpy()
                ax.plot(x, s["mean_delta_p"].to_numpy(), style, color=COLOURS[ds], lw=1.6)
                ax.fill_between(
                    x, s["ci_low"].to_numpy(), s["ci_high"].to_numpy(), color=COLOURS[ds], alpha=0.13, lw=0
                )
                shown.append((anchor, ds))
        if not ax.lines[1:]:  # only the zero line: an empty scale would suggest values that are not there
            ax.set_yticks([])
            ax.set_xticks([])
            if not notes:
                notes.append("no ΔP rows")
        _notes(ax, notes)
    axes[0].set_ylabel("ΔP")
    handles, labels = [], []
    for ds, label in DATASETS.items():
        for anchor, style in STYLES.items():
            handles.append(Line2D([], [], color=COLOURS[ds], ls=style, lw=1.6))
            labels.append(f"{anchor} ({label})")
    fig.legend(
        handles,
        labels,
        loc="lower center",
        ncol=4,
        frameon=False,
        fontsize=8,
        bbox_to_anchor=(0.5, (0.05 + 0.14 * len(lines)) / height),
    )
    _save(fig, lines, out_png, out_pdf)


def plot_probe_auc(
    auc: pl.DataFrame, models: list[str], titles: dict[str, str], out_png, out_pdf, caption: str = ""
) -> None:
    """Test AUC of the correctness probe by layer: mean over seeds, band = min..max over seeds."""
    fig, axes, lines, extra, height = _figure(len(models), caption, legend_rows=1)
    for ax, model in zip(axes, models, strict=False):
        ax.set_title(titles.get(model, model), fontsize=11)
        ax.set_xlabel("Layer")
        ax.xaxis.set_major_locator(MaxNLocator(integer=True))
        ax.axhline(0.5, color="0.6", lw=0.8, ls=":", zorder=0)
        ax.set_ylim(0.3, 1.02)
        ax.grid(alpha=0.3)
        notes = []
        for ds, label in DATASETS.items():
            sub = auc.filter((pl.col("model") == model) & (pl.col("dataset") == ds))
            bad = sub.filter(pl.col("status") != "ok")
            if bad.height:
                notes.append(f"{label}: {bad['status'][0]}")
                continue
            if sub.height == 0:
                continue
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
            ax.plot(x, agg["m"].to_numpy(), color=COLOURS[ds], lw=1.6)
            ax.fill_between(
                x, agg["lo"].to_numpy(), agg["hi"].to_numpy(), color=COLOURS[ds], alpha=0.15, lw=0
            )
        _notes(ax, notes)
    axes[0].set_ylabel("Probe test AUC")
    handles = [Line2D([], [], color=COLOURS[d], lw=1.6) for d in DATASETS]
    fig.legend(
        handles,
        list(DATASETS.values()),
        loc="lower center",
        ncol=4,
        frameon=False,
        fontsize=8,
        bbox_to_anchor=(0.5, (0.05 + 0.14 * len(lines)) / height),
    )
    _save(fig, lines, out_png, out_pdf)
