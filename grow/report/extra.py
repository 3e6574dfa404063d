"""The ``report`` extra (SciPy, statsmodels, matplotlib): whether it imports here, and the one line that says
what to install when it does not (docs/statistics.md, "Without the report extra"). The core (train, schedule,
sample, eval, export and compare's arms) never imports it; the report's statistics and figures do.
"""

from __future__ import annotations

import importlib

from grow.errors import ConfigError

MODULES = ("scipy", "statsmodels", "matplotlib")  # what grow.report.inference and grow.report.plots import
INSTALL = "pip install 'grow[report]'"


def missing() -> str | None:
    """The first module of the extra that does not import here (its name as the ImportError gives it), or None."""
    for name in MODULES:
        try:
            importlib.import_module(name)
        except ImportError as exc:
            return exc.name or name
    return None


def needs(what: str, absent: str) -> str:
    """'<what> need the report extra (<absent> is not installed): pip install ...': the one line of both cases."""
    return f"{what} need the report extra ({absent} is not installed): {INSTALL}"


def require(key: str, value) -> None:
    """`ConfigError` (``key=value: ...``; one line, exit status 2) naming the extra when part of it is missing."""
    absent = missing()
    if absent is not None:
        raise ConfigError(key, value, needs("the report's statistics and figures", absent))
