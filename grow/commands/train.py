"""``grow train``: one training run (the fixed-size baseline, or a growth run with +schedule=...)."""

from __future__ import annotations

from pathlib import Path

import hydra
from hydra.core.hydra_config import HydraConfig
from omegaconf import DictConfig

from grow.commands import user_errors
from grow.config import CONFIG_DIR, validate


def extra_overrides(argv: list[str]) -> list[str]:
    return []


@hydra.main(config_path=str(CONFIG_DIR), config_name="train", version_base="1.3")
def main(cfg: DictConfig) -> float:
    from grow.train import train

    with user_errors():
        validate(cfg)
        summary = train(cfg, Path(HydraConfig.get().runtime.output_dir))
    return summary["final_val_loss"]


if __name__ == "__main__":
    main()
