"""``random``: the control: the expansions of ``zero`` (with their rescalings), but every new entry,
those Gesmundo & Maile constrain to zero included, drawn from the model's initializer
(`grow.model.init_like`). The grown network computes another function: comparing it with ``zero``
shows what function preservation buys (docs/strategies.md). Named ``random_init`` so as not to shadow
the standard library's ``random``; registered as ``random``; options in ``configs/strategy/random.yaml``.
"""

from __future__ import annotations

from grow.growth.base import Strategy, register


@register("random")
class Random(Strategy):
    """New entries from the initializer, constrained or not."""

    grows_by_units = True  # each grown tensor from its own old one and its own draws
    exact_with = None  # the control: never function-preserving

    def constrained_values(self, ctx, site, slot):
        return self.free_values(ctx, site, slot)
