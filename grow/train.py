"""The training loop: stages of a plan, a growth between consecutive stages, everything measured.

    trainer = Trainer(run_config, run_dir)   # device, data, model (fresh, or a checkpoint's), optimizer
    summary = trainer.run()                  # summary.json's contents

`Trainer.run` alternates `grow_into(stage)` and `train_stage(stage)`; `Trainer.step` is one optimizer
step (`grow.loop.advance`, which a decay branch takes too). What it reads and writes lives in its own
modules: the starting model (`grow.start`), a growth (`grow.growing`), the summary (`grow.summary`).
The flow: docs/design.md "How a run flows"; the cost counting: "Costs and memory".
"""

from __future__ import annotations

import math
import os
import time
from dataclasses import asdict
from functools import partial
from pathlib import Path

import torch

from grow import branches, checkpoint, events, growing, rss
from grow import console as ui
from grow import data as data_lib
from grow.config import RunConfig
from grow.device import DeviceBatches, Precision, peak_flops
from grow.errors import NonFiniteLoss
from grow.faults import kill_point
from grow.loop import RunParts, StageLoop, advance, eval_points, micro_batch
from grow.metrics import MetricsLogger
from grow.optim import lr_schedule, rewarm_factor
from grow.parallel import distributed, fsdp
from grow.plan import frozen_flops_per_token
from grow.run import Run
from grow.start import fresh_model, restore_model, restore_state
from grow.state import RunState
from grow.steps import FiniteCheck, Stepper, evaluate
from grow.summary import make_summary
from grow.triggers.clock import StageClock


def _quiet(*args, **kwargs) -> None:
    """Console output of ranks other than 0."""


# ---- the run --------------------------------------------------------------------------------------


class Trainer:
    """One training run: its config, device and precision, data and validation batches, model,
    optimizer, state, logger and checkpoint control (see the module docstring for the loop)."""

    def __init__(self, cfg: Run, run_dir: Path, *, stop: checkpoint.StopRequest | None = None):
        """Set the run up: device, checkpoint to resume, data, logger, model, optimizer and state."""
        t_start = time.perf_counter()
        plan = cfg.plan
        distributed.init()  # a no-op unless started by torchrun (the CLI has joined already)
        for s in plan:
            distributed.check_batch(s.batch_size, "trainer.batch_size")
        distributed.check_world_size(cfg.trainer.world_size)
        precision = Precision.of(cfg)
        torch.manual_seed(cfg.seed)
        # reliability: one run per directory; what the strategy does not do itself, said (#16)
        checkpoint.check_run_dir(Path(run_dir), cfg.resumed)
        if distributed.is_main():
            for line in cfg.strategy_warnings():
                ui.console.print(f"warning: {line}", markup=False)
        sharded = fsdp.enabled(cfg.trainer.parallel)  # what FSDP cannot run was refused earlier (fsdp.check)
        if not sharded and cfg.trainer.parallel == "fsdp":
            ui.console.print("note: trainer.parallel=fsdp in one process (no torchrun): nothing to shard, the "
                             "model trains whole (a sharded checkpoint is read whole)", markup=False)
        # under FSDP rank 0 reads the checkpoint's tensors and scatters them (`grow.parallel.fsdp.shard`)
        resumed = checkpoint.open_resume(cfg, Path(run_dir), cfg.model, plan,
                                         torch.device("cpu") if sharded else precision.device,
                                         is_main=distributed.is_main(), whole=distributed.is_main() or not sharded,
                                         log=ui.console.print)
        self.assemble(cfg, run_dir, precision, self._load_data(cfg, run_dir))
        self.t_start = t_start
        self.logger = self._logger(resumed)
        holds = distributed.is_main() or not sharded  # under FSDP only rank 0 builds the whole model
        if resumed is None:
            self.model, self.opt = fresh_model(cfg, precision) if holds else (None, None)
            self.state = RunState()
        else:
            self.model, self.opt = restore_model(resumed, cfg, precision) if holds else (None, None)
            self.state = restore_state(resumed)
        if sharded:
            kept = None if resumed is None or not holds else self.opt.state_dict()  # a fresh run: a fresh optimizer
            self.model, self.opt = growing.shard(cfg, precision, self.model, kept)
        self.wall_base = self.state.wall_seconds  # the earlier processes' wall-clock (0 for a fresh run)
        self.control = checkpoint.RunControl(
            checkpoint.Checkpointer(self.run_dir, cfg, cfg.model, keep=cfg.trainer.keep_checkpoints,
                                    is_main=distributed.is_main()),
            stop or checkpoint.StopRequest(), plan, every=cfg.trainer.ckpt_every, logger=self.logger,
            minutes=cfg.trainer.ckpt_minutes)

    def wall_seconds(self) -> float:
        """The run's wall-clock: this process's so far plus the earlier processes' (a resumed run)."""
        return self.wall_base + time.perf_counter() - self.t_start

    def assemble(self, cfg: Run, run_dir: Path, precision: Precision, data) -> "Trainer":
        """Set the run's fixed parts without any I/O; ``data`` is (token data, validation batches).
        `__init__` adds the model, optimizer, state, logger and checkpoint control; `make bench` sets
        its own (a timing stand-in for the control)."""
        self.t_start, self.load_start, self.wall_base = time.perf_counter(), os.getloadavg()[0], 0.0
        self.cfg, self.run_dir, self.plan, self.precision = cfg, Path(run_dir), cfg.plan, precision
        self.data, self.val = data
        self.batches = DeviceBatches(self.data, precision.device)
        self.strategy = cfg.growth_strategy if cfg.grows or cfg.init_by_strategy else None
        self.clock = StageClock(cfg.trigger, self.plan, cfg.trainer.max_tokens)  # when each stage ends (grow.triggers)
        peak = peak_flops(precision.device)
        self.peak = peak * distributed.world_size() if peak else None  # tokens/s are global
        self.lr_of = lr_schedule(cfg.optim, cfg.trainer.max_tokens)
        self.parts = RunParts(cfg, self.run_dir, precision, self.data, self.val, self.batches)
        return self

    # ---- setting up ----
    @staticmethod
    def _load_data(cfg: RunConfig, run_dir: Path):
        """(token data, the fixed validation batches); rank 0 builds the token cache, the others read it."""
        log = ui.console.print if distributed.is_main() else _quiet
        seq_len = cfg.model.seq_len
        with distributed.main_first():
            data = data_lib.load(cfg.data, seq_len, log=log)
        if distributed.is_main():
            data.save_tokenizer(run_dir)  # a moved run keeps its tokenizer (grow sample, grow eval)
        t = cfg.trainer
        return data, data.val_batches(t.eval_batches, t.eval_batch_size, seq_len)

    def _logger(self, resumed) -> MetricsLogger:
        wcfg = asdict(self.cfg.logger)
        wcfg["name"] = wcfg["name"] or f"{self.cfg.strategy_name}-{self.run_dir.name}"
        return MetricsLogger(self.run_dir, enabled=distributed.is_main(), wandb_cfg=wcfg, config=self.cfg.raw,
                             resume_id=resumed["wandb_id"] if resumed else None)

    # ---- the loop ----
    def run(self) -> dict:
        """Train every remaining stage, growing between them; the summary (also summary.json)."""
        state = self.state
        try:
            with self.control.stop.installed():
                for stage in self.plan[state.stage:]:
                    if state.stayed is not None:  # the trigger never fired: the run ended at that size
                        break
                    if stage.index > state.stage:  # entering a new stage: grow, checkpoint
                        self.grow_into(stage)
                    if len(state.stage_losses) <= stage.index:  # not yet trained and evaluated
                        self.train_stage(stage)
            events.emit("end", self)
            summary = make_summary(self.parts, state, self.model, state.stage_losses[-1],  # the final model
                                   trigger=self.clock.trigger.describe(), wall_seconds=self.wall_seconds(),
                                   load_start=self.load_start)
            self.logger.summary(summary)
        except NonFiniteLoss as exc:
            raise self.control.nonfinite(exc) from None
        except checkpoint.StopNow:
            raise self.control.stopped_at_once(state) from None
        finally:
            self.logger.close()
        if self.logger.enabled:
            ui.summary_table(summary)
        return summary

    def train_stage(self, stage) -> None:
        """The stage's steps, then its end: an evaluation and a checkpoint (phase ``end``)."""
        loop = self._stage_loop(stage)
        self.model.train()
        try:
            while self.state.step_in_stage < loop.limit and not self.clock.ended(self.state):
                self.step(loop)
            loop.check.flush(self.state)
        finally:
            loop.bar.close()
        stage_loss = self.evaluate()
        self.state.stage_losses.append(stage_loss)
        self.clock.finish(stage, self.state)
        if self.state.stayed is not None and self.logger.enabled:
            ui.console.print(f"trigger {self.clock.trigger.describe()} did not fire in stage {stage.number}: the run "
                             f"used its token budget there and stays at stage {stage.number}'s size "
                             f"({stage.params:,} parameters)", markup=False)
        self.logger.log({"val/loss": stage_loss, **self.state.position(), "stage": stage.number,
                         "time/seconds": self.state.train_seconds})
        self.control.boundary("end", self.model, self.opt, self.state)

    def _stage_loop(self, stage) -> StageLoop:
        t = self.cfg.trainer
        self.clock.begin(stage, self.state)
        limit = self.clock.limit(stage, self.state)
        bar = ui.StageProgress(t.progress and distributed.is_main(), stage.index, len(self.plan), limit,
                               self.state.step_in_stage)
        stepper = Stepper(self.model, self.cfg, self.precision, stage.batch_size, micro_batch(self.parts, stage))
        if getattr(self.opt, "compile", False) and stage.index > 0 and self.precision.device.type != "cpu":
            stepper.compiling = True  # torch.compile builds the per-element update again (a CPU's C kernel: once)
        return StageLoop(stage=stage, stepper=stepper,
                         check=FiniteCheck(self.precision.device, self.cfg, self.plan, self.logger), bar=bar,
                         rows=distributed.shard_range(stage.batch_size),
                         tokens_per_step=stage.batch_size * stage.cfg.seq_len,
                         flops_per_token=self.flops_per_token(stage), limit=limit,
                         # a triggered stage's length is not known ahead: it evaluates every trainer.eval_every
                         eval_points=eval_points(stage.steps, t.evals_per_stage) if self.clock.planned else frozenset())

    def flops_per_token(self, stage) -> int:
        """The stage model's training FLOPs per token: with frozen layers (``trainer.train_new_only``) those of the
        backward it still runs (`grow.plan.frozen_flops_per_token`), else `TransformerConfig.flops_per_token`."""
        if not (self.cfg.trainer.train_new_only and stage.index > 0):
            return stage.cfg.flops_per_token()
        return frozen_flops_per_token(stage.cfg, growing.trainable_layers(self.model))

    def step(self, loop: StageLoop) -> None:
        """One optimizer step, its bookkeeping, and whatever is due after it."""
        state, stage = self.state, loop.stage
        t0 = time.perf_counter()
        lo, hi = loop.rows
        lr = self.lr_of(state.tokens + loop.tokens_per_step)  # lr_at's convention: tokens at the end of the step
        if stage.index > 0:  # optim.rewarm_steps: the whole model re-warmed after a growth (G_stack's recipe)
            lr *= rewarm_factor(state.step_in_stage + 1, self.cfg.optim.rewarm_steps)
        backward = partial(events.emit, "backward", self)  # the run's steps' event (a decay branch's emit none)
        loss, gnorm, ok = advance(self.parts, loop, self.opt, state, lr, backward)  # a decay branch's: the same
        events.emit("stepped", self)
        kill_point("step")
        if ok and self.cfg.grows and self.strategy.after_step(self.model, self.opt, state.step_in_stage):
            loop.stepper = Stepper(self.model, self.cfg, self.precision, stage.batch_size, loop.stepper.micro)
        last = state.step_in_stage == loop.limit or self.clock.after_step(stage, state)
        log_now = ok and (state.step % self.cfg.trainer.log_every == 0 or last)
        if log_now:  # the log point's host sync waits for the device: step time, not logging time
            loop.check.flush(state)
            lv = distributed.global_mean(loss, hi - lo, stage.batch_size)
        self._account_time(loop, t0)
        if log_now:
            self._log_step(loop, lv, lr, gnorm)
        else:
            loop.bar.update(state.step_in_stage)
        for b in branches.due(self.parts, state):  # optim.decay_branches: before a checkpoint here, so a resume redoes it
            branches.run_branch(self.parts, b, branches.Trunk(self.model, self.opt, state, loop, self.logger))
        self._after_step(loop, last, log_now)

    def _account_time(self, loop: StageLoop, t0: float) -> None:
        """The step's wall-clock: compile time for the first step after a (re)compile, else training
        time, which also enters the throughput window with the step's tokens."""
        if loop.stepper.compiling:
            if self.precision.device.type == "cuda":
                torch.cuda.synchronize(self.precision.device)
            self.state.compile_seconds += time.perf_counter() - t0
            loop.stepper.compiling = False
            return
        dt = time.perf_counter() - t0
        self.state.train_seconds += dt
        self.state.wall_seconds = self.wall_seconds()
        loop.window_seconds += dt
        loop.window_tokens += loop.tokens_per_step

    def _drain(self, loop: StageLoop) -> None:
        """Wait for the steps queued on a GPU, as training time, before something that is not training
        (an evaluation, a checkpoint) would wait for them on its own clock."""
        if self.precision.device.type != "cuda":
            return
        t0 = time.perf_counter()
        torch.cuda.synchronize(self.precision.device)
        self.state.train_seconds += time.perf_counter() - t0
        loop.window_seconds += time.perf_counter() - t0

    def in_decay(self, tokens: int) -> bool:
        """Is a step that ended at ``tokens`` in the decay phase of optim.schedule=wsd (past 1 − decay_fraction
        of trainer.max_tokens, as `grow.optim.lr_at`)? Each logged loss there is of a batch not trained on yet
        (one epoch or less), an in-distribution estimate beside the held-out split's."""
        o = self.cfg.optim
        return o.schedule == "wsd" and tokens > (1.0 - o.decay_fraction) * self.cfg.trainer.max_tokens

    def _log_step(self, loop: StageLoop, lv: float, lr: float, gnorm) -> None:
        state = self.state
        if not math.isfinite(lv):
            raise NonFiniteLoss(f"loss is {lv} at step {state.step} (stage {loop.stage.index + 1})")
        if self.in_decay(state.tokens):  # the second endpoint: the training stream's loss over the decay phase
            state.decay_loss = [state.decay_loss[0] + lv, state.decay_loss[1] + 1]
        rec = {"train/loss": lv, "train/lr": lr, "train/grad_norm": float(gnorm), **state.position(),
               "stage": loop.stage.number, "time/seconds": state.train_seconds}
        tps = loop.window_tokens / max(loop.window_seconds, 1e-9) if loop.window_tokens else None
        if tps is not None:  # None: only a compile step since the last log point
            rec["train/tokens_per_s"] = tps
            if self.peak:
                rec["train/mfu"] = tps * loop.flops_per_token / self.peak
        rec.update(self.model.router_metrics() if self.model is not None else {})  # a mixture of experts' load-balancing and z losses (none if dense)
        if self.cfg.grows:
            rec.update(self.strategy.step_metrics())  # what the strategy's after_step holds (vt's refreshed Eq. 5)
            self.clock.logged(state, lv)
        self.logger.log(rec)
        loop.bar.update(state.step_in_stage, lv, tps)
        loop.window_seconds, loop.window_tokens = 0.0, 0

    def _after_step(self, loop: StageLoop, last: bool, log_point: bool) -> None:
        """Evaluations, recovery measurements, a periodic checkpoint and stop requests, when due."""
        state, every = self.state, self.cfg.trainer.eval_every
        evaluate = ((every and state.step % every == 0) or state.step_in_stage in loop.eval_points) and not last
        recover = any(r[1] <= state.step for r in state.recoveries)
        # under DDP the ranks agree on stop requests and a checkpoint's time (all-reduces) at log points only
        poll = log_point or last or not distributed.is_initialized()
        due = self.control.due(state, last, poll)
        saving = due or self.control.stop.signal is not None
        if evaluate or recover or saving or last:
            self._drain(loop)
        if evaluate:
            loop.check.flush(state)
            val = self.evaluate()
            self.logger.log({"val/loss": val, **state.position(), "stage": loop.stage.number,
                             "time/seconds": state.train_seconds})
            if self.cfg.grows and self.clock.after_eval(loop.stage, state, val):  # the trigger ends the stage
                self.logger.log({"growth/trigger": self.clock.trigger.name, **state.position(),
                                 "stage": loop.stage.number})
        if recover:
            loop.check.flush(state)
            self.measure_recoveries()
        if saving:
            loop.check.flush(state)
        self.control.after_step(self.model, self.opt, state, due, poll=poll)

    # ---- growth and evaluation ----
    def evaluate(self) -> float:
        loss = evaluate(self.model, self.val, self.precision.device, self.precision.amp)
        events.emit("evaluated", self, loss)
        return loss

    def grow_into(self, stage) -> None:
        """Evaluate, grow into ``stage``, evaluate again, move the optimizer, log, checkpoint (``grown``)."""
        state, t = self.state, self.cfg.trainer
        model, before_cfg = self.model, self.model.config
        loss_before = state.stage_losses[stage.index - 1]  # the previous stage's end: the same model, evaluated
        t0 = time.perf_counter()
        gen = torch.Generator().manual_seed(self.cfg.seed * 7919 + stage.index)
        measures = {}
        g = growing.GrowthInputs(self.cfg, self.precision, self.data, self.strategy, state.strategy_state, model, self.opt)
        if fsdp.enabled(t.parallel):
            measured = rss.reset_peak()  # each rank's peak resident memory during the growth (docs/distributed.md, "FSDP2")
            new_model, self.opt, res = growing.grow_sharded(g, stage, gen)
            measures = growing.sharded_growth_measures(res, rss.peak_mb() if measured else None)
        else:
            new_model, res = growing.grow_model(g, stage, gen, host=False)
            distributed.assert_same(new_model, f"growth into stage {stage.number}")
        seconds = time.perf_counter() - t0
        self.model = new_model
        loss_after = self.evaluate()
        state.strategy_state = res.state
        state.growth_flops += float(res.flops)
        state.flops += float(res.flops)
        state.train_seconds += seconds
        state.wall_seconds = self.wall_seconds()
        rec = {"growth/stage": stage.number, **state.position(), "stage": stage.number,
               "growth/params_before": model.num_params(), "growth/params_after": new_model.num_params(),
               "growth/loss_before": loss_before, "growth/loss_after": loss_after,
               "growth/delta": loss_after - loss_before, "growth/seconds": seconds, "growth/flops": float(res.flops),
               **res.metrics, **measures}
        self.logger.log(rec)
        # the one stored copy of the event (its scalars): checkpointed, in summary.json, W&B's growth table
        state.growth_events.append({k: v for k, v in rec.items() if isinstance(v, (int, float, str))})
        after = min(t.recovery_steps, self.clock.limit(stage, state))  # measured within the stage the growth entered
        state.recoveries.append([stage.number, state.step + after, loss_after, after])
        if self.logger.enabled:
            ui.growth_panel(rec, before_cfg, stage.cfg, res.metrics,
                            growing.recipe_rows(self.cfg, self.strategy, self.model, before_cfg))
        state.stage, state.step_in_stage = stage.index, 0
        self.control.boundary("grown", self.model, self.opt, state)
        events.emit("grown", self, stage)

    def measure_recoveries(self) -> None:
        """The validation loss change since each growth whose ``recovery_steps`` have passed."""
        state = self.state
        for r in [r for r in state.recoveries if r[1] <= state.step]:
            loss = self.evaluate()
            steps = r[3] if len(r) > 3 else self.cfg.trainer.recovery_steps
            self.logger.log({"growth/stage": r[0], "growth/recovery": loss - r[2], "growth/recovery_loss": loss,
                             "growth/recovery_steps": steps, **state.position()})
            for ev in state.growth_events:
                if ev["growth/stage"] == r[0]:
                    ev["growth/recovery"], ev["growth/recovery_steps"] = loss - r[2], steps
            state.recoveries.remove(r)


def train(cfg: Run, run_dir: Path, *, stop: checkpoint.StopRequest | None = None) -> dict:
    """Run ``cfg`` to the end, writing into ``run_dir``; returns the summary (also summary.json).
    ``cfg`` is the run, validated and assembled once from Hydra's config by the caller (`grow.run.load`
    checks every key and builds the plan, strategy and trigger); nothing here reads the Hydra config.

    With ``cfg.resume`` set, continues from the newest checkpoint of that run (`grow.checkpoint`).
    SIGTERM / SIGINT (or ``stop``) end it with `checkpoint.Interrupted` after a checkpoint; a
    non-finite step beyond ``trainer.skip_nonfinite`` with `NonFiniteLoss`, writing nothing more."""
    if not isinstance(cfg, Run):
        raise TypeError(f"train() takes a grow.run.Run (grow.run.load(cfg)), not {type(cfg).__name__}")
    # join the ranks' group first (a no-op without one, or where the CLI has joined under torchrun): in a
    # job that submitit starts as SLURM tasks, this is where each task learns its rank, and only rank 0
    # may take the run directory's lock
    distributed.init()
    resume = cfg.resumed
    if resume is not None:  # a finished run is left as it is (#16)
        done = resume.finished()
        if done is not None:
            if distributed.is_main():
                ui.console.print(resume.complete_message(done), markup=False)
            return done
    with checkpoint.run_lock(Path(run_dir), "resume" if cfg.resume is not None else "hydra.run.dir"):
        return Trainer(cfg, run_dir, stop=stop).run()
