"""Token data: corpus -> byte-level BPE tokenizer -> uint16 memmap cache -> deterministic batches.

Sources (DESIGN §10), chosen by ``data.name``:

- ``stdlib``: the source files of the running Python's standard library, in sorted path order,
  up to ``max_bytes``; works offline on any machine.
- ``text``:   any local text files (``data.files``, globs allowed), in the order given.
- ``hf``:     a HuggingFace dataset through ``datasets.load_dataset(data.path, data.config)``
  (needs the network), or a local data file (json/jsonl, csv, parquet, txt) or a directory
  written by ``Dataset.save_to_disk``: the same loading code, offline.

Documents are split into train/validation by document (every ``val_every``-th document goes
to validation), a byte-level BPE tokenizer is trained on the train split, and the token ids of
both splits (documents joined by ``<|endoftext|>``) are cached as uint16 files under
``cache_dir/<fingerprint>/``. The fingerprint hashes the corpus content, the tokenizer settings
and the split rule, so a second run with the same data starts in seconds, and any change
re-tokenizes. ``meta.json`` records each file's size and SHA-256: a truncated or corrupt cache is
detected and rebuilt, never silently used.

Batches are a pure function of (seed, sample index): sample i of the training stream starts at an
offset drawn from a generator seeded with (seed, i // BLOCK). A batch is a run of consecutive
samples, so the token stream is the same whatever the batch sizes of the stages, and a resumed
run (or another rank, taking its shard of the same global batch) sees exactly the same samples.
"""

from __future__ import annotations

import glob
import hashlib
import json
import os
import sysconfig
import time
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import torch

from grow.errors import DataError

EOT = "<|endoftext|>"
TOKENIZER_VERSION = "bytelevel-bpe-v1"
BLOCK = 4096  # samples per generator block in the training stream
VAL_SEED = 1234  # the validation batches are the same for every run seed


# ---- corpus -----------------------------------------------------------------------------------


def stdlib_files() -> list[Path]:
    root = Path(sysconfig.get_paths()["stdlib"])
    return sorted(f for f in root.rglob("*.py") if "site-packages" not in f.parts and f.is_file())


def _read_files(paths, max_bytes: int) -> list[str]:
    docs, total = [], 0
    for path in paths:
        if total >= max_bytes:
            break
        text = Path(path).read_text(encoding="utf-8", errors="replace")
        docs.append(text[: max_bytes - total])
        total += len(docs[-1])
    return docs


def text_files(patterns) -> list[Path]:
    paths: list[Path] = []
    for pattern in patterns:
        matches = sorted(glob.glob(os.path.expanduser(str(pattern))))
        if not matches:
            raise DataError(f"data.files: {pattern!r} matches no file")
        paths.extend(Path(m) for m in matches)
    return paths


LOCAL_BUILDERS = {"json": "json", "jsonl": "json", "csv": "csv", "parquet": "parquet", "txt": "text"}


def _hf_documents(cfg) -> list[str]:
    """Load ``cfg.path`` with ``datasets.load_dataset``; a clear one-line error when it cannot."""
    import datasets

    datasets.disable_progress_bars()
    path, split = str(cfg.path), cfg.get("split", "train")
    local = Path(os.path.expanduser(path))
    try:
        if local.is_dir() and (local / "dataset_info.json").exists():  # saved with Dataset.save_to_disk
            ds = datasets.load_from_disk(str(local))
        elif local.is_file():  # a local data file: json/jsonl, csv, parquet or text
            builder = LOCAL_BUILDERS.get(local.suffix.lstrip(".").lower())
            if builder is None:
                raise DataError(f"data.path={path!r}: unknown file type (use one of {', '.join(LOCAL_BUILDERS)})")
            ds = datasets.load_dataset(builder, data_files=str(local), split="train")
        else:
            ds = datasets.load_dataset(path, cfg.get("config"), split=split)
    except DataError:
        raise
    except Exception as exc:  # noqa: BLE001 - any loader failure becomes one user-facing line
        first = str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__
        raise DataError(
            f"data.path={cfg.path!r}: could not load the dataset ({first[:160]}); "
            "offline machines can use data=stdlib or data=text data.files=[...]"
        ) from None
    field = cfg.get("text_field", "text")
    if field not in ds.column_names:
        raise DataError(f"data.text_field={field!r}: not a column of {cfg.path!r} (columns: {ds.column_names})")
    docs, total = [], 0
    for text in ds[field]:
        if total >= cfg.max_bytes:
            break
        docs.append(text)
        total += len(text)
    return docs


def load_documents(cfg) -> list[str]:
    if cfg.name == "stdlib":
        return _read_files(stdlib_files(), cfg.max_bytes)
    if cfg.name == "text":
        return _read_files(text_files(cfg.files), cfg.max_bytes)
    if cfg.name == "hf":
        return _hf_documents(cfg)
    raise DataError(f"data.name={cfg.name!r}: must be one of stdlib, text, hf")


def split_documents(docs: list[str], val_every: int) -> tuple[list[str], list[str]]:
    """Every ``val_every``-th document (1-based: documents val_every-1, 2*val_every-1, ...) to validation."""
    train = [d for i, d in enumerate(docs) if (i + 1) % val_every != 0]
    val = [d for i, d in enumerate(docs) if (i + 1) % val_every == 0]
    if not val:  # a tiny corpus: hold out the tail of the last document instead
        cut = int(len(docs[-1]) * 0.9)
        train, val = docs[:-1] + [docs[-1][:cut]], [docs[-1][cut:]]
    return train, val


def fingerprint(docs: list[str], cfg) -> str:
    h = hashlib.sha256()
    for part in (TOKENIZER_VERSION, cfg.vocab_size, cfg.val_every, len(docs)):
        h.update(str(part).encode() + b"\0")
    for d in docs:
        h.update(hashlib.sha256(d.encode("utf-8", errors="replace")).digest())
    return h.hexdigest()[:16]


# ---- tokenizer and cache ----------------------------------------------------------------------


def train_tokenizer(docs: list[str], vocab_size: int):
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers

    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=vocab_size,
        special_tokens=[EOT],
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=False,
    )
    tok.train_from_iterator(docs, trainer)
    return tok


def tokenize(docs: list[str], tok, num_proc: int | None = None) -> np.ndarray:
    """Token ids of ``docs`` joined by EOT, through ``datasets.Dataset.map`` in batches."""
    import datasets

    datasets.disable_progress_bars()
    eot = tok.token_to_id(EOT)
    ds = datasets.Dataset.from_dict({"text": docs})
    ds = ds.map(
        lambda b: {"ids": [e.ids + [eot] for e in tok.encode_batch(b["text"])]},
        batched=True,
        batch_size=256,
        remove_columns=["text"],
        keep_in_memory=True,
        num_proc=num_proc,
    )
    ids = ds.with_format("numpy")["ids"]
    flat = np.concatenate([np.asarray(x, dtype=np.uint16) for x in ids]) if len(ids) else np.zeros(0, np.uint16)
    return flat


def sha256_file(path: Path) -> str:
    """SHA-256 of a file, read in 4 MiB chunks (the token cache and checkpoints both verify with it)."""
    h = hashlib.sha256()
    with open(path, "rb") as f:
        for chunk in iter(lambda: f.read(1 << 22), b""):
            h.update(chunk)
    return h.hexdigest()


def _write_atomic(path: Path, data: bytes) -> None:
    tmp = path.with_suffix(path.suffix + f".{os.getpid()}.tmp")  # per process: parallel jobs may build one cache
    with open(tmp, "wb") as f:
        f.write(data)
        f.flush()
        os.fsync(f.fileno())
    os.replace(tmp, path)


def cache_is_valid(d: Path) -> bool:
    meta_path = d / "meta.json"
    if not meta_path.exists():
        return False
    try:
        meta = json.loads(meta_path.read_text())
        for name, info in meta["files"].items():
            p = d / name
            if not p.exists() or p.stat().st_size != info["bytes"] or sha256_file(p) != info["sha256"]:
                return False
    except (ValueError, KeyError, OSError):
        return False
    return True


def build_cache(d: Path, docs: list[str], cfg, log=print) -> None:
    """Tokenize into ``d``; a full disk ends with `grow.errors.DiskFull` (the cache stays incomplete:
    no meta.json, so the next run rebuilds it)."""
    from grow.errors import disk_full
    from grow.faults import kill_point

    with disk_full("the token cache", d, "nothing was trained yet; rerun once there is space"):
        _build_cache(d, docs, cfg, log, kill_point)


def _build_cache(d: Path, docs: list[str], cfg, log, kill_point) -> None:
    d.mkdir(parents=True, exist_ok=True)
    t0 = time.perf_counter()
    train_docs, val_docs = split_documents(docs, cfg.val_every)
    tok = train_tokenizer(train_docs, cfg.vocab_size)
    _write_atomic(d / "tokenizer.json", tok.to_str().encode())
    kill_point("cache")
    files = {"tokenizer.json": None}
    for split, split_docs in (("train", train_docs), ("val", val_docs)):
        ids = tokenize(split_docs, tok)
        _write_atomic(d / f"{split}.bin", ids.tobytes())
        kill_point("cache")
        files[f"{split}.bin"] = None
    meta = {
        "files": {n: {"bytes": (d / n).stat().st_size, "sha256": sha256_file(d / n)} for n in files},
        "vocab_size": cfg.vocab_size,
        "tokenizer_vocab": tok.get_vocab_size(),
        "documents": {"train": len(train_docs), "val": len(val_docs)},
        "source": cfg.name,
        "seconds": time.perf_counter() - t0,
    }
    _write_atomic(d / "meta.json", json.dumps(meta, indent=1).encode())
    log(f"data: tokenized {len(docs)} documents in {meta['seconds']:.1f}s -> {d}")


# ---- batches ----------------------------------------------------------------------------------


@dataclass
class TokenData:
    """The cached token ids of one corpus, and the deterministic batch streams over them."""

    train: np.ndarray
    val: np.ndarray
    vocab_size: int
    cache_dir: Path
    built: bool  # True when this call tokenized (False: the cache was reused)

    def _offsets(self, seed: int, start: int, count: int, seq_len: int) -> np.ndarray:
        high = len(self.train) - seq_len - 1
        out = np.empty(count, dtype=np.int64)
        i = 0
        while i < count:
            block, within = divmod(start + i, BLOCK)
            rng = np.random.default_rng([seed, block])
            offs = rng.integers(0, high, size=BLOCK)
            take = min(BLOCK - within, count - i)
            out[i : i + take] = offs[within : within + take]
            i += take
        return out

    def _gather(self, tokens: np.ndarray, offsets: np.ndarray, seq_len: int):
        rows = np.stack([tokens[o : o + seq_len + 1] for o in offsets]).astype(np.int64)
        t = torch.from_numpy(rows)
        return t[:, :-1].contiguous(), t[:, 1:].contiguous()

    def batch(self, seed: int, start: int, batch_size: int, seq_len: int):
        """Samples ``start .. start+batch_size-1`` of the training stream of ``seed``: (x, y) int64 [B, T]."""
        return self._gather(self.train, self._offsets(seed, start, batch_size, seq_len), seq_len)

    def val_batches(self, n_batches: int, batch_size: int, seq_len: int):
        """The fixed validation set: ``n_batches`` batches, identical for every run seed."""
        high = len(self.val) - seq_len - 1
        rng = np.random.default_rng(VAL_SEED)
        offs = rng.integers(0, high, size=n_batches * batch_size)
        return [
            self._gather(self.val, offs[i * batch_size : (i + 1) * batch_size], seq_len) for i in range(n_batches)
        ]


def load(cfg, seq_len: int, log=print) -> TokenData:
    """Documents -> cached token ids (built once per fingerprint) -> `TokenData`."""
    docs = load_documents(cfg)
    if not docs or not any(docs):
        raise DataError(f"data.name={cfg.name!r}: the corpus is empty")
    d = Path(os.path.expanduser(str(cfg.cache_dir))) / f"{cfg.name}-{fingerprint(docs, cfg)}"
    built = False
    if not cache_is_valid(d):
        if (d / "meta.json").exists():
            log(f"data: cache at {d} is incomplete or corrupt; rebuilding it")
        build_cache(d, docs, cfg, log)
        built = True
    train = np.memmap(d / "train.bin", dtype=np.uint16, mode="r")
    val = np.memmap(d / "val.bin", dtype=np.uint16, mode="r")
    for split, arr in (("train", train), ("val", val)):
        if len(arr) < seq_len + 2:
            raise DataError(
                f"data: the {split} split has {len(arr)} tokens, fewer than seq_len+2={seq_len + 2}; "
                "use more data (data.max_bytes) or a shorter model.seq_len"
            )
    return TokenData(train=train, val=val, vocab_size=cfg.vocab_size, cache_dir=d, built=built)


def load_tokenizer(cache_dir: Path):
    from tokenizers import Tokenizer

    return Tokenizer.from_file(str(Path(cache_dir) / "tokenizer.json"))
