"""Pre-tokenized shards (``data=bin``): nanoGPT's raw files and llm.c / modded-nanogpt shards (docs/design.md, "Data").

The two formats are told apart by the first 1024 bytes; every shard is memory-mapped read-only and
checked when opened (magic, version, size against the header, token ids below ``data.vocab_size`` on
a sample of `CHECK_WINDOWS` windows of `CHECK_TOKENS`), a failure ending in one line naming the file
(`DataError`, exit 2). The formats and checks: docs/data.md, "Shards".
"""

from __future__ import annotations

import glob
import os
from pathlib import Path

import numpy as np

from grow.errors import DataError

MAGIC, VERSION = 20240520, 1  # llm.c's GPT-2 format (uint16 tokens)
OTHER_MAGIC = {20240801: "a Llama 3 shard (uint32 tokens)", 20240522: "an llm.c eval file (HellaSwag, MMLU)"}
HEADER_INTS = 256
HEADER_BYTES = HEADER_INTS * 4
CHECK_TOKENS = 1 << 16  # tokens per checked window
CHECK_WINDOWS = 14  # windows between the first and the last


def shard_paths(key: str, patterns) -> list[Path]:
    """Every pattern's matching files, sorted, in the order of the patterns (duplicates once)."""
    paths, seen = [], set()
    for pattern in patterns:
        matches = sorted(p for p in glob.glob(os.path.expanduser(str(pattern))) if Path(p).is_file())
        if not matches:
            raise DataError(f"{key}: {pattern!r} matches no file")
        for m in matches:
            if m not in seen:
                seen.add(m)
                paths.append(Path(m))
    return paths


def _has_header(head: np.ndarray) -> bool:
    return len(head) == HEADER_INTS and (int(head[0]) == MAGIC or not head[3:].any())


def open_shard(path: Path) -> np.ndarray:
    """The tokens of one shard, memory-mapped read-only (format checks: see the module docstring)."""
    size = path.stat().st_size
    with open(path, "rb") as f:
        head = np.frombuffer(f.read(HEADER_BYTES), dtype="<i4") if size >= HEADER_BYTES else np.zeros(0, "<i4")
    if _has_header(head):
        magic, version, count = (int(v) for v in head[:3])
        if magic != MAGIC:
            what = f": {OTHER_MAGIC[magic]}" if magic in OTHER_MAGIC else ""
            raise DataError(f"{path}: wrong magic {magic} in the llm.c shard header{what} (grow reads GPT-2 "
                            f"shards: magic {MAGIC}, uint16 tokens)")
        if version != VERSION:
            raise DataError(f"{path}: llm.c shard version {version}; grow reads version {VERSION} (uint16 tokens)")
        if size != HEADER_BYTES + 2 * count:
            raise DataError(f"{path}: truncated shard: {size} bytes, but its header counts {count} tokens "
                            f"({HEADER_BYTES + 2 * count} bytes)")
        offset = HEADER_BYTES
    else:
        if size % 2:
            raise DataError(f"{path}: truncated shard: an odd number of bytes ({size}) for uint16 tokens")
        offset, count = 0, size // 2
    if count == 0:
        return np.zeros(0, dtype=np.uint16)
    return np.memmap(path, dtype=np.uint16, mode="r", offset=offset, shape=(count,))


def check_ids(path: Path, tokens: np.ndarray, vocab_size: int) -> None:
    """Token ids below ``vocab_size`` on the sample of the module docstring; `DataError` otherwise."""
    n = len(tokens)
    if n <= (CHECK_WINDOWS + 2) * CHECK_TOKENS:
        windows = [(0, n)]
    else:
        starts = np.linspace(0, n - CHECK_TOKENS, CHECK_WINDOWS + 2).astype(np.int64)
        windows = [(int(s), int(s) + CHECK_TOKENS) for s in starts]
    for lo, hi in windows:
        top = int(tokens[lo:hi].max()) if hi > lo else -1
        if top >= vocab_size:
            at = lo + int(np.argmax(np.asarray(tokens[lo:hi]) >= vocab_size))
            raise DataError(f"{path}: token id {int(tokens[at])} at position {at} is not below "
                            f"data.vocab_size={vocab_size}")


def open_shards(key: str, patterns, vocab_size: int) -> tuple[list[Path], list[np.ndarray]]:
    """(paths, memory-mapped tokens) of the shards ``patterns`` match, each checked."""
    paths = shard_paths(key, patterns)
    arrays = []
    for p in paths:
        tokens = open_shard(p)
        check_ids(p, tokens, vocab_size)
        arrays.append(tokens)
    return paths, arrays


def write_shard(path, tokens, header: bool = True) -> Path:
    """Write ``tokens`` as an llm.c shard (``header``) or a nanoGPT raw file: for tests and tools."""
    tokens = np.asarray(tokens, dtype=np.uint16)
    path = Path(path)
    with open(path, "wb") as f:
        if header:
            head = np.zeros(HEADER_INTS, dtype="<i4")
            head[:3] = (MAGIC, VERSION, len(tokens))
            f.write(head.tobytes())
        f.write(tokens.astype("<u2").tobytes())
    return path
