"""Dataset loading: hub (datasets.load_dataset) or local files in each set's published layout,
normalized to one schema (id, dataset, question, answers) plus the set's own useful fields."""

from __future__ import annotations

import csv
import json
import random
import time
from pathlib import Path

import polars as pl

from .errors import TruthflowError

QA_DATASETS = ("popqa", "triviaqa", "hotpotqa", "nq")
ALL_DATASETS = (*QA_DATASETS, "depthqa")
DEPTHQA_CONFIGS = ("questions", "nodes", "node_to_q")


# ---------------------------------------------------------------- raw records
def _read_json_records(path: Path, field: str | None) -> list[dict]:
    text = path.read_text(encoding="utf-8")
    try:
        obj = json.loads(text)
    except json.JSONDecodeError:
        # some published ".json" files are JSON Lines (HotpotQA's AMOR copy)
        return [json.loads(line) for line in text.splitlines() if line.strip()]
    if isinstance(obj, dict):
        if field:
            if field not in obj:
                raise TruthflowError(f"{path}: has no top-level field '{field}' (it has {sorted(obj)[:10]})")
            obj = obj[field]
        elif "Data" in obj and isinstance(obj["Data"], list):  # TriviaQA's original layout
            obj = obj["Data"]
        elif obj and all(isinstance(v, dict) for v in obj.values()):  # dict keyed by id
            obj = [{"_key": k, **v} for k, v in obj.items()]
        elif "data" in obj and isinstance(obj["data"], list):
            obj = obj["data"]
    if not isinstance(obj, list):
        raise TruthflowError(f"{path}: expected a JSON list of records (set `field:` for nested lists)")
    return obj


def read_local_records(path: str | Path, fmt: str = "auto", field: str | None = None) -> list[dict]:
    path = Path(path)
    if not path.exists():
        raise TruthflowError(f"local file '{path}' does not exist")
    if fmt == "auto":
        fmt = {".jsonl": "jsonl", ".json": "json", ".tsv": "tsv", ".csv": "csv", ".parquet": "parquet"}.get(
            path.suffix.lower(), ""
        )
        if not fmt:
            raise TruthflowError(f"'{path}': cannot tell the format from the suffix; set `format:`")
    if fmt == "jsonl":
        with path.open(encoding="utf-8") as fh:
            return [json.loads(line) for line in fh if line.strip()]
    if fmt == "json":
        return _read_json_records(path, field)
    if fmt in ("tsv", "csv"):
        with path.open(encoding="utf-8", newline="") as fh:
            return list(csv.DictReader(fh, delimiter="\t" if fmt == "tsv" else ","))
    if fmt == "parquet":
        return pl.read_parquet(path).to_dicts()
    raise TruthflowError(f"'{path}': unknown format '{fmt}'")


def load_hub_records(
    hub: str, config: str | None, split: str, revision: str | None, n: int | None, seed: int, label: str
) -> list[dict]:
    import datasets

    last: Exception | None = None
    for attempt in range(4):
        try:
            ds = datasets.load_dataset(hub, config, split=split, revision=revision)
            break
        except (ConnectionError, TimeoutError) as exc:  # network hiccups: retry with backoff
            last = exc
            time.sleep(2**attempt)
        except Exception as exc:  # noqa: BLE001 - DatasetNotFoundError, ValueError(bad split/config), ...
            raise TruthflowError(
                f"dataset '{label}': cannot load '{hub}' (config {config!r}, split {split!r}, "
                f"revision {revision!r}) from the hub: {type(exc).__name__}: {str(exc)[:300]}"
            ) from None
    else:
        raise TruthflowError(f"dataset '{label}': hub download of '{hub}' failed 4 times: {last}")
    if n is not None and n < len(ds):
        ds = ds.select(sample_indices(len(ds), n, seed))
    return ds.to_list()


def sample_indices(total: int, n: int | None, seed: int) -> list[int]:
    """Deterministic subsample (kept in file order) of n out of total."""
    if n is None or n >= total:
        return list(range(total))
    return sorted(random.Random(seed).sample(range(total), n))


# ---------------------------------------------------------------- per-dataset normalizers
def _get(rec: dict, key: str):
    """Dotted lookup ('answer.aliases') into nested dicts."""
    cur = rec
    for part in key.split("."):
        if not isinstance(cur, dict) or part not in cur:
            return None
        cur = cur[part]
    return cur


def _as_list(value) -> list[str]:
    if value is None:
        return []
    if isinstance(value, str):
        s = value.strip()
        if s.startswith("["):
            try:
                return [str(v) for v in json.loads(s)]
            except json.JSONDecodeError:
                pass
        return [s] if s else []
    return [str(v) for v in value]


def _dedup(values: list[str]) -> list[str]:
    seen, out = set(), []
    for v in values:
        v = v.strip()
        if v and v not in seen:
            seen.add(v)
            out.append(v)
    return out


def _unwrap_question(q: str) -> str:
    # lm-eval style copies wrap the question: "Question: ...\nAnswer:"
    q = q.strip()
    if q.startswith("Question:"):
        q = q[len("Question:") :]
    if q.endswith("Answer:"):
        q = q[: -len("Answer:")]
    return q.strip()


REQUIRED = {
    "popqa": ("question", "possible_answers"),
    "triviaqa": ("question", "answer"),
    "hotpotqa": ("question", "answer"),
    "nq": ("question", "answer"),
}


def _apply_columns(rec: dict, columns: dict[str, str]) -> dict:
    if not columns:
        return rec
    out = dict(rec)
    for canonical, source in columns.items():
        out[canonical] = _get(rec, source)
    return out


def _check_columns(name: str, records: list[dict], origin: str) -> None:
    if not records:
        raise TruthflowError(f"dataset '{name}': '{origin}' holds no records")
    first = records[0]
    need = REQUIRED[name]
    missing = [c for c in need if _get(first, c) is None and _get(first, c.capitalize()) is None]
    if missing:
        raise TruthflowError(
            f"dataset '{name}': '{origin}' lacks column(s) {missing} (it has {sorted(first)[:12]}); "
            f"map them with `datasets.{name}.source.columns`, e.g. {{{missing[0]}: <column in the file>}}"
        )


def normalize(name: str, records: list[dict]) -> list[dict]:
    rows = []
    for i, rec in enumerate(records):
        if name == "popqa":
            row = {
                "id": str(rec.get("id", i)),
                "question": str(rec["question"]).strip(),
                "answers": _dedup(_as_list(rec["possible_answers"])),
                "subj": rec.get("subj"),
                "prop": rec.get("prop"),
                "obj": rec.get("obj"),
                "s_pop": int(rec["s_pop"]) if rec.get("s_pop") not in (None, "") else None,
            }
        elif name == "triviaqa":
            ans = rec.get("answer") if rec.get("answer") is not None else rec.get("Answer")
            if isinstance(ans, dict):
                aliases = _as_list(ans.get("aliases") or ans.get("Aliases")) + _as_list(
                    ans.get("normalized_aliases") or ans.get("NormalizedAliases")
                )
                value = ans.get("value") or ans.get("Value")
            else:  # flat copies: answer = value, aliases in their own column
                aliases, value = _as_list(rec.get("aliases")), ans
            q = rec.get("question") or rec.get("Question")
            row = {
                "id": str(rec.get("question_id") or rec.get("QuestionId") or f"triviaqa-{i}"),
                "question": _unwrap_question(str(q)),
                "answers": _dedup(_as_list(value) + aliases),
            }
        elif name == "hotpotqa":
            row = {
                "id": str(rec.get("_id") or rec.get("id") or f"hotpotqa-{i}"),
                "question": str(rec["question"]).strip(),
                "answers": _dedup(
                    _as_list(rec["answer"]) if not isinstance(rec["answer"], str) else [rec["answer"]]
                ),
                "type": rec.get("type"),
                "level": rec.get("level"),
            }
        elif name == "nq":
            row = {
                "id": str(rec.get("id") or f"nq-{i}"),
                "question": str(rec["question"]).strip(),
                "answers": _dedup(
                    _as_list(rec["answer"]) if not isinstance(rec["answer"], str) else [rec["answer"]]
                ),
            }
        else:
            raise TruthflowError(f"unknown QA dataset '{name}' (known: {', '.join(QA_DATASETS)})")
        if not row["question"] or not row["answers"]:
            continue  # no gold answer: cannot be labelled (counted by the caller)
        rows.append(row)
    return rows


def _unique_ids(rows: list[dict]) -> None:
    seen: dict[str, int] = {}
    for row in rows:
        base = row["id"]
        if base in seen:
            seen[base] += 1
            row["id"] = f"{base}#{seen[base]}"
        else:
            seen[base] = 0


def load_qa(name: str, spec: dict) -> tuple[pl.DataFrame, dict]:
    """Load, normalize and subsample one QA dataset; returns the table and a small report."""
    src = spec["source"]
    n, seed = spec.get("n"), int(spec.get("seed", 0))
    if "local" in src:
        origin = str(src["local"])
        if not Path(origin).exists():
            raise TruthflowError(f"dataset '{name}': local file '{origin}' does not exist")
        records = read_local_records(origin, src.get("format", "auto"), src.get("field"))
        records = [_apply_columns(r, src.get("columns") or {}) for r in records]
        _check_columns(name, records, origin)
        total = len(records)
        records = [records[i] for i in sample_indices(total, n, seed)]
    elif "hub" in src:
        origin = src["hub"]
        records = load_hub_records(
            src["hub"], src.get("config"), src.get("split", "validation"), src.get("revision"), n, seed, name
        )
        records = [_apply_columns(r, src.get("columns") or {}) for r in records]
        _check_columns(name, records, origin)
        total = len(records)
    else:
        raise TruthflowError(f"dataset '{name}': source needs 'hub' or 'local'")
    rows = normalize(name, records)
    _unique_ids(rows)
    for row in rows:
        row["dataset"] = name
    df = pl.DataFrame(rows)
    first = ["id", "dataset", "question", "answers"]
    df = df.select(first + [c for c in df.columns if c not in first])
    report = {
        "dataset": name,
        "origin": origin,
        "available": total,
        "kept": df.height,
        "no_gold_answer": len(records) - len(rows),
    }
    return df, report


# ---------------------------------------------------------------- DepthQA
def _depthqa_questions(records: list[dict]) -> pl.DataFrame:
    rows = []
    for rec in records:
        qid = rec.get("qid") or rec.get("_key")
        if qid is None or "question" not in rec:
            raise TruthflowError(f"DepthQA questions need 'qid' and 'question' (got {sorted(rec)[:8]})")
        ref = str(rec.get("answer") or "")
        rows.append(
            {
                "id": str(qid),
                "dataset": "depthqa",
                "question": str(rec["question"]).strip(),
                "answers": [ref] if ref else [],
                "depth": int(rec["depth"]),
                "reference_answer": ref,
                "domain": rec.get("domain"),
            }
        )
    return pl.DataFrame(rows, schema_overrides={"answers": pl.List(pl.String), "domain": pl.String})


NODES_SCHEMA = {
    "nodeid": pl.String,
    "group": pl.String,
    "depth": pl.Int64,
    "direct_predecessors": pl.List(pl.String),
    "direct_successors": pl.List(pl.String),
    "qid": pl.String,
}


def _depthqa_nodes(nodes: list[dict], node_to_q: list[dict]) -> pl.DataFrame:
    n2q = {str(r["nodeid"]): str(r["qid"]) for r in node_to_q}
    rows = []
    for rec in nodes:
        nid = str(rec["nodeid"])
        rows.append(
            {
                "nodeid": nid,
                "group": str(rec.get("group", nid.split("_")[0])),
                "depth": int(rec["depth"]),
                "direct_predecessors": [str(x) for x in rec.get("direct_predecessors") or []],
                "direct_successors": [str(x) for x in rec.get("direct_successors") or []],
                "qid": n2q.get(nid),
            }
        )
    return pl.DataFrame(rows, schema=NODES_SCHEMA)


def load_depthqa(spec: dict) -> tuple[pl.DataFrame, pl.DataFrame, dict]:
    """DepthQA questions + graph. A local source is a directory with questions/nodes/node_to_q files
    (jsonl/json/parquet) or one questions file (e.g. an outputs/*.json dict keyed by qid: no graph)."""
    src = spec["source"]
    n, seed = spec.get("n"), int(spec.get("seed", 0))
    if "hub" in src:
        parts = {
            c: load_hub_records(
                src["hub"], c, src.get("split", "test"), src.get("revision"), None, seed, "depthqa"
            )
            for c in DEPTHQA_CONFIGS
        }
        origin = src["hub"]
    elif "local" in src:
        origin = str(src["local"])
        path = Path(origin)
        if not path.exists():
            raise TruthflowError(f"dataset 'depthqa': local source '{path}' does not exist")
        parts = {}
        if path.is_dir():
            for c in DEPTHQA_CONFIGS:
                found = [
                    p for p in sorted(path.glob(f"{c}.*")) if p.suffix in (".jsonl", ".json", ".parquet")
                ]
                parts[c] = read_local_records(found[0]) if found else []
            if not parts["questions"]:
                raise TruthflowError(f"dataset 'depthqa': '{path}' has no questions.jsonl/.json/.parquet")
        else:
            parts = {
                "questions": read_local_records(path, src.get("format", "auto"), src.get("field")),
                "nodes": [],
                "node_to_q": [],
            }
    else:
        raise TruthflowError("dataset 'depthqa': source needs 'hub' or 'local'")
    questions = _depthqa_questions(parts["questions"])
    nodes = _depthqa_nodes(parts["nodes"], parts["node_to_q"])
    if n is not None and nodes.height:  # sample whole groups so each keeps its D3/D2/D1 structure
        groups = sorted(nodes["group"].unique().to_list(), key=lambda g: (len(g), g))
        keep = [groups[i] for i in sample_indices(len(groups), n, seed)]
        nodes = nodes.filter(pl.col("group").is_in(keep))
        questions = questions.filter(pl.col("id").is_in(nodes["qid"].drop_nulls().unique().to_list()))
    elif n is not None:
        questions = questions[sample_indices(questions.height, n, seed)]
    report = {
        "dataset": "depthqa",
        "origin": origin,
        "questions": questions.height,
        "nodes": nodes.height,
        "groups": nodes["group"].n_unique() if nodes.height else 0,
    }
    return questions, nodes, report
