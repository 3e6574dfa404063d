"""Growing a `Transformer`: the six function-preserving expansions of Gesmundo & Maile and pluggable
strategies (docs/model.md, "The six expansions"; docs/strategies.md; the papers in its References).

    from grow.growth import grow, grow_model, GrowthResult
    bigger = grow_model(model, target_cfg, strategy="zero")            # .config == target_cfg
    res = grow(model, target_cfg, strategy="vt", stage=1, state=prev_state, noise_ratio=0.0)

Expansions: `grow.growth.expand`; the strategy interface and registry: `grow.growth.base`.
"""

from __future__ import annotations

import copy
from contextlib import contextmanager
from contextvars import ContextVar
from typing import Any

import torch

from grow import mup
from grow.faults import kill_point
from grow.growth.base import (
    DIMS,
    ORDER,
    GrowthContext,
    GrowthResult,
    ParamMap,
    Passes,
    Site,
    Slot,
    Strategy,
    available,
    check_growth,
    compose_maps,
    get_strategy,
    identity_map,
    new_entry_mask,
    register,
)
from grow.growth.expand import (
    EXPANSIONS,
    add_heads,
    add_layers,
    grow_hidden_size,
    grow_key_size,
    grow_mlp,
    grow_value_size,
    layer_positions,
)
from grow.masks import build_model
from grow.model import Transformer, TransformerConfig

__all__ = [
    "grow",
    "grow_model",
    "as_unit",
    "GrowthResult",
    "GrowthContext",
    "Passes",
    "Strategy",
    "Site",
    "Slot",
    "ParamMap",
    "register",
    "get_strategy",
    "available",
    "check_growth",
    "compose_maps",
    "identity_map",
    "new_entry_mask",
    "grow_hidden_size",
    "grow_key_size",
    "grow_value_size",
    "grow_mlp",
    "add_heads",
    "add_layers",
    "layer_positions",
    "DIMS",
    "ORDER",
]


_UNIT: ContextVar[tuple[set, torch.device] | None] = ContextVar("unit", default=None)


@contextmanager
def as_unit(new_layers: set[int], device: torch.device):
    """`grow` grows one unit (docs/distributed.md, "FSDP2"): only these of the grown model's inserted layers are
    computed (the others on the meta device), and its tensors are on ``device`` (its input may hold
    none: an inserted block's unit)."""
    token = _UNIT.set((set(new_layers), torch.device(device)))
    try:
        yield
    finally:
        _UNIT.reset(token)


def _batches(batch) -> list:
    if batch is None:
        return []
    if isinstance(batch, tuple) and len(batch) == 2 and torch.is_tensor(batch[0]):
        return [batch]
    return list(batch)


def grow(
    model: Transformer,
    target_cfg: TransformerConfig,
    strategy: Any = "zero",
    *,
    batch=None,
    generator: torch.Generator | None = None,
    stage: int | None = None,
    state: Any = None,
    passes: Passes | None = None,
    **options,
) -> GrowthResult:
    """Grow ``model`` to ``target_cfg`` with ``strategy`` (a name, a ``strategy`` node or a `Strategy`;
    ``options`` over its YAML), one dimension at a time in `ORDER`, composing the param maps; see `GrowthResult`.

    ValueError on a shrink or a fixed field changed (`check_growth`); the same config: a copy, the identity
    map, ``state`` passed through. ``batch``: one ``(inputs, targets)`` tuple or a list; ``generator``: every
    draw; ``stage``: the stage entered (1 first); ``state``: the previous growth's; ``passes``: `Passes`.
    The input model is not modified (docs/model.md, "The six expansions")."""
    check_growth(model.config, target_cfg)
    strat = get_strategy(strategy, **options)
    if model.config == target_cfg:
        return GrowthResult(model=copy.deepcopy(model), param_map=identity_map(model), state=state)
    ctx = GrowthContext(
        source=model.config,
        target=target_cfg,
        model=model,
        batches=_batches(batch),
        generator=generator,
        stage=stage,
        state=state,
        amp=passes.amp if passes else None,
        reduce=passes.reduce if passes else None,
        new_layers=unit[0] if (unit := _UNIT.get()) else None,
        unit_device=unit[1] if unit else None,
    )
    where = strat.layer_positions(model.config, target_cfg)
    ctx.dim = "setup"
    strat.setup(ctx)
    # the fields that are not dimensions (dropout, init_std) come from the target from the start
    dims_now = {fld: getattr(model.config, fld) for fld in DIMS.values()}
    dims_now["top_k"] = model.config.top_k  # changes with the experts (X), never above them
    current, pmap = model, None  # None: the identity (not materialized, to spare memory)
    if target_cfg.replace(**dims_now) != model.config:
        current, pmap = _rebuild(model, target_cfg.replace(**dims_now))
    for dim in ORDER:
        fld = DIMS[dim]
        same_k = dim != "X" or current.config.top_k == target_cfg.top_k  # X's expansion also sets top_k
        if getattr(current.config, fld) == getattr(target_cfg, fld) and same_k:
            continue
        ctx.model, ctx.dim = current, dim
        strat.before_expansion(ctx, dim)
        kwargs = {"where": where} if dim == "N" else {}
        grown, step = EXPANSIONS[dim](current, getattr(target_cfg, fld), strat, ctx=ctx, **kwargs)
        strat.after_expansion(ctx, dim, grown, step)
        ctx.rescaled = _moved(ctx.rescaled, step, grown)
        for n, c in ctx.expansion_scales.items():
            ctx.rescaled[n] = ctx.rescaled.get(n, 1.0) * c
        ctx.expansion_scales = {}
        current, pmap = grown, step if pmap is None else compose_maps(pmap, step)
        kill_point("expand")
    assert current.config == target_cfg, (current.config, target_cfg)
    if pmap is None:
        pmap = identity_map(model)
    ctx.model, ctx.dim = current, "finish"
    strat.finish(ctx, current, pmap)
    if mup.is_mup(target_cfg):  # W_out x m'/m, its multiplier / (m'/m): the grown model in mup, the same function
        ctx.rescaled = mup.regrow(model.config, current, ctx.rescaled)
    return GrowthResult(
        model=current,
        param_map=pmap,
        metrics=dict(ctx.metrics),
        flops=float(ctx.flops),
        state=ctx.state,
        lr_multipliers=ctx.lr_multipliers,
        fresh=set(ctx.fresh),
        rescaled={n: c for n, c in ctx.rescaled.items() if not _is_one(c) and n not in ctx.fresh},
    )


def _moved(rescaled: dict, step: ParamMap, grown: Transformer) -> dict:
    """``rescaled`` through one expansion's map: renamed, and a factor per entry (a tensor) placed at its
    entries' new positions (1 at the new entries, which have no moments to convert)."""
    out = {}
    for name, c in rescaled.items():
        new, idx = step[name]
        if isinstance(c, torch.Tensor):
            p = grown.get_parameter(new)
            placed = torch.ones(p.shape, dtype=c.dtype, device=c.device)
            placed.view(-1)[idx.reshape(-1).to(c.device)] = c.reshape(-1)
            c = placed
        out[new] = c
    return out


def _is_one(c) -> bool:
    return bool((c == 1.0).all()) if isinstance(c, torch.Tensor) else c == 1.0


def grow_model(
    model: Transformer,
    target_cfg: TransformerConfig,
    strategy: Any = "zero",
    *,
    batch=None,
    generator: torch.Generator | None = None,
    **options,
) -> Transformer:
    """``grow(...).model``: the grown `Transformer`, whose ``.config == target_cfg``."""
    return grow(model, target_cfg, strategy, batch=batch, generator=generator, **options).model


def _rebuild(model: Transformer, cfg: TransformerConfig) -> tuple[Transformer, ParamMap]:
    """Same parameters under a config that differs only in non-dimension fields (dropout, init_std)."""
    new = build_model(cfg, model.state_dict())
    new.train(model.training)
    # fresh parameter objects: the input model must not share storage-changing identity with it
    new = copy.deepcopy(new)
    return new, identity_map(new)
