"""The figures of the Section 3.2-5 experiments (docs/method.md A12-A16), one panel column per model of
a pair, in the layout of the pathways figures (pathways/plots.py): token patching and answer-only as grouped
bars per dataset, the knowledge boundary as per-layer curves plus a popularity box plot, the saliency
distribution as a density on a log scale, and pathway awareness as AUC per layer. Each function draws from
the aggregated tables and recomputes no statistic it could read (densities and box plots are drawn from
per-sample values).

Honest drawing, as in plots.py: a group with fewer than MIN_LINE_N distinct samples is a point (no bar, box,
band or density); a line never crosses a layer without rows; what is missing is said by a note inside the
panel; legends list only what is drawn. No function raises on empty or degenerate tables."""

from __future__ import annotations

import textwrap
from collections.abc import Collection, Mapping

import numpy as np
import polars as pl
from matplotlib.colors import to_rgb
from matplotlib.lines import Line2D
from matplotlib.patches import Patch

from ..plotting import DATASETS, colour, datasets_in, label
from ..plotting import figure as _figure
from ..plotting import finish as _finish
from .detection import AWARENESS_SCHEMA as DETECTION_AWARENESS_SCHEMA
from .experiments import ROW_SCHEMA
from .plots import MIN_LINE_N, STYLES, _layer_axis, _notes, draw_series

GROUPS = ("Q-Anchored", "A-Anchored")
# group colours of the bar and box figures (datasets are on the x axis there); not the datasets' tab10 hues
GROUP_COLOURS = {"Q-Anchored": "#542788", "A-Anchored": "#b35806"}
# the paper's Llama-3-8B values (Q-Anchored, A-Anchored), in %: token patching flip rate and answer-only -ΔP
PUBLISHED_MODEL = "Llama-3-8B"
PUBLISHED_PATCHING = {"popqa": (40, 10), "triviaqa": (70, 48), "hotpotqa": (39, 5), "nq": (42, 18)}
PUBLISHED_ANSWER_ONLY = {"popqa": (52, 7), "triviaqa": (64, 12), "hotpotqa": (53, 20), "nq": (27, 7)}

_KEYS = {"model": pl.String, "dataset": pl.String}
# the tables as experiment_tables writes them: the per-(model, dataset) schemas with the two keys in front
ROWS_SCHEMA = {**_KEYS, **ROW_SCHEMA}
AWARENESS_SCHEMA = {**_KEYS, **DETECTION_AWARENESS_SCHEMA}
SAMPLES_SCHEMA = {"model": pl.String, "dataset": pl.String, "id": pl.String, "group": pl.String}
NOTE_COLOUR = "firebrick"
E_Q = r"$E_Q$"
CONDITION_NOTES = {"random": "random-token control"}
SALIENCY_NAMES = {"s_eq_ea": r"$S(E_Q \rightarrow E_A)$", "s_eq_all": r"$S(E_Q \rightarrow *)$"}


# ------------------------------------------------------------------------------------------------ helpers
def _table(df: pl.DataFrame | None, schema: Mapping[str, pl.DataType], optional=()) -> pl.DataFrame:
    """The table, or an empty one of `schema` when it is missing, empty or lacks a required column (an empty
    parquet written without columns reads back as a frame without any); `optional` columns it lacks are
    added as null."""
    if df is None or df.height == 0 or any(c not in df.columns for c in schema if c not in optional):
        return pl.DataFrame(schema=dict(schema))
    missing = [pl.lit(None, dtype=schema[c]).alias(c) for c in optional if c not in df.columns]
    return df.with_columns(missing) if missing else df


def _of(df: pl.DataFrame, **eq) -> pl.DataFrame:
    for col, value in eq.items():
        df = df.filter(pl.col(col) == value)
    return df


def _num(x) -> float:
    return float("nan") if x is None else float(x)


def _blank(ax, note: str, notes: list[str]) -> None:
    """A panel with nothing drawn: no ticks (an empty scale would suggest values), only the reason."""
    ax.set_xticks([])
    ax.set_yticks([])
    ax.set_xlabel("")
    ax.grid(False)
    if note:
        notes.append(note)


def _text_lines(ax, lines: list[tuple[str, str]], x: float, y: float, ha: str, va: str = "top") -> None:
    """Coloured lines of small text stacked from (x, y) in axes coordinates, each wrapped to the panel's
    width (a long note never runs out of its panel)."""
    width_in = ax.get_position().width * ax.figure.get_figwidth()
    chars = max(24, int(width_in * 15))
    lines = [(part, col) for text, col in lines for part in (textwrap.wrap(text, chars) or [""])]
    step = -0.065 if va == "top" else 0.065
    order = lines if va == "top" else lines[::-1]
    for i, (text, col) in enumerate(order):
        ax.text(
            x,
            y + i * step,
            text,
            transform=ax.transAxes,
            fontsize=6.5,
            color=col,
            ha=ha,
            va=va,
            bbox={"facecolor": "white", "alpha": 0.75, "lw": 0, "pad": 0.4},
            zorder=6,
        )


def _row_notes(sub: pl.DataFrame) -> list[str]:
    if "note" not in sub.columns:
        return []
    notes = sub.filter(pl.col("note").is_not_null() & (pl.col("note") != ""))
    return [f"{label(d)}: {n}" for d, n in notes.select("dataset", "note").unique(maintain_order=True).rows()]


def _ylabel(axes_row, text: str) -> None:
    """The y label on the first panel with a scale (a blank panel has no y ticks)."""
    for ax in axes_row:
        if len(ax.get_yticks()):
            ax.set_ylabel(text)
            return


def _titles(axes_row, models: list[str], titles: dict[str, str]) -> None:
    for ax, model in zip(axes_row, models, strict=False):
        ax.set_title(titles.get(model, model), fontsize=11)


def _hide_unused(axes, n_used: int) -> None:
    """A figure for zero models still gets one panel: say so in it."""
    if n_used == 0:
        ax = axes[0][0]
        _blank(ax, "", [])
        _notes(ax, ["no models in this figure"])


# -------------------------------------------------------------------------------------------- bar figures
def _condition_style(i: int) -> dict:
    """The first condition is solid, a second (the control) light with hatching."""
    return {"alpha": 1.0, "hatch": None} if i == 0 else {"alpha": 0.28, "hatch": "////"}


def _draw_bar_panel(
    ax,
    sub: pl.DataFrame,
    conditions: list[str],
    published: Mapping[str, tuple[float, float]] | None,
    drawn: set,
) -> tuple[float, float]:
    """Bars per dataset: group-major (Q-Anchored then A-Anchored), one bar per condition inside a group, with
    the 95% CI; a group with 0 < n < MIN_LINE_N is a point without CI; n is written above every bar. Adds
    (condition, group) / 'small' / 'published' to `drawn`. Returns the (low, high) values drawn."""
    datasets = datasets_in(sub)
    present = [c for c in conditions if sub.filter(pl.col("condition") == c).height]
    n_bars = 2 * len(present)
    gap = 0.06  # between the two groups of one dataset
    width = (0.8 - gap) / max(1, n_bars)
    lo_hi = [0.0, 0.0]
    for xi, ds in enumerate(datasets):
        for gi, group in enumerate(GROUPS):
            pv = float(published[ds][gi]) if published and ds in published else None
            for ci, cond in enumerate(present):
                x = xi - 0.4 + gi * gap + (gi * len(present) + ci + 0.5) * width
                r = _of(sub, dataset=ds, group=group, condition=cond)
                if r.height == 0:
                    continue
                n, v = int(r["n"][0] or 0), _num(r["value"][0])
                lo, hi = _num(r["ci_low"][0]), _num(r["ci_high"][0])
                col, style = GROUP_COLOURS[group], _condition_style(ci)
                top = 0.0
                if n >= MIN_LINE_N and np.isfinite(v):
                    ax.bar(
                        x,
                        v,
                        width * 0.92,
                        color=col if style["hatch"] is None else "white",
                        edgecolor=col,
                        lw=0.8,
                        hatch=style["hatch"],
                        zorder=2,
                    )
                    if style["hatch"] is not None:
                        ax.bar(x, v, width * 0.92, color=col, alpha=style["alpha"], lw=0, zorder=2)
                    if np.isfinite(lo) and np.isfinite(hi):
                        ax.errorbar(
                            x,
                            v,
                            yerr=[[v - lo], [hi - v]],
                            fmt="none",
                            ecolor="0.15",
                            elinewidth=0.8,
                            capsize=1.8,
                            zorder=3,
                        )
                        top = max(v, hi)
                        lo_hi = [min(lo_hi[0], lo, v), max(lo_hi[1], hi, v)]
                    else:
                        top = v
                        lo_hi = [min(lo_hi[0], v), max(lo_hi[1], v)]
                    drawn.add((cond, group))
                elif n > 0 and np.isfinite(v):
                    ax.plot(
                        [x],
                        [v],
                        "o",
                        color=col,
                        mfc=col if ci == 0 else "white",
                        ms=4,
                        ls="none",
                        zorder=3,
                    )
                    top = v
                    lo_hi = [min(lo_hi[0], v), max(lo_hi[1], v)]
                    drawn.add((cond, group))
                    drawn.add("small")
                if ci == 0 and pv is not None:  # the published marker sits on this bar: n goes above it
                    top = max(top, pv)
                ax.annotate(
                    str(n),
                    (x, max(top, 0.0)),
                    xytext=(0, 2),
                    textcoords="offset points",
                    rotation=90,
                    ha="center",
                    va="bottom",
                    fontsize=6,
                    color="0.3",
                    zorder=4,
                )
            if pv is not None and present:
                x = xi - 0.4 + gi * gap + (gi * len(present) + 0.5) * width
                ax.plot([x], [pv], "D", color="black", ms=3.2, ls="none", zorder=5)
                lo_hi = [min(lo_hi[0], pv), max(lo_hi[1], pv)]
                drawn.add("published")
    ax.set_xticks(range(len(datasets)), [label(d) for d in datasets])
    ax.set_xlim(-0.55, len(datasets) - 0.45)
    ax.tick_params(axis="x", length=0)
    ax.grid(axis="y", alpha=0.3, zorder=0)
    return lo_hi[0], lo_hi[1]


def _bar_legend(drawn: set, conditions: list[str], names: dict[str, str], published_label: str, narrow: bool):
    """Legend columns: one per condition (its Q- and A-Anchored bars; all bars in one column when `narrow`),
    then the markers; columns are padded with blank entries so that each condition's bars share a column."""
    columns: list[list[tuple]] = []
    for ci, cond in enumerate(conditions):
        style, column = _condition_style(ci), []
        for group in GROUPS:
            if (cond, group) not in drawn:
                continue
            col = GROUP_COLOURS[group]
            if style["hatch"] is None:
                handle = Patch(facecolor=col, edgecolor=col)
            else:
                handle = Patch(facecolor=(*to_rgb(col), style["alpha"]), edgecolor=col, hatch="////")
            column.append((handle, f"{group}{names.get(cond, '')}"))
        if column:
            columns.append(column)
    extras = []
    if "published" in drawn:
        extras.append(
            (Line2D([], [], marker="D", color="black", ms=3.2, ls="none"), f"published, {published_label}")
        )
    if "small" in drawn:
        extras.append(
            (
                Line2D([], [], marker="o", color="0.3", ms=4, ls="none"),
                f"point: n < {MIN_LINE_N} samples (no CI)",
            )
        )
    if columns:
        n_handle = Line2D([], [], marker="$12$", color="0.3", ms=7, ls="none")
        extras.append((n_handle, "n samples (above bars)"))
        if narrow:
            columns = [[entry for column in columns for entry in column]]
        columns.append(extras)
    return _padded(columns)


def _padded(columns: list[list[tuple]]) -> tuple[list, list[str], int]:
    """Flatten legend columns (matplotlib fills a legend column by column) padded with blank entries."""
    columns = [c for c in columns if c]
    rows = max((len(c) for c in columns), default=0)
    handles, labels = [], []
    for column in columns:
        for handle, text in column + [(Line2D([], [], ls="none"), "")] * (rows - len(column)):
            handles.append(handle)
            labels.append(text)
    return handles, labels, max(1, len(columns))


def _bar_figure(
    rows: pl.DataFrame,
    experiment: str,
    conditions: list[str],
    names: dict[str, str],
    ylabel: str,
    models: list[str],
    titles: dict[str, str],
    out_png,
    out_pdf,
    caption: str,
    published: Mapping[str, tuple[float, float]] | None,
    published_on: Collection[str] | None,
    published_label: str,
) -> None:
    rows = _table(rows, ROWS_SCHEMA, optional=("note",))
    rows = rows.filter((pl.col("experiment") == experiment) & pl.col("condition").is_in(conditions))
    fig, axes = _figure(len(models))
    _titles(axes[0], models, titles)
    _hide_unused(axes, len(models))
    drawn: set = set()
    lows, highs, used = [], [], []
    for ax, model in zip(axes[0], models, strict=False):
        sub = rows.filter(pl.col("model") == model)
        notes = _row_notes(sub)
        if sub.height == 0:
            _blank(ax, f"no {experiment.replace('_', '-')} rows for this model", notes)
            _notes(ax, notes)
            continue
        pub = published if published_on is None or model in published_on else None
        lo, hi = _draw_bar_panel(ax, sub, conditions, pub, drawn)
        lows.append(lo)
        highs.append(hi)
        missing = [c for c in conditions[1:] if sub.filter(pl.col("condition") == c).height == 0]
        notes += [f"no {CONDITION_NOTES.get(c, c)} rows" for c in missing]
        used.append((ax, notes))
    if used:
        low, high = min(lows), max(highs)
        span = max(high - low, 1.0)
        n_lines = max(len(notes) for _, notes in used)
        for ax, notes in used:  # one scale for the pair; headroom for the n labels and the notes
            ax.set_ylim(low - 0.05 * span if low < 0 else 0, high + (0.22 + 0.09 * n_lines) * span)
            ax.axhline(0, color="0.4", lw=0.8, zorder=1)
            _text_lines(ax, [(n, NOTE_COLOUR) for n in notes], 0.02, 0.97, "left")
        used[0][0].set_ylabel(ylabel)
    handles, labels, ncol = _bar_legend(drawn, conditions, names, published_label, narrow=len(models) < 2)
    _finish(fig, handles, labels, caption, out_png, out_pdf, ncol=ncol)


def plot_patching(
    rows: pl.DataFrame,
    models: list[str],
    titles: dict[str, str],
    out_png,
    out_pdf,
    caption: str = "",
    published: Mapping[str, tuple[float, float]] | None = None,
    published_on: Collection[str] | None = None,
    published_label: str = PUBLISHED_MODEL,
) -> None:
    """Token patching (A12): the probe's prediction flip rate (%) per dataset, Q- vs A-Anchored, when the E_Q
    tokens are replaced by a donor's (solid bars) and when as many random question tokens are (the control,
    light hatched bars), each with its 95% CI and n. `published` (dataset -> (Q-Anchored, A-Anchored)) adds
    the paper's values as black diamonds, on the panels of `published_on` (None: every panel)."""
    _bar_figure(
        rows,
        "patching",
        ["E_Q", "random"],
        {"E_Q": f", {E_Q} patched", "random": ", random tokens (control)"},
        "Prediction flip rate (%)",
        models,
        titles,
        out_png,
        out_pdf,
        caption,
        published,
        published_on,
        published_label,
    )


def plot_answer_only(
    rows: pl.DataFrame,
    models: list[str],
    titles: dict[str, str],
    out_png,
    out_pdf,
    caption: str = "",
    published: Mapping[str, tuple[float, float]] | None = None,
    published_on: Collection[str] | None = None,
    published_label: str = PUBLISHED_MODEL,
) -> None:
    """Answer-only (A13): −ΔP (%) per dataset, Q- vs A-Anchored, the drop of the probe's confidence when the
    state is recomputed from the answer alone, with its 95% CI and n; `published` as in plot_patching."""
    _bar_figure(
        rows,
        "answer_only",
        ["-ΔP"],
        {"-ΔP": ""},
        "−ΔP, answer only (%)",
        models,
        titles,
        out_png,
        out_pdf,
        caption,
        published,
        published_on,
        published_label,
    )


# --------------------------------------------------------------------------------------- knowledge boundary
def _draw_layer_panel(ax, sub: pl.DataFrame, condition: str, drawn: set) -> bool:
    """Q-Anchored solid / A-Anchored dashed per dataset over layers, with the 95% CI band (plots.draw_series:
    n < MIN_LINE_N are points). Returns whether any group had such points."""
    s = sub.filter(pl.col("condition") == condition)
    small = False
    n_layers = int(s["layer"].max()) if s.height and s["layer"].max() is not None else 0
    for ds in datasets_in(s):
        for group, style in STYLES.items():
            g = _of(s, dataset=ds, group=group).select(
                "layer", "n", pl.col("value").alias("mean_delta_p"), "ci_low", "ci_high"
            )
            g = g.filter(pl.col("mean_delta_p").is_not_nan())
            if draw_series(ax, g, n_layers, colour(ds), style):
                drawn.add((group, ds))
                small |= bool(((g["n"] > 0) & (g["n"] < MIN_LINE_N)).any())
    return small


def _draw_popularity(ax, samples: pl.DataFrame, notes: list[str]) -> tuple[bool, bool]:
    """Box plot of log10 popularity per group (and dataset, where more than one has it); a group with
    n < MIN_LINE_N is drawn as its points. Returns (anything drawn, any small group)."""
    if "s_pop" not in samples.columns:
        _blank(ax, "no popularity values (PopQA only)", notes)
        return False, False
    pop = samples.filter(pl.col("s_pop").is_not_null())
    if pop.height == 0:
        _blank(ax, "no popularity values (PopQA only)", notes)
        return False, False
    positions, ticks, small = [], [], False
    several = len(datasets_in(pop)) > 1
    for di, ds in enumerate(datasets_in(pop)):
        d = pop.filter(pl.col("dataset") == ds)
        bad = d.filter(~(pl.col("s_pop") > 0)).height
        if bad:
            notes.append(f"{label(ds)}: {bad} samples with popularity ≤ 0 left out")
        for gi, group in enumerate(GROUPS):
            v = d.filter((pl.col("group") == group) & (pl.col("s_pop") > 0))["s_pop"].to_numpy()
            x = di * 2.6 + gi
            where = f"\n{label(ds)}" if several else ""
            ticks.append((x, f"{group}\nn = {len(v)}{where}"))
            if len(v) == 0:
                continue
            y = np.log10(v)
            ls = STYLES[group]
            if len(v) >= MIN_LINE_N:
                ax.boxplot(
                    y,
                    positions=[x],
                    widths=0.55,
                    patch_artist=True,
                    showfliers=False,
                    boxprops={
                        "facecolor": (*to_rgb(colour(ds)), 0.25),
                        "edgecolor": colour(ds),
                        "linestyle": ls,
                    },
                    whiskerprops={"color": colour(ds), "linestyle": ls},
                    capprops={"color": colour(ds)},
                    medianprops={"color": "black", "lw": 1.4},
                )
                jitter = np.random.default_rng(0).uniform(-0.16, 0.16, len(y))
                ax.scatter(x + jitter, y, s=3, color=colour(ds), alpha=0.35, lw=0, zorder=3)
            else:
                ax.plot(np.full(len(y), x), y, "o", color=colour(ds), ms=3.5, ls="none")
                small = True
            positions.append(x)
    ax.set_xticks([t for t, _ in ticks], [s for _, s in ticks], fontsize=8)
    ax.set_xlim(-0.7, max(t for t, _ in ticks) + 0.7)
    ax.grid(axis="y", alpha=0.3)
    names = datasets_in(pop)
    ax.set_ylabel(f"{label(names[0])}: log10 popularity" if len(names) == 1 else "log10 popularity")
    if not positions:
        _blank(ax, "no sample with a positive popularity", notes)
        return False, small
    return True, small


def plot_boundary(
    rows: pl.DataFrame,
    per_sample: pl.DataFrame,
    models: list[str],
    titles: dict[str, str],
    out_png,
    out_pdf,
    caption: str = "",
) -> None:
    """Knowledge boundary (A14), one row of panels per model: (a) answer accuracy and (b) refusal rate (%) per
    layer of the groups split at that layer, Q-Anchored solid / A-Anchored dashed, colour = dataset, 95% CI
    bands; (c) log10 entity popularity by group at layer K (PopQA; per-sample values from `per_sample`)."""
    rows = _table(rows, ROWS_SCHEMA, optional=("note",))
    ks = experiment_layers(rows, None)
    rows = rows.filter(pl.col("experiment") == "boundary")
    samples = _table(per_sample, SAMPLES_SCHEMA)
    fig, axes = _figure(3, n_rows=max(1, len(models)), height=2.9)
    fig.subplots_adjust(hspace=0.5, wspace=0.3)
    drawn: set = set()
    small = False
    letters = "abcdefghijklmnopqrstuvwxyz"
    for r, model in enumerate(models):
        name = titles.get(model, model)
        sub = rows.filter(pl.col("model") == model)
        for c, (cond, ylabel) in enumerate((("accuracy", "Accuracy (%)"), ("refusal", "Refusal rate (%)"))):
            ax = axes[r][c]
            ax.set_title(f"({letters[(3 * r + c) % 26]}) {name}", fontsize=10, loc="left")
            notes = []
            if sub.filter(pl.col("condition") == cond).height == 0:
                _blank(ax, f"no {cond} rows for this model", notes)
            else:
                _layer_axis(ax)
                small |= _draw_layer_panel(ax, sub, cond, drawn)
                lo, hi = ax.get_ylim()  # autoscaled to what is drawn, never beyond 0..100
                ax.set_ylim(max(lo, -4), min(max(hi, 5), 104))
                ax.set_ylabel(ylabel)
            _notes(ax, notes)
        ax = axes[r][2]
        mine = samples.filter(pl.col("model") == model)
        with_pop = mine.filter(pl.col("s_pop").is_not_null()) if "s_pop" in mine.columns else mine.clear()
        pop_k = {ks.get((model, ds)) for ds in datasets_in(with_pop)} - {None}
        at_k = f", groups at K = {pop_k.pop()}" if len(pop_k) == 1 else ""
        ax.set_title(f"({letters[(3 * r + 2) % 26]}) {name}{at_k}", fontsize=10, loc="left")
        notes = []
        _, small_pop = _draw_popularity(ax, mine, notes)
        small |= small_pop
        _notes(ax, notes)
    if not models:
        for ax in axes[0]:
            _blank(ax, "", [])
        _notes(axes[0][0], ["no models in this figure"])
    handles, labels = [], []
    for ds in [d for d in DATASETS if any(d == x for _, x in drawn)] + sorted(
        {x for _, x in drawn} - set(DATASETS)
    ):
        handles.append(Line2D([], [], color=colour(ds), lw=1.6))
        labels.append(label(ds))
    for group, style in STYLES.items():
        if any(g == group for g, _ in drawn):
            handles.append(Line2D([], [], color="0.25", ls=style, lw=1.6))
            labels.append(group)
    if small:
        handles.append(Line2D([], [], color="0.3", marker="o", ls="none", ms=3.5))
        labels.append(f"point: n < {MIN_LINE_N} samples")
    _finish(fig, handles, labels, caption, out_png, out_pdf, ncol=8)


# ------------------------------------------------------------------------------------------------ saliency
def _kde(x: np.ndarray, grid: np.ndarray) -> np.ndarray | None:
    """Gaussian KDE (Silverman's bandwidth) of x on grid; None when x has no spread."""
    sd = float(np.std(x, ddof=1)) if len(x) > 1 else 0.0
    iqr = float(np.subtract(*np.percentile(x, [75, 25])))
    spread = min(sd, iqr / 1.34) if iqr > 0 else sd
    if not spread > 0:
        return None
    bw = 0.9 * spread * len(x) ** -0.2
    z = (grid[:, None] - x[None, :]) / bw
    return np.exp(-0.5 * z**2).sum(axis=1) / (len(x) * bw * np.sqrt(2 * np.pi))


def plot_saliency(
    per_sample: pl.DataFrame,
    models: list[str],
    titles: dict[str, str],
    out_png,
    out_pdf,
    caption: str = "",
    column: str = "s_eq_ea",
    rug: bool = True,
) -> None:
    """Saliency (A15): the density of per-sample S(E_Q→E_A) (`column`; averaged over layers) on a log10 x
    axis, one curve per dataset (each integrates to 1 in log10 units), with a rug of the samples below;
    non-positive values cannot be drawn on a log scale and are counted in a note; a dataset with fewer than
    MIN_LINE_N positive values is its rug only."""
    samples = _table(per_sample, SAMPLES_SCHEMA)
    fig, axes = _figure(len(models))
    _titles(axes[0], models, titles)
    _hide_unused(axes, len(models))
    name = SALIENCY_NAMES.get(column, column)
    drawn: set[str] = set()
    any_small = False
    for ax, model in zip(axes[0], models, strict=False):
        notes: list[str] = []
        sub = samples.filter(pl.col("model") == model)
        if column not in sub.columns or sub.filter(pl.col(column).is_not_null()).height == 0:
            _blank(ax, f"no {name} values for this model", notes)
            _notes(ax, notes)
            continue
        sub = sub.filter(pl.col(column).is_not_null() & pl.col(column).is_not_nan())
        data, left_out = {}, {}
        for ds in datasets_in(sub):
            v = sub.filter(pl.col("dataset") == ds)[column].cast(pl.Float64).to_numpy()
            pos = v[v > 0]
            left_out[ds] = len(v) - len(pos)
            if len(pos):
                data[ds] = np.log10(pos)
            else:
                notes.append(f"{label(ds)}: all {len(v)} values ≤ 0, nothing to draw on a log scale")
        if not data:
            _blank(ax, "", notes)
            _notes(ax, notes)
            continue
        lo = min(float(x.min()) for x in data.values())
        hi = max(float(x.max()) for x in data.values())
        pad = max(0.1 * (hi - lo), 0.3)
        grid = np.linspace(lo - pad, hi + pad, 400)
        top = 0.0
        info = []
        curves = {}
        for ds, x in data.items():
            dens = _kde(x, grid) if len(x) >= MIN_LINE_N else None
            if dens is not None:
                curves[ds] = dens
                top = max(top, float(dens.max()))
            elif len(x) >= MIN_LINE_N:
                notes.append(f"{label(ds)}: all values equal, no density")
            out = f" ({left_out[ds]} values ≤ 0 left out)" if left_out[ds] else ""
            info.append((f"{label(ds)}: n = {len(x)}{out}", colour(ds)))
        top = top if top > 0 else 1.0
        for ds, dens in curves.items():
            ax.plot(10**grid, dens, color=colour(ds), lw=1.6)
            drawn.add(ds)
        h = 0.055 * top
        for i, (ds, x) in enumerate(data.items()):
            y = -(i + 0.7) * h
            if rug or ds not in curves:
                ax.plot(
                    10**x,
                    np.full(len(x), y),
                    "|" if ds in curves else "o",
                    color=colour(ds),
                    ms=5 if ds in curves else 3.5,
                    alpha=0.45 if ds in curves else 1.0,
                    ls="none",
                )
                drawn.add(ds)
            if ds not in curves:
                any_small = True
        ax.set_xscale("log")
        lines = info + [(n, NOTE_COLOUR) for n in notes]
        # headroom: the highest density stays below the text block in the top right
        bottom, block = -(len(data) + 0.3) * h, 0.065 * len(lines) + 0.06
        ceiling = bottom + (top * 1.04 - bottom) / (1 - block)
        ax.set_ylim(bottom, ceiling)
        ax.set_yticks([t for t in ax.get_yticks() if 0 <= t <= ceiling])
        ax.axhline(0, color="0.5", lw=0.6)
        ax.set_xlabel(f"{name} per sample (log scale)")
        ax.grid(alpha=0.3)
        _text_lines(ax, lines, 0.98, 0.97, "right")
    _ylabel(axes[0], f"Density of log10 {name}")
    order = [d for d in DATASETS if d in drawn] + sorted(drawn - set(DATASETS))
    handles = [Line2D([], [], color=colour(d), lw=1.6) for d in order]
    labels = [label(d) for d in order]
    if rug and order:
        handles.append(Line2D([], [], color="0.3", marker="|", ls="none", ms=6))
        labels.append("one sample (rug)")
    if any_small:
        handles.append(Line2D([], [], color="0.3", marker="o", ls="none", ms=3.5))
        labels.append(f"point: fewer than {MIN_LINE_N} samples, no density")
    _finish(fig, handles, labels, caption, out_png, out_pdf, ncol=6 if len(models) > 1 else 3)


# ----------------------------------------------------------------------------------------------- awareness
def experiment_layers(rows: pl.DataFrame, awareness: pl.DataFrame) -> dict[tuple[str, str], int]:
    """Layer K per (model, dataset): the layer of the patching / answer-only / saliency / popularity rows
    (one layer each), else the one layer 1..max missing from the awareness table (K is not probed there);
    absent if neither."""
    rows = _table(rows, ROWS_SCHEMA, optional=("note",))
    aw = _table(awareness, AWARENESS_SCHEMA, optional=("n", "n_q", "n_a"))
    out: dict[tuple[str, str], int] = {}
    at_k = rows.filter(
        pl.col("experiment").is_in(["patching", "answer_only", "saliency"])
        | (pl.col("condition") == "log10 popularity")
    )
    for (model, ds), g in at_k.group_by(["model", "dataset"]):
        layers = g["layer"].drop_nulls().unique()
        if len(layers) == 1:
            out[(model, ds)] = int(layers[0])
    for (model, ds), g in aw.filter(pl.col("layer").is_not_null()).group_by(["model", "dataset"]):
        if (model, ds) in out:
            continue
        present = set(g["layer"].to_list())
        missing = set(range(1, max(present) + 1)) - present
        if len(missing) == 1:
            out[(model, ds)] = missing.pop()
    return out


def plot_awareness(
    awareness: pl.DataFrame,
    rows: pl.DataFrame,
    models: list[str],
    titles: dict[str, str],
    out_png,
    out_pdf,
    caption: str = "",
) -> None:
    """Pathway awareness (A16): the cross-fitted AUC of a probe predicting Q- vs A-Anchored from the clean
    states, per layer, mean over seeds (band = min..max over seeds), one line per dataset; dashed at chance
    (0.5); a dotted vertical line at the experiment layer K, which defined the groups and is not probed."""
    aw = _table(awareness, AWARENESS_SCHEMA, optional=("n", "n_q", "n_a"))
    ks = experiment_layers(rows, aw)
    fig, axes = _figure(len(models))
    _titles(axes[0], models, titles)
    _hide_unused(axes, len(models))
    drawn: set[str] = set()
    extras: set[str] = set()
    low = 0.3
    for ax, model in zip(axes[0], models, strict=False):
        notes: list[str] = []
        info: list[tuple[str, str]] = []
        sub = aw.filter(pl.col("model") == model)
        if sub.height == 0:
            _blank(ax, "no awareness rows for this model", notes)
            _notes(ax, notes)
            continue
        _layer_axis(ax)
        panel_drawn = False
        for ds in datasets_in(sub):
            d = sub.filter(pl.col("dataset") == ds)
            ok = d.filter(
                (pl.col("status") == "ok") & pl.col("auc").is_not_null() & pl.col("auc").is_not_nan()
            )
            k = ks.get((model, ds))
            if ok.height == 0:
                status = d.filter(pl.col("status") != "ok")["status"]
                notes.append(f"{label(ds)}: {status[0] if len(status) else 'no AUC'}")
                continue
            agg = (
                ok.group_by("layer")
                .agg(
                    pl.col("auc").mean().alias("m"),
                    pl.col("auc").min().alias("lo"),
                    pl.col("auc").max().alias("hi"),
                    pl.len().alias("seeds"),
                )
                .sort("layer")
            )
            n_layers = max(int(agg["layer"].max()), k or 0)
            x = np.arange(1, n_layers + 1)
            full = pl.DataFrame({"layer": x}).join(agg, on="layer", how="left")
            m = full["m"].cast(pl.Float64).to_numpy()
            lo, hi = full["lo"].cast(pl.Float64).to_numpy(), full["hi"].cast(pl.Float64).to_numpy()
            multi = full["seeds"].fill_null(0).to_numpy() > 1
            ax.plot(x, m, color=colour(ds), lw=1.6)
            fin = np.isfinite(m)
            isolated = fin & ~np.r_[False, fin[:-1]] & ~np.r_[fin[1:], False]
            if isolated.any():
                ax.plot(x[isolated], m[isolated], "o", color=colour(ds), ms=3, ls="none")
            if multi.any():
                ax.fill_between(
                    x,
                    np.where(multi, lo, np.nan),
                    np.where(multi, hi, np.nan),
                    color=colour(ds),
                    alpha=0.15,
                    lw=0,
                )
                extras.add("band")
            low = min(low, float(np.nanmin(lo)) - 0.03)
            if k is not None:
                ax.axvline(k, color=colour(ds), ls=":", lw=1.2, zorder=1)
                extras.add("k")
            drawn.add(ds)
            panel_drawn = True
            first = d.row(0, named=True)
            n = f"n = {first['n']}" if first["n"] is not None else ""
            if first["n_q"] is not None and first["n_a"] is not None:
                n += f" (Q-A {first['n_q']}, A-A {first['n_a']})"
            k_text = f"K = {k}" if k is not None else ""
            info.append((f"{label(ds)}: " + ", ".join(t for t in (n, k_text) if t), colour(ds)))
        if panel_drawn:
            ax.axhline(0.5, color="0.45", lw=0.9, ls="--", zorder=0)
        else:
            _blank(ax, "", [])
        # sample counts and notes share one block in the empty region below chance
        _text_lines(ax, info + [(n, NOTE_COLOUR) for n in notes], 0.98, 0.03, "right", va="bottom")
    for ax in axes[0]:
        if ax.get_xticks().size:
            ax.set_ylim(low, 1.02)
    _ylabel(axes[0], "Pathway-awareness AUC")
    order = [d for d in DATASETS if d in drawn] + sorted(drawn - set(DATASETS))
    handles = [Line2D([], [], color=colour(d), lw=1.6) for d in order]
    labels = [label(d) for d in order]
    if "band" in extras:
        handles.append(Patch(facecolor="0.5", alpha=0.3, lw=0))
        labels.append("min..max over probe seeds")
    if order:
        handles.append(Line2D([], [], color="0.45", ls="--", lw=0.9))
        labels.append("chance (AUC 0.5)")
    if "k" in extras:
        handles.append(Line2D([], [], color="0.3", ls=":", lw=1.2))
        labels.append("layer K (defines the groups, not probed)")
    _finish(fig, handles, labels, caption, out_png, out_pdf, ncol=4 if len(models) > 1 else 2)


__all__ = [
    "PUBLISHED_ANSWER_ONLY",
    "PUBLISHED_MODEL",
    "PUBLISHED_PATCHING",
    "experiment_layers",
    "plot_answer_only",
    "plot_awareness",
    "plot_boundary",
    "plot_patching",
    "plot_saliency",
]
