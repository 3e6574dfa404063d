"""The training loop: stages of a plan, a growth between consecutive stages, everything measured.

Per stage (DESIGN §8): train the stage's tokens at its batch size; at its end evaluate the fixed
validation batches, grow with the configured strategy, evaluate again, carry the optimizer state
across (old slices keep their moments, new ones start fresh with their own Adam step count), and
go on. Without a schedule the plan has one stage: the fixed-size baseline.

Costs are counted, not estimated after the fact: ``train/flops`` is the sum over steps of the
stage model's FLOPs per token (DESIGN §8) times the tokens of the step, plus the FLOPs the growth
strategies spend on their own passes (statistics, line searches). Evaluations are measurements
and are not counted (every arm of a comparison evaluates the same way).
"""

from __future__ import annotations

import contextlib
import math
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path

import torch
from omegaconf import DictConfig, OmegaConf

from grow import console as ui
from grow import data as data_lib
from grow.config import model_config
from grow.logging import MetricsLogger
from grow.model import Transformer
from grow.optim import build_optimizer, lr_at
from grow.schedule import build_plan

PEAK_BF16_FLOPS = {"H200": 989e12, "H100": 989e12, "A100": 312e12, "L40S": 362e12, "A10": 125e12, "4090": 165e12}


class NonFiniteLoss(RuntimeError):
    """The loss or the gradient became NaN or infinite (and no skips were left)."""


@dataclass
class RunState:
    """Where a run is; everything needed to continue it (saved in checkpoints)."""

    stage: int = 0
    step_in_stage: int = 0
    step: int = 0  # optimizer steps over the whole run
    tokens: int = 0  # training tokens seen
    samples: int = 0  # position in the training sample stream
    flops: float = 0.0  # training + growth-pass FLOPs
    growth_flops: float = 0.0
    train_seconds: float = 0.0  # wall-clock of training steps and growths (compile time apart)
    compile_seconds: float = 0.0
    skipped_nonfinite: int = 0
    strategy_state: object = None
    recoveries: list = field(default_factory=list)  # [stage, due_step, loss_after] awaiting a measurement
    growth_events: list = field(default_factory=list)
    stage_losses: list = field(default_factory=list)


# ---- devices and precision ----------------------------------------------------------------------


def resolve_device(name: str) -> torch.device:
    if name == "auto":
        return torch.device("cuda" if torch.cuda.is_available() else "cpu")
    return torch.device(name)


def resolve_precision(name: str, device: torch.device) -> tuple[torch.dtype, torch.dtype | None]:
    """(parameter dtype, autocast dtype or None)."""
    if name == "auto":
        return (torch.float32, torch.bfloat16) if device.type == "cuda" else (torch.float32, None)
    if name == "bfloat16":
        return torch.float32, torch.bfloat16
    return (torch.float64 if name == "float64" else torch.float32), None


def autocast(device: torch.device, dtype: torch.dtype | None):
    if dtype is None:
        return contextlib.nullcontext()
    return torch.autocast(device_type=device.type, dtype=dtype)


def peak_flops(device: torch.device) -> float | None:
    """Dense bf16 peak of the GPU, from its name (None on CPU or an unknown GPU)."""
    if device.type != "cuda":
        return None
    name = torch.cuda.get_device_name(device)
    return next((v for k, v in PEAK_BF16_FLOPS.items() if k in name), None)


# ---- pieces of the loop -----------------------------------------------------------------------------


def to_device(batch, device: torch.device):
    x, y = batch
    if device.type == "cuda":
        return x.pin_memory().to(device, non_blocking=True), y.pin_memory().to(device, non_blocking=True)
    return x.to(device), y.to(device)


@torch.no_grad()
def evaluate(model, batches, device, amp) -> float:
    """Mean cross-entropy over the fixed validation batches."""
    was_training = model.training
    model.eval()
    total = 0.0
    for batch in batches:
        x, y = to_device(batch, device)
        with autocast(device, amp):
            _, loss = model(x, y)
        total += float(loss)
    model.train(was_training)
    return total / len(batches)


def growth_batches(data, seed: int, stage: int, n: int, batch_size: int, seq_len: int):
    """Batches for data-driven strategies, from a stream of their own (not training tokens)."""
    stream = 1_000_003 * (seed + 1) + stage
    return [data.batch(stream, i * batch_size, batch_size, seq_len) for i in range(n)]


def optimizer_lr(cfg: DictConfig, tokens: int) -> float:
    o, t = cfg.optim, cfg.trainer
    return lr_at(tokens, lr=float(o.lr), total_tokens=int(t.max_tokens), warmup_tokens=int(float(o.warmup) * t.max_tokens),
                 schedule=o.schedule, min_lr_ratio=float(o.min_lr_ratio), decay_fraction=float(o.decay_fraction))


class Stepper:
    """Forward and backward of a (possibly compiled) model; rebuilt after every growth.

    With ``trainer.compile=true`` the model is compiled afresh for each stage (``torch.compiler.reset()``
    first, since the shapes changed); the first step after a (re)compile is timed as compile time."""

    def __init__(self, model, cfg: DictConfig, device, amp):
        self.model, self.device, self.amp = model, device, amp
        self.clip = float(cfg.trainer.grad_clip)
        self.forward = model
        self.compiling = bool(cfg.trainer.compile)
        if self.compiling:
            torch.compiler.reset()
            self.forward = torch.compile(model)

    def __call__(self, x, y):
        """Loss (a detached tensor: no host sync) and the pre-clipping gradient norm."""
        with autocast(self.device, self.amp):
            _, loss = self.forward(x, y)
        loss.backward()
        params = [p for p in self.model.parameters() if p.grad is not None]
        gnorm = torch.nn.utils.clip_grad_norm_(params, self.clip if self.clip > 0 else float("inf"))
        return loss.detach(), gnorm


# ---- the run --------------------------------------------------------------------------------------


def _strategy_options(cfg: DictConfig) -> tuple[str, dict]:
    s = OmegaConf.to_container(cfg.strategy, resolve=True)
    return s.pop("name"), s


def do_growth(model, next_cfg, cfg, state: RunState, data, device, amp, val, logger, opt, stage_index: int):
    """Evaluate, grow into stage ``stage_index``, evaluate again, move the optimizer; returns the new model."""
    from grow.growth import grow

    name, options = _strategy_options(cfg)
    before_cfg = model.config
    loss_before = evaluate(model, val, device, amp)
    t0 = time.perf_counter()
    batches = growth_batches(data, cfg.seed, stage_index, int(cfg.trainer.growth_batches),
                             int(cfg.trainer.batch_size), before_cfg.seq_len)
    batches = [to_device(b, device) for b in batches]
    gen = torch.Generator().manual_seed(int(cfg.seed) * 7919 + stage_index)
    res = grow(model, next_cfg, strategy=name, batch=batches, generator=gen, stage=stage_index,
               state=state.strategy_state, **options)
    new_model = res.model.to(device)
    opt.grow(list(new_model.named_parameters()), res.param_map, stage_index, on_growth=cfg.optim.on_growth)
    if res.lr_multipliers:
        opt.set_lr_multipliers(res.lr_multipliers)
    seconds = time.perf_counter() - t0
    loss_after = evaluate(new_model, val, device, amp)
    state.strategy_state = res.state
    state.growth_flops += float(res.flops)
    state.flops += float(res.flops)
    state.train_seconds += seconds
    rec = {
        "growth/stage": stage_index, "train/tokens": state.tokens, "train/flops": state.flops,
        "train/step": state.step, "stage": stage_index,
        "growth/params_before": model.num_params(), "growth/params_after": new_model.num_params(),
        "growth/loss_before": loss_before, "growth/loss_after": loss_after,
        "growth/delta": loss_after - loss_before, "growth/seconds": seconds, "growth/flops": float(res.flops),
        **{k: v for k, v in res.metrics.items()},
    }
    logger.log_growth(rec)
    state.growth_events.append({k: v for k, v in rec.items() if isinstance(v, (int, float, str))})
    state.recoveries.append([stage_index, state.step + int(cfg.trainer.recovery_steps), loss_after])
    if logger.enabled:
        ui.growth_panel(rec, before_cfg, next_cfg, res.metrics)
    return new_model


def measure_recoveries(model, state: RunState, device, amp, val, logger) -> None:
    due = [r for r in state.recoveries if r[1] <= state.step]
    for r in due:
        loss = evaluate(model, val, device, amp)
        rec = {"growth/stage": r[0], "growth/recovery": loss - r[2], "growth/recovery_loss": loss,
               "train/tokens": state.tokens, "train/flops": state.flops, "train/step": state.step}
        logger.log(rec)
        logger.update_growth(r[0], "growth/recovery", loss - r[2])
        for ev in state.growth_events:
            if ev["growth/stage"] == r[0]:
                ev["growth/recovery"] = loss - r[2]
        state.recoveries.remove(r)


def train(cfg: DictConfig, run_dir: Path) -> dict:
    """Run ``cfg`` to the end, writing into ``run_dir``; returns the summary (also summary.json)."""
    t_start = time.perf_counter()
    run_dir = Path(run_dir)
    final_cfg = model_config(cfg.model)
    schedule = OmegaConf.to_container(cfg.schedule, resolve=True) if cfg.get("schedule") is not None else None
    plan = build_plan(final_cfg, schedule, max_tokens=int(cfg.trainer.max_tokens), batch_size=int(cfg.trainer.batch_size))
    device = resolve_device(str(cfg.device))
    param_dtype, amp = resolve_precision(str(cfg.precision), device)
    torch.manual_seed(int(cfg.seed))

    data = data_lib.load(cfg.data, final_cfg.seq_len, log=ui.console.print)
    val = data.val_batches(int(cfg.trainer.eval_batches), int(cfg.trainer.eval_batch_size), final_cfg.seq_len)

    strategy = cfg.strategy.name if schedule is not None else "baseline"
    if len(plan) > 1:
        import grow.growth  # noqa: F401 - imported now so that growth/seconds times the growth, not imports
    wcfg = OmegaConf.to_container(cfg.logger, resolve=True)
    wcfg["name"] = wcfg.get("name") or f"{strategy}-{run_dir.name}"
    logger = MetricsLogger(run_dir, wandb_cfg=wcfg, config=OmegaConf.to_container(cfg, resolve=True))
    state = RunState()
    model = Transformer(plan[0].cfg, generator=torch.Generator().manual_seed(int(cfg.seed)))
    model = model.to(device=device, dtype=param_dtype)
    opt = build_optimizer(model, cfg.optim)
    peak = peak_flops(device)
    try:
        for stage in plan:
            if stage.index > 0:
                model = do_growth(model, stage.cfg, cfg, state, data, device, amp, val, logger, opt, stage.index)
            state.stage = stage.index
            model = run_stage(model, stage, plan, cfg, state, data, device, amp, val, logger, opt, peak)
        final_loss = evaluate(model, val, device, amp)
        summary = make_summary(cfg, run_dir, plan, state, model, final_loss, strategy, time.perf_counter() - t_start)
        logger.log({"val/loss": final_loss, "train/tokens": state.tokens, "train/flops": state.flops,
                    "train/step": state.step, "stage": state.stage, "time/seconds": state.train_seconds})
        logger.summary(summary)
    finally:
        logger.close()
    if logger.enabled:
        ui.summary_table(summary)
    return summary


def run_stage(model, stage, plan, cfg, state: RunState, data, device, amp, val, logger, opt, peak):
    t = cfg.trainer
    seq_len, bs = stage.cfg.seq_len, stage.batch_size
    tokens_per_step = bs * seq_len
    fpt = stage.cfg.flops_per_token()
    stepper = Stepper(model, cfg, device, amp)
    bar = ui.StageProgress(bool(t.progress), stage.index, len(plan), stage.steps, state.step_in_stage)
    model.train()
    window_t, window_tokens = time.perf_counter(), 0
    try:
        while state.step_in_stage < stage.steps:
            t0 = time.perf_counter()
            x, y = to_device(data.batch(int(cfg.seed), state.samples, bs, seq_len), device)
            lr = optimizer_lr(cfg, state.tokens)
            loss, gnorm = stepper(x, y)
            opt.step(lr=lr)
            opt.zero_grad(set_to_none=True)
            state.step += 1
            state.step_in_stage += 1
            state.samples += bs
            state.tokens += tokens_per_step
            state.flops += fpt * tokens_per_step
            window_tokens += tokens_per_step
            if stepper.compiling:  # the first step after a (re)compile: compile time, reported apart
                if device.type == "cuda":
                    torch.cuda.synchronize(device)
                state.compile_seconds += time.perf_counter() - t0
                stepper.compiling = False
            else:
                state.train_seconds += time.perf_counter() - t0
            last = state.step_in_stage == stage.steps
            if state.step % int(t.log_every) == 0 or last:
                lv = float(loss)
                if not math.isfinite(lv):
                    raise NonFiniteLoss(f"loss is {lv} at step {state.step} (stage {stage.index + 1})")
                elapsed = time.perf_counter() - window_t
                tps = window_tokens / max(elapsed, 1e-9)
                rec = {"train/loss": lv, "train/lr": lr, "train/grad_norm": float(gnorm),
                       "train/tokens": state.tokens, "train/flops": state.flops, "train/step": state.step,
                       "train/tokens_per_s": tps, "stage": stage.index, "time/seconds": state.train_seconds}
                if peak:
                    rec["train/mfu"] = tps * fpt / peak
                logger.log(rec)
                bar.update(state.step_in_stage, lv, tps)
                window_t, window_tokens = time.perf_counter(), 0
            else:
                bar.update(state.step_in_stage)
            if int(t.eval_every) and state.step % int(t.eval_every) == 0 and not last:
                logger.log({"val/loss": evaluate(model, val, device, amp), "train/tokens": state.tokens,
                            "train/flops": state.flops, "train/step": state.step, "stage": stage.index,
                            "time/seconds": state.train_seconds})
            if state.recoveries:
                measure_recoveries(model, state, device, amp, val, logger)
    finally:
        bar.close()
    stage_loss = evaluate(model, val, device, amp)
    state.stage_losses.append(stage_loss)
    logger.log({"val/loss": stage_loss, "train/tokens": state.tokens, "train/flops": state.flops,
                "train/step": state.step, "stage": stage.index, "time/seconds": state.train_seconds})
    state.step_in_stage = 0
    return model


def make_summary(cfg, run_dir: Path, plan, state: RunState, model, final_loss: float, strategy: str,
                 wall: float) -> dict:
    stages = [
        {"stage": s.index, "config": s.cfg.to_dict(), "params": s.cfg.num_params(), "tokens": s.tokens,
         "steps": s.steps, "batch_size": s.batch_size, "flops": s.flops,
         "val_loss_end": state.stage_losses[s.index] if s.index < len(state.stage_losses) else None}
        for s in plan
    ]
    return {
        "run_dir": str(run_dir),
        "strategy": strategy,
        "seed": int(cfg.seed),
        "stages": len(plan),
        "final_val_loss": final_loss,
        "tokens": state.tokens,
        "flops": state.flops,
        "train_flops": state.flops - state.growth_flops,
        "growth_flops": state.growth_flops,
        "params": model.num_params(),
        "final_config": model.config.to_dict(),
        "wall_seconds": wall,
        "train_seconds": state.train_seconds,
        "compile_seconds": state.compile_seconds,
        "tokens_per_s": state.tokens / max(state.train_seconds, 1e-9),
        "growth_events": state.growth_events,
        "stage_plan": stages,
        "state": {k: v for k, v in asdict(state).items() if k in ("step", "tokens", "samples", "skipped_nonfinite")},
        "complete": True,
    }
