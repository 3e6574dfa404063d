"""The training step's kernel choices measured on a plan's final stage (grow/kernels.py): every pair of
``trainer.loss_kernel`` (chunked, liger where it imports) and ``trainer.attention`` (auto, cudnn on CUDA) as
the trainer runs a step (compiled, the run's autocast, the growth-aware AdamW), its tokens/s as a ratio to
the default pair's and its MFU; the fastest pair is what the training checks then run with."""

from __future__ import annotations

import time
from types import SimpleNamespace

import torch

DEFAULT = ("chunked", "auto")


def variants(gpu: bool) -> tuple[list[tuple[str, str]], dict]:
    """The pairs this machine can run, and why the others are left out."""
    from grow.kernels import liger_missing

    losses, attentions, skipped = ["chunked"], ["auto"], {}
    why = None if gpu else "no CUDA device"
    why = why or liger_missing()
    if why:
        skipped["liger"] = why
    else:
        losses.append("liger")
    if gpu:
        attentions.append("cudnn")
    else:
        skipped["cudnn"] = "no CUDA device"
    return [(loss, att) for att in attentions for loss in losses], skipped


def check_kernels(run, rows: int = 16, steps: int = 6, warmup: int = 2) -> dict:
    """Each pair of `variants` on ``run``'s final stage, ``rows`` sequences a step; the compiled model is
    compiled again for each attention backend (torch.compile picks SDPA's kernel when it traces)."""
    from grow.device import Precision, peak_flops

    precision, final = Precision.of(run), run.plan[-1]
    gpu = precision.device.type == "cuda"
    pairs, skipped = variants(gpu)
    peak = peak_flops(precision.device)
    rows_out = []
    for loss_kernel, attention in pairs:
        seconds = _time_steps(run, final, precision, rows, SimpleNamespace(loss_kernel=loss_kernel, attention=attention),
                              steps, warmup)
        tps = rows * final.cfg.seq_len / seconds
        rows_out.append({"loss_kernel": loss_kernel, "attention": attention, "seconds_per_step": seconds,
                         "tokens_per_s": tps, "mfu": tps * final.cfg.flops_per_token() / peak if peak else None})
    base = next(r for r in rows_out if (r["loss_kernel"], r["attention"]) == DEFAULT)
    for r in rows_out:
        r["speed_over_default"] = r["tokens_per_s"] / base["tokens_per_s"]
    best = max(rows_out, key=lambda r: r["tokens_per_s"])
    return {"stage": final.number, "rows": rows, "steps": steps, "variants": rows_out, "skipped": skipped,
            "best": {"loss_kernel": best["loss_kernel"], "attention": best["attention"]}}


def _time_steps(run, final, precision, rows: int, trainer, steps: int, warmup: int) -> float:
    """Seconds per training step (forward, backward, clipping, the optimizer) of a fresh final-stage model
    under ``trainer``'s kernels, after ``warmup`` steps (the compile)."""
    from grow.model import Transformer
    from grow.optim import build_optimizer
    from grow.steps import Stepper

    model = Transformer(final.cfg, generator=torch.Generator().manual_seed(0)).to(precision.device)
    opt = build_optimizer(model, run.optim, compile=run.trainer.compile)
    stepper = Stepper(model, run, precision, rows)  # torch.compiler.reset() first under compile
    stepper.trainer = trainer  # the kernels under test (grow.kernels.training reads these two keys)
    g = torch.Generator().manual_seed(0)
    idx = torch.randint(0, final.cfg.vocab_size, (rows, final.cfg.seq_len + 1), generator=g).to(precision.device)
    cuda = precision.device.type == "cuda"
    for i in range(warmup + steps):
        if i == warmup:
            if cuda:
                torch.cuda.synchronize()
            t0 = time.perf_counter()
        stepper(idx[:, :-1], idx[:, 1:])
        opt.step()
        opt.zero_grad()
    if cuda:
        torch.cuda.synchronize()
    return (time.perf_counter() - t0) / steps
