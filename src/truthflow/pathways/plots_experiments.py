"""The figures of the Section 3.2-5 experiments (docs/method.md A12-A16), a panel column per model of a pair,
from the aggregated tables (densities, boxes: per-sample values); none raises on empty or degenerate ones."""

from functools import partial

import numpy as np
import polars as pl
import seaborn as sns
from matplotlib.colors import to_rgb
from matplotlib.patches import Patch

from .. import plotting
from ..plotting import MIN_LINE_N, colour, datasets_in, label
from .detection import AWARENESS_SCHEMA
from .experiments import GROUPS, ROW_SCHEMA, TABLE_KEYS
from .plots import STYLES

# group colours of the bar and box figures (datasets are on the x axis there); not the datasets' tab10 hues
GROUP_COLOURS = {"Q-Anchored": "#542788", "A-Anchored": "#b35806"}
# experiment_tables' tables: (schema, the optional columns that plotting.table adds as null, as k_layer)
ROWS_TABLE_SCHEMA = {**TABLE_KEYS, **ROW_SCHEMA}
AWARENESS_TABLE_SCHEMA = {**TABLE_KEYS, **AWARENESS_SCHEMA}
VALUES = dict.fromkeys(["s_pop", "s_eq_ea"], pl.Float64)  # per-sample values
PER_SAMPLE_SCHEMA = dict.fromkeys(["model", "dataset", "id", "group"], pl.String) | VALUES
TABLES = {
    "rows": (ROWS_TABLE_SCHEMA, ("note",)),
    "awareness": (AWARENESS_TABLE_SCHEMA, ("n", "n_q", "n_a")),
    "per_sample": (PER_SAMPLE_SCHEMA, tuple(VALUES)),
}
REQUIRED = {name: [c for c in s if c not in ("k_layer", *opt)] for name, (s, opt) in TABLES.items()}
PUBLISHED_SCHEMA = dict.fromkeys("kind model dataset anchor".split(), pl.String) | {"published": pl.Float64}
SALIENCY = r"$S(E_Q \rightarrow E_A)$"
# the bar figures: experiment -> (conditions with their legend suffixes, y label)
PATCHED = {"E_Q": r", $E_Q$ patched", "random": ", random tokens (control)"}
BARS = {
    "patching": (PATCHED, "Prediction flip rate (%)"),
    "answer_only": ({"-ΔP": ""}, "−ΔP, answer only (%)"),
}
BAR = {"lw": 0.8, "zorder": 2, "error_kw": {"ecolor": "0.15", "elinewidth": 0.8, "capsize": 1.8}}
N_LABEL = {
    "xytext": (0, 2),
    "textcoords": "offset points",
    "rotation": 90,
    "ha": "center",
    "va": "bottom",
    "fontsize": 6,
    "color": "0.3",
    "zorder": 4,
}
BOX = dict(widths=0.55, patch_artist=True, showfliers=False, medianprops={"color": "black", "lw": 1.4})
_finish = plotting.finish  # module attribute: tests replace it to inspect the legend


def _face(group: str, ci: int) -> dict:
    """A bar's look: the first condition solid, the control light and hatched."""
    col = GROUP_COLOURS[group]
    if ci == 0:
        return {"facecolor": col, "edgecolor": col}
    return {"facecolor": (*to_rgb(col), 0.28), "edgecolor": col, "hatch": "////"}


def _table(name: str, df) -> pl.DataFrame:
    return plotting.table(df, *TABLES[name])


def experiment_layers(rows: pl.DataFrame, awareness: pl.DataFrame) -> dict[tuple[str, str], int]:
    """Layer K per (model, dataset), from the tables' k_layer column (one value per model and dataset)."""
    tables = (_table("rows", rows), _table("awareness", awareness))
    found = pl.concat(t.select("model", "dataset", "k_layer") for t in tables).drop_nulls("k_layer")
    return {(m, ds): int(k) for m, ds, k in found.unique(["model", "dataset"]).iter_rows()}


def k_caption(rows, awareness, models: list[str], titles: dict[str, str]) -> str:
    """The figures' caption line naming layer K per model and dataset."""
    ks = experiment_layers(rows, awareness)
    parts = []
    for m in models:
        if mine := plotting.ordered(d for n, d in ks if n == m):
            parts.append(", ".join(f"{ks[m, ds]} ({label(ds)})" for ds in mine) + f" for {titles.get(m, m)}")
    return f"Experiment layer K: {'; '.join(parts) or 'none in the tables'}."


def _bar_panel(ax, sub: pl.DataFrame, conditions: list[str], published: pl.DataFrame, drawn: set) -> None:
    """Bars per dataset, group-major, one per condition present, looking as its place in `conditions` does in
    the legend; CI and n above; a group below MIN_LINE_N is a point; `published`: diamonds on the first's."""
    datasets = datasets_in(sub)
    present = [(ci, c) for ci, c in enumerate(conditions) if (sub["condition"] == c).any()]
    gap = 0.06  # between a dataset's Q- and A-Anchored bars
    width = (0.8 - gap) / (2 * len(present))
    for pi, (ci, cond) in enumerate(present):
        for gi, group in enumerate(GROUPS):
            r = sub.filter((pl.col("condition") == cond) & (pl.col("group") == group) & (pl.col("n") > 0))
            r = r.filter(pl.col("value").is_not_nan()).join(published, on=["dataset", "group"], how="left")
            idx = np.array([datasets.index(d) for d in r["dataset"]])
            x = idx - 0.4 + gi * gap + (gi * len(present) + pi + 0.5) * width
            v, lo, hi = r.select(pl.col("value", "ci_low", "ci_high").cast(pl.Float64)).to_numpy().T
            big = r["n"].to_numpy() >= MIN_LINE_N
            col = GROUP_COLOURS[group]
            err = [(v - lo)[big], (hi - v)[big]]
            ax.bar(x[big], v[big], width * 0.92, yerr=err, **_face(group, ci), **BAR)
            if (~big).any():
                fill = col if ci == 0 else "white"  # the control's points are hollow, as its bars are light
                ax.plot(x[~big], v[~big], "o", color=col, mfc=fill, ms=4, zorder=3)
                drawn.add("small")
            pv = r["published"].to_numpy() if ci == 0 else np.full(len(v), np.nan)
            if np.isfinite(pv).any():
                ax.plot(x, pv, "D", color="black", ms=3.2, zorder=5)
                drawn.add("published")
            label_y = np.nanmax([v, hi, pv, np.zeros(len(v))], axis=0)  # above the bar, its CI and diamond
            for xi, n, top in zip(x, r["n"], label_y, strict=True):
                ax.annotate(str(n), (xi, top), **N_LABEL)
            if r.height:
                drawn.add((cond, group))
    ax.set_xticks(range(len(datasets)), [label(d) for d in datasets])
    ax.set_xlim(-0.55, len(datasets) - 0.45)
    ax.tick_params(axis="x", length=0)
    ax.grid(axis="y", alpha=0.3, zorder=0)


def _bar_legend(drawn: set, names: dict[str, str], narrow: bool) -> tuple[list, list[str], int]:
    """Legend columns, one per condition (its Q- and A-Anchored bars; all bars in one column when `narrow`),
    then the markers; matplotlib fills a legend column by column, so short columns are padded blank."""
    columns = [
        [(Patch(**_face(g, ci)), f"{g}{names[cond]}") for g in GROUPS if (cond, g) in drawn]
        for ci, cond in enumerate(names)
    ]
    if narrow:
        columns = [[e for c in columns for e in c]]
    else:
        columns = [c for c in columns if c]
    extras = []
    if "published" in drawn:
        extras.append(plotting.marker("published value", "D", "black", 3.2))
    if "small" in drawn:
        extras.append(plotting.marker(f"point: n < {MIN_LINE_N} samples (no CI)"))
    if any(columns):
        columns.append([*extras, plotting.marker("n samples (above bars)", "$12$", ms=7)])
    rows = max((len(c) for c in columns), default=0)
    blank = plotting.marker("", "")
    padded = []
    for column in columns:
        if column:
            padded += column + [blank] * (rows - len(column))
    handles, labels = plotting.legend(padded)
    return handles, labels, max(1, len(columns))


def plot_bars(experiment, rows, models, titles, out_png, out_pdf, caption: str = "", published=None) -> None:
    """Token patching (A12: flip rate (%), E_Q solid, the control hatched) or answer-only (A13: −ΔP (%)), per
    dataset, Q- vs A-Anchored, with 95% CI and n; `published` (published.tsv) values are diamonds."""
    names, ylabel = BARS[experiment]
    rows = _table("rows", rows).filter(experiment=experiment)
    rows = rows.filter(pl.col("condition").is_in(list(names)))
    pub = plotting.table(published, PUBLISHED_SCHEMA).filter(kind=experiment).rename({"anchor": "group"})
    pub = pub.select("model", "dataset", "group", pl.col("published").cast(pl.Float64))
    fig, axes = plotting.panels(models, titles)
    drawn = set()
    used = []  # (panel, its notes) of each model with rows
    why = f"no {experiment.replace('_', '-')} rows"
    for ax, model, sub in plotting.per_model(axes[0], rows, models, why):
        noted = sub.filter(pl.col("note") != "").select("dataset", "note").unique(maintain_order=True)
        notes = [f"{label(d)}: {n}" for d, n in noted.rows()]  # a null note is not kept
        _bar_panel(ax, sub, list(names), pub.filter(pl.col("model") == model).drop("model"), drawn)
        missing = [c for c in list(names)[1:] if not (sub["condition"] == c).any()]  # the random control
        if missing:
            notes.append("no random-token control rows")
        used.append((ax, notes))
    if used:  # one scale for the pair; headroom for the n labels and the notes
        low = min(0.0, *(ax.dataLim.y0 for ax, _ in used))
        high = max(ax.dataLim.y1 for ax, _ in used)
        span = max(high - low, 1.0)
        n_lines = max(len(n) for _, n in used)
        below = 0.05 * span if low < 0 else 0.0
        above = (0.22 + 0.09 * n_lines) * span
        for ax, notes in used:
            ax.set_ylim(low - below, high + above)
            ax.axhline(0, color="0.4", lw=0.8, zorder=1)
            plotting.note(ax, notes, loc="upper left")
        used[0][0].set_ylabel(ylabel)
    handles, labels, ncol = _bar_legend(drawn, names, narrow=len(models) < 2)
    _finish(fig, handles, labels, caption, out_png, out_pdf, ncol=ncol)


plot_patching = partial(plot_bars, "patching")
plot_answer_only = partial(plot_bars, "answer_only")


def _popularity_panel(ax, samples: pl.DataFrame) -> bool:
    """Boxes of log10 popularity per group (and dataset), points below MIN_LINE_N; whether any were points."""
    pop = samples.filter(pl.col("s_pop").is_not_null())
    if pop.height == 0:
        plotting.blank(ax, "no popularity values (PopQA only)")
        return False
    ticks = []
    small = False
    notes = []
    names = datasets_in(pop)
    for di, ds in enumerate(names):
        d = pop.filter(pl.col("dataset") == ds)
        c = colour(ds)
        non_positive = d.filter(~(pl.col("s_pop") > 0)).height
        if non_positive:
            notes.append(f"{label(ds)}: {non_positive} samples with popularity ≤ 0 left out")
        for gi, group in enumerate(GROUPS):
            positive = d.filter((pl.col("group") == group) & (pl.col("s_pop") > 0))
            y = np.log10(positive["s_pop"].to_numpy())
            x = di * 2.6 + gi
            ls = STYLES[group]
            tick = f"{group}\nn = {len(y)}"
            if len(names) > 1:
                tick += f"\n{label(ds)}"
            ticks.append((x, tick))
            if len(y) >= MIN_LINE_N:
                box = {"facecolor": (*to_rgb(c), 0.25), "edgecolor": c, "linestyle": ls}
                lines = {"whiskerprops": {"color": c, "linestyle": ls}, "capprops": {"color": c}}
                ax.boxplot(y, positions=[x], boxprops=box, **lines, **BOX)
                jitter = np.random.default_rng(0).uniform(-0.16, 0.16, len(y))
                ax.scatter(x + jitter, y, s=3, color=c, alpha=0.35, lw=0, zorder=3)
            elif len(y):
                ax.plot(np.full(len(y), x), y, "o", color=c, ms=3.5)
                small = True
    ax.set_xticks(*zip(*ticks, strict=True), fontsize=8)
    ax.set_xlim(-0.7, ticks[-1][0] + 0.7)
    ax.grid(axis="y", alpha=0.3)
    ax.set_ylabel(f"{label(names[0])}: log10 popularity" if len(names) == 1 else "log10 popularity")
    plotting.note(ax, notes)
    return small


def plot_boundary(rows, per_sample, models, titles, out_png, out_pdf, caption: str = "") -> None:
    """Knowledge boundary (A14), one row of panels per model: (a) accuracy and (b) refusal rate (%) per layer,
    Q-Anchored solid / A-Anchored dashed, colour = dataset; (c) log10 popularity by group at K (PopQA)."""
    ks = experiment_layers(rows, None)
    rows = _table("rows", rows).filter(pl.col("experiment") == "boundary")
    samples = _table("per_sample", per_sample)
    fig, axes = plotting.figure(3, n_rows=max(1, len(models)), height=2.9)
    drawn = set()
    small = False
    for r, model in enumerate(models):
        name = titles.get(model, model)
        sub = rows.filter(pl.col("model") == model)
        mine = samples.filter(pl.col("model") == model)
        pop_k = {ks.get((model, ds)) for ds in datasets_in(mine.drop_nulls("s_pop"))} - {None}
        at_k = f", groups at K = {pop_k.pop()}" if len(pop_k) == 1 else ""
        for c, ax in enumerate(axes[r]):
            letter = chr(97 + (3 * r + c) % 26)  # (a), (b), ... across the rows
            suffix = at_k if c == 2 else ""  # the popularity panel
            ax.set_title(f"({letter}) {name}{suffix}", fontsize=10, loc="left")
        for c, (cond, ylabel) in enumerate((("accuracy", "Accuracy (%)"), ("refusal", "Refusal rate (%)"))):
            ax = axes[r][c]
            rates = sub.filter(pl.col("condition") == cond)
            if rates.height == 0:
                plotting.blank(ax, f"no {cond} rows for this model")
                continue
            plotting.layer_axis(ax)
            n_layers = int(rates["layer"].max() or 0)
            rates = rates.filter(pl.col("value").is_not_nan()).rename({"value": "mean_delta_p"})
            for ds in datasets_in(rates):
                d = rates.filter(pl.col("dataset") == ds)
                small |= plotting.draw_styles(ax, d, "group", STYLES, ds, n_layers, drawn)
            lo, hi = ax.get_ylim()  # autoscaled to what is drawn, never beyond 0..100
            ax.set(ylim=(max(lo, -4), min(max(hi, 5), 104)), ylabel=ylabel)
        small |= _popularity_panel(axes[r][2], mine)
    if not models:
        for ax in axes[0]:
            plotting.blank(ax, "no models in this figure" if ax is axes[0][0] else "")
    groups = [(plotting.line("0.25", s), g) for g, s in STYLES.items() if any(x == g for x, _ in drawn)]
    point = small and plotting.marker(f"point: n < {MIN_LINE_N} samples")
    handles, labels = plotting.dataset_legend({ds for _, ds in drawn}, *groups, point)
    _finish(fig, handles, labels, caption, out_png, out_pdf, ncol=8)


def plot_saliency(per_sample, models, titles, out_png, out_pdf, caption: str = "") -> None:
    """Saliency (A15): per dataset a KDE of log10 of the positive S(E_Q→E_A) per sample (area 1 in log10
    units) with a rug below zero, the rug alone below MIN_LINE_N or without spread; values ≤ 0 in a note."""
    samples = _table("per_sample", per_sample).filter(pl.col("s_eq_ea").is_not_nan())  # null: not kept
    fig, axes = plotting.panels(models, titles)
    drawn = set()
    small = False
    for ax, _, sub in plotting.per_model(axes[0], samples, models, f"no {SALIENCY} values"):
        info = []
        notes = []
        rugs = []  # (dataset, its positive values, whether a density is drawn above them)
        for ds in datasets_in(sub):
            v = sub.filter(pl.col("dataset") == ds)["s_eq_ea"].cast(pl.Float64).to_numpy()
            pos = v[v > 0]
            if not len(pos):
                notes.append(f"{label(ds)}: all {len(v)} values ≤ 0, nothing to draw on a log scale")
                continue
            curve = len(pos) >= MIN_LINE_N and len(np.unique(pos)) > 1
            if curve:
                sns.kdeplot(x=pos, ax=ax, log_scale=True, cut=2, color=colour(ds), lw=1.6)
            elif len(pos) >= MIN_LINE_N:
                notes.append(f"{label(ds)}: all values equal, no density")
            rugs.append((ds, pos, curve))
            out = f" ({len(v) - len(pos)} values ≤ 0 left out)" if len(v) > len(pos) else ""
            info.append((f"{label(ds)}: n = {len(pos)}{out}", colour(ds)))
            drawn.add(ds)
        small |= not all(c for _, _, c in rugs)
        if not rugs:
            plotting.blank(ax)
        else:
            ax.set_xscale("log")
            top = max([ln.get_ydata().max() for ln in ax.lines] or [1.0])
            h = 0.055 * top
            for i, (ds, pos, curve) in enumerate(rugs):
                if curve:  # a rug under the density
                    m, ms, alpha = "|", 5, 0.45
                else:  # points where no density is drawn
                    m, ms, alpha = "o", 3.5, 1.0
                ax.plot(pos, np.full(len(pos), -(i + 0.7) * h), m, color=colour(ds), ms=ms, alpha=alpha)
            # headroom: the highest density stays below the text block in the top right
            bottom = -(len(rugs) + 0.3) * h
            block = 0.075 * (len(info) + len(notes)) + 0.06  # the text block's share of the panel height
            ax.set_ylim(bottom, bottom + (top * 1.04 - bottom) / (1 - block))
            ax.set_yticks([t for t in ax.get_yticks() if 0 <= t <= ax.get_ylim()[1]])
            ax.axhline(0, color="0.5", lw=0.6)
            ax.grid(alpha=0.3)
        ax.set(xlabel=f"{SALIENCY} per sample (log scale)", ylabel="")
        plotting.note(ax, info + notes, loc="upper right")
    plotting.ylabel(axes[0], f"Density of log10 {SALIENCY}")
    rug = plotting.marker("one sample (rug)", "|", ms=6)
    point = plotting.marker(f"point: fewer than {MIN_LINE_N} samples, no density")
    handles, labels = plotting.dataset_legend(drawn, bool(drawn) and rug, small and point)
    _finish(fig, handles, labels, caption, out_png, out_pdf, ncol=6 if len(models) > 1 else 3)


def plot_awareness(awareness, rows, models, titles, out_png, out_pdf, caption: str = "") -> None:
    """Pathway awareness (A16): probe AUC by layer per dataset, chance dashed, layer K (unprobed) dotted."""
    aw = _table("awareness", awareness)
    ks = experiment_layers(rows, awareness)
    fig, axes = plotting.panels(models, titles)
    drawn = set()
    band = False  # whether any band (several probe seeds) was drawn
    at_k = False  # whether any layer K line was drawn
    low = 0.3  # the panels' shared lower y limit
    for ax, model, sub in plotting.per_model(axes[0], aw, models, "no awareness rows"):
        info = []
        notes = []
        plotting.layer_axis(ax)
        for ds in datasets_in(sub):
            d = sub.filter(pl.col("dataset") == ds)
            k = ks.get((model, ds))
            ok = d.filter((pl.col("status") == "ok") & pl.col("auc").is_not_nan())  # null: not kept
            if ok.height == 0:
                status = d.filter(pl.col("status") != "ok")["status"]
                notes.append(f"{label(ds)}: {status[0] if len(status) else 'no AUC'}")
                continue
            full = plotting.band_by_layer(ax, ok, colour(ds), k or 0)
            band |= bool((full["seeds"].fill_null(0) > 1).any())
            low = min(low, float(full["lo"].min()) - 0.03)
            if k is not None:
                ax.axvline(k, color=colour(ds), ls=":", lw=1.2, zorder=1)
                at_k = True
            drawn.add(ds)
            first = d.row(0, named=True)
            n = f"n = {first['n']}" if first["n"] is not None else ""
            if first["n_q"] is not None and first["n_a"] is not None:
                n += f" (Q-A {first['n_q']}, A-A {first['n_a']})"
            k_text = f"K = {k}" if k is not None else ""
            text = ", ".join(t for t in (n, k_text) if t)
            info.append((f"{label(ds)}: {text}", colour(ds)))
        if info:
            ax.axhline(0.5, color="0.45", lw=0.9, ls="--", zorder=0)
        else:
            plotting.blank(ax)
        # sample counts and notes share one block in the empty region below chance
        plotting.note(ax, info + notes, loc="lower right")
    for ax in axes[0]:
        if ax.get_xticks().size:
            ax.set_ylim(low, 1.02)
    plotting.ylabel(axes[0], "Pathway-awareness AUC")
    band = band and (Patch(facecolor="0.5", alpha=0.3, lw=0), "min..max over probe seeds")
    chance = bool(drawn) and (plotting.line("0.45", "--", lw=0.9), "chance (AUC 0.5)")
    at_k = at_k and (plotting.line("0.3", ":", lw=1.2), "layer K (defines the groups, not probed)")
    handles, labels = plotting.dataset_legend(drawn, band, chance, at_k)
    _finish(fig, handles, labels, caption, out_png, out_pdf, ncol=4 if len(models) > 1 else 2)
