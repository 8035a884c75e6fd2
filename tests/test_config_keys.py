"""Config keys, read <=> schema: every key the code reads is in the schema (src/truthflow/schemas/), and every
key of the schema is read by the code.

The code is read statically (Snakefile, workflow/rules/*.smk, src/truthflow/**/*.py, workflow/scripts/*.py): a
read is a chain of string-literal subscripts or `.get`/`.setdefault`/`.pop` calls, or an `"key" in ...` test,
on something that holds (part of) the config: `config` itself, a variable assigned from such a chain
(`pw = config["pathways"]`, `for name, spec in config["datasets"].items()`), a rule's `params` in its script
(`sm.params.knockout["mode"]`, the param's own chain read from the rule), a rule's
`**model_params("key", ...)` (those keys of its model's entry), or one of the few function parameters listed
in HANDOFFS. A variable subscript under a fixed section (`config["pathways"][k]`) is a dynamic read: the keys
it can take are listed, with the reason, in DYNAMIC."""

from __future__ import annotations

import inspect
import re

import pytest
import yaml
from conftest import REPO

from truthflow.depth import judge

SCHEMA = yaml.safe_load((REPO / "src" / "truthflow" / "schemas" / "config.schema.yaml").read_text())
FILES = sorted(
    [
        REPO / "Snakefile",
        *(REPO / "workflow" / "rules").glob("*.smk"),
        *(REPO / "src" / "truthflow").rglob("*.py"),
        *(REPO / "workflow" / "scripts").glob("*.py"),
        *(REPO / "workflow" / "report").glob("*.rst"),  # report captions: {{ snakemake.config["run"] }}
    ]
)
ANY = "*"  # a models/datasets entry (their names are the user's)

# function parameters that receive a config section under another name (the module's hand-off points)
HANDOFFS = {
    "src/truthflow/data.py": {"spec": ("datasets", ANY), "src": ("datasets", ANY, "source")},
    "src/truthflow/registry.py": {"spec": ("datasets", ANY)},  # fill_source: hub defaults into an entry
    "src/truthflow/models.py": {"spec": ("models", ANY), "source": ("models", ANY, "source")},
    # memplan.plan_model(name, spec, ...) / dims_for(name, source): a model entry with its defaults
    "src/truthflow/memplan.py": {"spec": ("models", ANY), "source": ("models", ANY, "source")},
    # depth.judge: the section, its defaults filled, is the judge's `settings`
    "src/truthflow/depth/judge.py": {"settings": ("depth", "judge")},
    # the answers' decoding section, read by engine.decoding.Decoding.from_config(cfg)
    "src/truthflow/engine/decoding.py": {"cfg": ("depth", "decoding")},
    # pathways.check: the verdict's settings, rule param `check` passed whole to check.family / caption
    "src/truthflow/pathways/check.py": {"cfg": ("pathways", "check")},
    # the probe settings (pathways.probe) passed whole to the cross-fitted probes
    "src/truthflow/pathways/probes.py": {"probe": ("pathways", "probe")},
    "src/truthflow/pathways/detection.py": {"probe": ("pathways", "probe")},
    "src/truthflow/pathways/experiments.py": {"probe": ("pathways", "probe")},
    # knockout_states(..., knockout, ...): pathways.knockout;
    # experiment_states(..., cfg, ...): pathways.experiments
    "src/truthflow/pathways/extract.py": {
        "knockout": ("pathways", "knockout"),
        "cfg": ("pathways", "experiments"),
    },
}
# rule params built by a comprehension over literal keys, not by a chain: the section they are a part of
PARAM_SECTIONS = {
    # probe_deltap: cfg={k: config["pathways"][k] for k in ("probe", "anchor_split", ...)}
    "cfg": ("pathways",),
}
# schema keys read only through a variable key (no literal anywhere), each with where and why; none today:
# probe_deltap's `config["pathways"][k] for k in (...)` is followed into its script through PARAM_SECTIONS
DYNAMIC: dict[tuple[str, ...], str] = {}


# ------------------------------------------------------------ the schema's key paths
def _resolve(node: dict) -> dict:
    while "$ref" in node:
        node = SCHEMA["$defs"][node["$ref"].rsplit("/", 1)[1]]
    return node


def schema_paths(node: dict | None = None, prefix: tuple[str, ...] = ()) -> dict[tuple[str, ...], bool]:
    """Every key path of the schema -> whether it is a leaf (a value, or an object of free-form keys)."""
    node = _resolve(node if node is not None else SCHEMA)
    out: dict[tuple[str, ...], bool] = {}
    props = node.get("properties")
    entries = node.get("additionalProperties")
    if props:
        for key, sub in props.items():
            path = (*prefix, key)
            sub = _resolve(sub)
            out[path] = "properties" not in sub and not isinstance(sub.get("additionalProperties"), dict)
            out.update(schema_paths(sub, path))
    elif isinstance(entries, dict) and "properties" in _resolve(entries):  # models.*, datasets.*
        out[(*prefix, ANY)] = False
        out.update(schema_paths(entries, (*prefix, ANY)))
    return out


PATHS = schema_paths()


def _lookup(path: tuple[str, ...]) -> str:
    """'key' (in the schema), 'free' (inside a free-form object), 'dynamic' (a variable key under fixed
    keys: not checkable) or 'missing'."""
    for i in range(1, len(path) + 1):
        head = path[:i]
        if head in PATHS:
            if PATHS[head] and i < len(path):
                return "free"
            continue
        star = (*path[: i - 1], ANY)
        if star in PATHS:  # a named models/datasets entry
            path = (*star, *path[i:])
            continue
        if path[i - 1] == ANY:
            return "dynamic"
        return "missing"
    return "key"


def _norm(path: tuple[str, ...]) -> tuple[str, ...]:
    out: tuple[str, ...] = ()
    for key in path:
        out = (*out, ANY) if (*out, ANY) in PATHS else (*out, key)
    return out


# ------------------------------------------------------------ the code's reads
_STR = r"""(?:"([^"\\{}]*)"|'([^'\\{}]*)')"""
_ACCESS = re.compile(
    rf"""\s*\[\s*(?:{_STR}|([^\[\]]+))\s*\]|\.(?:get|setdefault|pop)\(\s*(?:{_STR}|([^,()]+))"""
)


def _chain(text: str, pos: int) -> tuple[list[str], int]:
    """Keys of the access chain starting at text[pos] (ANY for a variable key); a .get() ends it."""
    keys = []
    while m := _ACCESS.match(text, pos):
        literal = next((g for g in m.groups()[:2] + m.groups()[3:5] if g is not None), None)
        keys.append(literal if literal is not None else ANY)
        pos = m.end()
        if not m.group(0).lstrip().startswith("["):
            break
    return keys, pos


def _param_chains() -> dict[str, tuple[str, ...] | None]:
    """Rule params given by a config chain (`knockout=config["pathways"]["knockout"]`): name -> path, or
    None for a name that two rules give different sections (a script must then not subscript it)."""
    out: dict[str, tuple[str, ...] | None] = dict(PARAM_SECTIONS)
    for smk in (REPO / "workflow" / "rules").glob("*.smk"):
        for m in re.finditer(r"(?m)^\s+(\w+)=(?:lambda \w+: )?config(?=\[)", smk.read_text()):
            keys, _ = _chain(smk.read_text(), m.end())
            path = _norm(tuple(keys))
            if out.setdefault(m.group(1), path) != path:
                out[m.group(1)] = None
    return out


def code_reads() -> dict[tuple[str, ...], set[str]]:
    """Config key path -> the files reading it."""
    params = _param_chains()
    reads: dict[tuple[str, ...], set[str]] = {}
    unused = {(f, name) for f, names in HANDOFFS.items() for name in names}
    for file in FILES:
        rel = str(file.relative_to(REPO))
        roots: dict[str, tuple[str, ...]] = {"config": (), "snakemake.config": ()}
        roots.update(HANDOFFS.get(rel, {}))
        if file.suffix == ".smk" or file.name == "Snakefile":
            roots["model_spec"] = ("models", ANY)
        for line in file.read_text().splitlines():
            pattern = "|".join(map(re.escape, sorted(roots, key=len, reverse=True)))
            root_re = re.compile(
                rf"(?<![\w.])(?:sm\.params\.(\w+)|self\.({pattern})|({pattern}))(\([^()]*(?:\([^()]*\))?[^()]*\))?"
            )
            for m in root_re.finditer(line):
                param, name = m.group(1), m.group(2) or m.group(3)
                if param:
                    if param not in params:
                        continue
                    base = params[param]
                    if base is None:
                        assert not _chain(line, m.end())[0], f"{rel}: sm.params.{param} is two sections"
                        continue
                elif name == "model_spec" and not m.group(4):
                    continue  # its definition
                elif name != "model_spec" and m.group(4):
                    continue  # a call, not a subscript
                else:
                    base = roots[name]
                    unused.discard((rel, name))
                keys, end = _chain(line, m.end())
                before = line[: m.start()]
                member = re.search(rf"""{_STR}\s+(?:not\s+)?in\s+$""", before)
                if member and not keys:
                    keys = [member.group(1) or member.group(2)]
                if keys:
                    reads.setdefault((*base, *keys), set()).add(rel)
                # an alias: `x = <chain>`, `for a, x in <chain>.items()`, `for x in <chain>.values()`
                alias = re.match(r"\s*(\w+)\s*=\s*\(?\s*$", before)
                loop = re.search(r"for\s+(?:\w+\s*,\s*)?(\w+)\s+in\s+\(?\s*$", before)
                rest = line[end:]
                if alias and keys is not None and not re.match(r"\s*(\.|\(|\+|\*)", rest):
                    roots[alias.group(1)] = _norm((*base, *keys))
                elif loop and re.match(r"\s*(?:or \{\}\s*\)\s*)?\.(items|values)\(\)", rest):
                    roots[loop.group(1)] = _norm((*base, *keys, ANY))
        # a rule's `**model_params("chat", "dtype")`: those keys of the job's model entry (common.smk)
        for m in re.finditer(r"model_params\(([^()]*)\)", file.read_text() if file.suffix == ".smk" else ""):
            for key in re.findall(_STR, m.group(1)):
                reads.setdefault(("models", ANY, key[0] or key[1]), set()).add(rel)
    assert not unused, f"HANDOFFS names no longer used: {sorted(unused)}"
    return reads


READS = code_reads()


# ------------------------------------------------------------ the two directions
def test_every_key_the_code_reads_is_in_the_schema():
    missing = {".".join(p): sorted(files) for p, files in READS.items() if _lookup(p) == "missing"}
    assert not missing, f"read by the code but not in the schema: {missing}"


@pytest.mark.parametrize("path", [p for p, leaf in PATHS.items() if leaf], ids=".".join)
def test_every_schema_key_is_read(path):
    read = {_norm(p) for p in READS if _lookup(p) in ("key", "free")}
    dynamic = any(path[: len(d)] == d for d in DYNAMIC)
    assert path in read or dynamic or any(r[: len(path)] == path for r in read), (
        f"schema key '{'.'.join(path)}' is never read by the code: wire it or remove it from the schema"
    )


def test_dynamic_reads_are_schema_keys():
    assert all(PATHS.get(d) is not None for d in DYNAMIC), [d for d in DYNAMIC if d not in PATHS]
    assert set(PARAM_SECTIONS.values()) <= set(PATHS) | {()}


def test_judge_reads_every_key_of_its_section():
    section = {p[-1] for p in PATHS if p[:2] == ("depth", "judge") and len(p) == 3}
    assert section == set(re.findall(r"settings\[\"(\w+)\"\]", inspect.getsource(judge)))


def test_the_scan_sees_reads():
    """The scanner itself: known reads of each kind are found."""
    for path in [
        ("run",),
        ("pathways", "knockout", "mode"),  # common.smk alias ko = pw["knockout"]; sm.params.knockout["mode"]
        ("pathways", "probe", "seeds"),  # sm.params.cfg["probe"]["seeds"]
        ("models", "gemma3-270m", "display_name"),
        ("depth", "judge", "base_url"),
        ("datasets", ANY, "source", "columns"),
        ("models", ANY, "source", "embedded"),  # `"embedded" in source`
        ("models", ANY, "chat"),  # a rule's **model_params("chat", ...)
    ]:
        assert any(_norm(r) == _norm(path) for r in READS) or path[1] == "gemma3-270m", path
    assert _lookup(("pathways", "knockot")) == "missing"
    assert _lookup(("models", "m1", "chat_template_kwargs", "enable_thinking")) == "free"
    assert _lookup(("datasets", "nq", "source", "local")) == "key"


@pytest.mark.parametrize("key,value", [("columns", {"question": "q"}), ("config", "questions")])
def test_depthqa_refuses_source_keys_it_does_not_read(key, value):
    """`columns` and a hub `config` are read for QA sets only: given for DepthQA they are refused, not
    silently ignored."""
    from truthflow.data import check_local_sources
    from truthflow.errors import TruthflowError

    src = {"hub": "kaist-ai/DepthQA", "config": None, "columns": {}}
    check_local_sources({"datasets": {"depthqa": {"source": src}}})  # the filled defaults pass
    with pytest.raises(TruthflowError, match=rf"'datasets.depthqa.source.{key}': DepthQA does not use it"):
        check_local_sources({"datasets": {"depthqa": {"source": {**src, key: value}}}})
