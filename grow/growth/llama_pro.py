"""``llama_pro``: block expansion (docs/strategies.md, "shrink_perturb, llama_pro, dus; training only the new layers; the MIDAS and SPARKLING recipes"). C. Wu et al., "LLaMA Pro: Progressive LLaMA with Block
Expansion", ACL 2024; reference TencentARC/LLaMA-Pro ``scripts/block_expansion.py``.

N blocks grow to N + P: after every old block i with (i + 1) mod floor(N/P) == 0, a copy of block i whose W^O
and W2 (and b2; ``o_proj``, ``down_proj``) are zero: an identity block, exactly function-preserving. A depth
where this places other than P blocks (the reference's assertion) is refused. Train the new blocks alone with
``trainer.train_new_only``. Other dimensions through ``base``.

Options (``configs/strategy/llama_pro.yaml``): ``base``, ``base_options``.
"""

from __future__ import annotations

from typing import Any

import torch

from grow.growth.base import GrowthContext, Site, register
from grow.growth.stack import BlockCopies


def expansion_order(n_old: int, n_new: int) -> list[int]:
    """The old block each block of the grown model copies: every split-th block followed by its copy."""
    added = n_new - n_old
    if added == 0:
        return list(range(n_old))
    split = n_old // added
    if split == 0 or n_old // split != added:
        raise ValueError(f"{n_old} -> {n_new} layers: LLaMA Pro inserts a block after every floor(N/P) = "
                         f"{split}-th of N={n_old} blocks, which places {n_old // split if split else 'no'} blocks, "
                         f"not P={added} (the reference's assertion); pick P dividing N")
    out = []
    for i in range(n_old):
        out.append(i)
        if (i + 1) % split == 0:
            out.append(i)
    return out


@register("llama_pro")
class LlamaPro(BlockCopies):
    """Identity copies of every split-th block after it; other dimensions through ``base``."""

    exact_with: dict[str, Any] = {}  # identity blocks (with an exact base)
    grows_by_units = True  # a new block reads the old block it copies (`block_sources`)

    def sources(self, n_old: int, n_new: int) -> list[int]:
        return expansion_order(n_old, n_new)

    def fill(self, ctx: GrowthContext, site: Site) -> None:
        super().fill(ctx, site)
        if site.dim == "N":  # the writers of the residual stream (Gesmundo & Maile's Thm 3.6 entries) zeroed
            for slot in site.slots:
                if slot.zero:
                    with torch.no_grad():
                        slot.tensor.zero_()
