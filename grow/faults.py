"""Deterministic kill points for the crash tests: a process kills itself with SIGKILL at a named point.

``GROW_KILL_AT=<point>:<n>`` (comma-separated) sends SIGKILL the ``n``-th time `kill_point` ``<point>``
is reached; unset, `kill_point` is one dictionary lookup. The points: docs/testing.md.
"""

from __future__ import annotations

import os
import signal

ENV = "GROW_KILL_AT"
_counts: dict[str, int] = {}
_plan: dict[str, int] | None = None
_spec: str | None = None


def _parse(spec: str) -> dict[str, int]:
    plan = {}
    for part in spec.split(","):
        if part.strip():
            name, _, n = part.strip().rpartition(":")
            plan[name] = int(n)
    return plan


def kill_point(name: str) -> None:
    """SIGKILL this process if ``GROW_KILL_AT`` names ``name`` and this is its n-th call."""
    global _plan, _spec
    spec = os.environ.get(ENV)
    if not spec:
        return
    if spec != _spec:
        _spec, _plan = spec, _parse(spec)
        _counts.clear()
    if name not in _plan:
        return
    _counts[name] = _counts.get(name, 0) + 1
    if _counts[name] == _plan[name]:
        os.kill(os.getpid(), signal.SIGKILL)
