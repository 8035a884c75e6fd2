import logging

import polars as pl

from truthflow import runlog, validate
from truthflow.pathways import plots_experiments as pe
from truthflow.plotting import DATASETS, label

ROWS = ["model", "dataset", "experiment", "condition", "group", "layer", "n", "value", "ci_low", "ci_high"]
AWARENESS = ["model", "dataset", "layer", "seed", "auc", "status"]
SAMPLES = ["model", "dataset", "id", "group"]


def _read(path, columns) -> pl.DataFrame:
    """The table; an empty one (a run without rows writes it without columns) is passed on as it is, and
    the figures write a note for it."""
    df = validate.read_parquet(path)
    if df.height:
        validate.check_columns(df, path, columns, "experiment_tables")
    return df


def _layers(rows, awareness, models, titles) -> str:
    """'K = 10 (PopQA), 8 (TriviaQA) for Llama-3.2-1B; ...' from the tables."""
    ks = pe.experiment_layers(rows, awareness)
    order = {ds: i for i, ds in enumerate(DATASETS)}
    parts = []
    for m in models:
        mine = sorted((ds for model, ds in ks if model == m), key=lambda d: (order.get(d, len(order)), d))
        these = [f"{ks[(m, ds)]} ({label(ds)})" for ds in mine]
        if these:
            parts.append(f"{', '.join(these)} for {titles.get(m, m)}")
    return "; ".join(parts)


def _published_on(models, titles) -> set[str]:
    """The panels that get the paper's values: the paper reports them for Llama-3-8B only."""
    return {m for m in models if m == "llama-3-8b" or titles.get(m) == pe.PUBLISHED_MODEL}


def main(sm):
    # runlog logs at INFO; fontTools would write hundreds of lines per PDF (font subsetting) into the log
    logging.getLogger("fontTools").setLevel(logging.WARNING)
    rows = _read(sm.input.rows, ROWS)
    awareness = _read(sm.input.awareness, AWARENESS)
    per_sample = _read(sm.input.per_sample, SAMPLES)
    p = sm.params
    models, titles = list(p.models), dict(p.titles)
    k = _layers(rows, awareness, models, titles)
    at_k = f"Experiment layer K: {k}." if k else "Experiment layer K: none in the tables."
    n_text = "n = distinct samples."
    ci_text = {
        "bootstrap": "n = distinct samples; {}: seeded bootstrap 95% CI over samples.",
        "wilson": "n = distinct samples; {}: Wilson 95% CI of the rate over samples.",
    }

    def caption(text: str, ci: str = "", kind: str = "bootstrap") -> str:
        stats = ci_text[kind].format(ci) if ci else n_text
        return f"{text} {stats} {at_k}" if p.show_caption else ""

    def out(fig: str):
        return sm.output[f"{fig}_png"], sm.output[f"{fig}_pdf"]

    pub_on = _published_on(models, titles)
    pub_note = f" Black diamonds: published {pe.PUBLISHED_MODEL} values." if pub_on else ""
    pe.plot_patching(
        rows,
        models,
        titles,
        *out("patching"),
        caption=caption(
            "Token patching (A12): share of the probe's 'correct' predictions that flip when the E_Q tokens"
            " are replaced by a donor question's (solid) or when as many random non-E_Q question tokens are"
            " (hatched, the control), over samples answered correctly and predicted correct." + pub_note,
            "error bars",
            "wilson",
        ),
        published=pe.PUBLISHED_PATCHING if pub_on else None,
        published_on=pub_on,
    )
    pe.plot_answer_only(
        rows,
        models,
        titles,
        *out("answer_only"),
        caption=caption(
            "Answer-only (A13): −ΔP, the drop (%) of the probe's confidence in its clean prediction when the"
            " state is recomputed from the answer alone; higher = more question-dependent." + pub_note,
            "error bars",
        ),
        published=pe.PUBLISHED_ANSWER_ONLY if pub_on else None,
        published_on=pub_on,
    )
    pe.plot_boundary(
        rows,
        per_sample,
        models,
        titles,
        *out("boundary"),
        caption=caption(
            "Knowledge boundary (A14): answer accuracy and refusal rate per layer of the groups split at that"
            " layer (solid Q-Anchored, dashed A-Anchored); box plots: log10 PopQA popularity of the groups at"
            " layer K (box = quartiles, whiskers = 1.5 IQR, dots = samples).",
            "bands",
            "wilson",
        ),
    )
    pe.plot_saliency(
        per_sample,
        models,
        titles,
        *out("saliency"),
        caption=caption(
            "Saliency (A15): density of the per-sample S(E_Q→E_A) (averaged over layers) on a log scale,"
            " Gaussian KDE of log10 values, one curve per dataset, rug = samples; values ≤ 0 are left out"
            " and counted. The paper shows two modes on its models."
        ),
    )
    pe.plot_awareness(
        awareness,
        rows,
        models,
        titles,
        *out("awareness"),
        caption=caption(
            "Pathway awareness (A16): cross-fitted AUC of a linear probe predicting Q- vs A-Anchored (the"
            " groups at K) from the clean state at each other layer; line = mean over probe seeds, band ="
            " min..max over seeds; dashed: chance; dotted: K, which defines the groups and is not probed."
        ),
    )


runlog.run(snakemake, main)  # noqa: F821
