import ast
import functools
import os
import re
import sys
import textwrap
from pathlib import Path

SRC = str(Path(workflow.basedir) / "src")
sys.path.insert(0, SRC)
# script jobs (local, SLURM or in a conda env) import the package from this checkout
_env = dict(os.environ)
os.environ.update(
    PYTHONPATH=os.pathsep.join(filter(None, [SRC, _env.get("PYTHONPATH")]))
)

from truthflow import registry  # noqa: E402
from truthflow.scheduling import model_slots, model_threads, torch_threads  # noqa: E402

# the config is checked and its defaults filled by the Snakefile (truthflow.config.check_config)
RUN = config["run"]
MODELS = list(config["models"])
# the configured QA sets, in registry order (src/truthflow/registry.py holds every dataset's knowledge)
QA = [d for d in registry.qa_names() if d in config["datasets"]]
PKG = Path(workflow.basedir) / "src" / "truthflow"


def _given_cores():
    """--cores of this invocation, or None where there is none (--report, --list-rules, a cluster run)."""
    try:
        return workflow.cores
    except WorkflowError:
        return None


def _given_gpus():
    """K of --resources gpu=K, or None where it is not given."""
    value = workflow.global_resources.get("gpu")
    value = getattr(value, "value", value)
    return value if isinstance(value, int) and value > 0 else None


# model jobs share the local cores by slots (scheduling.model_slots); cluster profiles set their threads with
# set-threads (every rule with a `gpu` resource), and torch then uses those
_cores = _given_cores()
_cores = (
    _cores if isinstance(_cores, int) and _cores < 1024 else None
)  # None: a cluster run
MODEL_THREADS = model_threads(
    _cores, model_slots(_given_gpus(), any(Path("/dev").glob("nvidia[0-9]*")))
)
_cpus = (
    len(os.sched_getaffinity(0))
    if hasattr(os, "sched_getaffinity")
    else os.cpu_count() or 1
)
TORCH_THREADS = torch_threads(MODEL_THREADS, _cores, _cpus)


def res(*parts):
    """Every results path is built here: results/{run}/<parts>."""
    return str(Path("results", RUN, *parts))


def checkout_path(*parts):
    """A file of this checkout as an input path relative to the working directory (src/..., workflow/... in
    a checkout), so a copied or moved checkout keeps its recorded inputs."""
    return os.path.relpath(Path(workflow.basedir, *parts), Path.cwd())


def _module_file(dotted):
    """The file of a truthflow module or package, or None (an attribute, or not truthflow)."""
    parts = dotted.split(".")
    if parts[0] != "truthflow":
        return None
    base = PKG.joinpath(*parts[1:])
    for path in (base.with_suffix(".py"), base / "__init__.py"):
        if len(parts) > 1 and path.is_file():
            return path
    return PKG / "__init__.py" if len(parts) == 1 else None


def _imported_modules(source, module=None, where="a rule"):
    """Dotted truthflow modules a source imports anywhere (lazy imports inside functions count).

    module: its own dotted name (a package's: <package>.__init__), for relative imports.
    """
    try:
        tree = ast.parse(source)
    except SyntaxError as exc:
        raise WorkflowError(f"cannot read the imports of {where}: {exc}")
    found = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            found.update(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                package = (module or "").split(".")[: -node.level]
                base = ".".join(package + ([base] if base else []))
            found.add(base)
            found.update(f"{base}.{alias.name}" for alias in node.names)
    return {name for name in found if _module_file(name)}


@functools.cache
def _module_closure(source, where):
    """Files of the truthflow modules a source imports, transitively, with their parent packages."""
    files, todo = set(), list(_imported_modules(source, where=where))
    while todo:
        parts = todo.pop().split(".")
        for i in range(1, len(parts) + 1):
            name = ".".join(parts[:i])
            path = _module_file(name)
            if path and path not in files:
                files.add(path)
                own = f"{name}.__init__" if path.name == "__init__.py" else name
                todo.extend(_imported_modules(path.read_text(), own, str(path)))
    return tuple(sorted(files))


class _RuleCode:
    """Input function: the package modules that the rule's script (or run block) imports, transitively."""

    def __call__(self, wildcards):
        job_rule = next(
            r for r in workflow.rules if any(item is self for item in r.input)
        )
        if job_rule.script:
            script = Path(job_rule.script)
            if not script.is_absolute():
                script = Path(job_rule.snakefile).parent / script
            source, where = script.read_text(), str(script)
        elif job_rule.shellcmd is None and job_rule.run_func_src:
            # a run: block counts the imports it makes itself
            source = textwrap.dedent(job_rule.run_func_src)
            where = f"the run: block of rule {job_rule.name}"
        else:
            return []
        files = _module_closure(source, where)
        return [os.path.relpath(path, Path.cwd()) for path in files]


def code():
    """The `code=` input of a rule: every truthflow module its script imports (directly or not), relative
    to the working directory, so editing one reruns exactly the jobs that import it."""
    return _RuleCode()


def model_dir(wildcards=None, model=None):
    return f"resources/models/{model or wildcards.model}"


def model_spec(model):
    return config["models"][model]


def local_source(kind, name):
    """A local dataset/model source as input, so editing the file reruns what depends on it."""
    src = config[kind][name]["source"]
    return [src["local"]] if "local" in src and Path(src["local"]).exists() else []


def gpu_resources(model):
    spec = model_spec(model)
    return {"gpu": spec["gpus"], "mem_mb": spec["mem_mb"], "runtime": spec["runtime"]}


def qa_pairs():
    """(model, dataset) pairs whose answers are generated and labelled."""
    models = sorted(set(config["pathways"]["models"])) or MODELS
    return [(m, d) for m in models for d in QA]


def all_targets():
    targets = [res("tables", "accuracy.tsv")] if qa_pairs() else []
    pw = config["pathways"]
    if pw["models"] and pw["datasets"]:
        targets += [
            res("tables", "pathways_summary.parquet"),
            res("tables", "dropped_samples.tsv"),
        ]
        for pair in config["figures"]["pathways"]:
            targets += [
                res("figures", f"{fig}_{pair_name(pair)}.png")
                for fig in (
                    "pathways",
                    "pathways_control",
                    "pathways_check",
                    "probe_auc",
                )
            ]
            targets += [
                res("figures", f"experiment_{fig}_{pair_name(pair)}.png")
                for fig in EXPERIMENT_FIGURES
            ]
    if config["depth"]["models"]:
        targets += [
            res("tables", "depth_per_question.parquet"),
            res("tables", "depth_pooled_by_depth.tsv"),
        ]
        if config["figures"]["depth"]:
            targets += [
                res("figures", "depth_mink_boxes.png"),
                res("figures", "depth_score_gap_density.png"),
            ]
    elif "depthqa" in config["datasets"]:
        targets.append(res("data", "depthqa.parquet"))
    if config["depth"]["models"] or (pw["models"] and pw["datasets"]):
        targets += [
            res("tables", "published_vs_reproduced.tsv"),
            res("tables", "benchmarks.tsv"),
        ]
    if pw["models"] and pw["datasets"]:
        targets += [
            res("tables", f"{t}.tsv")
            for t in (
                "pathways_check",
                "pathways_check_layers",
                "exact_tokens",
                "probe_auc",
                "pathways_experiments",
                "pathways_awareness",
                "pathways_table3",
            )
        ]
    return targets + report_tables(targets)


# report tables, shown inline as HTML (rule table_html): name -> (title, caption file in workflow/report)
REPORT_TABLES = {
    "accuracy": ("Accuracy", "accuracy.rst"),
    "pathways_check": (
        "Falsification test: E_Q knockout vs random control",
        "pathways_check_table.rst",
    ),
    "pathways_check_layers": (
        "Falsification test under each layer range",
        "pathways_check_layers.rst",
    ),
    "exact_tokens": ("Exact tokens per answer class", "exact_tokens.rst"),
    "pathways_experiments": (
        "Patching, answer-only, knowledge boundary, saliency per group",
        "pathways_experiments_table.rst",
    ),
    "pathways_awareness": (
        "Pathway awareness AUC by layer",
        "pathways_awareness_table.rst",
    ),
    "pathways_table3": (
        "Hallucination detection (the paper's Table 3)",
        "pathways_table3.rst",
    ),
    "probe_auc": ("Probe AUC by layer", "probe_auc_table.rst"),
    "dropped_samples": ("Kept and dropped samples", "dropped.rst"),
    "published_vs_reproduced": ("Published vs reproduced", "compare.rst"),
    "benchmarks": ("Benchmarks", "benchmarks.rst"),
}


def table_caption(name):
    text = Path(
        workflow.basedir, "workflow", "report", REPORT_TABLES[name][1]
    ).read_text()
    return " ".join(text.replace("``", "").split())


def report_tables(targets):
    """The inline HTML page of every report table that this run makes."""
    made = {Path(t).stem for t in targets if t.endswith(".tsv")}
    return [res("report", f"{name}.html") for name in REPORT_TABLES if name in made]


# the experiment figures of rule plot_experiments, one of each per model pair: figures/experiment_<name>_<pair>
EXPERIMENT_FIGURES = ("patching", "answer_only", "boundary", "saliency", "awareness")


def pair_name(pair):
    return "__".join(pair)


def pair_models(name):
    return name.split("__")


def pathways_caption(wildcards=None):
    pw = config["pathways"]
    ko = pw["knockout"]
    split = pw["anchor_split"] + (
        f" (K={pw['fixed_layer']})" if pw["anchor_split"] == "fixed_layer" else ""
    )
    return (
        f"knockout.mode={ko['mode']}"
        + (f" (w={ko['window']})" if ko["mode"] == "window" else "")
        + f", knockout.target={ko['target']}, control: {ko['control_draws']} matched random draws "
        f"(seed {ko['control_seed']}), anchor_split={split}, "
        f"exact_tokens.extractor={pw['exact_tokens']['extractor']}, probe: logistic regression "
        f"(C={pw['probe']['C']}), test_size={pw['probe']['test_size']}, seeds={pw['probe']['seeds']}, "
        f"95% CI: bootstrap n={pw['bootstrap']['n']} seed={pw['bootstrap']['seed']}"
    )


def depth_caption(wildcards=None):
    d = config["depth"]
    m = d["memorization"]
    judge = d["judge"]
    return (
        f"MIN-K% k={d['mink']['k_plot']} (grid {d['mink']['k_grid']}) on the raw question with BOS; "
        f"depthwise average = mean over a group's questions at each depth; judge backend={judge['backend']}"
        + (f" ({judge['model']})" if judge.get("model") else "")
        + f", max_new_tokens={d['max_new_tokens']}; score gap = (score(D3) - mean score(D2 predecessors))/4; "
        f"memorization subsets: D3 MIN-K% <= q{m['lower_quantile']} and >= q{m['upper_quantile']}"
    )


def check_gated_tokens():
    """Before any job: a gated hub model that is not prepared yet needs a token; name the model and variable."""
    from truthflow.models import INFO_FILE, check_gated_token

    used = set(config["pathways"]["models"]) | set(config["depth"]["models"])
    for name in sorted(used):
        if not Path(model_dir(model=name), INFO_FILE).exists():
            check_gated_token(name, model_spec(name)["source"])


def optional_input(part, path):
    """An analysis's table as input only when that analysis is configured."""
    active = bool(config[part]["models"]) and (
        part != "pathways" or bool(config["pathways"]["datasets"])
    )
    return [path] if active else []


def all_benchmarks(wildcards=None):
    """Benchmark files of every GPU job in the DAG."""
    paths = [
        res("benchmarks", "generate_answers", m, f"{d}.tsv") for m, d in qa_pairs()
    ]
    paths += [
        res("benchmarks", rule, m, f"{d}.tsv")
        for rule in ("extract_pathways", "extract_experiments")
        for m, d in pw_pairs()
    ]
    for m in config["depth"]["models"]:
        paths += [
            res("benchmarks", "score_mink", f"{m}.tsv"),
            res("benchmarks", "answer_depthqa", f"{m}.tsv"),
        ]
    return paths


def pw_dir(*parts):
    return res("pathways", "{model}", "{dataset}", *parts)


def pw_pairs():
    """(model, dataset) pairs of the pathways analysis, in one order for every aggregate."""
    pw = config["pathways"]
    return [(m, d) for m in pw["models"] for d in pw["datasets"]]


def pw_inputs(name):
    return [res("pathways", m, d, name) for m, d in pw_pairs()]


def judge_model_input():
    """The hf judge's model as input where depth.judge.model is a configured model's resources/models/<name>."""
    judge = config["depth"]["judge"]
    path = Path(str(judge.get("model")))
    prepared = path.parent == Path("resources/models") and path.name in config["models"]
    return [model_dir(model=path.name)] if judge["backend"] == "hf" and prepared else []


def depth_dir(*parts):
    return res("depth", "{model}", *parts)
