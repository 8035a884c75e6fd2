import polars as pl

from truthflow.report_tables import fmt, to_html


def test_numbers_are_rounded_for_reading():
    assert fmt(12.569444444444443) == "12.6"
    assert fmt(-0.13000000001) == "-0.13"
    assert fmt(0.0056123) == "0.00561"
    assert fmt(1234.5678) == "1,234.6"
    assert fmt(None) == "–" and fmt(float("nan")) == "–"
    assert fmt(7) == "7" and fmt(True) == "yes" and fmt(0.0) == "0"


def test_html_table_has_no_literal_quotes_and_marks_verdicts():
    table = pl.DataFrame(
        {
            "check": ["E_Q knockout beats random control", "published value"],
            "published_range": [None, "[-60, -40]"],
            "reproduced": [10.123456789, -45.0],
            "verdict": ["does not hold", "within range"],
        }
    )
    page = to_html(table, "Published vs reproduced", "caption <b>escaped</b>")
    assert '""' not in page and "10.1<" in page and "10.123" not in page
    assert '<td class="not">does not hold</td>' in page and '<td class="holds">within range</td>' in page
    assert "&lt;b&gt;" in page and "<td>–</td>" in page


def test_every_report_table_has_a_one_line_caption():
    from conftest import REPO

    from truthflow.report_tables import TABLES, caption

    for name, (_, rst) in TABLES.items():
        text = caption(REPO / "workflow" / "report" / rst)
        assert text and "\n" not in text and "``" not in text, name
