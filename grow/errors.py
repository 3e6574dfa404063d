"""The errors a user can cause, and where the configs live: the leaves every other module may import.

Nothing here imports another module of ``grow``, so config, data, checkpoint and distributed can
all raise and catch these without importing each other.

- `ConfigError`: a bad configuration value, ``key=value: what is allowed`` (exit status 2);
- `DataError`: a data problem the user can fix (missing file, unreachable dataset; exit status 2);
- `NonFiniteLoss`: the loss or the gradient became NaN or infinite (exit status 3).
"""

from __future__ import annotations

from pathlib import Path

# The Hydra configs: ``configs/`` beside the package in a source checkout.
CONFIG_DIR = Path(__file__).resolve().parent.parent / "configs"


class ConfigError(ValueError):
    """A bad configuration value: ``key=value: allowed``."""

    def __init__(self, key: str, value, allowed: str):
        self.key, self.value, self.allowed = key, value, allowed
        super().__init__(f"{key}={value!r}: {allowed}" if value is not ... else f"{key}: {allowed}")


class DataError(ValueError):
    """A data problem the user can fix (missing file, unreachable dataset, ...): one-line message."""


class NonFiniteLoss(RuntimeError):
    """The loss or the gradient became NaN or infinite (and no skips were left)."""


def options(group: str) -> list[str]:
    """The YAML options of a config group, e.g. options('strategy') -> ['net2net', 'random', ...]."""
    return sorted(p.stem for p in (CONFIG_DIR / group).glob("*.yaml"))
