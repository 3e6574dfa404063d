"""``grow train``: one training run (the fixed-size baseline, or a growth run with +schedule=...)."""

from __future__ import annotations

from pathlib import Path

import hydra
from hydra.core.hydra_config import HydraConfig
from omegaconf import DictConfig

from grow.checkpoint import run_outcomes
from grow.commands import user_errors
from grow.config import CONFIG_DIR
from grow.parallel import distributed
from grow.parallel.distributed import peer_errors
from grow.run import load as load_run
from grow.train import train


def normalize(argv: list[str]) -> list[str]:
    """``init=<model directory>``: the checkpoint's model and start sizes (`grow.hf.pretrained.command_line`)."""
    from grow.hf.pretrained import command_line  # start-up speed

    return command_line(argv)


def extra_overrides(argv: list[str]) -> list[str]:
    """Under ``torchrun`` (RANK, WORLD_SIZE in the environment): join the process group now, before
    the job is composed, so that every rank uses rank 0's run directory (`grow.parallel.distributed.hydra_overrides`).
    A resume's own overrides and directory come after these (`grow.cli.front`)."""
    if not distributed.wants_distributed():
        return []
    with user_errors(), distributed.peer_errors():
        distributed.init()
        return distributed.hydra_overrides("train", argv)


def job(run) -> float:
    """Train the checked run (`grow.run.load`) into the job's run directory (Hydra's); its final validation loss."""
    with run_outcomes(), user_errors(), peer_errors():
        summary = train(run, Path(HydraConfig.get().runtime.output_dir))
    return summary["final_val_loss"]


@hydra.main(config_path=str(CONFIG_DIR), config_name="train", version_base="1.3")
def main(cfg: DictConfig) -> float:
    """A job of ``grow train ... -m`` (Hydra's launcher; a single run is `job` through `grow.cli`)."""
    with run_outcomes(), user_errors(), peer_errors():
        run = load_run(cfg)  # the precheck's run, handed over (`grow.run.handing_over`)
    return job(run)


if __name__ == "__main__":
    main()
