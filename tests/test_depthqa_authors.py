"""The DepthQA authors' own inputs: their prompt file read without running it (on a stand-in of its shape,
never their text), pinned downloads refused on a wrong digest, the judge's messages equal to theirs, and a
released answers file of their shape judged end to end, every metric against a value computed by hand."""

import hashlib
import json
import urllib.error
from pathlib import Path

import polars as pl
import pytest
import yaml
from conftest import REPO, SHARED_REAL, snakemake, write_config
from test_judge import KEY_ENV, endpoint, key, openai_cfg  # noqa: F401 - fixtures

from truthflow import hub
from truthflow.data import load_depthqa
from truthflow.depth import authors
from truthflow.depth.judge import judge_all
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


def test_released_answers_are_read_as_is_over_the_runs_questions(released):
    """The real file's fields and texts as written (the judge strips them, as theirs does), its depths
    checked."""
    kept = first_questions(released)
    questions = pl.DataFrame({"id": [r["qid"] for r in kept], "depth": [r["depth"] for r in kept]})
    answers, judged = authors.released_answers(RELEASED, questions)
    assert answers["qid"].to_list() == questions["id"].to_list()
    first = kept[0]
    assert answers.row(0) == (first["qid"], first["predicted_answer"], first["depth"])
    assert judged.row(0) == (first["qid"], first["question"], first["answer"])
    unknown = pl.DataFrame({"id": ["d9_q1"], "depth": [1]})
    with pytest.raises(TruthflowError, match="no answer to 1 DepthQA question.*'d9_q1'"):
        authors.released_answers(RELEASED, unknown)
    wrong = pl.DataFrame({"id": [first["qid"]], "depth": [1]})
    with pytest.raises(TruthflowError, match=f"question '{first['qid']}' has depth 3, DepthQA's 1"):
        authors.released_answers(RELEASED, wrong)


# ---------------------------------------------------------------- the judge's messages, as theirs

# USER_PROMPT_TEMPLATE_EVAL of STAND_IN as Python reads it, written out by hand
THEIR_TEMPLATE = (
    "\n###Task Description:\nGrade {{strictly}}.\n\n###The instruction to evaluate:\n{instruction}\n\n"
    "###Response to evaluate:\n{response}\n\n###Reference Answer (Score 5):\n{reference_answer}\n\n"
    "###Score Rubrics:\n[Is it right?]\nScore 1: no.\nScore 5: yes.\n\n###Feedback: "
)


def test_a_reference_ending_in_a_newline_reaches_the_judge_as_theirs(endpoint, key, tmp_path):  # noqa: F811
    """A model's own answers: the reference as data.load_depthqa reads it (11 of DepthQA's end in a newline)
    is stripped before the judge prompt, as their batch_eval_openai.prepare_inputs strips instruction,
    reference and response."""
    url, sha256 = stand_in(tmp_path)
    _, judge_path = make(tmp_path, url, sha256)
    record = {"qid": "d2_q15", "depth": 2, "question": "Why do sacs stack?", "answer": "To pack membrane.\n"}
    (tmp_path / "depthqa").mkdir()
    (tmp_path / "depthqa" / "questions.jsonl").write_text(json.dumps(record) + "\n")
    questions, _, _ = load_depthqa({"source": {"local": str(tmp_path / "depthqa")}})
    assert questions["reference_answer"].to_list() == ["To pack membrane.\n"]  # read as written
    # the row judge_answers makes: the model's answer joined to the question and its reference
    reference = questions.select(
        pl.col("id").alias("qid"), "question", pl.col("reference_answer").alias("reference")
    )
    row = reference.to_dicts()[0] | {"answer": "More membrane in less space."}  # generated: stripped
    endpoint.replies = [(200, "Feedback: Right. [RESULT] 5")]
    cfg = openai_cfg(endpoint.base_url, prompt=str(judge_path), parser="authors")
    judge_all([row], cfg, tmp_path / "cache.jsonl", progress=False)
    # theirs: SYSTEM_PROMPT_EVAL, then the template filled with the three texts stripped (format_messages)
    user = THEIR_TEMPLATE.format(
        instruction=record["question"].strip(),
        response=row["answer"].strip(),
        reference_answer=record["answer"].strip(),
    )
    theirs = [{"role": "system", "content": "Stand-in judge system text."}, {"role": "user", "content": user}]
    [request] = endpoint.requests
    assert request["body"]["messages"] == theirs


# ---------------------------------------------------------------- released answers, end to end

# a stand-in graph: node -> (its question, its direct predecessors), in the node_to_q file's order; two
# groups, each node its own question. 1_d1_n2 has two successors: 1_d2_n1 comes first in node_to_q, though
# the nodes file (NODES_FILE_ORDER) and 1_d1_n2's own successor list name 1_d2_n2 first
STAND_IN_GRAPH = {
    "1_d3": ("d3_q1", ["1_d2_n1", "1_d2_n2"]),
    "1_d2_n1": ("d2_q1", ["1_d1_n1", "1_d1_n2"]),
    "1_d2_n2": ("d2_q2", ["1_d1_n2", "1_d1_n3"]),
    "1_d1_n1": ("d1_q1", []),
    "1_d1_n2": ("d1_q2", []),
    "1_d1_n3": ("d1_q3", []),
    "2_d3": ("d3_q2", ["2_d2_n1"]),
    "2_d2_n1": ("d2_q3", ["2_d1_n1"]),
    "2_d1_n1": ("d1_q4", []),
}
NODES_FILE_ORDER = [
    "1_d3",
    "1_d2_n2",
    "1_d2_n1",
    "1_d1_n1",
    "1_d1_n2",
    "1_d1_n3",
    "2_d3",
    "2_d2_n1",
    "2_d1_n1",
]
# the stand-in judge's score of each question's answer; None: a reply with no score in it, which their
# parser cannot read and `unparseable: zero` scores 0
VERDICTS = {
    "d3_q1": None,
    "d3_q2": 5,
    "d2_q1": 4,
    "d2_q2": 3,
    "d2_q3": 5,
    "d1_q1": 5,
    "d1_q2": 3,
    "d1_q3": 5,
    "d1_q4": 5,
}
# the nine metrics by hand, (n, value), scores as above (d3_q1 = 0):
# mean score: depth 1 (5 + 3 + 5 + 5) / 4 = 4.5; depth 2 (4 + 3 + 5) / 3 = 4.0; depth 3 (0 + 5) / 2 = 2.5
# forward 1-2, over the depth-2 nodes whose predecessors' mean p >= 4, max(0, (p - own) / 4):
#   1_d2_n1 p = (5 + 3) / 2 = 4, (4 - 4) / 4 = 0; 1_d2_n2 p = (3 + 5) / 2 = 4, (4 - 3) / 4 = 0.25;
#   2_d2_n1 p = 5, (5 - 5) / 4 = 0: 0.25 / 3
# forward 2-3: 1_d3 p = (4 + 3) / 2 = 3.5 < 4, not counted; 2_d3 p = 5, (5 - 5) / 4 = 0: 0 over 1
# forward overall: the four counted nodes, 0.25 / 4
# backward 1-2, over the depth-1 nodes whose first depth-2 successor scores f >= 4, max(0, (f - own) / 4):
#   1_d1_n1 -> 1_d2_n1 = 4, (4 - 5) / 4 -> 0; 1_d1_n2 -> 1_d2_n1 = 4 (first in node_to_q; 1_d2_n2 = 3 would
#   not count), (4 - 3) / 4 = 0.25; 1_d1_n3 -> 1_d2_n2 = 3 < 4, not counted; 2_d1_n1 -> 2_d2_n1 = 5, 0:
#   0.25 / 3
# backward 2-3: 1_d2_n1 and 1_d2_n2 -> 1_d3 = 0 < 4, not counted; 2_d2_n1 -> 2_d3 = 5, (5 - 5) / 4 = 0: 0 / 1
# backward overall: the four counted nodes, 0.25 / 4
BY_HAND = {
    ("mean_score", "depth 1"): (4, 4.5),
    ("mean_score", "depth 2"): (3, 4.0),
    ("mean_score", "depth 3"): (2, 2.5),
    ("forward_discrepancy", "1-2"): (3, 0.25 / 3),
    ("forward_discrepancy", "2-3"): (1, 0.0),
    ("forward_discrepancy", "overall"): (4, 0.0625),
    ("backward_discrepancy", "1-2"): (3, 0.25 / 3),
    ("backward_discrepancy", "2-3"): (1, 0.0),
    ("backward_discrepancy", "overall"): (4, 0.0625),
}
# workflow/report/published.tsv's value and range of each, and this run's verdict: within the range, or
# outside it by the distance to its nearest bound
PUBLISHED = {
    ("mean_score", "depth 1"): (4.56, "[4.36, 4.76]", 0.0),  # 4.5
    ("mean_score", "depth 2"): (4.451, "[4.251, 4.651]", 4.0 - 4.251),
    ("mean_score", "depth 3"): (4.363, "[4.163, 4.563]", 2.5 - 4.163),
    ("forward_discrepancy", "1-2"): (0.085, "[0.045, 0.125]", 0.0),  # 0.0833
    ("forward_discrepancy", "2-3"): (0.0947, "[0.0547, 0.1347]", 0.0 - 0.0547),
    ("forward_discrepancy", "overall"): (0.0868, "[0.0468, 0.1268]", 0.0),  # 0.0625
    ("backward_discrepancy", "1-2"): (0.0663, "[0.0263, 0.1063]", 0.0),  # 0.0833
    ("backward_discrepancy", "2-3"): (0.0886, "[0.0486, 0.1286]", 0.0 - 0.0486),
    ("backward_discrepancy", "overall"): (0.0711, "[0.0311, 0.1111]", 0.0),  # 0.0625
}


def stand_in_release(root: Path) -> tuple[Path, dict]:
    """The stand-in graph's files under root/depthqa, and a released answers file of their shape (keyed by
    qid: qid, depth, question, answer = the reference, predicted_answer), with one reference ending in a
    newline and one answer opening with a space, as some of theirs do."""

    def depth(node: str) -> int:
        return int(node.split("_")[1][1])

    def successors(node: str) -> list[str]:
        listed = [m for m, (_, preds) in STAND_IN_GRAPH.items() if node in preds]
        return listed[::-1] if node == "1_d1_n2" else listed

    qids = {q: depth(n) for n, (q, _) in STAND_IN_GRAPH.items()}
    records = {
        q: {
            "qid": q,
            "depth": d,
            "question": f"What is {q}?",
            "answer": f"The answer to {q}.",
            "predicted_answer": f"It is {q}.",
        }
        for q, d in qids.items()
    }
    records["d2_q1"]["answer"] += "\n"
    records["d1_q1"]["predicted_answer"] = " " + records["d1_q1"]["predicted_answer"]
    files = {
        "questions": [{k: r[k] for k in ("qid", "depth", "question", "answer")} for r in records.values()],
        "nodes": [
            {
                "nodeid": n,
                "group": n[0],
                "depth": depth(n),
                "direct_predecessors": STAND_IN_GRAPH[n][1],
                "direct_successors": successors(n),
            }
            for n in NODES_FILE_ORDER
        ],
        "node_to_q": [{"nodeid": n, "qid": q} for n, (q, _) in STAND_IN_GRAPH.items()],
    }
    (root / "depthqa").mkdir(parents=True)
    for name, rows in files.items():
        (root / "depthqa" / f"{name}.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    path = root / "released" / "llama3_8b_zero-shot.json"
    path.parent.mkdir()
    path.write_text(json.dumps(records, indent=4))
    return path, records


@pytest.mark.workflow
def test_released_answers_are_judged_end_to_end(endpoint, key, tmp_path):  # noqa: F811
    """configs/authors-answers.yaml on stand-ins: a released file of their shape (file://, its sha256) over a
    stand-in graph, judged by a stand-in endpoint whose scores reach the >= 4 gate, their parser and
    `unparseable: zero`; every one of the nine metrics and the published-vs-reproduced rows against values
    computed by hand. No model is loaded, nothing is downloaded."""
    released, records = stand_in_release(tmp_path)
    sha256 = hashlib.sha256(released.read_bytes()).hexdigest()
    prompts = []

    def verdict(body: dict) -> str:
        user = body["messages"][-1]["content"]
        prompts.append(user)
        [qid] = [q for q in VERDICTS if f"What is {q}?" in user]
        return (
            "I cannot grade this." if VERDICTS[qid] is None else f"Feedback: Fine. [RESULT] {VERDICTS[qid]}"
        )

    endpoint.reply = verdict
    cfg = yaml.safe_load((REPO / "configs" / "authors-answers.yaml").read_text())
    cfg["datasets"]["depthqa"]["source"] = {"local": str(tmp_path / "depthqa")}
    cfg["depth"]["released_answers"][MODEL] = {"url": released.as_uri(), "sha256": sha256}
    # their judge settings, at the stand-in endpoint; truthflow's shipped judge prompt (theirs is downloaded)
    cfg["depth"]["judge"] |= {
        "base_url": endpoint.base_url,
        "api_key_env": KEY_ENV,
        "prompt": "prompts/depthqa_judge.yaml",
    }
    cfg["depth"]["metrics"] |= {"n_boot": 100}
    write_config(tmp_path, cfg)
    proc = snakemake(tmp_path, timeout=600)
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert "prepare_model" not in proc.stderr and not (tmp_path / "resources" / "models").exists()
    # one request per answer, each with the texts stripped (their prepare_inputs)
    judge_prompt = load_judge_prompt(REPO / "prompts" / "depthqa_judge.yaml")
    expected = [
        judge_prompt.user(r["question"], r["predicted_answer"].strip(), r["answer"].strip())
        for r in records.values()
    ]
    assert sorted(prompts) == sorted(expected)
    results = tmp_path / "results" / cfg["run"]
    metrics = pl.read_parquet(results / "tables" / "depth_released_metrics.parquet")
    got = {(r["metric"], r["scope"]): (r["n"], r["value"]) for r in metrics.iter_rows(named=True)}
    assert got.keys() == BY_HAND.keys()
    for row, (n, value) in BY_HAND.items():
        assert got[row] == (n, pytest.approx(value, abs=1e-12)), row
    assert metrics.filter(scope="depth 3")["n_unparseable"].to_list() == [1]
    compared = pl.read_csv(results / "tables" / "published_vs_reproduced.tsv", separator="\t")
    compared = compared.filter(model=MODEL, check="published value")
    assert compared.height == len(PUBLISHED)
    for (metric, scope), (published, rng, off) in PUBLISHED.items():
        [row] = compared.filter(
            pl.col("detail").str.starts_with(f"{metric.replace('_', ' ')}, {scope},")
        ).to_dicts()
        reproduced = BY_HAND[(metric, scope)][1]
        assert (row["published"], row["published_range"]) == (published, rng)
        assert row["reproduced"] == pytest.approx(reproduced, abs=1e-12)
        low, high = (float(x) for x in rng.strip("[]").split(", "))
        assert min(reproduced - low, 0) + max(reproduced - high, 0) == pytest.approx(off, abs=1e-12)
        assert row["off_range"] == pytest.approx(off, abs=1e-12)  # the table's own "by how much"
        assert row["verdict"] == ("within range" if off == 0 else "outside range"), (metric, scope)
    assert (results / "report" / "depth_released_metrics.html").exists()
    inputs = pl.read_csv(results / "tables" / "inputs.tsv", separator="\t")
    assert inputs["kind"].to_list() == ["dataset", "released answers"]
    assert f"llama3_8b_zero-shot.json {sha256}" == inputs["sha256"][1]
    assert inputs["files"][0] == 3  # the stand-in questions, nodes and node_to_q, each with its sha256
