"""A floor for the validation loss: a count-based bigram model of the training split, scored on the run's
own validation batches; the formula and the choice of λ are in docs/design.md, "Data".
"""

from __future__ import annotations

from pathlib import Path

import numpy as np

from grow.data.tokenizer import load_tokenizer

LAMBDAS = (*(round(0.05 * i, 2) for i in range(1, 20)), 0.99, 0.999)


def _pairs(arrays, max_tokens: int) -> tuple[np.ndarray, np.ndarray, int]:
    """(previous, next) token ids of adjacent pairs inside each array, from at most ``max_tokens`` tokens."""
    prev, nxt, used = [], [], 0
    for a in arrays:
        a = np.asarray(a[: max(0, max_tokens - used)], dtype=np.int64)
        used += len(a)
        if len(a) > 1:
            prev.append(a[:-1])
            nxt.append(a[1:])
        if used >= max_tokens:
            break
    if not prev:
        return np.zeros(0, np.int64), np.zeros(0, np.int64), used
    return np.concatenate(prev), np.concatenate(nxt), used


def bigram_floor(train, val_batches, vocab_size: int, max_tokens: int = 20_000_000) -> dict:
    """The interpolated bigram model's mean cross-entropy (nats per token) on ``val_batches`` ([(x, y)],
    the run's validation set), with its λ and the number of training tokens counted."""
    a, b, used = _pairs(train, max_tokens)
    V = int(vocab_size)
    uni = (np.bincount(b, minlength=V)[:V].astype(np.float64) + 1.0) / (len(b) + V)
    codes, pair_counts = np.unique(a * V + b, return_counts=True)
    first = np.bincount(a, minlength=V)[:V].astype(np.float64)
    x = np.concatenate([np.asarray(xb.cpu()).reshape(-1) for xb, _ in val_batches]).astype(np.int64)
    y = np.concatenate([np.asarray(yb.cpu()).reshape(-1) for _, yb in val_batches]).astype(np.int64)
    q = x * V + y
    idx = np.clip(np.searchsorted(codes, q), 0, max(len(codes) - 1, 0))
    c_xy = np.where((len(codes) > 0) & (codes[idx] == q), pair_counts[idx], 0).astype(np.float64) if len(codes) \
        else np.zeros(len(q))
    c_x = first[x]
    p_big = np.divide(c_xy, c_x, out=np.zeros_like(c_xy), where=c_x > 0)
    seen = c_x > 0
    best = None
    for lam in LAMBDAS:
        p = np.where(seen, lam * p_big + (1.0 - lam) * uni[y], uni[y])
        ce = float(-np.log(p).mean())
        if best is None or ce < best[0]:
            best = (ce, lam)
    return {"bigram_val_loss": best[0], "bigram_lambda": best[1], "bigram_train_tokens": int(min(used, max_tokens))}


BPB_TOKENS = 1 << 20  # the validation tokens decoded to count their bytes (the split's first this-many)


def bytes_per_token(val: list, tokenizer_path) -> dict:
    """The UTF-8 bytes of text per token of the validation split (its first BPB_TOKENS tokens decoded by
    the run's tokenizer; the end-of-text token has none), which turns nats per token into bits per byte:
    bpb = loss / (ln 2 · bytes per token). Empty without a tokenizer (data=bin without one)."""
    if tokenizer_path is None or not Path(tokenizer_path).is_file():
        return {}

    ids = np.concatenate([np.asarray(a[:BPB_TOKENS]) for a in val])[:BPB_TOKENS]
    if not len(ids):
        return {}
    text = load_tokenizer(tokenizer_path).decode(ids.tolist())
    return {"val_bytes_per_token": len(text.encode("utf-8")) / len(ids), "bytes_per_token_tokens": int(len(ids))}
