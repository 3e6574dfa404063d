"""3. growth: each strategy's growths through the default schedule (`grow.train.Trainer.grow_into`:
growth batches, statistics passes, the growth, the optimizer move; not the evaluations around it),
against one training step at the grown size, and the share of the default run's wall-clock they
take: sum(growth s) / (sum over stages of steps x step time + sum(growth s)); for a strategy that declares the
training its source runs after a growth (`Strategy.reference_training_steps`: ligo), the same share on that plan
too (the default run's stages scaled so that the last one trains that many steps). Also svd's statistics
passes as a share of the run on the tiny CPU config."""

from __future__ import annotations

import shutil

import torch

from benchmarks.common import Bench, StepTimer, compose, median, plan_of, sync
from benchmarks.stages import stage_times


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
    cfg.growth_strategy.initialize(model, torch.Generator().manual_seed(0))
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


def reference_share(strategy, stages: list[dict], growths: list[dict]) -> dict | None:
    """The growths' share of the plan ``strategy``'s source runs (`Strategy.reference_training_steps` after a
    growth): the default run's stages, each's steps x ``scale`` so that the last trains that many (at least the
    default's), at the measured step times, with the measured growths; None where it declares none."""
    steps = strategy.reference_training_steps
    if steps is None:
        return None
    scale = max(1.0, steps / stages[-1]["steps"])
    return {"last_stage_steps": steps, "scale": scale,
            **run_share([{**r, "steps": r["steps"] * scale} for r in stages], growths)}


def bench_growth(b: Bench, stages: list[dict]) -> dict:
    """(3): each strategy's growths through the default schedule (median over ``--growth-repeats``
    chains, strategies interleaved), against one step at the grown size and the run's wall-clock."""
    from grow.config import ConfigError

    cfgs, skipped = {}, {}
    for n in [n for n in b.args.strategies.split(",") if n]:
        try:
            cfgs[n] = compose(b.s["model"], b.overrides, strategy=n)
        except ConfigError as exc:  # the strategy refuses this schedule, as `grow train` would
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
                  **run_share(stages, growths),
                  "reference_plan": reference_share(cfgs[n].growth_strategy, stages, growths)}
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
