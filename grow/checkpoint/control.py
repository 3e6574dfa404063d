"""Run control: when the trainer writes a checkpoint (`RunControl`, `Checkpointer`), stop requests (SIGTERM,
SIGINT: a checkpoint, then `Interrupted`), and the exit status of every outcome (`run_outcomes`).

A full disk while writing a checkpoint is `grow.errors.DiskFull` (exit status 4), the earlier
checkpoints intact; a non-finite step beyond ``trainer.skip_nonfinite`` exits with `NONFINITE_EXIT`.
"""

from __future__ import annotations

import signal
import sys
import threading
import time
from contextlib import contextmanager
from dataclasses import asdict
from pathlib import Path

import torch

from grow.checkpoint import shards
from grow.checkpoint.files import FORMAT, checkpoint_dir, latest, prune, rng_state, stem, write
from grow.checkpoint.resume import task_overrides
from grow.errors import DISK_FULL_EXIT, DiskFull, NonFiniteLoss
from grow.faults import kill_point
from grow.parallel import distributed

EXIT_CODES = {"SIGTERM": 0, "SIGINT": 130}  # preemption is a normal end; Ctrl-C is 128 + SIGINT


NONFINITE_EXIT = 3


class Interrupted(Exception):
    """A stop request (SIGTERM, SIGINT) honoured: the step finished and a checkpoint was written."""

    def __init__(self, signal_name: str, message: str):
        super().__init__(message)
        self.signal_name, self.message = signal_name, message
        self.exit_code = EXIT_CODES.get(signal_name, 1)


class StopNow(KeyboardInterrupt):
    """A second SIGINT (Ctrl-C) during a run: stop at once, without the step's end or a checkpoint (a
    KeyboardInterrupt, so no ``except Exception`` swallows it; `Trainer.run` turns it into `Interrupted`)."""


class Checkpointer:
    """Writes a run's checkpoints (only where ``is_main``) and keeps the newest ``keep``."""

    def __init__(self, run_dir: Path, cfg, final_cfg, *, keep: int, is_main: bool = True):
        self.run_dir, self.keep, self.is_main = Path(run_dir), int(keep), is_main
        self.final = final_cfg.to_dict()
        self.config = cfg.raw  # the resolved config (grow.config.RunConfig.raw)
        self.overrides = task_overrides()
        self.last: Path | None = None
        self.last_meta: dict | None = None
        if is_main:
            found = latest(self.run_dir) if checkpoint_dir(self.run_dir).is_dir() else None
            self.last = Path(found["path"]) if found else None
            self.last_meta = found

    def save(self, phase: str, model, opt, state, logger) -> Path | None:
        """Write a checkpoint (rank 0; under FSDP every rank writes its shards first, `shards`)."""
        sharded = None
        if opt.sharded:  # an FSDP run: every rank takes part
            tensors, rest, opt_sd = shards.split(model, opt)
            where = {"phase": phase, "step": state.step, "stage": state.stage}
            sharded = {"shard_files": shards.write(checkpoint_dir(self.run_dir), stem(where), tensors),
                       "shards": shards.dir_name(stem(where))}
            stored = {"model": rest, "optimizer": opt_sd, "shards": sharded["shards"]}
        if not self.is_main:
            return None
        if sharded is None:
            stored = {"model": model.state_dict(), "optimizer": opt.state_dict()}
        payload = {
            "format": FORMAT,
            "phase": phase,
            "model_config": model.config.to_dict(),
            "final_config": self.final,
            **stored,
            "state": asdict(state),
            "rng": rng_state(),
            "wandb_id": logger.wandb_id,
            "metrics_offset": logger.offset,
            "config": self.config,
            "overrides": self.overrides,
            "torch_version": str(torch.__version__),
            "time": time.time(),
        }
        meta = {
            "phase": phase, "step": state.step, "stage": state.stage, "step_in_stage": state.step_in_stage,
            "tokens": state.tokens, "samples": state.samples, "model_config": payload["model_config"],
            "final_config": self.final, "optimizer_kind": getattr(opt, "kind", None), "overrides": self.overrides,
            "wandb_id": logger.wandb_id, "time": payload["time"], **(sharded or {}),
        }
        path = write(self.run_dir, payload, meta)
        prune(self.run_dir, self.keep)
        kill_point("ckpt.prune")
        self.last, self.last_meta = path, meta
        return path


class StopRequest:
    """SIGTERM and SIGINT ask the run to stop: the current step finishes, a checkpoint is written, and
    the run exits (0 for SIGTERM, a preemption; 130 for SIGINT). A second SIGINT stops at once.

    `poll` is asked at every safe point (after each step, after each growth or stage end); in a
    multi-process run every rank gets the same answer (any rank's request stops all)."""

    def __init__(self):
        self.signal: str | None = None

    def _handler(self, signum, frame) -> None:
        name = signal.Signals(signum).name
        if self.signal == "SIGINT" and name == "SIGINT":
            raise StopNow  # asked twice: stop now (checkpoints are atomic; the last one stays)
        self.signal = self.signal or name

    @contextmanager
    def installed(self):
        """Handle SIGTERM and SIGINT while the block runs (the previous handlers come back after)."""
        if threading.current_thread() is not threading.main_thread():
            yield self
            return
        previous = {s: signal.signal(s, self._handler) for s in (signal.SIGTERM, signal.SIGINT)}
        try:
            yield self
        finally:
            for s, h in previous.items():
                signal.signal(s, h)

    def poll(self, state, where: str) -> str | None:
        if distributed.is_initialized():
            if distributed.sum_float(1.0 if self.signal else 0.0) > 0:
                return self.signal or "SIGTERM"
            return None
        return self.signal


class RunControl:
    """What the training loop consults at its safe points: checkpoints and stop requests.

    A periodic checkpoint is due every ``every`` steps, and once ``minutes`` of wall-clock have passed
    since the last checkpoint (or the process's start), so that a run without growths, killed, loses at
    most that much (docs/distributed.md, "When a checkpoint is written")."""

    def __init__(self, ckpt: Checkpointer, stop: StopRequest, plan, *, every: int, logger, minutes: float = 0.0,
                 clock=time.monotonic):
        self.ckpt, self.stop, self.plan, self.every, self.logger = ckpt, stop, plan, int(every), logger
        self.minutes, self.clock = float(minutes), clock
        self.since = clock()

    def save(self, phase: str, model, opt, state) -> Path | None:
        path = self.ckpt.save(phase, model, opt, state, self.logger)
        self.since = self.clock()
        return path

    def due(self, state, last: bool, poll: bool = True) -> bool:
        """Whether a periodic checkpoint is due after this step (never a stage's last: its end writes one).
        The clock is read at poll points only; under several ranks rank 0's clock decides for all."""
        if last:
            return False
        if self.every and state.step % self.every == 0:
            return True
        if not self.minutes or not poll:
            return False
        late = self.clock() - self.since >= 60.0 * self.minutes
        if distributed.is_initialized():  # every rank takes part in a sharded save: they must agree
            late = distributed.sum_float(1.0 if late and distributed.is_main() else 0.0) > 0
        return late

    def after_step(self, model, opt, state, due: bool, poll: bool = True) -> None:
        """After a step (logged, evaluated, recoveries measured): a periodic checkpoint when ``due``
        (`due`), and a stop request when ``poll`` (the trainer polls at every step alone, at log points
        under DDP)."""
        saved = False
        if due:
            self.save("step", model, opt, state)
            saved = True
        if poll or saved:
            self._check_stop("step", model, opt, state, saved)

    def boundary(self, phase: str, model, opt, state) -> None:
        """A stage trained and evaluated (``end``, before growing) or a growth done (``grown``)."""
        self.save(phase, model, opt, state)
        self._check_stop(phase, model, opt, state, True)

    def where(self, state) -> str:
        stage = self.plan[state.stage]
        return (f"step {state.step} (stage {state.stage + 1}/{len(self.plan)}, step {state.step_in_stage} of "
                f"{stage.steps}, {state.tokens} tokens)")

    def _check_stop(self, where: str, model, opt, state, saved: bool) -> None:
        name = self.stop.poll(state, where)
        if name is None:
            return
        if not saved:
            self.save("step", model, opt, state)
        run_dir = self.ckpt.run_dir
        msg = (f"stopped by {name} at {self.where(state)}; checkpoint {self.ckpt.last}\n"
               f"resume with: grow train resume={run_dir}")
        raise Interrupted(name, msg)

    def stopped_at_once(self, state) -> Interrupted:
        """A second Ctrl-C (`StopNow`): one line saying where the run was and which checkpoint stays."""
        run_dir = self.ckpt.run_dir  # the newest complete checkpoint on disk: one cut short is not counted
        m = latest(run_dir) if self.ckpt.is_main and checkpoint_dir(run_dir).is_dir() else None
        kept = ("no checkpoint was written yet: run the command again" if m is None else
                f"the last checkpoint {m['path']} (step {m['step']}) is intact: resume with: grow train "
                f"resume={run_dir}")
        return Interrupted("SIGINT", f"stopped at once by a second Ctrl-C at {self.where(state)}; {kept}")

    def nonfinite(self, exc: NonFiniteLoss) -> NonFiniteLoss:
        """The error with where the last good checkpoint is and how to go on."""
        m = self.ckpt.last_meta
        if self.ckpt.last is None or m is None:
            tail = "no checkpoint was written before it"
        else:
            tail = (f"the last good checkpoint is {self.ckpt.last} (step {m['step']}), untouched: resume with "
                    f"`grow train resume={self.ckpt.run_dir}` and a lower optim.lr, or allow skipping bad steps "
                    "with trainer.skip_nonfinite=N")
        return NonFiniteLoss(f"{exc}; {tail}")


@contextmanager
def run_outcomes():
    """The command's end for a stop request (its message; exit 0 or 130), a non-finite loss (exit 3)
    or a full disk (exit 4)."""
    try:
        yield
    except Interrupted as exc:
        print(exc.message, file=sys.stderr)
        sys.exit(exc.exit_code)
    except NonFiniteLoss as exc:
        print(f"error: {exc}", file=sys.stderr)
        sys.exit(NONFINITE_EXIT)
    except DiskFull as exc:
        print(f"error: {exc}", file=sys.stderr)
        sys.exit(DISK_FULL_EXIT)
