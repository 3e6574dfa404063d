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
    gpt-124m on a GPU): one stage and several stages, ratios to torch's fused AdamW (no corpus: it times
    optimizer steps on random gradients), ``steps`` timed steps per side; ``several_stages.routes``: the grown
    tensors per update route."""
    from benchmarks.common import Bench, parse_args
    from benchmarks.optimizer import bench_optimizer

    argv = ["--opt-steps", str(steps), "--no-tiny", *(["--model", model] if model else [])]
    b = Bench(parse_args(argv), torch.device("cuda" if gpu else "cpu"), data=False)
    try:
        return {**bench_optimizer(b), "one_pass_route": one_pass_route(gpu), "steps": steps}
    finally:
        shutil.rmtree(b.tmp, ignore_errors=True)


def one_pass_route(gpu: bool) -> str:
    """Which one-pass update the grown tensors took (`grow.optim.adamw._one_pass_update`)."""
    import grow.optim.adamw as adamw
    from grow.optim.triton_adamw import available

    if not gpu:
        return f"cpu: {adamw.CPU_ONE_PASS}"
    ok, why = available()
    failed = adamw._triton_failed[0] if adamw._triton_failed else None
    return "triton" if ok and not failed else f"torch.compile per tensor ({failed or why})"
