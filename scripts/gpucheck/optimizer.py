"""The growth-aware AdamW right after the default schedule's growths against torch's fused AdamW, as
`make bench` measures it (scripts/benchmarks/optimizer.py), on the device of the check."""

from __future__ import annotations

import shutil
import sys
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))  # scripts/: the benchmarks package


def check_optimizer(model: str | None, gpu: bool, steps: int = 20) -> dict:
    """`benchmarks.optimizer.bench_optimizer` on ``model`` (None: the bench's default for the device,
    gpt-124m on a GPU): one stage and several stages, ratios to torch's fused AdamW."""
    from benchmarks.common import Bench, parse_args
    from benchmarks.optimizer import bench_optimizer

    argv = ["--opt-steps", str(steps), "--no-tiny", *(["--model", model] if model else [])]
    b = Bench(parse_args(argv), torch.device("cuda" if gpu else "cpu"))
    try:
        return bench_optimizer(b)
    finally:
        shutil.rmtree(b.tmp, ignore_errors=True)
