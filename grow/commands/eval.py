"""``grow eval``: validation loss and bits per byte of a run's checkpoint on any data (`grow.checkpoint_eval`)."""

from __future__ import annotations

import hydra
from omegaconf import DictConfig

from grow.checkpoint_eval import (
    EvalConfig,
    check,
    evaluate,
    show,
)
from grow.commands import in_place, quote_values, reader_may_stop, user_errors
from grow.config import CONFIG_DIR
from grow.hf.harness import run_harness, show_harness


def normalize(argv: list[str]) -> list[str]:
    """A run directory may contain ``=`` (``svd_width_rate=0.5-seed0``); ``harness=a,b`` is a list of tasks,
    not a sweep."""
    return quote_values(argv, keys=("run", "ckpt", "harness_include"), lists=("harness",))


extra_overrides = in_place  # no run directory: the current one, no .hydra/ output


def job(run: EvalConfig) -> None:
    """The evaluation of the checked settings (`check`): the loss, or lm-evaluation-harness's tasks."""
    with user_errors(), reader_may_stop():
        if run.harness is None:
            return show(evaluate(run))
        show_harness(run_harness(run))


@hydra.main(config_path=str(CONFIG_DIR), config_name="eval", version_base="1.3")
def main(cfg: DictConfig) -> None:
    """A job of ``grow eval ... -m`` (Hydra's launcher; a single one runs `job` through `grow.cli`)."""
    with user_errors():
        run = check(cfg)
    job(run)


if __name__ == "__main__":
    main()
