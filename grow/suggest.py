"""The nearest valid key for a key a user mistyped, from the whole composed config and the config
groups (``modle=tiny`` -> ``model=tiny``, ``trainer.lr`` -> ``optim.lr``): the hint after a one-line
`ConfigError` (docs/design.md, "Architecture", "The run config")."""

from __future__ import annotations

from dataclasses import fields

from omegaconf import DictConfig, OmegaConf

from grow.config import NOT_GROUPS, LoggerConfig, OptimConfig, TrainerConfig, nearest
from grow.errors import CONFIG_DIR, ConfigError, options
from grow.growth.base import strategy_class
from grow.model import TransformerConfig
from grow.plan import GROWABLE


def config_groups() -> list[str]:
    """The config groups a command line can pick an option of (model, data, strategy, schedule, ...)."""
    return sorted(p.name for p in CONFIG_DIR.iterdir() if p.is_dir() and p.name not in ("arms", "hydra", *NOT_GROUPS))


def _paths(node, prefix: str = "") -> list[str]:
    """The dotted path of every key of a plain nested dict (inner nodes included)."""
    out = []
    if isinstance(node, dict):
        for k, v in node.items():
            path = f"{prefix}{k}"
            out.append(path)
            out += _paths(v, path + ".")
    return out


def _strategy_hint(leaf: str, cfg: dict) -> str:

    current = (cfg.get("strategy") or {}).get("name")
    having = []
    for name in options("strategy"):
        try:
            known = set(strategy_class(name).option_defaults())
        except ValueError:
            continue
        if leaf in known:
            having.append(name)
    if having:
        return f" (an option of strategy={', '.join(having)}; this config's strategy is {current})"
    mine = [k for k in (cfg.get("strategy") or {}) if k != "name"]
    near = nearest(leaf, mine)
    return f" (did you mean strategy.{near}?)" if near else f" (strategy {current} has: {', '.join(mine) or 'no options'})"


def suggest(key: str, value, cfg: dict | None) -> str:
    """`` (did you mean ...?)`` for an unknown ``key=value``, from the whole composed config ``cfg``
    (a plain dict) and the config groups: ``modle=tiny`` -> ``model=tiny``, ``trainer.lr`` ->
    ``optim.lr`` (the same key in another section), ``trainer.max_token`` -> ``trainer.max_tokens``,
    ``schedule.grow=...`` without a schedule -> add ``+schedule=exp`` first. '' when nothing is close."""
    cfg = cfg or {}
    key = key.lstrip("+~")
    parts = key.split(".")
    if parts[0] in NOT_GROUPS:
        return f" ({NOT_GROUPS[parts[0]]})"
    groups, present = config_groups(), list(cfg)
    if len(parts) == 1:
        near = nearest(key, [*groups, *present])
        if not near:
            return ""
        if near in groups and isinstance(value, str) and (CONFIG_DIR / near / f"{value}.yaml").is_file():
            return f" (did you mean {'' if near in present else '+'}{near}={value}?)"
        if near in groups and near not in present:
            return f" (did you mean +{near}=<{'|'.join(options(near))}>?)"
        return f" (did you mean {near}{'' if value is ... else '=' + str(value)}?)"
    head, leaf = parts[0], parts[-1]
    if head in groups and head not in present:
        return f" ({head} is not in this config: add +{head}=<{'|'.join(options(head))}> first)"
    if head not in present:
        near = nearest(head, present)
        return f" (did you mean {'.'.join([near, *parts[1:]])}?)" if near else ""
    if head == "strategy" and len(parts) == 2:
        return _strategy_hint(leaf, cfg)
    if parts[:-1] == ["schedule", "start"] and leaf in GROWABLE:  # a stage-0 size: a key the schedule file leaves out
        return f" (schedule.start sets it with a +: +{key}{'' if value is ... else '=' + str(value)})"
    paths = _paths(cfg)
    same = [p for p in paths if p.rsplit(".", 1)[-1] == leaf and p != key]
    if same:
        return f" (did you mean {same[0]}?)"
    near = nearest(key, paths)
    return f" (did you mean {near}?)" if near else ""


SECTIONS = {"trainer": TrainerConfig, "optim": OptimConfig, "logger": LoggerConfig, "model": TransformerConfig}


def check_section_keys(cfg: DictConfig) -> None:
    """Every key of the typed sections is known; an unknown one (``+trainer.lr=...``) is refused with
    the nearest key of the whole config (``optim.lr``)."""
    plain = None
    for section, cls in SECTIONS.items():
        node = cfg.get(section)
        if not isinstance(node, DictConfig):
            continue
        names = set(cls.defaults()) if cls is TransformerConfig else {f.name for f in fields(cls)}  # plugin flags
        for key in node:
            if key not in names:
                plain = plain or OmegaConf.to_container(cfg, resolve=True)
                known = {k: v for k, v in plain.items()}
                known[section] = {k: v for k, v in plain[section].items() if k in names}
                raise ConfigError(f"{section}.{key}", node.get(key),
                                  f"not a key of {section}{suggest(f'{section}.{key}', node.get(key), known)}")
