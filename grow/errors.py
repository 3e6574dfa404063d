"""The errors a user can cause, and where the configs live: the leaves every other module may import.

Nothing here imports another module of ``grow``, so config, data, checkpoint and distributed can
raise and catch these without importing each other. `ConfigError` (``key=value: what is allowed``)
and `DataError` end with exit status 2, `NonFiniteLoss` with 3, `DiskFull` with 4: every writer that
can fill a disk writes inside `disk_full` (docs/design.md, "Reliability and exit statuses", where every exit status is listed).
The value checks (`positive_int`, `check_number`, `check_bool`) are the one style every config key is checked in.
"""

from __future__ import annotations

import difflib
import errno
import math
from contextlib import contextmanager
from pathlib import Path

DISK_FULL_EXIT = 4


def _config_dir() -> Path:
    """The Hydra configs: ``configs/`` at the top of a source checkout (editable installs, the
    tests), else ``grow/configs/`` inside the installed package (a wheel: setup.py copies them)."""
    here = Path(__file__).resolve().parent
    checkout = here.parent / "configs"
    if (here.parent / "pyproject.toml").is_file() and (checkout / "train.yaml").is_file():
        return checkout
    return here / "configs"


CONFIG_DIR = _config_dir()
# grow compare's pseudo-strategies (arms/strategy/{baseline,equal_flops}.yaml): in the package, not in
# configs/, so that only grow compare (which adds it to Hydra's search path) sees them: `grow train
# --help` lists no internal group
ARMS_DIR = Path(__file__).resolve().parent / "arms"


class ConfigError(ValueError):
    """A bad configuration value: ``key=value: allowed``."""

    def __init__(self, key: str, value, allowed: str):
        self.key, self.value, self.allowed = key, value, allowed
        super().__init__(f"{key}={_shown(value)}: {allowed}" if value is not ... else f"{key}: {allowed}")


SHOWN_CHARS = 160  # a value longer than this (a whole config section) is cut: the line stays one readable line


def _shown(value) -> str:
    text = repr(value)
    return text if len(text) <= SHOWN_CHARS else f"{text[:SHOWN_CHARS]}... ({len(text):,} characters)"


class DataError(ValueError):
    """A data problem the user can fix (missing file, unreachable dataset, ...): one-line message."""


class NonFiniteLoss(RuntimeError):
    """The loss or the gradient became NaN or infinite (and no skips were left)."""


class DiskFull(RuntimeError):
    """No space left on the device while writing ``what`` at ``path`` (exit status 4)."""

    def __init__(self, what: str, path, *, hint: str = ""):
        self.what, self.path = what, str(path)
        super().__init__(f"no space left on the device while writing {what} ({path}): free some space"
                         f"{'; ' + hint if hint else ''}")


DISK_FULL_ERRNOS = (errno.ENOSPC, errno.EDQUOT)


@contextmanager
def disk_full(what: str, path, hint: str = ""):
    """Run a write; an ``OSError`` ENOSPC / EDQUOT becomes `DiskFull` (other errors pass unchanged).

    ``what`` names the file for the user ("a checkpoint", "metrics.jsonl", "the token cache"),
    ``hint`` what to do next ("the earlier checkpoints are intact: resume with ..."). A nested
    `DiskFull` passes through with its own message."""
    try:
        yield
    except (OSError, RuntimeError) as exc:
        if is_disk_full(exc):
            raise DiskFull(what, path, hint=hint) from None
        raise


def is_disk_full(exc: BaseException) -> bool:
    """Whether ``exc`` is, or was raised while handling, an ENOSPC / EDQUOT ``OSError``: torch's zip writer
    turns the file's ENOSPC into a RuntimeError ("unexpected pos ...") with the OSError as its context."""
    seen = set()
    while exc is not None and id(exc) not in seen:
        seen.add(id(exc))
        if isinstance(exc, DiskFull):
            return False  # a nested one passes through with its own message
        if isinstance(exc, OSError) and exc.errno in DISK_FULL_ERRNOS:
            return True
        exc = exc.__cause__ or exc.__context__
    return False


def file_in_the_way(path) -> Path | None:
    """The file standing where ``path`` or one of its parents must be a directory (None when none does):
    what makes ``mkdir(parents=True)`` fail with FileExistsError or NotADirectoryError."""
    path = Path(path).expanduser()
    for p in (path, *path.parents):
        if p.exists():
            return None if p.is_dir() else p
    return None


def options(group: str) -> list[str]:
    """The options of a config group, e.g. options('strategy') -> ['net2net', 'random', ...]: its YAML
    files and what is stored in Hydra's ConfigStore under it (a plugin's strategies, `grow.plugins`)."""
    from hydra.core.config_store import ConfigStore

    stored = ConfigStore.instance().repo.get(group, {})
    names = {p.stem for p in (CONFIG_DIR / group).glob("*.yaml")}
    names |= {k.removesuffix(".yaml") for k, v in stored.items() if not isinstance(v, dict)}
    return sorted(n for n in names if not n.startswith("_"))  # model/_base: what every model YAML starts from


def groups_help() -> str:
    """``grow <command> --help``'s config groups as Hydra lists them, from `options` (Hydra's shows model/_base)."""
    groups = {str(p.parent.relative_to(CONFIG_DIR)) for p in CONFIG_DIR.rglob("*.yaml") if p.parent != CONFIG_DIR}
    return "".join(f"{g}: {', '.join(options(g))}\n" for g in sorted(groups) if g.split("/")[0] != "hydra")


# ---- value checks: what every config section's keys are checked with (one style) ----------------


def positive_int(key: str, value) -> int:
    if isinstance(value, float) and value.is_integer():
        value = int(value)
    if not isinstance(value, int) or isinstance(value, bool) or value < 1:
        raise ConfigError(key, value, "must be a positive integer")
    return value


def check_number(key: str, value, lo: float | None = None, hi: float | None = None, *, lo_open: bool = False,
                 hi_open: bool = False) -> float:
    """A finite number in [lo, hi] (or open ends); a string, a bool, null, NaN or inf is refused."""
    ok = isinstance(value, (int, float)) and not isinstance(value, bool) and math.isfinite(value)
    if ok and lo is not None:
        ok = value > lo if lo_open else value >= lo
    if ok and hi is not None:
        ok = value < hi if hi_open else value <= hi
    if not ok:
        if lo is not None and hi is not None:
            rng = f"in {'(' if lo_open else '['}{lo:g}, {hi:g}{')' if hi_open else ']'}"
        elif lo is not None:
            rng = f"{'>' if lo_open else '>='} {lo:g}"
        elif hi is not None:
            rng = f"{'<' if hi_open else '<='} {hi:g}"
        else:
            raise ConfigError(key, value, "must be a finite number")
        raise ConfigError(key, value, f"must be a number {rng}")
    return float(value)


def check_bool(key: str, value) -> bool:
    if not isinstance(value, bool):
        raise ConfigError(key, value, "must be true or false")
    return value


def nearest(key: str, known) -> str:
    """The closest of ``known`` to ``key`` ('' when none is close)."""
    match = difflib.get_close_matches(key, list(known), n=1, cutoff=0.6)
    return match[0] if match else ""


def nearest_key(key: str, known) -> str:
    """`` (did you mean <k>?)`` naming the closest of ``known`` to ``key``, or ''."""
    match = nearest(key, known)
    return f" (did you mean {match}?)" if match else ""
