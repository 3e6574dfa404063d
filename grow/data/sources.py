"""Corpora as streams of documents, and their identity, which the token cache is keyed by (docs/design.md, "Data").

`documents` yields the texts of ``stdlib``, ``text`` or ``hf`` one at a time, up to ``data.max_bytes``
characters, so the corpus is never held in memory. `identity` describes the source without reading
it (file paths, sizes and modification times; a hub dataset's name, configuration, split, revision
and mode), so a second start costs a few ``stat`` calls whatever the corpus size.
"""

from __future__ import annotations

import codecs
import functools
import glob
import os
import sys
import sysconfig
from collections.abc import Iterator
from pathlib import Path

from grow import hub
from grow.data import pysrc
from grow.data.config import LOCAL_BUILDERS, DataConfig
from grow.errors import DataError

HF_BATCH = 1000  # rows per read from a datasets table


# ---- which files -------------------------------------------------------------------------------------


@functools.lru_cache(maxsize=1)
def _stdlib_files(root: str) -> tuple[Path, ...]:
    found = []
    for dirpath, dirnames, filenames in os.walk(root):
        dirnames[:] = [d for d in dirnames if d != "site-packages"]  # not the standard library
        found.extend(Path(dirpath, f) for f in filenames if f.endswith(".py"))
    return tuple(sorted(f for f in found if f.is_file()))


def stdlib_files() -> list[Path]:
    """The standard library's ``.py`` files (site-packages left out), sorted by path."""
    return list(_stdlib_files(sysconfig.get_paths()["stdlib"]))


def text_files(patterns) -> list[Path]:
    """Every pattern's matching files (directories left out), sorted, in the order of the patterns."""
    paths: list[Path] = []
    for pattern in patterns:
        matches = sorted(m for m in glob.glob(os.path.expanduser(str(pattern))) if os.path.isfile(m))
        if not matches:
            raise DataError(f"data.files: {pattern!r} matches no file")
        paths.extend(Path(m) for m in matches)
    return paths


def _stat(path: Path, root: Path | None = None) -> list:
    """[path relative to ``root`` (else resolved), size, mtime]: on strings, as a corpus of ~1,800 files (the
    standard library's) is stat'ed every run, where pathlib's relative_to cost 5x the stat."""
    s = str(path)
    st = os.stat(s)
    return [s[len(str(root).rstrip(os.sep)) + 1:] if root else str(path.resolve()), st.st_size, st.st_mtime_ns]


def _local(cfg: DataConfig) -> Path | None:
    """The local file or save_to_disk directory ``data.path`` names (None: a hub dataset)."""
    p = Path(os.path.expanduser(str(cfg.path)))
    return p if p.is_file() or (p.is_dir() and (p / "dataset_info.json").exists()) else None


# ---- identity -------------------------------------------------------------------------------------------


def identity(cfg: DataConfig) -> dict:
    """What the corpus is, from metadata only (no document is read)."""
    if cfg.name == "stdlib":
        root = Path(sysconfig.get_paths()["stdlib"])
        return {"stdlib": str(root), "files": [_stat(p, root) for p in stdlib_files()]}
    if cfg.name == "text":
        return {"files": [_stat(p) for p in text_files(cfg.files)], "encoding": cfg.encoding}
    if cfg.name == "pysrc":
        return pysrc.identity(cfg)
    local = _local(cfg)
    if local is not None and local.is_file():
        return {"file": _stat(local), "text_field": cfg.text_field}
    if local is not None:
        return {"dir": str(local.resolve()), "files": [_stat(p, local) for p in sorted(local.rglob("*")) if p.is_file()],
                "text_field": cfg.text_field}
    return {"hub": cfg.path, "config": cfg.config, "split": cfg.split, "revision": cfg.revision,
            "streaming": cfg.streaming, "text_field": cfg.text_field}


# ---- documents ------------------------------------------------------------------------------------------


def documents(cfg: DataConfig) -> Iterator[str]:
    """The corpus's documents in order, up to ``data.max_bytes`` characters in all."""
    if cfg.name == "stdlib":
        return _read_files(stdlib_files(), cfg.max_bytes)
    if cfg.name == "text":
        return _read_files(text_files(cfg.files), cfg.max_bytes, cfg.encoding)
    if cfg.name == "hf":
        return _hf_documents(cfg)
    raise DataError(f"data.name={cfg.name!r}: not a text source (documents are read from stdlib, text and hf; "
                    "pysrc through grow.data.pysrc, bin holds token ids)")


def _read_files(paths, max_bytes: int | None, encoding: str = "utf-8") -> Iterator[str]:
    """Each file one document in ``encoding``, the last one cut at ``max_bytes``. Bytes that do not
    decode become U+FFFD and are counted: one warning line at the end names how many, in which files
    (a Latin-1 file read as UTF-8, a binary file), and the ``data.encoding`` option."""
    total, bad = 0, {}
    for path in paths:
        if max_bytes is not None and total >= max_bytes:
            break
        _UNDECODABLE[0] = 0
        text = Path(path).read_bytes().decode(encoding, errors=_COUNT_AND_REPLACE)
        if _UNDECODABLE[0]:
            bad[Path(path).name] = _UNDECODABLE[0]
        if max_bytes is not None:
            text = text[: max_bytes - total]
        total += len(text)
        yield text
    if bad:
        names = ", ".join(list(bad)[:3]) + (f" and {len(bad) - 3} more" if len(bad) > 3 else "")
        print(f"warning: data: {sum(bad.values())} bytes of {len(bad)} file(s) ({names}) are not valid {encoding} "
              "and were read as U+FFFD; if they are text in another encoding, set data.encoding (e.g. latin-1)",
              file=sys.stderr, flush=True)


_UNDECODABLE = [0]  # bytes the current file's decoding replaced
_COUNT_AND_REPLACE = "grow-count-and-replace"


def _count_and_replace(exc: UnicodeDecodeError) -> tuple[str, int]:
    """codecs error handler: what ``errors="replace"`` does, counting the bytes replaced."""
    _UNDECODABLE[0] += exc.end - exc.start
    return "\ufffd", exc.end


codecs.register_error(_COUNT_AND_REPLACE, _count_and_replace)


def _hf_documents(cfg: DataConfig) -> Iterator[str]:
    """The ``text_field`` column of the dataset, read in batches of `HF_BATCH` rows."""
    ds = _open_dataset(cfg)
    total = 0
    try:
        for batch in ds.iter(batch_size=HF_BATCH):
            if cfg.text_field not in batch:
                raise DataError(f"data.text_field={cfg.text_field!r}: not a column of {cfg.path!r} "
                                f"(columns: {sorted(batch)})")
            for text in batch[cfg.text_field]:
                if cfg.max_bytes is not None and total >= cfg.max_bytes:
                    return
                text = text or ""
                total += len(text)
                yield text
    except DataError:
        raise
    except Exception as exc:  # noqa: BLE001 - a reader failing mid-way (network, a bad row) is one line
        raise DataError(f"data.path={cfg.path!r}: reading the dataset failed ({_first_line(exc)})") from None


def _open_dataset(cfg: DataConfig):
    """A Dataset or IterableDataset with ``.iter(batch_size)``; a clear one-line error when it cannot."""
    import datasets

    datasets.disable_progress_bars()
    local = _local(cfg)
    if local is not None and local.is_file() and local.stat().st_size == 0:
        raise DataError(f"data.path={cfg.path!r}: the file is empty (no documents to read)")
    try:
        if local is not None and local.is_dir():  # written by Dataset.save_to_disk: memory-mapped arrow
            ds = datasets.load_from_disk(str(local))
        elif local is not None:  # a local data file, streamed: no arrow copy of it is written
            builder = LOCAL_BUILDERS[local.suffix.lstrip(".").lower()]
            ds = datasets.load_dataset(builder, data_files=str(local), split="train", streaming=True)
        else:
            _check_hub(cfg)
            ds = datasets.load_dataset(cfg.path, cfg.config, split=cfg.split, revision=cfg.revision,
                                       streaming=cfg.streaming)
    except DataError:
        raise
    except Exception as exc:  # noqa: BLE001 - any loader failure becomes one user-facing line
        raise DataError(f"data.path={cfg.path!r}: could not load the dataset ({_first_line(exc)}); "
                        "offline machines can use data=stdlib or data=text data.files=[...]") from None
    names = getattr(ds, "column_names", None)
    if names is not None and cfg.text_field not in names:
        raise DataError(f"data.text_field={cfg.text_field!r}: not a column of {cfg.path!r} (columns: {names})")
    if names is not None and len(names) > 1:
        ds = ds.select_columns([cfg.text_field])  # decode only the text
    return ds


def _check_hub(cfg: DataConfig) -> None:
    """A hub dataset where the Hub cannot be reached: one line at once (`grow.hub`), not 30 s of retries."""
    problem = hub.unreachable()
    if problem:
        raise DataError(f"data.path={cfg.path!r}: a Hub dataset, and {problem}; {hub.HOW_TO_USE_THE_CACHE}, or "
                        "train offline on data=stdlib, data=text data.files=[...] or data=hf data.path=<a local file>")


def _first_line(exc: BaseException) -> str:
    text = str(exc).strip()
    return (text.splitlines()[0] if text else type(exc).__name__)[:160]
