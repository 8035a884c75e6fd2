import functools
import modulefinder
import os
from pathlib import Path

SRC = str(CHECKOUT / "src")  # on sys.path since the Snakefile
# script jobs (local, SLURM or in a conda env) import the package from this checkout, before an installed one
os.environ["PYTHONPATH"] = os.pathsep.join(filter(None, [SRC, os.environ.get("PYTHONPATH")]))


envvars:
    "PYTHONPATH",


from truthflow import answer_backend, diskplan, job_requests, registry, sizing  # noqa: E402
from truthflow.pathways import states  # noqa: E402
from truthflow.depth import authors, prompts  # noqa: E402
from truthflow.report_tables import TABLES as REPORT_TABLES, caption as table_caption  # noqa: E402
from truthflow.scheduling import model_slots, model_threads, torch_threads, visible_gpus  # noqa: E402

# the config as the Snakefile checked it and filled its defaults (truthflow.preflight.prepare_config)
RUN = config["run"]
MODELS = list(config["models"])
# the models of depth.released_answers: their answers are read from a released file, not generated
RELEASED = config["depth"]["released_answers"]


def _local_cores():
    """--cores of a local run; None for a cluster run or an invocation without cores (--report)."""
    try:
        cores = workflow.cores
    except WorkflowError:
        return None
    return cores if isinstance(cores, int) and cores < 1024 else None


# model jobs share local cores by slots, one per visible GPU (scheduling.model_slots): read off the machine,
# as Snakemake offers no API to read --resources; cluster profiles set threads (set-threads)
_cores = _local_cores()
MODEL_THREADS = model_threads(_cores, model_slots(visible_gpus()))
_cpus = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count() or 1
TORCH_THREADS = torch_threads(MODEL_THREADS, _cores, _cpus)


def model_spec(model):
    return config["models"][model]


def model_params(*keys):
    """These keys of a model job's model entry (models.<name>.<key>), as its params or resources."""
    return {key: lambda w, key=key: model_spec(w.model)[key] for key in keys}


def answer_backend_param(wildcards):
    """Which backend writes this model's answers (generation.backend, models.<name>.backend): a param, so a
    change of backend reruns the answers."""
    return answer_backend.backend_for(config, wildcards.model)


def model_gpus(wildcards):
    return model_spec(wildcards.model)["gpus"]


KEEP_STATES = config["pathways"]["keep_states"]

# A run's order: CPU steps before model jobs (else they wait for a free core), then the model stages in the
# order the disk plan simulates (truthflow.diskplan.GPU_PRIORITY): with the states kept, breadth-first
# (answers and DepthQA jobs, knockouts, experiments), so the run ends on its shortest jobs; with the states
# removed after their last reader, a run's experiments before the next run's knockout, so few runs hold
# states at once.
PRIORITY = {"step": 10, **diskplan.GPU_PRIORITY[KEEP_STATES]}


# the settings of the readers of the residual states: their params, and what each records beside its outputs
READER_SETTINGS = {
    "probe_deltap": {k: config["pathways"][k] for k in ("probe", "anchor_split", "fixed_layer", "bootstrap", "check")},
    "pathway_experiments": {k: config["pathways"][k] for k in ("experiments", "probe", "bootstrap")},
}
READER_SETTINGS_FILE = {reader: record for reader, (record, _) in states.READERS.items()}


def warn_reextraction():
    """Before any job (at parse, so a dry run says it too): the runs whose removed states a reader with
    changed settings needs again (truthflow.pathways.states)."""
    run_dirs = {(m, d): Path(pw_dir().format(model=m, dataset=d)) for m, d in pw_runs()}
    if message := states.reextraction_message(states.reextractions(run_dirs, READER_SETTINGS)):
        print(message, file=sys.stderr)


def state_file(path):
    """A residual-state output: removed by Snakemake after its last reader unless pathways.keep_states."""
    return path if KEEP_STATES else temp(path)


@functools.cache
def _analysis_requests(model, dataset):
    return sizing.requests(config, model, dataset)


def analysis_threads(rule_name):
    """The threads of an analysis job (probe_deltap, pathway_experiments), from the shapes it reads."""
    return lambda w: _analysis_requests(w.model, w.dataset)[rule_name].threads


# Every priced job's runtime and memory follow from the bill's figures (truthflow.job_requests), grow with
# each attempt, and a job past the cluster's runtime limit is refused here, before any job
@functools.cache
def _job_seconds():
    """Each model and analysis job's wall seconds as the bill prices them, once per invocation."""
    from truthflow.pricing import job_seconds

    return job_seconds(config)


@functools.cache
def _asks():
    return job_requests.asks(config, _job_seconds())


def _ask(rule_name, wildcards):
    key = (rule_name, wildcards.model, getattr(wildcards, "dataset", registry.DEPTHQA))
    return _asks()[key]


def request_runtime(rule_name):
    """A job's runtime (minutes): its estimate times cluster.runtime_margin, times the attempt."""
    limit = job_requests.limit_minutes(config)
    return lambda wildcards, attempt: _ask(rule_name, wildcards).runtime(attempt, limit)


def request_mem_mb(rule_name):
    """A job's memory (MiB): the plan's peak for it, grown by MEMORY_GROWTH on each attempt."""
    return lambda wildcards, attempt: _ask(rule_name, wildcards).memory(attempt)


def check_runtime_limit():
    """At parse, so a dry run refuses too: on a cluster no job may need more than its longest runtime."""
    if not _run_settings()[1]:
        return
    try:
        job_requests.check_runtimes(config, _asks())
    except TruthflowError as exc:
        raise WorkflowError(f"invalid config: {exc}")


def model_resources(rule_name):
    """The resources of a model job: its runtime and memory from the bill, its torch threads and batch size
    (each rule names its `gpu` resource, which the SLURM profiles key on)."""
    return dict(
        torch_threads=TORCH_THREADS,
        runtime=request_runtime(rule_name),
        mem_mb=request_mem_mb(rule_name),
        **model_params("batch_size"),
    )


def results_path(*parts):
    """Every results path is built here: results/{run}/<parts>."""
    return str(Path("results", RUN, *parts))


def checkout_path(*parts):
    """A checkout file as an input path relative to the working directory (survives a moved checkout)."""
    return os.path.relpath(CHECKOUT.joinpath(*parts), Path.cwd())


def figures(category, names, suffix=""):
    """Outputs <name>_png/_pdf: figures/<name><suffix>.png/.pdf, captioned by workflow/report/<name>.rst."""
    out = {}
    for name in names:
        caption = str(CHECKOUT / "workflow" / "report" / f"{name}.rst")
        png = results_path("figures", f"{name}{suffix}.png")
        out[f"{name}_png"] = report(png, category=category, caption=caption)
        out[f"{name}_pdf"] = results_path("figures", f"{name}{suffix}.pdf")
    return out


def captions(names):
    """figures(names)' caption files as inputs <name>_caption: editing one redraws its figure."""
    return {f"{n}_caption": checkout_path("workflow", "report", f"{n}.rst") for n in names}


@functools.cache
def _script_modules(script):
    """The truthflow files a script imports, transitively (imports inside functions count)."""
    finder = modulefinder.ModuleFinder(path=[SRC])
    try:
        finder.run_script(script)
    except SyntaxError as exc:
        raise WorkflowError(f"cannot read the imports of {exc.filename}: {exc.msg} (line {exc.lineno})")
    files = {m.__file__ for name, m in finder.modules.items() if name.split(".")[0] == "truthflow"}
    return sorted(os.path.relpath(f, Path.cwd()) for f in files if f)


def code_inputs(script):
    """The input `code` of a script's rules, the truthflow modules workflow/scripts/<script> imports, so an
    edit to one reruns exactly its importers (Snakemake watches the script alone); found as a job is planned.
    prepare_model takes none (PREPARE_VERSION keys it)."""
    path = str(CHECKOUT / "workflow" / "scripts" / script)
    return lambda wildcards: _script_modules(path)


def model_dir(wildcards=None, model=None):
    return f"resources/models/{model or wildcards.model}"


def local_source(name):
    """A local dataset source as input, so editing the file reruns what depends on it."""
    src = config["datasets"][name]["source"]
    return [src["local"]] if "local" in src and Path(src["local"]).exists() else []


def qa_runs():
    """The runs, (model, dataset), whose answers are generated and labelled: the bill and the disk plan
    walk the same (truthflow.diskplan)."""
    return diskplan.qa_runs(config)


def pw_runs():
    """The runs, (model, dataset), of the pathways analysis, in one order for every aggregate."""
    return diskplan.pw_runs(config)


def used_models():
    """The models a run prepares (the inputs table lists each)."""
    return diskplan.used_models(config)


def used_datasets():
    """The datasets a run reads (the inputs table lists each)."""
    qa = {d for _, d in qa_runs()} | {d for _, d in pw_runs()}
    depthqa = ["depthqa"] if config["depth"]["models"] or RELEASED else []
    return sorted(qa) + depthqa


def pw_dir(*parts):
    return results_path("pathways", "{model}", "{dataset}", *parts)


def per_run(path, runs=None):
    """A {model}/{dataset} path for each run of the pathways analysis (or of `runs`), in their order."""
    return [path.format(model=m, dataset=d) for m, d in (pw_runs() if runs is None else runs)]


def depth_dir(*parts):
    return results_path("depth", "{model}", *parts)


def optional_inputs(active, rule, *names, **renamed):
    """A table rule's outputs `names` (`renamed`: input=output) as inputs, where `active` (runs, models)."""
    outputs = {name: name for name in names} | renamed
    return {key: [getattr(rule.output, name)] if active else [] for key, name in outputs.items()}


def prompt_file(value, key):
    """The prompt file config key `key` names, resolved as its readers do, as an input (edits rerun them);
    one of the authors' prompt files not made yet as is, for rule authors_prompts to make."""
    return str(value if authors.pending(value) else prompts.resolve(value, key))


def judge_model_input():
    """An hf judge's model as input where depth.judge.model is a configured model's dir (resources/models)."""
    from truthflow.judge_cost import judge_model

    if config["depth"]["judge"]["backend"] != "hf":
        return []
    name, _, prepared = judge_model(config)  # the bill prices the same judge model
    return [model_dir(model=name)] if prepared else []


def generated_answers():
    """Every answers table a model job generates: each QA run's (answers and pathways analyses) and each
    DepthQA model's not read from a released file."""
    runs = sorted(set(qa_runs()) | set(pw_runs()))
    depth = [m for m in config["depth"]["models"] if m not in RELEASED]
    return per_run(rules.generate_answers.output[0], runs) + [
        rules.answer_depthqa.output[0].format(model=m) for m in depth
    ]


def depth_answers(wildcards):
    """A model's answers (qid, answer, depth): read from its released file, else generated."""
    if wildcards.model in RELEASED:
        return rules.released_answers.output.answers
    return rules.answer_depthqa.output[0]


def judged_questions(wildcards):
    """The questions and references the judge reads: a released file's own (as its authors judged them)."""
    if wildcards.model in RELEASED:
        return rules.released_answers.output.questions
    return rules.download_depthqa.output.questions


def benchmarked_jobs():
    """(rule, wildcards) of every job with a benchmark directive (the model jobs, probe_deltap and
    pathway_experiments; each writes its exact `peaks`), in the benchmark table order."""
    benchmarked = [r for r in workflow.rules if r.benchmark]
    jobs = [
        (r.name, dict(model=m, dataset=d))
        for r in benchmarked
        if "dataset" in r.wildcard_names
        for m, d in {"generate": qa_runs(), "pathways": pw_runs()}[Path(r.snakefile).stem]
    ]
    depth = [r.name for r in benchmarked if "dataset" not in r.wildcard_names]
    return jobs + [(name, dict(model=m)) for m in config["depth"]["models"] for name in depth]


def all_targets():
    """Every output of the configured analyses, read off the rules that make them."""
    depth, released = config["depth"]["models"], config["depth"]["released_answers"]
    made = [rules.accuracy_table] if qa_runs() else []
    if pw_runs():
        made += [rules.pathways_tables, rules.experiment_tables]
    if depth:
        made += [rules.depth_tables] + ([rules.plot_depth] if config["figures"]["depth"] else [])
    elif "depthqa" in config["datasets"]:
        made.append(rules.download_depthqa)
    if released:
        made.append(rules.released_metrics)
    if depth or pw_runs() or released:
        made += [rules.compare_published, rules.front_page]
    if depth or pw_runs():
        made.append(rules.benchmark_table)
    if depth or pw_runs() or released or qa_runs():
        made.append(rules.input_revisions)
    targets = [str(f) for r in made for f in r.output]
    if pw_runs():
        pairs = [pair_name(p) for p in config["figures"]["pathways"]]
        targets += expand([*rules.plot_pathways.output, *rules.plot_experiments.output], pair=pairs)
    tables = [t for t in REPORT_TABLES if results_path("tables", f"{t}.tsv") in targets]
    return targets + expand(rules.table_html.output[0], table=tables)


def display_names(models):
    return {m: model_spec(m).get("display_name", m) for m in models}


def pair_name(pair):
    """A {pair} of figures: two models side by side."""
    return "__".join(pair)


def pair_models(name):
    return name.split("__")


def pathways_caption(wildcards=None):
    pw, ko = config["pathways"], config["pathways"]["knockout"]
    split = pw["anchor_split"] + (f" (K={pw['fixed_layer']})" if pw["anchor_split"] == "fixed_layer" else "")
    window = f" (w={ko['window']})" if ko["mode"] == "window" else ""
    return (
        f"knockout.mode={ko['mode']}{window}, knockout.target={ko['target']}, control draws: "
        f"{ko['control_draws']} (matched random, seed {ko['control_seed']}), anchor_split={split}, "
        f"exact_tokens.extractor={pw['exact_tokens']['extractor']}, probe: logistic regression "
        f"(C={pw['probe']['C']}), test_size={pw['probe']['test_size']}, seeds={pw['probe']['seeds']}, "
        f"95% CI: bootstrap n={pw['bootstrap']['n']} seed={pw['bootstrap']['seed']}"
    )


def decoding_text(d):
    """A decoding section (depth.decoding, depth.judge.decoding) as a caption says it."""
    if d.get("mode", "greedy") == "greedy":
        return "greedy"
    penalty = f", repetition penalty {rp}" if (rp := d.get("repetition_penalty", 1.0)) != 1.0 else ""
    return f"sampled (temperature {d['temperature']}, top_p {d['top_p']}{penalty}, seed {d['seed']})"


def depth_caption(wildcards=None):
    d = config["depth"]
    m = d["memorization"]
    judge = d["judge"]
    verdicts = f", {judge['judgments']} verdicts per answer" if judge["judgments"] > 1 else ""
    return (
        f"MIN-K% k={d['mink']['k_plot']} (grid {d['mink']['k_grid']}) on the raw question with BOS; "
        f"depthwise average = mean over a group's questions at each depth; "
        f"answers {decoding_text(d['decoding'])}, max_new_tokens={d['max_new_tokens']}, "
        f"prompt {Path(d['prompt']).name}; judge backend={judge['backend']}"
        + (f" ({judge['model']})" if judge.get("model") else "")
        + f", {decoding_text(judge['decoding'])}{verdicts}; "
        f"score gap = (score(D3) - mean score(D2 predecessors))/4; "
        f"memorization subsets: D3 MIN-K% <= q{m['lower_quantile']} and >= q{m['upper_quantile']}"
    )


def finished_message():
    """What a finished run prints last: where its figures are and how to browse them with their captions."""
    figures = Path(results_path("figures"))
    shown = sorted(f.name for f in figures.glob("*.png"))
    listing = "".join(f"\n  {figures / name}" for name in shown)
    return (
        f"truthflow: {len(shown)} figures in {figures}/{listing}\n"
        "Every figure and table with its caption, in one HTML report: snakemake --report report.zip"
    )


def _run_settings():
    """(GPU jobs at once at most, on a cluster?) of this invocation. Snakemake has no documented API for the
    --jobs and --resources a profile gives; workflow.resource_settings and global_resources hold them (pinned
    Snakemake range). A cluster run (no local cores) runs up to --jobs at once, fewer where the profile caps
    the `gpu` resource; a local run one model job per visible GPU (scheduling.model_slots)."""
    settings = getattr(workflow, "resource_settings", None)
    nodes = getattr(settings, "nodes", None)
    gpu_cap = getattr(getattr(workflow, "global_resources", {}).get("gpu"), "value", None)
    # a cluster run gives --jobs and no cores; its dry run gets one core from Snakemake
    if nodes and (_local_cores() is None or dry_run()):
        return min(int(nodes), int(gpu_cap)) if isinstance(gpu_cap, int) else int(nodes), True
    return max(1, visible_gpus()), False


def _job_done(key):
    """Whether a planned job (rule, model, dataset) has run: its outputs exist, the residual states aside
    (removed after their last reader when keep_states is false, and not a reason to rerun)."""
    rule_name, model, dataset = key
    outputs = getattr(rules, rule_name).output
    kept = [path for name, path in outputs.items() if not name.startswith("resid_")]
    return all(Path(str(path).format(model=model, dataset=dataset)).exists() for path in kept)


def disk_plan():
    """The disk plan of what this invocation will still write (truthflow.diskplan), at the concurrency it
    runs with: on a cluster the largest peak over 1 to its GPU jobs at once (its queue decides how many run
    together), locally its GPUs; the jobs whose outputs exist and the models prepared already write nothing."""
    slots, cluster = _run_settings()
    seconds = _job_seconds()
    done = {job.key for job in diskplan.jobs(config, seconds) if _job_done(job.key)}
    prepared = {m for m in used_models() if Path(model_dir(model=m)).exists()}
    kwargs = dict(seconds=seconds, done=done, prepared=prepared)
    if cluster:
        return diskplan.worst_plan(config, slots, **kwargs)
    return diskplan.plan(config, slots, **kwargs)


def check_disk_space():
    """Before any job: refuse a run whose planned peak disk exceeds the free space (truthflow.preflight)."""
    from truthflow.preflight import check_disk, free_space

    try:
        check_disk(config, disk_plan(), free_space(config))
    except TruthflowError as exc:
        raise WorkflowError(str(exc))


def dry_run():
    """Whether Snakemake was asked for a dry run. It runs `onstart` only for real runs, and a Snakefile has no
    documented way to know it is parsed for a dry run: the command line says it (tests/test_disk_preflight.py
    test_dry_run_prints_the_refusal)."""
    args = sys.argv[1:]
    # short flags bundled as in -np; one that takes a value (-j4, -c2) is not letters only
    bundled = [a[1:] for a in args if a.startswith("-") and not a.startswith("--") and a[1:].isalpha()]
    return "--dry-run" in args or "--dryrun" in args or any("n" in flags for flags in bundled)


def print_dry_run_plan():
    """In a dry run: who answers (vLLM or the engine, per model), and the disk plan's line with the refusal the
    real run would give (the dry run goes on)."""
    from truthflow.preflight import disk_line, disk_refusal, free_space

    if not dry_run():
        return
    answering = {m for m, _ in set(qa_runs()) | set(pw_runs())}
    answering |= {m for m in config["depth"]["models"] if m not in RELEASED}
    if answering:
        print(answer_backend.plan_line(config, sorted(answering)), file=sys.stderr)
    if not config["disk"]["check"]:
        return
    planned, free = disk_plan(), free_space(config)
    print(disk_line(planned, free, disk_refusal(config, planned, free)), file=sys.stderr)


def check_gated_tokens():
    """Before any job: a gated hub model not prepared yet needs a token; name the model and the variable."""
    from truthflow.models import INFO_FILE, check_gated_token

    try:
        for name in used_models():
            if not Path(model_dir(model=name), INFO_FILE).exists():
                check_gated_token(name, model_spec(name)["source"])
    except TruthflowError as exc:
        raise WorkflowError(str(exc))


def check_revisions():
    """Before any job: a hub source left unpinned that now resolves to another commit than the one this run
    recorded (a prepared model's, a dataset's) is named, with both commits."""
    import json

    from truthflow.hub import changed_revisions
    from truthflow.prepared import INFO_FILE

    paths = [Path(model_dir(model=m), INFO_FILE) for m in used_models()]
    paths += [Path(results_path("data", f"{d}.source.json")) for d in used_datasets()]
    records = [json.loads(path.read_text()) for path in paths if path.exists()]
    records = [r.get("resolved", r) | {"name": r["name"]} for r in records]
    for line in changed_revisions(records):
        print(f"truthflow: {line}", file=sys.stderr)


# a front-page row's kind (truthflow.compare) -> what shows it: a figure, (rule, output) drawn per model pair or
# for the depth models, or a report table (rule table_html)
FRONT_PAGE_FIGURES = {
    "delta_p": ("plot_pathways", "pathways_png"),
    "eq_vs_control": ("plot_pathways", "pathways_check_png"),
    **{k: ("plot_experiments", f"experiment_{k}_png") for k in ("patching", "answer_only", "awareness")},
    **dict.fromkeys(("median_mink", "mink_rises"), ("plot_depth", "depth_mink_boxes_png")),
}
FRONT_PAGE_TABLES = {
    "detection": "pathways_table3",
    **dict.fromkeys(("mean_score", "forward_discrepancy", "backward_discrepancy"), "depth_metrics"),
}


def front_page_links():
    """kind -> model -> the file name of the report item that shows the model's front-page row (Snakemake
    names a report item's link target after its file)."""
    links = {}

    def add(kind, models, path):
        for model in models:
            links.setdefault(kind, {}).setdefault(model, Path(path).name)

    for kind, (rule_name, name) in FRONT_PAGE_FIGURES.items():
        path = getattr(getattr(rules, rule_name).output, name)
        if rule_name == "plot_depth":
            add(kind, config["figures"]["depth"], path)
        else:
            for pair in config["figures"]["pathways"]:
                add(kind, pair, path.format(pair=pair_name(pair)))
    table_page = rules.table_html.output[0]
    for kind, table in FRONT_PAGE_TABLES.items():
        if kind == "detection":
            add(kind, config["pathways"]["models"], table_page.format(table=table))
        else:
            add(kind, config["depth"]["models"], table_page.format(table=table))
            add(kind, RELEASED, table_page.format(table="depth_released_metrics"))
    return links
