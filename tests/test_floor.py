"""The bigram floor (grow.data.floor) against a direct count in Python, and its place in summary.json."""

from __future__ import annotations

import math
from collections import Counter

import numpy as np
import pytest
import torch

from grow.data.floor import LAMBDAS, bigram_floor


def brute_force(train: list[list[int]], x: list[int], y: list[int], V: int) -> tuple[float, float]:
    pairs = Counter((a, b) for seq in train for a, b in zip(seq, seq[1:]))
    first = Counter(a for seq in train for a in seq[:-1])
    nxt = Counter(b for seq in train for b in seq[1:])
    n = sum(nxt.values())
    best = None
    for lam in LAMBDAS:
        total = 0.0
        for a, b in zip(x, y):
            uni = (nxt[b] + 1) / (n + V)
            p = lam * pairs[(a, b)] / first[a] + (1 - lam) * uni if first[a] else uni
            total -= math.log(p)
        ce = total / len(x)
        if best is None or ce < best[0]:
            best = (ce, lam)
    return best


def test_the_floor_is_the_interpolated_bigram_counted_directly():
    rng = np.random.default_rng(0)
    V = 13
    # a Markov chain with a few likely successors per token, in two arrays (no pair across them)
    trans = rng.dirichlet(np.full(V, 0.3), size=V)
    def chain(n):
        s = [int(rng.integers(V))]
        for _ in range(n - 1):
            s.append(int(rng.choice(V, p=trans[s[-1]])))
        return s
    train = [chain(3000), chain(1500)]
    val = chain(65)
    x = torch.tensor(val[:-1]).reshape(4, 16)
    y = torch.tensor(val[1:]).reshape(4, 16)
    got = bigram_floor([np.array(a, dtype=np.uint16) for a in train], [(x[:2], y[:2]), (x[2:], y[2:])], V)
    ce, lam = brute_force(train, val[:-1], val[1:], V)
    assert got["bigram_val_loss"] == pytest.approx(ce, rel=1e-12) and got["bigram_lambda"] == lam
    assert got["bigram_train_tokens"] == 4500
    # the chain is learnable: the floor is well below the uniform model's log V
    assert got["bigram_val_loss"] < math.log(V) - 0.3
    capped = bigram_floor([np.array(a, dtype=np.uint16) for a in train], [(x, y)], V, max_tokens=1000)
    assert capped["bigram_train_tokens"] == 1000
    assert capped["bigram_val_loss"] == pytest.approx(brute_force([train[0][:1000]], val[:-1], val[1:], V)[0], rel=1e-12)
