"""Dataset loading (hub, or local files in each set's layout) into one schema: id, dataset, question, answers,
own fields; ids do not depend on `n` or `seed`; unusable rows, too large an `n` go to a dropped table."""

import csv
import json
import logging
import random
from pathlib import Path

import polars as pl

from . import registry
from .errors import TruthflowError
from .hub import HUB_ATTEMPTS, is_transient, offline, resolve_revision, retrying, sha256_of
from .registry import get_field as _get
from .registry import question_id  # noqa: F401 - the stable id rule, imported from here by tests

DEPTHQA_CONFIGS = ("questions", "nodes", "node_to_q")
DROPPED_QUESTIONS_SCHEMA = dict.fromkeys(["dataset", "id", "reason", "detail"], pl.String)
_LINKS = {"direct_predecessors": "predecessor", "direct_successors": "successor"}  # nodes' columns: role
NODES_SCHEMA = {"nodeid": pl.String, "group": pl.String, "depth": pl.Int64}
NODES_SCHEMA |= {**dict.fromkeys(_LINKS, pl.List(pl.String)), "qid": pl.String}


def _bad_json(path: Path, lineno: int, exc: json.JSONDecodeError) -> TruthflowError:
    return TruthflowError(f"{path} line {lineno}: not valid JSON ({exc.msg}, column {exc.colno})")


def _json_lines(path: Path, text: str) -> list[dict]:
    """JSON Lines records; an error names its line (polars' read_ndjson names none)."""
    out = []  # split on "\n" only: str.splitlines() also breaks at U+2028 inside JSON strings
    for lineno, line in enumerate(text.split("\n"), 1):
        if not line.strip():
            continue
        try:
            rec = json.loads(line)
        except json.JSONDecodeError as exc:
            raise _bad_json(path, lineno, exc) from None
        if not isinstance(rec, dict):
            raise TruthflowError(f"{path} line {lineno}: expected a JSON object, got {type(rec).__name__}")
        out.append(rec)
    return out


def _read_json_records(path: Path, text: str, field: str | None) -> list[dict]:
    try:
        obj = json.loads(text)
    except json.JSONDecodeError as exc:
        if exc.msg == "Extra data":  # a first value, then more: JSON Lines (HotpotQA's AMOR copy is one)
            return _json_lines(path, text)
        raise _bad_json(path, exc.lineno, exc) from None
    if isinstance(obj, dict):
        data_lists = [obj[k] for k in ("Data", "data") if isinstance(obj.get(k), list)]  # Data: TriviaQA's
        if field:
            if field not in obj:
                raise TruthflowError(f"{path}: has no top-level field '{field}' (it has {sorted(obj)[:10]})")
            obj = obj[field]
        elif data_lists:
            obj = data_lists[0]
        elif obj and all(isinstance(v, dict) for v in obj.values()):  # dict keyed by id
            obj = [{"_key": k, **v} for k, v in obj.items()]
    if not isinstance(obj, list):
        raise TruthflowError(f"{path}: expected a JSON list of records (set `field:` for nested lists)")
    bad = next((i for i, r in enumerate(obj) if not isinstance(r, dict)), None)
    if bad is not None:
        raise TruthflowError(f"{path}: record {bad} is a {type(obj[bad]).__name__}, not a JSON object")
    return obj


def _read_delimited(path: Path, delimiter: str) -> list[dict]:
    """TSV/CSV with standard quoting; a ragged row is an error naming its line (polars' names none)."""
    kind = "tab" if delimiter == "\t" else "comma"
    with path.open(encoding="utf-8", newline="") as fh:
        reader = csv.reader(fh, delimiter=delimiter, strict=True)
        records = []
        header = None
        start = 1  # the line the next row starts on (a quoted field may span lines)
        try:
            for row in reader:
                lineno = start
                start = reader.line_num + 1
                if not row or (len(row) == 1 and not row[0].strip()):
                    continue
                if header is None:
                    header = [h.strip() for h in row]
                    if dup := sorted({h for h in header if header.count(h) > 1}):
                        raise TruthflowError(f"{path} line {lineno}: header repeats column(s) {dup}")
                    continue
                if len(row) != len(header):
                    raise TruthflowError(
                        f"{path} line {lineno}: {len(row)} fields, but the header has {len(header)} "
                        f"(a {kind} inside an unquoted field? quote such fields)"
                    )
                records.append(dict(zip(header, row, strict=True)))
        except csv.Error as exc:
            raise TruthflowError(f"{path} line {start}: malformed {kind}-separated row ({exc})") from None
    return records


def _check_file(path: Path) -> None:
    """It exists and is not empty (whitespace only counts as empty)."""
    if not path.exists():
        raise TruthflowError(f"'{path}' does not exist")
    if path.is_dir():
        raise TruthflowError(f"'{path}' is a directory, not a data file")
    size = path.stat().st_size
    small_text = size <= 4096 and path.suffix.lower() != ".parquet"
    if size == 0 or (small_text and not path.read_bytes().strip()):
        raise TruthflowError(f"'{path}' is empty")


def read_local_records(path: str | Path, fmt: str = "auto", field: str | None = None) -> list[dict]:
    """The records of a local file; format 'auto' goes by its suffix."""
    path = Path(path)
    _check_file(path)
    fmt = path.suffix.lower().lstrip(".") if fmt == "auto" else fmt
    if fmt not in ("jsonl", "json", "tsv", "csv", "parquet"):
        raise TruthflowError(f"'{path}': cannot tell the format from the suffix; set `format:`")
    if fmt == "parquet":
        try:
            return pl.read_parquet(path).to_dicts()
        except (pl.exceptions.PolarsError, OSError) as exc:
            raise TruthflowError(f"'{path}': not a readable parquet file ({str(exc)[:200]})") from None
    try:
        if fmt in ("tsv", "csv"):
            return _read_delimited(path, "\t" if fmt == "tsv" else ",")
        text = path.read_text(encoding="utf-8")
        return _json_lines(path, text) if fmt == "jsonl" else _read_json_records(path, text, field)
    except UnicodeDecodeError as e:
        raise TruthflowError(f"'{path}': not UTF-8 text (byte {e.start}); is format '{fmt}' right?") from None


def load_hub_records(
    hub: str, config: str | None, split: str, revision: str | None, label: str
) -> list[dict]:
    """Every record of one hub split, retried as the hub module says; a failure is one line."""
    import datasets

    try:
        retry = retrying(f"dataset '{label}'", hub)
        ds = retry(datasets.load_dataset, hub, config, split=split, revision=revision)
    except Exception as exc:  # noqa: BLE001 - DatasetNotFoundError, ValueError(bad split/config), ...
        tried = f"failed {HUB_ATTEMPTS} times (transient)" if is_transient(exc) else "failed"
        what = f"'{hub}' (config {config!r}, split {split!r}, revision {revision!r})"
        raise TruthflowError(
            f"dataset '{label}': hub load of {what} {tried}: {type(exc).__name__}: {str(exc)[:300]}"
        ) from None
    return ds.to_list()


def _copy_entry(spec: dict) -> dict:
    """A dataset entry that registry.fill_source may fill without touching the config's (its source too)."""
    return {**spec, "source": dict(spec["source"])} if spec.get("source") else dict(spec)


def resolve_source(name: str, spec: dict) -> tuple[dict, dict]:
    """A dataset entry with its hub source pinned to the commit its revision names now (offline: as given),
    and the record the run's report shows: source, requested and resolved revision, each file's sha256 (the
    hub's, of its data files; a local file's own)."""
    spec = _copy_entry(spec)
    registry.fill_source(name, spec)
    src = spec["source"]
    record = {"kind": "dataset", "name": name, "requested": src.get("revision"), "revision": None}
    if "local" in src:
        path = Path(str(src["local"]))
        files = sorted(f for f in path.rglob("*") if f.is_file()) if path.is_dir() else [path]
        where = path if path.is_dir() else path.parent
        digests = {str(f.relative_to(where)): sha256_of(f) for f in files if f.exists()}
        return spec, record | {"source": str(path), "files": digests, "note": "local files"}
    record["source"] = src["hub"]
    if offline():
        return spec, record | {
            "files": {},
            "note": "offline: read from the local cache, revision not resolved",
        }
    try:
        found = resolve_revision(src["hub"], "dataset", src.get("revision"), f"dataset '{name}'")
    except Exception as exc:  # noqa: BLE001 - RepositoryNotFoundError, RevisionNotFoundError, network
        tried = f"failed {HUB_ATTEMPTS} times (transient)" if is_transient(exc) else "failed"
        raise TruthflowError(
            f"dataset '{name}': resolving '{src['hub']}' at revision {src.get('revision')!r} {tried}: "
            f"{type(exc).__name__}: {str(exc)[:300]}"
        ) from None
    src["revision"] = found["revision"]
    return spec, record | {"revision": found["revision"], "files": found["files"], "note": "hub"}


def sample_indices(total: int, n: int | None, seed: int) -> list[int]:
    """Deterministic subsample (kept in file order) of n out of total."""
    if n is None or n >= total:
        return list(range(total))
    return sorted(random.Random(seed).sample(range(total), n))


def _dropped_frame(name: str, dropped: list[dict]) -> pl.DataFrame:
    return pl.DataFrame([{"dataset": name, **d} for d in dropped], schema=DROPPED_QUESTIONS_SCHEMA)


def _sample(name: str, usable: int, unit: str, origin: str, n: int | None, seed: int, dropped: list) -> list:
    """sample_indices; an `n` above the usable count is logged and goes to `dropped`."""
    if n is not None and n > usable:
        detail = f"n={n} requested but only {usable} usable {unit} in '{origin}'"
        logging.getLogger(__name__).warning("dataset '%s': %s; using all %d", name, detail, usable)
        dropped.append({"id": None, "reason": "n_exceeds_rows", "detail": detail})
    return sample_indices(usable, n, seed)


def load_qa(name: str, spec: dict) -> tuple[pl.DataFrame, dict]:
    """One QA dataset loaded, normalized and subsampled: the table, and a report with the dropped table."""
    entry = registry.get(name)  # an unknown name fails here, naming the registered ones
    spec = _copy_entry(spec)
    registry.fill_source(name, spec)
    src = spec["source"]
    n = spec.get("n")
    seed = int(spec.get("seed", 0))
    if "local" in src:
        origin = str(src["local"])
        try:
            records = read_local_records(origin, src.get("format", "auto"), src.get("field"))
        except TruthflowError as exc:
            raise TruthflowError(f"dataset '{name}': {exc}") from None
    else:  # the schema wants one of hub and local
        origin = src["hub"]
        records = load_hub_records(
            src["hub"], src.get("config"), src.get("split", "validation"), src.get("revision"), name
        )
    columns = src.get("columns") or {}  # our column -> the file's field (dotted: nested)
    records = [r | {c: _get(r, field) for c, field in columns.items()} for r in records]
    if not records:
        raise TruthflowError(f"dataset '{name}': '{origin}' holds no records")
    first = records[0]

    def has_column(c: str) -> bool:  # a capitalized column counts (TriviaQA's "Question")
        return _get(first, c) is not None or _get(first, c.capitalize()) is not None

    missing = [c for c in entry.required if not has_column(c)]
    if missing:
        raise TruthflowError(
            f"dataset '{name}': '{origin}' lacks column(s) {missing} (it has {sorted(first)[:12]}); "
            f"map them with `datasets.{name}.source.columns`, e.g. {{{missing[0]}: <column in the file>}}"
        )
    rows = []
    dropped = []  # no question, no gold answer, or an id seen before
    seen = set()
    for i, rec in enumerate(records):
        row = entry.normalize(rec, i)
        reason = None
        if not row["question"]:
            reason = "no_question"
        elif not row["answers"]:
            reason = "no_gold_answer"
        elif row["id"] in seen:
            reason = "duplicate_id"
        if reason:
            dropped.append({"id": row["id"], "reason": reason, "detail": None})
        else:
            seen.add(row["id"])
            rows.append(row)
    kept = _sample(name, len(rows), "rows", origin, n, seed, dropped)
    rows = [{**rows[i], "dataset": name} for i in kept]
    if not rows:
        raise TruthflowError(
            f"dataset '{name}': no usable row in '{origin}' (every row lacks a question or answer)"
        )
    lead = ["id", "dataset", "question", "answers"]
    df = pl.DataFrame(rows).select(*lead, pl.exclude(lead))
    reasons = [d["reason"] for d in dropped]
    counts = {r: reasons.count(r) for r in ("no_gold_answer", "no_question", "duplicate_id")}
    report = {"dataset": name, "origin": origin, "available": len(records), "n": n, "kept": df.height}
    return df, {**report, **counts, "dropped": _dropped_frame(name, dropped)}


def _depthqa_questions(records: list[dict], where: str) -> tuple[pl.DataFrame, list[dict]]:
    rows = []
    dropped = []
    seen = set()
    for i, rec in enumerate(records):
        qid = rec.get("qid") or rec.get("_key")
        if qid is None or "question" not in rec:
            raise TruthflowError(
                f"DepthQA questions ({where}, record {i}): need 'qid' and 'question' (got {sorted(rec)[:8]})"
            )
        qid = str(qid)
        if qid in seen:
            dropped.append({"id": qid, "reason": "duplicate_id", "detail": None})
            continue
        seen.add(qid)
        try:
            depth = int(rec["depth"])
        except (KeyError, TypeError, ValueError):
            raise TruthflowError(
                f"DepthQA questions ({where}): question '{qid}' has no integer 'depth'"
            ) from None
        ref = str(rec.get("answer") or "")
        question = str(rec["question"]).strip()
        row = {"id": qid, "dataset": "depthqa", "question": question, "answers": [ref] if ref else []}
        rows.append(row | {"depth": depth, "reference_answer": ref, "domain": rec.get("domain")})
    table = pl.DataFrame(rows, schema_overrides={"answers": pl.List(pl.String), "domain": pl.String})
    return table, dropped


def _graph_error(message: str) -> TruthflowError:
    return TruthflowError(f"DepthQA graph: {message}")


def depthqa_nodes(
    nodes: list[dict], node_to_q: list[dict], depth_of: dict[str, int], where: dict[str, str]
) -> pl.DataFrame:
    """The nodes table (NODES_SCHEMA), checked closed: named nodes exist, map to a question of their depth. Its
    rows are in the node_to_q file's order, the order the authors' metrics walk (depth.metrics)."""
    # where each part was read, as the errors name it: wn the nodes, wm the node-to-question map, wq questions
    wn, wm, wq = (where.get(k, k) for k in ("nodes", "node_to_q", "questions"))
    if not nodes and not node_to_q:
        return pl.DataFrame(schema=NODES_SCHEMA)
    if not nodes or not node_to_q:
        if nodes:
            have, lack = "nodes", "node_to_q"
        else:
            have, lack = "node_to_q", "nodes"
        raise _graph_error(f"{where.get(have, have)} is given but the {lack} file is missing or empty")
    qid_of: dict[str, str] = {}
    for i, rec in enumerate(node_to_q):
        if rec.get("nodeid") is None or rec.get("qid") is None:
            raise _graph_error(f"{wm}, record {i}: needs 'nodeid' and 'qid' (got {sorted(rec)[:6]})")
        nid, qid = str(rec["nodeid"]), str(rec["qid"])
        if qid_of.setdefault(nid, qid) != qid:
            raise _graph_error(f"{wm}: node '{nid}' maps to two questions, '{qid_of[nid]}' and '{qid}'")
        if qid not in depth_of:
            raise _graph_error(f"{wm}: node '{nid}' maps to question '{qid}', which is not in {wq}")
    rows: dict[str, dict] = {}
    for i, rec in enumerate(nodes):
        if rec.get("nodeid") in (None, ""):
            raise _graph_error(f"{wn}, record {i}: has no 'nodeid'")
        nid = str(rec["nodeid"])
        if nid in rows:
            raise _graph_error(f"{wn}: node '{nid}' appears twice")
        if nid not in qid_of:
            raise _graph_error(f"{wn}: node '{nid}' has no question in {wm}")
        depth = rec.get("depth")
        qid = qid_of[nid]
        if str(depth) not in ("1", "2", "3") or int(depth) != depth_of[qid]:
            need = f"its question '{qid}' has {depth_of[qid]}; a node's depth is 1, 2 or 3, its question's"
            raise _graph_error(f"{wn}: node '{nid}' has depth {depth!r} but {need}")
        links = {k: [str(x) for x in rec.get(k) or []] for k in _LINKS}
        group = str(rec.get("group", nid.split("_")[0]))
        rows[nid] = {"nodeid": nid, "group": group, "depth": int(depth), **links, "qid": qid}
    if unknown := [nid for nid in qid_of if nid not in rows]:
        raise _graph_error(f"{wm}: maps node '{unknown[0]}', which is not in {wn}")
    d3_of: dict[str, str] = {}
    for nid, row in rows.items():
        for field, role in _LINKS.items():
            if missing := [other for other in row[field] if other not in rows]:
                raise _graph_error(f"{wn}: node '{nid}' names {role} '{missing[0]}', which is not a node")
        if row["depth"] == 3 and d3_of.setdefault(row["group"], nid) != nid:
            raise _graph_error(
                f"{wn}: group '{row['group']}' has two D3 nodes, '{d3_of[row['group']]}' and '{nid}'; "
                f"a group is one D3 node with its ancestors"
            )
    # the authors' node_results is filled from their node_to_q dict, whose order is that file's (a repeated
    # node keeps its first place); the first successor of depth.metrics depends on it, not on the nodes file
    return pl.DataFrame([rows[nid] for nid in qid_of], schema=NODES_SCHEMA)


def load_depthqa(spec: dict) -> tuple[pl.DataFrame, pl.DataFrame, dict]:
    """DepthQA questions + graph: from a directory of questions/nodes/node_to_q files, or a questions file."""
    src = spec["source"]
    n = spec.get("n")
    seed = int(spec.get("seed", 0))
    if "hub" in src:
        origin = src["hub"]
        split = src.get("split", "test")
        revision = src.get("revision")
        parts = {c: load_hub_records(origin, c, split, revision, "depthqa") for c in DEPTHQA_CONFIGS}
        where = {c: f"{origin} ({c})" for c in DEPTHQA_CONFIGS}
    else:
        origin = str(src["local"])
        path = Path(origin)
        if path.is_dir():
            parts = {}
            where = {}
            for c in DEPTHQA_CONFIGS:
                candidates = sorted(path.glob(f"{c}.*"))
                hits = [f for f in candidates if f.suffix in (".jsonl", ".json", ".parquet")]
                parts[c] = read_local_records(hits[0]) if hits else []
                where[c] = str(hits[0] if hits else path / f"{c}.jsonl")
            if not parts["questions"]:
                raise TruthflowError(f"dataset 'depthqa': '{path}' has no questions.jsonl/.json/.parquet")
        else:
            records = read_local_records(path, src.get("format", "auto"), src.get("field"))
            parts = {"questions": records, "nodes": [], "node_to_q": []}  # a questions file alone: no graph
            where = {"questions": origin}
    questions, dropped = _depthqa_questions(parts["questions"], where["questions"])
    depth_of = dict(zip(questions["id"], questions["depth"], strict=True))
    nodes = depthqa_nodes(parts["nodes"], parts["node_to_q"], depth_of, where)
    if nodes.height:  # sample whole groups so each keeps its D3/D2/D1 structure
        groups = sorted(nodes["group"].unique().to_list(), key=lambda g: (len(g), g))
        sampled = _sample("depthqa", len(groups), "groups", origin, n, seed, dropped)
        keep = [groups[i] for i in sampled]
        nodes = nodes.filter(pl.col("group").is_in(keep))
        questions = questions.filter(pl.col("id").is_in(nodes["qid"].implode()))
    else:
        sampled = _sample("depthqa", questions.height, "questions", origin, n, seed, dropped)
        questions = questions[sampled]
    report = {
        "dataset": "depthqa",
        "origin": origin,
        "n": n,
        "questions": questions.height,
        "nodes": nodes.height,
        "groups": nodes["group"].n_unique(),
        "duplicate_id": sum(d["reason"] == "duplicate_id" for d in dropped),
        "dropped": _dropped_frame("depthqa", dropped),
    }
    return questions, nodes, report


def check_local_sources(config: dict) -> None:
    """Before any job: local data files exist and are not empty, a local DepthQA graph is closed."""
    for name, spec in config["datasets"].items():
        src = spec.get("source") or {}
        for unused in ("columns", "config"):
            if name == registry.DEPTHQA and src.get(unused):
                raise TruthflowError(
                    f"config key 'datasets.depthqa.source.{unused}': DepthQA does not use it (its files have "
                    f"a fixed layout; hub configs {', '.join(DEPTHQA_CONFIGS)} are all read); remove it"
                )
        if "local" not in src:
            continue
        try:
            if name == registry.DEPTHQA:  # a broken graph is refused before hours of model jobs
                load_depthqa({"source": src})
            else:
                _check_file(Path(str(src["local"])))
        except TruthflowError as exc:
            raise TruthflowError(
                f"dataset '{name}' (config key 'datasets.{name}.source.local'): {exc}"
            ) from None
