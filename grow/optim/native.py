"""The per-element AdamW update as a small C kernel for CPU tensors (docs/optimizer.md), built with
the system's C compiler on first use, loaded with ctypes, cached by a hash of source, flags,
compiler and CPU. One call updates every mixed tensor in runs of equal birth byte; with
``-ffp-contract=off`` and no fast-math every operation is IEEE-rounded as written, so the bits do
not depend on the SIMD width (within 64 ulp of the eager ops, which may fuse multiply-adds).
"""

from __future__ import annotations

import ctypes
import hashlib
import os
import platform
import shutil
import subprocess
import tempfile
from pathlib import Path

import torch

SOURCE = r"""
#include <stdint.h>
#include <string.h>
#include <math.h>

/* The update of n elements that share one stage's scalars (neg_step, bc2_sqrt, decay): a loop the
   compiler vectorizes with the scalars broadcast, no gather. */
#define ADAMW_RUN(NAME, T, SQRT)                                                                  \
static void NAME(int64_t n, T *restrict p, const T *restrict g, T *restrict m, T *restrict v,    \
                 T neg_step, T bc2_sqrt, T decay, T w1, T b2, T w2, T eps) {                       \
    const int low = w1 < (T)0.5; /* torch's lerp: start + w (end - start) for |w| < 0.5 */        \
    const T w1c = (T)1 - w1;                                                                      \
    for (int64_t i = 0; i < n; i++) {                                                             \
        const T gi = g[i], mo = m[i];                                                             \
        const T mi = low ? mo + w1 * (gi - mo) : gi - (gi - mo) * w1c;                            \
        const T vb = v[i] * b2;                                                                   \
        const T vi = vb + w2 * gi * gi;                                                           \
        const T denom = SQRT(vi) / bc2_sqrt + eps;                                                \
        m[i] = mi;                                                                                \
        v[i] = vi;                                                                                \
        p[i] = p[i] * decay + (mi * neg_step) / denom;                                            \
    }                                                                                             \
}

/* Every tensor k of the list in one call: its elements in runs of equal birth byte, each run by
   ADAMW_RUN with row birth[i] of the tensor's (S, 3) table (tables + 3 S k). */
#define ADAMW_MULTI(NAME, RUN, T)                                                                 \
void NAME(int64_t count, const int64_t *sizes, T *const *P, T *const *G, T *const *M, T *const *V, \
          const uint8_t *const *B, const T *tables, int64_t stages, T w1, T b2, T w2, T eps) {     \
    for (int64_t k = 0; k < count; k++) {                                                         \
        const uint8_t *b = B[k];                                                                  \
        const T *t = tables + 3 * stages * k;                                                     \
        const int64_t n = sizes[k];                                                               \
        int64_t i = 0;                                                                            \
        while (i < n) {                                                                           \
            const uint8_t s = b[i];                                                               \
            int64_t j = i + 1;                                                                    \
            const uint64_t same = 0x0101010101010101ull * s;                                      \
            uint64_t word;                                                                        \
            while (j + 8 <= n && (memcpy(&word, b + j, 8), word == same)) j += 8; /* 8 bytes a go */ \
            while (j < n && b[j] == s) j++;                                                       \
            RUN(j - i, P[k] + i, G[k] + i, M[k] + i, V[k] + i, t[3 * s], t[3 * s + 1], t[3 * s + 2], \
                w1, b2, w2, eps);                                                                 \
            i = j;                                                                                \
        }                                                                                         \
    }                                                                                             \
}

/* The same update with each element's scalars gathered by its birth byte: the one-pass-per-tensor
   form this pass replaced, kept as the reference the runs must equal bit for bit (tests). */
#define ADAMW_PER_ELEMENT(NAME, T, SQRT)                                                          \
void NAME(int64_t n, T *restrict p, const T *restrict g, T *restrict m, T *restrict v,           \
          const uint8_t *restrict birth, const T *restrict t, T w1, T b2, T w2, T eps) {          \
    const int low = w1 < (T)0.5;                                                                  \
    const T w1c = (T)1 - w1;                                                                      \
    for (int64_t i = 0; i < n; i++) {                                                             \
        const int s = 3 * birth[i];                                                               \
        const T gi = g[i], mo = m[i];                                                             \
        const T mi = low ? mo + w1 * (gi - mo) : gi - (gi - mo) * w1c;                            \
        const T vb = v[i] * b2;                                                                   \
        const T vi = vb + w2 * gi * gi;                                                           \
        const T denom = SQRT(vi) / t[s + 1] + eps;                                                \
        m[i] = mi;                                                                                \
        v[i] = vi;                                                                                \
        p[i] = p[i] * t[s + 2] + (mi * t[s]) / denom;                                             \
    }                                                                                             \
}

ADAMW_RUN(adamw_run_f32, float, sqrtf)
ADAMW_RUN(adamw_run_f64, double, sqrt)
ADAMW_MULTI(grow_adamw_multi_f32, adamw_run_f32, float)
ADAMW_MULTI(grow_adamw_multi_f64, adamw_run_f64, double)
ADAMW_PER_ELEMENT(grow_adamw_per_element_f32, float, sqrtf)
ADAMW_PER_ELEMENT(grow_adamw_per_element_f64, double, sqrt)
"""
FLAGS = ("-O3", "-march=native", "-ffp-contract=off", "-fno-math-errno", "-shared", "-fPIC", "-std=c99")
_C_TYPES = {torch.float32: ctypes.c_float, torch.float64: ctypes.c_double}


def cache_dir() -> Path:
    """Where built kernels are kept: ``$GROW_KERNEL_CACHE``, else ``$XDG_CACHE_HOME/grow/kernels``
    (``~/.cache/grow/kernels``)."""
    if os.environ.get("GROW_KERNEL_CACHE"):
        return Path(os.environ["GROW_KERNEL_CACHE"])
    base = os.environ.get("XDG_CACHE_HOME") or str(Path.home() / ".cache")
    return Path(base) / "grow" / "kernels"


def _cpu_signature() -> str:
    """What ``-march=native`` depends on: the CPU's flags (Linux), else its name."""
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("flags"):
                return line
    except OSError:
        pass
    return platform.processor() or platform.machine()


def _build(cc: str) -> Path:
    """The shared library for this source, flags, compiler and CPU: from the cache, or compiled into
    it (written under a temporary name and renamed, so concurrent processes never load half a file)."""
    version = subprocess.run([cc, "--version"], capture_output=True, text=True, timeout=30).stdout
    key = hashlib.sha256("\0".join([SOURCE, " ".join(FLAGS), cc, version, _cpu_signature()]).encode()).hexdigest()[:20]
    lib = cache_dir() / f"adamw_per_element-{key}.so"
    if lib.exists():
        return lib
    lib.parent.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory(dir=lib.parent) as tmp:
        src, out = Path(tmp) / "adamw_per_element.c", Path(tmp) / "adamw_per_element.so"
        src.write_text(SOURCE)
        done = subprocess.run([cc, *FLAGS, "-o", str(out), str(src), "-lm"], capture_output=True, text=True,
                              timeout=120)
        if done.returncode != 0:
            raise RuntimeError(f"{cc} failed: {(done.stderr or done.stdout).strip().splitlines()[:1]}")
        os.replace(out, lib)
    return lib


class NativeAdamW:
    """The loaded kernels, on contiguous CPU tensors of one dtype, float32 or float64 (`supports`):
    ``kernel(ps, gs, ms, vs, births, table, (b1, b2, eps))`` updates every tensor of the lists in one
    call (``table``: the (K, S, 3) stage scalars of the K tensors, ``births`` their uint8 stages);
    ``kernel.per_tensor(p, g, m, v, birth, table_row, constants)`` is the per-element form, one
    tensor, the reference the runs are tested against bit for bit."""

    def __init__(self, lib: Path):
        self._lib = ctypes.CDLL(str(lib))
        self._multi, self._single = {}, {}
        for dtype, suffix in ((torch.float32, "f32"), (torch.float64, "f64")):
            scalars = [_C_TYPES[dtype]] * 4
            multi = getattr(self._lib, f"grow_adamw_multi_{suffix}")
            multi.restype = None
            multi.argtypes = [ctypes.c_int64] + [ctypes.c_void_p] * 7 + [ctypes.c_int64] + scalars
            single = getattr(self._lib, f"grow_adamw_per_element_{suffix}")
            single.restype = None
            single.argtypes = [ctypes.c_int64] + [ctypes.c_void_p] * 6 + scalars
            self._multi[dtype], self._single[dtype] = multi, single

    @staticmethod
    def supports(dtype: torch.dtype) -> bool:
        return dtype in _C_TYPES

    def __call__(self, ps, gs, ms, vs, births, table, constants: tuple[float, float, float]) -> None:
        """Update every ``ps[k]``, ``ms[k]``, ``vs[k]`` in place; ``constants`` = (b1, b2, eps). The
        caller (`GrowthAwareAdamW`) passes contiguous CPU tensors; what a wrong call would corrupt
        memory with is checked here: one dtype, one size per tensor, uint8 births, a (K, S, 3) table."""
        (b1, b2, eps), dtype, u8, k = constants, table.dtype, torch.uint8, len(ps)
        bad = not (table.is_contiguous() and table.dim() == 3 and table.shape[0] == k and table.shape[2] == 3
                   and len(gs) == len(ms) == len(vs) == len(births) == k and dtype in self._multi)
        sizes = []
        for p, g, m, v, birth in zip(ps, gs, ms, vs, births):  # a tight loop: it runs at every step
            n = p.numel()
            bad = bad or not (p.dtype is dtype and g.dtype is dtype and m.dtype is dtype and v.dtype is dtype
                              and birth.dtype is u8 and g.numel() == n and m.numel() == n and v.numel() == n
                              and birth.numel() == n and p.is_contiguous() and g.is_contiguous()
                              and m.is_contiguous() and v.is_contiguous() and birth.is_contiguous())
            sizes.append(n)
        if bad:
            raise ValueError("native AdamW kernel: contiguous tensors of one dtype and size, uint8 births, "
                             "a (K, S, 3) table")
        pointers = [t.data_ptr() for ts in (ps, gs, ms, vs, births) for t in ts]
        held = torch.tensor(sizes + pointers, dtype=torch.int64)  # rows: sizes, P, G, M, V, B; alive for the call
        addr = [held.data_ptr() + 8 * k * row for row in range(6)]
        self._multi[dtype](k, *addr, table.data_ptr(), table.shape[1], 1 - b1, b2, 1 - b2, eps)

    def per_tensor(self, p, g, m, v, birth, table_row, constants: tuple[float, float, float]) -> None:
        """The per-element form on one tensor (the reference of `__call__`; same checks)."""
        n, (b1, b2, eps) = p.numel(), constants
        if not (p.dtype == g.dtype == m.dtype == v.dtype == table_row.dtype and birth.dtype == torch.uint8
                and n == g.numel() == m.numel() == v.numel() == birth.numel() and birth.is_contiguous()
                and table_row.is_contiguous() and table_row.shape[-1] == 3):
            raise ValueError("native AdamW kernel: tensors of one dtype and size, uint8 births, an (S, 3) table")
        self._single[p.dtype](n, p.data_ptr(), g.data_ptr(), m.data_ptr(), v.data_ptr(), birth.data_ptr(),
                              table_row.data_ptr(), 1 - b1, b2, 1 - b2, eps)


_loaded: NativeAdamW | None = None
_failure: str | None = None


def native_adamw() -> tuple[NativeAdamW | None, str | None]:
    """The kernel, built and loaded once per process, or (None, why not): no C compiler (``$CC``,
    else ``cc``), a failed build or load."""
    global _loaded, _failure
    if _loaded is None and _failure is None:
        cc = os.environ.get("CC") or "cc"
        if shutil.which(cc) is None:
            _failure = f"no C compiler ({cc!r} not found; set CC)"
        else:
            try:
                _loaded = NativeAdamW(_build(cc))
            except (OSError, RuntimeError, subprocess.SubprocessError) as exc:
                _failure = f"building the C kernel failed: {exc}"
    return _loaded, _failure
