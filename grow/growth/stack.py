"""``stack``: depth growth by copying blocks (G_stack; MIDAS), other dimensions through ``base``.

Wenyu Du et al., "Stacking Your Transformers: A Closer Look at Model Growth for Efficient LLM
Pre-Training", NeurIPS 2024, arXiv 2405.15319 (code: ``tongxuluo/prts``); Nikunj Saunshi et al., "On
the Inductive Bias of Stacking Towards Improving Reasoning" (MIDAS), NeurIPS 2024, arXiv 2409.19044.
Block i of the grown model copies old block s(i), s given by ``order`` (repeat | middle |
interleave): docs/strategies.md, "stack, hyperclone, msg", "stack in detail".
"""

from __future__ import annotations

import torch

from grow.growth.base import GrowthContext, Site, Strategy, get_strategy, register
from grow.model import TransformerConfig

ORDERS = ("repeat", "middle", "interleave")
BASES = ("zero", "random", "net2net")


def stack_order(n_old: int, n_new: int, order: str) -> list[int]:
    """s: the old block each block of the grown model copies (module docstring)."""
    if order == "repeat":
        return [i % n_old for i in range(n_new)]
    if order == "interleave":
        return [i * n_old // n_new for i in range(n_new)]
    if order == "middle":
        seq = list(range(n_old))
        while len(seq) < n_new:
            seq = _midas_round(seq, min(n_new - len(seq), len(seq)), n_old, n_new)
        return seq
    raise ValueError(f"order={order!r}: must be one of {', '.join(ORDERS)}")


def _midas_round(seq: list[int], b: int, n_old: int, n_new: int) -> list[int]:
    """MIDAS's operator on a model of len(seq) layers read as B = len(seq)/b blocks of b layers f_1 .. f_B
    (from the embeddings): block ceil(B/2) is copied and inserted right after itself (Saunshi et al., §3)."""
    if len(seq) % b:
        raise ValueError(f"stack order=middle (MIDAS) adds one block of b layers, copying the middle one of the model's "
                         f"blocks of b: {len(seq)} layers are not whole blocks of b={b} ({n_old} -> {n_new} layers); "
                         f"grow from schedule.start.n_layers = b by schedule.depth_step = b")
    start = ((len(seq) // b + 1) // 2 - 1) * b
    return seq[: start + b] + seq[start : start + b] + seq[start + b :]


def copy_positions(src: list[int]) -> list[int]:
    """Positions of the copies in the grown model: every occurrence of a block but its first."""
    seen: set[int] = set()
    out = []
    for i, s in enumerate(src):
        if s in seen:
            out.append(i)
        seen.add(s)
    return out


def copy_block(ctx: GrowthContext, site: Site, src: int) -> None:
    """Fill the new layer of ``site`` (an N site) with a copy of the input model's block ``src``:
    its parameters and its forward multipliers, so it computes what block ``src`` computes."""
    params = dict(ctx.model.named_parameters())
    for slot in site.slots:
        old = params[f"layers.{src}.{slot.key}"].detach()
        with torch.no_grad():
            slot.tensor.copy_(old)
    for mod in list(site.mults):
        if mod.startswith(f"layers.{site.layer}."):
            rest = mod.split(".", 2)[2]
            site.mults[mod] = ctx.model.get_submodule(f"layers.{src}.{rest}").mult


class BlockCopies(Strategy):
    """Depth growth whose new layers are copies of old blocks (`sources`: the old block each block of the grown
    model copies; first occurrences keep their names); every other dimension through ``base``. Subclasses:
    ``stack``, ``llama_pro``, ``dus``."""

    own_dims = ("N",)
    exact_with = None  # a copied block changes the function

    def __init__(self, **options):
        super().__init__(**options)
        o = self.options
        if o["base"] not in BASES:
            raise self.bad_option("base", o["base"], f"must be one of {', '.join(BASES)}")
        self.base = get_strategy(o["base"], **dict(o["base_options"] or {}))

    def sources(self, n_old: int, n_new: int) -> list[int]:  # pragma: no cover - abstract
        raise NotImplementedError

    def block_sources(self, n_old: int, n_new: int, inserted: list[int]) -> dict[int, int]:
        return dict(enumerate(self.sources(n_old, n_new)))

    def check_transition(self, source: TransformerConfig, target: TransformerConfig) -> None:
        self.sources(source.n_layers, target.n_layers)  # a depth the order cannot reach: its ValueError, before training
        self.base.check_transition(source, target.replace(n_layers=source.n_layers))
        super().check_transition(source, target)

    def layer_positions(self, source: TransformerConfig, target: TransformerConfig):
        return copy_positions(self.sources(source.n_layers, target.n_layers))

    def initialize(self, model, generator=None) -> None:
        self.base.initialize(model, generator)

    def setup(self, ctx: GrowthContext) -> None:
        self.base.setup(ctx)

    def before_expansion(self, ctx: GrowthContext, dim: str) -> None:
        self.base.before_expansion(ctx, dim)

    def fill(self, ctx: GrowthContext, site: Site) -> None:
        if site.dim != "N":
            return self.base.fill(ctx, site)
        copy_block(ctx, site, self.sources(ctx.model.config.n_layers, site.new_size)[site.layer])

    def after_expansion(self, ctx: GrowthContext, dim: str, model, param_map) -> None:
        self.base.after_expansion(ctx, dim, model, param_map)

    def finish(self, ctx: GrowthContext, model, param_map) -> None:
        self.base.finish(ctx, model, param_map)
        if ctx.target.n_layers > ctx.source.n_layers:
            ctx.metrics[f"{self.name}/copied_layers"] = float(ctx.target.n_layers - ctx.source.n_layers)


@register("stack")
class Stack(BlockCopies):
    """New layers are copies of old blocks in the ``order`` named; other dimensions from ``base``."""

    grows_by_units = True  # a new block reads the old block it copies (`block_sources`)

    def __init__(self, **options):
        super().__init__(**options)
        if self.options["order"] not in ORDERS:
            raise self.bad_option("order", self.options["order"], f"must be one of {', '.join(ORDERS)}")

    def sources(self, n_old: int, n_new: int) -> list[int]:
        return stack_order(n_old, n_new, self.options["order"])
