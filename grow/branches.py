"""WSD decay branches (``optim.decay_branches``, docs/optimizer.md, "WSD decay branches"): one fixed-size run measures several
budgets. Budget ``b`` shares the main run's steps up to where its own decay would begin; there the run
forks (model and optimizer copied), the copy decays to ``floor(b x trainer.max_tokens)`` tokens as a
wsd run of that budget (and the main run's warmup tokens) would, is evaluated and writes
``branches/b<b>/summary.json``; then the main run goes on untouched. A branch takes the run's fixed
parts (`grow.loop.RunParts`) and its `Trunk`, never the trainer, and steps by the training's own step
(`grow.loop.advance`)."""

from __future__ import annotations

import copy
import dataclasses
import functools
import json
from dataclasses import dataclass
from pathlib import Path

from grow import checkpoint
from grow import console as ui
from grow.errors import ConfigError
from grow.loop import advance
from grow.optim.lr import lr_at
from grow.parallel import distributed
from grow.state import RunState
from grow.steps import FiniteCheck, Stepper, evaluate
from grow.validation import full_validation

SUBDIR = "branches"


def branch_dir(run_dir: Path, fraction: float) -> Path:
    return Path(run_dir) / SUBDIR / f"b{fraction:g}"


@functools.lru_cache(maxsize=None)
def _plan(o, max_tokens: int, tokens_per_step: int, fraction: float) -> tuple[int, int, int, int]:
    """(budget tokens T_b, warmup tokens, fork step k, branch steps n_b): T_b = floor(b x max_tokens) trains
    n_b = floor(T_b / tokens_per_step) steps (the fixed-size plan's count); steps 1..k have the same learning
    rate under the main run's schedule and budget b's (the shared trunk), step k + 1 the first that differs."""
    budget = int(fraction * max_tokens)
    warmup = int(o.warmup * max_tokens)
    steps = budget // tokens_per_step
    main, mine = branch_lr(o, max_tokens, warmup), branch_lr(o, budget, warmup)
    fork = 0
    while fork < steps and main((fork + 1) * tokens_per_step) == mine((fork + 1) * tokens_per_step):
        fork += 1
    return budget, warmup, fork, steps


def branch_lr(o, budget: int, warmup: int):
    """``tokens -> learning rate`` of budget ``budget`` (the wsd schedule with the main run's ``warmup`` tokens)."""
    return functools.partial(lr_at, lr=o.lr, total_tokens=budget, warmup_tokens=warmup, schedule="wsd",
                             min_lr_ratio=o.min_lr_ratio, decay_fraction=o.decay_fraction)


def plan(cfg, fraction: float) -> dict:
    """Budget ``fraction``'s figures under run ``cfg``: tokens, warmup tokens, fork step and steps."""
    stage = cfg.plan[0]
    budget, warmup, fork, steps = _plan(cfg.optim, cfg.trainer.max_tokens, stage.batch_size * stage.cfg.seq_len,
                                        fraction)
    return {"fraction": fraction, "tokens": budget, "warmup_tokens": warmup, "fork_step": fork, "steps": steps}


def check(run) -> None:
    """The branches of ``run`` can be exact: wsd, a fixed size, unsharded (one process or DDP), each budget's
    decay starting after the warmup and inside the run (a step to decay, a step of trunk)."""
    branches = run.optim.decay_branches
    if not branches:
        return
    key = "optim.decay_branches"
    if run.optim.schedule != "wsd":
        raise ConfigError(key, list(branches), f"needs optim.schedule=wsd (got {run.optim.schedule}), or []")
    if run.grows:
        raise ConfigError(key, list(branches), "is for a fixed-size run: drop the growth schedule (schedule=null), or []")
    if run.trainer.parallel == "fsdp":
        raise ConfigError(key, list(branches), "needs trainer.parallel=ddp (an FSDP model is not copied), or []")
    o = run.optim
    for b in branches:
        if (1 - o.decay_fraction) * int(b * run.trainer.max_tokens) <= int(o.warmup * run.trainer.max_tokens):
            raise ConfigError(key, b, f"budget {b:g}'s decay must start after the warmup: need (1 - optim.decay_fraction) "
                                      f"x {b:g} > optim.warmup={o.warmup:g}")
        p = plan(run, b)
        if not 0 < p["fork_step"] < p["steps"]:
            raise ConfigError(key, b, f"budget {b:g} is {p['steps']} steps, sharing {p['fork_step']}: raise "
                                      "trainer.max_tokens or the fraction")


def describe(run) -> list[str]:
    """`grow schedule`'s lines: each branch's budget, fork, decay and FLOPs (the budget's and those it adds)."""
    stage = run.plan[0]
    per_step = stage.cfg.flops_per_token() * stage.batch_size * stage.cfg.seq_len
    out = []
    for b in run.optim.decay_branches:
        p = plan(run, b)
        out.append(f"decay branch {b:g}: {p['tokens']:,} tokens, {p['steps']} steps sharing the first {p['fork_step']} "
                   f"with the main run; {p['steps'] * per_step:.4g} FLOPs as a budget, "
                   f"+{(p['steps'] - p['fork_step']) * per_step:.4g} FLOPs to the run ({branch_dir('', b)}/)")
    return out


@dataclass
class Trunk:
    """The main run where a branch forks: its model, optimizer and state after the fork step, the stage's
    loop (`grow.loop.StageLoop`) and the logger; a branch copies the first three and changes none."""

    model: object
    opt: object
    state: RunState
    loop: object  # grow.loop.StageLoop
    logger: object  # grow.metrics.MetricsLogger


def due(parts, state: RunState) -> list[float]:
    """The branches to fork after the step just taken (their summaries not yet written: a resumed run
    does not repeat one)."""
    cfg = parts.cfg
    return [b for b in cfg.optim.decay_branches if plan(cfg, b)["fork_step"] == state.step
            and not (branch_dir(parts.run_dir, b) / "summary.json").is_file()]


def run_branch(parts, fraction: float, trunk: Trunk) -> dict:
    """Fork at the current step, decay budget ``fraction`` to its end on a copy, evaluate, write its
    summary; the main run's model, optimizer, state and random generators are as before."""
    cfg, stage = parts.cfg, trunk.loop.stage
    p = plan(cfg, fraction)
    rng = checkpoint.rng_state()
    model, opt = copy.deepcopy((trunk.model, trunk.opt))  # one memo: the copy's optimizer holds the copy's parameters
    mine, flops = copy.deepcopy(trunk.state), trunk.state.flops
    lr_of = branch_lr(cfg.optim, p["tokens"], p["warmup_tokens"])
    # the training's loop on the copy: its own wrapper and finite check, the stage's rows and counts
    loop = dataclasses.replace(trunk.loop, stepper=Stepper(model, cfg, parts.precision, stage.batch_size,
                                                           trunk.loop.stepper.micro),
                               check=FiniteCheck(parts.precision.device, cfg, cfg.plan, trunk.logger))
    lo, hi = loop.rows
    rows = []
    model.train()
    for _ in range(p["steps"] - p["fork_step"]):
        lr = lr_of(mine.tokens + loop.tokens_per_step)
        loss, _, _ = advance(parts, loop, opt, mine, lr)
        loss = distributed.global_mean(loss, hi - lo, stage.batch_size)  # this rank's rows' mean -> the batch's
        rows.append({"train/step": mine.step, "train/tokens": mine.tokens, "train/lr": lr, "train/loss": loss})
    loop.check.flush(mine)
    final = {"final_val_loss": evaluate(model, parts.val, parts.precision.device, parts.precision.amp),
             **full_validation(parts, model)}
    summary = _summary(parts, model, fraction, p, mine, flops, final)
    _write(branch_dir(parts.run_dir, fraction), summary, rows)
    checkpoint.set_rng_state(rng)
    if trunk.logger.enabled:
        ui.console.print(f"decay branch {fraction:g}: {p['tokens']:,} tokens, final val loss "
                         f"{summary['final_val_loss']:.4f} ({branch_dir(parts.run_dir, fraction)})", markup=False)
    return summary


def _summary(parts, model, fraction: float, p: dict, mine, trunk: float, final: dict) -> dict:
    o = parts.cfg.optim
    return {
        "branch_of": str(parts.run_dir), "strategy": "baseline", "seed": parts.cfg.seed, "stages": 1,
        **p, **final,
        "tokens": mine.tokens, "flops": mine.flops, "train_flops": mine.flops, "growth_flops": 0.0,
        "trunk_flops": trunk, "marginal_flops": mine.flops - trunk,  # the budget's FLOPs = the shared trunk's + its decay's
        "params": model.num_params(), "final_config": model.config.to_dict(),
        # the from-scratch run this branch equals (docs/optimizer.md)
        "equivalent": {"trainer.max_tokens": p["tokens"], "optim.warmup": p["warmup_tokens"] / p["tokens"],
                       "optim.schedule": "wsd", "optim.decay_fraction": o.decay_fraction},
        "complete": True,
    }


def _write(d: Path, summary: dict, rows: list[dict]) -> None:
    if not distributed.is_main():
        return
    d.mkdir(parents=True, exist_ok=True)
    with open(d / "steps.jsonl", "w") as f:
        for r in rows:
            f.write(json.dumps(r) + "\n")
    (d / "summary.json").write_text(json.dumps(summary, indent=2))


def read_branches(run_dir: Path) -> list[dict]:
    """The decay branches a run wrote (their summaries), by fraction: the report's fixed-size budget points
    (`grow.report.frontier`)."""
    out = []
    for path in sorted(Path(run_dir).glob(f"{SUBDIR}/b*/summary.json")):
        s = json.loads(path.read_text())
        if s.get("complete"):
            out.append({k: s[k] for k in ("fraction", "tokens", "flops", "marginal_flops", "final_val_loss")})
    return sorted(out, key=lambda b: b["fraction"])

