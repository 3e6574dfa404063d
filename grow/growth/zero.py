"""``zero``: function-preserving growth as in A. Gesmundo and K. Maile, "Composable Function-preserving
Expansions for Transformer Architectures", arXiv:2308.06103 (2023): Table 1, Thm 3.1-3.6
(docs/design.md §4, §5).

Every entry under a function-preserving constraint is 0 (new rows of W2 for p, new rows of W^O
for E and v, new columns of W^K for k, the new residual-stream writers E, P, W^O, W2, b2 for h,
and W^O, W2, b2 of an inserted layer for N); every free entry comes from the model's own
initializer (`grow.model.init_like`): N(0, init_std^2) weights (W^O/W2 roles scaled by
1/sqrt(2N)), zero biases, unit gains times the h-growth's sqrt(h/h_hat). The rescalings that
are part of the transformations (old W^K x sqrt(k_hat/k), norm gains x sqrt(h/h_hat)) are done
by the expansions. Exactly function-preserving for every dimension and any composition.

The one deviation from Gesmundo & Maile: the new norm-gain entries of an h growth are free, not zero
(see `grow.growth.expand.grow_hidden_size`), so that no new unit is dead.

Options (``configs/strategy/zero.yaml``): ``layer_position`` (where new layers go).
"""

from __future__ import annotations

from grow.growth.base import Strategy, register


@register("zero")
class Zero(Strategy):
    """Constrained entries 0, free entries from the model's initializer (the base-class rule)."""

    defaults = {"layer_position": "end"}
