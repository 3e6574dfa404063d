"""What a run tells its observers: a plugin or a test watches the trainer without patching it (docs/extending.md,
"An observer"), in the process that trains (every rank under DDP and FSDP); a decay branch's copy emits none:

- ``backward``: ``fn(trainer, loss, gnorm)`` in each step after its backward, before its finite check and update
  (clipped gradients in ``p.grad``; the tensors, changed in place, are what the check reads);
- ``stepped``: ``fn(trainer)`` after each optimizer step, inside its timed span (what it costs is step time);
- ``evaluated``: ``fn(trainer, loss)`` after each validation pass, inside its span (out of the throughput window);
- ``grown``: ``fn(trainer, stage)`` after each growth, the grown model and moved optimizer in place, its checkpoint
  written;
- ``end``: ``fn(trainer)`` once the last stage is trained, before the summary is made.
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable, Iterator

EVENTS = ("backward", "stepped", "evaluated", "grown", "end")
_OBSERVERS: dict[str, list[Callable]] = {name: [] for name in EVENTS}


def subscribe(event: str, fn: Callable) -> None:
    """Call ``fn`` at every ``event`` of every run in this process, in the order subscribed."""
    if event not in _OBSERVERS:
        raise ValueError(f"event {event!r}: allowed {', '.join(EVENTS)}")
    _OBSERVERS[event].append(fn)


def unsubscribe(event: str, fn: Callable) -> None:
    _OBSERVERS[event].remove(fn)


@contextlib.contextmanager
def observing(event: str, fn: Callable) -> Iterator[None]:
    """``fn`` subscribed to ``event`` for the duration of the block."""
    subscribe(event, fn)
    try:
        yield
    finally:
        unsubscribe(event, fn)


def emit(event: str, *args) -> None:
    for fn in list(_OBSERVERS[event]):
        fn(*args)
