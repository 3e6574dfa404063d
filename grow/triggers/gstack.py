"""``gstack``: the growth timing of G_stack (W. Du et al., "Stacking Your Transformers: A Closer Look at
Model Growth for Efficient LLM Pre-Training", NeurIPS 2024, Eq. 2), fitted for a growth factor of 4:

    log10 d = 0.88 log10 N + 163.27 / log10 C - 5.74

d: the small model's training tokens before the growth; N: the plan's final parameters; C: the plan's
training FLOPs (docs/design.md, "Growth triggers"). Later growths wait the same d again. Fitted at 10^20-10^21 FLOPs,
at CPU scale it can ask for more tokens than the budget: the run then stays at its first size (the
summary says so).
"""

from __future__ import annotations

import math

from grow.triggers.base import Trigger, register


def gstack_tokens(final_params: float, budget_flops: float) -> float:
    """d of the formula above (tokens before the growth)."""
    return 10 ** (0.88 * math.log10(final_params) + 163.27 / math.log10(budget_flops) - 5.74)


@register("gstack")
class GStack(Trigger):
    """A stage ends after G_stack's d tokens."""

    def after_step(self, memory: dict, progress) -> bool:
        d = memory.setdefault("d", gstack_tokens(progress.final_params, progress.budget_flops))
        return progress.stage_tokens >= d
