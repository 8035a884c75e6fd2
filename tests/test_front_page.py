"""The report's front page (truthflow.front_page): both papers' published-vs-reproduced rows and the
falsification verdicts, each linking to its figure, rendered as Snakemake renders the report's description
(workflow/report/workflow.rst: Jinja, then docutils, with a link target per report item)."""

import re

import polars as pl
from conftest import REPO

from truthflow.compare import SCHEMA
from truthflow.front_page import render
from truthflow.pathways.check import CHECK_SCHEMA, LAYERS_SCHEMA

PAIR = "llama-3.2-1b__llama-3.2-3b"
LINKS = {
    "delta_p": {"llama-3.2-1b": f"pathways_{PAIR}.png"},
    "eq_vs_control": {"llama-3.2-1b": f"pathways_check_{PAIR}.png"},
    "median_mink": {"llama-2-7b-chat": "depth_mink_boxes.png"},
    "mink_rises": {"llama-2-7b-chat": "depth_mink_boxes.png"},
    "mean_score": {"llama-2-7b-chat": "depth_metrics.html"},
}


def _compared() -> pl.DataFrame:
    delta_p = "mean ΔP, Q-Anchored, layer 10 (seeds 000-002)"
    rows = [
        ("Two Pathways", "delta_p", "published value", "llama-3.2-1b", "popqa", delta_p, -55.0, "[-65, -40]")
        + (-47.25, 0.0, "within range"),
        ("Two Pathways", "delta_p", "published value", "llama-3.2-1b", "nq", delta_p, -55.0, "[-65, -40]")
        + (-20.0, 20.0, "outside range"),
        ("Two Pathways", "eq_vs_control", "E_Q knockout beats random control", "llama-3.2-1b", "popqa", "…")
        + (None, None, -12.5, None, "holds"),
        ("DepthQA", "median_mink", "published value", "llama-2-7b-chat", "depthqa", "median, depth 1", 3.0)
        + ("[2.5, 3.5]", 2.0, -0.5, "outside range"),
        (
            "DepthQA",
            "mean_score",
            "published value",
            "llama-2-7b-chat",
            "depthqa",
            "mean score, depth 1",
            4.56,
        )
        + ("[4.36, 4.76]", 4.5, 0.0, "within range"),
        ("DepthQA", "mink_rises", "MIN-K% rises with depth", "llama-2-7b-chat", "depthqa")
        + ("median by depth D1/D2/D3: 2.00 / 2.50 / 2.40", None, None, 0.4, None, "does not hold"),
    ]
    return pl.DataFrame(rows, schema=SCHEMA, orient="row")


def _check() -> tuple[pl.DataFrame, pl.DataFrame]:
    row = dict.fromkeys(CHECK_SCHEMA) | {
        "model": "llama-3.2-1b",
        "measure": "delta_p",
        "layers": "second_half (9-16)",
        "n_samples": 120,
        "sesoi": 5.0,
    }
    check = pl.DataFrame(
        [
            row
            | {"dataset": "popqa", "diff": -12.5, "diff_low": -18.0, "diff_high": -7.0}
            | {"p_holm": 0.0004, "verdict": "holds", "reason": ""},
            row | {"dataset": "nq", "diff": -1.0, "verdict": "inconclusive", "reason": "mde 9.1 > SESOI 5"},
        ],
        schema=CHECK_SCHEMA,
    )
    layer = dict.fromkeys(LAYERS_SCHEMA) | {"model": "llama-3.2-1b", "measure": "delta_p"}
    layers = pl.DataFrame(
        [
            layer | {"dataset": "popqa", "range": "all", "layers": "all (1-16)", "verdict": "holds"},
            layer
            | {
                "dataset": "popqa",
                "range": "second_half",
                "layers": "second_half (9-16)",
                "verdict": "holds",
            },
            layer | {"dataset": "nq", "range": "all", "layers": "all (1-16)", "verdict": "does not hold"},
        ],
        schema=LAYERS_SCHEMA,
    )
    return check, layers


def _as_snakemake_renders(page: str) -> str:
    """workflow/report/workflow.rst rendered as `snakemake --report` renders it (snakemake.report.auto_report:
    Jinja, then docutils' html_body, with a link target per report item), the front page in its include."""
    from docutils.core import publish_parts
    from jinja2 import Environment

    text = (REPO / "workflow" / "report" / "workflow.rst").read_text()
    text = text.replace('.. include:: results/{{ snakemake.config["run"] }}/report/front_page.rst', page)
    targets = {t for kind in LINKS.values() for t in kind.values()} | {"published_vs_reproduced.html"}
    text += "\n\n" + "\n".join(f".. _{t}: javascript:app.showResultInfo('results/run/{t}')" for t in targets)

    class Snakemake:
        config = {"run": "run"}

    files = [type("FileRecord", (), {"target": t}) for t in targets]
    rst = Environment(trim_blocks=True, lstrip_blocks=True).from_string(text)
    return publish_parts(rst.render(snakemake=Snakemake, files=files), writer="html")["html_body"]


def test_front_page_shows_both_papers_and_the_verdicts_each_linked_to_its_figure():
    check, layers = _check()
    html = _as_snakemake_renders(render(_compared(), check, layers, LINKS))
    assert "System Message" not in html and "problematic" not in html, html  # no rst error, every link found
    two_pathways, depthqa, workflow = (
        html.index(f"<h1>{h}") for h in ("Two Pathways (", "DepthQA (", "The workflow")
    )
    assert two_pathways < depthqa < workflow  # the headline first, the workflow's description after it
    tables = re.findall(r"<table.*?</table>", html, re.S)
    assert len(tables) == 4  # each paper's published values, the falsification check, MIN-K% by depth
    published_pw, check_table, published_depth, mink = tables
    # met, or missed and by how much
    assert "-47.2" in published_pw and ">met<" in published_pw
    assert "missed: 20 above the range" in published_pw and "[-65, -40]" in published_pw
    assert "missed: 0.5 below the range" in published_depth and ">met<" in published_depth
    # each paper's answers in a line, above the tables
    answers = html[: html.index("<table")]
    assert "1 of 2 published values met; falsification check holds in 1, inconclusive in 1 of 2" in answers
    assert "1 of 2 published values met; MIN-K% rises with depth: does not hold in 1 of 1 models" in answers
    # the verdicts, coloured by class, with the effect, its interval and the other layer ranges
    assert '<span class="verdict-holds">holds</span>' in check_table
    assert "delta_p -12.5 [-18, -7]" in check_table and "0.0004" in check_table
    assert "inconclusive</span> (mde 9.1 &gt; SESOI 5)" in check_table
    assert "all (1-16): " in check_table and "does not hold" in check_table
    assert "SESOI) 5" in html
    assert '<span class="verdict-not">does not hold</span>' in mink
    # every row links to its figure or table through Snakemake's link to the report item
    shown_in = {
        published_pw: [f"pathways_{PAIR}.png"] * 2,
        check_table: [f"pathways_check_{PAIR}.png"] * 2,
        published_depth: ["depth_mink_boxes.png", "depth_metrics.html"],
        mink: ["depth_mink_boxes.png"],
    }
    for table, targets in shown_in.items():
        rows = re.findall(r"<tr>.*?</tr>", table.split("</thead>")[1], re.S)
        assert len(rows) == len(targets)
        for row, target in zip(rows, targets, strict=True):
            shown = re.findall(r"showResultInfo\('results/run/([^']+)'\)", row)
            assert shown == [target], row


def test_a_paper_the_run_has_no_published_value_for_says_which_config_has_them():
    compared = _compared().filter(pl.col("check") != "published value")
    check, layers = _check()
    page = render(compared, check, layers, LINKS)
    assert page.count("no published value for this run's models") == 2 * 2  # the answers, the sections
    assert "``configs/paper-pathways.yaml``" in page and "``configs/paper-depth.yaml``" in page
    depth_only = render(compared.filter(paper="DepthQA"))  # no pathways stage, no figure drawn
    assert "Two Pathways" not in depth_only and "DepthQA (" in depth_only
    assert "_>`__" not in depth_only and "     - –\n" in depth_only


def test_cells_are_text_not_markup():
    """A name that reads as reStructuredText (an enumerator, emphasis, a reference) shows as written."""
    compared = _compared().with_columns(model=pl.lit("1. m*odel_ `x`_ |s|"))
    html = _as_snakemake_renders(render(compared, links=LINKS))
    assert "System Message" not in html and "<ol" not in html
    shown = compared.filter(pl.col("kind") != "eq_vs_control")  # the E_Q rows show pathways_check.tsv
    assert html.count("<td>1. m*odel_ `x`_ |s|</td>") == shown.height


def test_workflow_description_without_the_comparison_has_no_headline():
    """A report of some targets alone, or of a run with nothing to compare, holds no
    published_vs_reproduced.html: its description includes no front page, which would not exist."""
    from docutils.core import publish_parts
    from jinja2 import Environment

    text = (REPO / "workflow" / "report" / "workflow.rst").read_text()

    class Snakemake:
        config = {"run": "run"}

    rst = (
        Environment(trim_blocks=True, lstrip_blocks=True)
        .from_string(text)
        .render(snakemake=Snakemake, files=[])
    )
    html = publish_parts(rst, writer="html")["html_body"]
    assert "include" not in rst and "The workflow" in html and "System Message" not in html
