"""The ``report`` extra (SciPy, statsmodels, matplotlib): whether it imports, and the line naming it when not
(docs/statistics.md, "Without the report extra"). Only the report's statistics and figures import it."""

from __future__ import annotations

import importlib

from grow.errors import ConfigError

MODULES = ("scipy", "statsmodels", "matplotlib")
INSTALL = "pip install 'grow[report]'"


def missing() -> str | None:
    """The first module of the extra that does not import, or None."""
    for name in MODULES:
        try:
            importlib.import_module(name)
        except ImportError as exc:
            return exc.name or name
    return None


def needs(what: str, absent: str) -> str:
    return f"{what} need the report extra ({absent} is not installed): {INSTALL}"


def require(key: str, value) -> None:
    """`ConfigError` (exit status 2) naming the extra when part of it is missing."""
    absent = missing()
    if absent is not None:
        raise ConfigError(key, value, needs("the report's statistics and figures", absent))
