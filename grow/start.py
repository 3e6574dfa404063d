"""A run's starting model and optimizer: fresh, or a pretrained model's weights (`fresh_model`), or a
checkpoint's (`grow.checkpoint`), rebuilt at its (grown) architecture (`restore_model`), with the run's
state and random generators (`restore_state`). The contract (a resume continues bitwise): docs/design.md
"Distributed, reliability".
"""

from __future__ import annotations

from dataclasses import fields

import torch

from grow import checkpoint
from grow import console as ui
from grow.config import RunConfig
from grow.device import Precision
from grow.growing import freeze_all_but
from grow.hf import pretrained
from grow.masks import build_model
from grow.model import Transformer, TransformerConfig
from grow.optim import build_optimizer
from grow.parallel import distributed, fsdp
from grow.state import RunState


def fresh_model(cfg: RunConfig, precision: Precision):
    """Stage 0's model (set up by the strategy when it assumes a parameterization, as vt does, in a
    growth run or with ``init=strategy``; a pretrained model's weights with ``init=<dir>``), its
    optimizer; under FSDP on rank 0's host, for `grow.growing.shard`."""
    seed = cfg.seed
    device = torch.device("cpu") if fsdp.enabled(cfg.trainer.parallel) else precision.device
    start = pretrained.pretrained_dir(cfg.init)
    if start is not None:  # init=<LlamaForCausalLM dir>: its weights are stage 0 (grow.hf.pretrained)
        model = pretrained.load(start, cfg.plan[0].cfg, precision.param_dtype)
        model = model.to(device=device)
        if distributed.is_main():
            ui.console.print(f"init: pretrained weights loaded from {start} ({model.num_params():,} parameters: "
                             "stage 1's model)", markup=False)
        return model, build_optimizer(model, cfg.optim, compile=cfg.trainer.compile)
    model = Transformer(cfg.plan[0].cfg, generator=torch.Generator().manual_seed(seed))
    if precision.param_dtype == torch.float64:
        # float64 draws: torch's float32 normal sampler takes a vectorized path whose last bits
        # depend on the CPU (AVX2/AVX-512 or not), its float64 one does not (docs/testing.md)
        model = model.to(dtype=torch.float64)
        model.reset_parameters(torch.Generator().manual_seed(seed))
    if cfg.init_by_strategy:
        cfg.growth_strategy.initialize(model, torch.Generator().manual_seed(seed))
    model = model.to(device=device, dtype=precision.param_dtype)
    return model, build_optimizer(model, cfg.optim, compile=cfg.trainer.compile)


def restore_model(payload: dict, cfg: RunConfig, precision: Precision):
    """(model, optimizer) of a checkpoint (`grow.checkpoint`): the model rebuilt at the checkpoint's
    (grown) architecture; the optimizer's moments, birth stages and per-stage step counts from the
    checkpoint, its hyperparameters from ``cfg``. Under FSDP on rank 0's host, for `grow.growing.shard`."""
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


def restore_state(payload: dict) -> RunState:
    """The checkpoint's `RunState` (its growth events the W&B table's rows too); sets the RNG states, last."""
    names = {f.name for f in fields(RunState)}
    state = RunState(**{k: v for k, v in payload["state"].items() if k in names})
    checkpoint.set_rng_state(payload["rng"])
    return state
