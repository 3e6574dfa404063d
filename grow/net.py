"""Whether a server answers a TCP connection in time: asked before W&B (`grow.metrics`) or the Hugging Face
Hub (`grow.hub`) is asked anything, so that an unreachable one costs one line, not a library's retries."""

from __future__ import annotations

import os
import socket
import threading
from urllib.parse import urlparse

PROXY_VARIABLES = ("HTTPS_PROXY", "https_proxy", "HTTP_PROXY", "http_proxy", "ALL_PROXY", "all_proxy")


def unreachable(url: str, timeout: float) -> str | None:
    """Why the server of ``url`` cannot be reached by TCP within ``timeout`` seconds (name lookup
    included: it runs in a thread that is waited for at most that long), or None when it can. Behind
    a proxy (an ``*_PROXY`` variable set) a direct connection says nothing: None, and W&B's own
    ``init_timeout`` bounds the wait."""
    if any(os.environ.get(v) for v in PROXY_VARIABLES):
        return None
    parsed = urlparse(url)
    host, port = parsed.hostname or "", parsed.port or (443 if parsed.scheme == "https" else 80)
    outcome: list[str | None] = []

    def connect() -> None:
        try:
            socket.create_connection((host, port), timeout=timeout).close()
            outcome.append(None)
        except OSError as exc:
            outcome.append(str(exc) or type(exc).__name__)

    worker = threading.Thread(target=connect, daemon=True)
    worker.start()
    worker.join(timeout)
    return outcome[0] if outcome else f"no answer within {timeout:g} s"
