"""The DepthQA authors' own inputs: their prompt file read without running it (on a stand-in of its shape,
never their text), pinned downloads refused on a wrong digest, their released answers judged end to end."""

import hashlib
import json
import urllib.error
from pathlib import Path

import polars as pl
import pytest
from conftest import SHARED_REAL, snakemake, write_config

from truthflow import hub
from truthflow.depth import authors
from truthflow.depth.prompts import load_answer_prompt, load_judge_prompt
from truthflow.errors import TruthflowError

RELEASED = SHARED_REAL / "depthqa" / "outputs" / "inference" / "llama3_8b_zero-shot.json"
RELEASED_SHA256 = "a1f5090c901e7f1eabbc255f56cf93e885d2a88bac88d45712a270e9648ae225"
MODEL = "llama-3-8b-instruct"

# the shape of their src/utils/prompts.py, in words of our own: parenthesised and triple-quoted constants,
# templates that open with a newline and end in a space, a literal brace, an inline rubric, and a statement
# that would stop a test that ran the file
STAND_IN = '''from typing import Tuple

raise SystemExit("this file is read, never run")

SYSTEM_PROMPT_ZERO_SHOT = (
    "Stand-in system text. Reply to {{it}}."
)

USER_PROMPT_TEMPLATE_ZERO_SHOT = """
###Question: 
{question}

###Answer: """

SYSTEM_PROMPT_CTX = "unused"

SYSTEM_PROMPT_EVAL = "Stand-in judge system text."

USER_PROMPT_TEMPLATE_EVAL = """
###Task Description:
Grade {{strictly}}.

###The instruction to evaluate:
{instruction}

###Response to evaluate:
{response}

###Reference Answer (Score 5):
{reference_answer}

###Score Rubrics:
[Is it right?]
Score 1: no.
Score 5: yes.

###Feedback: """
'''


def stand_in(tmp_path: Path, text: str = STAND_IN) -> tuple[str, str]:
    path = tmp_path / "upstream" / "prompts.py"
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(text)
    return path.as_uri(), hashlib.sha256(text.encode()).hexdigest()


def make(tmp_path: Path, url: str, sha256: str) -> tuple[Path, Path]:
    out = tmp_path / "resources" / "depthqa_authors"
    authors.make_prompt_files(url, sha256, out / "prompts.py", out / "answer.yaml", out / "judge.yaml")
    return out / "answer.yaml", out / "judge.yaml"


def test_prompt_files_fill_in_to_their_strings(tmp_path):
    url, sha256 = stand_in(tmp_path)
    answer_path, judge_path = make(tmp_path, url, sha256)
    answer, judge = load_answer_prompt(answer_path), load_judge_prompt(judge_path)
    assert answer.system == "Stand-in system text. Reply to {{it}}."  # a constant, not a template
    assert answer.user.format(question="Why?") == "\n###Question: \nWhy?\n\n###Answer: "
    assert answer.no_system_role == "fold"
    assert judge.system == "Stand-in judge system text."
    assert judge.rubric == "[Is it right?]\nScore 1: no.\nScore 5: yes."
    text = judge.user("Q {x}", "A", "R")
    assert text.startswith(
        "\n###Task Description:\nGrade {strictly}.\n\n###The instruction to evaluate:\nQ {x}\n"
    )
    assert text.endswith(
        "(Score 5):\nR\n\n###Score Rubrics:\n[Is it right?]\nScore 1: no.\nScore 5: yes.\n\n###Feedback: "
    )
    assert (tmp_path / "resources" / "depthqa_authors" / "prompts.py").read_text() == STAND_IN


def test_a_wrong_digest_is_one_line_naming_the_file_and_both_digests(tmp_path):
    url, sha256 = stand_in(tmp_path)
    with pytest.raises(TruthflowError) as err:
        make(tmp_path, url, "0" * 64)
    message = str(err.value)
    assert "\n" not in message and url in message and sha256 in message and "0" * 64 in message
    assert not (tmp_path / "resources" / "depthqa_authors" / "prompts.py").exists()


def test_a_missing_constant_or_rubric_is_named(tmp_path):
    url, sha256 = stand_in(tmp_path, STAND_IN.replace("SYSTEM_PROMPT_EVAL =", "OTHER ="))
    with pytest.raises(TruthflowError, match="no string constant SYSTEM_PROMPT_EVAL"):
        make(tmp_path, url, sha256)
    url, sha256 = stand_in(tmp_path, STAND_IN.replace("###Score Rubrics:", "###Rubrics:"))
    with pytest.raises(TruthflowError, match="USER_PROMPT_TEMPLATE_EVAL: no rubric"):
        make(tmp_path, url, sha256)


def test_an_unreachable_url_fails_at_once(tmp_path):
    with pytest.raises(TruthflowError, match=r"download of file://.* failed: URLError"):
        hub.download_pinned((tmp_path / "absent.py").as_uri(), "0" * 64, tmp_path / "x", "label")


def test_urllib_errors_are_transient_as_the_hub_clients_are(monkeypatch):
    for name in hub.OFFLINE_VARIABLES:
        monkeypatch.delenv(name, raising=False)
    unavailable = urllib.error.HTTPError("https://x", 503, "Service Unavailable", {}, None)
    missing = urllib.error.HTTPError("https://x", 404, "Not Found", {}, None)
    assert hub.is_transient(unavailable) and not hub.is_transient(missing)
    assert hub.is_transient(urllib.error.URLError(ConnectionRefusedError("refused")))
    assert not hub.is_transient(urllib.error.URLError(FileNotFoundError("no such file")))


def test_pending_prompt_files_wait_for_their_rule(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    judge = "resources/depthqa_authors/judge.yaml"
    assert authors.pending(judge) and authors.pending(f"./{judge}") and not authors.pending("prompts/x.yaml")
    (tmp_path / judge).parent.mkdir(parents=True)
    (tmp_path / judge).write_text("kind: judge\n")
    assert not authors.pending(judge)


@pytest.fixture(scope="module")
def released() -> dict:
    if not RELEASED.exists():
        pytest.skip(f"the released answers are not at {RELEASED}")
    return json.loads(RELEASED.read_text())


def first_questions(released: dict) -> list[dict]:
    """The first questions of each depth, in the file's order."""
    by_depth = {d: [r for r in released.values() if r["depth"] == d] for d in (1, 2, 3)}
    return by_depth[3][:2] + by_depth[2][:4] + by_depth[1][:5]


def test_released_answers_are_read_stripped_over_the_runs_questions(released, tmp_path):
    kept = first_questions(released)
    questions = pl.DataFrame({"id": [r["qid"] for r in kept], "depth": [r["depth"] for r in kept]})
    answers, judged = authors.released_answers(RELEASED, questions)
    assert answers["qid"].to_list() == questions["id"].to_list()
    first = kept[0]
    assert answers.row(0) == (first["qid"], first["predicted_answer"].strip(), first["depth"])
    assert judged.row(0) == (first["qid"], first["question"].strip(), first["answer"].strip())
    unknown = pl.DataFrame({"id": ["d9_q1"], "depth": [1]})
    with pytest.raises(TruthflowError, match="no answer to 1 DepthQA question.*'d9_q1'"):
        authors.released_answers(RELEASED, unknown)
    wrong = pl.DataFrame({"id": [first["qid"]], "depth": [1]})
    with pytest.raises(TruthflowError, match=f"question '{first['qid']}' has depth 3, DepthQA's 1"):
        authors.released_answers(RELEASED, wrong)


def stand_in_graph(root: Path, kept: list[dict]) -> None:
    """Two groups over the kept questions: each D3 node with two D2 predecessors, each with D1 ones."""
    d3, d2, d1 = ([r["qid"] for r in kept if r["depth"] == d] for d in (3, 2, 1))
    preds = {
        "1_d3": ["1_d2_n1", "1_d2_n2"],
        "2_d3": ["2_d2_n1", "2_d2_n2"],
        "1_d2_n1": ["1_d1_n1", "1_d1_n2"],
        "1_d2_n2": ["1_d1_n3"],
        "2_d2_n1": ["2_d1_n1"],
        "2_d2_n2": ["2_d1_n2"],
    }
    qid = {
        "1_d3": d3[0],
        "2_d3": d3[1],
        "1_d2_n1": d2[0],
        "1_d2_n2": d2[1],
        "2_d2_n1": d2[2],
        "2_d2_n2": d2[3],
    }
    qid |= {"1_d1_n1": d1[0], "1_d1_n2": d1[1], "1_d1_n3": d1[2], "2_d1_n1": d1[3], "2_d1_n2": d1[4]}
    succs = {n: [m for m, ps in preds.items() if n in ps] for n in qid}
    nodes = [
        {
            "nodeid": n,
            "group": n.split("_")[0],
            "depth": int(n.split("_")[1][1]),
            "direct_predecessors": preds.get(n, []),
            "direct_successors": succs[n],
        }
        for n in qid
    ]
    root.mkdir(parents=True)
    lines = {
        "questions": [{k: r[k] for k in ("qid", "depth", "question", "answer")} for r in kept],
        "nodes": nodes,
        "node_to_q": [{"nodeid": n, "qid": q} for n, q in qid.items()],
    }
    for name, records in lines.items():
        (root / f"{name}.jsonl").write_text("".join(json.dumps(r) + "\n" for r in records))


@pytest.mark.workflow
def test_released_answers_are_judged_end_to_end(released, tmp_path):
    """The released file read (file://, the pinned digest), judged by the reference judge, the authors'
    metrics over a stand-in graph, and the published-vs-reproduced rows: no model is loaded."""
    kept = first_questions(released)
    stand_in_graph(tmp_path / "depthqa", kept)
    cfg = {
        "run": "authors",
        "models": {MODEL: {"source": {"hub": "meta-llama/Meta-Llama-3-8B-Instruct", "gated": True}}},
        "datasets": {"depthqa": {"source": {"local": str(tmp_path / "depthqa")}}},
        "depth": {
            "released_answers": {MODEL: {"url": RELEASED.as_uri(), "sha256": RELEASED_SHA256}},
            "judge": {"backend": "reference"},
            "metrics": {"unparseable": "zero", "n_boot": 100},
        },
    }
    write_config(tmp_path, cfg)
    proc = snakemake(tmp_path, timeout=600)
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert "prepare_model" not in proc.stderr and not (tmp_path / "resources" / "models").exists()
    results = tmp_path / "results" / "authors"
    answers = pl.read_parquet(results / "depth" / MODEL / "released_answers.parquet")
    assert answers["answer"].to_list() == [r["predicted_answer"].strip() for r in kept]
    scores = pl.read_parquet(results / "depth" / MODEL / "scores.parquet")
    assert scores.height == len(kept) and scores["backend"].unique().to_list() == ["reference"]
    metrics = pl.read_parquet(results / "tables" / "depth_released_metrics.parquet")
    means = metrics.filter(metric="mean_score").sort("depth")
    assert means["n"].to_list() == [5, 4, 2]
    for depth, value in means.select("depth", "value").iter_rows():
        assert value == pytest.approx(scores.filter(depth=depth)["score"].mean())
    assert set(metrics["metric"]) == {"mean_score", "forward_discrepancy", "backward_discrepancy"}
    compared = pl.read_csv(results / "tables" / "published_vs_reproduced.tsv", separator="\t")
    rows = compared.filter(model=MODEL, check="published value").sort("published", descending=True)
    published = [4.56, 4.451, 4.363]  # workflow/report/published.tsv, mean score at depths 1, 2, 3
    assert rows["published"].head(3).to_list() == published
    assert rows["reproduced"].head(3).to_list() == pytest.approx(means["value"].to_list())
    assert (results / "report" / "depth_released_metrics.html").exists()
    inputs = pl.read_csv(results / "tables" / "inputs.tsv", separator="\t")
    assert inputs["kind"].to_list() == ["dataset", "released answers"]
    assert f"llama3_8b_zero-shot.json {RELEASED_SHA256}" == inputs["sha256"][1]
    assert inputs["files"][0] == 3  # the stand-in questions, nodes and node_to_q, each with its sha256
