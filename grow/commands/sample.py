"""``grow sample``: text from a run's checkpoint with the run's tokenizer (`grow.sampling`)."""

from __future__ import annotations

import hydra
from omegaconf import DictConfig

from grow.commands import in_place, quote_values, reader_may_stop, user_errors
from grow.config import CONFIG_DIR
from grow.sampling import (
    SampleConfig,
    check,
    sample,
)


def normalize(argv: list[str]) -> list[str]:
    """A run directory may contain ``=`` (``svd_width_rate=0.5-seed0``) and a prompt any character."""
    return quote_values(argv, keys=("run", "ckpt", "prompt"))


extra_overrides = in_place  # no run directory: the current one, no .hydra/ output


def job(config: SampleConfig) -> None:
    """The samples of the checked settings (`check`)."""
    with user_errors(), reader_may_stop():
        sample(config)


@hydra.main(config_path=str(CONFIG_DIR), config_name="sample", version_base="1.3")
def main(cfg: DictConfig) -> None:
    """A job of ``grow sample ... -m`` (Hydra's launcher; a single one runs `job` through `grow.cli`)."""
    with user_errors():
        config = check(cfg)
    job(config)


if __name__ == "__main__":
    main()
