"""A torch.profiler trace of 3 training steps of a plan's final stage (compiled, the run's autocast),
kept beside gpu_check.json: the key_averages table (text) and the Chrome trace (gzip), and in the JSON
the operators that took the most device (CPU: host) time."""

from __future__ import annotations

import gzip
import shutil
import time
from pathlib import Path

import torch

KEEP_TRACE_BYTES = 16 << 20  # a larger gzip'd trace is left out (the table is always kept): the device tool returns 16 MiB


def check_profile(run, out: Path, steps: int = 3, warmup: int = 3, rows: int = 16) -> dict:
    """Profile ``steps`` steps (after ``warmup``) of ``run``'s final stage at ``rows`` sequences per
    step: forward, backward and clipping by the trainer's `Stepper`, the growth-aware AdamW step."""
    from torch.profiler import ProfilerActivity, profile

    from grow.device import Precision
    from grow.model import Transformer
    from grow.optim import build_optimizer
    from grow.steps import Stepper

    precision, final = Precision.of(run), run.plan[-1]
    model = Transformer(final.cfg, generator=torch.Generator().manual_seed(0)).to(precision.device)
    opt = build_optimizer(model, run.optim, compile=run.trainer.compile)
    stepper = Stepper(model, run, precision, rows)
    g = torch.Generator().manual_seed(0)
    idx = torch.randint(0, final.cfg.vocab_size, (rows, final.cfg.seq_len + 1), generator=g).to(precision.device)
    x, y = idx[:, :-1], idx[:, 1:]
    cuda = precision.device.type == "cuda"

    def step():
        stepper(x, y)
        opt.step()
        opt.zero_grad()

    for _ in range(warmup):  # the compile, and the allocator's first sizes
        step()
    activities = [ProfilerActivity.CPU] + ([ProfilerActivity.CUDA] if cuda else [])
    t0 = time.perf_counter()
    with profile(activities=activities) as prof:
        for _ in range(steps):
            step()
        if cuda:
            torch.cuda.synchronize()
    seconds = (time.perf_counter() - t0) / steps
    key = "self_device_time_total" if cuda else "self_cpu_time_total"
    averages = prof.key_averages()
    table_path, trace_path = out.with_suffix(".profile.txt"), out.with_suffix(".trace.json.gz")
    table_path.write_text(averages.table(sort_by=key, row_limit=40) + "\n")
    raw = out.with_suffix(".trace.json")
    prof.export_chrome_trace(str(raw))
    with open(raw, "rb") as src, gzip.open(trace_path, "wb") as dst:
        shutil.copyfileobj(src, dst)
    raw.unlink()
    if trace_path.stat().st_size > KEEP_TRACE_BYTES:
        trace_path.unlink()
    total = sum(getattr(e, key) for e in averages) or 1.0
    top = sorted(averages, key=lambda e: getattr(e, key), reverse=True)[:10]
    return {"stage": final.number, "rows": rows, "seq_len": final.cfg.seq_len, "steps": steps,
            "seconds_per_step": seconds, "table": table_path.name,
            "trace": trace_path.name if trace_path.exists() else None,
            "top": [{"name": e.key, "ms": getattr(e, key) / 1e3 / steps, "share": getattr(e, key) / total,
                     "calls": e.count // steps} for e in top]}
