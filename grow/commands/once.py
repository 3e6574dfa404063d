"""A single-run command's one job (``grow train`` without ``-m``, schedule, sample, eval, report, export).

It is composed once with Hydra's compose API, checked into the command's object (`grow.commands.precheck.check_one`),
and started as Hydra's launcher starts a job: the Hydra config set (`HydraConfig`), the run directory and its
``.hydra/{config,hydra,overrides}.yaml`` written (a resume reads them); the command is then called with the object
(docs/design.md, "Commands"). ``grow compare`` and ``-m`` sweeps keep Hydra's launcher.
"""

from __future__ import annotations

import copy
import os
from pathlib import Path

from omegaconf import DictConfig, OmegaConf, open_dict, read_write

from grow.errors import CONFIG_DIR


def compose(config_name: str, overrides: list[str], job_name: str) -> DictConfig:
    """The job's whole config, Hydra's node included, in run mode (Hydra's own run composes the same)."""
    from hydra import compose as hydra_compose
    from hydra import initialize_config_dir

    if not any(o.startswith("hydra.mode=") for o in overrides):  # as Hydra's run adds it (its hydra.yaml records it)
        overrides = [*overrides, "hydra.mode=RUN"]
    with initialize_config_dir(str(CONFIG_DIR), version_base="1.3", job_name=job_name):
        return hydra_compose(config_name, overrides=overrides, return_hydra_config=True)


def start(cfg: DictConfig) -> tuple[DictConfig, Path]:
    """Set the Hydra config of the job (its ``hydra.runtime.output_dir``, from ``hydra.run.dir`` resolved once) and
    return the job's config without Hydra's node, unresolved, and its output directory."""
    from hydra.core.hydra_config import HydraConfig
    from hydra.core.utils import configure_log

    HydraConfig.instance().set_config(cfg)  # hydra.run.dir may read ${hydra:...} and ${now:...}
    out = Path(str(cfg.hydra.run.dir))
    with read_write(cfg.hydra.runtime), open_dict(cfg.hydra.runtime):
        cfg.hydra.runtime.output_dir = os.path.abspath(out)
    HydraConfig.instance().set_config(cfg)
    configure_log(cfg.hydra.job_logging, cfg.hydra.verbose)  # grow's configs: none (its console prints)
    task = copy.deepcopy(cfg)
    with read_write(task), open_dict(task):
        del task["hydra"]
    return task, out


def write_run_dir(cfg: DictConfig, task: DictConfig, out: Path) -> None:
    """The output directory, and unless ``hydra.output_subdir=null`` its ``.hydra/`` as Hydra writes it."""
    from hydra.core.hydra_config import HydraConfig

    out.mkdir(parents=True, exist_ok=True)
    if cfg.hydra.output_subdir is None:
        return
    where = out / str(cfg.hydra.output_subdir)
    where.mkdir(parents=True, exist_ok=True)
    for name, node in (("config.yaml", task), ("hydra.yaml", HydraConfig.instance().cfg),
                       ("overrides.yaml", cfg.hydra.overrides.task)):
        (where / name).write_text(OmegaConf.to_yaml(node), encoding="utf-8")
