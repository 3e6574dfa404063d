"""``grow schedule``: print the stage plan of the composed config, without training or writing files."""

from __future__ import annotations

import hydra
from omegaconf import DictConfig, OmegaConf

from grow.commands import user_errors
from grow.config import CONFIG_DIR, validate


def extra_overrides(argv: list[str]) -> list[str]:
    """Nothing on disk: run in the current directory and skip Hydra's .hydra/ output."""
    return ["hydra.run.dir=.", "hydra.output_subdir=null"]


@hydra.main(config_path=str(CONFIG_DIR), config_name="train", version_base="1.3")
def main(cfg: DictConfig) -> None:
    from grow.console import console
    from grow.schedule import build_plan, format_plan

    with user_errors():
        final = validate(cfg)
        schedule = OmegaConf.to_container(cfg.schedule, resolve=True) if cfg.get("schedule") is not None else None
        plan = build_plan(final, schedule, max_tokens=int(cfg.trainer.max_tokens),
                          batch_size=int(cfg.trainer.batch_size))
    console.print(format_plan(plan))


if __name__ == "__main__":
    main()
