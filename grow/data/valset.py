"""A validation split that represents the corpus (``data=pysrc`` with ``data.val_near_dup`` / ``data.val_max_share``;
docs/data.md, "pysrc", and docs/design.md, "Data", "Token cache"): near-duplicate files removed, then no package above
a share of the split's bytes. Held-out packages are whole packages, so one package of near-identical files (the
standard library's `encodings` codec tables) or one large file can otherwise be most of what the loss is measured
on. Both rules only drop validation files; the training split is untouched.
"""

from __future__ import annotations

import math
import re
import zlib

import numpy as np

from grow.errors import ConfigError

SHINGLE = 5  # words per shingle: long enough that shared boilerplate lines alone do not make two files alike
PERMS = 128  # MinHash functions: the Jaccard estimate's SD is at most 0.5/sqrt(128) = 0.044
_P = (1 << 31) - 1  # the universal hashes (a x + b) mod p, a, b < p, x a CRC-32: a x < 2^63, exact in uint64
_RNG = np.random.default_rng(20231111)  # a fixed draw: the same files are dropped on every machine
_A = _RNG.integers(1, _P, PERMS, dtype=np.uint64)
_B = _RNG.integers(0, _P, PERMS, dtype=np.uint64)
_WORD = re.compile(rb"\w+|[^\w\s]")
_CHUNK = 4096  # shingles hashed at once (bounds the PERMS x chunk array)


def signature(data: bytes) -> np.ndarray:
    """The MinHash signature (Broder, "On the resemblance and containment of documents", 1997) of a file's set of
    word 5-gram shingles: PERMS minima; the fraction of equal entries of two signatures estimates the Jaccard
    similarity of their shingle sets."""
    words = _WORD.findall(data)
    grams = {b" ".join(words[i:i + SHINGLE]) for i in range(max(len(words) - SHINGLE + 1, 1))}
    x = np.fromiter((zlib.crc32(g) for g in grams), dtype=np.uint64, count=len(grams))
    out = np.full(PERMS, _P, dtype=np.uint64)
    for i in range(0, len(x), _CHUNK):
        h = (_A[:, None] * x[None, i:i + _CHUNK] + _B[:, None]) % np.uint64(_P)
        out = np.minimum(out, h.min(axis=1))
    return out


def near_duplicates(texts: list[bytes], threshold: float) -> dict[int, int]:
    """``{i: j}``: file i (in order) is a near-duplicate of the earlier kept file j, its estimated Jaccard
    similarity at least ``threshold``; the first file of each group of alike files is kept."""
    kept: list[int] = []
    sigs = np.empty((len(texts), PERMS), dtype=np.uint64)
    out: dict[int, int] = {}
    for i, t in enumerate(texts):
        sigs[i] = signature(t)
        if kept:
            alike = (sigs[kept] == sigs[i]).mean(axis=1)
            j = int(np.argmax(alike))
            if alike[j] >= threshold:
                out[i] = kept[j]
                continue
        kept.append(i)
    return out


def _kept(files: list[tuple[str, int]], cap: float) -> tuple[set[int], dict[str, int]]:
    """Each package's files in order, a file kept when it still fits within ``cap`` bytes of its package."""
    kept, used = set(), {}
    for i, (pkg, n) in enumerate(files):
        if used.get(pkg, 0) + n <= cap:
            used[pkg] = used.get(pkg, 0) + n
            kept.add(i)
    return kept, used


def cap_shares(files: list[tuple[str, int]], share: float) -> set[int]:
    """The files (``(package, bytes)`` in order) kept so that no package has more than ``share`` of the kept
    bytes: each package keeps its files in order while each still fits within a cap c of its bytes (whole files:
    one above the cap goes, the next may fit), c the largest at which every kept package is within ``share`` of the
    kept bytes, searched from all the bytes down in steps of 0.5% (and at every package's whole size).
    `ConfigError` when no c works (fewer than 1/share packages, or sizes no cap can balance)."""
    total = sum(n for _, n in files)
    whole: dict[str, int] = {}
    for pkg, n in files:
        whole[pkg] = whole.get(pkg, 0) + n
    smallest = min((n for _, n in files if n > 0), default=0)
    grid, c = set(whole.values()), float(total)
    while c >= smallest > 0:
        grid.add(c)
        c *= 0.995
    for cap in sorted(grid, reverse=True):
        kept, used = _kept(files, cap)
        kept_total = sum(used.values())
        if kept_total and max(used.values()) <= share * kept_total + 1e-9:
            return kept
    raise ConfigError("data.val_max_share", share,
                      f"no cap keeps the validation split's {len(whole)} package(s) each at most {share:g} of it "
                      f"(at least {math.ceil(1 / share)} of similar size are needed): raise it, or hold out more "
                      "packages (a smaller data.val_every)")
