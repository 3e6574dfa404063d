"""1. step: the trainer's own step against a plain PyTorch loop on a copy of the same model (same
batches, autocast, clipping, torch's AdamW fused where the device has it), interleaved block by
block; overhead = grow / plain - 1."""

from __future__ import annotations

import copy
import math
import time

import torch

from benchmarks.common import Bench, StepTimer, fused_available, median, paired, sync, torch_adamw


def plain_loop(b: Bench, model, impl: str):
    """One step of a plain PyTorch training loop (nanoGPT style) on ``model``; returns step()."""
    cfg, device, amp = b.cfg, b.device, b.amp
    opt = torch_adamw(list(model.named_parameters()), cfg.optim, impl)
    bs, T, seed, clip = int(cfg.trainer.batch_size), b.final.seq_len, int(cfg.seed), float(cfg.trainer.grad_clip)
    lr, total, warm = float(cfg.optim.lr), int(cfg.trainer.max_tokens), float(cfg.optim.warmup) * int(cfg.trainer.max_tokens)
    lo = float(cfg.optim.min_lr_ratio) * lr
    fwd = torch.compile(model) if b.s["compile"] else model
    it = {"step": 0}

    def get_lr(tokens: int) -> float:
        if tokens < warm:
            return lr * tokens / warm
        q = min(1.0, (tokens - warm) / max(total - warm, 1))
        return lo + (lr - lo) * 0.5 * (1 + math.cos(math.pi * q))

    def step() -> None:
        i = it["step"]
        x, y = b.data.batch(seed, i * bs, bs, T)
        if device.type == "cuda":
            x, y = x.pin_memory().to(device, non_blocking=True), y.pin_memory().to(device, non_blocking=True)
        for g in opt.param_groups:
            g["lr"] = get_lr((i + 1) * bs * T)  # tokens at the end of the step, as the trainer
        with torch.autocast(device.type, dtype=amp or torch.bfloat16, enabled=amp is not None):
            _, loss = fwd(x, y)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), clip)
        opt.step()
        opt.zero_grad(set_to_none=True)
        it["step"] = i + 1

    return step


def bench_step(b: Bench) -> dict:
    """(1): blocks of trainer steps and plain steps, interleaved; medians after warmup."""
    s = b.s
    stage = b.plan[len(b.plan) - 1]  # the final model at the last stage's batch size
    impl = b.args.plain_optimizer
    if impl == "auto":
        impl = "fused" if fused_available(b.device) else "foreach"
    trainer_model = b.model(stage.cfg)
    plain_model = copy.deepcopy(trainer_model)
    plain = {}

    def between() -> float:  # the plain loop's block, built after run_stage's compiler reset
        if "step" not in plain:
            plain["step"] = plain_loop(b, plain_model, impl)
        sync(b.device)
        t0 = time.perf_counter()
        for _ in range(s["block"]):
            plain["step"]()
        sync(b.device)
        return (time.perf_counter() - t0) / s["block"]

    timer = StepTimer(b.device, s["block"], between)
    state = b.run_trainer(stage, trainer_model, timer, s["warmup"] + s["steps"])
    grow_t, plain_t = timer.times[s["warmup"]:], timer.other[s["warmup"]:]
    return {"grow_s": median(grow_t), "plain_s": median(plain_t), "overhead": paired(grow_t, plain_t) - 1,
            "plain_optimizer": impl,
            "tokens_per_step": stage.tokens_per_step, "compile_s": state.compile_seconds if s["compile"] else None,
            "samples": {"grow": grow_t, "plain": plain_t}}
