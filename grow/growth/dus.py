"""``dus``: depth up-scaling (docs/strategies.md, "shrink_perturb, llama_pro, dus; training only the new layers; the MIDAS and SPARKLING recipes"). D. Kim et al., "SOLAR 10.7B: Scaling Large Language Models
with Simple yet Effective Depth Up-Scaling", arXiv 2312.15166.

The n-layer model twice, the last m layers of the first copy and the first m of the second dropped, concatenated:
blocks 0 .. n-m-1 then m .. n-1 (SOLAR: n = 32, m = 8 -> 48); m = n - N_hat / 2 from the target depth. The
second copy's blocks m .. n-m-1 are the new layers. Not function-preserving. Other dimensions through ``base``.

Options (``configs/strategy/dus.yaml``): ``base``, ``base_options``.
"""

from __future__ import annotations

from grow.growth.base import register
from grow.growth.stack import BlockCopies


def dus_order(n_old: int, n_new: int) -> list[int]:
    """Blocks 0 .. n-m-1 of the first copy, then m .. n-1 of the second (m = n - n_new / 2)."""
    if n_new == n_old:
        return list(range(n_old))
    if n_new % 2 or n_new > 2 * n_old:
        raise ValueError(f"{n_old} -> {n_new} layers: depth up-scaling gives 2n - 2m layers for 0 <= m < n, an even "
                         f"number in [{n_old + n_old % 2}, {2 * n_old}]")
    m = n_old - n_new // 2
    return list(range(n_old - m)) + list(range(m, n_old))


@register("dus")
class DUS(BlockCopies):
    """Two copies of the model with m layers dropped at the seam of each; other dimensions through ``base``."""

    grows_by_units = True  # a new block reads the old block it copies (`block_sources`)

    def sources(self, n_old: int, n_new: int) -> list[int]:
        return dus_order(n_old, n_new)
