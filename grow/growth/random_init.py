"""``random``: the control: every new entry from the initializer, no zero constraint.

The same expansions as ``zero`` (A. Gesmundo and K. Maile, "Composable Function-preserving
Expansions for Transformer Architectures", arXiv:2308.06103 (2023), Def. 3.1-3.6, including the
rescalings that are part of them: old W^K x sqrt(k_hat/k), norm gains x sqrt(h/h_hat)), but the
entries that Gesmundo & Maile constrain to zero (Thm 3.1-3.6) are drawn from the model's
initializer like the free ones (`grow.model.init_like`: N(0, init_std^2), W^O/W2 roles scaled by
1/sqrt(2N); biases stay 0 because that is the initializer's value for biases). The grown network
computes a different function: comparing it with ``zero`` shows what function preservation buys.

(Named ``random_init`` so as not to shadow the standard library's ``random``; registered as
``random``.)

Options (``configs/strategy/random.yaml``): ``layer_position``.
"""

from __future__ import annotations

from grow.growth.base import Strategy, register


@register("random")
class Random(Strategy):
    """New entries from the initializer, constrained or not."""

    exact_with = None  # the control: never function-preserving
    defaults = {"layer_position": "end"}

    def constrained_values(self, ctx, site, slot):
        return self.free_values(ctx, site, slot)
