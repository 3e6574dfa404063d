"""The step machinery of the loop: a step's forward and backward over micro-batches (`Stepper`), the
check that its loss and gradient are finite (`FiniteCheck`), evaluation on the fixed validation
batches, and the batches data-driven strategies read at a growth."""

from __future__ import annotations

import contextlib

import torch

from grow import console as ui
from grow import kernels
from grow.config import RunConfig
from grow.device import Precision, autocast, to_device
from grow.errors import ConfigError, NonFiniteLoss
from grow.faults import kill_point
from grow.model import routing_counts_summed
from grow.parallel import distributed, fsdp
from grow.state import RunState


@torch.no_grad()
def evaluate(model, batches, device, amp) -> float:
    """Mean cross-entropy over the fixed validation batches (split across ranks, then summed). A
    sharded model's forward is collective: a rank with one batch fewer than the others runs its first
    batch once more, uncounted."""
    was_training = model.training
    model.eval()
    total = 0.0
    mine = batches[distributed.rank()::distributed.world_size()]
    rounds = -(-len(batches) // distributed.world_size()) if fsdp.is_sharded_model(model) else len(mine)
    for i in range(rounds):
        x, y = to_device(mine[i] if i < len(mine) else batches[0], device)
        with autocast(device, amp):
            _, loss = model(x, y)
        if i < len(mine):
            total += float(loss)
        kill_point("eval")
    model.train(was_training)
    return distributed.sum_float(total) / len(batches)


def growth_batches(data, seed: int, stage: int, n: int, batch_size: int, seq_len: int):
    """Batches for data-driven strategies, from a stream of their own (not training tokens)."""
    stream = 1_000_003 * (seed + 1) + stage
    return [data.batch(stream, i * batch_size, batch_size, seq_len) for i in range(n)]


class Stepper:
    """Forward and backward of one step's batch through the (possibly compiled, DDP-wrapped) model,
    in micro-batches of at most ``micro`` rows.

    The batch's gradient is accumulated over micro-batches, each micro-batch's mean loss weighted by
    its share of the global batch's tokens (every row holds ``seq_len`` targets, all counted), so the
    update equals the whole batch's; an uneven last micro-batch is weighted by its own rows. Under DDP
    the gradients are all-reduced once, on the last micro-batch (``no_sync`` before it). Clipping
    applies to the accumulated gradient. Built afresh for each stage and after a change of the
    model's structure. With ``trainer.compile=true`` the model is compiled again
    (``torch.compiler.reset()`` first, since the shapes changed); the first step after a (re)compile
    is timed as compile time."""

    def __init__(self, model, cfg: RunConfig, precision: Precision, global_batch: int, micro: int | None = None):
        self.model, self.precision = model, precision
        self.clip, self.trainer = cfg.trainer.grad_clip, cfg.trainer
        self.sharded = fsdp.is_sharded_model(model)  # FSDP2: already wrapped (grow.parallel.fsdp); else DDP in a multi-process run
        self.ddp = self.forward = model if self.sharded else distributed.wrap(model, precision.device)
        self.loss_scale = distributed.loss_scale(global_batch)  # this rank's share of the global batch
        self.micro, self.global_batch = micro, global_batch
        self.moe = bool(getattr(getattr(model, "config", None), "moe", False))  # its balance loss sums routing counts
        self.compiling = cfg.trainer.compile
        if self.compiling:
            torch.compiler.reset()
            self.forward = torch.compile(self.forward)

    def __call__(self, x, y):
        """This rank's mean loss over its rows (a detached tensor: no host sync) and the pre-clipping
        gradient norm."""
        rows = x.shape[0]
        chunks = self._chunks(rows)
        total = None
        for i, (lo, hi) in enumerate(chunks):
            share = (hi - lo) / rows
            with self._accumulating(last=i == len(chunks) - 1):
                loss = self._backward(x[lo:hi], y[lo:hi], self.loss_scale * share)
            part = loss if share == 1.0 else loss * share
            total = part if total is None else total + part
        params = [p for p in self.model.parameters() if p.grad is not None]
        gnorm = torch.nn.utils.clip_grad_norm_(params, self.clip if self.clip > 0 else float("inf"))
        if self.sharded:  # the norm over the shards, reduced
            gnorm = gnorm.full_tensor()
        return total, gnorm

    def _chunks(self, rows: int) -> list[tuple[int, int]]:
        """This rank's micro-batches, as row ranges: ``micro`` rows each, the last one what is left.
        Sharded, every rank runs as many as the rank with the most rows (a forward is collective),
        its rows split as evenly as they go."""
        micro = rows if self.micro is None else min(self.micro, rows)
        if not self.sharded or self.micro is None:
            return [(lo, min(lo + micro, rows)) for lo in range(0, rows, micro)]
        most = -(-self.global_batch // distributed.world_size())
        n = -(-most // self.micro)
        if rows < n:
            raise ConfigError("trainer.micro_batch_size", self.micro, f"a larger size: with trainer.parallel=fsdp "
                              f"every rank runs {n} micro-batches (a global batch of {self.global_batch} on "
                              f"{distributed.world_size()} ranks), and this rank has {rows} rows")
        bounds = [lo * rows // n for lo in range(n + 1)]
        return list(zip(bounds[:-1], bounds[1:]))

    def _accumulating(self, last: bool):
        """No gradient reduction before the last micro-batch (DDP's ``no_sync``, FSDP2's
        ``set_requires_gradient_sync``)."""
        if last:
            return contextlib.nullcontext()
        if self.sharded:
            return fsdp.gradient_sync(self.model, False)
        return contextlib.nullcontext() if self.ddp is self.model else self.ddp.no_sync()

    def _counts_summed(self):
        """A mixture of experts' routing counts summed over the ranks in a step (`grow.model.routing_counts_summed`):
        each micro-batch's balance loss is that of the ranks' rows together."""
        if not (self.moe and distributed.is_initialized() and distributed.world_size() > 1):
            return contextlib.nullcontext()
        return routing_counts_summed(distributed.all_reduce_sum)

    def _backward(self, x, y, weight: float):
        """Forward and backward of one micro-batch, its loss weighted by ``weight``; its detached loss."""
        with kernels.training(self.trainer):
            with self.precision.autocast(), self._counts_summed():
                _, loss = self.forward(x, y)
            (loss if weight == 1.0 else loss * weight).backward()
        return loss.detach()


def defer_finite_checks(device: torch.device, cfg: RunConfig) -> bool:
    """Whether `FiniteCheck` reads a step's verdict later: on CUDA, when bad steps are not skipped."""
    return device.type == "cuda" and cfg.trainer.skip_nonfinite == 0


class FiniteCheck:
    """`verdict` for every step, without a host sync in the step where the run allows it.

    With ``trainer.skip_nonfinite > 0`` a bad step must not update the weights, so its verdict is
    read at once (one host sync per step; free on CPU, where nothing is asynchronous). Otherwise (the
    default) a bad step need only stop the run before anything sees its weights: on CUDA the step's
    loss and gradient norm are copied to pinned host memory without blocking, an event marks the
    copy, and the verdict is read one step later, after the next step's forward and backward are
    queued (the GPU has passed the event by then), or at once by `flush` where the loop reads the
    model: log points, evaluations, recovery measurements, checkpoints and the stage's end. The
    error names the bad step as the immediate check does; nothing is logged, evaluated or saved
    from its weights."""

    def __init__(self, device: torch.device, cfg: RunConfig, plan, logger):
        self.deferred = defer_finite_checks(device, cfg)
        self.cfg, self.plan, self.logger = cfg, plan, logger
        self.pending = None

    def __call__(self, loss, gnorm, state: RunState, stage) -> bool:
        """Whether this step may update the weights; raises `NonFiniteLoss` for a bad (earlier) step."""
        if not self.deferred:
            return self.verdict(loss, gnorm, state, stage)
        self.flush(state)  # the previous step's verdict
        values = torch.stack([loss.detach().float(), gnorm.detach().float()]).to("cpu", non_blocking=True)
        event = None
        if loss.device.type == "cuda":
            event = torch.cuda.Event()
            event.record()
        self.pending = (values, event, stage, state.step + 1, state.step_in_stage + 1)
        return True

    def flush(self, state: RunState) -> None:
        """Read the pending verdict (waits for its step only); raises `NonFiniteLoss` if it was bad."""
        if self.pending is None:
            return
        values, event, stage, step, in_stage = self.pending
        self.pending = None
        if event is not None:
            event.synchronize()
        self.verdict(values[0], values[1], state, stage, at=(step, in_stage))

    def verdict(self, loss, gnorm, state: RunState, stage, at: tuple[int, int] | None = None) -> bool:
        """Whether the step just computed may update the weights (one host sync per step).

        A NaN or infinite loss or gradient norm skips the update while the run has skipped at most
        ``trainer.skip_nonfinite`` steps (the batch is consumed, nothing else moves); beyond that,
        `NonFiniteLoss` naming the step and the stage. Multi-process runs decide on the gradient norm
        alone, the same on every rank after DDP's all-reduce. ``at``: (step, step in stage), 1-based,
        of the step checked when that is not the one just computed (`FiniteCheck`)."""
        bad = ~torch.isfinite(gnorm) if distributed.is_initialized() else ~(torch.isfinite(loss) & torch.isfinite(gnorm))
        if not bool(bad):
            return True
        allowed = self.cfg.trainer.skip_nonfinite
        state.skipped_nonfinite += 1
        step, in_stage = at or (state.step + 1, state.step_in_stage + 1)
        where = f"step {step} (stage {stage.index + 1}/{len(self.plan)}, step {in_stage} of {stage.steps})"
        what = f"non-finite loss ({float(loss)}) or gradient norm ({float(gnorm)}) at {where}"
        if state.skipped_nonfinite > allowed:
            after = f", after skipping {allowed} such step(s) (trainer.skip_nonfinite={allowed})" if allowed else ""
            raise NonFiniteLoss(f"{what}{after}")
        self.logger.log({"train/skipped_nonfinite": state.skipped_nonfinite, "train/step": step,
                          "train/tokens": state.tokens, "train/flops": state.flops, "stage": stage.number})
        if self.logger.enabled:
            ui.console.print(f"warning: {what}: update skipped ({state.skipped_nonfinite} of trainer.skip_nonfinite="
                             f"{allowed})")
        return False
