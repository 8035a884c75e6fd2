"""Hostile data: broken, empty or inconsistent dataset files fail with one line naming the file, line, key
or node (before any job where the check can be made at parse time); what can be repaired (repeated ids,
rows without a gold answer, n larger than the file) is repaired and counted in the dropped table.

The parse-time refusals are tested in-process through truthflow.preflight.prepare_config (the Snakefile's own
checks); one real dry run per family (`workflow` mark) proves the message reaches the user as one line."""

from __future__ import annotations

import copy
import json
import shutil

import polars as pl
import pytest
import tenacity
from conftest import REPO, small_config, snakemake, write_config

from truthflow import data, hub
from truthflow.data import load_depthqa, load_qa, question_id, read_local_records
from truthflow.errors import TruthflowError
from truthflow.preflight import prepare_config

DEMO = REPO / "data" / "demo"


def local(path, n=None, seed=0, **extra):
    return {"source": {"local": str(path), **extra}, "n": n, "seed": seed}


def _failed_once(workdir, proc, *needles):
    """Nonzero exit, every needle in the output, no traceback, and the error printed by one attempt only."""
    out = proc.stdout + proc.stderr
    assert proc.returncode != 0, out[-2000:]
    for needle in needles:
        assert needle in out, out[-3000:]
    assert "Traceback" not in out, out[-3000:]
    return out


def _refusal(cfg) -> str:
    """The one-line refusal of prepare_config, the workflow's parse-time checks."""
    with pytest.raises(TruthflowError) as err:
        prepare_config(cfg, [], {})
    assert "\n" not in str(err.value)
    return str(err.value)


def _refused_by_dry_run(workdir, cfg, message):
    """A real dry run of `cfg` prints `invalid config: <message>` as a line, no traceback, writes nothing."""
    write_config(workdir, cfg)
    proc = snakemake(workdir, "-n", timeout=120)
    out = _failed_once(workdir, proc)
    assert f"invalid config: {message}" in out.splitlines(), out[-3000:]
    assert not (workdir / "results").exists()


# ------------------------------------------------------------ TSV quoting (issue 12 #1)
def _popqa_with_stray_tab(tmp_path):
    lines = (DEMO / "popqa" / "popqa.tsv").read_text(encoding="utf-8").splitlines(keepends=True)
    fields = lines[3].split("\t")
    header = lines[0].rstrip("\n").split("\t")
    q = header.index("question")
    fields[q] = fields[q].replace(" ", "\t", 1)  # "What<TAB>is the capital of Italy?", unquoted
    lines[3] = "\t".join(fields)
    path = tmp_path / "popqa.tsv"
    path.write_text("".join(lines), encoding="utf-8")
    return path


@pytest.mark.workflow
def test_stray_tab_in_tsv_field_fails_naming_file_and_line(tmp_path):
    bad = _popqa_with_stray_tab(tmp_path)
    cfg = small_config()
    cfg["datasets"]["popqa"]["source"]["local"] = str(bad)
    write_config(tmp_path, cfg)
    proc = snakemake(tmp_path, "results/demo/data/popqa.parquet", timeout=300)
    out = _failed_once(tmp_path, proc, f"{bad} line 4: 18 fields, but the header has 17")
    assert out.count("18 fields, but the header has 17") <= 2  # terminal + its echo of the log, no retry
    assert not (tmp_path / "results" / "demo" / "data" / "popqa.parquet").exists()


def test_quoted_tab_and_quotes_in_tsv_are_one_field(tmp_path):
    path = tmp_path / "q.tsv"
    path.write_text(
        'id\tquestion\tpossible_answers\n1\t"What\tis ""this""?"\t"[""a\tb""]"\n', encoding="utf-8"
    )
    recs = read_local_records(path)
    assert recs == [{"id": "1", "question": 'What\tis "this"?', "possible_answers": '["a\tb"]'}]


@pytest.mark.parametrize(
    "text,line,what",
    [
        ("id\tquestion\tpossible_answers\n1\tq one\t[]\n2\tq two\n", 3, "2 fields, but the header has 3"),
        ('id\tquestion\tpossible_answers\n1\t"q one" x\t[]\n', 2, "malformed tab-separated row"),
    ],
)
def test_short_or_malformed_tsv_row_names_line(tmp_path, text, line, what):
    path = tmp_path / "bad.tsv"
    path.write_text(text, encoding="utf-8")
    with pytest.raises(TruthflowError, match=rf"bad\.tsv line {line}: {what}"):
        load_qa("popqa", local(path))


def test_broken_jsonl_line_names_line(tmp_path):
    path = tmp_path / "nq.jsonl"
    path.write_text('{"question": "a", "answer": ["b"]}\n{"question": \n', encoding="utf-8")
    with pytest.raises(TruthflowError, match=r"dataset 'nq': .*nq\.jsonl line 2: not valid JSON"):
        load_qa("nq", local(path))


# ------------------------------------------------------------ missing / empty local files (issue 12 #7)
def _with_local_file(tmp_path, dataset, content):
    path = tmp_path / f"{dataset}.{'tsv' if dataset == 'popqa' else 'jsonl'}"
    if content is not None:
        path.write_text(content)
    cfg = small_config()
    cfg["datasets"][dataset] = {"source": {"local": str(path)}, "n": 5, "seed": 0}
    return cfg, path


@pytest.mark.parametrize(
    "dataset,content,message",
    [
        ("nq", None, "does not exist"),
        ("nq", "", "is empty"),
        ("popqa", "\n \n", "is empty"),
        ("hotpotqa", "", "is empty"),
    ],
)
def test_missing_or_empty_local_file_fails_before_any_job(tmp_path, dataset, content, message):
    cfg, path = _with_local_file(tmp_path, dataset, content)
    key = f"dataset '{dataset}' (config key 'datasets.{dataset}.source.local')"
    assert _refusal(cfg) == f"{key}: '{path}' {message}"


@pytest.mark.workflow
def test_missing_local_file_stops_a_dry_run(tmp_path):
    """The local-file family in a real dry run."""
    cfg, path = _with_local_file(tmp_path, "nq", None)
    message = _refusal(copy.deepcopy(cfg))
    assert message.endswith(f"'{path}' does not exist")
    _refused_by_dry_run(tmp_path, cfg, message)


def test_empty_parquet_file_is_one_error(tmp_path):
    path = tmp_path / "nq.parquet"
    path.write_bytes(b"not parquet at all")
    with pytest.raises(TruthflowError, match=r"dataset 'nq': .*nq\.parquet': not a readable parquet file"):
        load_qa("nq", local(path))


# ------------------------------------------------------------ DepthQA graph (issue 12 #7)
def _depthqa_copy(tmp_path):
    d = tmp_path / "depthqa"
    shutil.copytree(DEMO / "depthqa", d)
    return d


def _rewrite_jsonl(path, edit):
    recs = [json.loads(line) for line in path.read_text().splitlines() if line.strip()]
    recs = edit(recs)
    path.write_text("".join(json.dumps(r) + "\n" for r in recs))


def _unknown_node_in_node_to_q(d):
    with (d / "node_to_q.jsonl").open("a") as fh:
        fh.write(json.dumps({"nodeid": "99_d3", "qid": "d3_q1"}) + "\n")
    return f"{d / 'node_to_q.jsonl'}: maps node '99_d3', which is not in {d / 'nodes.jsonl'}"


def _unknown_link(index, field, node, kind, missing):
    def damage(d):
        _rewrite_jsonl(
            d / "nodes.jsonl",
            lambda recs: [
                *recs[:index],
                {**recs[index], field: [*recs[index][field], missing]},
                *recs[index + 1 :],
            ],
        )
        return f"{d / 'nodes.jsonl'}: node '{node}' names {kind} '{missing}', which is not a node"

    return damage


_unknown_predecessor = _unknown_link(0, "direct_predecessors", "1_d3", "predecessor", "1_d2_n9")
_unknown_successor = _unknown_link(1, "direct_successors", "1_d2_n1", "successor", "1_d3_n9")


def _unknown_question(d):
    _rewrite_jsonl(d / "node_to_q.jsonl", lambda recs: [{**recs[0], "qid": "d3_q999"}, *recs[1:]])
    return f"node '1_d3' maps to question 'd3_q999', which is not in {d / 'questions.jsonl'}"


def _node_without_question(d):
    _rewrite_jsonl(d / "node_to_q.jsonl", lambda recs: recs[1:])
    return f"{d / 'nodes.jsonl'}: node '1_d3' has no question in {d / 'node_to_q.jsonl'}"


def _depthqa_config(d) -> dict:
    cfg = small_config()
    cfg["datasets"]["depthqa"]["source"]["local"] = str(d)
    return cfg


def _two_d3_nodes_in_a_group(d):
    with (d / "nodes.jsonl").open("a") as fh:
        fh.write(json.dumps({"nodeid": "1_d3_b", "group": "1", "depth": 3, "direct_predecessors": []}) + "\n")
    with (d / "node_to_q.jsonl").open("a") as fh:
        fh.write(json.dumps({"nodeid": "1_d3_b", "qid": "d3_q2"}) + "\n")
    return f"{d / 'nodes.jsonl'}: group '1' has two D3 nodes, '1_d3' and '1_d3_b'"


def _depth_disagrees_with_the_question(d):
    _rewrite_jsonl(d / "node_to_q.jsonl", lambda recs: [{**recs[0], "qid": "d2_q1"}, *recs[1:]])
    return f"{d / 'nodes.jsonl'}: node '1_d3' has depth 3 but its question 'd2_q1' has 2"


@pytest.mark.parametrize(
    "breaks",
    [
        _unknown_node_in_node_to_q,
        _unknown_predecessor,
        _unknown_successor,
        _unknown_question,
        _node_without_question,
        _two_d3_nodes_in_a_group,
        _depth_disagrees_with_the_question,
    ],
)
def test_broken_depthqa_graph_fails_at_parse_time(tmp_path, breaks):
    """One check (data.depthqa_nodes, as load_depthqa builds the nodes table), one line naming file and node:
    the workflow refuses a local graph before any job, and the loader refuses it (hub sources)."""
    d = _depthqa_copy(tmp_path)
    message = breaks(d)
    refusal = _refusal(_depthqa_config(d))
    assert refusal.startswith(
        "dataset 'depthqa' (config key 'datasets.depthqa.source.local'): DepthQA graph: "
    )
    assert message in refusal, refusal
    with pytest.raises(TruthflowError, match="DepthQA graph"):
        load_depthqa(local(d))


@pytest.mark.workflow
def test_broken_depthqa_graph_stops_a_dry_run(tmp_path):
    """The DepthQA-graph family in a real dry run."""
    d = _depthqa_copy(tmp_path)
    message = _unknown_predecessor(d)
    cfg = _depthqa_config(d)
    refusal = _refusal(copy.deepcopy(cfg))
    assert message in refusal
    _refused_by_dry_run(tmp_path, cfg, refusal)


# ------------------------------------------------------------ repeats, no gold, n too large (issue 12 #5)
def _nq_with_problems(tmp_path):
    recs = [json.loads(line) for line in (DEMO / "nq" / "NQ-open.dev.jsonl").read_text().splitlines()]
    recs = recs[:20]
    recs += [recs[3], {**recs[5], "question": "  " + recs[5]["question"].upper()}]  # 2 repeats
    recs += [{"question": "who has no answer", "answer": []}, {"question": "nor me", "answer": [" "]}]
    path = tmp_path / "nq.jsonl"
    path.write_text("".join(json.dumps(r) + "\n" for r in recs))
    return path, recs


@pytest.mark.workflow
def test_dropped_table_counts_repeats_missing_gold_and_short_file(tmp_path):
    path, recs = _nq_with_problems(tmp_path)
    cfg = small_config()
    cfg["datasets"]["nq"] = local(path, n=50)
    write_config(tmp_path, cfg)
    proc = snakemake(tmp_path, "results/demo/data/nq.parquet", timeout=300)
    assert proc.returncode == 0, proc.stderr[-3000:]
    out_dir = tmp_path / "results" / "demo" / "data"
    df = pl.read_parquet(out_dir / "nq.parquet")
    assert df.height == 20 and df["id"].n_unique() == 20
    dropped = pl.read_parquet(out_dir / "nq.dropped.parquet")
    assert dropped.columns == ["dataset", "id", "reason", "detail"]
    counts = dict(dropped.group_by("reason").len().iter_rows())
    assert counts == {"duplicate_id": 2, "no_gold_answer": 2, "n_exceeds_rows": 1}
    assert set(dropped["dataset"]) == {"nq"}
    assert dropped.filter(pl.col("reason") == "duplicate_id")["id"].to_list() == [
        question_id("nq", recs[3]["question"]),
        question_id("nq", recs[5]["question"]),
    ]
    detail = dropped.filter(pl.col("reason") == "n_exceeds_rows")["detail"].item()
    assert "n=50" in detail and "only 20 usable rows" in detail
    log = (tmp_path / "results" / "demo" / "logs" / "download_dataset" / "nq.log").read_text()
    assert "n=50 requested but only 20 usable rows" in log


def test_depthqa_repeats_and_short_n_are_counted(tmp_path):
    d = _depthqa_copy(tmp_path)
    _rewrite_jsonl(d / "questions.jsonl", lambda recs: [*recs, recs[0]])
    questions, nodes, report = load_depthqa(local(d, n=50))
    assert questions["id"].n_unique() == questions.height == 104
    dropped = report["dropped"]
    assert dict(dropped.group_by("reason").len().iter_rows()) == {"duplicate_id": 1, "n_exceeds_rows": 1}
    assert "n=50 requested but only 10 usable groups" in dropped["detail"].drop_nulls().item()


# ------------------------------------------------------------ stable ids (issue 10 #7)
@pytest.mark.parametrize(
    "name,path",
    [
        ("popqa", "popqa/popqa.tsv"),
        ("triviaqa", "triviaqa/validation.jsonl"),
        ("hotpotqa", "hotpotqa/hotpot_dev_distractor_v1.json"),
        ("nq", "nq/NQ-open.dev.jsonl"),
    ],
)
def test_ids_do_not_depend_on_n_or_seed(name, path):
    small, _ = load_qa(name, local(DEMO / path, n=10, seed=0))
    large, _ = load_qa(name, local(DEMO / path, n=50, seed=7))
    full, _ = load_qa(name, local(DEMO / path))
    id_of = dict(zip(full["question"], full["id"], strict=True))
    for df in (small, large):
        assert all(id_of[q] == i for q, i in zip(df["question"], df["id"], strict=True))
    both = set(small["question"]) & set(large["question"])
    assert both, "the two samples share no question; pick other seeds"
    if name == "nq":  # no id in the source: a hash of the question text
        assert full["id"][0] == question_id("nq", full["question"][0])
        assert question_id("nq", " Who WROTE  it ") == question_id("nq", "who wrote it")


def test_source_ids_are_kept(tmp_path):
    df, _ = load_qa("triviaqa", local(DEMO / "triviaqa/validation.jsonl"))
    assert df["id"][0] == "tc_1"
    df, _ = load_qa("hotpotqa", local(DEMO / "hotpotqa/hotpot_dev_distractor_v1.json"))
    assert df["id"][0] == "544b2b1ad2e7951f0e08a203"
    df, _ = load_qa("popqa", local(DEMO / "popqa/popqa.tsv"))
    assert df["id"][0] == "4000005"


# ------------------------------------------------------------ hub: only transient errors retried (#8)
class _Response:
    def __init__(self, status):
        self.status_code = status


class _HTTPError(OSError):
    def __init__(self, status):
        super().__init__(f"{status} Server Error")
        self.response = _Response(status)


class _Dataset:
    def to_list(self):
        return [{"question": "who wrote hamlet", "answer": ["Shakespeare"]}]


@pytest.fixture
def fake_hub(monkeypatch):
    import datasets

    monkeypatch.delenv("HF_HUB_OFFLINE", raising=False)
    monkeypatch.delenv("HF_DATASETS_OFFLINE", raising=False)
    monkeypatch.setattr(hub, "HUB_WAIT", tenacity.wait_none())
    calls = []

    def install(*errors):
        def load_dataset(*args, **kwargs):
            calls.append(args)
            if len(calls) <= len(errors):
                raise errors[len(calls) - 1]
            return _Dataset()

        monkeypatch.setattr(datasets, "load_dataset", load_dataset)
        return calls

    return install


HUB = {"source": {"hub": "someone/nq", "split": "validation"}, "n": None, "seed": 0}


@pytest.mark.parametrize(
    "error",
    [ConnectionError("reset by peer"), TimeoutError("read timed out"), _HTTPError(503), _HTTPError(429)],
)
def test_transient_hub_errors_are_retried(fake_hub, error):
    calls = fake_hub(error, error)
    df, _ = load_qa("nq", HUB)
    assert len(calls) == 3 and df.height == 1


@pytest.mark.parametrize(
    "error",
    [ValueError("Unknown split 'validaton'"), _HTTPError(404), KeyError("answer"), FileNotFoundError("x")],
)
def test_deterministic_hub_errors_fail_at_once(fake_hub, error):
    calls = fake_hub(error, error)
    with pytest.raises(TruthflowError, match=r"dataset 'nq': hub load of 'someone/nq' .* failed: "):
        load_qa("nq", HUB)
    assert len(calls) == 1


def test_transient_errors_give_up_after_the_attempts(fake_hub):
    calls = fake_hub(*[ConnectionError("down")] * 10)
    with pytest.raises(TruthflowError, match=rf"failed {data.HUB_ATTEMPTS} times \(transient\)"):
        load_qa("nq", HUB)
    assert len(calls) == data.HUB_ATTEMPTS


@pytest.mark.workflow
def test_hub_failure_in_workflow_is_reported_once(tmp_path):
    """Offline, an uncached hub id fails for good: one attempt, one message, no Snakemake restarts."""
    cfg = small_config()
    cfg["datasets"]["nq"] = {"source": {"hub": "truthflow-tests/no-such-set", "split": "validation"}}
    write_config(tmp_path, cfg)
    proc = snakemake(tmp_path, "results/demo/data/nq.parquet", timeout=300)
    out = _failed_once(tmp_path, proc, "dataset 'nq': hub load of 'truthflow-tests/no-such-set'")
    assert "Trying to restart" not in out
    log = (tmp_path / "results" / "demo" / "logs" / "download_dataset" / "nq.log").read_text()
    assert log.count("hub load of") == 1 and "retrying" not in log
