"""``tokens_per_param``: grow when the current model has seen ``ratio`` training tokens per parameter
(the run's tokens so far over the current model's parameters: the tokens its smaller ancestors saw
count, as they shaped its weights). Mallik et al. ("When is Warmstarting Effective for Scaling
Language Models?", arXiv 2605.13405) find growth pays most below ~20 tokens per parameter."""

from __future__ import annotations

from grow.errors import ConfigError
from grow.triggers.base import Trigger, number, register


@register("tokens_per_param")
class TokensPerParam(Trigger):
    """A stage ends once tokens >= ``ratio`` x the current model's parameters."""

    @classmethod
    def check_options(cls, options: dict) -> dict:
        options = super().check_options(options)
        options["ratio"] = number("ratio", options["ratio"], 0, lo_open=True)
        return options

    def check_plan(self, plan, tokens_per_step: int) -> None:
        r = self.options["ratio"]
        marks = [r * s.params for s in list(plan)[:-1]]
        if len(marks) > 1 and any(b - a < tokens_per_step for a, b in zip(marks, marks[1:])):
            raise ConfigError("schedule.trigger.ratio", r, f"two growths would fall in one step (the thresholds "
                             f"ratio x params of consecutive stages are less than a step's {tokens_per_step} tokens "
                             f"apart); allowed: a larger ratio")

    def after_step(self, memory: dict, progress) -> bool:
        return progress.tokens >= self.options["ratio"] * progress.params
