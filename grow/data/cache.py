"""The token cache: one directory per fingerprint, built once, checked at every start (docs/design.md, "Data").

``cache_dir/<name>-<fingerprint>/`` holds ``train.bin``, ``val.bin`` (uint16), ``tokenizer.json`` and
``meta.json`` (the manifest). The fingerprint hashes the source's identity (`grow.data.sources.identity`),
the tokenizer and the split rule, never a document. A build writes into
``.<name>-<fingerprint>.tmp-<host>-<pid>/`` and renames it into place once written and synced, so an
interrupted build is never used (docs/data.md, "How it works").
"""

from __future__ import annotations

import hashlib
import itertools
import json
import os
import shutil
import socket
import time
from pathlib import Path

from grow.data import pysrc
from grow.data.config import DataConfig
from grow.data.encode import Encoder, chunks, split_stream
from grow.data.progress import Progress, fmt_count
from grow.data.sources import documents, identity
from grow.data.tokenizer import TOKENIZER_VERSION, read_tokenizer, train_bpe
from grow.errors import DataError, disk_full
from grow.faults import kill_point

CACHE_FORMAT = "grow.tokens/2"
FILES = ("tokenizer.json", "train.bin", "val.bin")


def sha256_file(path: Path) -> str:
    """SHA-256 of a file, read in 4 MiB chunks (the token cache and checkpoints both verify with it)."""
    h = hashlib.sha256()
    with open(path, "rb") as f:
        for chunk in iter(lambda: f.read(1 << 22), b""):
            h.update(chunk)
    return h.hexdigest()


# ---- where ------------------------------------------------------------------------------------------


def tokenizer_identity(cfg: DataConfig) -> dict:
    if cfg.tokenizer is not None:
        return {"file_sha256": sha256_file(Path(os.path.expanduser(cfg.tokenizer))), "eot": cfg.eot_token}
    return {"bpe": TOKENIZER_VERSION, "vocab_size": cfg.vocab_size, "sample_chars": cfg.tokenizer_sample_bytes,
            "eot": cfg.eot_token}


def fingerprint(cfg: DataConfig) -> str:
    """16 hex digits naming the cache of ``cfg``: source identity, tokenizer, split rule, limit."""
    key = {"format": CACHE_FORMAT, "source": identity(cfg), "tokenizer": tokenizer_identity(cfg),
           "val_every": cfg.val_every, "max_bytes": cfg.max_bytes}
    return hashlib.sha256(json.dumps(key, sort_keys=True).encode()).hexdigest()[:16]


def cache_path(cfg: DataConfig) -> Path:
    return Path(os.path.expanduser(cfg.cache_dir)) / f"{cfg.name}-{fingerprint(cfg)}"


# ---- checking ----------------------------------------------------------------------------------------


def read_meta(d: Path) -> dict | None:
    try:
        return json.loads((Path(d) / "meta.json").read_text())
    except (OSError, ValueError):
        return None


def check_cache(d: Path, full: bool = False) -> str | None:
    """Why the cache at ``d`` cannot be used (None: it can): sizes always, SHA-256 with ``full``."""
    meta = read_meta(d)
    if meta is None or meta.get("format") != CACHE_FORMAT:
        return "missing" if not Path(d).exists() else "incomplete (no readable manifest)"
    try:
        for name, info in meta["files"].items():
            p = Path(d) / name
            if not p.is_file() or p.stat().st_size != info["bytes"]:
                return f"damaged ({name} is missing or not {info['bytes']} bytes)"
            if full and sha256_file(p) != info["sha256"]:
                return f"corrupt (the SHA-256 of {name} differs from the manifest's)"
    except (KeyError, TypeError, AttributeError):
        return "incomplete (a bad manifest)"
    return None


def cache_is_valid(d: Path, full: bool = False) -> bool:
    return check_cache(d, full) is None


# ---- building -----------------------------------------------------------------------------------------


def _sample(stream, limit: int):
    """(the first documents up to ``limit`` training characters, the whole stream again)."""
    sample, size = [], 0
    for item in stream:
        sample.append(item)
        size += 0 if item[0] else len(item[1])
        if size >= limit:
            break
    return sample, itertools.chain(sample, stream)


def _tokenizer(cfg: DataConfig, stream, log):
    """(tokenizer, the stream to encode): the given tokenizer.json, or a BPE trained on a sample."""
    if cfg.tokenizer is not None:
        return read_tokenizer(Path(os.path.expanduser(cfg.tokenizer))), stream
    sample, stream = _sample(stream, cfg.tokenizer_sample_bytes)
    chars = sum(len(t) for is_val, t in sample if not is_val)
    log(f"data: training a byte-level BPE tokenizer ({cfg.vocab_size} tokens) on {fmt_count(chars)} characters "
        "of the training text")
    tok = train_bpe((t for is_val, t in sample if not is_val), cfg.vocab_size, cfg.eot_token)
    got = tok.get_vocab_size()
    if got < cfg.vocab_size:  # BPE stops when no pair occurs twice: a small corpus has fewer merges to give
        log(f"data: the tokenizer has {got} ids, not data.vocab_size={cfg.vocab_size}: {fmt_count(chars)} characters "
            f"hold no more merges; the model keeps {cfg.vocab_size} embedding rows, {cfg.vocab_size - got} never used "
            f"(data.vocab_size={got} drops them, or give more text)")
    return tok, stream


def _what(cfg: DataConfig) -> str:
    """The corpus's short name on the console: the source, a local file's name or a hub dataset's."""
    if cfg.name != "hf":
        return cfg.name
    local = Path(os.path.expanduser(cfg.path))
    return local.name if local.exists() else cfg.path


def _write_tokens(tmp: Path, cfg: DataConfig, tok, stream, log, where: Path, lengths=None) -> dict:
    """Encode ``stream`` into ``tmp``/train.bin and val.bin; the manifest's counts and hashes. ``lengths``
    (``{"train": [], "val": []}``), when given, gets each document's number of ids, in stream order."""
    eot_id = tok.token_to_id(cfg.eot_token)
    hashes = {"train.bin": hashlib.sha256(), "val.bin": hashlib.sha256()}
    progress = Progress(log, _what(cfg))
    try:
        with open(tmp / "train.bin", "wb") as ftrain, open(tmp / "val.bin", "wb") as fval, \
                Encoder(tok.to_str(), eot_id, cfg.workers) as encoder:
            for train_ids, val_ids, nbytes, docs, (train_lengths, val_lengths) in encoder.map(chunks(stream)):
                for f, name, ids in ((ftrain, "train.bin", train_ids), (fval, "val.bin", val_ids)):
                    f.write(ids)
                    hashes[name].update(ids)
                if lengths is not None:
                    lengths["train"] += train_lengths
                    lengths["val"] += val_lengths
                progress.update(nbytes, len(train_ids) // 2, len(val_ids) // 2, docs)
            for f in (ftrain, fval):
                f.flush()
                os.fsync(f.fileno())
    finally:
        progress.close()
    if progress.bytes == 0:
        raise DataError(f"data.name={cfg.name!r}: the corpus is empty")
    progress.done(where)
    return {"sha256": {k: h.hexdigest() for k, h in hashes.items()},
            "tokens": {"train": progress.train_tokens, "val": progress.val_tokens},
            "documents": progress.docs, "text_bytes": progress.bytes, "eot_id": eot_id,
            "seconds": progress.seconds, "mb_per_s": progress.mb_per_s()}


def _write_atomic(path: Path, data: bytes) -> None:
    with open(path, "wb") as f:
        f.write(data)
        f.flush()
        os.fsync(f.fileno())


def _tmp_prefix(d: Path) -> str:
    return f".{d.name}.tmp-{socket.gethostname()}-"


def _remove_stale(d: Path) -> None:
    """Remove the temporary build directories of ``d`` left by dead processes of this host."""
    for p in d.parent.glob(_tmp_prefix(d) + "*"):
        try:
            os.kill(int(p.name.rsplit("-", 1)[1]), 0)
        except ProcessLookupError:
            shutil.rmtree(p, ignore_errors=True)
        except (ValueError, PermissionError):
            pass


def _publish(tmp: Path, d: Path) -> None:
    """Rename the finished build into place, replacing a damaged cache of the same fingerprint. A sound one that
    another process published meanwhile stays (same fingerprint, same tokens): others may be reading it, and
    moving it away under them would end their runs with a missing file."""
    if d.exists() and check_cache(d, full=True) is None:  # every file hashed: only a rebuild or a race gets here
        shutil.rmtree(tmp, ignore_errors=True)
        return
    if d.exists():
        old = d.parent / f"{_tmp_prefix(d)}{os.getpid()}-old"
        os.rename(d, old)
        shutil.rmtree(old, ignore_errors=True)
    os.rename(tmp, d)


def build_cache(d: Path, cfg: DataConfig, log=print) -> dict:
    """Tokenize the corpus of ``cfg`` into the cache directory ``d`` (see the module docstring)."""
    d.parent.mkdir(parents=True, exist_ok=True)
    _remove_stale(d)
    tmp = d.parent / f"{_tmp_prefix(d)}{os.getpid()}"
    shutil.rmtree(tmp, ignore_errors=True)
    tmp.mkdir()
    try:
        with disk_full("the token cache", d, "nothing was trained yet; rerun once there is space"):
            return _build(tmp, d, cfg, log)
    finally:
        shutil.rmtree(tmp, ignore_errors=True)


def _build(tmp: Path, d: Path, cfg: DataConfig, log) -> dict:
    """`build_cache` in the temporary directory ``tmp``, published as ``d`` when complete."""
    manifest: list[dict] = []  # data=pysrc: the files read (grow.data.pysrc)
    stream = (pysrc.split_documents(cfg, manifest) if cfg.name == "pysrc" else
              split_stream(documents(cfg), cfg.val_every))
    tok, stream = _tokenizer(cfg, stream, log)
    given = cfg.tokenizer and Path(os.path.expanduser(cfg.tokenizer)).read_bytes()
    _write_atomic(tmp / "tokenizer.json", given or tok.to_str().encode())  # a given file byte for byte
    kill_point("cache")
    lengths = {"train": [], "val": []} if cfg.name == "pysrc" else None
    built = _write_tokens(tmp, cfg, tok, stream, log, d, lengths)
    if cfg.name == "pysrc":  # each file's tokens, counted as it was encoded (one pass over the corpus)
        pysrc.set_tokens(manifest, lengths)
        built["corpus"] = pysrc.summary(manifest)
        _write_atomic(tmp / pysrc.MANIFEST, json.dumps({"summary": built["corpus"], "files": manifest}).encode())
    kill_point("cache")
    meta = {
        "format": CACHE_FORMAT,
        "files": {n: {"bytes": (tmp / n).stat().st_size,
                      "sha256": built["sha256"].get(n) or sha256_file(tmp / n)} for n in FILES},
        "source": cfg.name, "fingerprint": d.name, "vocab_size": cfg.vocab_size,
        "tokenizer": cfg.tokenizer, "tokenizer_vocab": tok.get_vocab_size(), "eot_token": cfg.eot_token,
        **{k: v for k, v in built.items() if k != "sha256"}, "num_proc": cfg.workers,
        "created": time.strftime("%Y-%m-%dT%H:%M:%S"),
    }
    _write_atomic(tmp / "meta.json", json.dumps(meta, indent=1).encode())
    kill_point("cache")  # every file written, not yet published
    _publish(tmp, d)
    return meta


def open_cache(cfg: DataConfig, log=print) -> tuple[Path, bool]:
    """(the cache directory of ``cfg``, whether this call built it): reused when it checks out."""
    d = cache_path(cfg)
    problem = check_cache(d, full=cfg.verify == "full")
    if problem is None:
        meta = read_meta(d)
        log(f"data: reusing the token cache {d} ({meta['tokens']['train']:,} train + {meta['tokens']['val']:,} "
            "val tokens)")
        return d, False
    if problem != "missing":
        log(f"data: the token cache {d} is {problem}; rebuilding it")
    build_cache(d, cfg, log)
    return d, True
