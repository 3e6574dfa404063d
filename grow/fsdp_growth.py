"""A growth one unit at a time (docs/design.md §11.2, "Growing by units"): the root, then each block
of the grown model, each grown by `grow.growth.grow` on a model holding only that unit's tensors (and
the root's) whole, every other tensor on the meta device. With the per-tensor random streams of
design §5 each unit draws what the whole model grown at once draws, so the units' tensors put
together are the whole growth's. `grow_by_units` takes the tensors from a loader (a sharded model's
gathered unit under FSDP) and hands each grown unit to a consumer (that rank's rows).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Callable

import torch

from grow.growth import GrowthResult, get_strategy, grow, layer_positions
from grow.growth.masks import build_model
from grow.growth.msg import copied_layer
from grow.growth.stack import BlockCopies
from grow.model import TransformerConfig

# the strategies whose growth of one tensor reads only its own unit (and the root), or, for depth, the
# blocks it copies (stack): what `grow_by_units` grows exactly; the others need the whole model
# (svd's statistics, ligo's operator; vt's Eq. 5 norms, which its finish takes of every layer at once)
BY_UNITS = ("zero", "random", "net2net", "hyperclone", "shrink_perturb", "msg", "stack", "llama_pro", "dus")


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
    root_metrics: set = field(default_factory=set)  # the keys the root unit logged


def supports(strategy) -> bool:
    """Whether ``strategy`` (a `Strategy`) grows exactly by units."""
    return strategy.name in BY_UNITS and (strategy.name != "hyperclone" or strategy.base.name in BY_UNITS)


def plan_units(strategy, source: TransformerConfig, target: TransformerConfig) -> list[Unit]:
    """The root, each old block (to its place in the grown model), each new block (with the old block
    it copies, for the strategies that copy blocks)."""
    n, m = source.n_layers, target.n_layers
    inserted = layer_positions(n, m, strategy.layer_positions(source, target)) if m > n else []
    kept = [i for i in range(m) if i not in inserted]
    sources = _copied(strategy, n, m, inserted)
    units = [Unit(frozenset(), frozenset(), frozenset(), root=True)]
    units += [Unit(frozenset({i}), frozenset(), frozenset({kept[i]})) for i in range(n)]
    units += [Unit(frozenset({sources[j]}) if j in sources else frozenset(), frozenset({j}), frozenset({j}))
              for j in inserted]
    return units


def _copied(strategy, n: int, m: int, inserted: list[int]) -> dict[int, int]:
    """{new block: the old block it copies} of a depth growth (stack's orders, msg's ``copy``)."""
    if isinstance(strategy, BlockCopies):
        return dict(enumerate(strategy.sources(n, m)))
    if strategy.name == "msg" and strategy.options["new_layer_init"] == "copy":
        return {j: copied_layer(n, inserted, j) for j in inserted}
    return {}


def _layer(name: str) -> int | None:
    return int(name.split(".")[1]) if name.startswith("layers.") else None


def unit_model(config: TransformerConfig, skeleton: dict, load: Callable[[str], torch.Tensor], unit: Unit):
    """The input model with the root and ``unit.old``'s tensors whole (``load(name)``), the rest on the
    meta device (``skeleton``: name -> (shape, dtype) of every tensor of the state dict, or a value)."""
    sd = {}
    for name, spec in skeleton.items():
        if not isinstance(spec, tuple):
            sd[name] = spec
        elif _layer(name) is None or _layer(name) in unit.old:
            sd[name] = load(name)
        else:
            sd[name] = torch.empty(spec[0], dtype=spec[1], device="meta")
    return build_model(config, sd)


def grow_by_units(config: TransformerConfig, skeleton: dict, load: Callable[[str], torch.Tensor],
                  target: TransformerConfig, strategy, keep: Callable[[str, torch.Tensor], None], **grow_kw
                  ) -> UnitsResult:
    """Grow unit by unit (`plan_units`): ``keep(name, tensor)`` gets every tensor of the grown model's
    state dict once, whole, from the unit that yields it; ``grow_kw`` go to `grow.growth.grow`."""
    strategy = get_strategy(strategy)
    out = UnitsResult(GrowthResult(model=None, param_map={}))
    for unit in plan_units(strategy, config, target):
        model = unit_model(config, skeleton, load, unit)
        res = grow(model, target, strategy=strategy, new_layers=set(unit.new), **grow_kw)
        for name, t in res.model.state_dict().items():
            if isinstance(t, torch.Tensor) and (unit.root if _layer(name) is None else _layer(name) in unit.grown):
                keep(name, t)
        for name, mod in res.model.named_modules():
            if hasattr(mod, "mult") and (unit.root if _layer(name) is None else _layer(name) in unit.grown):
                out.mults[name] = mod.mult
        _merge(out, res, unit)
        del model, res
    return out


def _merge(out: UnitsResult, res: GrowthResult, unit: Unit) -> None:
    """The whole growth's fields from each unit's: the maps (value-free, every unit's the same), the
    sets and factors of the tensors each unit yields, the root unit's state, FLOPs and metrics, plus
    the sum over the blocks of the metrics the blocks' own sites add (net2net's copies)."""
    into = out.result
    into.param_map = res.param_map
    yields = (lambda n: _layer(n) is None) if unit.root else (lambda n: _layer(n) in unit.grown)
    into.fresh |= {n for n in res.fresh if yields(n)}
    into.rescaled.update({n: c for n, c in res.rescaled.items() if yields(n)})
    if unit.root:
        into.metrics, into.state, into.flops = dict(res.metrics), res.state, float(res.flops)
        into.lr_multipliers, out.root_metrics = res.lr_multipliers, set(res.metrics)
        return
    for k, v in res.metrics.items():
        if k not in out.root_metrics:
            into.metrics[k] = into.metrics.get(k, 0.0) + v
