"""The answer jobs of a config (generate_answers per QA run, answer_depthqa per DepthQA model) as the workflow
runs them, on each answers backend (`generation.backend`: engine or vllm) side by side, and the verdict: which
backend finishes the config's answer jobs sooner on this machine.

    python benchmarks/bench_answers.py                            # the demo (config.yaml), both backends
    python benchmarks/bench_answers.py --rules answer_depthqa --repeat --models-dir /tmp/models

Each job runs its script file from workflow/scripts/ in a fresh process (one process per job, as Snakemake
starts it), with the `snakemake` object the job gets (the model entry's params and batch size, `backend` set
to the backend measured, the threads a local `snakemake --cores N` gives a model job here: --cores, default 8
as the README's demo command) and the environment Snakemake's shell gives a script job (OMP_NUM_THREADS and
the BLAS libraries' thread counts set to the rule's threads). The backends alternate which one runs first,
job by job. A job's time runs from the spawn of its process to its exit (with --repeat: to the end of the
job's own run): interpreter, imports, model load, vLLM's engine start, the first answers, the table written.
Its parts, timed where the job calls the package: start-up (the interpreter and the imports before the job's
main), load (`jobs.answer_model`: the engine's model, or vLLM's import and tokenizer), vLLM's engine start,
the answers and their new tokens/s, and with --repeat the answers again in the same process on the same
questions (the model kept); beside them the torch threads the job ran and its peak resident memory. Greedy
answers are compared between the backends question by question. Not measured: Snakemake's own start of a job
(the same for both backends), and jobs running side by side (a local run holds two model jobs at once on a
machine without a GPU).

The models are prepared as the workflow prepares them (`truthflow.models.prepare_model`, reused where
prepared) in --models-dir (default resources/models); the questions are read from the config's sources
(`truthflow.data`), as download_dataset and download_depthqa read them.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import platform
import resource
import subprocess
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
SCRIPTS = REPO / "workflow" / "scripts"
RULES = ("generate_answers", "answer_depthqa")
BACKENDS = ("engine", "vllm")
# what Snakemake's shell sets to the rule's threads in a script job's environment (snakemake/shell.py)
THREAD_VARIABLES = (
    "OMP_NUM_THREADS",
    "GOTO_NUM_THREADS",
    "OPENBLAS_NUM_THREADS",
    "MKL_NUM_THREADS",
    "VECLIB_MAXIMUM_THREADS",
    "NUMEXPR_NUM_THREADS",
)


def demo_config(path: str | Path) -> dict:
    """The config as the Snakefile checks it and fills its defaults."""
    import yaml

    from truthflow.preflight import prepare_config

    return prepare_config(yaml.safe_load(Path(path).read_text()), environ={})


def answer_jobs(config: dict, rules=RULES, models=None) -> list[tuple[str, str, str]]:
    """(rule, model, dataset) of every answer job the config runs: the runs the rules expand."""
    from truthflow import diskplan

    released = set(config["depth"].get("released_answers") or {})
    jobs = [("generate_answers", m, d) for m, d in diskplan.qa_runs(config)]
    jobs += [("answer_depthqa", m, "depthqa") for m in config["depth"]["models"] if m not in released]
    return [j for j in jobs if j[0] in rules and (not models or j[1] in models)]


def job_threads(cores: int) -> tuple[int, int]:
    """(threads, torch threads) of a model job of a local `snakemake --cores <cores>` on this machine."""
    from truthflow.scheduling import model_slots, model_threads, torch_threads, visible_gpus

    threads = model_threads(cores, model_slots(visible_gpus()))
    return threads, torch_threads(threads, cores, len(os.sched_getaffinity(0)))


def prepare_inputs(config: dict, jobs, folder: Path, models_dir: Path) -> dict[str, Path]:
    """The jobs' inputs: each dataset's questions table (as download_dataset / download_depthqa write it) in
    folder, and each model prepared in models_dir. Returns {dataset or model: path}."""
    from truthflow.data import load_depthqa, load_qa, resolve_source
    from truthflow.models import prepare_model

    paths = {}
    for dataset in sorted({d for _, _, d in jobs}):
        spec, _ = resolve_source(dataset, config["datasets"][dataset])
        table = load_depthqa(spec)[0] if dataset == "depthqa" else load_qa(dataset, spec)[0]
        paths[dataset] = folder / f"{dataset}.parquet"
        table.write_parquet(paths[dataset])
    for model in sorted({m for _, m, _ in jobs}):
        paths[model] = models_dir / model
        prepare_model(model, config["models"][model], paths[model])
    return paths


def job_spec(config: dict, job, backend: str, paths: dict, folder: Path, cores: int) -> dict:
    """What the job's `snakemake` object holds, as the rule (workflow/rules/generate.smk, depth.smk) gives
    it, with `backend` in its params."""
    from truthflow.depth import authors, prompts

    rule, model, dataset = job
    entry = config["models"][model]
    threads, torch_threads = job_threads(cores)
    name = f"{rule}.{model}.{dataset}.{backend}"
    params = {k: entry[k] for k in ("chat", "dtype", "attention", "token_budget", "chat_template_kwargs")}
    params |= {"max_prompt_tokens": config["generation"]["max_prompt_tokens"], "backend": backend}
    inputs = {"data": str(paths[dataset]), "model": str(paths[model])}
    if rule == "generate_answers":
        params |= {
            "max_new_tokens": entry["max_new_tokens"],
            "instruction": config["generation"]["instruction"],
        }
    else:
        depth = config["depth"]
        if authors.pending(depth["prompt"]):
            sys.exit(f"{depth['prompt']}: the authors' prompt file is made by rule authors_prompts first")
        inputs["prompt"] = str(prompts.resolve(depth["prompt"], "depth.prompt"))
        params |= {k: depth[k] for k in ("max_new_tokens", "decoding", "prompt_layout")}
    return {
        "rule": rule,
        "wildcards": {"model": model, "dataset": dataset},
        "input": inputs,
        "output": {"answers": str(folder / f"{name}.parquet"), "peaks": str(folder / f"{name}.peaks.tsv")},
        "params": params,
        "resources": {
            "torch_threads": torch_threads,
            "batch_size": entry["batch_size"],
            "gpu": entry["gpus"],
        },
        "threads": threads,
        "name": name,
    }


def run_job_here(spec_file: str) -> None:
    """In the job's own process: its script run as Snakemake runs it, timed where the job calls the package
    (the model load, vLLM's engine start, the answers), then with `repeat` the answers again, model kept."""
    import runpy

    import polars as pl
    import torch
    from snakemake.iocontainers import Namedlist

    from truthflow import jobs, vllm_answers

    spec = json.loads(Path(spec_file).read_text())
    got = {"ready_s": time.time() - spec["spawned"], "load_s": 0.0, "start_s": 0.0, "answers_s": []}
    kept = []
    answer_model, answer_questions = jobs.answer_model, jobs.answer_questions
    start = vllm_answers.VllmModel.start

    def timed_model(sm):
        if kept:
            return kept[0]
        t0 = time.perf_counter()
        kept.append(answer_model(sm))
        got["load_s"] = time.perf_counter() - t0
        return kept[0]

    def timed_start(self, max_model_len):
        t0 = time.perf_counter()
        start(self, max_model_len)
        got["start_s"] += time.perf_counter() - t0

    def timed_answers(lm, *args, **kwargs):
        t0 = time.perf_counter()
        out = answer_questions(lm, *args, **kwargs)
        got["answers_s"].append(time.perf_counter() - t0)
        got["backend"] = getattr(lm, "backend", "engine")
        return out

    jobs.answer_model, jobs.answer_questions = timed_model, timed_answers
    vllm_answers.VllmModel.start = timed_start
    sm = type("Snakemake", (), {})()
    for key in ("input", "output", "params", "wildcards", "resources"):
        setattr(sm, key, Namedlist(fromdict=spec[key]))
    sm.log, sm.threads, sm.rule = Namedlist(), spec["threads"], spec["rule"]
    script = str(SCRIPTS / f"{spec['rule']}.py")
    runpy.run_path(script, init_globals={"snakemake": sm}, run_name="__main__")
    got["job_s"] = time.time() - spec["spawned"]
    table = pl.read_parquet(spec["output"]["answers"])
    got["answers"] = table["answer"].to_list()
    got["new_tokens"] = int(table["n_new_tokens"].sum())
    got["peak_rss_mb"], got["torch_threads"] = peak_rss_mb(), torch.get_num_threads()
    if spec.get("repeat"):
        runpy.run_path(script, init_globals={"snakemake": sm}, run_name="__main__")
        got["repeat_same"] = pl.read_parquet(spec["output"]["answers"])["answer"].to_list() == got["answers"]
    Path(spec["result"]).write_text(json.dumps(got))


def peak_rss_mb() -> float:
    """This process's peak resident memory in MiB: Linux's VmHWM, which starts afresh at exec (getrusage's
    ru_maxrss, which the job's peaks file holds, keeps the peak of the process that spawned it)."""
    with contextlib.suppress(OSError, StopIteration):
        status = Path("/proc/self/status").read_text().splitlines()
        return int(next(line for line in status if line.startswith("VmHWM:")).split()[1]) / 1024
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024


def run_job(spec: dict, folder: Path, repeat: bool = False) -> dict:
    """The job in a fresh process; its figures, with wall_s from spawn to exit. Its output goes to a log in
    folder, whose last lines are printed if it fails."""
    spec = {**spec, "repeat": repeat, "result": str(folder / f"{spec['name']}.result.json")}
    spec_file, log = folder / f"{spec['name']}.job.json", folder / f"{spec['name']}.log"
    env = {
        **os.environ,
        "PYTHONPATH": os.pathsep.join(filter(None, [str(REPO / "src"), os.environ.get("PYTHONPATH")])),
        **dict.fromkeys(THREAD_VARIABLES, str(spec["threads"])),
    }
    with open(log, "w") as out:
        spec["spawned"] = time.time()
        spec_file.write_text(json.dumps(spec))
        t0 = time.perf_counter()
        done = subprocess.run(
            [sys.executable, __file__, "--run-job", str(spec_file)],
            stdout=out,
            stderr=subprocess.STDOUT,
            env=env,
            cwd=REPO,
        )
        wall = time.perf_counter() - t0
    if done.returncode:
        tail = "\n".join(log.read_text(errors="replace").splitlines()[-20:])
        sys.exit(f"{spec['name']} failed with exit code {done.returncode}; the end of {log}:\n{tail}")
    return {**json.loads(Path(spec["result"]).read_text()), "wall_s": wall}


def orders(n: int, backends) -> list[tuple[str, ...]]:
    """Which backend runs first, job by job: the given order, then reversed, and so on."""
    return [tuple(backends) if i % 2 == 0 else tuple(reversed(backends)) for i in range(n)]


def machine(threads: tuple[int, int]) -> str:
    """The CPU (its model name where Linux gives it), its CPUs and load, the jobs' threads, vLLM's build."""
    from truthflow.answer_backend import vllm_label

    cpu = platform.processor() or platform.machine()
    with contextlib.suppress(OSError):
        names = [
            line for line in Path("/proc/cpuinfo").read_text().splitlines() if line.startswith("model name")
        ]
        cpu = names[0].split(":", 1)[1].strip() if names else cpu
    return (
        f"{cpu}, {len(os.sched_getaffinity(0))} CPUs, load {os.getloadavg()[0]:.1f}; a job's threads "
        f"{threads[0]}, torch threads {threads[1]}; {vllm_label() or 'vLLM not installed'}"
    )


def job_line(backend: str, got: dict) -> str:
    """A job's figures on one backend: wall, then its parts (load, engine start, answers, tokens/s)."""
    first = got["answers_s"][0] - got["start_s"]
    parts = [f"start-up {got['ready_s']:.1f} s", f"load {got['load_s']:.1f} s"]
    if got["start_s"]:
        parts.append(f"engine start {got['start_s']:.1f} s")
    parts.append(f"answers {first:.1f} s = {got['new_tokens'] / first:.1f} new tokens/s")
    if len(got["answers_s"]) > 1:
        again = got["answers_s"][1]
        same = "same answers" if got["repeat_same"] else "answers differ"
        parts.append(f"repeat {again:.1f} s = {got['new_tokens'] / again:.1f} new tokens/s ({same})")
    fell = "" if got["backend"] == backend else f" (answered by the {got['backend']}: vLLM refused)"
    parts.append(f"{got['torch_threads']} torch threads, peak RSS {got['peak_rss_mb']:,.0f} MiB")
    return f"    {backend:<7} job {job_seconds(got):6.1f} s{fell}: {', '.join(parts)}"


def job_seconds(got: dict) -> float:
    """The job's wall seconds: spawn to exit, or with a repeat, spawn to the end of the job's own run."""
    return got["job_s"] if len(got["answers_s"]) > 1 else got["wall_s"]


def agreement(results: dict) -> str:
    """How many answers every backend gives alike (greedy: the same question, the same answer expected)."""
    answers = [got["answers"] for got in results.values()]
    same = sum(len(set(a)) == 1 for a in zip(*answers, strict=True))
    return f"{same}/{len(answers[0])} answers identical"


def compare(config: dict, jobs, backends, paths: dict, folder: Path, cores: int, repeat: bool = False):
    """Each job on each backend, alternating which goes first; prints each job's figures as they come and
    returns {job: {backend: figures}}."""
    results = {}
    for job, order in zip(jobs, orders(len(jobs), backends), strict=True):
        got = {b: run_job(job_spec(config, job, b, paths, folder, cores), folder, repeat) for b in order}
        results[job] = {b: got[b] for b in backends}
        rule, model, dataset = job
        tokens = "; ".join(f"{b} {got[b]['new_tokens']}" for b in backends)
        print(
            f"  {rule} {model}/{dataset}: {len(got[order[0]]['answers'])} questions, new tokens {tokens}, "
            f"{agreement(got)}",
            flush=True,
        )
        for b in backends:
            print(job_line(b, got[b]), flush=True)
    return results


def totals(results: dict, backends) -> None:
    """Wall seconds per backend summed over the jobs, by rule and in all, and the verdict."""
    print("\n  total job seconds (spawn to exit, or to the end of the job's run where repeated):", flush=True)
    print(f"  {'':<26}" + "".join(f"{b:>10}" for b in backends))
    for rule in RULES:
        rows = [r for job, r in results.items() if job[0] == rule]
        if rows:
            sums = [sum(job_seconds(r[b]) for r in rows) for b in backends]
            print(f"  {f'{rule} x {len(rows)}':<26}" + "".join(f"{s:10.1f}" for s in sums))
    sums = {b: sum(job_seconds(r[b]) for r in results.values()) for b in backends}
    print(f"  {f'all {len(results)} jobs':<26}" + "".join(f"{sums[b]:10.1f}" for b in backends))
    if len(backends) == 2:
        fast, slow = sorted(backends, key=sums.get)
        print(
            f"  verdict: the {fast} finishes these jobs in {sums[fast] / sums[slow]:.0%} of the {slow}'s "
            f"time ({sums[slow] - sums[fast]:.0f} s less)",
            flush=True,
        )


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--config", default=str(REPO / "config.yaml"))
    ap.add_argument("--rules", nargs="+", choices=RULES, default=list(RULES))
    ap.add_argument("--models", nargs="*", help="default: every model with an answer job")
    ap.add_argument("--backends", nargs="+", choices=BACKENDS, default=list(BACKENDS))
    ap.add_argument("--models-dir", default=str(REPO / "resources" / "models"))
    ap.add_argument("--cores", type=int, default=8, help="the run's --cores: sets the jobs' threads")
    ap.add_argument("--repeat", action="store_true", help="also the answers again, in the same process")
    ap.add_argument("--workdir", help="where the temporary folder goes (default: TMPDIR)")
    ap.add_argument("--run-job", help=argparse.SUPPRESS)
    args = ap.parse_args()
    sys.path.insert(0, str(REPO / "src"))
    if args.run_job:
        return run_job_here(args.run_job)
    config_file, models_dir = Path(args.config).resolve(), Path(args.models_dir).resolve()
    workdir = args.workdir and Path(args.workdir).resolve()
    os.chdir(REPO)  # the config's local sources are relative to the checkout, as for Snakemake
    config = demo_config(config_file)
    jobs = answer_jobs(config, args.rules, args.models)
    with tempfile.TemporaryDirectory(prefix="bench_answers.", dir=workdir) as tmp:
        paths = prepare_inputs(config, jobs, Path(tmp), models_dir)
        print(
            f"{len(jobs)} answer jobs of {config_file.name}, one fresh process each, on "
            f"{machine(job_threads(args.cores))}",
            flush=True,
        )
        results = compare(config, jobs, args.backends, paths, Path(tmp), args.cores, args.repeat)
    totals(results, args.backends)


# vLLM may spawn its engine process, which imports this file again: only the bench itself runs main
if __name__ == "__main__":
    main()
