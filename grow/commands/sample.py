"""``grow sample``: text from a run's checkpoint with the run's tokenizer (`grow.sampling`)."""

from __future__ import annotations

import hydra
from omegaconf import DictConfig

from grow.commands import quote_values, user_errors
from grow.config import CONFIG_DIR
from grow.sampling import check  # noqa: F401 - the command's validation (grow.cli runs it before Hydra)


def normalize(argv: list[str]) -> list[str]:
    """A run directory may contain ``=`` (``svd_width_rate=0.5-seed0``) and a prompt any character."""
    return quote_values(argv, keys=("run", "ckpt", "prompt"))


def extra_overrides(argv: list[str]) -> list[str]:
    """Nothing on disk: run in the current directory and skip Hydra's .hydra/ output."""
    return ["hydra.run.dir=.", "hydra.output_subdir=null"]


@hydra.main(config_path=str(CONFIG_DIR), config_name="sample", version_base="1.3")
def main(cfg: DictConfig) -> None:
    from grow.sampling import SampleConfig, sample

    with user_errors():
        sample(SampleConfig.from_node(cfg))


if __name__ == "__main__":
    main()
