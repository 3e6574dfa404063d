"""``stack``: depth growth by copying blocks (G_stack; MIDAS), other dimensions through ``base``.

Papers
------
- G_stack: Wenyu Du, Tongxu Luo, Zihan Qiu, Zeyu Huang, Yikang Shen, Reynold Cheng, Yike Guo,
  Jie Fu, "Stacking Your Transformers: A Closer Look at Model Growth for Efficient LLM
  Pre-Training", NeurIPS 2024, arXiv 2405.15319 (code: ``tongxuluo/prts``).
- MIDAS: Nikunj Saunshi, Stefani Karp, Shankar Krishnan, Sobhan Miryoosefi, Sashank J. Reddi,
  Sanjiv Kumar, "On the Inductive Bias of Stacking Towards Improving Reasoning", NeurIPS 2024,
  arXiv 2409.19044.

The rule
--------
A model of N blocks f_0, ..., f_{N-1} (``layers.n``; embeddings, final norm and W_out unchanged)
grows to N_hat blocks, block i of the grown model being a copy of block s(i) of the old one:

    M(f) = f_{s(N_hat-1)} o ... o f_{s(1)} o f_{s(0)}

with s given by ``order``:

- ``repeat`` (G_stack): s(i) = i mod N, i.e. blocks 0..N-1, then 0..N-1 again (G_stack's
  ``stacking_list`` for N_hat = g N; prts' ``stackingpt.py`` copies block ``stacking_list[i]`` into
  block i). When N_hat is not a multiple of N the last round is cut short: it copies blocks
  0..(N_hat mod N) - 1.
- ``middle`` (MIDAS): the middle d = N_hat - N blocks, a = floor((N - d)/2) .. a + d - 1, are
  copied and the copies inserted right after them (MIDAS duplicates the middle block of layers,
  where gradual stacking duplicates the last):
  s = 0 .. a+d-1, a .. a+d-1, a+d .. N-1. When d > N, this is done in rounds of at most the
  current depth (each round on the result of the previous one): 1 -> 4 is [0, 0], then [0, 0, 0, 0].
- ``interleave``: each block followed by its copies, s(i) = floor(i N / N_hat): 0, 0, 1, 1, ...
  for N_hat = 2N; when N_hat is not a multiple of N, the first blocks get one copy more.

Not function-preserving: a copied block adds its residual update a second time, so the logits
change at the growth (``growth/delta`` in the logs measures by how much, as for every growth).

Which entries are "new". The first occurrence of each old block in s is that block itself (it
keeps its parameter names in the param map, so the growth-aware optimizer keeps its moments);
every other occurrence is an inserted layer (`grow.growth.expand.add_layers` at the positions
`layer_positions` returns), absent from the param map: the optimizer treats a copy as new, with
zero moments and its own step count. G_stack instead restarts the whole optimizer at the stacked
model (``optim.on_growth=reset`` does that here). A copy also takes its source's forward
multipliers (``mult``), so it computes exactly what its source computes.

Other dimensions (h, k, v, p, E) are grown first by ``base`` (``zero``, ``random`` or
``net2net``), so the copies are taken from the widened blocks.

Options (``configs/strategy/stack.yaml``): ``order``, ``base``, ``base_options``.
"""

from __future__ import annotations

from typing import Any

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
            d = min(n_new - len(seq), len(seq))
            a = (len(seq) - d) // 2
            seq = seq[: a + d] + seq[a : a + d] + seq[a + d :]
        return seq
    raise ValueError(f"order={order!r}: must be one of {', '.join(ORDERS)}")


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
            raise ValueError(f"strategy {self.name!r}: base={o['base']!r}: must be one of {', '.join(BASES)}")
        self.base = get_strategy(o["base"], **dict(o["base_options"] or {}))

    def sources(self, n_old: int, n_new: int) -> list[int]:  # pragma: no cover - abstract
        raise NotImplementedError

    def check_transition(self, source: TransformerConfig, target: TransformerConfig) -> None:
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

    defaults: dict[str, Any] = {"order": "repeat", "base": "zero", "base_options": {}}

    def __init__(self, **options):
        super().__init__(**options)
        if self.options["order"] not in ORDERS:
            raise ValueError(f"strategy 'stack': order={self.options['order']!r}: must be one of {', '.join(ORDERS)}")

    def sources(self, n_old: int, n_new: int) -> list[int]:
        return stack_order(n_old, n_new, self.options["order"])
