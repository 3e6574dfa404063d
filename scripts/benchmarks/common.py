"""The shared pieces of `make bench`: the run config as `grow train +schedule=exp` builds it, timing
helpers, the trainer driven block by block (`StepTimer`, `Bench.run_trainer`), torch's AdamW with the
growth-aware optimizer's hyperparameters."""

from __future__ import annotations

import argparse
import statistics
import tempfile
import time
from dataclasses import replace
from pathlib import Path

import torch

from grow.growth.base import available

SCHEMA = "grow.bench/1"


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
    p.add_argument("--strategies", default=",".join(available()),
                   help="strategies whose growth is timed (default: every registered one, plugins of GROW_PLUGINS included)")
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

    from grow import plugins
    from grow.config import CONFIG_DIR
    from grow.run import load as load_run

    extra = [f"strategy={strategy}"] if strategy else []
    base = [f"model={model}", "+schedule=exp", "trainer.progress=false", "trainer.eval_every=0", "trainer.evals_per_stage=1",
            "seed=0"]
    plugins.load()  # model/_base and GROW_PLUGINS' strategies, stored as the CLI stores them
    with initialize_config_dir(str(CONFIG_DIR), version_base="1.3"):
        cfg = hydra_compose("train", overrides=[*base, *overrides, *extra])
    return load_run(cfg)


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
    return cfg.plan


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

    def due(self, state, last: bool, poll: bool = True) -> bool:
        """RunControl's periodic checkpoint (trainer.ckpt_every, trainer.ckpt_minutes): never due here."""
        return False

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
                 main: bool = True, data: bool = True):
        from grow.device import Precision, peak_flops
        from grow.train import Trainer

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
        # data=False: no corpus (gpu-check's optimizer measurement reads none; a bare machine would build it)
        self.data, self.val = Trainer._load_data(self.cfg, self.tmp) if data else (None, None)

    def model(self, cfg, seed: int = 0):
        from grow.model import Transformer

        m = Transformer(cfg, generator=torch.Generator().manual_seed(seed))
        return m.to(device=self.device, dtype=self.param_dtype)

    def logger(self, name: str, enabled: bool = True):
        from grow.metrics import MetricsLogger

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


def dims(c) -> str:
    return f"N={c.n_layers} h={c.d_model} E={c.n_heads} k={c.d_qk} v={c.d_v} p={c.d_ff}"


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


def random_grads(params, seed: int) -> None:
    g = torch.Generator().manual_seed(seed)
    for p in params:
        p.grad = (torch.randn(p.shape, generator=g) * 1e-3).to(device=p.device, dtype=p.dtype)
