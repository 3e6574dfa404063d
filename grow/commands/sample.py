"""``grow sample``: text from a run's checkpoint with the run's tokenizer (`grow.sampling`)."""

from __future__ import annotations

import hydra
from omegaconf import DictConfig

from grow.commands import in_place, quote_values, reader_may_stop, user_errors
from grow.config import CONFIG_DIR
from grow.sampling import (
    SampleConfig,
    check,  # noqa: F401 - the command's validation (grow.cli runs it before Hydra)
    sample,
)


def normalize(argv: list[str]) -> list[str]:
    """A run directory may contain ``=`` (``svd_width_rate=0.5-seed0``) and a prompt any character."""
    return quote_values(argv, keys=("run", "ckpt", "prompt"))


extra_overrides = in_place  # no run directory: the current one, no .hydra/ output


@hydra.main(config_path=str(CONFIG_DIR), config_name="sample", version_base="1.3")
def main(cfg: DictConfig) -> None:
    with user_errors(), reader_may_stop():
        sample(SampleConfig.from_node(cfg))


if __name__ == "__main__":
    main()
