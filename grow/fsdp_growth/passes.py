"""A strategy's whole-model passes around the units (`Strategy.passes_around_units`: svd growing d_k;
docs/distributed.md, "FSDP2", docs/fsdp.md "A growth"), run on the model as it is held (under FSDP:
sharded, data-parallel). Before the units the statistics pass on the model about to grow k (the input, or
where h grows too the input grown to the new h), layer n's statistics and eigenproblem held by rank n % W
only (`LayerOwners`, `SVD.prepare_units`); each old block's unit records its q/k rows; after them gamma's
line search on the grown model writes the chosen rows (`SVD.finish_units`), each layer's broadcast from its owner.
"""

from __future__ import annotations

from typing import Callable

import torch

from grow.growth import DIMS, GrowthContext, Strategy, get_strategy
from grow.growth.svd_stats import LayerOwners
from grow.model import TransformerConfig
from grow.parallel import distributed, fsdp


def grows_k(strategy, source: TransformerConfig, target: TransformerConfig) -> bool:
    """Whether the strategy runs whole-model passes around the units of this growth (what it declares,
    `Strategy.passes_around_units`: svd growing d_k)."""
    return get_strategy(strategy).passes_around_units(source, target)


def before_k(source: TransformerConfig, target: TransformerConfig) -> TransformerConfig:
    """The config of the model the whole growth takes svd's statistics on: ``target`` with every
    dimension but h (grown first, `grow.growth.base.ORDER`) still ``source``'s."""
    return target.replace(**{f: getattr(source, f) for f in DIMS.values() if f != "d_model"})


class BeforeK(Strategy):
    """svd's base up to the expansion of k: the fills and draws svd's whole growth makes before its
    statistics pass (every hook the base's), without the base's `finish`."""

    name = "svd/before-k"

    def __init__(self, svd: Strategy):  # no options of its own: the base's are set
        self.base, self.options = svd.base, {}

    def layer_positions(self, source, target):
        return self.base.layer_positions(source, target)

    def setup(self, ctx):
        self.base.setup(ctx)

    def before_expansion(self, ctx, dim):
        self.base.before_expansion(ctx, dim)

    def fill(self, ctx, site):
        self.base.fill(ctx, site)

    def after_expansion(self, ctx, dim, model, param_map):
        self.base.after_expansion(ctx, dim, model, param_map)

    def unit_state(self, whole, part, yields):
        return whole  # no `finish`: no state (the statistics model is all it is grown for)


def share(batches: list) -> tuple[list, bool]:
    """(this rank's rows of each growth batch, whether they are a share to sum over the ranks): a
    sharded forward is collective, so every rank must run as many (the growth batches' targets are all
    tokens: no rank skips one); where some batch's rows do not split evenly, every rank takes them all
    (the same sums on every rank, no reduction)."""
    world = distributed.world_size()
    if world > 1 and all(b[0].shape[0] % world == 0 for b in batches):
        return [distributed.shard_batch(b) for b in batches], True
    return list(batches), False


def prepare(strategy, model, source: TransformerConfig, target: TransformerConfig, batches: list, *,
            generator=None, stage=None, amp=None) -> None:
    """svd's statistics on ``model`` (the model about to grow k, `before_k`: whole, or sharded on every
    rank) over the growth ``batches`` (every rank's the whole ones; each takes its `share`)."""
    mine, split = share(batches)
    ctx = GrowthContext(source=source, target=target, model=model, batches=mine, generator=generator, stage=stage,
                        state=None, amp=amp, reduce=distributed.all_reduce_sum if split else None)
    world = distributed.world_size()  # layers divided where each rank gets one (else each holds all, summed)
    owners = LayerOwners(distributed.rank(), world, split) if 1 < world <= model.config.n_layers else None
    get_strategy(strategy).prepare_units(ctx, owners)


def finish(strategy, model, result, rows: Callable[[torch.Tensor], torch.Tensor] | None = None) -> tuple[dict, float]:
    """gamma's line search on the grown ``model`` (whole; or sharded, each rank writing ``rows(whole)``
    of every chosen q/k weight into its shard), the base's state, rates and metrics in ``result`` (the
    units' `GrowthResult`) revised for the chosen rows (vt's Eq. 5); (svd's metrics, FLOPs)."""
    params = dict(model.named_parameters())

    @torch.no_grad()
    def sink(name: str, whole: torch.Tensor) -> None:
        p = params[name]
        fsdp.local(p).copy_(rows(whole) if fsdp.is_sharded(p) else whole)

    grown = GrowthContext(source=model.config, target=model.config, model=model, batches=[], generator=None,
                          stage=None, state=result.state, metrics=result.metrics,
                          lr_multipliers=result.lr_multipliers)
    return get_strategy(strategy).finish_units(model, sink, grown)
