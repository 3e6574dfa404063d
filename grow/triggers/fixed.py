"""``fixed``: the plan's stage lengths (Yuan et al.'s Eq. 7), decided before training. The default;
every run before triggers existed is this one, bit for bit."""

from __future__ import annotations

from grow.triggers.base import Trigger, register


@register("fixed")
class Fixed(Trigger):
    """Grow at the plan's stage boundaries (the trainer runs each stage's planned steps)."""

    @property
    def planned(self) -> bool:
        return True
