"""2. optimizer: the growth-aware AdamW step against torch's AdamW (fused and foreach) on the same
parameters and gradients, with one stage (a fresh final model: the fused path) and right after the
default schedule's growths (several stages: the grown tensors' elements need per-stage bias
corrections until they round alike, ~340 steps at b2 = 0.95). Right after growths the optimizer
runs as the trainer builds it for the bench's config (``optim.compile`` null: one call of the C kernel
over all grown tensors on a CPU; on a GPU one Triton launch when the bench compiles, as it does by
default); the other way (eager, or one pass) is timed too (``several_stages.other``), with the
seconds of its first step after the last growth (one pass: the kernel's build or compile)."""

from __future__ import annotations

import copy
import time

import torch

from benchmarks.common import Bench, fused_available, median, paired, random_grads, sync, torch_adamw


def grown_optimizer(b: Bench, steps_between: int = 3, other_way: bool = False):
    """A model grown through the default schedule (zero strategy) and its growth-aware AdamW as the
    trainer builds it for this device and config (``other_way``: with ``compile`` flipped), with a
    few steps between growths, so the grown tensors hold elements of several stage ages; and the
    seconds of the first step after the last growth (with a compiled pass: its compile for that many
    stages)."""
    from grow.growth import grow
    from grow.optim import build_optimizer

    model = b.model(b.plan[0].cfg)
    opt = build_optimizer(model, b.cfg.optim, compile=bool(b.s["compile"]))
    if other_way:
        opt.compile = not opt.compile
    first_s = 0.0
    for stage in b.plan:
        if stage.index:
            res = grow(model, stage.cfg, strategy="zero", generator=torch.Generator().manual_seed(stage.index),
                       stage=stage.index)
            model = res.model.to(b.device)
            opt.grow(list(model.named_parameters()), res.param_map, stage.index)
        for k in range(steps_between):
            random_grads(model.parameters(), 100 * stage.index + k)
            sync(b.device)
            t0 = time.perf_counter()
            opt.step()
            sync(b.device)
            if k == 0:
                first_s = time.perf_counter() - t0
    return model, opt, first_s


def time_optimizers(b: Bench, arms: dict, n: int, warmup: int = 3) -> dict:
    """Seconds of each ``arm.step()`` per arm (after warmup), the arms interleaved step by step."""
    times = {k: [] for k in arms}
    for i in range(warmup + n):
        for name, opt in arms.items():
            sync(b.device)
            t0 = time.perf_counter()
            opt.step()
            sync(b.device)
            if i >= warmup:
                times[name].append(time.perf_counter() - t0)
    return times


def optimizer_arms(b: Bench, model, grow_opt) -> dict:
    """The growth-aware optimizer and torch's AdamW (fused where available, foreach) on copies of
    ``model``'s parameters with the same gradients."""
    arms = {"grow": grow_opt}
    random_grads(model.parameters(), 7)
    impls = ["fused", "foreach"] if fused_available(b.device) else ["foreach"]
    for impl in impls:
        twin = copy.deepcopy(model)
        for p, q in zip(model.parameters(), twin.parameters()):
            q.grad = p.grad.clone()
        arms[f"torch_{impl}"] = torch_adamw(list(twin.named_parameters()), b.cfg.optim, impl)
    return arms


def ratios(t: dict, arm: str = "grow") -> dict:
    """Medians per arm; ratios of the growth-aware step (``arm``) to torch's fused (where there is
    one: the reference) and foreach AdamW, as medians of step-by-step pairs."""
    ref = "torch_fused" if "torch_fused" in t else "torch_foreach"
    return {"grow_s": median(t[arm]), "torch_fused_s": median(t.get("torch_fused")),
            "torch_foreach_s": median(t["torch_foreach"]), "reference": ref, "ratio": paired(t[arm], t[ref]),
            "ratio_foreach": paired(t[arm], t["torch_foreach"])}


def other_way(b: Bench) -> tuple[object, float]:
    """The grown optimizer run the other way (one pass or eager), its gradients those of
    `optimizer_arms`, and the seconds of its first step after the last growth."""
    grown, opt, first_s = grown_optimizer(b, other_way=True)
    random_grads(grown.parameters(), 7)
    return opt, first_s


def bench_optimizer(b: Bench) -> dict:
    """(2): one stage (a fresh final model) and several stages (grown through the schedule), the
    latter both ways (the one-pass and the eager per-element update)."""
    from grow.optim import build_optimizer

    model = b.model(b.final)
    one = time_optimizers(b, optimizer_arms(b, model, build_optimizer(model, b.cfg.optim)), b.args.opt_steps)
    grown, opt, _ = grown_optimizer(b)
    compiled = opt.compile
    other, first_s = other_way(b)
    several = time_optimizers(b, {**optimizer_arms(b, grown, opt), "other": other}, b.args.opt_steps)
    mixed = sum(p.numel() for n, p in opt.params.items() if isinstance(opt.birth[n], torch.Tensor))
    total = sum(p.numel() for p in opt.params.values())
    alt = ratios(several, "other")
    return {"params": total, "one_stage": ratios(one),
            "several_stages": {**ratios(several), "compile": compiled, "stages": len(b.plan),
                               "mixed_fraction": mixed / total, "routes": dict(opt.routes),
                               "other": {"compile": not compiled, "grow_s": alt["grow_s"], "ratio": alt["ratio"],
                                         "first_step_s": first_s}}}
