"""Interop with the Hugging Face ecosystem (the ``hf`` extra: transformers, safetensors, lm-eval): grow models as
``transformers`` models (`grow.hf.llama`, `grow.hf.remote`), run directories exported as model directories
(`grow.hf.export`), runs started from one (`grow.hf.pretrained`), lm-evaluation-harness (`grow.hf.harness`).
This module stays light: `grow.config` imports the package, and only these modules import the extra."""

from __future__ import annotations

import importlib

from grow.errors import ConfigError

EXTRA = 'pip install -e ".[hf]"'


def require(key: str, value, *modules: str) -> None:
    """`ConfigError` (``key=value``: what asked for it; one line, exit 2) naming the hf extra when one of
    ``modules`` is not installed."""
    for name in modules:
        try:
            importlib.import_module(name)
        except ImportError as exc:
            raise ConfigError(key, value, f"needs the hf extra ({exc.name or name} is not installed): {EXTRA}") from None
