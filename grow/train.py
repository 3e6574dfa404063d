"""The training loop: stages of a plan, a growth between consecutive stages, everything measured.

    trainer = Trainer(run_config, run_dir)   # device, data, model (fresh, or a checkpoint's), optimizer
    summary = trainer.run()                  # summary.json's contents

`Trainer.run` alternates `grow_into(stage)` and `train_stage(stage)`; `Trainer.step` is one optimizer
step. The flow: docs/design.md §2, "How a run flows"; the cost counting: §8.
"""

from __future__ import annotations

import json
import math
import os
import time
from dataclasses import asdict, dataclass, field, fields
from pathlib import Path

import numpy as np
import torch

from grow import branches, checkpoint, events, mup, rss
from grow import console as ui
from grow import data as data_lib
from grow.checkpoint_eval import cross_entropy_sum, package_losses, windows
from grow.config import RunConfig
from grow.data.floor import bigram_floor, bytes_per_token
from grow.device import DeviceBatches, Precision, peak_flops, to_device
from grow.errors import NonFiniteLoss
from grow.faults import kill_point
from grow.growth import Passes, grow
from grow.growth.masks import build_model
from grow.growth.stack import BlockCopies
from grow.hf import pretrained
from grow.memory import auto_micro_batch, memory_budget, optimizer_kind, shards_of
from grow.metrics import GROWTH_COLUMNS, MetricsLogger
from grow.model import Transformer, TransformerConfig
from grow.optim import build_optimizer, lr_schedule, rewarm_factor
from grow.parallel import distributed, fsdp, fsdp_growth
from grow.plan import frozen_flops_per_token
from grow.provenance import code_version, machine
from grow.run import Run
from grow.state import RunState
from grow.steps import FiniteCheck, Stepper, evaluate, growth_batches
from grow.triggers.clock import StageClock


def _quiet(*args, **kwargs) -> None:
    """Console output of ranks other than 0."""




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



# ---- the run --------------------------------------------------------------------------------------


class Trainer:
    """One training run: its config, device and precision, data and validation batches, model,
    optimizer, state, logger and checkpoint control (see the module docstring for the loop)."""

    def __init__(self, cfg: Run, run_dir: Path, *, stop: checkpoint.StopRequest | None = None):
        """Set the run up: the device, the checkpoint to resume from, the data, the logger, and the
        model, optimizer and state (fresh, or the checkpoint's)."""
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
            self.model, self.opt = self._fresh() if holds else (None, None)
            self.state = RunState()
        else:
            self.model, self.opt = restore_model(resumed, cfg, precision) if holds else (None, None)
            self.state = restore_state(resumed, self.logger)
        if sharded:
            self.model, self.opt = self.shard(self.model, None if resumed is None or not holds
                                              else self.opt.state_dict())
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
        self.t_start, self.load_start = time.perf_counter(), os.getloadavg()[0]
        self.wall_base = 0.0
        self.cfg, self.run_dir, self.plan, self.precision = cfg, Path(run_dir), cfg.plan, precision
        self.data, self.val = data
        self.batches = DeviceBatches(self.data, precision.device)
        self.strategy = cfg.growth_strategy if cfg.grows or cfg.init_by_strategy else None
        self.clock = StageClock(cfg.trigger, self.plan, cfg.trainer.max_tokens)  # when each stage ends (grow.triggers)
        peak = peak_flops(precision.device)
        self.peak = peak * distributed.world_size() if peak else None  # tokens/s are global
        self.lr_of = lr_schedule(cfg.optim, cfg.trainer.max_tokens)
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

    def _fresh(self):
        """Stage 0's model (set up by the strategy when it assumes a parameterization, as vt does, in a
        growth run or with ``init=strategy``; a pretrained model's weights with ``init=<dir>``), its
        optimizer; under FSDP on rank 0's host, for `shard`."""
        seed = self.cfg.seed
        device = torch.device("cpu") if fsdp.enabled(self.cfg.trainer.parallel) else self.precision.device
        start = pretrained.pretrained_dir(self.cfg.init)
        if start is not None:  # init=<LlamaForCausalLM dir>: its weights are stage 0 (grow.hf.pretrained)
            model = pretrained.load(start, self.plan[0].cfg, self.precision.param_dtype)
            model = model.to(device=device)
            if distributed.is_main():
                ui.console.print(f"init: pretrained weights loaded from {start} ({model.num_params():,} parameters: "
                                 "stage 1's model)", markup=False)
            return model, build_optimizer(model, self.cfg.optim, compile=self.cfg.trainer.compile)
        model = Transformer(self.plan[0].cfg, generator=torch.Generator().manual_seed(seed))
        if self.precision.param_dtype == torch.float64:
            # float64 draws: torch's float32 normal sampler takes a vectorized path whose last bits
            # depend on the CPU (AVX2/AVX-512 or not), its float64 one does not (docs/design.md §12)
            model = model.to(dtype=torch.float64)
            model.reset_parameters(torch.Generator().manual_seed(seed))
        if self.cfg.init_by_strategy:
            self.strategy.initialize(model, torch.Generator().manual_seed(seed))
        model = model.to(device=device, dtype=self.precision.param_dtype)
        return model, build_optimizer(model, self.cfg.optim, compile=self.cfg.trainer.compile)

    def shard(self, plain, opt_state: dict | None):
        """(the FSDP2 model, its optimizer) of rank 0's plain model and optimizer state dict (None on
        the other ranks; None everywhere: a fresh optimizer), `grow.parallel.fsdp`."""
        model = fsdp.shard(plain, self.precision.device, fsdp.ShardOptions.of(self.cfg, self.precision))
        opt = build_optimizer(model, self.cfg.optim, compile=self.cfg.trainer.compile)
        if distributed.broadcast_object(opt_state is not None):
            hyper = opt.hyperparameters()
            fsdp.shard_optimizer(opt, opt_state)
            opt.set_hyperparameters(hyper)
        return model, opt

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
            summary = make_summary(self, state.stage_losses[-1])  # the last stage's end: the final model
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
        stepper = Stepper(self.model, self.cfg, self.precision, stage.batch_size, self.micro_batch(stage))
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
        return frozen_flops_per_token(stage.cfg, trainable_layers(self.model))

    def micro_batch(self, stage) -> int | None:
        """Rows per forward/backward on this rank in ``stage`` (None: all of them at once):
        ``trainer.micro_batch_size``, or for ``auto`` the memory plan's pick on CUDA (`grow.memory`)."""
        lo, hi = distributed.shard_range(stage.batch_size)
        micro = self.cfg.trainer.micro_batch_size
        if micro is None and self.precision.device.type == "cuda":
            micro = auto_micro_batch(stage.cfg, hi - lo, memory_budget(self.cfg, self.precision.device),
                                     optimizer=optimizer_kind(self.cfg.optim), amp=self.precision.amp,
                                     shards=shards_of(self.cfg, distributed.world_size()),
                                     compiled=self.cfg.trainer.compile) or 1
        return None if micro is None or micro >= hi - lo else micro

    def step(self, loop: StageLoop) -> None:
        """One optimizer step, its bookkeeping, and whatever is due after it."""
        state, stage = self.state, loop.stage
        t0 = time.perf_counter()
        lo, hi = loop.rows
        x, y = self.batches.get(self.cfg.seed, state.samples + lo, hi - lo, stage.cfg.seq_len)
        lr = self.lr_of(state.tokens + loop.tokens_per_step)  # lr_at's convention: tokens at the end of the step
        if stage.index > 0:  # optim.rewarm_steps: the whole model re-warmed after a growth (G_stack's recipe)
            lr *= rewarm_factor(state.step_in_stage + 1, self.cfg.optim.rewarm_steps)
        loss, gnorm = loop.stepper(x, y)
        ok = loop.check(loss, gnorm, state, stage)
        if ok:
            self.opt.step(lr=lr)
        kill_point("step")
        self.opt.zero_grad(set_to_none=True)
        state.step += 1
        state.step_in_stage += 1
        state.samples += stage.batch_size
        state.tokens += loop.tokens_per_step
        state.flops += loop.flops_per_token * loop.tokens_per_step
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
        for b in branches.due(self):  # optim.decay_branches: before a checkpoint at this step, so a resume redoes it
            branches.run_branch(self, b, loop)
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
        return evaluate(self.model, self.val, self.precision.device, self.precision.amp)

    def full_validation(self, model) -> dict:
        """`full_validation` of ``model`` (a decay branch's copy, `grow.branches`)."""
        return full_validation(self, model)

    def grow_into(self, stage) -> None:
        """Evaluate, grow into ``stage``, evaluate again, move the optimizer, log, checkpoint (``grown``)."""
        state, t = self.state, self.cfg.trainer
        model, before_cfg = self.model, self.model.config
        loss_before = state.stage_losses[stage.index - 1]  # the previous stage's end: the same model, evaluated
        t0 = time.perf_counter()
        gen = torch.Generator().manual_seed(self.cfg.seed * 7919 + stage.index)
        measures = {}
        if fsdp.enabled(t.parallel):
            measured = rss.reset_peak()  # each rank's peak resident memory during the growth (§11.2)
            new_model, self.opt, res = self._grow_sharded(stage, gen)
            measures = sharded_growth_measures(res, rss.peak_mb() if measured else None)
        else:
            new_model, res = self._grow(model, self.opt, stage, gen, host=False)
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
        self.logger.log_growth(rec)
        state.growth_events.append({k: v for k, v in rec.items() if isinstance(v, (int, float, str))})
        after = min(t.recovery_steps, self.clock.limit(stage, state))  # measured within the stage the growth entered
        state.recoveries.append([stage.number, state.step + after, loss_after, after])
        if self.logger.enabled:
            ui.growth_panel(rec, before_cfg, stage.cfg, res.metrics,
                            recipe_rows(self.cfg, self.strategy, self.model, before_cfg))
        state.stage, state.step_in_stage = stage.index, 0
        self.control.boundary("grown", self.model, self.opt, state)
        events.emit("grown", self, stage)

    def _grow(self, model, opt, stage, gen, *, host: bool):
        """The growth into ``stage`` of ``model`` and ``opt`` (moved onto the grown parameters):
        (grown model, `grow.growth.GrowthResult`). ``host``: the one-process growth on rank 0's host
        of an FSDP run (`_grow_sharded`): the whole growth batches, no reduction, no autocast."""
        p, t = self.precision, self.cfg.trainer
        batches = growth_batches(self.data, self.cfg.seed, stage.index, t.growth_batches, t.batch_size,
                                 model.config.seq_len)
        device = torch.device("cpu") if host else p.device
        batches = [to_device(b if host else distributed.shard_batch(b), device) for b in batches]
        # a strategy's passes run under the training's autocast, their sums over all ranks
        reduce = distributed.all_reduce_sum if distributed.is_initialized() and not host else None
        passes = Passes(amp=None if host else p.amp, reduce=reduce)
        res = grow(model, stage.cfg, strategy=self.strategy, batch=batches, generator=gen,  # the run's one strategy
                   stage=stage.index, state=self.state.strategy_state, passes=passes)
        new_model = res.model.to(device)
        kill_point("growth")
        param_map = res.param_map
        if t.train_new_only:  # only what the growth created trains: the rest frozen, its optimizer state dropped
            freeze_all_but(new_model, born_at(res.param_map, new_model))
            opt.forget(list(opt.params))
            param_map = {}
        opt.grow(list(new_model.named_parameters()), param_map, stage.index,
                 on_growth=self.cfg.optim.on_growth, fresh=res.fresh,
                 rescaled=res.rescaled)  # kept moments follow the strategy's compensated rescalings
        self.set_growth_rates(opt, res, stage)
        return new_model, res

    def set_growth_rates(self, opt, res, stage) -> None:
        """The learning-rate multipliers a growth into ``stage`` sets on the grown optimizer ``opt``
        (in one process, on rank 0's host, or by units on every rank: `grow.parallel.fsdp_growth`)."""
        self.strategy.after_growth(opt, res, self.cfg.optim.name)  # vt under SGD: Eq. 5's rates
        if mup.is_mup(stage.cfg):  # every hidden matrix at the grown width's eta / m' (grow/mup.py)
            opt.set_lr_multipliers(mup.lr_multipliers(stage.cfg, opt.params, stage.index))

    def _grow_sharded(self, stage, gen):
        """A growth under FSDP (docs/design.md §11.2), by units on every rank (`grow.parallel.fsdp_growth`) or
        on rank 0's host (`_grow_on_host`), as ``trainer.fsdp_growth`` says: (model, optimizer,
        `GrowthInfo`) on every rank."""
        if fsdp_growth.sharded_path(self.cfg, self.strategy):
            model, opt, res, phases = fsdp_growth.grow_sharded(self, stage, gen)
            return model, opt, GrowthInfo(res.state, float(res.flops), dict(res.metrics), phases)
        return self._grow_on_host(stage, gen)

    def _grow_on_host(self, stage, gen):
        """The model and optimizer gathered on rank 0's host, grown there as one process grows them
        (`_grow`), sharded again (`grow.parallel.fsdp`)."""
        t0 = time.perf_counter()
        plain, opt_state = fsdp.gather(self.model), fsdp.gather_optimizer(self.opt)
        t1 = time.perf_counter()
        grown = opt = info = None
        if distributed.is_main():
            opt = build_optimizer(plain, self.cfg.optim, compile=False)
            opt.load_state_dict(opt_state)
            grown, res = self._grow(plain, opt, stage, gen, host=True)
            info = GrowthInfo(res.state, float(res.flops), dict(res.metrics),
                              {"gather": t1 - t0, "grow": time.perf_counter() - t1})
        info = distributed.broadcast_object(info)
        t2 = time.perf_counter()
        model, opt = self.shard(grown, opt.state_dict() if opt is not None else None)
        info.phases = {"gather": t1 - t0, "grow": t2 - t1, "shard": time.perf_counter() - t2}
        return model, opt, info

    def measure_recoveries(self) -> None:
        """The validation loss change since each growth whose ``recovery_steps`` have passed."""
        state = self.state
        for r in [r for r in state.recoveries if r[1] <= state.step]:
            loss = self.evaluate()
            steps = r[3] if len(r) > 3 else self.cfg.trainer.recovery_steps
            self.logger.log({"growth/stage": r[0], "growth/recovery": loss - r[2], "growth/recovery_loss": loss,
                             "growth/recovery_steps": steps, **state.position()})
            self.logger.update_growth(r[0], "growth/recovery", loss - r[2])
            for ev in state.growth_events:
                if ev["growth/stage"] == r[0]:
                    ev["growth/recovery"], ev["growth/recovery_steps"] = loss - r[2], steps
            state.recoveries.remove(r)


@dataclass
class GrowthInfo:
    """What the trainer keeps of a growth done on another rank (`Trainer._grow_sharded`)."""

    state: dict
    flops: float
    metrics: dict
    phases: dict[str, float] = field(default_factory=dict)  # seconds by phase (rank 0's: gather, grow, shard)


def sharded_growth_measures(info: GrowthInfo, peak_mb: float | None) -> dict:
    """A sharded growth's records: ``growth/seconds_<phase>`` and every rank's peak resident memory
    (`grow.rss.peaks_by_rank`: every rank takes part; none where ``peak_mb`` is None)."""
    return {**{f"growth/seconds_{k}": v for k, v in info.phases.items()}, **rss.peaks_by_rank(peak_mb)}


def eval_points(steps: int, per_stage: int) -> frozenset:
    """The steps of a stage of ``steps`` steps after which to evaluate, besides its end: ``per_stage - 1``
    of them, evenly spaced (the end makes ``per_stage`` evaluations per stage)."""
    return frozenset(math.ceil(j * steps / per_stage) for j in range(1, per_stage)) - {steps, 0}


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


def recipe_rows(cfg: Run, strategy, model, before_cfg) -> list[tuple[str, str]]:
    """What a growth's panel says of how it was made, besides the strategy's figures: which old layer each layer
    copies (a strategy of block copies: G_stack's repeat, MIDAS's middle block, LLaMA Pro, depth up-scaling), the
    layers that train after it (``trainer.train_new_only``), and what the optimizer does to old and new entries."""
    rows = []
    n_old, n_new = before_cfg.n_layers, model.config.n_layers
    if isinstance(strategy, BlockCopies) and n_new != n_old:
        rows.append(("layers", f"copies of old layers {strategy.sources(n_old, n_new)} (layer i of the grown model "
                               f"is a copy of old layer [i])"))
    if cfg.trainer.train_new_only:
        trains = trainable_layers(model)
        rows.append(("trains", f"layers {trains} of {n_new}; the rest frozen (trainer.train_new_only)"))
    o = cfg.optim
    warm = f"; new entries' learning rate warmed up over {o.new_warmup_steps} steps" if o.new_warmup_steps else ""
    rows.append(("optimizer", f"on_growth={o.on_growth}{warm}"))
    return rows


def born_at(param_map, model) -> set[str]:
    """Names of ``model``'s parameters that no old parameter maps to: created whole by the growth (new layers)."""
    mapped = {new for new, _ in param_map.values()}
    return {n for n, _ in model.named_parameters() if n not in mapped}


def freeze_all_but(model, names: set[str]) -> None:
    """``requires_grad`` only for the parameters ``names`` (autograd then skips the others' weight gradients)."""
    for n, p in model.named_parameters():
        p.requires_grad_(n in names)


def trainable_layers(model) -> list[int]:
    """Indices of the layers with a parameter that trains."""
    return sorted({int(n.split(".")[1]) for n, p in model.named_parameters() if p.requires_grad and n.startswith("layers.")})


def restore_model(payload: dict, cfg: RunConfig, precision: Precision):
    """(model, optimizer) of a checkpoint (`grow.checkpoint`): the model rebuilt at the checkpoint's
    (grown) architecture; the optimizer's moments, birth stages and per-stage step counts from the
    checkpoint, its hyperparameters from ``cfg``. Under FSDP on rank 0's host, for `Trainer.shard`."""
    device = torch.device("cpu") if fsdp.enabled(cfg.trainer.parallel) else precision.device
    model = build_model(TransformerConfig.from_dict(payload["model_config"]), payload["model"])
    model = model.to(device=device, dtype=precision.param_dtype)
    if cfg.trainer.train_new_only:  # the parameters the checkpoint's optimizer holds are the ones that train
        freeze_all_but(model, set(payload["optimizer"]["state"]))
    opt = build_optimizer(model, cfg.optim, compile=cfg.trainer.compile)
    hyper = opt.hyperparameters()
    opt.load_state_dict(payload["optimizer"])
    opt.set_hyperparameters(hyper)
    return model, opt


def restore_state(payload: dict, logger) -> RunState:
    """The checkpoint's `RunState` (and the logger's growth rows); sets the RNG states, last."""
    names = {f.name for f in fields(RunState)}
    state = RunState(**{k: v for k, v in payload["state"].items() if k in names})
    logger.growth_rows = [[ev.get(c) for c in GROWTH_COLUMNS] for ev in state.growth_events]
    checkpoint.set_rng_state(payload["rng"])
    return state


def data_figures(trainer: Trainer) -> dict:
    """What a reader needs to judge the loss: the splits' sizes (epochs = tokens / train_tokens) and the
    count-based bigram floor on the run's validation batches (`grow.data.floor`); None for a stand-in
    without token arrays (scripts/gpu_check.py's random tokens)."""
    data = trainer.data
    if not isinstance(data, data_lib.TokenData):
        return None
    return {"train_tokens": data.train_tokens, "val_tokens": data.val_tokens,
            "epochs": trainer.state.tokens / max(data.train_tokens, 1),
            **bigram_floor(data.train, trainer.val, data.vocab_size), **bytes_per_token(data.val, data.tokenizer_path),
            **_corpus_manifest(data)}


def _corpus_manifest(data) -> dict:
    """data=pysrc: the token cache's manifest (every file read, its hash and tokens) and the corpus's counts."""
    path = data.cache_dir / data_lib.pysrc.MANIFEST if data.cache_dir is not None else None
    if path is None or not path.is_file():
        return {}
    return {"manifest": str(path), "corpus": json.loads(path.read_text())["summary"]}


def full_validation(trainer: Trainer, model=None) -> dict:
    """trainer.full_val: the final model's mean loss over every non-overlapping window of the held-out split
    (`grow eval`'s windows, the shards joined), beside final_val_loss's trainer.eval_batches sampled windows;
    its forward FLOPs (2 N_matmul + 2 N s E (k + v) a token: a third of §8's training FLOPs) are evaluation
    FLOPs, never in ``flops``. docs/design.md §2. Nulls when off, or for a stand-in without token arrays.
    ``model``: another than the trainer's (a decay branch's, `grow.branches`)."""
    data, model = trainer.data, model or trainer.model
    if not trainer.cfg.trainer.full_val or not isinstance(data, data_lib.TokenData):
        return {"full_val_loss": None, "full_val_tokens": None, "full_val_flops": None, "full_val_packages": None}

    ids = np.concatenate([np.asarray(a, dtype=np.int64) for a in data.val])
    x, y = windows(ids, model.config.seq_len)
    was_training = model.training
    model.eval()
    batch, device, amp = trainer.cfg.trainer.eval_batch_size, trainer.precision.device, trainer.precision.amp
    nats = cross_entropy_sum(model, x, y, batch, device, amp)
    packages = package_losses(model, ids, _val_entries(data), batch, device, amp)  # data=pysrc: per package
    model.train(was_training)
    scored = y.numel() + sum(p["tokens"] for p in (packages or {}).values())
    return {"full_val_loss": nats / y.numel(), "full_val_tokens": int(y.numel()),
            "full_val_flops": float(scored * (model.config.flops_per_token() // 3)), "full_val_packages": packages}


def _val_entries(data) -> list[dict]:
    """The validation files of a data=pysrc cache's manifest, in stream order ([] for another source)."""
    path = data.cache_dir / data_lib.pysrc.MANIFEST if data.cache_dir is not None else None
    if path is None or not path.is_file():
        return []
    return [e for e in json.loads(path.read_text())["files"] if e["split"] == "val"]


def make_summary(trainer: Trainer, final_loss: float) -> dict:
    """summary.json: the run's result, costs, stage plan and growth events."""
    cfg, plan, state, model = trainer.cfg, trainer.plan, trainer.state, trainer.model
    stages = [
        {"stage": s.number, "config": s.cfg.to_dict(), "params": s.cfg.num_params(),
         "active_params": s.cfg.active_params(), "tokens": s.tokens,
         "steps": s.steps, "batch_size": s.batch_size, "flops": s.flops,
         "val_loss_end": state.stage_losses[s.index] if s.index < len(state.stage_losses) else None}
        for s in plan
    ]
    return {
        "run_dir": str(trainer.run_dir),
        "strategy": cfg.strategy_name,
        "init": cfg.strategy.name if cfg.init_by_strategy else (cfg.init if pretrained.pretrained_dir(cfg.init)
                                                                  else "model"),
        "seed": cfg.seed,
        "stages": len(plan),
        "final_val_loss": final_loss,
        **full_validation(trainer),  # the whole held-out split (trainer.full_val), evaluation FLOPs apart
        # the second endpoint: the mean logged training loss over the wsd decay phase (trainer.log_every apart)
        "decay_train_loss": state.decay_loss[0] / state.decay_loss[1] if state.decay_loss[1] else None,
        "decay_train_losses": state.decay_loss[1],
        "tokens": state.tokens,
        "flops": state.flops,
        "train_flops": state.flops - state.growth_flops,
        "growth_flops": state.growth_flops,
        "params": model.num_params(),
        "active_params": model.config.active_params(),  # a token's: top_k of n_experts experts (= params if dense)
        "final_config": model.config.to_dict(),
        "wall_seconds": trainer.wall_seconds(),
        "load_average": [trainer.load_start, os.getloadavg()[0]],  # 1-minute load at the start and the end
        "train_seconds": state.train_seconds,
        "compile_seconds": state.compile_seconds,
        "tokens_per_s": state.tokens / max(state.train_seconds, 1e-9),
        "world_size": distributed.world_size(),
        "growth_events": state.growth_events,
        "stage_plan": stages,
        "data": data_figures(trainer),
        "trigger": trainer.clock.trigger.describe(),
        "decay_branches": [str(branches.branch_dir(Path(), b)) for b in cfg.optim.decay_branches],
        "stages_trained": state.trained,  # steps, tokens and FLOPs of each stage as trained
        "stayed_at_stage": None if state.stayed is None else state.stayed + 1,  # the trigger never fired there
        "state": {k: v for k, v in asdict(state).items() if k in ("step", "tokens", "samples", "skipped_nonfinite")},
        "code": code_version(),  # the package version, git commit and torch that trained it
        "machine": machine(),  # the CPU (model, SIMD level, torch's kernels) and GPU it trained on
        "complete": True,
    }
