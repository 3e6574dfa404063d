"""Strategies, triggers and model flags from outside the package: ``GROW_PLUGINS=module[,module...]``.

A module on the Python path registers its class (`grow.growth.base.register`, ``grow.triggers.register``,
`grow.flags.register`) and ships its YAML beside itself (``configs/strategy/<name>.yaml``,
``configs/schedule/trigger/<name>.yaml``); every command imports the named modules before composing
its config and stores each YAML in Hydra's ConfigStore, so ``strategy=<name>`` composes as a built-in
one does and everything listing the registry includes it (docs/extending.md). `load` then stores the
model group's ``_base`` node, `TransformerConfig.defaults` (docs/design.md, "The run config"), and the
``grow_groups`` resolver of the help's group list.
"""

from __future__ import annotations

import copy
import functools
import importlib
import os
from pathlib import Path

from grow.errors import CONFIG_DIR, ConfigError, groups_help

ENV = "GROW_PLUGINS"
GROUPS = ("strategy", "schedule/trigger")  # the config groups a plugin adds options to (a strategy, a trigger)
_yamls: dict[tuple[str, str], Path] = {}  # (group, name) -> a plugin's YAML
_imported: set[str] = set()
_stored: dict[str, dict] = {}  # model/_base as stored
MODEL_BASE = "_base"  # configs/model/<name>.yaml: defaults: [_base, _self_]


def names() -> list[str]:
    """The plugin modules named by ``GROW_PLUGINS`` (empty when unset)."""
    return [m.strip() for m in os.environ.get(ENV, "").split(",") if m.strip()]


def load() -> None:
    """Import every module of ``GROW_PLUGINS`` not imported yet and store its strategy YAMLs.

    A module that cannot be imported is bad input: `ConfigError` (one line, exit 2)."""
    for module in names():
        if module in _imported:
            continue
        try:
            mod = importlib.import_module(module)
        except ImportError as exc:
            raise ConfigError(ENV, os.environ.get(ENV, ""),
                              f"importable module names, comma-separated ({module}: {exc})") from None
        _imported.add(module)
        for group in GROUPS:
            _store_yamls(Path(mod.__file__).parent / "configs" / group, group)
    store_model_base()
    _register_groups_help()


def store_model_base() -> None:
    """Store ``model/_base``: every key of `TransformerConfig` at its dataclass default, derived at run time so
    that each default is written once (on the field); a model YAML holds only what differs from it, and
    ``model.<key>=v`` composes for every key (a plugin flag's too)."""
    from hydra.core.config_store import ConfigStore

    from grow.model import TransformerConfig  # start-up speed

    node = TransformerConfig.defaults()
    if _stored.get(MODEL_BASE) != node:
        ConfigStore.instance().store(group="model", name=MODEL_BASE, node=node)
        _stored[MODEL_BASE] = node


def _register_groups_help() -> None:
    """``${grow_groups:}`` in configs/train.yaml's help template."""
    from omegaconf import OmegaConf

    if not OmegaConf.has_resolver("grow_groups"):
        OmegaConf.register_new_resolver("grow_groups", groups_help)


def _store_yamls(directory: Path, group: str) -> None:
    from hydra.core.config_store import ConfigStore
    from omegaconf import OmegaConf

    for path in sorted(directory.glob("*.yaml")):
        _yamls[group, path.stem] = path
        ConfigStore.instance().store(group=group, name=path.stem, node=OmegaConf.load(path))


def yaml_path(name: str, group: str = "strategy") -> Path | None:
    """The YAML of a plugin's strategy (or trigger); None for a built-in one."""
    load()
    return _yamls.get((group, name))


def yaml_names(group: str = "strategy") -> list[str]:
    load()
    return sorted(n for g, n in _yamls if g == group)


def yaml_options(group: str, name: str) -> dict:
    """A plugin's or ``configs/<group>/<name>.yaml``'s options and defaults (not ``name``); {} if no YAML."""
    path = yaml_path(name, group) or CONFIG_DIR / group / f"{name}.yaml"
    if not path.is_file():
        return {}
    stat = path.stat()
    return copy.deepcopy(_read_options(str(path), stat.st_mtime_ns, stat.st_size))


@functools.lru_cache(maxsize=256)
def _read_options(path: str, _mtime_ns: int, _size: int) -> dict:
    """A YAML's options, read once per version of the file."""
    from omegaconf import OmegaConf

    data = OmegaConf.to_container(OmegaConf.load(path), resolve=True) or {}
    data.pop("name", None)
    return dict(data)
