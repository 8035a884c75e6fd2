"""The bill, its pricing and the disk plan (truthflow.bill, truthflow.pricing, truthflow.diskplan), each
formula on a hand-computed case."""

from __future__ import annotations

import json
import re

import pytest
from conftest import DEMO_MODELS, REPO, throughput_rows

from truthflow import bill, decoding_cost, diskplan, pricing, sizing
from truthflow.memplan import Dims

# 2 layers, hidden 4, 1 head of 4 (1 KV head), intermediate 8, vocab 10, untied: parameters by hand
# attention 4*4*2*(1+1) = 64, MLP 3*4*8 = 96, norms 8: 168 per layer, x2 = 336; embeddings 2*10*4 = 80; norm 4
TOY = Dims(layers=2, hidden=4, heads=1, kv_heads=1, head_dim=4, intermediate=8, vocab=10)


def test_decode_work_by_hand():
    assert TOY.params == 420
    # bf16: weights 840 bytes, KV 2 * 2 layers * 1 head * 4 * 2 bytes = 32 bytes a token
    assert decoding_cost.kv_bytes(TOY, "bfloat16") == 32
    # 2 new tokens at batch 2 after a 3-token prompt: 2 * 840 / 2 + 32 * (2 * 3 + 2 * 3 / 2) = 840 + 288
    assert decoding_cost.decode_work(TOY, "bfloat16", 2, 3, 2) == pytest.approx(1128)
    # the budget binds: 1024 // (24 + 64) = 11 rows, not 64
    assert decoding_cost.decode_batch(64, 1024, 24, 64) == 11


def test_decode_step_cost_fitted_through_two_rows():
    """Two rows whose step times are 10 ms + bytes / 1 GB/s are fitted back to (0.010 s, 1e-9 s/byte)."""
    rows = []
    for batch in (2, 8):
        work = decoding_cost.decode_work(TOY, "bfloat16", batch, 16, 64)  # bytes per answer
        step = 0.010 + work * batch / 64 * 1e-9
        rows.append(
            (
                TOY,
                {
                    "samples_per_s": batch / (64 * step),
                    "max_new_tokens": 64,
                    "settings": f"batch {batch}, token budget 100000",
                    "dtype": "bfloat16",
                },
            )
        )
    fixed, per_byte = decoding_cost.step_cost(rows)
    assert fixed == pytest.approx(0.010)
    assert per_byte == pytest.approx(1e-9)
    # an answer of 1,024 tokens at batch 4 after 100: 1,024 * 0.010 / 4 + 1e-9 * its bytes read
    work = 1024 * 840 / 4 + 32 * (1024 * 100 + 1024 * 1025 / 2)
    assert decoding_cost.answers_seconds(TOY, "bfloat16", 4, 100, 1024, (fixed, per_byte)) == pytest.approx(
        2.56 + work * 1e-9
    )


def test_a_vllm_answers_line_by_hand():
    """Llama-3-8B of paper-pathways (generation.backend vllm) on PopQA on an H200: 14,267 answers of 64 new
    tokens after 24, 64 rows at once (the vLLM plan holds them). An answer's share of the bytes read: 64
    steps x 16,060,522,496 bytes of weights / 64 rows + 131,072 bytes of KV a token x (64 x 24 + 64 x 65 / 2)
    = 16,534,478,848 at 60% of 4.8 TB/s = 5.741 ms; its decode FLOPs, 2 x 8,030,261,248 x 64 at 50% of 989
    TFLOP/s, 2.079 ms, the smaller; its prefill, 2 x 8,030,261,248 x 24 at the same, 0.779 ms: 6.521 ms, x
    14,267 = 93.03 s, + a 60 s start = 153.03 GPU-seconds, estimated. The engine's figure stands beside it."""
    paper = pricing.prepared(REPO / "configs" / "paper-pathways.yaml")
    rows = [{**r, "card": "NVIDIA H200"} for r in throughput_rows("batch 64, token budget 32768")]
    setting = pricing.Setting.load("NVIDIA H200", rows=rows)
    (answers,) = [
        c
        for c in pricing.gpu_costs(paper, "llama-3-8b", "pathways", ["popqa"], setting)
        if c.stage == "answers"
    ]
    per = 16_534_478_848 / (0.6 * 4.8e12) + 2 * 8_030_261_248 * 24 / (0.5 * 989e12)
    assert per == pytest.approx(6.5206e-3, rel=1e-4)
    assert answers.gpu_seconds.value == pytest.approx(per * 14_267 + 60) == pytest.approx(153.03, abs=0.01)
    assert not answers.gpu_seconds.measured and answers.gpu_seconds.basis.startswith("vLLM, no vLLM row")
    d = diskplan.model_dims("llama-3-8b", paper["models"]["llama-3-8b"])
    batch = decoding_cost.decode_batch(64, paper["models"]["llama-3-8b"]["token_budget"], 24, 64)
    engine = decoding_cost.answers_seconds(d, "bfloat16", batch, 24, 64, setting.step) * 14_267
    assert answers.engine_seconds.value == pytest.approx(engine)
    # a card without datasheet figures: the engine's figure, saying why
    unknown = pricing.Setting.load("H", rows=throughput_rows("batch 64, token budget 32768"))
    costs = pricing.gpu_costs(paper, "llama-3-8b", "pathways", ["popqa"], unknown)
    (fallback,) = [c for c in costs if c.stage == "answers"]
    assert fallback.gpu_seconds.value == pytest.approx(engine) and fallback.engine_seconds is None
    assert "no datasheet figures for H" in fallback.gpu_seconds.basis


def test_the_paper_bills_price_vllms_answers_and_show_the_engines(capsys):
    """Issue 48: with generation.backend vllm the paper configs fit 35 (pathways) and 15 (depth) H200-hours;
    every answers line is estimated, with its vLLM basis, and the engine's figure is printed beside it."""
    setting = pricing.Setting.load()
    for path, goal in zip(pricing.PAPER_CONFIGS, (35, 15), strict=True):
        costs = pricing.price(pricing.prepared(path), setting)
        answers = [c for c in costs if c.stage == "answers"]
        assert answers and all(c.engine_seconds and not c.gpu_seconds.measured for c in answers), path
        assert all(c.gpu_seconds.basis.startswith("vLLM, no vLLM row measured") for c in answers)
        assert sum(c.gpu_seconds.value for c in costs if c.gpu_seconds) / 3600 <= goal, path
    bill.main([str(pricing.PAPER_CONFIGS[1])])
    out = capsys.readouterr().out
    assert "the same answers on the engine (estimated: decode steps of" in out
    assert re.search(r"\n   llama-3-70b-instruct answers \(DepthQA\): vLLM [\d.]+, engine [\d.]+\n", out), out
    assert re.search(
        r"total paper-depth: [\d.]+ GPU-hours .*; with the engine's answers [\d.]+ GPU-hours", out
    )


def config(**pathways) -> dict:
    return {
        "models": {"m": {"source": {"twin": "llama"}, "dtype": "bfloat16", "gpus": 1}},
        "datasets": {"popqa": {"source": {"hub": "x"}, "n": 100}, "nq": {"source": {"hub": "y"}, "n": None}},
        "pathways": {
            "models": ["m"],
            "datasets": ["popqa", "nq"],
            "knockout": {"control_draws": 3},
            "experiments": {"pr_factors": [2.0, 4.0]},
            "probe": {"seeds": [0, 1, 2], "test_size": 0.2},
            **pathways,
        },
        "depth": {"models": []},
    }


def test_probe_cpu_seconds_threads_and_memory_by_hand(monkeypatch):
    """probe_deltap at issue 41's rate: 35 s a layer at N 14,267, D 4,096, 15 fits; 2 layers: 70 s on one
    thread (70 / 600 s asks for 1). Its RAM is the rule's request: 1,000 MB, one worker's clean, knockout and
    3 control layers in float32 and its fit's workspace, 3.5 layers and a test fold (0.2) of each of the 5
    (9.5 x 14,267 x 4,096 x 4 = 2,220,630,016 bytes), and the per-sample tables (2 x 14,267 x 2 layers x 200
    = 11,413,600 bytes): 3,128.6 MB, requested as 3,129."""
    monkeypatch.setattr(sizing, "CPU_COST", REPO / "no_cpu_cost.tsv")  # issue 41's rate, not a measured one
    d = Dims(layers=2, hidden=4096, heads=32, kv_heads=8, head_dim=128, intermediate=8, vocab=10)
    monkeypatch.setattr(diskplan, "model_dims", lambda name, spec: d)
    cfg = config()
    cfg["datasets"]["popqa"]["n"] = None  # every row: 14,267
    probe, experiments = pricing.cpu_costs(cfg, "m", "popqa", [])
    assert probe.cpu_seconds.value == pytest.approx(70.0)
    assert not probe.cpu_seconds.measured
    assert probe.threads == 1
    assert probe.ram_gib.value == pytest.approx(3129 / 1024)
    assert sizing.requests(cfg, "m", "popqa")["probe_deltap"].mem_mb == 3129
    # pathway_experiments: L + 3 = 5 layers' worth of fits
    assert experiments.cpu_seconds.value == pytest.approx(175.0)
    measured = [
        {
            "rule": "probe_deltap",
            "n": "1000",
            "layers": "4",
            "hidden": "100",
            "fits": "15",
            "cpu_seconds": "60",
            "seconds": "10",
            "peak_rss_mb": "100",
            "date": "d",
            "machine": "here",
            "threads": "1",
        }
    ]
    cfg["datasets"]["popqa"]["n"] = 2000
    probe = pricing.cpu_costs(cfg, "m", "popqa", measured)[0]
    # one layer count, too few for a fit of fixed + per layer: its rate per layer x fit x N x D, 60 s x
    # (2000 x 4096 x 2) / (1000 x 100 x 4), scaled, so estimated (tests/test_cpu_cost.py: the fit)
    assert probe.cpu_seconds.value == pytest.approx(60 * 2000 * 4096 * 2 / (1000 * 100 * 4))
    assert not probe.cpu_seconds.measured


def test_analysis_jobs_last_their_cpu_seconds_over_their_threads(monkeypatch):
    """Llama-3-70B's shape (80 layers, D 8,192) on PopQA's 14,267 rows: 35 s x 80 layers x 2 (D over 4,096)
    = 5,600 one-thread seconds asks for ceil(5,600 / 600) = 10 threads, capped at 8: 700 s of wall time in
    the disk plan's simulation. A model job lasts its GPU-seconds over its GPUs."""
    monkeypatch.setattr(sizing, "CPU_COST", REPO / "no_cpu_cost.tsv")  # issue 41's rate, not a measured one
    d = Dims(layers=80, hidden=8192, heads=64, kv_heads=8, head_dim=128, intermediate=8, vocab=10)
    monkeypatch.setattr(diskplan, "model_dims", lambda name, spec: d)
    cfg = config()
    cfg["datasets"]["popqa"]["n"] = None
    probe = pricing.cpu_costs(cfg, "m", "popqa", [])[0]
    assert probe.cpu_seconds.value == pytest.approx(5600.0)
    assert probe.threads == 8
    gpu = pricing.Cost(
        "m", "popqa", "knockout", "extract_pathways", gpu_seconds=pricing.Figure(600, True, ""), gpus=2
    )
    assert pricing.durations([probe, gpu]) == {
        ("probe_deltap", "m", "popqa"): pytest.approx(700.0),
        ("extract_pathways", "m", "popqa"): pytest.approx(300.0),
    }


def test_disk_written_and_held_by_hand():
    """A twin of 3 layers, hidden 32: popqa n 100, nq all 3,610 rows; bfloat16 states (2 bytes a value, as
    the model computes), 3 control draws."""
    runs = diskplan.run_files(config())
    assert [(r.dataset, r.n) for r in runs] == [("popqa", 100), ("nq", 3_610)]
    assert runs[0].resid == {
        "resid_clean": 100 * 3 * 32 * 2,
        "resid_ko": 100 * 3 * 32 * 2,
        "resid_control": 3 * 100 * 3 * 32 * 2,
    }
    # patch [2, N, D], answer_only [N, D], pr [2 x 2 factors, N, D]
    assert sum(runs[0].experiments.values()) == (2 + 1 + 4) * 100 * 32 * 2


@pytest.mark.parametrize(
    ("spec", "size"),
    [
        ({"dtype": "float32"}, 4),  # the CPU demo's models
        ({"dtype": "auto", "gpus": 0}, 4),  # a CPU loads auto as float32
        ({"dtype": "bfloat16", "gpus": 0}, 4),  # ... and bfloat16 without AVX512-BF16: the larger
        ({"dtype": "auto"}, 2),  # bfloat16 on a GPU (float16 on a V100: 2 bytes too)
        ({"dtype": "float16"}, 2),
    ],
)
def test_state_bytes_follow_the_dtype_the_model_computes_in(spec, size):
    """A model's states are stored in the dtype it computes in (`pathways.activations.storage`), so the disk
    plan sizes them at that dtype's bytes: the by-hand case above with 4-byte values is twice as large."""
    cfg = config()
    cfg["models"]["m"] |= spec
    (popqa, _) = diskplan.run_files(cfg)
    assert popqa.resid["resid_clean"] == 100 * 3 * 32 * size
    assert sum(popqa.experiments.values()) == (2 + 1 + 4) * 100 * 32 * size


def test_peak_of_two_runs_by_hand():
    """Weights 100 bytes; runs A and B each write resid_clean 10, resid_ko 20, resid_control 30 at their
    knockout (1 h on the GPU) and exp 5 at their experiments (1 h); probe_deltap takes 3 h, the analysis 1 h.
    One slot, depth-first: knockout A [0,1], knockout B [1,2] (A's experiments wait for its probe), probe A
    [1,4], probe B [2,5], experiments A [4,5], experiments B [5,6]. Peak at 2 h: 100 + 60 + 60 = 220.
    Removed after use: A's ko/control go at 4, its clean at 6 (analysis A [5,6], B [6,7]); final
    100 + 5 + 5 = 110."""
    runs = [
        diskplan.RunFiles(
            "m", d, 1, {"resid_clean": 10, "resid_ko": 20, "resid_control": 30}, {"exp_patch": 5}
        )
        for d in ("a", "b")
    ]
    seconds = {}
    for d in ("a", "b"):
        seconds |= {
            ("extract_pathways", "m", d): 3600,
            ("probe_deltap", "m", d): 3 * 3600,
            ("extract_experiments", "m", d): 3600,
            ("pathway_experiments", "m", d): 3600,
        }
    jobs = []
    for r in runs:
        key = ("extract_pathways", "m", r.dataset)
        probe, exp = ("probe_deltap", "m", r.dataset), ("extract_experiments", "m", r.dataset)
        jobs += [
            diskplan.Job(key, seconds[key], (), r.resid, gpu=True),
            diskplan.Job(probe, seconds[probe], (key,)),
            diskplan.Job(exp, seconds[exp], (key, probe), r.experiments, gpu=True),
            diskplan.Job(("pathway_experiments", "m", r.dataset), 3600, (exp, probe)),
        ]
    temp = diskplan.simulate(jobs, diskplan.removals(runs, False), diskplan.GPU_PRIORITY[False], 1, 100)
    assert temp == {"peak": 220, "final": 110, "activation_peak": 120, "states_peak": 120, "hours": 7.0}
    kept = diskplan.simulate(jobs, diskplan.removals(runs, True), diskplan.GPU_PRIORITY[True], 1, 100)
    assert (kept["peak"], kept["final"]) == (230, 230)


def test_paper_pathways_states_kept_reach_917_gb():
    """Issue 41: 917 GB of resid files at the paper configs' real row counts when every state is kept."""
    paper = pricing.prepared(REPO / "configs" / "paper-pathways.yaml")
    paper["pathways"]["keep_states"] = True
    plan = diskplan.plan(paper, 1, {})
    assert plan.states_peak_bytes == pytest.approx(917.1e9, rel=1e-3)
    assert plan.weights_bytes == pytest.approx(328e9, rel=0.01)


def test_gpu_memory_and_knockout_hours_of_a_paper_model():
    """llama-3.2-1b of paper-pathways over the four sets' 43,226 rows with a knockout measured at 200/s
    (the schema's 3 control draws): 43,226 / 200 s; its GPU memory is the memory plan's."""
    paper = pricing.prepared(REPO / "configs" / "paper-pathways.yaml")
    rows = throughput_rows("batch 64, token budget 32768, prompts 16-256 tokens")
    setting = pricing.Setting.load("H", rows=rows)
    costs = pricing.gpu_costs(
        paper, "llama-3.2-1b", "pathways", ["popqa", "triviaqa", "hotpotqa", "nq"], setting
    )
    knockout = [c for c in costs if c.stage == "knockout"]
    assert sum(c.gpu_seconds.value for c in knockout) == pytest.approx(43_226 / 200)
    assert all(c.gpu_seconds.measured for c in knockout)
    saliency = next(c for c in costs if c.stage == "saliency")
    assert not saliency.gpu_seconds.measured and saliency.gpu_seconds.value > 0
    from truthflow.memplan import plan_model

    dims = diskplan.model_dims("llama-3.2-1b", paper["models"]["llama-3.2-1b"])
    plan = plan_model(
        "llama-3.2-1b", paper["models"]["llama-3.2-1b"], dims, {"generation", "passes", "saliency"}, 4
    )
    assert saliency.gpu_mem_gib == pytest.approx(plan["saliency"])
    assert knockout[0].gpu_mem_gib == pytest.approx(plan["passes"])


def test_the_demo_is_priced_from_its_embedded_models_dimensions(capsys):
    """The demo's models ship as GGUF files: their dimensions come from diskplan.EMBEDDED_DIMS, unprepared.
    SmolLM2-135M by hand: per layer attention 576 x 64 x 2 x (9 + 3) = 884,736, MLP 3 x 576 x 1,536 =
    2,654,208, norms 1,152, so 3,540,096 x 30 layers + tied embeddings 49,152 x 576 + a norm of 576 =
    134,515,008 (the published 135M). Float32 models run on the CPU: the bill says their model jobs have no
    CPU measurement."""
    demo = pricing.prepared(REPO / "config.yaml")
    assert diskplan.model_dims("smollm2-135m", demo["models"]["smollm2-135m"]).params == 134_515_008
    bill.main([str(REPO / "config.yaml")])
    out = capsys.readouterr().out
    assert "no measurement on a CPU: the model jobs of gemma3-270m, smollm2-135m run on the CPU" in out
    assert re.search(r"\n  smollm2-135m +probe_deltap +[\d.]+ [em]\d+ +1 ", out), out
    assert "total demo: " in out and "not sized" not in out


@pytest.mark.model
def test_embedded_dims_are_the_prepared_models(smollm_dir, gemma_dir):
    """EMBEDDED_DIMS equal the config.json that preparing each demo model writes."""
    for name, folder in (("smollm2-135m", smollm_dir), ("gemma3-270m", gemma_dir)):
        prepared = Dims.of(json.loads((folder / "config.json").read_text()))
        assert diskplan.model_dims(name, DEMO_MODELS[name]) == prepared, name
