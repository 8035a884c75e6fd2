"""The bill of the paper configs (or any config): `truthflow.bill` with the benchmark shapes of shapes.py, and
--measure to time a shape here first (bench_job) and price from that measurement alone.

    python benchmarks/paper_cost.py                          # = python -m truthflow.bill
    python benchmarks/paper_cost.py config.yaml --gpu-slots 2
    python benchmarks/paper_cost.py --measure tiny --n 8     # measure the tiny shape first (CPU: seconds)
"""

from __future__ import annotations

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from shapes import SHAPES, dims  # noqa: E402

from truthflow import bill, pricing  # noqa: E402


def measured_rows(shape: str, n: int, dtype: str | None) -> list[dict]:
    """One throughput row per stage of a bench_job run of `shape` in this process."""
    import torch
    from bench_job import card_name, measure, model_default

    dtype = dtype or ("bfloat16" if torch.cuda.is_available() else "float32")
    new = model_default("max_new_tokens")
    got = measure(shape, n, dtype, None, new, 8)
    line = f"batch {got['plan']['batch_size']}, token budget {got['plan']['token_budget']}"
    source = f"measured in this process, n {n}, {dtype}"
    return [
        {
            "shape": shape,
            "card": card_name(),
            "stage": stage,
            "samples_per_s": str(n / t),
            "dtype": dtype,
            "max_new_tokens": str(new),
            "settings": line,
            "source": source,
        }
        for stage, t in got["seconds"].items()
    ]


def main() -> None:
    ap = bill.arguments(__doc__)
    ap.add_argument("--measure", choices=sorted(SHAPES), help="measure this shape here first (bench_job)")
    ap.add_argument("--n", type=int, default=16, help="--measure: questions of the measured job")
    ap.add_argument("--dtype", default=None, help="--measure: weights' dtype (default: float32 on a CPU)")
    args = ap.parse_args()
    shapes = {name: dims(name) for name in SHAPES}
    rows = measured_rows(args.measure, args.n, args.dtype) if args.measure else None
    card = rows[0]["card"] if rows else args.card
    setting = pricing.Setting.load(card, shapes, rows)
    bill.report(args.configs or pricing.PAPER_CONFIGS, setting, args.gpu_slots)


if __name__ == "__main__":
    main()
