"""The step loop's shared pieces: what a run fixes before it trains (`RunParts`), what one stage's steps
share (`StageLoop`), and one optimizer step's arithmetic (`advance`), which the training loop
(`grow.train.Trainer.step`) and a WSD decay branch (`grow.branches.run_branch`) both take, so a branch's
steps are the training's steps by construction. The flow: docs/design.md "How a run flows".
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from pathlib import Path

from grow import console as ui
from grow.device import DeviceBatches, Precision
from grow.memory import auto_micro_batch, memory_budget, optimizer_kind, shards_of
from grow.parallel import distributed
from grow.state import RunState
from grow.steps import FiniteCheck, Stepper


@dataclass
class RunParts:
    """A run's fixed parts, set once before it trains: what a summary, a decay branch or a growth reads
    of the run besides the model, optimizer and state (never the whole trainer)."""

    cfg: object  # grow.run.Run
    run_dir: Path
    precision: Precision
    data: object  # grow.data.TokenData, or a stand-in (scripts/gpu_check.py's random tokens)
    val: list  # the fixed validation batches
    batches: DeviceBatches  # the training batches, by sample index


@dataclass
class StageLoop:
    """What one stage's steps share: its wrapper, its rows of each global batch, its counters."""

    stage: object  # grow.plan.Stage
    stepper: Stepper
    check: FiniteCheck
    bar: ui.StageProgress
    rows: tuple[int, int]  # this rank's rows [lo, hi) of each global batch
    tokens_per_step: int
    flops_per_token: int
    eval_points: frozenset  # steps of the stage (1-based) after which to evaluate (trainer.evals_per_stage)
    limit: int  # the most steps the stage may take (the plan's; under a trigger, what the budget leaves)
    window_seconds: float = 0.0  # the throughput window since the last log point: training steps only
    window_tokens: int = 0  # (no compile step, evaluation, recovery measurement or checkpoint write)


def advance(parts: RunParts, loop: StageLoop, opt, state: RunState, lr: float, backward=None) -> tuple:
    """One optimizer step of ``loop``'s model at learning rate ``lr``: the next global batch's rows of this
    rank (by ``state.samples``: a resumed run and a branch read the batches the run would), forward and
    backward, ``backward(loss, gnorm)`` if given (the run's ``backward`` event, `grow.events`), the finite
    check, the update unless skipped, and ``state``'s counters. (loss, gnorm, ok)."""
    stage = loop.stage
    lo, hi = loop.rows
    x, y = parts.batches.get(parts.cfg.seed, state.samples + lo, hi - lo, stage.cfg.seq_len)
    loss, gnorm = loop.stepper(x, y)
    if backward is not None:
        backward(loss, gnorm)
    ok = loop.check(loss, gnorm, state, stage)
    if ok:
        opt.step(lr=lr)
    opt.zero_grad(set_to_none=True)
    state.step += 1
    state.step_in_stage += 1
    state.samples += stage.batch_size
    state.tokens += loop.tokens_per_step
    state.flops += loop.flops_per_token * loop.tokens_per_step
    return loss, gnorm, ok


def micro_batch(parts: RunParts, stage) -> int | None:
    """Rows per forward/backward on this rank in ``stage`` (None: all of them at once):
    ``trainer.micro_batch_size``, or for ``auto`` the memory plan's pick on CUDA (`grow.memory`)."""
    lo, hi = distributed.shard_range(stage.batch_size)
    micro = parts.cfg.trainer.micro_batch_size
    if micro is None and parts.precision.device.type == "cuda":
        micro = auto_micro_batch(stage.cfg, hi - lo, memory_budget(parts.cfg, parts.precision.device),
                                 optimizer=optimizer_kind(parts.cfg.optim), amp=parts.precision.amp,
                                 shards=shards_of(parts.cfg, distributed.world_size()),
                                 compiled=parts.cfg.trainer.compile) or 1
    return None if micro is None or micro >= hi - lo else micro


def eval_points(steps: int, per_stage: int) -> frozenset:
    """The steps of a stage of ``steps`` steps after which to evaluate, besides its end: ``per_stage - 1``
    of them, evenly spaced (the end makes ``per_stage`` evaluations per stage)."""
    return frozenset(math.ceil(j * steps / per_stage) for j in range(1, per_stage)) - {steps, 0}
