"""One Hydra application per command; each validates its config before any work (exit 2 on bad input)."""

from __future__ import annotations

import sys
from contextlib import contextmanager

from grow.errors import ConfigError, DataError


@contextmanager
def user_errors():
    """Turn a `ConfigError` or `DataError` into one line on stderr and exit status 2."""
    try:
        yield
    except (ConfigError, DataError) as exc:
        print(f"error: {exc}", file=sys.stderr)
        sys.exit(2)
