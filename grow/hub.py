"""Whether this machine can ask the Hugging Face Hub, asked before anything downloads from it (a hub
dataset of ``data=hf``, a task of lm-evaluation-harness's index), so that an offline machine gets one
line at once instead of huggingface_hub's retries (about 30 s, then a traceback or a vague error).

- Offline mode asked for (``HF_HUB_OFFLINE``, ``HF_DATASETS_OFFLINE`` or ``TRANSFORMERS_OFFLINE`` set to
  1/true/yes/on): the Hub is not asked; the libraries read their local cache, and fail at once without it.
- Else one TCP connection to the Hub's host (``HF_ENDPOINT``, default https://huggingface.co) within
  `TIMEOUT_S`, the probe W&B's server gets (`grow.net.unreachable`; behind a proxy it says nothing).
"""

from __future__ import annotations

import os

from grow.net import unreachable as probe

OFFLINE_VARIABLES = ("HF_HUB_OFFLINE", "HF_DATASETS_OFFLINE", "TRANSFORMERS_OFFLINE")
TIMEOUT_S = 5.0
HOW_TO_USE_THE_CACHE = "HF_HUB_OFFLINE=1 reads a copy already in the local Hugging Face cache"


def offline_mode() -> str | None:
    """The variable that asks for offline mode (None when none does)."""
    return next((v for v in OFFLINE_VARIABLES if os.environ.get(v, "").strip().lower() in ("1", "true", "yes", "on")),
                None)


def endpoint() -> str:
    return os.environ.get("HF_ENDPOINT") or "https://huggingface.co"


def unreachable(timeout: float = TIMEOUT_S) -> str | None:
    """Why the Hub cannot be reached now (None when it can, or when offline mode is asked for: the
    local cache is then the libraries' business, and they fail fast)."""
    if offline_mode():
        return None
    problem = probe(endpoint(), timeout)
    return None if problem is None else f"the Hugging Face Hub ({endpoint()}) is unreachable: {problem}"
