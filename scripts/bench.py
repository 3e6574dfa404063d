"""`make bench`: what the runner costs, measured against plain PyTorch in one process (DESIGN §12).

Usage: ``python scripts/bench.py [options] [hydra overrides]`` (``make bench ARGS="--model tiny"``).
On the current device (``--device``, default cuda if available) it measures, as ratios taken in the
same process so that a busy machine slows both sides alike:

1. step      the trainer's own step (`grow.train.run_stage`: batch from `grow.data`, pinned
             non-blocking copy, learning rate, `Stepper` forward/backward/clip, finiteness check,
             growth-aware AdamW step, logging at log points) against a plain PyTorch loop on a
             copy of the same model, the same batches, autocast and clipping, with
             ``torch.optim.AdamW`` (fused where torch has the kernel for the device). The two run
             interleaved (a block of trainer steps, a block of plain steps, ...); medians after
             warmup. overhead = grow / plain - 1.
2. optimizer the growth-aware AdamW step against torch's AdamW (fused and foreach) on the same
             parameters and gradients: with one stage (no growth: the fused path), and after the
             default schedule's growths (several stages: the grown tensors take the per-element
             path while their stages' bias corrections differ).
3. growth    each strategy's growth time (`grow.train.do_growth`: statistics passes, the growth,
             the optimizer move) through the default schedule, against one training step at the
             grown size, and the share of the default run's wall-clock the growths take:
             sum(growth s) / (sum over stages of steps x step time + sum(growth s)). Compile time
             (``trainer.compile``) is reported apart, as the trainer does. Also svd's statistics
             pass as a share of the run on the tiny CPU config.
4. stages    tokens/s of each stage of the default schedule (the trainer's step) and, on a GPU,
             the MFU: tokens/s x FLOPs per token / the device's dense bf16 peak (from its name).

It writes ``bench.json`` (``--out``) and prints a table. Each figure stands beside its target
(``targets``): framework overhead <= 3%, growth-aware AdamW <= 1.3x torch's with one stage, all
growths of the default run together <= 1% of its wall-clock, svd statistics <= 5% on the tiny CPU
config, and on a GPU the final stage >= 40% MFU (bf16, compile). A missed target prints a FAIL
line; the exit status is 1 only with ``--strict``. Figures that need a GPU are null on a CPU, with
a ``reason``. Timings are medians of a few steps on whatever machine runs this: on a shared CPU
they move by several percent between runs. On a CPU torch gets one thread unless ``--threads``
says otherwise: with two threads on two busy cores every small kernel waits for a descheduled
partner (steps 2.5x, optimizer steps 40x slower in our runs) and the figures drown in noise.
"""

from __future__ import annotations

import argparse
import copy
import json
import math
import os
import platform
import shutil
import statistics
import sys
import tempfile
import time
from dataclasses import replace
from pathlib import Path

import torch

SCHEMA = "grow.bench/1"
STRATEGIES = ("zero", "random", "net2net", "vt", "svd")
RETRY = ["++schedule.start.n_heads=2"]  # for a strategy that refuses the default schedule (vt: heads in pairs)
TARGETS = {  # name: (comparison, limit, what)
    "framework_overhead": ("<=", 0.03, "trainer step / plain PyTorch step - 1"),
    "optimizer_one_stage": ("<=", 1.3, "growth-aware AdamW step / torch AdamW step, one stage"),
    "growth_fraction": ("<=", 0.01, "all growths of the default run / its wall-clock (worst strategy)"),
    "svd_stats_tiny": ("<=", 0.05, "svd statistics passes / run wall-clock, tiny CPU config"),
    "mfu_final_stage": (">=", 0.40, "MFU of the final stage (bf16, compile)"),
}


# ---- configuration ----------------------------------------------------------------------------------


def parse_args(argv):
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0], formatter_class=argparse.RawTextHelpFormatter)
    p.add_argument("overrides", nargs="*", help="Hydra overrides of the run config (data.vocab_size=512, ...)")
    p.add_argument("--model", default=None, help="model config (default: small on CPU, gpt-124m on a GPU)")
    p.add_argument("--device", default="auto", help="auto | cpu | cuda | cuda:N")
    p.add_argument("--batch-size", type=int, default=None, help="sequences per step (default trainer.batch_size)")
    p.add_argument("--compile", choices=("auto", "true", "false"), default="auto",
                   help="torch.compile both loops (auto: on a GPU only)")
    p.add_argument("--steps", type=int, default=None, help="measured blocks per side (default 10)")
    p.add_argument("--warmup", type=int, default=None, help="blocks left out first (default 2 CPU, 3 GPU)")
    p.add_argument("--block", type=int, default=None, help="steps per timed block (default 1 CPU, 5 GPU)")
    p.add_argument("--stage-steps", type=int, default=None, help="timed blocks per schedule stage (default 3 CPU, 5 GPU)")
    p.add_argument("--opt-steps", type=int, default=20, help="timed optimizer steps per side")
    p.add_argument("--strategies", default=",".join(STRATEGIES), help="strategies whose growth is timed")
    p.add_argument("--growth-repeats", type=int, default=1, help="timed growth chains per strategy (median)")
    p.add_argument("--plain-optimizer", choices=("auto", "fused", "foreach"), default="auto",
                   help="torch AdamW of the plain loop (auto: fused where torch has the kernel)")
    p.add_argument("--no-tiny", action="store_true", help="skip the svd statistics share on the tiny CPU config")
    p.add_argument("--threads", type=int, default=None,
                   help="torch CPU threads (default: 1 on CPU, steady on a shared machine; 0: torch's default)")
    p.add_argument("--out", default="bench.json", help="where the JSON goes")
    p.add_argument("--strict", action="store_true", help="exit 1 when a target is missed")
    return p.parse_args(argv)


def compose(model: str, overrides, strategy: str | None = None):
    """The `grow train +schedule=exp` config for ``model`` (validated and typed, as the CLI would run it:
    `grow.config.RunConfig`)."""
    from hydra import compose as hydra_compose
    from hydra import initialize_config_dir

    from grow.config import CONFIG_DIR, RunConfig

    extra = [f"strategy={strategy}"] if strategy else []
    base = [f"model={model}", "+schedule=exp", "trainer.progress=false", "trainer.eval_every=0", "trainer.evals_per_stage=1", "seed=0"]
    with initialize_config_dir(str(CONFIG_DIR), version_base="1.3"):
        cfg = hydra_compose("train", overrides=[*base, *overrides, *extra])
    return RunConfig.from_hydra(cfg)


def settings(args, device: torch.device) -> dict:
    gpu = device.type == "cuda"
    pick = lambda value, cpu, cuda: value if value is not None else (cuda if gpu else cpu)
    return {
        "model": pick(args.model, "small", "gpt-124m"),
        "compile": gpu if args.compile == "auto" else args.compile == "true",
        "steps": pick(args.steps, 10, 10),
        "warmup": pick(args.warmup, 2, 3),
        "block": pick(args.block, 1, 5),
        "stage_steps": pick(args.stage_steps, 3, 5),
    }


def plan_of(cfg):
    """The stage plan `grow train` builds from ``cfg``."""
    return cfg.plan()


# ---- timing -------------------------------------------------------------------------------------------


def sync(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def median(xs) -> float | None:
    return statistics.median(xs) if xs else None


def paired(a: list[float], b: list[float]) -> float:
    """Median of a_i / b_i over interleaved samples: a drift in the machine's load cancels in each pair."""
    return statistics.median(x / y for x, y in zip(a, b))


class StepTimer:
    """Stands in for `grow.checkpoint.RunControl` in `grow.train.run_stage` (which calls
    ``after_step`` after every trainer step): times blocks of ``block`` trainer steps, the device
    synchronized at each block's end, and after each block runs ``between()`` (the plain loop's
    block in the A/B comparison), whose time is excluded. Never checkpoints nor stops."""

    every = 0  # RunControl's checkpoint period (0: none)

    def boundary(self, phase, model, opt, state) -> None:
        """A stage's end or a growth: nothing to write."""

    def __init__(self, device, block: int, between=None):
        from grow.checkpoint import StopRequest

        self.stop = StopRequest()  # never signalled
        self.device, self.block, self.between = device, block, between
        self.count, self.mark = 0, None
        self.times: list[float] = []  # seconds per trainer step, one entry per block
        self.other: list[float] = []  # what between() returned, one entry per block

    def start(self) -> None:
        sync(self.device)
        self.mark = time.perf_counter()

    def after_step(self, model, opt, state, last, poll=True) -> None:
        self.count += 1
        if self.count % self.block:
            return
        sync(self.device)
        self.times.append((time.perf_counter() - self.mark) / self.block)
        if self.between is not None:
            self.other.append(self.between())
        self.mark = time.perf_counter()


class Bench:
    """The shared pieces of one measured setting: device, precision, run config, data, plan.

    ``model`` / ``compile`` default to the device's (`settings`); ``main`` applies ``--batch-size``
    (the tiny CPU figure runs the tiny config as `grow train model=tiny +schedule=exp` would)."""

    def __init__(self, args, device: torch.device, model: str | None = None, compile: bool | None = None,
                 main: bool = True):
        from grow.train import Precision, Trainer, peak_flops

        self.args, self.device = args, device
        self.s = settings(args, device)
        self.s["model"] = model or self.s["model"]
        self.s["compile"] = self.s["compile"] if compile is None else compile
        overrides = list(args.overrides)
        if main and args.batch_size:
            overrides.append(f"trainer.batch_size={args.batch_size}")
        overrides.append(f"trainer.compile={str(self.s['compile']).lower()}")
        if device.type == "cpu":
            overrides.append("device=cpu")
        self.overrides = overrides = [*overrides, "trainer.eval_batches=1", "trainer.eval_batch_size=1"]
        self.cfg = compose(self.s["model"], overrides)
        self.final = self.cfg.model
        self.precision = Precision.of(self.cfg)
        self.param_dtype, self.amp = self.precision.param_dtype, self.precision.amp
        self.peak = peak_flops(device)
        self.plan = plan_of(self.cfg)
        self.tmp = Path(tempfile.mkdtemp(prefix="grow-bench-"))
        self.data, self.val = Trainer._load_data(self.cfg, self.tmp)

    def model(self, cfg, seed: int = 0):
        from grow.model import Transformer

        m = Transformer(cfg, generator=torch.Generator().manual_seed(seed))
        return m.to(device=self.device, dtype=self.param_dtype)

    def logger(self, name: str, enabled: bool = True):
        from grow.logging import MetricsLogger

        return MetricsLogger(self.tmp / name, enabled=enabled, wandb_cfg=None)

    def run_trainer(self, stage, model, timer: StepTimer, blocks: int):
        """``blocks`` blocks of the trainer's steps on ``stage``'s model (`grow.train.Trainer.train_stage`)."""
        from grow.optim import build_optimizer
        from grow.train import RunState, Trainer

        one = replace(stage, steps=blocks * timer.block)
        opt = build_optimizer(model, self.cfg.optim)
        state, logger = RunState(stage=stage.index), self.logger(f"stage{stage.index}-{len(timer.times)}")
        trainer = Trainer.__new__(Trainer).assemble(self.cfg, self.tmp, self.precision, (self.data, self.val))
        trainer.model, trainer.opt, trainer.state, trainer.logger, trainer.control = model, opt, state, logger, timer
        timer.start()
        try:
            trainer.train_stage(one)
        finally:
            logger.close()
        return state


# ---- 1. the trainer's step vs a plain PyTorch loop ---------------------------------------------------------


def torch_adamw(params_named, optim_cfg, impl: str):
    """torch.optim.AdamW with the growth-aware optimizer's hyperparameters (decay on dim >= 2 only)."""
    decay = [p for _, p in params_named if p.dim() >= 2]
    no_decay = [p for _, p in params_named if p.dim() < 2]
    groups = [{"params": decay, "weight_decay": float(optim_cfg.weight_decay)},
              {"params": no_decay, "weight_decay": 0.0}]
    flag = {"fused": True} if impl == "fused" else {"foreach": True}
    return torch.optim.AdamW(groups, lr=float(optim_cfg.lr), betas=tuple(float(b) for b in optim_cfg.betas),
                             eps=float(optim_cfg.eps), **flag)


def fused_available(device: torch.device) -> bool:
    """Whether torch's fused AdamW runs on ``device`` (CUDA; CPU from torch 2.4)."""
    p = torch.nn.Parameter(torch.zeros(2, device=device))
    p.grad = torch.ones_like(p)
    try:
        torch.optim.AdamW([p], fused=True).step()
    except (RuntimeError, NotImplementedError, ValueError):
        return False
    return True


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


# ---- 2. the optimizer alone ------------------------------------------------------------------------------


def random_grads(params, seed: int) -> None:
    g = torch.Generator().manual_seed(seed)
    for p in params:
        p.grad = (torch.randn(p.shape, generator=g) * 1e-3).to(device=p.device, dtype=p.dtype)


def grown_optimizer(b: Bench, steps_between: int = 3):
    """A model grown through the default schedule (zero strategy) and its growth-aware AdamW, with
    a few steps between growths, so the grown tensors hold elements of several stage ages."""
    from grow.growth import grow
    from grow.optim import build_optimizer

    model = b.model(b.plan[0].cfg)
    opt = build_optimizer(model, b.cfg.optim)
    for stage in b.plan:
        if stage.index:
            res = grow(model, stage.cfg, strategy="zero", generator=torch.Generator().manual_seed(stage.index),
                       stage=stage.index)
            model = res.model.to(b.device)
            opt.grow(list(model.named_parameters()), res.param_map, stage.index)
        for k in range(steps_between):
            random_grads(model.parameters(), 100 * stage.index + k)
            opt.step()
    return model, opt


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


def ratios(t: dict) -> dict:
    """Medians per arm; ratios of the growth-aware step to torch's fused (where there is one: the
    reference) and foreach AdamW, as medians of step-by-step pairs."""
    ref = "torch_fused" if "torch_fused" in t else "torch_foreach"
    return {"grow_s": median(t["grow"]), "torch_fused_s": median(t.get("torch_fused")),
            "torch_foreach_s": median(t["torch_foreach"]), "reference": ref, "ratio": paired(t["grow"], t[ref]),
            "ratio_foreach": paired(t["grow"], t["torch_foreach"])}


def bench_optimizer(b: Bench) -> dict:
    """(2): one stage (a fresh final model) and several stages (grown through the schedule)."""
    from grow.optim import build_optimizer

    model = b.model(b.final)
    one = time_optimizers(b, optimizer_arms(b, model, build_optimizer(model, b.cfg.optim)), b.args.opt_steps)
    grown, opt = grown_optimizer(b)
    several = time_optimizers(b, optimizer_arms(b, grown, opt), b.args.opt_steps)
    mixed = sum(p.numel() for n, p in opt.params.items() if isinstance(opt.birth[n], torch.Tensor))
    total = sum(p.numel() for p in opt.params.values())
    return {"params": total, "one_stage": ratios(one),
            "several_stages": {**ratios(several), "stages": len(b.plan), "mixed_fraction": mixed / total}}


# ---- 3, 4. the schedule's stages and growths ---------------------------------------------------------------


def stage_times(b: Bench, step: dict | None = None) -> list[dict]:
    """(4): the trainer's step time on each stage of the plan (median of timed blocks), tokens/s
    and MFU; the last stage's from ``step`` (`bench_step`'s result) when given."""
    s, rows = b.s, []
    for stage in b.plan:
        compile_s = None
        if step is not None and stage.index == len(b.plan) - 1:
            step_s, compile_s = step["grow_s"], step["compile_s"]
        else:
            timer = StepTimer(b.device, s["block"])
            state = b.run_trainer(stage, b.model(stage.cfg), timer, s["warmup"] + s["stage_steps"])
            step_s = median(timer.times[s["warmup"]:])
            compile_s = state.compile_seconds if s["compile"] else None
        tps = stage.tokens_per_step / step_s
        fpt = stage.cfg.flops_per_token()
        rows.append({"stage": stage.index, "dims": dims(stage.cfg), "params": stage.params,
                     "batch_size": stage.batch_size, "steps": stage.steps, "step_s": step_s, "tokens_per_s": tps,
                     "flops_per_token": fpt, "mfu": tps * fpt / b.peak if b.peak else None, "compile_s": compile_s})
    return rows


def dims(c) -> str:
    return f"N={c.n_layers} h={c.d_model} E={c.n_heads} k={c.d_qk} v={c.d_v} p={c.d_ff}"



def growth_chain(b: Bench, cfg) -> list[dict]:
    """Every growth of ``cfg``'s plan with its strategy, from a fresh stage-0 model (set up by the
    strategy, as `grow.train.train` does), each through `grow.train.Trainer.grow_into`: its
    ``growth/seconds`` counts the growth batches, statistics passes, the growth and the optimizer
    move (not the evaluations around it)."""
    from grow.model import Transformer
    from grow.optim import build_optimizer
    from grow.train import RunState, Trainer

    plan = plan_of(cfg)
    model = Transformer(plan[0].cfg, generator=torch.Generator().manual_seed(0))
    cfg.strategy.build().initialize(model, torch.Generator().manual_seed(0))
    model = model.to(device=b.device, dtype=b.param_dtype)
    opt = build_optimizer(model, cfg.optim)
    state, logger, out = RunState(), b.logger("growth", enabled=False), []
    trainer = Trainer.__new__(Trainer).assemble(cfg, b.tmp, b.precision, (b.data, b.val))
    trainer.model, trainer.opt, trainer.state, trainer.logger = model, opt, state, logger
    trainer.control = StepTimer(b.device, 1)
    for stage in plan[1:]:
        state.stage_losses.append(trainer.evaluate())  # the stage's end, whose loss the growth starts from
        trainer.grow_into(stage)
        ev = state.growth_events[-1]
        out.append({"stage": stage.index, "seconds": ev["growth/seconds"], "stats_seconds": ev.get("svd/stats_seconds"),
                    "params_after": ev["growth/params_after"]})
    sync(b.device)
    return out


def run_share(stages: list[dict], growths: list[dict]) -> dict:
    """The default run's wall-clock: its training steps (plan steps x measured step time per stage)
    plus the growths; the growths' share of it."""
    train_s = sum(r["steps"] * r["step_s"] for r in stages)
    total = sum(g["seconds"] for g in growths)
    stats = [g["stats_seconds"] for g in growths if g["stats_seconds"] is not None]
    return {"total_s": total, "stats_s": sum(stats) if stats else None, "run_s": train_s + total,
            "run_fraction": total / (train_s + total), "stats_fraction": sum(stats) / (train_s + total) if stats else None}


def bench_growth(b: Bench, stages: list[dict]) -> dict:
    """(3): each strategy's growths through the default schedule (median over ``--growth-repeats``
    chains, strategies interleaved), against one step at the grown size and the run's wall-clock."""
    from grow.config import ConfigError

    cfgs, skipped, adjusted = {}, {}, {}
    for n in [n for n in b.args.strategies.split(",") if n]:
        try:
            cfgs[n] = compose(b.s["model"], b.overrides, strategy=n)
        except ConfigError as exc:  # the strategy refuses this schedule (as `grow train` would) ...
            try:  # ... vt adds heads in pairs: start at 2 heads, as `make compare` does (COMPARE_ARGS)
                cfgs[n] = compose(b.s["model"], [*b.overrides, *RETRY], strategy=n)
                adjusted[n] = {"schedule_overrides": RETRY, "refused": str(exc)}
            except ConfigError:
                skipped[n] = {"skipped": str(exc)}
    names = list(cfgs)
    growth_chain(b, compose(b.s["model"], b.overrides, strategy="zero"))  # untimed: first-use costs
    runs = {n: [] for n in names}
    for _ in range(max(1, b.args.growth_repeats)):
        for n in names:
            runs[n].append(growth_chain(b, cfgs[n]))
    step_s = stages[-1]["step_s"]
    out = {}
    for n in names:
        growths = []
        for i, g in enumerate(runs[n][0]):
            per = [r[i] for r in runs[n]]
            stats = [x["stats_seconds"] for x in per if x["stats_seconds"] is not None]
            growths.append({**g, "seconds": median([x["seconds"] for x in per]), "stats_seconds": median(stats),
                            "vs_step": median([x["seconds"] for x in per]) / step_s})
        out[n] = {"growths": growths, "last_s": growths[-1]["seconds"], "last_vs_step": growths[-1]["vs_step"],
                  **run_share(stages, growths), **adjusted.get(n, {})}
    train_s = sum(r["steps"] * r["step_s"] for r in stages)
    return {"step_s": step_s, "run_train_s": train_s, "repeats": max(1, b.args.growth_repeats),
            "strategies": {**out, **skipped}}


def bench_svd_tiny(args, b: Bench, stages: list[dict], growth: dict) -> dict:
    """svd's statistics passes as a share of the default run on the tiny CPU config (`grow train
    model=tiny +schedule=exp strategy=svd` on CPU): stage step times and one growth chain (those
    of the main measurement when it is that config)."""
    svd = growth["strategies"].get("svd", {})
    same = (b.s["model"], b.device.type, b.s["compile"], args.batch_size) == ("tiny", "cpu", False, None)
    if same and "growths" in svd:
        share = svd
    else:
        tb = Bench(args, torch.device("cpu"), model="tiny", compile=False, main=False)
        cfg = compose("tiny", tb.overrides, strategy="svd")
        try:
            stages = stage_times(tb)
            growth_chain(tb, cfg)  # untimed: first-use costs
            share = run_share(stages, growth_chain(tb, cfg))
        finally:
            shutil.rmtree(tb.tmp, ignore_errors=True)
    return {"model": "tiny", "device": "cpu", "stats_s": share["stats_s"], "growth_s": share["total_s"],
            "run_s": share["run_s"], "fraction": share["stats_fraction"]}


# ---- targets, JSON, table -----------------------------------------------------------------------------------


def device_info(device: torch.device) -> dict:
    if device.type == "cuda":
        name = torch.cuda.get_device_name(device)
    else:
        name = platform.processor() or platform.machine()
        try:
            name = next(ln.split(":", 1)[1].strip() for ln in open("/proc/cpuinfo") if ln.startswith("model name"))
        except (OSError, StopIteration):
            pass
    return {"type": device.type, "name": name, "torch": torch.__version__, "threads": torch.get_num_threads(),
            "cpus": os.cpu_count(), "python": platform.python_version()}


def mfu_reason(b: Bench) -> str | None:
    if b.device.type != "cuda":
        return "no CUDA device"
    if b.peak is None:
        return f"unknown dense bf16 peak for {torch.cuda.get_device_name(b.device)} (grow.train.PEAK_BF16_FLOPS)"
    return None


def target(name: str, value, reason: str | None = None, note: str | None = None) -> dict:
    op, limit, what = TARGETS[name]
    ok = None if value is None else (value <= limit if op == "<=" else value >= limit)
    return {"value": value, "op": op, "limit": limit, "pass": ok, "what": what,
            "reason": reason if value is None else None, "note": note}


def targets(result: dict, b: Bench) -> dict:
    strategies = {n: s for n, s in result["growth"]["strategies"].items() if "skipped" not in s}
    worst = max(strategies, key=lambda n: strategies[n]["run_fraction"]) if strategies else None
    tiny = result.get("svd_stats_tiny")
    mfu = result["mfu"]
    note = None
    if (b.s["model"], b.s["compile"], b.amp) != ("gpt-124m", True, torch.bfloat16):
        note = (f"the target is for model=gpt-124m, bf16, compile; measured: model={b.s['model']}, "
                f"autocast={str(b.amp).replace('torch.', '')}, compile={b.s['compile']}")
    return {
        "framework_overhead": target("framework_overhead", result["step"]["overhead"]),
        "optimizer_one_stage": target("optimizer_one_stage", result["optimizer"]["one_stage"]["ratio"],
                                      note=f"reference: {result['optimizer']['one_stage']['reference']}"),
        "growth_fraction": target("growth_fraction", strategies[worst]["run_fraction"] if worst else None,
                                  reason="no strategy timed", note=f"worst strategy: {worst}" if worst else None),
        "svd_stats_tiny": target("svd_stats_tiny", tiny["fraction"] if tiny else None, reason="skipped (--no-tiny)"),
        "mfu_final_stage": target("mfu_final_stage", mfu["final_stage"], reason=mfu["reason"], note=note),
    }


# (dotted path, kind): kind is num, int, str, bool, list, dict; a trailing ? allows null
SCHEMA_FIELDS = [
    ("schema", "str"), ("seconds", "num"), ("section_seconds", "dict"), ("loadavg", "list"),
    ("device.type", "str"), ("device.name", "str"), ("device.torch", "str"), ("device.threads", "int"),
    ("config.model", "str"), ("config.model_config", "dict"), ("config.batch_size", "int"), ("config.seq_len", "int"),
    ("config.autocast", "str?"), ("config.compile", "bool"), ("config.schedule", "str"), ("config.max_tokens", "int"),
    ("config.steps", "int"), ("config.warmup", "int"), ("config.block", "int"), ("config.overrides", "list"),
    ("step.grow_s", "num"), ("step.plain_s", "num"), ("step.overhead", "num"), ("step.plain_optimizer", "str"),
    ("step.tokens_per_step", "int"), ("step.compile_s", "num?"), ("step.samples.grow", "list"),
    ("step.samples.plain", "list"),
    ("optimizer.params", "int"),
    *[(f"optimizer.{k}.{f}", t) for k in ("one_stage", "several_stages") for f, t in (
        ("grow_s", "num"), ("torch_fused_s", "num?"), ("torch_foreach_s", "num"), ("reference", "str"),
        ("ratio", "num"), ("ratio_foreach", "num"))],
    ("optimizer.several_stages.stages", "int"), ("optimizer.several_stages.mixed_fraction", "num"),
    ("stages", "list"), ("growth.step_s", "num"), ("growth.run_train_s", "num"), ("growth.strategies", "dict"),
    ("svd_stats_tiny", "dict?"), ("mfu.final_stage", "num?"), ("mfu.peak_flops", "num?"), ("mfu.reason", "str?"),
    *[(f"targets.{name}.{f}", t) for name in TARGETS for f, t in (
        ("value", "num?"), ("limit", "num"), ("op", "str"), ("pass", "bool?"), ("reason", "str?"))],
]
STAGE_FIELDS = [("stage", "int"), ("dims", "str"), ("params", "int"), ("batch_size", "int"), ("steps", "int"),
                ("step_s", "num"), ("tokens_per_s", "num"), ("flops_per_token", "int"), ("mfu", "num?"),
                ("compile_s", "num?")]
STRATEGY_FIELDS = [("growths", "list"), ("last_s", "num"), ("last_vs_step", "num"), ("total_s", "num"),
                   ("stats_s", "num?"), ("run_s", "num"), ("run_fraction", "num"), ("stats_fraction", "num?")]
GROWTH_FIELDS = [("stage", "int"), ("seconds", "num"), ("stats_seconds", "num?"), ("params_after", "int"),
                 ("vs_step", "num")]
TINY_FIELDS = [("stats_s", "num"), ("growth_s", "num"), ("run_s", "num"), ("fraction", "num")]


def _kind_ok(value, kind: str) -> bool:
    if kind.endswith("?"):
        return value is None or _kind_ok(value, kind[:-1])
    if kind == "num":
        return isinstance(value, (int, float)) and not isinstance(value, bool) and math.isfinite(value)
    if kind == "int":
        return isinstance(value, int) and not isinstance(value, bool)
    return isinstance(value, {"str": str, "bool": bool, "list": list, "dict": dict}[kind])


def _check(obj, fields, where: str) -> list[str]:
    errors = []
    for path, kind in fields:
        node, ok = obj, True
        for key in path.split("."):
            if not isinstance(node, dict) or key not in node:
                ok = False
                break
            node = node[key]
        if not ok:
            errors.append(f"{where}{path}: missing")
        elif not _kind_ok(node, kind):
            errors.append(f"{where}{path}: {node!r} is not {kind}")
    return errors


def check_schema(result: dict) -> list[str]:
    """Every field `make bench` promises, with its type; [] when the JSON is complete.

    A null figure must come with a reason: each target's ``reason`` when its value is null, the
    ``mfu.reason`` when the final stage's MFU is null."""
    errors = _check(result, SCHEMA_FIELDS, "")
    if errors:
        return errors
    if result["schema"] != SCHEMA:
        errors.append(f"schema: {result['schema']!r} is not {SCHEMA!r}")
    if not result["stages"]:
        errors.append("stages: empty")
    for i, row in enumerate(result["stages"]):
        errors += _check(row, STAGE_FIELDS, f"stages[{i}].")
    for name, s in result["growth"]["strategies"].items():
        if "skipped" in s:
            errors += _check(s, [("skipped", "str")], f"growth.strategies.{name}.")
            continue
        errors += _check(s, STRATEGY_FIELDS, f"growth.strategies.{name}.")
        for i, g in enumerate(s.get("growths") or []):
            errors += _check(g, GROWTH_FIELDS, f"growth.strategies.{name}.growths[{i}].")
    if result["svd_stats_tiny"] is not None:
        errors += _check(result["svd_stats_tiny"], TINY_FIELDS, "svd_stats_tiny.")
    for name, t in result["targets"].items():
        if t["value"] is None and not t["reason"]:
            errors.append(f"targets.{name}: null value without a reason")
        if (t["value"] is None) != (t["pass"] is None):
            errors.append(f"targets.{name}: pass must be null exactly when the value is")
    if result["mfu"]["final_stage"] is None and not result["mfu"]["reason"]:
        errors.append("mfu: null final_stage without a reason")
    return errors


def fmt(x, unit: str = "") -> str:
    if x is None:
        return "—"
    if unit == "%":
        return f"{100 * x:.2f}%"
    if unit == "x":
        return f"{x:.3f}x"
    if unit == "s":
        return f"{x * 1e3:.2f} ms" if x < 1 else f"{x:.2f} s"
    if unit == "tok/s":
        return f"{x:,.0f}"
    return f"{x:.4g}"


def print_table(r: dict) -> None:
    from rich.console import Console
    from rich.table import Table

    con = Console() if sys.stdout.isatty() else Console(width=120)
    d, c = r["device"], r["config"]
    con.print(f"[bold]grow bench[/] on {d['type']} ({d['name']}, torch threads={d['threads']}, torch {d['torch']}), "
              f"model={c['model']} batch={c['batch_size']}x{c['seq_len']} autocast={c['autocast']} "
              f"compile={c['compile']}; load average {r['loadavg'][0]:.1f} -> {r['loadavg'][1]:.1f}")
    t = Table(title="1-2. step and optimizer (medians, interleaved)")
    for col in ("figure", "grow", "reference", "ratio"):
        t.add_column(col)
    st, op = r["step"], r["optimizer"]
    t.add_row("training step", fmt(st["grow_s"], "s"), f"{fmt(st['plain_s'], 's')} (plain, AdamW {st['plain_optimizer']})",
              fmt(1 + st["overhead"], "x"))
    for k in ("one_stage", "several_stages"):
        o = op[k]
        label = "optimizer, one stage" if k == "one_stage" else f"optimizer, {o['stages']} stages " \
                f"({100 * o['mixed_fraction']:.0f}% mixed)"
        t.add_row(label, fmt(o["grow_s"], "s"), f"{fmt(o['torch_fused_s'], 's')} fused / "
                  f"{fmt(o['torch_foreach_s'], 's')} foreach", f"{fmt(o['ratio'], 'x')} ({o['reference']})")
    con.print(t)
    t = Table(title="3. growth through the default schedule (growth/seconds, statistics included)")
    for col in ("strategy", "growths", "last", "last / step", "share of run", "statistics"):
        t.add_column(col)
    for n, s in r["growth"]["strategies"].items():
        if "skipped" in s:
            t.add_row(n, "skipped (below)", "", "", "", "")
            continue
        name = f"{n} *" if "schedule_overrides" in s else n
        t.add_row(name, " ".join(fmt(g["seconds"], "s") for g in s["growths"]), fmt(s["last_s"], "s"),
                  fmt(s["last_vs_step"], "x"), fmt(s["run_fraction"], "%"), fmt(s["stats_fraction"], "%"))
    con.print(t)
    for n, s in r["growth"]["strategies"].items():
        if "skipped" in s:
            con.print(f"{n} skipped: {s['skipped']}")
        elif "schedule_overrides" in s:
            con.print(f"* {n} refuses the default schedule ({s['refused']}); timed with "
                      f"{' '.join(s['schedule_overrides'])}, as make compare runs it")
    t = Table(title="4. stages of the default schedule (trainer step; the last one from 1)")
    for col in ("stage", "dims", "batch", "steps", "step", "tokens/s", "MFU", "compile"):
        t.add_column(col)
    for s in r["stages"]:
        t.add_row(str(s["stage"]), s["dims"], str(s["batch_size"]), str(s["steps"]), fmt(s["step_s"], "s"),
                  fmt(s["tokens_per_s"], "tok/s"), fmt(s["mfu"], "%"), fmt(s["compile_s"], "s"))
    con.print(t)
    t = Table(title="targets")
    for col in ("target", "value", "limit", "", "note"):
        t.add_column(col)
    for name, x in r["targets"].items():
        unit = "x" if name == "optimizer_one_stage" else "%"
        status = "n/a" if x["pass"] is None else ("[green]PASS[/]" if x["pass"] else "[red]FAIL[/]")
        t.add_row(name, fmt(x["value"], unit), f"{x['op']} {fmt(x['limit'], unit)}", status,
                  x["reason"] or x["note"] or "")
    con.print(t)


# ---- main ---------------------------------------------------------------------------------------------------------


def run(args) -> dict:
    from grow.train import resolve_device

    t_start, load0 = time.perf_counter(), os.getloadavg()[0]
    device = resolve_device(args.device)
    threads = args.threads if args.threads is not None else (1 if device.type == "cpu" else 0)
    if threads:
        torch.set_num_threads(threads)
    b = Bench(args, device)
    clock = {"setup": time.perf_counter() - t_start}

    def timed(name, fn, *a):
        t0 = time.perf_counter()
        out = fn(*a)
        clock[name] = time.perf_counter() - t0
        return out

    try:
        step = timed("step", bench_step, b)
        optimizer = timed("optimizer", bench_optimizer, b)
        stages = timed("stages", stage_times, b, step)
        growth = timed("growth", bench_growth, b, stages)
        tiny = None if args.no_tiny else timed("svd_stats_tiny", bench_svd_tiny, args, b, stages, growth)
    finally:
        shutil.rmtree(b.tmp, ignore_errors=True)  # the trainer's metrics.jsonl files
    reason = mfu_reason(b)
    result = {
        "schema": SCHEMA,
        "created": time.strftime("%Y-%m-%dT%H:%M:%S%z"),
        "device": device_info(device),
        "config": {"model": b.s["model"], "model_config": b.final.to_dict(),
                   "batch_size": int(b.cfg.trainer.batch_size), "seq_len": b.final.seq_len,
                   "precision": str(b.cfg.precision), "autocast": None if b.amp is None else str(b.amp).replace("torch.", ""),
                   "compile": b.s["compile"], "schedule": str(b.cfg.schedule["name"]), "max_tokens": int(b.cfg.trainer.max_tokens),
                   "steps": b.s["steps"], "warmup": b.s["warmup"], "block": b.s["block"],
                   "stage_steps": b.s["stage_steps"], "opt_steps": args.opt_steps, "overrides": b.overrides},
        "step": step,
        "optimizer": optimizer,
        "stages": stages,
        "growth": growth,
        "svd_stats_tiny": tiny,
        "mfu": {"peak_flops": b.peak, "final_stage": stages[-1]["mfu"], "reason": reason},
    }
    result["targets"] = targets(result, b)
    result["seconds"] = time.perf_counter() - t_start
    result["section_seconds"] = clock
    result["loadavg"] = [load0, os.getloadavg()[0]]
    return result


def main(argv=None) -> int:
    args = parse_args(sys.argv[1:] if argv is None else argv)
    os.environ.setdefault("WANDB_MODE", "disabled")
    result = run(args)
    errors = check_schema(result)
    if errors:  # a bug in this script: say so rather than write an incomplete file
        raise RuntimeError("bench.json would be incomplete: " + "; ".join(errors))
    Path(args.out).write_text(json.dumps(result, indent=2) + "\n")
    print_table(result)
    failed = [n for n, t in result["targets"].items() if t["pass"] is False]
    for n in failed:
        t = result["targets"][n]
        print(f"FAIL {n}: {t['value']:.4g} (target {t['op']} {t['limit']:g}; {t['what']})")
    print(f"wrote {args.out} ({result['seconds']:.0f} s)")
    return 1 if failed and args.strict else 0


if __name__ == "__main__":
    sys.exit(main())
