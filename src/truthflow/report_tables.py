"""Report tables as small self-contained HTML pages (shown inline, unlike TSV), numbers rounded."""

from __future__ import annotations

import html
import math
import re
from pathlib import Path
from typing import TYPE_CHECKING

if TYPE_CHECKING:  # the Snakefile reads TABLES: no polars import at parse time
    import polars as pl

# the report's tables (rule table_html): name -> (title, caption file in workflow/report)
TABLES = {
    "accuracy": ("Accuracy", "accuracy.rst"),
    "pathways_check": ("Falsification test: E_Q knockout vs random control", "pathways_check_table.rst"),
    "pathways_check_layers": ("Falsification test under each layer range", "pathways_check_layers.rst"),
    "exact_tokens": ("Exact tokens per answer class", "exact_tokens.rst"),
    "pathways_experiments": (
        "Patching, answer-only, knowledge boundary, saliency per group",
        "pathways_experiments_table.rst",
    ),
    "pathways_awareness": ("Pathway awareness AUC by layer", "pathways_awareness_table.rst"),
    "pathways_table3": ("Hallucination detection (the paper's Table 3)", "pathways_table3.rst"),
    "probe_auc": ("Probe AUC by layer", "probe_auc_table.rst"),
    "dropped_samples": ("Kept and dropped samples", "dropped.rst"),
    "depth_metrics": (
        "DepthQA: the authors' metrics (mean score, forward and backward discrepancy)",
        "depth_metrics.rst",
    ),
    "depth_prompts": ("DepthQA: the prompt files of this run, by content digest", "depth_prompts.rst"),
    "depth_released_metrics": (
        "DepthQA, the judge stage alone: the authors' metrics over released answers",
        "depth_released_metrics.rst",
    ),
    "depth_released_prompts": ("DepthQA: the released answers' judge prompt", "depth_released_prompts.rst"),
    "inputs": ("Inputs: every model's and dataset's resolved revision and files' sha256", "inputs.rst"),
    "published_vs_reproduced": ("Published vs reproduced", "compare.rst"),
    "benchmarks": ("Benchmarks", "benchmarks.rst"),
}


def caption(rst, options: str = "", extra: str = "") -> str:
    """A report caption (workflow/report/*.rst) as plain text, `options` in its placeholder, `extra` after."""
    text = re.sub(r"\{\{\s*snakemake\.params\.caption\s*\}\}", options, Path(rst).read_text())
    return " ".join(f"{text.replace('``', '')} {extra}".split())


STYLE = """
body { font-family: system-ui, sans-serif; font-size: 13px; margin: 12px; color: #222; }
h1 { font-size: 15px; margin: 0 0 6px 0; }
p.caption { color: #555; max-width: 70em; margin: 0 0 10px 0; }
table { border-collapse: collapse; }
th, td { padding: 3px 8px; border-bottom: 1px solid #ddd; text-align: left; vertical-align: top; }
th { background: #f3f3f3; position: sticky; top: 0; }
td.num { text-align: right; font-variant-numeric: tabular-nums; white-space: nowrap; }
tr:hover td { background: #fafafa; }
td.holds { color: #1a7f37; font-weight: 600; }
td.not { color: #b42318; font-weight: 600; }
td.inconclusive { color: #9a6700; font-weight: 600; }
"""


def fmt(value) -> str:
    """Numbers for reading: ints as is, floats to 3 significant digits (1 decimal from 100), missing: '–'."""
    if value is None or (isinstance(value, float) and math.isnan(value)):
        return "–"
    if isinstance(value, bool):
        return "yes" if value else "no"
    if isinstance(value, int):
        return f"{value:,}" if abs(value) >= 10_000 else str(value)
    if isinstance(value, float):
        if value == 0:
            return "0"
        return f"{value:,.1f}" if abs(value) >= 100 else f"{value:.3g}"
    return str(value)


# a verdict's colour class by its first word; any other verdict (does not hold, outside range) is "not"
VERDICTS = {"holds": "holds", "within": "holds", "inconclusive": "inconclusive", "undefined": "inconclusive"}


def _cell(col: str, value) -> str:
    text = html.escape(fmt(value))
    if isinstance(value, (int, float)) and not isinstance(value, bool):
        return f'<td class="num">{text}</td>'
    if col == "verdict" and isinstance(value, str):
        first_word = value.partition(" ")[0]
        return f'<td class="{VERDICTS.get(first_word, "not")}">{text}</td>'
    return f"<td>{text}</td>"


# polars writes no HTML, and pandas' to_html neither rounds for reading nor marks verdicts
def to_html(table: pl.DataFrame, title: str, caption: str = "") -> str:
    head = "".join(f"<th>{html.escape(c)}</th>" for c in table.columns)
    body = "\n".join(
        "<tr>" + "".join(_cell(c, row[c]) for c in table.columns) + "</tr>"
        for row in table.iter_rows(named=True)
    )
    cap = f'<p class="caption">{html.escape(caption)}</p>' if caption else ""
    title = html.escape(title)
    return (
        f'<!doctype html>\n<html><head><meta charset="utf-8"><title>{title}</title>'
        f"<style>{STYLE}</style></head><body><h1>{title}</h1>{cap}"
        f"<table><thead><tr>{head}</tr></thead><tbody>\n{body}\n</tbody></table>"
        f'<p class="caption">{table.height} rows.</p></body></html>\n'
    )


def tsv_to_html(tsv: str | Path, out: str | Path, title: str, caption: str = "") -> None:
    import polars as pl

    table = pl.read_csv(tsv, separator="\t", infer_schema_length=None)
    Path(out).parent.mkdir(parents=True, exist_ok=True)
    Path(out).write_text(to_html(table, title, caption), encoding="utf-8")
