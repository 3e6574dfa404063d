"""A process's peak resident memory over a stretch of code (Linux's ``VmHWM``), per rank: what a growth
under FSDP holds on each host (docs/distributed.md, "FSDP2"). Elsewhere (no ``/proc``) nothing is measured."""

from __future__ import annotations

import re
from pathlib import Path

from grow.parallel import distributed

PROC = Path("/proc/self")


def reset_peak() -> bool:
    """Reset this process's peak resident memory to its current one (``clear_refs`` "5"); False where
    that is not possible (not Linux, or a kernel that refuses)."""
    try:
        (PROC / "clear_refs").write_text("5")
        return True
    except OSError:
        return False


def peak_mb() -> float | None:
    """This process's peak resident memory since start or `reset_peak`, in MB (2^20 bytes); None where
    ``/proc/self/status`` has no ``VmHWM``."""
    try:
        m = re.search(r"^VmHWM:\s+(\d+)\s+kB", (PROC / "status").read_text(), re.MULTILINE)
    except OSError:
        return None
    return int(m.group(1)) / 1024 if m else None


def peaks_by_rank(peak: float | None) -> dict[str, float]:
    """``{"growth/peak_rss_mb/rank<r>": MB}`` of every rank's ``peak`` (one all-gather; every rank takes
    part), or {} when any rank could not measure."""
    peaks = distributed.all_gather_object(peak)
    if any(p is None for p in peaks):
        return {}
    return {f"growth/peak_rss_mb/rank{r}": float(p) for r, p in enumerate(peaks)}
