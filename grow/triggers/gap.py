"""``gap``: grow when the model starts to overfit its training tokens: at an evaluation, the
validation loss minus the mean training loss logged since the previous evaluation exceeds
``threshold`` nats (the train-validation gap that GroMo's users grow on). ``min_tokens`` keeps a
stage from ending before it trained that many tokens."""

from __future__ import annotations

from grow.errors import ConfigError
from grow.triggers.base import Trigger, integer, number, register


@register("gap")
class Gap(Trigger):
    """A stage ends when validation loss - training loss > ``threshold``."""

    needs_evals = True

    @classmethod
    def check_options(cls, options: dict) -> dict:
        options = super().check_options(options)
        options["threshold"] = number("threshold", options["threshold"])
        options["min_tokens"] = integer("min_tokens", options["min_tokens"], 0)
        return options

    def check(self, run) -> None:
        """Each evaluation is compared with the training losses logged since the previous one: some must be."""
        super().check(run)
        t = run.trainer
        if t.log_every > t.eval_every:
            raise ConfigError("trainer.log_every", t.log_every, "trigger gap compares each evaluation with the "
                              f"training losses logged since the previous one; allowed: at most trainer.eval_every="
                              f"{t.eval_every}")

    def after_eval(self, memory: dict, progress, val_loss: float, train_loss) -> bool:
        if train_loss is None:
            return False
        memory["gap"] = float(val_loss) - float(train_loss)
        return progress.stage_tokens >= self.options["min_tokens"] and memory["gap"] > self.options["threshold"]
