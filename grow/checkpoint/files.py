"""The checkpoint files (docs/distributed.md).

A checkpoint is a plain-data ``.pt`` (``torch.load(weights_only=True)``) and its ``.json`` manifest
(size, SHA-256, position, architectures), both written atomically, the manifest last; a file that
does not match its manifest is refused. What a checkpoint holds and how its names order: docs/distributed.md.
"""

from __future__ import annotations

import hashlib
import json
import os
import pickle
import random
import re
import sys
import zipfile
from collections import OrderedDict
from pathlib import Path

import numpy as np
import torch

from grow.checkpoint import shards
from grow.data import sha256_file
from grow.errors import ConfigError, disk_full
from grow.faults import kill_point

FORMAT = "grow.checkpoint/1"


SUBDIR = "checkpoints"


PHASES = {"step": 0, "end": 1, "grown": 2}


class CheckpointError(ConfigError):
    """A checkpoint that cannot be used (missing, truncated, corrupt, not plain data): ``resume=<path>: why``."""

    def __init__(self, path, problem: str):
        super().__init__("resume", str(path), problem)


class _HashingWriter:
    """A file object that hashes and counts what goes through it (so a checkpoint is read once, not twice)."""

    def __init__(self, f):
        self.f, self.sha, self.bytes = f, hashlib.sha256(), 0
        self.error: OSError | None = None  # what the file raised: torch's zip writer hides it in a RuntimeError

    def write(self, b) -> int:
        self.sha.update(b)
        self.bytes += len(b)
        try:
            return self.f.write(b)
        except OSError as exc:
            self.error = exc
            raise

    def flush(self) -> None:
        self.f.flush()


def _fsync_dir(d: Path) -> None:
    try:
        fd = os.open(d, os.O_RDONLY)
    except OSError:
        return
    try:
        os.fsync(fd)
    except OSError:
        pass
    finally:
        os.close(fd)


def atomic_write(path: Path, write, *, kill: str | None = None) -> tuple[int, str]:
    """``write(file)`` into a temporary file beside ``path``, fsync, rename; returns (bytes, sha256).

    ``kill``: the name of the `grow.faults.kill_point` between the fsync and the rename (tests)."""
    path = Path(path)
    tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
    try:
        with open(tmp, "wb") as f:
            w = _HashingWriter(f)
            try:
                write(w)
            except RuntimeError:
                if w.error is not None:  # the file's own error (ENOSPC: `grow.errors.disk_full`), not torch's wrapper
                    raise w.error from None
                raise
            f.flush()
            os.fsync(f.fileno())
        if kill:
            kill_point(kill)
        os.replace(tmp, path)
    finally:
        if tmp.exists():
            tmp.unlink()
    _fsync_dir(path.parent)
    return w.bytes, w.sha.hexdigest()


def checkpoint_dir(run_dir: Path) -> Path:
    return Path(run_dir) / SUBDIR


def _name(step: int, stage: int, phase: str) -> str:
    return f"ckpt-{step:09d}-{stage:03d}-{PHASES[phase]}{phase}"


def stem(meta: dict) -> str:
    """The name of the checkpoint at ``meta``'s position (step, stage, phase), without suffix."""
    return _name(int(meta["step"]), int(meta["stage"]), meta["phase"])


def write(run_dir: Path, payload: dict, meta: dict) -> Path:
    """Write ``payload`` (plain data) and its manifest ``meta`` atomically; returns the ``.pt`` path.
    A sharded checkpoint's directory (`grow.checkpoint.shards`) is in place already: ``payload`` names it
    (``shards``) and ``meta`` lists its files (``shard_files``).

    A full disk ends with `DiskFull` (nothing half-written is left; the earlier checkpoints are
    untouched)."""
    check_plain(payload)
    d = checkpoint_dir(run_dir)
    name = stem(meta)
    pt = d / f"{name}.pt"
    with disk_full("a checkpoint", pt, f"the earlier checkpoints are intact: resume with `grow train "
                                       f"resume={Path(run_dir)}` once there is space"):
        d.mkdir(parents=True, exist_ok=True)
        (d / f"{name}.json").unlink(missing_ok=True)  # rewriting a position: never an old manifest over a new file
        size, sha = atomic_write(pt, lambda f: torch.save(payload, f), kill="ckpt.tmp")
        kill_point("ckpt.pt")
        manifest = {**meta, "format": FORMAT, "file": pt.name, "bytes": size, "sha256": sha}
        text = json.dumps(manifest, indent=1).encode()
        atomic_write(d / f"{name}.json", lambda f: f.write(text))
    kill_point("ckpt.manifest")
    _VERIFIED[str(pt)] = _stat_key(pt)
    return pt


def list_checkpoints(run_dir: Path) -> list[Path]:
    """The manifests (``.json``) of a run, oldest first."""
    d = checkpoint_dir(run_dir)
    if not d.is_dir():
        return []
    return sorted(p for p in d.glob("ckpt-*.json") if not p.name.startswith("."))


def read_manifest(path: Path) -> dict:
    try:
        meta = json.loads(Path(path).read_text())
        if meta.get("format") != FORMAT:
            raise ValueError(f"format {meta.get('format')!r}")
        for key in ("file", "bytes", "sha256", "step", "stage", "step_in_stage", "phase", "model_config",
                    "final_config"):
            meta[key]  # noqa: B018 - presence check
    except (OSError, ValueError, KeyError, TypeError, AttributeError) as exc:
        raise CheckpointError(path, f"unreadable checkpoint manifest ({exc}); delete it and its .pt to use "
                                    "the previous checkpoint") from None
    meta["path"] = str(Path(path).with_name(meta["file"]))
    meta["run_dir"] = str(Path(path).parent.parent)
    return meta


def latest(run_dir: Path) -> dict | None:
    """The manifest of the newest checkpoint of ``run_dir`` (None if it has none)."""
    found = list_checkpoints(run_dir)
    return read_manifest(found[-1]) if found else None


def without_manifest(run_dir: Path, after: dict | None = None) -> list[Path]:
    """The checkpoint files of ``run_dir`` that have no manifest (a write cut short between the ``.pt`` and
    its manifest, or a manifest deleted), newer than the checkpoint ``after`` when given; oldest first."""
    d = checkpoint_dir(run_dir)
    last = Path(after["path"]).name if after else ""
    return sorted(p for p in d.glob("ckpt-*.pt") if not p.name.startswith(".") and p.name > last
                  and not p.with_suffix(".json").exists()) if d.is_dir() else []


_SKIPPED_SAID: set[str] = set()  # the files `latest_complete` has warned about (the precheck and the command both ask)


def latest_complete(run_dir: Path) -> dict | None:
    """`latest`, for a command that continues from it or loads it (resume, sample, eval, export): a newer
    checkpoint file without a manifest is skipped, and one warning line says so (once per process)."""
    meta = latest(run_dir)
    skipped = without_manifest(run_dir, meta) if meta is not None else []
    if skipped and str(skipped[-1]) not in _SKIPPED_SAID:
        _SKIPPED_SAID.add(str(skipped[-1]))
        print(f"warning: {skipped[-1]} has no manifest (its write was cut short, or the manifest was deleted): using "
              f"the newest checkpoint that has one, {meta['path']} (step {meta['step']})", file=sys.stderr, flush=True)
    return meta


def _stat_key(path: Path) -> tuple:
    st = Path(path).stat()
    return (st.st_size, st.st_mtime_ns, st.st_ino)


_VERIFIED: dict[str, tuple] = {}  # .pt path -> stat key of a file this process has hashed (or written)


def verify(meta: dict, *, full: bool = True) -> None:
    """Refuse a checkpoint whose file is missing, of the wrong size or (``full``) of the wrong SHA-256."""
    pt = Path(meta["path"])
    previous = _previous(meta)
    hint = (f"; delete it and its .json to resume from the previous checkpoint ({previous})" if previous
            else "; it is the run's only checkpoint")
    if not pt.is_file():
        raise CheckpointError(pt, f"checkpoint file missing (its manifest is {Path(meta['path']).stem}.json){hint}")
    size = pt.stat().st_size
    if size != int(meta["bytes"]):
        what = "truncated" if size < int(meta["bytes"]) else "damaged"
        raise CheckpointError(pt, f"checkpoint is {what}: {size} bytes, its manifest says {meta['bytes']}{hint}")
    if meta.get("shards"):
        problem = shards.check(pt.with_name(meta["shards"]), meta.get("shard_files") or {})
        if problem:
            raise CheckpointError(pt, f"sharded checkpoint is incomplete: {problem}{hint}")
    if not full or _VERIFIED.get(str(pt)) == _stat_key(pt):
        return
    if sha256_file(pt) != meta["sha256"]:
        raise CheckpointError(pt, f"checkpoint is corrupt: its SHA-256 differs from its manifest's{hint}")
    _VERIFIED[str(pt)] = _stat_key(pt)


def _previous(meta: dict) -> str | None:
    found = [p for p in list_checkpoints(meta["run_dir"]) if p.name != f"{Path(meta['path']).stem}.json"]
    return str(found[-1].with_suffix(".pt")) if found else None


def load_file(path: Path, map_location=None, *, whole: bool = True) -> dict:
    """``torch.load(path, weights_only=True)`` of a checkpoint, any failure as a `CheckpointError`.

    Plain data only: a file whose pickle references any callable or class (arbitrary code) is
    refused by the unpickler before anything runs. A sharded checkpoint's tensors are read from its
    shard directory and put in their places (``whole=False``: left out, for the ranks of an FSDP
    run other than 0, which get their shards from rank 0)."""
    path = Path(path)
    try:
        payload = torch.load(path, map_location=map_location, weights_only=True)
    except pickle.UnpicklingError as exc:
        raise CheckpointError(path, "refused: not a plain-data checkpoint (weights_only loading rejected it: "
                                    f"{_unpickler_reason(exc)})") from None
    except (RuntimeError, EOFError, OSError, ValueError, zipfile.BadZipFile) as exc:
        first = str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__
        raise CheckpointError(path, f"cannot read the checkpoint (truncated or not a checkpoint: {first[:200]})") from None
    if not isinstance(payload, dict) or payload.get("format") != FORMAT:
        got = payload.get("format") if isinstance(payload, dict) else type(payload).__name__
        raise CheckpointError(path, f"not a grow checkpoint (format {got!r}, expected {FORMAT!r})")
    if payload.get("shards") and whole:
        try:
            payload = shards.merge(payload, shards.read(path.with_name(payload["shards"])))
        except (RuntimeError, OSError, ValueError, KeyError) as exc:
            first = (str(exc).strip().splitlines() or [type(exc).__name__])[0][:200]
            raise CheckpointError(path, f"cannot read its shard directory {payload['shards']} ({first})") from None
        if map_location is not None:
            payload["model"] = {k: v.to(map_location) if isinstance(v, torch.Tensor) else v
                                for k, v in payload["model"].items()}
    return payload


def _unpickler_reason(exc: Exception) -> str:
    """The informative line of torch's long weights_only error (e.g. ``Unsupported global: GLOBAL builtins.exec``)."""
    text = re.sub(r"\x1b\[[0-9;]*m", "", str(exc))
    for line in text.splitlines():
        if "WeightsUnpickler error:" in line:
            return line.split("WeightsUnpickler error:", 1)[1].strip().split(" was not an allowed")[0][:200]
    lines = [ln.strip() for ln in text.splitlines() if ln.strip()]
    return lines[0][:200] if lines else type(exc).__name__


PLAIN = (str, int, float, bool, type(None))


def check_plain(obj, where: str = "checkpoint") -> None:
    """Refuse (TypeError) anything ``torch.load(weights_only=True)`` would not load back: only dicts,
    lists, tuples, tensors, strings, numbers, booleans and None."""
    if type(obj) in PLAIN or type(obj) is torch.Tensor or type(obj) is torch.nn.Parameter:
        return
    if isinstance(obj, dict) and type(obj) in (dict, OrderedDict):
        for k, v in obj.items():
            if type(k) not in PLAIN:
                raise TypeError(f"{where}: key {k!r} of type {type(k).__name__} is not plain data")
            check_plain(v, f"{where}[{k!r}]")
        return
    if type(obj) in (list, tuple):
        for i, v in enumerate(obj):
            check_plain(v, f"{where}[{i}]")
        return
    raise TypeError(f"{where}: {type(obj).__module__}.{type(obj).__qualname__} is not plain data "
                    "(weights_only checkpoints hold dicts, lists, tensors, strings and numbers)")


def load(meta: dict, map_location=None, *, whole: bool = True) -> dict:
    """Verify (size and hash against the manifest) and load a checkpoint (``whole``: `load_file`)."""
    verify(meta, full=True)
    return load_file(meta["path"], map_location, whole=whole)


def prune(run_dir: Path, keep: int) -> None:
    """Keep the newest ``keep`` checkpoints; remove older ones, orphaned files and stale temporaries."""
    d = checkpoint_dir(run_dir)
    manifests = list_checkpoints(run_dir)
    for m in manifests[: max(len(manifests) - keep, 0)]:
        m.unlink(missing_ok=True)  # the manifest first: a half-pruned checkpoint is never taken as complete
        m.with_suffix(".pt").unlink(missing_ok=True)
    kept = {m.stem for m in manifests[-keep:]} if keep > 0 else set()
    for p in d.glob("ckpt-*.pt"):
        if p.stem not in kept:
            p.unlink(missing_ok=True)
    for p in d.glob(".ckpt-*.tmp"):
        if p.is_file():
            p.unlink(missing_ok=True)
    shards.prune(d, kept)


def rng_state() -> dict:
    """torch (CPU and, if initialized, every CUDA device), numpy's and python's global generators, as plain data."""
    name, key, pos, has_gauss, gauss = np.random.get_state()
    version, internal, py_gauss = random.getstate()
    cuda = torch.cuda.get_rng_state_all() if torch.cuda.is_available() and torch.cuda.is_initialized() else []
    return {
        "torch": torch.get_rng_state(),
        "cuda": list(cuda),
        "numpy": {"name": name, "key": torch.from_numpy(key.astype(np.int64)), "pos": int(pos),
                  "has_gauss": int(has_gauss), "gauss": float(gauss)},
        "python": [int(version), list(internal), py_gauss],
    }


def set_rng_state(st: dict) -> None:
    torch.set_rng_state(st["torch"].cpu())
    if st.get("cuda") and torch.cuda.is_available():
        states = st["cuda"][: torch.cuda.device_count()]
        for i, s in enumerate(states):
            torch.cuda.set_rng_state(s.cpu(), i)
    n = st["numpy"]
    np.random.set_state((n["name"], n["key"].numpy().astype(np.uint32), n["pos"], n["has_gauss"], n["gauss"]))
    v, internal, gauss = st["python"]
    random.setstate((v, tuple(internal), gauss))
