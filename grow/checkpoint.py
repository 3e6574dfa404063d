"""Checkpoints, resume, stop requests and non-finite steps (docs/design.md §11).

A checkpoint is two files in ``<run dir>/checkpoints/``:

* ``ckpt-<step>-<stage>-<n><phase>.pt``: a plain-data ``torch.save`` (dicts, lists, tensors, numbers,
  strings only; loaded with ``torch.load(weights_only=True)``, so a checkpoint can never run code):
  the current architecture (``model_config``) and the final one, the weights (with every Linear's
  ``mult``), the growth-aware optimizer state (moments, birth stage of every element, per-stage step
  counts, lr multipliers), the `RunState` (schedule position = (stage, step_in_stage), data position
  = ``samples``, tokens, FLOPs, pending recovery measurements, growth events, the strategy's state),
  the RNG states (torch, CUDA, numpy, python), the W&B run id, the length of ``metrics.jsonl`` at
  that point, the resolved config and the command line's overrides;
* ``ckpt-....json``: its manifest: size and SHA-256 of the ``.pt`` and the position and
  architectures (read without unpickling anything: `grow.config` checks a resume against it
  before any work starts).

Both are written atomically (temporary file, fsync, rename; the manifest last), so a kill at any
moment leaves the previous checkpoints intact and never a half-written one that looks complete. A
checkpoint whose file is missing, shorter or longer than its manifest says, or whose hash differs
is refused with a message, never used. The phase in the name orders the checkpoints of one step:
``0step`` (every ``trainer.ckpt_every`` steps, or on a stop request), ``1end`` (a stage trained
and evaluated, before growing), ``2grown`` (right after a growth). The last
``trainer.keep_checkpoints`` are kept.

Resume (``grow train resume=<run dir>`` or ``resume=latest``) reloads the newest checkpoint,
truncates ``metrics.jsonl`` to the checkpoint's length, and continues: the per-step losses are
the same as a run never stopped (bitwise on CPU). The command line of the run is taken from the
checkpoint; overrides given with ``resume=`` may change only `RESUME_ACCEPTS` (where and how the run
reports and saves), anything else is refused before any work (`check_resume_keeps_experiment`).
A live run holds ``<run dir>/.lock`` (`exclusive`, `run_lock`): a second writer is refused.

One run per directory (`check_run_dir`): a new run into a directory that holds another run's files
(a non-empty metrics.jsonl, summary.json, checkpoints) is refused (``hydra.run.dir=...: holds
another run's files``); the CLI checks before Hydra writes its .hydra/ there, the trainer again for
any directory. A resume of a run that finished (`finished`) changes nothing and returns its summary.
A full disk while writing a checkpoint is `grow.errors.DiskFull` (exit status 4), the earlier
checkpoints intact.
"""

from __future__ import annotations

import hashlib
import json
import os
import pickle
import random
import re
import signal
import sys
import threading
import time
import zipfile
from collections import OrderedDict
from contextlib import contextmanager
from dataclasses import asdict
from pathlib import Path

import numpy as np
import torch

from grow.data import sha256_file
from grow.errors import (  # noqa: F401 - NonFiniteLoss re-exported
    CONFIG_DIR,
    DISK_FULL_EXIT,
    ConfigError,
    DiskFull,
    NonFiniteLoss,
    disk_full,
)
from grow.faults import kill_point

FORMAT = "grow.checkpoint/1"
SUBDIR = "checkpoints"
PHASES = {"step": 0, "end": 1, "grown": 2}
EXIT_CODES = {"SIGTERM": 0, "SIGINT": 130}  # preemption is a normal end; Ctrl-C is 128 + SIGINT
NONFINITE_EXIT = 3


class CheckpointError(ConfigError):
    """A checkpoint that cannot be used (missing, truncated, corrupt, not plain data): ``resume=<path>: why``."""

    def __init__(self, path, problem: str):
        super().__init__("resume", str(path), problem)


class Interrupted(Exception):
    """A stop request (SIGTERM, SIGINT) honoured: the step finished and a checkpoint was written."""

    def __init__(self, signal_name: str, message: str):
        super().__init__(message)
        self.signal_name, self.message = signal_name, message
        self.exit_code = EXIT_CODES.get(signal_name, 1)


# ---- atomic files -------------------------------------------------------------------------------


class _HashingWriter:
    """A file object that hashes and counts what goes through it (so a checkpoint is read once, not twice)."""

    def __init__(self, f):
        self.f, self.sha, self.bytes = f, hashlib.sha256(), 0

    def write(self, b) -> int:
        self.sha.update(b)
        self.bytes += len(b)
        return self.f.write(b)

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
            write(w)
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


# ---- writing, listing, verifying, loading ----------------------------------------------------------


def checkpoint_dir(run_dir: Path) -> Path:
    return Path(run_dir) / SUBDIR


def _name(step: int, stage: int, phase: str) -> str:
    return f"ckpt-{step:09d}-{stage:03d}-{PHASES[phase]}{phase}"


def write(run_dir: Path, payload: dict, meta: dict) -> Path:
    """Write ``payload`` (plain data) and its manifest ``meta`` atomically; returns the ``.pt`` path.

    A full disk ends with `DiskFull` (nothing half-written is left; the earlier checkpoints are
    untouched)."""
    check_plain(payload)
    d = checkpoint_dir(run_dir)
    name = _name(int(meta["step"]), int(meta["stage"]), meta["phase"])
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
    if not full or _VERIFIED.get(str(pt)) == _stat_key(pt):
        return
    if sha256_file(pt) != meta["sha256"]:
        raise CheckpointError(pt, f"checkpoint is corrupt: its SHA-256 differs from its manifest's{hint}")
    _VERIFIED[str(pt)] = _stat_key(pt)


def _previous(meta: dict) -> str | None:
    found = [p for p in list_checkpoints(meta["run_dir"]) if p.name != f"{Path(meta['path']).stem}.json"]
    return str(found[-1].with_suffix(".pt")) if found else None


def load_file(path: Path, map_location=None) -> dict:
    """``torch.load(path, weights_only=True)`` of a checkpoint, any failure as a `CheckpointError`.

    Plain data only: a file whose pickle references any callable or class (arbitrary code) is
    refused by the unpickler before anything runs."""
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


def load(meta: dict, map_location=None) -> dict:
    """Verify (size and hash against the manifest) and load a checkpoint."""
    verify(meta, full=True)
    return load_file(meta["path"], map_location)


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
        p.unlink(missing_ok=True)


# ---- RNG states ---------------------------------------------------------------------------------


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


# ---- resume: which run, which command line, is it compatible -----------------------------------------


def resolve_resume(value, root: Path | str = "outputs") -> Path:
    """The run directory of ``resume=<dir>`` (or ``<dir>/checkpoints``) or ``resume=latest``: the run
    under ``outputs/`` with the newest checkpoint. `ConfigError` when there is none."""
    value = str(value)
    if value == "latest":
        root = Path(root)
        manifests = [p for p in root.glob(f"**/{SUBDIR}/ckpt-*.json")] if root.is_dir() else []
        if not manifests:
            raise ConfigError("resume", value, f"no run directory with a checkpoint under {root.resolve()}/ "
                                               "(give the run directory: resume=<run dir>)")
        newest = max(manifests, key=lambda p: p.stat().st_mtime_ns)
        return newest.parent.parent
    run = Path(os.path.expanduser(value))
    if run.name == SUBDIR and run.is_dir():
        run = run.parent
    if run.is_file() and run.parent.name == SUBDIR:
        raise ConfigError("resume", value, f"resume takes a run directory and continues from its newest "
                                           f"checkpoint: resume={run.parent.parent} (to start from this "
                                           "checkpoint, delete the newer ones)")
    if not run.is_dir():
        raise ConfigError("resume", value, "no such run directory (give a run directory, or resume=latest)")
    if not list_checkpoints(run):
        raise ConfigError("resume", value, f"no checkpoint in {checkpoint_dir(run)}/ (a run writes one at every "
                                           "growth, at its end and every trainer.ckpt_every steps)")
    return run


def _key(arg: str) -> str:
    return arg.split("=", 1)[0].lstrip("+~")


def _resume_arg(argv: list[str]) -> str | None:
    value = None
    for a in argv:
        if not a.startswith("-") and "=" in a and _key(a) == "resume":
            value = a.split("=", 1)[1].strip()
            if len(value) >= 2 and value[0] == value[-1] and value[0] in "'\"":
                value = value[1:-1]
    return None if value in (None, "", "null", "None") else value


def saved_overrides(meta: dict, argv: list[str]) -> list[str]:
    """The checkpointed run's command-line overrides, minus ``resume=`` and those ``argv`` replaces.

    A group given again (``strategy=vt``) drops the saved group choice and its keys (``strategy.*``);
    any other key given again drops the saved value of that key."""
    user = [_key(a) for a in argv if not a.startswith("-") and ("=" in a or a.startswith("~"))]
    groups = {k for k in user if "." not in k and (CONFIG_DIR / k).is_dir()}
    out = []
    for a in meta.get("overrides") or []:
        k = _key(a)
        if k == "resume" or k.startswith("hydra.") or k in user or any(k.startswith(g + ".") for g in groups):
            continue
        out.append(a)
    return out


def resume_overrides(argv: list[str]) -> list[str]:
    """For `grow.config.precheck`: the saved overrides to compose before ``argv`` ([] without ``resume=``)."""
    value = _resume_arg(argv)
    if value is None:
        return []
    meta = latest(resolve_resume(value))
    return saved_overrides(meta, argv)


# what a resume may change: where and how the run reports and saves, not what it computes
RESUME_ACCEPTS = ("resume", "device", "logger.", "trainer.progress", "trainer.log_every", "trainer.ckpt_every",
                  "trainer.keep_checkpoints", "trainer.skip_nonfinite", "trainer.device_memory_gb",
                  "trainer.micro_batch_size", "trainer.compile", "data.num_proc", "data.verify", "data.cache_dir")


def is_resume(argv: list[str]) -> bool:
    return _resume_arg(argv) is not None


def resume_base_overrides(argv: list[str]) -> list[str]:
    """The resumed run's own overrides (`saved_overrides` of an empty command line)."""
    return saved_overrides(latest(resolve_resume(_resume_arg(argv))), [])


def check_resume_keeps_experiment(run_cfg, now_cfg, argv: list[str]) -> None:
    """`ConfigError` on the first key that a resume's command line changes (``now_cfg`` against the run's
    own ``run_cfg``, both composed) beyond `RESUME_ACCEPTS`: the model, schedule, strategy, data,
    optimizer, seed, token budget... define the experiment, and a resume continues it as it was."""
    from omegaconf import OmegaConf

    before, after = (_flatten(OmegaConf.to_container(c, resolve=True)) for c in (run_cfg, now_cfg))
    changed = [k for k in set(before) | set(after)
               if before.get(k, ...) != after.get(k, ...) and not k.startswith(RESUME_ACCEPTS)]
    if not changed:
        return
    key = min(changed, key=lambda k: (not k.endswith(".name"), k))  # a group's choice (strategy=...) first
    shown = key.removesuffix(".name") if key.endswith(".name") else key
    accepted = ", ".join(k.rstrip(".") + (".*" if k.endswith(".") else "") for k in RESUME_ACCEPTS[1:])
    raise ConfigError(shown, after.get(key, "(absent)"),
                      f"a resume continues {resolve_resume(_resume_arg(argv))} as it was ({shown}="
                      f"{before.get(key, '(absent)')!r}); start a new run to change it (a resume may change only "
                      f"{accepted})")


def _quote(value: str) -> str:
    return "'" + value.replace("\\", "\\\\").replace("'", "\\'") + "'"


def resume_hydra_overrides(argv: list[str]) -> list[str]:
    """For ``grow train``'s Hydra command line: the saved overrides and ``hydra.run.dir=<the resumed run>``."""
    value = _resume_arg(argv)
    if value is None:
        return []
    run = resolve_resume(value)
    return [*saved_overrides(latest(run), argv), f"hydra.run.dir={_quote(str(run))}"]


def _first_difference(saved: dict, now: dict) -> tuple[str, object, object] | None:
    for k in now:
        if k in saved and saved[k] != now[k]:
            return k, saved[k], now[k]
    return None


def check_compatible(meta: dict, final_cfg, plan, optim_name: str | None = None) -> None:
    """Refuse to resume ``meta`` (a manifest or a payload) into a different model, schedule or optimizer."""
    where = meta.get("run_dir") or "the checkpoint"
    diff = _first_difference(meta["final_config"], final_cfg.to_dict())
    if diff:
        k, old, new = diff
        raise ConfigError(f"model.{k}", new, f"the checkpoint in {where} trains a model with {k}={old!r}; resume "
                                             "needs the same model (start a new run to change it)")
    stage = int(meta["stage"])
    if stage >= len(plan):
        raise ConfigError("schedule.stages", len(plan), f"the checkpoint in {where} is in stage {stage + 1}; "
                                                        "resume needs the same schedule")
    diff = _first_difference(meta["model_config"], plan[stage].cfg.to_dict())
    if diff:
        k, old, new = diff
        raise ConfigError("schedule", ..., f"stage {stage + 1} of this plan has {k}={new!r}, the checkpoint's model "
                                           f"in {where} {k}={old!r}; resume needs the same schedule")
    if int(meta["step_in_stage"]) > plan[stage].steps:
        raise ConfigError("trainer.max_tokens", ..., f"the checkpoint in {where} is at step {meta['step_in_stage']} "
                                                     f"of stage {stage + 1}, which has {plan[stage].steps} steps in "
                                                     "this plan; resume needs the same token budget")
    saved_opt = meta.get("optimizer_kind")
    if optim_name and saved_opt and saved_opt != optim_name:
        raise ConfigError("optim.name", optim_name, f"the checkpoint in {where} holds a {saved_opt!r} optimizer")


def _flatten(d, prefix="") -> dict:
    out = {}
    if isinstance(d, dict):
        for k, v in d.items():
            out.update(_flatten(v, f"{prefix}{k}."))
        return out
    return {prefix[:-1]: d}


IGNORED_DIFFS = ("resume", "trainer.progress", "logger.")


def config_differences(saved: dict, now: dict) -> list[str]:
    """``key: old -> new`` for every config value that differs (resume, progress and W&B keys aside)."""
    a, b = _flatten(saved), _flatten(now)
    keys = sorted(k for k in set(a) | set(b) if a.get(k, ...) != b.get(k, ...) and not k.startswith(IGNORED_DIFFS))
    return [f"{k}: {a.get(k, '(absent)')!r} -> {b.get(k, '(absent)')!r}" for k in keys]


def truncate_metrics(run_dir: Path, offset: int, source: Path | None = None) -> None:
    """Make ``run_dir/metrics.jsonl`` the first ``offset`` bytes of ``source``'s (its own by default)."""
    dst = Path(run_dir) / "metrics.jsonl"
    src = Path(source) / "metrics.jsonl" if source is not None else dst
    if not src.exists():
        if offset:
            print(f"resume: note: {src} is missing; metrics.jsonl restarts at the checkpoint", file=sys.stderr)
        return
    if src.stat().st_size < offset:
        raise CheckpointError(src, f"metrics.jsonl has {src.stat().st_size} bytes, fewer than the checkpoint's "
                                   f"{offset}: it was truncated or replaced")
    if src == dst:
        with open(dst, "r+b") as f:
            f.truncate(offset)
        return
    Path(run_dir).mkdir(parents=True, exist_ok=True)
    with open(src, "rb") as f:
        head = f.read(offset)
    atomic_write(dst, lambda f: f.write(head))


def task_overrides() -> list[str]:
    """The command line's overrides of the running Hydra job ([] outside Hydra)."""
    try:
        from hydra.core.hydra_config import HydraConfig

        return list(HydraConfig.get().overrides.task) if HydraConfig.initialized() else []
    except Exception:  # noqa: BLE001 - no Hydra, or no job config
        return []


def open_resume(cfg, run_dir: Path, final_cfg, plan, device, *, is_main: bool = True, log=print) -> dict | None:
    """The checkpoint to resume from (``cfg.resume``, ``cfg`` a `grow.config.RunConfig`), checked and
    loaded; None without ``resume``.

    On the main process, ``run_dir/metrics.jsonl`` becomes the resumed run's up to the checkpoint."""
    value = cfg.resume
    if value is None:
        return None
    run = resolve_resume(value)
    meta = latest(run)
    check_compatible(meta, final_cfg, plan, str(cfg.optim.name))
    payload = load(meta, map_location=device)
    st = payload["state"]
    check_compatible({**payload, "run_dir": str(run), "stage": st["stage"], "step_in_stage": st["step_in_stage"],
                      "optimizer_kind": payload["optimizer"].get("kind")}, final_cfg, plan, str(cfg.optim.name))
    if is_main:
        same = Path(run).resolve() == Path(run_dir).resolve()
        truncate_metrics(run_dir, int(payload["metrics_offset"]), None if same else run)
        log(f"resume: {meta['path']} (step {st['step']}, stage {st['stage'] + 1}/{len(plan)}, "
            f"step {st['step_in_stage']} of {plan[st['stage']].steps}, {payload['phase']})")
        diffs = config_differences(payload.get("config") or {}, cfg.raw)
        if diffs:
            log("resume: the config differs from the checkpoint's in " + "; ".join(diffs[:8])
                + (f" (and {len(diffs) - 8} more)" if len(diffs) > 8 else ""))
    return payload


# ---- writing checkpoints during a run -------------------------------------------------------------


class Checkpointer:
    """Writes a run's checkpoints (only where ``is_main``) and keeps the newest ``keep``."""

    def __init__(self, run_dir: Path, cfg, final_cfg, *, keep: int, is_main: bool = True):
        self.run_dir, self.keep, self.is_main = Path(run_dir), int(keep), is_main
        self.final = final_cfg.to_dict()
        self.config = cfg.raw  # the resolved config (grow.config.RunConfig.raw)
        self.overrides = task_overrides()
        self.last: Path | None = None
        self.last_meta: dict | None = None
        if is_main:
            found = latest(self.run_dir) if checkpoint_dir(self.run_dir).is_dir() else None
            self.last = Path(found["path"]) if found else None
            self.last_meta = found

    def save(self, phase: str, model, opt, state, logger) -> Path | None:
        if not self.is_main:
            return None
        payload = {
            "format": FORMAT,
            "phase": phase,
            "model_config": model.config.to_dict(),
            "final_config": self.final,
            "model": model.state_dict(),
            "optimizer": opt.state_dict(),
            "state": asdict(state),
            "rng": rng_state(),
            "wandb_id": logger.wandb_id,
            "metrics_offset": logger.offset,
            "config": self.config,
            "overrides": self.overrides,
            "torch_version": str(torch.__version__),
            "time": time.time(),
        }
        meta = {
            "phase": phase, "step": state.step, "stage": state.stage, "step_in_stage": state.step_in_stage,
            "tokens": state.tokens, "samples": state.samples, "model_config": payload["model_config"],
            "final_config": self.final, "optimizer_kind": getattr(opt, "kind", None), "overrides": self.overrides,
            "wandb_id": logger.wandb_id, "time": payload["time"],
        }
        path = write(self.run_dir, payload, meta)
        prune(self.run_dir, self.keep)
        kill_point("ckpt.prune")
        self.last, self.last_meta = path, meta
        return path


# ---- stop requests ------------------------------------------------------------------------------


class StopRequest:
    """SIGTERM and SIGINT ask the run to stop: the current step finishes, a checkpoint is written, and
    the run exits (0 for SIGTERM, a preemption; 130 for SIGINT). A second SIGINT stops at once.

    `poll` is asked at every safe point (after each step, after each growth or stage end); in a
    multi-process run every rank gets the same answer (any rank's request stops all)."""

    def __init__(self):
        self.signal: str | None = None

    def _handler(self, signum, frame) -> None:
        name = signal.Signals(signum).name
        if self.signal == "SIGINT" and name == "SIGINT":
            raise KeyboardInterrupt  # asked twice: stop now (checkpoints are atomic; the last one stays)
        self.signal = self.signal or name

    @contextmanager
    def installed(self):
        """Handle SIGTERM and SIGINT while the block runs (the previous handlers come back after)."""
        if threading.current_thread() is not threading.main_thread():
            yield self
            return
        previous = {s: signal.signal(s, self._handler) for s in (signal.SIGTERM, signal.SIGINT)}
        try:
            yield self
        finally:
            for s, h in previous.items():
                signal.signal(s, h)

    def poll(self, state, where: str) -> str | None:
        from grow import distributed

        if distributed.is_initialized():
            if distributed.sum_float(1.0 if self.signal else 0.0) > 0:
                return self.signal or "SIGTERM"
            return None
        return self.signal


class RunControl:
    """What the training loop consults at its safe points: checkpoints and stop requests."""

    def __init__(self, ckpt: Checkpointer, stop: StopRequest, plan, *, every: int, logger):
        self.ckpt, self.stop, self.plan, self.every, self.logger = ckpt, stop, plan, int(every), logger

    def save(self, phase: str, model, opt, state) -> Path | None:
        return self.ckpt.save(phase, model, opt, state, self.logger)

    def after_step(self, model, opt, state, last: bool, poll: bool = True) -> None:
        """After a step (logged, evaluated, recoveries measured): a periodic checkpoint, and a stop
        request when ``poll`` (the trainer polls at every step alone, at log points under DDP)."""
        saved = False
        if self.every and state.step % self.every == 0 and not last:
            self.save("step", model, opt, state)
            saved = True
        if poll or saved:
            self._check_stop("step", model, opt, state, saved)

    def boundary(self, phase: str, model, opt, state) -> None:
        """A stage trained and evaluated (``end``, before growing) or a growth done (``grown``)."""
        self.save(phase, model, opt, state)
        self._check_stop(phase, model, opt, state, True)

    def where(self, state) -> str:
        stage = self.plan[state.stage]
        return (f"step {state.step} (stage {state.stage + 1}/{len(self.plan)}, step {state.step_in_stage} of "
                f"{stage.steps}, {state.tokens} tokens)")

    def _check_stop(self, where: str, model, opt, state, saved: bool) -> None:
        name = self.stop.poll(state, where)
        if name is None:
            return
        if not saved:
            self.save("step", model, opt, state)
        run_dir = self.ckpt.run_dir
        msg = (f"stopped by {name} at {self.where(state)}; checkpoint {self.ckpt.last}\n"
               f"resume with: grow train resume={run_dir}")
        raise Interrupted(name, msg)

    def nonfinite(self, exc: NonFiniteLoss) -> NonFiniteLoss:
        """The error with where the last good checkpoint is and how to go on."""
        m = self.ckpt.last_meta
        if self.ckpt.last is None or m is None:
            tail = "no checkpoint was written before it"
        else:
            tail = (f"the last good checkpoint is {self.ckpt.last} (step {m['step']}), untouched: resume with "
                    f"`grow train resume={self.ckpt.run_dir}` and a lower optim.lr, or allow skipping bad steps "
                    "with trainer.skip_nonfinite=N")
        return NonFiniteLoss(f"{exc}; {tail}")


@contextmanager
def run_outcomes():
    """The command's end for a stop request (its message; exit 0 or 130), a non-finite loss (exit 3)
    or a full disk (exit 4)."""
    try:
        yield
    except Interrupted as exc:
        print(exc.message, file=sys.stderr)
        sys.exit(exc.exit_code)
    except NonFiniteLoss as exc:
        print(f"error: {exc}", file=sys.stderr)
        sys.exit(NONFINITE_EXIT)
    except DiskFull as exc:
        print(f"error: {exc}", file=sys.stderr)
        sys.exit(DISK_FULL_EXIT)


# ---- one run per directory ------------------------------------------------------------------------

LOCK = ".lock"
_HELD: dict[str, int] = {}  # the lock files this process holds -> their descriptors


@contextmanager
def exclusive(directory: Path):
    """Yields True when this process holds ``<directory>/.lock``, an exclusive ``flock`` that the kernel
    releases when the process ends (SIGKILL included), so no lock outlives its holder; False when
    another process holds it. Re-entrant within a process (a `grow compare` job holds its arm's lock,
    then trains the arm there). The file stays empty: `holder` finds the pid in ``/proc/locks``."""
    import fcntl

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
    from grow import distributed

    if not distributed.is_main():
        yield
        return
    with exclusive(run_dir) as mine:
        if not mine:
            raise ConfigError(key, str(run_dir), f"a live process ({holder(run_dir) or 'another process'}) is training in "
                                                 "this run directory; wait for it to end (or stop it) first")
        yield


def finished(run_dir: Path) -> dict | None:
    """The summary of a run that finished (``summary.json`` with ``"complete": true``), else None."""
    try:
        summary = json.loads((Path(run_dir) / "summary.json").read_text())
    except (OSError, ValueError):
        return None
    return summary if isinstance(summary, dict) and summary.get("complete") is True else None


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
    """Why ``run_dir`` cannot take this run, or None: a new run (no ``resume``, or a resume of
    another directory) never writes into a directory that holds another run's files."""
    run_dir = Path(run_dir)
    if resume is not None and Path(resolve_resume(resume)).resolve() == run_dir.resolve():
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
    from grow import distributed

    problem = run_dir_problem(run_dir, resume) if distributed.is_main() else None
    if distributed.is_initialized():
        problem = distributed.broadcast_object(problem)
    if problem:
        raise ConfigError("hydra.run.dir", str(run_dir), problem)


def finished_resume(argv: list[str]) -> tuple[Path, dict] | None:
    """(run dir, summary) when the command line's ``resume=`` names a run that finished, else None."""
    value = _resume_arg(argv)
    if value is None:
        return None
    try:
        run = resolve_resume(value)
    except ConfigError:
        return None
    summary = finished(run)
    return None if summary is None else (run, summary)


def complete_message(run: Path, summary: dict) -> str:
    loss = summary.get("final_val_loss")
    loss = f"{loss:.4f}" if isinstance(loss, (int, float)) else loss
    return (f"resume: {run} is complete (strategy {summary.get('strategy')}, {summary.get('tokens')} tokens, "
            f"final val loss {loss}); nothing to do, nothing changed (train again into another directory)")
