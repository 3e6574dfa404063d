"""What code made a run: the package version, the git commit of a checkout, and torch's version.

``summary.json`` keeps it under ``code`` and a report names every version its runs came from, so a
sweep whose arms were trained by two versions of the code says so (a change that only reorders float32
sums, such as the loss path's chunking, already makes two runs of one seed differ in their last bits).
A wheel installed from PyPI or a copy without ``.git`` has no commit: ``commit`` is then null."""

from __future__ import annotations

import functools
import subprocess
from pathlib import Path

import torch

import grow

CHECKOUT = Path(grow.__file__).resolve().parent.parent


def _git(*args: str) -> str | None:
    try:
        out = subprocess.run(["git", "-C", str(CHECKOUT), *args], capture_output=True, text=True, timeout=10)
    except (OSError, subprocess.TimeoutExpired):
        return None
    return out.stdout.strip() if out.returncode == 0 else None


@functools.lru_cache(maxsize=1)
def code_version() -> dict:
    """``{"version", "commit", "dirty", "torch"}``: ``commit`` the HEAD of the checkout ``grow`` is
    imported from (null outside one), ``dirty`` whether tracked files differ from it (null likewise)."""
    inside = _git("rev-parse", "--show-toplevel")
    commit = _git("rev-parse", "HEAD") if inside and Path(inside).resolve() == CHECKOUT else None
    status = _git("status", "--porcelain", "--untracked-files=no") if commit else None
    return {"version": grow.__version__, "commit": commit, "dirty": None if status is None else bool(status),
            "torch": torch.__version__}


def describe(code: dict | None) -> str:
    """One line: ``grow 0.1.0 at 2dd7727 (torch 2.13.0)``, ``+ uncommitted changes`` where dirty;
    ``not recorded`` for a run from before the ``code`` entry."""
    if not code:
        return "not recorded"
    at = f" at {code['commit'][:7]}" + (" + uncommitted changes" if code.get("dirty") else "") if code.get("commit") else ""
    return f"grow {code.get('version')}{at} (torch {code.get('torch')})"
