"""Deterministic kill points for the crash tests: a process kills itself with SIGKILL at a named point.

``GROW_KILL_AT=<point>:<n>`` (several separated by commas) makes the process send itself SIGKILL
the ``n``-th time it reaches `kill_point` ``<point>`` (counted from the process's start). Unset (every
normal run), `kill_point` is one dictionary lookup. The tests use it to stop a run at exact places
(inside a growth, between the two files of a checkpoint, while the token cache is being built, ...)
instead of at a moment chosen by a timer, then check that a rerun gives the same losses as a run
never stopped.

The points (grep ``kill_point(`` for where they are):

=================== ====================================================================
``cache``           each file of the token cache written (tokenizer, train, val), before
                    the cache is complete
``step``            after the optimizer step, before the run's counters move on
``metrics``         after a record is written to metrics.jsonl
``eval``            inside an evaluation
``growth``          inside a growth: the grown model made, the optimizer not yet moved
``expand``          inside a growth, after each dimension's expansion
``ckpt.shards``     (FSDP, rank 0) every rank's shards written to the temporary directory,
                    not renamed
``ckpt.tmp``        a checkpoint's .pt written to its temporary file, not renamed
``ckpt.pt``         the .pt renamed into place, its manifest not written
``ckpt.manifest``   the manifest written, older checkpoints not yet pruned
``ckpt.prune``      after the older checkpoints were pruned
``summary``         after summary.json was written
=================== ====================================================================
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
