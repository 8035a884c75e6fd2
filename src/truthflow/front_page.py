"""The report's front page: each paper's published-vs-reproduced values (met, or missed and by how much) and
the falsification verdicts, as reStructuredText that workflow/report/workflow.rst includes above the
workflow graph. Every row links to the report item that shows it: Snakemake names a link target after each
report item's file (`name.png`_ in any of the report's .rst)."""

from __future__ import annotations

import polars as pl

from .compare import QUALITATIVE
from .report_tables import VERDICTS, fmt

# published.tsv's papers, in the order the page shows them: heading, and the config that runs their models
PAPERS = {
    "Two Pathways": ("Two Pathways (Luo et al., arXiv 2601.07422)", "configs/paper-pathways.yaml"),
    "DepthQA": ("DepthQA (Ko et al., EMNLP 2024)", "configs/paper-depth.yaml"),
}
FALSIFICATION = QUALITATIVE["eq_vs_control"]
ROLES = ("holds", "not", "inconclusive")  # a verdict's class (report_tables.VERDICTS), styled by report.css


def _rst(value) -> str:
    """A cell's text, rounded for reading, with reStructuredText's markup characters taken literally."""
    text = fmt(value)
    for char in "\\`*_|":
        text = text.replace(char, "\\" + char)
    return text


def _verdict(verdict: str, shown: str | None = None) -> str:
    """A verdict coloured by its class (report_tables.VERDICTS: by its first word), shown as `shown`."""
    role = VERDICTS.get(verdict.partition(" ")[0], "not")
    return f":verdict-{role}:`{_rst(shown or verdict)}`"


def _link(target: str | None) -> str:
    """An anonymous link to a report item by its file name; '–' where the run draws none."""
    if not target:
        return "–"
    return f"`{'figure' if target.endswith('.png') else 'table'} <{target}_>`__"


def _table(header: list[str], rows: list[list[str]]) -> list[str]:
    lines = [".. list-table::", "   :header-rows: 1", "   :widths: auto", "   :class: front-page", ""]
    for row in [header, *rows]:
        # an escaped space before a leading digit: "1. x" would open an enumerated list
        cells = ["\\ " + c if c[:1].isdigit() else c for c in row]
        lines += [f"   {'*' if i == 0 else ' '} - {cell}" for i, cell in enumerate(cells)]
    return [*lines, ""]


def _missed(row: dict) -> str:
    """'met' within the published range; otherwise how far outside it."""
    off = row["off_range"]
    if off == 0:
        return _verdict(row["verdict"], "met")
    side = "below" if off < 0 else "above"
    return _verdict(row["verdict"], f"missed: {fmt(abs(off))} {side} the range")


def published_table(rows: pl.DataFrame, links: dict) -> tuple[str, list[str]]:
    """The published values of this run's models next to this run's: (the one-line answer, the table)."""
    header = ["Model", "Dataset", "Value", "Published [range]", "Reproduced", "Verdict", "Shown in"]
    body = [
        [
            _rst(r["model"]),
            _rst(r["dataset"]),
            _rst(r["detail"]),
            f"{_rst(r['published'])} {_rst(r['published_range'])}",
            _rst(r["reproduced"]),
            _missed(r),
            _link(links.get(r["kind"], {}).get(r["model"])),
        ]
        for r in rows.iter_rows(named=True)
    ]
    answer = f"{rows.filter(pl.col('off_range') == 0).height} of {rows.height} published values met"
    return answer, [
        f"**Published vs reproduced**: {answer} (reproduced within the published range).",
        "",
        *_table(header, body),
    ]


def _counts(verdicts: list[str]) -> str:
    counts = {v: verdicts.count(v) for v in dict.fromkeys(verdicts)}
    return ", ".join(f"{v} in {n}" for v, n in counts.items())


def _other_ranges(layers: pl.DataFrame | None, r: dict) -> str:
    """The verdict under each other layer range (pathways_check_layers.tsv): does the verdict depend on it?"""
    if layers is None:
        return "–"
    sub = layers.filter(model=r["model"], dataset=r["dataset"]).filter(pl.col("layers") != r["layers"])
    return (
        "; ".join(f"{_rst(x['layers'])}: {_verdict(x['verdict'])}" for x in sub.iter_rows(named=True)) or "–"
    )


def falsification_table(
    check: pl.DataFrame, layers: pl.DataFrame | None, links: dict
) -> tuple[str, list[str]]:
    """pathways_check.tsv: per (model, dataset), the E_Q knockout against the matched random-token control."""
    header = [
        "Model",
        "Dataset",
        "Layers",
        "E_Q − control [Holm-corrected interval]",
        "p (Holm)",
        "n",
        "Verdict",
    ]
    header += ["Other layer ranges", "Shown in"]
    body = []
    for r in check.iter_rows(named=True):
        diff = _rst(r["diff"])
        if r["diff_low"] is not None:
            diff = f"{_rst(r['measure'])} {diff} [{_rst(r['diff_low'])}, {_rst(r['diff_high'])}]"
        verdict = _verdict(r["verdict"])
        if r["verdict"] == "inconclusive" and r["reason"]:  # else the interval and the margin say why
            verdict += f" ({_rst(r['reason'])})"
        cells = [r["model"], r["dataset"], r["layers"]]
        body.append(
            [*map(_rst, cells), diff, _rst(r["p_holm"]), _rst(r["n_samples"]), verdict]
            + [_other_ranges(layers, r), _link(links.get("eq_vs_control", {}).get(r["model"]))]
        )
    sesoi = check["sesoi"].drop_nulls()
    margin = f", equivalence margin (SESOI) {fmt(sesoi[0])}" if sesoi.len() else ""
    answer = f"{_counts(check['verdict'].to_list())} of {check.height} (model, dataset) cells"
    test = f"one-sided, Holm-corrected over the {check.height} cells{margin}"
    intro = f"**Falsification check**: {_rst(FALSIFICATION[1])} ({test}): {answer}."
    return f"falsification check {answer}", [intro, "", *_table(header, body)]


def qualitative_table(rows: pl.DataFrame, links: dict) -> tuple[str, list[str]]:
    """A qualitative check per model (published_vs_reproduced.tsv)."""
    header = ["Model", "Reproduced", "Verdict", "Shown in"]
    body = [
        [
            _rst(r["model"]),
            _rst(r["detail"]),
            _verdict(r["verdict"]),
            _link(links.get(r["kind"], {}).get(r["model"])),
        ]
        for r in rows.iter_rows(named=True)
    ]
    answer = f"{_rst(rows['check'][0])}: {_counts(rows['verdict'].to_list())} of {rows.height} models"
    return answer, [f"**{answer}**.", "", *_table(header, body)]


def render(
    compared: pl.DataFrame,
    check: pl.DataFrame | None = None,
    layers: pl.DataFrame | None = None,
    links: dict[str, dict[str, str]] | None = None,
) -> str:
    """The front page from published_vs_reproduced.tsv (`compared`), pathways_check.tsv (`check`, None where
    the pathways stage is off) and pathways_check_layers.tsv (`layers`); `links`: kind -> model -> the file
    name of the report item that shows it. It opens on each paper's answers in a line, then their tables."""
    links = links or {}
    answers, sections = [], []
    for paper, (heading, config) in PAPERS.items():
        rows = compared.filter(paper=paper)
        falsification = check if paper == FALSIFICATION[0] else None
        if rows.height == 0 and falsification is None:
            continue
        parts = []
        published = rows.filter(check="published value")
        if published.height:
            parts.append(published_table(published, links))
        else:
            none = "no published value for this run's models"
            where = f"(``workflow/report/published.tsv``; ``{config}`` runs the paper's models)"
            parts.append((none, [f"**Published vs reproduced**: {none} {where}.", ""]))
        if falsification is not None and falsification.height:
            parts.append(falsification_table(falsification, layers, links))
        qualitative = rows.filter(pl.col("check") != "published value", pl.col("kind") != "eq_vs_control")
        for kind in qualitative["kind"].unique(maintain_order=True):
            parts.append(qualitative_table(qualitative.filter(kind=kind), links))
        answers.append(f"- **{heading}**: {'; '.join(answer for answer, _ in parts)}.")
        sections += [heading, "-" * len(heading), "", *(line for _, table in parts for line in table)]
    roles = [f".. role:: verdict-{role}" for role in ROLES]
    return "\n".join([*roles, "", *answers, "", *sections]) + "\n"
