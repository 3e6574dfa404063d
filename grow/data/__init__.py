"""Token data: corpus -> tokenizer -> uint16 token arrays -> deterministic batches (docs/design.md, "Data").

``data=<name>`` picks the source (``configs/data/*.yaml``; every key in `DataConfig`, docs/data.md):
``stdlib``, ``text``, ``hf`` and ``pysrc`` are read one document at a time (`sources`, `pysrc`),
tokenized by worker processes (`encode`, `tokenizer`) into a token cache checked by its manifest
(`cache`); ``bin`` memory-maps pre-tokenized shards (`shards`). Either way the batches are a pure
function of (seed, sample index) (`batches`); progress goes through the ``log`` callable (`progress`).
"""

from __future__ import annotations

import os
from pathlib import Path

import numpy as np

from grow.data.batches import BLOCK, VAL_SEED, TokenData, split_rows
from grow.data.cache import build_cache, cache_is_valid, check_cache, fingerprint, open_cache, sha256_file
from grow.data.config import EOT, DataConfig
from grow.data.shards import open_shards, write_shard
from grow.data.tokenizer import load_tokenizer, train_bpe
from grow.errors import DataError

__all__ = ["BLOCK", "EOT", "VAL_SEED", "DataConfig", "DataError", "TokenData", "build_cache", "cache_is_valid",
           "check_cache", "fingerprint", "load", "load_tokenizer", "open_cache", "open_shards", "sha256_file",
           "split_rows", "train_bpe", "write_shard"]


def load(cfg, seq_len: int, log=print) -> TokenData:
    """The token data of the ``data`` config ``cfg`` (a DictConfig, a dict or a `DataConfig`).

    Text sources: the token cache (built on the first call, then reused); ``bin``: the shards.
    `DataError` (one line, exit status 2) when the data cannot serve ``seq_len + 1`` token windows."""
    cfg = DataConfig.from_node(cfg)
    if cfg.name == "bin":
        data = _load_shards(cfg, log)
    else:
        d, built = open_cache(cfg, log)
        data = TokenData(train=[_memmap(d / "train.bin")], val=[_memmap(d / "val.bin")], vocab_size=cfg.vocab_size,
                         cache_dir=d, built=built, tokenizer_path=d / "tokenizer.json")
    for split, arrays in (("train", data.train), ("val", data.val)):
        if max(len(a) for a in arrays) < seq_len + 2:
            raise DataError(
                f"data: the {split} split has no run of seq_len+2={seq_len + 2} tokens (longest: "
                f"{max(len(a) for a in arrays)}); use more data (data.max_bytes) or a shorter model.seq_len"
            )
    return data


def _memmap(path: Path):
    return np.memmap(path, dtype=np.uint16, mode="r") if path.stat().st_size else np.zeros(0, dtype=np.uint16)


def _load_shards(cfg: DataConfig, log) -> TokenData:
    splits = {}
    for key in ("train", "val"):
        paths, arrays = open_shards(f"data.{key}", getattr(cfg, key), cfg.vocab_size)
        splits[key] = arrays
        log(f"data: {len(paths)} {key} shard(s), {sum(len(a) for a in arrays):,} tokens ({paths[0].parent})")
    tok = Path(os.path.expanduser(cfg.tokenizer)) if cfg.tokenizer is not None else None
    return TokenData(train=splits["train"], val=splits["val"], vocab_size=cfg.vocab_size, cache_dir=None, built=False,
                     tokenizer_path=tok)
