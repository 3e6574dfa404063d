"""Run directories: one run per directory, and the lock a live run holds.

A live run holds ``<run dir>/.lock`` (`exclusive`, `run_lock`): a second writer is refused.

One run per directory (`check_run_dir`): a new run into a directory that holds another run's files
(a non-empty metrics.jsonl, summary.json, checkpoints) is refused (``hydra.run.dir=...: holds
another run's files``); the CLI checks before Hydra writes its .hydra/ there, the trainer again for
any directory. A resume of a run that finished (`finished`) changes nothing and returns its summary.
"""

from __future__ import annotations

import fcntl
import os
from contextlib import contextmanager
from pathlib import Path

from grow.checkpoint.files import SUBDIR, list_checkpoints
from grow.checkpoint.resume import finished
from grow.errors import ConfigError
from grow.parallel import distributed

LOCK = ".lock"


_HELD: dict[str, int] = {}  # the lock files this process holds -> their descriptors


@contextmanager
def exclusive(directory: Path):
    """Yields True when this process holds ``<directory>/.lock``, an exclusive ``flock`` that the kernel
    releases when the process ends (SIGKILL included), so no lock outlives its holder; False when
    another process holds it. Re-entrant within a process (a `grow compare` job holds its arm's lock,
    then trains the arm there). The file stays empty: `holder` finds the pid in ``/proc/locks``."""
    Path(directory).mkdir(parents=True, exist_ok=True)
    path = str((Path(directory) / LOCK).resolve())
    if path in _HELD:
        yield True
        return
    fd = os.open(path, os.O_CREAT | os.O_RDWR)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        os.close(fd)
        yield False
        return
    _HELD[path] = fd
    try:
        yield True
    finally:
        del _HELD[path]
        fcntl.flock(fd, fcntl.LOCK_UN)
        os.close(fd)


def holder(directory: Path) -> str | None:
    """``pid N`` of the live process that holds ``<directory>/.lock`` (``another process`` where
    ``/proc/locks`` does not say), else None. Reads the directory only."""
    lock = Path(directory) / LOCK
    if not lock.is_file():
        return None
    with exclusive(Path(directory)) as mine:
        if mine:
            return None
    try:
        inode = os.stat(lock).st_ino
        for line in Path("/proc/locks").read_text().splitlines():
            fields = line.split()
            if len(fields) > 5 and fields[1] == "FLOCK" and fields[5].rsplit(":", 1)[-1] == str(inode):
                return f"pid {fields[4]}"
    except OSError:
        pass
    return "another process"


@contextmanager
def run_lock(run_dir: Path, key: str = "hydra.run.dir"):
    """Hold ``run_dir``'s lock while a run trains there (rank 0): a second process that would write
    into a live run (a resume of it, a new run into it) gets `ConfigError` (one line, exit 2)."""
    if not distributed.is_main():
        yield
        return
    with exclusive(run_dir) as mine:
        if not mine:
            raise ConfigError(key, str(run_dir), f"a live process ({holder(run_dir) or 'another process'}) is training in "
                                                 "this run directory; wait for it to end (or stop it) first")
        yield


def run_files(run_dir: Path) -> list[str]:
    """The files of a run in ``run_dir``: a non-empty metrics.jsonl, summary.json, checkpoints."""
    d = Path(run_dir)
    found = []
    metrics = d / "metrics.jsonl"
    if metrics.is_file() and metrics.stat().st_size > 0:
        found.append("metrics.jsonl")
    if (d / "summary.json").is_file():
        found.append("summary.json")
    if (d / SUBDIR).is_dir() and any((d / SUBDIR).glob("ckpt-*")):
        found.append(f"{SUBDIR}/")
    return found


def run_dir_problem(run_dir: Path, resume) -> str | None:
    """Why ``run_dir`` cannot take this run, or None: a new run (no ``resume``, a `Resume`, or a resume of
    another directory) never writes into a directory that holds another run's files."""
    run_dir = Path(run_dir)
    if resume is not None and resume.run.resolve() == run_dir.resolve():
        return None
    found = run_files(run_dir)
    if not found:
        return None
    if finished(run_dir) is not None:
        how = "that run finished; train into another directory"
    elif list_checkpoints(run_dir):
        how = f"continue that run with `grow train resume={run_dir}`, or train into another directory"
    else:
        how = "that run left no checkpoint to resume: delete the directory or train into another one"
    return f"holds another run's files ({', '.join(found)}); {how}"


def check_run_dir(run_dir: Path, resume) -> None:
    """`run_dir_problem` as a `ConfigError` on ``hydra.run.dir`` (decided by rank 0 in a multi-process run)."""
    problem = run_dir_problem(run_dir, resume) if distributed.is_main() else None
    if distributed.is_initialized():
        problem = distributed.broadcast_object(problem)
    if problem:
        raise ConfigError("hydra.run.dir", str(run_dir), problem)
