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
import functools
import math
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path

import torch
from omegaconf import DictConfig, OmegaConf

from grow import checkpoint, distributed
from grow import console as ui
from grow import data as data_lib
from grow.config import model_config
from grow.growth.base import get_strategy
from grow.logging import MetricsLogger
from grow.model import Transformer, TransformerConfig
from grow.optim import build_optimizer, lr_at
from grow.schedule import build_plan

# dense bf16 peak by device name, first match wins (so the PCIe / NVL H100 parts come before "H100": SXM)
PEAK_BF16_FLOPS = {"H200": 989e12, "H100 PCIe": 756e12, "H100 NVL": 835e12, "H100": 989e12, "A100": 312e12,
                   "L40S": 362e12, "A10": 125e12, "4090": 165e12}


NonFiniteLoss = checkpoint.NonFiniteLoss  # the loss or the gradient became NaN or infinite (no skips left)


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


def _quiet(*args, **kwargs) -> None:
    """Console output of ranks other than 0."""


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
    """Mean cross-entropy over the fixed validation batches (split across ranks, then summed)."""
    was_training = model.training
    model.eval()
    total = 0.0
    for batch in batches[distributed.rank()::distributed.world_size()]:
        x, y = to_device(batch, device)
        with autocast(device, amp):
            _, loss = model(x, y)
        total += float(loss)
    model.train(was_training)
    return distributed.sum_float(total) / len(batches)


def growth_batches(data, seed: int, stage: int, n: int, batch_size: int, seq_len: int):
    """Batches for data-driven strategies, from a stream of their own (not training tokens)."""
    stream = 1_000_003 * (seed + 1) + stage
    return [data.batch(stream, i * batch_size, batch_size, seq_len) for i in range(n)]


def lr_schedule(cfg: DictConfig):
    """``tokens -> learning rate`` of the run: `lr_at` with the config's settings, read once (a
    config lookup costs tens of microseconds; the loop asks every step)."""
    o, t = cfg.optim, cfg.trainer
    return functools.partial(lr_at, lr=float(o.lr), total_tokens=int(t.max_tokens),
                             warmup_tokens=int(float(o.warmup) * t.max_tokens), schedule=str(o.schedule),
                             min_lr_ratio=float(o.min_lr_ratio), decay_fraction=float(o.decay_fraction))


class Stepper:
    """Forward and backward of a (possibly compiled) model; rebuilt after every growth.

    With ``trainer.compile=true`` the model is compiled afresh for each stage (``torch.compiler.reset()``
    first, since the shapes changed); the first step after a (re)compile is timed as compile time."""

    def __init__(self, model, cfg: DictConfig, device, amp):
        self.model, self.device, self.amp = model, device, amp
        self.clip = float(cfg.trainer.grad_clip)
        self.forward = distributed.wrap(model, device)  # DDP in a multi-process run
        self.loss_scale = 1.0  # this rank's share of the global batch (grow.distributed.loss_scale)
        self.compiling = bool(cfg.trainer.compile)
        if self.compiling:
            torch.compiler.reset()
            self.forward = torch.compile(self.forward)

    def __call__(self, x, y):
        """Loss (a detached tensor: no host sync) and the pre-clipping gradient norm."""
        with autocast(self.device, self.amp):
            _, loss = self.forward(x, y)
        (loss if self.loss_scale == 1.0 else loss * self.loss_scale).backward()
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
    from grow.growth.base import strategy_class

    name, options = _strategy_options(cfg)
    before_cfg = model.config
    loss_before = evaluate(model, val, device, amp)
    t0 = time.perf_counter()
    batches = growth_batches(data, cfg.seed, stage_index, int(cfg.trainer.growth_batches),
                             int(cfg.trainer.batch_size), before_cfg.seq_len)
    batches = [to_device(distributed.shard_batch(b), device) for b in batches]
    gen = torch.Generator().manual_seed(int(cfg.seed) * 7919 + stage_index)
    if distributed.is_initialized() and "reduce" in strategy_class(name).defaults:
        options["reduce"] = distributed.all_reduce_sum  # svd: Sigma, T and held-out losses over all ranks
    res = grow(model, next_cfg, strategy=name, batch=batches, generator=gen, stage=stage_index,
               state=state.strategy_state, **options)
    new_model = res.model.to(device)
    distributed.assert_same(new_model, f"growth into stage {stage_index}")
    opt.grow(list(new_model.named_parameters()), res.param_map, stage_index, on_growth=cfg.optim.on_growth,
             fresh=res.fresh)
    if res.lr_multipliers and cfg.optim.name == "sgd":
        # seed 003: Eq. 5's per-(layer, stage) rates are its SGD rule; with Adam the adaptation is
        # Appendix C / Table 9's per-stage step counts, which the growth-aware AdamW always applies.
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


def train(cfg: DictConfig, run_dir: Path, *, stop: checkpoint.StopRequest | None = None) -> dict:
    """Run ``cfg`` to the end, writing into ``run_dir``; returns the summary (also summary.json).

    With ``cfg.resume`` set, continues from the newest checkpoint of that run (`grow.checkpoint`).
    SIGTERM / SIGINT (or ``stop``) end it with `checkpoint.Interrupted` after a checkpoint; a
    non-finite step beyond ``trainer.skip_nonfinite`` with `NonFiniteLoss`, writing nothing more."""
    t_start = time.perf_counter()
    run_dir = Path(run_dir)
    final_cfg = model_config(cfg.model)
    schedule = OmegaConf.to_container(cfg.schedule, resolve=True) if cfg.get("schedule") is not None else None
    plan = build_plan(final_cfg, schedule, max_tokens=int(cfg.trainer.max_tokens), batch_size=int(cfg.trainer.batch_size))
    distributed.init()  # a no-op unless started by torchrun (the CLI has joined already)
    for s in plan:
        distributed.check_batch(s.batch_size, "trainer.batch_size")
    device = distributed.device(resolve_device(str(cfg.device)))
    param_dtype, amp = resolve_precision(str(cfg.precision), device)
    torch.manual_seed(int(cfg.seed))
    resumed = checkpoint.open_resume(cfg, run_dir, final_cfg, plan, device, is_main=distributed.is_main(),
                                     log=ui.console.print)

    with distributed.main_first():  # rank 0 builds the token cache, the others read it
        data = data_lib.load(cfg.data, final_cfg.seq_len, log=ui.console.print if distributed.is_main() else _quiet)
    val = data.val_batches(int(cfg.trainer.eval_batches), int(cfg.trainer.eval_batch_size), final_cfg.seq_len)

    strategy = cfg.strategy.name if schedule is not None else "baseline"
    if len(plan) > 1:
        import grow.growth  # noqa: F401 - imported now so that growth/seconds times the growth, not imports
    wcfg = OmegaConf.to_container(cfg.logger, resolve=True)
    wcfg["name"] = wcfg.get("name") or f"{strategy}-{run_dir.name}"
    logger = MetricsLogger(run_dir, enabled=distributed.is_main(), wandb_cfg=wcfg, config=OmegaConf.to_container(cfg, resolve=True),
                           resume_id=resumed["wandb_id"] if resumed else None)
    if resumed is None:
        state = RunState()
        model = Transformer(plan[0].cfg, generator=torch.Generator().manual_seed(int(cfg.seed)))
        if len(plan) > 1:  # a strategy whose rules assume a parameterization (vt) sets up stage 0
            get_strategy(OmegaConf.to_container(cfg.strategy, resolve=True)).initialize(
                model, torch.Generator().manual_seed(int(cfg.seed)))
        model = model.to(device=device, dtype=param_dtype)
        opt = build_optimizer(model, cfg.optim)
    else:
        model, opt, state = restore(resumed, cfg, device, param_dtype, logger)
    control = checkpoint.RunControl(
        checkpoint.Checkpointer(run_dir, cfg, final_cfg, keep=int(cfg.trainer.keep_checkpoints), is_main=distributed.is_main()),
        stop or checkpoint.StopRequest(), plan, every=int(cfg.trainer.ckpt_every), logger=logger)
    peak = peak_flops(device)
    peak = peak * distributed.world_size() if peak else None  # tokens/s are global
    try:
        with control.stop.installed():
            for stage in plan[state.stage:]:
                if stage.index > state.stage:  # entering a new stage: grow, checkpoint
                    model = do_growth(model, stage.cfg, cfg, state, data, device, amp, val, logger, opt, stage.index)
                    state.stage, state.step_in_stage = stage.index, 0
                    control.boundary("grown", model, opt, state)
                if len(state.stage_losses) <= stage.index:  # not yet trained and evaluated
                    model = run_stage(model, stage, plan, cfg, state, data, device, amp, val, logger, opt, peak, control)
                    control.boundary("end", model, opt, state)
        final_loss = evaluate(model, val, device, amp)
        summary = make_summary(cfg, run_dir, plan, state, model, final_loss, strategy, time.perf_counter() - t_start)
        logger.log({"val/loss": final_loss, "train/tokens": state.tokens, "train/flops": state.flops,
                    "train/step": state.step, "stage": state.stage, "time/seconds": state.train_seconds})
        logger.summary(summary)
    except NonFiniteLoss as exc:
        raise control.nonfinite(exc) from None
    finally:
        logger.close()
    if logger.enabled:
        ui.summary_table(summary)
    return summary


def run_stage(model, stage, plan, cfg, state: RunState, data, device, amp, val, logger, opt, peak, control=None):
    t = cfg.trainer
    seq_len, bs = stage.cfg.seq_len, stage.batch_size
    tokens_per_step = bs * seq_len
    fpt = stage.cfg.flops_per_token()
    stepper = Stepper(model, cfg, device, amp)
    lo, hi = distributed.shard_range(bs)  # this rank's rows of each global batch
    stepper.loss_scale = distributed.loss_scale(bs)
    bar = ui.StageProgress(bool(t.progress) and distributed.is_main(), stage.index, len(plan), stage.steps, state.step_in_stage)
    seed, log_every, eval_every, lr_of = int(cfg.seed), int(t.log_every), int(t.eval_every), lr_schedule(cfg)
    check = FiniteCheck(device, cfg)
    strat = get_strategy(OmegaConf.to_container(cfg.strategy, resolve=True)) if len(plan) > 1 else None
    model.train()
    window_t, window_tokens = time.perf_counter(), 0
    try:
        while state.step_in_stage < stage.steps:
            t0 = time.perf_counter()
            x, y = to_device(data.batch(seed, state.samples + lo, hi - lo, seq_len), device)
            lr = lr_of(state.tokens + tokens_per_step)  # lr_at's convention: tokens at the end of the step
            loss, gnorm = stepper(x, y)
            ok = check(loss, gnorm, state, stage, plan, cfg, logger)
            if ok:
                opt.step(lr=lr)
            opt.zero_grad(set_to_none=True)
            state.step += 1
            state.step_in_stage += 1
            state.samples += bs
            state.tokens += tokens_per_step
            state.flops += fpt * tokens_per_step
            window_tokens += tokens_per_step
            if ok and strat is not None and strat.after_step(model, opt, state.step_in_stage):
                stepper = Stepper(model, cfg, device, amp)  # the structure changed: new wrappers
                stepper.loss_scale = distributed.loss_scale(bs)
            last = state.step_in_stage == stage.steps
            log_now = ok and (state.step % log_every == 0 or last)
            if log_now:  # the log point's host sync waits for the device: step time, not logging time
                check.flush(state, plan, cfg, logger)
                lv = distributed.global_mean(loss, hi - lo, bs)
            if stepper.compiling:  # the first step after a (re)compile: compile time, reported apart
                if device.type == "cuda":
                    torch.cuda.synchronize(device)
                state.compile_seconds += time.perf_counter() - t0
                stepper.compiling = False
            else:
                state.train_seconds += time.perf_counter() - t0
            if log_now:
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
            if eval_every and state.step % eval_every == 0 and not last:
                check.flush(state, plan, cfg, logger)
                logger.log({"val/loss": evaluate(model, val, device, amp), "train/tokens": state.tokens,
                            "train/flops": state.flops, "train/step": state.step, "stage": stage.index,
                            "time/seconds": state.train_seconds})
            if any(r[1] <= state.step for r in state.recoveries):
                check.flush(state, plan, cfg, logger)
                measure_recoveries(model, state, device, amp, val, logger)
            if control is not None:  # a periodic checkpoint; a stop request (SIGTERM, SIGINT)
                if may_checkpoint(control, state, last):
                    check.flush(state, plan, cfg, logger)
                control.after_step(model, opt, state, last)
        check.flush(state, plan, cfg, logger)
    finally:
        bar.close()
    stage_loss = evaluate(model, val, device, amp)
    state.stage_losses.append(stage_loss)
    logger.log({"val/loss": stage_loss, "train/tokens": state.tokens, "train/flops": state.flops,
                "train/step": state.step, "stage": stage.index, "time/seconds": state.train_seconds})
    return model


def finite_step(loss, gnorm, state: RunState, stage, plan, cfg, logger, at: tuple[int, int] | None = None) -> bool:
    """Whether the step just computed may update the weights (one host sync per step).

    A NaN or infinite loss or gradient norm skips the update while the run has skipped at most
    ``trainer.skip_nonfinite`` steps (the batch is consumed, nothing else moves); beyond that,
    `NonFiniteLoss` naming the step and the stage. Multi-process runs decide on the gradient norm
    alone, the same on every rank after DDP's all-reduce. ``at``: (step, step in stage), 1-based,
    of the step checked when that is not the one just computed (`FiniteCheck`)."""
    bad = ~torch.isfinite(gnorm) if distributed.is_initialized() else ~(torch.isfinite(loss) & torch.isfinite(gnorm))
    if not bool(bad):
        return True
    allowed = int(cfg.trainer.skip_nonfinite)
    state.skipped_nonfinite += 1
    step, in_stage = at or (state.step + 1, state.step_in_stage + 1)
    where = f"step {step} (stage {stage.index + 1}/{len(plan)}, step {in_stage} of {stage.steps})"
    what = f"non-finite loss ({float(loss)}) or gradient norm ({float(gnorm)}) at {where}"
    if state.skipped_nonfinite > allowed:
        after = f", after skipping {allowed} such step(s) (trainer.skip_nonfinite={allowed})" if allowed else ""
        raise NonFiniteLoss(f"{what}{after}")
    logger.log({"train/skipped_nonfinite": state.skipped_nonfinite, "train/step": step,
                "train/tokens": state.tokens, "train/flops": state.flops, "stage": stage.index})
    if logger.enabled:
        ui.console.print(f"warning: {what}: update skipped ({state.skipped_nonfinite} of trainer.skip_nonfinite="
                         f"{allowed})")
    return False


def defer_finite_checks(device: torch.device, cfg: DictConfig) -> bool:
    """Whether `FiniteCheck` reads a step's verdict later: on CUDA, when bad steps are not skipped."""
    return device.type == "cuda" and int(cfg.trainer.skip_nonfinite) == 0


class FiniteCheck:
    """`finite_step` for every step, without a host sync in the step where the run allows it (DESIGN §12).

    With ``trainer.skip_nonfinite > 0`` a bad step must not update the weights, so its verdict is
    read at once (one host sync per step; free on CPU, where nothing is asynchronous). Otherwise (the
    default) a bad step need only stop the run before anything sees its weights: on CUDA the step's
    loss and gradient norm are copied to pinned host memory without blocking, an event marks the
    copy, and the verdict is read one step later, after the next step's forward and backward are
    queued (the GPU has passed the event by then), or at once by `flush` where the loop reads the
    model: log points, evaluations, recovery measurements, checkpoints and the stage's end. The
    error names the bad step as the immediate check does; nothing is logged, evaluated or saved
    from its weights."""

    def __init__(self, device: torch.device, cfg: DictConfig):
        self.deferred = defer_finite_checks(device, cfg)
        self.pending = None

    def __call__(self, loss, gnorm, state: RunState, stage, plan, cfg, logger) -> bool:
        """Whether this step may update the weights; raises `NonFiniteLoss` for a bad (earlier) step."""
        if not self.deferred:
            return finite_step(loss, gnorm, state, stage, plan, cfg, logger)
        self.flush(state, plan, cfg, logger)  # the previous step's verdict
        values = torch.stack([loss.detach().float(), gnorm.detach().float()]).to("cpu", non_blocking=True)
        event = None
        if loss.device.type == "cuda":
            event = torch.cuda.Event()
            event.record()
        self.pending = (values, event, stage, state.step + 1, state.step_in_stage + 1)
        return True

    def flush(self, state: RunState, plan, cfg, logger) -> None:
        """Read the pending verdict (waits for its step only); raises `NonFiniteLoss` if it was bad."""
        if self.pending is None:
            return
        values, event, stage, step, in_stage = self.pending
        self.pending = None
        if event is not None:
            event.synchronize()
        finite_step(values[0], values[1], state, stage, plan, cfg, logger, at=(step, in_stage))


def may_checkpoint(control, state: RunState, last: bool) -> bool:
    """Whether ``control.after_step`` may write a checkpoint now (`grow.checkpoint.RunControl`: every
    ``ckpt_every`` steps but a stage's last, and on a stop request)."""
    return bool(control.every and state.step % control.every == 0 and not last) or control.stop.signal is not None


def restore(payload: dict, cfg: DictConfig, device, param_dtype, logger):
    """(model, optimizer, RunState) of a checkpoint (`grow.checkpoint`); sets the RNG states last.

    The model is rebuilt at the checkpoint's (grown) architecture; the optimizer's moments, birth
    stages and per-stage step counts come from the checkpoint, its hyperparameters from ``cfg``."""
    from dataclasses import fields

    from grow.logging import GROWTH_COLUMNS

    with torch.device("meta"):
        model = Transformer(TransformerConfig.from_dict(payload["model_config"]))
    model.load_state_dict(payload["model"], assign=True)
    if model.config.tie_embeddings:
        model.lm_head.weight = model.wte.weight
    model = model.to(device=device, dtype=param_dtype)
    opt = build_optimizer(model, cfg.optim)
    hyper = opt._hyper()
    opt.load_state_dict(payload["optimizer"])
    opt._set_hyper(hyper)
    names = {f.name for f in fields(RunState)}
    state = RunState(**{k: v for k, v in payload["state"].items() if k in names})
    logger.growth_rows = [[ev.get(c) for c in GROWTH_COLUMNS] for ev in state.growth_events]
    checkpoint.set_rng_state(payload["rng"])
    return model, opt, state


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
        "world_size": distributed.world_size(),
        "growth_events": state.growth_events,
        "stage_plan": stages,
        "state": {k: v for k, v in asdict(state).items() if k in ("step", "tokens", "samples", "skipped_nonfinite")},
        "complete": True,
    }
