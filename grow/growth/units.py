"""A growth one unit at a time (docs/distributed.md, "FSDP2", docs/fsdp.md "A growth"): the root, then
each block of the grown model, each grown by `grow.growth.grow` on a model holding only that unit's
tensors whole (a block's: its block, and the root's masks), every other tensor on the meta device. With the per-tensor random
streams of docs/strategies.md each unit draws what the whole model grown at once draws, so the units' tensors
put together are the whole growth's. `grow_by_units` takes the tensors from a loader (a sharded
model's gathered unit under FSDP, `grow.fsdp_growth.sharded`) and hands each grown unit to a consumer.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Callable

import torch

from grow.growth import GrowthResult, Strategy, as_unit, get_strategy, grow, layer_positions
from grow.growth.base import available, strategy_class
from grow.masks import MASK_BUFFERS, build_model
from grow.model import Linear, TransformerConfig


@dataclass(frozen=True)
class Unit:
    """One growth of a unit: the input's ``old`` blocks held whole (the root always), the grown
    model's ``new`` inserted blocks computed, ``grown`` the grown model's blocks it yields (the root
    where ``root``)."""

    old: frozenset
    new: frozenset
    grown: frozenset
    root: bool = False


@dataclass
class UnitsResult:
    """What `grow_by_units` returns besides the tensors it handed on: the whole growth's
    `GrowthResult` fields (``model`` None), and every Linear's forward multiplier by module name."""

    result: GrowthResult
    mults: dict[str, float] = field(default_factory=dict)
    root_metrics: dict = field(default_factory=dict)  # what the root unit logged
    skeleton: dict = field(default_factory=dict)  # the grown model's state dict's tensors, on the meta device


def supports(strategy) -> bool:
    """Whether ``strategy`` (a `Strategy`) grows exactly by units: what its class declares
    (`Strategy.grows_by_units`), its base strategy's too, if it has one."""
    return get_strategy(strategy).by_units()


def declared() -> list[str]:
    """The registered strategies that declare they grow by units (plugins included)."""
    return [name for name in available() if strategy_class(name).declares_by_units()]


def plan_units(strategy, source: TransformerConfig, target: TransformerConfig) -> list[Unit]:
    """The root, each old block (to its place in the grown model), each new block (with the old block
    it copies, for the strategies that copy blocks)."""
    n, m = source.n_layers, target.n_layers
    inserted = layer_positions(n, m, strategy.layer_positions(source, target)) if m > n else []
    kept = [i for i in range(m) if i not in inserted]
    sources = strategy.block_sources(n, m, inserted) if m > n else {}
    units = [Unit(frozenset(), frozenset(), frozenset(), root=True)]
    units += [Unit(frozenset({i}), frozenset(), frozenset({kept[i]})) for i in range(n)]
    units += [Unit(frozenset({sources[j]}) if j in sources else frozenset(), frozenset({j}), frozenset({j}))
              for j in inserted]
    return units


def layer_of(name: str) -> int | None:
    return int(name.split(".")[1]) if name.startswith("layers.") else None


def unit_model(config: TransformerConfig, skeleton: dict, load: Callable[[str], torch.Tensor], unit: Unit):
    """The input model with ``unit``'s tensors whole (``load(name)``: the root's, or ``unit.old``'s blocks', and
    the root's masks, which a block's masks grow from), the rest on the meta device (``skeleton``: name ->
    (shape, dtype) of every tensor of the state dict, or a value): a block's unit does not grow the root again."""
    sd = {}
    for name, spec in skeleton.items():
        if not isinstance(spec, tuple):
            sd[name] = spec
        elif (unit.root or name.rpartition(".")[2] in MASK_BUFFERS if layer_of(name) is None
              else layer_of(name) in unit.old):
            sd[name] = load(name)
        else:
            sd[name] = torch.empty(spec[0], dtype=spec[1], device="meta")
    return build_model(config, sd)


def grow_by_units(config: TransformerConfig, skeleton: dict, load: Callable[[str], torch.Tensor],
                  target: TransformerConfig, strategy, keep: Callable[[str, torch.Tensor], None], *,
                  after: Callable | None = None, **grow_kw) -> UnitsResult:
    """Grow unit by unit (`plan_units`): ``keep(name, tensor)`` gets every tensor of the grown model's
    state dict once, whole, from the unit that yields it; ``after(unit, model, result, yields)`` (if
    given) sees each unit's input and growth first; ``grow_kw`` go to `grow.growth.grow`."""
    strategy = get_strategy(strategy)
    out = UnitsResult(GrowthResult(model=None, param_map={}))
    device = load(next(n for n, s in skeleton.items() if isinstance(s, tuple) and layer_of(n) is None)).device
    for unit in plan_units(strategy, config, target):
        model = unit_model(config, skeleton, load, unit)
        with as_unit(unit.new, device):
            res = grow(model, target, strategy=strategy, **grow_kw)
        yields = _yields(unit)
        if after is not None:
            after(unit, model, res, yields)
        for name, t in res.model.state_dict().items():
            if isinstance(t, torch.Tensor) and yields(name):
                keep(name, t)
        out.mults.update({name: mod.mult for name, mod in res.model.named_modules()
                          if isinstance(mod, Linear) and yields(name)})
        out.skeleton.update({n: torch.empty(t.shape, dtype=t.dtype, device="meta")
                             for n, t in res.model.state_dict().items() if isinstance(t, torch.Tensor) and yields(n)})
        _merge(out, res, unit, strategy)
        del model, res
    strategy.units_done(out.result.metrics, out.skeleton)
    return out


def _yields(unit: Unit) -> Callable[[str], bool]:
    """Whether a name of the grown model is one of the tensors (or modules) ``unit`` yields."""
    return (lambda n: layer_of(n) is None) if unit.root else (lambda n: layer_of(n) in unit.grown)


def _merge(out: UnitsResult, res: GrowthResult, unit: Unit, strategy: Strategy) -> None:
    """The whole growth's fields from each unit's: the maps (each tensor's from a unit that holds it), the
    sets, factors and learning-rate multipliers of the tensors each unit yields, the root unit's FLOPs,
    the state as the strategy puts it together (`Strategy.unit_state`); a metric is the root unit's
    plus what each block unit adds to it (its value less the root unit's): a constant of the growth stays,
    a count over the sites adds up (net2net's copies: a site spanning the root and the blocks is counted
    by every unit holding one of its tensors, once), or the strategy's own reduction (`Strategy.unit_reduction`:
    vt's extremes); what no sum gives the strategy recounts at the end (`Strategy.units_done`: msg's masks)."""
    into = out.result
    into.param_map.update({n: m for n, m in res.param_map.items() if not m[1].is_meta})  # each from its unit
    yields = _yields(unit)
    into.fresh |= {n for n in res.fresh if yields(n)}
    into.rescaled.update({n: c for n, c in res.rescaled.items() if yields(n)})
    if res.lr_multipliers is not None:
        into.lr_multipliers = {**(into.lr_multipliers or {}),
                               **{n: m for n, m in res.lr_multipliers.items() if yields(n)}}
    if unit.root:
        into.metrics, into.state, into.flops = dict(res.metrics), res.state, float(res.flops)
        out.root_metrics = dict(res.metrics)
        return
    into.state = strategy.unit_state(into.state, res.state, yields)
    for k, v in res.metrics.items():
        reduce = strategy.unit_reduction(k)
        if reduce is not None:
            into.metrics[k] = reduce(into.metrics[k], v) if k in into.metrics else v
        else:
            into.metrics[k] = into.metrics.get(k, 0.0) + v - out.root_metrics.get(k, 0.0)
