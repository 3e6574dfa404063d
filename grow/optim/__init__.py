"""Growth-aware optimizers (docs/optimizer.md) and the learning-rate schedule over a whole run.

``from grow.optim import GrowthAwareAdamW, GrowthAwareSGD, build_optimizer, lr_at, LR_SCHEDULES``.
`bookkeeping`: per-element stages of birth and per-stage step counts, the move onto a grown model,
the state dict; `adamw` / `sgd`: the update rules (per-stage bias corrections, Yuan et al. Appendix
C); `native` / `triton_adamw` / `compiled`: one pass over mixed-stage tensors; `lr`: the schedule
over tokens, never restarted by a growth.
"""

from __future__ import annotations

import torch

from grow import mup
from grow.optim.adamw import GrowthAwareAdamW
from grow.optim.bookkeeping import GrowthAware
from grow.optim.lr import LR_SCHEDULES, lr_at, lr_schedule, rewarm_factor
from grow.optim.sgd import GrowthAwareSGD

__all__ = ["GrowthAware", "GrowthAwareAdamW", "GrowthAwareSGD", "build_optimizer", "lr_at", "lr_schedule", "rewarm_factor", "LR_SCHEDULES"]


def build_optimizer(model: torch.nn.Module, o, compile: bool = False) -> GrowthAware:
    """The optimizer of the ``optim`` config (`grow.config.OptimConfig`, read by attribute) for ``model``.

    Reads ``name`` (adamw | sgd), ``lr``, ``weight_decay``, ``new_warmup_steps``; adamw: ``betas``,
    ``eps``, ``fused`` (None = auto), ``compile`` (None = auto: on for a model on the CPU, where the
    per-element pass is a C kernel built in ~0.1 s; elsewhere the ``compile`` argument, which the
    trainer sets to ``trainer.compile``, since torch.compile takes seconds per growth); sgd: ``momentum``, ``nesterov``, ``decoupled_weight_decay`` (false =
    torch.optim.SGD's coupled L2). The schedule keys (``schedule``, ``warmup``, ...) belong to
    `lr_at`, ``on_growth`` to `GrowthAware.grow`."""
    common = {"lr": float(o.lr), "weight_decay": float(o.weight_decay), "new_warmup_steps": int(o.new_warmup_steps or 0)}
    params = model.named_parameters()
    if o.name == "adamw":
        own = getattr(o, "compile", None)
        if own is None:  # auto: the C kernel on a CPU (built in ~0.1 s); torch.compile elsewhere only when asked
            own = compile or next(iter(model.parameters())).device.type == "cpu"
        opt = GrowthAwareAdamW(params, betas=(float(o.betas[0]), float(o.betas[1])), eps=float(o.eps), fused=o.fused,
                               compile=bool(own), **common)
        config = getattr(model, "config", None)
        if config is not None and mup.is_mup(config):  # the hidden matrices' eta / m (grow/mup.py)
            opt.set_lr_multipliers(mup.lr_multipliers(config, opt.params, opt.stage))
        return opt
    if o.name == "sgd":
        return GrowthAwareSGD(params, momentum=float(o.momentum), nesterov=bool(o.nesterov),
                              decoupled_weight_decay=bool(o.decoupled_weight_decay), **common)
    raise ValueError(f"optim.name={o.name!r}: must be adamw or sgd")
