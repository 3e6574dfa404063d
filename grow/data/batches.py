"""Deterministic batches over one or more token arrays: a cache file, or a set of shards (docs/design.md, "Data").

A sample is a window of ``seq_len + 1`` tokens inside one array; the window starts of all arrays form
one range, and sample i of ``seed`` is drawn by the generator seeded with ``(seed, i // BLOCK)``. So
batches are a pure function of (seed, sample index), arrays are sampled in proportion to their length,
and the validation batches (drawn from `VAL_SEED`) are the same for every run.
"""

from __future__ import annotations

import shutil
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import torch

BLOCK = 4096  # samples per generator block in the training stream
VAL_SEED = 1234  # the validation batches are the same for every run seed


def _ends(arrays, seq_len: int) -> np.ndarray:
    """Cumulative number of window starts through each array."""
    return np.cumsum([max(len(a) - seq_len - 1, 0) for a in arrays], dtype=np.int64)


def _rows(arrays, starts: np.ndarray, seq_len: int) -> np.ndarray:
    """The windows at global ``starts`` as uint16 rows [B, T + 1] (the arrays' own dtype)."""
    ends = _ends(arrays, seq_len)
    which = np.searchsorted(ends, starts, side="right")
    local = starts - np.concatenate([[0], ends[:-1]])[which]
    return np.stack([arrays[k][o : o + seq_len + 1] for k, o in zip(which, local)])


def split_rows(rows: torch.Tensor):
    """(x, y) of uint16-valued rows [B, T + 1] (any integer tensor): int64 inputs and targets [B, T]."""
    t = rows.long()
    return t[:, :-1].contiguous(), t[:, 1:].contiguous()


def _gather(arrays, starts: np.ndarray, seq_len: int):
    """(x, y) int64 [B, T] of the windows at global ``starts``."""
    return split_rows(torch.from_numpy(_rows(arrays, starts, seq_len).astype(np.int64)))


@dataclass
class TokenData:
    """The token arrays of one corpus, and the deterministic batch streams over them."""

    train: list  # uint16 arrays (memory-mapped): the cache's train.bin, or the training shards
    val: list
    vocab_size: int
    cache_dir: Path | None  # the token cache (None for data=bin)
    built: bool  # True when this call tokenized (False: the cache was reused)
    tokenizer_path: Path | None = None  # the tokenizer.json of these ids (None: data=bin without one)

    @property
    def train_tokens(self) -> int:
        return int(sum(len(a) for a in self.train))

    @property
    def val_tokens(self) -> int:
        return int(sum(len(a) for a in self.val))

    def _starts(self, seed: int, start: int, count: int, seq_len: int) -> np.ndarray:
        total = int(_ends(self.train, seq_len)[-1])
        out = np.empty(count, dtype=np.int64)
        i = 0
        while i < count:
            block, within = divmod(start + i, BLOCK)
            offs = np.random.default_rng([seed, block]).integers(0, total, size=BLOCK)
            take = min(BLOCK - within, count - i)
            out[i : i + take] = offs[within : within + take]
            i += take
        return out

    def batch(self, seed: int, start: int, batch_size: int, seq_len: int):
        """Samples ``start .. start+batch_size-1`` of the training stream of ``seed``: (x, y) int64 [B, T]."""
        return _gather(self.train, self._starts(seed, start, batch_size, seq_len), seq_len)

    def rows(self, seed: int, start: int, batch_size: int, seq_len: int) -> np.ndarray:
        """The same samples as `batch`, as uint16 rows [B, T + 1] (x = rows[:, :-1], y = rows[:, 1:])."""
        return _rows(self.train, self._starts(seed, start, batch_size, seq_len), seq_len)

    def val_batches(self, n_batches: int, batch_size: int, seq_len: int):
        """The fixed validation set: ``n_batches`` batches, identical for every run seed."""
        total = int(_ends(self.val, seq_len)[-1])
        starts = np.random.default_rng(VAL_SEED).integers(0, total, size=n_batches * batch_size)
        return [_gather(self.val, starts[i * batch_size : (i + 1) * batch_size], seq_len) for i in range(n_batches)]

    def save_tokenizer(self, run_dir) -> Path | None:
        """Copy the tokenizer into ``run_dir``/tokenizer.json (a moved run keeps it); None without one."""
        if self.tokenizer_path is None:
            return None
        dest = Path(run_dir) / "tokenizer.json"
        dest.parent.mkdir(parents=True, exist_ok=True)
        shutil.copyfile(self.tokenizer_path, dest)
        return dest
