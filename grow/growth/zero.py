"""``zero``: function-preserving growth as in A. Gesmundo and K. Maile, "Composable Function-preserving
Expansions for Transformer Architectures", arXiv:2308.06103 (2023): Table 1, Thm 3.1-3.6
(docs/model.md, "The six expansions"; docs/strategies.md).

Every entry under a function-preserving constraint is 0; every free entry comes from the model's own
initializer (`grow.model.init_like`), and the expansions do the rescalings. The one deviation from
the paper: an h growth's new norm-gain entries are free, not zero, so that no new unit is dead
(docs/model.md, "The six expansions"). Options (``configs/strategy/zero.yaml``): ``layer_position``.
"""

from __future__ import annotations

from grow.growth.base import Strategy, register


@register("zero")
class Zero(Strategy):
    """Constrained entries 0, free entries from the model's initializer (the base-class rule)."""

    grows_by_units = True  # each grown tensor from its own old one and its own draws
