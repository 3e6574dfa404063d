"""``periodic``: grow every ``every_tokens`` training tokens (GroMo's users grow on a fixed period,
e.g. every few epochs). The first stage and each later one last ``every_tokens`` (rounded up to
whole steps)."""

from __future__ import annotations

import math

from grow.errors import ConfigError
from grow.triggers.base import Trigger, integer, register


@register("periodic")
class Periodic(Trigger):
    """A stage ends once it has trained ``every_tokens`` tokens."""

    @classmethod
    def check_options(cls, options: dict) -> dict:
        options = super().check_options(options)
        options["every_tokens"] = integer("every_tokens", options["every_tokens"], 1)
        return options

    def check_plan(self, plan, tokens_per_step: int) -> None:
        n = len(plan) - 1  # growths
        if n and math.ceil(self.options["every_tokens"] / tokens_per_step) * tokens_per_step * n >= plan.max_tokens:
            raise ConfigError("schedule.trigger.every_tokens", self.options['every_tokens'], f"the {n} growths would "
                             f"use all of trainer.max_tokens={plan.max_tokens} before the last stage; allowed: fewer "
                             f"than {plan.max_tokens // n} tokens per stage")

    def after_step(self, memory: dict, progress) -> bool:
        return progress.stage_tokens >= self.options["every_tokens"]
