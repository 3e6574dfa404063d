"""The console line while a corpus is tokenized: text read, MB/s, tokens, documents.

When ``log`` is a rich ``Console.print`` on a terminal (the trainer's ``grow.console``), one status
line is redrawn in place; otherwise (a log file, a test, a silent rank) a plain line goes through
``log`` every `PLAIN_EVERY` seconds. Either way `Progress.done` ends with one line of the totals.
"""

from __future__ import annotations

import time

PLAIN_EVERY = 15.0  # seconds between plain progress lines


def fmt_count(x: float) -> str:
    for div, suffix in ((1e9, "G"), (1e6, "M"), (1e3, "k")):
        if abs(x) >= div:
            return f"{x / div:.3g}{suffix}"
    return f"{x:.0f}"


def fmt_bytes(n: float) -> str:
    """``19.2 kB``, ``3.4 MB``: a size in decimal units (a 50 kB corpus is not "0.0 MB")."""
    for div, unit in ((1e9, "GB"), (1e6, "MB"), (1e3, "kB")):
        if n >= div:
            return f"{n / div:.1f} {unit}"
    return f"{n:.0f} B"


class Progress:
    """Counts what the tokenizer has done and shows it (see the module docstring)."""

    def __init__(self, log, what: str):
        self.log, self.what = log, what
        self.t0 = self.last = time.perf_counter()
        self.bytes = self.docs = self.train_tokens = self.val_tokens = 0
        console = getattr(log, "__self__", None)
        self.status = None
        if getattr(console, "is_terminal", False) and hasattr(console, "status"):
            self.status = console.status(self.line())
            self.status.start()

    @property
    def seconds(self) -> float:
        return time.perf_counter() - self.t0

    def mb_per_s(self) -> float:
        return self.bytes / 1e6 / max(self.seconds, 1e-9)

    def line(self) -> str:
        tokens = self.train_tokens + self.val_tokens
        return (f"data: tokenizing {self.what}: {fmt_bytes(self.bytes)} of text, {self.mb_per_s():.1f} MB/s, "
                f"{fmt_count(tokens)} tokens, {fmt_count(self.docs)} documents, {self.seconds:.0f}s")

    def update(self, nbytes: int, train_tokens: int, val_tokens: int, docs: int) -> None:
        self.bytes += nbytes
        self.train_tokens += train_tokens
        self.val_tokens += val_tokens
        self.docs += docs
        now = time.perf_counter()
        if self.status is not None:
            self.status.update(self.line())
        elif now - self.last >= PLAIN_EVERY:
            self.log(self.line())
            self.last = now

    def close(self) -> None:
        if self.status is not None:
            self.status.stop()
            self.status = None

    def done(self, where) -> None:
        self.close()
        self.log(f"data: tokenized {self.what}: {fmt_bytes(self.bytes)} of text, {fmt_count(self.docs)} documents "
                 f"-> {fmt_count(self.train_tokens)} train + {fmt_count(self.val_tokens)} val tokens in "
                 f"{self.seconds:.1f}s ({self.mb_per_s():.1f} MB/s) -> {where}")
