"""Growth-aware optimizers (docs/design.md §6) and the learning-rate schedule over a whole run.

``from grow.optim import GrowthAwareAdamW, GrowthAwareSGD, build_optimizer, lr_at, LR_SCHEDULES``.

- `grow.optim.bookkeeping`: what does not depend on the update rule. Per parameter element, the
  stage it was born in, and per stage a step count; the per-stage scalars (learning-rate
  multipliers, the new-element warmup); the move onto a grown model (`GrowthAware.grow`: old
  slices keep their buffers and births, new ones start at zero with their own step count); the
  dispatch of a step between the uniform and the per-element paths; the state dict.
- `grow.optim.adamw` and `grow.optim.sgd`: the update rules (torch's AdamW with per-stage bias
  corrections, Appendix C of X. Yuan, P. Savarese and M. Maire, "Accelerated Training via
  Incrementally Growing Neural Networks using Variance Transfer and Learning Rate Adaptation",
  NeurIPS 2023; torch's SGD with momentum).
- `grow.optim.lr`: `lr_at`, the learning rate as a function of the tokens seen over the whole
  run, so a growth never restarts the schedule.

Parameters are given by their names in the *unwrapped* model (``model.named_parameters()``, not a
DDP or torch.compile wrapper, whose names carry a ``module.`` / ``_orig_mod.`` prefix); the names
key the growth map, the multipliers and the state dict. A parameter whose ``.grad`` is None at a
step is skipped (its moments do not move), but the stage step counts are global and advance
anyway: every parameter is expected to get a gradient at every step. Weight decay applies to
parameters with ``dim >= 2`` only (weight matrices, embeddings and W_out). The learning rate:
``opt.step(lr=...)`` sets ``opt.lr`` and steps (or assign ``opt.lr`` and call ``opt.step()``).

Speed. Right after a growth most tensors hold elements of several stages (a growth of h adds
columns to every weight that reads the residual stream, so a stage's elements are strided boxes,
not contiguous slices), and they stay so until the stages' bias corrections round to the same
float32 (b2^n < 2^-25: ~340 steps at b2 = 0.95). No torch kernel applies per-element bias
corrections in one pass: the eager per-element path costs one pass per elementwise op (about nine,
and the gathers of the per-stage scalars) where torch's fused AdamW makes one. ``optim.compile``
runs the same arithmetic as one pass over all mixed tensors: on a CPU one call of a C kernel
(`grow.optim.native`, the default there), on CUDA one Triton launch (`grow.optim.triton_adamw`),
elsewhere torch.compile per tensor (`grow.optim.compiled`); off a CPU the default with
``trainer.compile``. `make bench` reports the ratios (``optimizer.several_stages``).
"""

from __future__ import annotations

import torch

from grow import mup
from grow.optim.adamw import GrowthAwareAdamW
from grow.optim.bookkeeping import GrowthAware
from grow.optim.lr import LR_SCHEDULES, lr_at, rewarm_factor
from grow.optim.sgd import GrowthAwareSGD

__all__ = ["GrowthAware", "GrowthAwareAdamW", "GrowthAwareSGD", "build_optimizer", "lr_at", "rewarm_factor", "LR_SCHEDULES"]


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
