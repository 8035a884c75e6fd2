"""The engine has one entry: every forward call of a model in src/ sits in `engine/passes.py`, which only
`engine/entry.py` (the `run` entry) imports, and every caller outside the engine imports `truthflow.engine`,
not its modules. Checked twice: by reading the code (ast) and by watching the passes of every stage run."""

import ast
import inspect
import warnings
from pathlib import Path

SRC = Path(__file__).resolve().parents[1] / "src" / "truthflow"
ENTRY = {"engine/passes.py"}
# the load-time kernel probe runs the model on a tiny made-up batch to name the SDPA kernel each kind of
# pass runs (its log line); no table reads it
PROBE = {"engine/backend.py"}
# the other backend of answers that need no hook: vLLM's own engine runs the model (`llm.generate(`), never a
# torch module of truthflow's
VLLM = {"vllm_answers.py"}
# names whose call runs a model or one of its layers: the causal LM, its base model, a decoder layer, the
# final norm, the LM head, the embeddings; as attributes only the unambiguous ones (`df.head()` is polars)
MODEL_NAMES = {"model", "base", "lm_model", "layer", "norm", "head", "lm_head", "embed_tokens"}
MODEL_ATTRS = {"model", "base", "lm_model", "lm_head", "embed_tokens"}


def model_calls(path: Path, root: Path = SRC) -> list[str]:
    """Calls in a module that run a model or a layer of it: `.generate(`, `.forward(`, a call of a name in
    MODEL_NAMES or an attribute in MODEL_ATTRS, `F.linear(` (a head applied by hand), a call of what
    `get_*_embeddings()` or `final_norm(...)` return, or of the base model fetched by
    `getattr(model, model.base_model_prefix)`."""
    found = []
    for node in ast.walk(ast.parse(path.read_text())):
        if not isinstance(node, ast.Call):
            continue
        f, where = node.func, f"{path.relative_to(root)}:{node.lineno}"
        if isinstance(f, ast.Attribute) and f.attr in ("generate", "forward", "linear"):
            found.append(f"{where} .{f.attr}(")
        elif isinstance(f, ast.Name) and f.id in MODEL_NAMES:
            found.append(f"{where} {f.id}(")
        elif isinstance(f, ast.Attribute) and f.attr in MODEL_ATTRS:
            found.append(f"{where} .{f.attr}(")
        elif isinstance(f, ast.Call):
            inner = ast.unparse(f.func)
            if inner.endswith(("_embeddings", "final_norm")) or (
                inner == "getattr" and "base_model_prefix" in ast.unparse(f)
            ):
                found.append(f"{where} {inner}(...)(")
    return found


def imported_modules(path: Path) -> set[str]:
    """The truthflow modules a module imports (`from .x import y` counts y where y is a module), dotted."""
    package = ".".join(("truthflow", *path.relative_to(SRC).parent.parts))
    names = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.ImportFrom):
            base = package.rsplit(".", node.level - 1)[0] if node.level else ""
            module = ".".join(filter(None, (base, node.module)))
            folder = SRC.joinpath(*module.split(".")[1:])
            submodules = {f"{module}.{a.name}" for a in node.names if (folder / f"{a.name}.py").exists()}
            names |= {module} | submodules
        elif isinstance(node, ast.Import):
            names |= {a.name for a in node.names}
    return {n for n in names if n.startswith("truthflow.")}


def test_model_calls_are_in_the_entry_only():
    calls = {str(p.relative_to(SRC)): model_calls(p) for p in SRC.rglob("*.py")}
    outside = [c for p, found in calls.items() if p not in ENTRY | PROBE | VLLM for c in found]
    assert outside == []
    kinds = {c.split(" ", 1)[1] for p in ENTRY for c in calls[p]}
    # the walker sees each kind of call the entry makes (it would pass vacuously otherwise)
    assert {"base(", ".generate(", "norm(", ".linear(", "model.get_output_embeddings(...)("} <= kinds, kinds


def test_the_walker_finds_a_model_call_hidden_in_a_stage(tmp_path):
    stage = tmp_path / "stage.py"
    stage.write_text(
        "def score(lm, ids):\n"
        "    hidden = getattr(lm.model, lm.model.base_model_prefix)(input_ids=ids).last_hidden_state\n"
        "    base = lm.model.model\n"
        "    base(input_ids=ids)\n"
        "    return lm.model.lm_head(final_norm(lm.model)(hidden))\n"
    )
    found = [c.split(" ", 1)[1] for c in model_calls(stage, root=tmp_path)]
    assert sorted(found) == sorted(["getattr(...)(", "base(", ".lm_head(", "final_norm(...)("])


def test_only_the_entry_imports_the_passes_and_callers_import_the_package():
    modules = {str(p.relative_to(SRC)): imported_modules(p) for p in SRC.rglob("*.py")}
    assert sorted(p for p, m in modules.items() if "truthflow.engine.passes" in m) == ["engine/entry.py"]
    # outside the engine, `truthflow.engine` itself; engine.backend only where a model is loaded with the
    # attention the engine chose (a load, not a pass)
    allowed = {"truthflow.engine", "truthflow.engine.backend"}
    around = {
        p: sorted(m for m in found if m.startswith("truthflow.engine") and m not in allowed)
        for p, found in modules.items()
        if not p.startswith("engine/")
    }
    assert {p: m for p, m in around.items() if m} == {}


def test_every_stage_runs_its_model_from_the_entry():
    """At run time: a pre-hook on the model's first decoder layer records which truthflow module called into
    torch for every pass of every stage on a twin: the entry's `passes`, nothing else."""
    from conftest import resid_states

    from truthflow.depth.mink import score_texts
    from truthflow.engine import Condition
    from truthflow.generation import generate_answers
    from truthflow.pathways import interventions
    from truthflow.pathways.saliency import saliency
    from truthflow.twins import build_twin

    twin = build_twin("llama")
    callers: set[str] = set()

    def hook(_mod, _args):
        for frame in inspect.stack()[1:]:
            name = frame.frame.f_globals.get("__name__", "")
            if name.startswith("truthflow."):
                callers.add(name)
                return

    handle = twin.model.model.layers[0].register_forward_pre_hook(hook)
    with warnings.catch_warnings(record=True) as seen:
        warnings.simplefilter("always")
        try:
            seqs = [[1, *range(10, 30)], [1, *range(40, 55)]]
            probes = [len(s) - 1 for s in seqs]
            generate_answers(twin, ["Q: a\nA:", "Q: bb\nA:"], 2, 3, True, False)
            resid_states(twin, seqs, probes, [Condition(), Condition(block=[[3], [4]], window=3)], 2)
            resid_states(twin, seqs, probes, [Condition(tokens=seqs)], 2, layer=1)
            saliency(twin, seqs, [15, 10], [[3], [4]], [[18], [12]], 2)
            interventions.p_true(twin, seqs, 2)
            score_texts(twin, ["some text here", "more"], [20.0], 2)
        finally:
            handle.remove()
    assert callers == {"truthflow.engine.passes"}, callers
    # the current transformers API: no stage hands a cache over as `past_key_values`
    assert not [str(w.message) for w in seen if "past_key_values" in str(w.message)]
    # the engine's hooks are gone after the passes (context managers); transformers keeps its own
    left = [
        getattr(getattr(h, "func", h), "__module__", "")
        for m in twin.model.modules()
        for h in (*m._forward_hooks.values(), *m._forward_pre_hooks.values())
    ]
    assert not [name for name in left if name.startswith("truthflow")]
