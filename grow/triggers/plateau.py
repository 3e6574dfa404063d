"""``plateau``: grow when the validation loss stops falling. The rate at which it falls is the
least-squares slope of the validation loss against the run's tokens over ``window`` consecutive
evaluations of the current stage (the evaluations the run makes every ``trainer.eval_every`` steps).
The stage ends when the rate over its last ``window`` evaluations is below ``min_ratio`` times the
rate over its first ``window`` (a loss that does not fall at all over the first window ends it at
once). Relative, so one setting means the same at any scale: at 0.25 a stage ends once its loss
falls four times slower than when it began. ``min_tokens`` keeps a stage from ending before it
trained that many tokens."""

from __future__ import annotations

from grow.triggers.base import Trigger, integer, number, register


def slope(points: list[tuple[float, float]]) -> float:
    """The least-squares slope of y on x over ``points`` [(x, y), ...] (at least two distinct x)."""
    n = len(points)
    mx = sum(x for x, _ in points) / n
    my = sum(y for _, y in points) / n
    sxx = sum((x - mx) ** 2 for x, _ in points)
    return sum((x - mx) * (y - my) for x, y in points) / sxx


@register("plateau")
class Plateau(Trigger):
    """A stage ends when its validation loss falls at less than ``min_ratio`` of its first rate."""

    needs_evals = True

    @classmethod
    def check_options(cls, options: dict) -> dict:
        options = super().check_options(options)
        options["window"] = integer("window", options["window"], 2)
        options["min_ratio"] = number("min_ratio", options["min_ratio"], 0)
        options["min_tokens"] = integer("min_tokens", options["min_tokens"], 0)
        return options

    def begin_stage(self, memory: dict, progress) -> None:
        memory["evals"] = []

    def after_eval(self, memory: dict, progress, val_loss: float, train_loss) -> bool:
        evals = memory.setdefault("evals", [])
        evals.append([progress.tokens / 1e6, float(val_loss)])
        w = self.options["window"]
        if len(evals) < w or progress.stage_tokens < self.options["min_tokens"]:
            return False
        first, now = -slope(evals[:w]), -slope(evals[-w:])  # nats per million tokens
        memory["rate"], memory["first_rate"] = now, first
        return first <= 0 or now < self.options["min_ratio"] * first
