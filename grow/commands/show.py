"""``grow <command> ... --cfg job|hydra|all``: the composed config of every job the command line runs.

Hydra's own ``--cfg`` composes one job and refuses a sweep (a ``grow compare``, a ``-m``); here each job
`grow.overrides.jobs` lists is composed with Hydra's compose API and printed as Hydra prints one (``--package``,
``--resolve`` as Hydra's); several jobs are one YAML stream, a document per job (docs/design.md, "Commands").
"""

from __future__ import annotations

import sys

from omegaconf import OmegaConf

from grow.errors import CONFIG_DIR, ConfigError
from grow.overrides import jobs

CFG_FLAGS = ("-c", "--cfg")
PACKAGE_FLAGS = ("-p", "--package")
CFG_TYPES = ("job", "hydra", "all")


def wanted(argv: list[str]) -> bool:
    return any(a in CFG_FLAGS for a in argv)


def _flag_value(argv: list[str], flags: tuple[str, ...], allowed: str) -> str | None:
    for i, a in enumerate(argv):
        if a in flags:
            if i + 1 == len(argv) or argv[i + 1].startswith("-"):
                raise ConfigError(a, ..., f"needs a value: {allowed}")
            return argv[i + 1]
    return None


def parse(argv: list[str]) -> tuple[str, str | None, bool, list[str]]:
    """``argv`` as (the config type, the package or None, resolve, the overrides)."""
    cfg_type = _flag_value(argv, CFG_FLAGS, " | ".join(CFG_TYPES))
    if cfg_type not in CFG_TYPES:
        raise ConfigError("--cfg", cfg_type, f"must be one of {', '.join(CFG_TYPES)}")
    package = _flag_value(argv, PACKAGE_FLAGS, "a key of the config, e.g. model")
    taken = {i + 1 for i, a in enumerate(argv) if a in CFG_FLAGS + PACKAGE_FLAGS}
    overrides = [a for i, a in enumerate(argv) if i not in taken and not a.startswith("-")]
    return cfg_type, package, "--resolve" in argv, overrides


def show(config_name: str, overrides: list[str], cfg_type: str, package: str | None, resolve: bool) -> None:
    """Print the config of each job of ``overrides`` (flags, such as ``-m``, left out) as `parse` read the flags."""
    from hydra import compose, initialize_config_dir
    from hydra.core.global_hydra import GlobalHydra

    overrides = [o for o in overrides if not o.startswith("-")]
    with initialize_config_dir(str(CONFIG_DIR), version_base="1.3"):
        every = jobs(overrides, GlobalHydra.instance().config_loader())
        swept = _varying(every)
        for n, job in enumerate(every, 1):
            cfg = compose(config_name, overrides=job, return_hydra_config=cfg_type != "job")
            if len(every) > 1:
                print(f"---\n# job {n} of {len(every)}: {' '.join(o for o in job if o.split('=')[0] in swept)}")
            sys.stdout.write(_text(_selected(cfg, cfg_type), package, resolve))


def _varying(every: list[list[str]]) -> set[str]:
    """The keys whose value differs between the jobs (what names a job)."""
    values: dict[str, set[str]] = {}
    for job in every:
        for o in job:
            key, _, value = o.partition("=")
            values.setdefault(key, set()).add(value)
    return {k for k, v in values.items() if len(v) > 1}


def _selected(cfg, cfg_type: str):
    """What Hydra's ``--cfg`` shows: the job's keys, Hydra's (less its help texts), or both."""
    if cfg_type == "job":
        return cfg
    from omegaconf import open_dict

    if cfg_type == "hydra":
        cfg = OmegaConf.masked_copy(cfg, ["hydra"])
    with open_dict(cfg.hydra):
        for key in ("help", "hydra_help"):
            del cfg.hydra[key]
    return cfg


def _text(cfg, package: str | None, resolve: bool) -> str:
    node = cfg if package in (None, "_global_") else OmegaConf.select(cfg, package)
    if node is None:
        raise ConfigError("--package", package, "not a key of the composed config")
    head = f"# @package {package}\n" if package not in (None, "_global_") else ""
    if not OmegaConf.is_config(node):
        return f"{head}{node}\n"
    return head + OmegaConf.to_yaml(node, resolve=resolve)
