"""The per-element AdamW update as a small C kernel for CPU tensors (docs/design.md §6), built with
the system's C compiler on first use and loaded with ctypes: no torch headers, no Python headers,
a build of ~0.1 s, cached on disk by a hash of the source, the flags, the compiler and the CPU.

For an element born at stage s (``birth[i]``, uint8) with its stage's scalars in row s of the
parameter's (S, 3) table ``t`` = (neg_step, bc2_sqrt, decay) (`GrowthAwareAdamW._derived`):

    m <- lerp(m, g, 1 - b1);   v <- b2 v + (1 - b2) g g
    p <- p decay[s] + (neg_step[s] m) / (sqrt(v) / bc2_sqrt[s] + eps)

the eager per-element path's arithmetic, in its order of operations (torch's ``lerp`` formula for
both halves of the weight, ``addcmul`` as ``v + ((1 - b2) g) g``, ``addcdiv`` as ``p + x / d``).
One pass reads p, g, m, v and the birth byte and writes p, m, v, as torch's fused AdamW does (less
the byte). ``-ffp-contract=off`` keeps the compiler from fusing multiply-adds, and without
``-ffast-math`` it does not reassociate: every operation is IEEE-rounded as written, whatever the
vector width ``-march=native`` picks, so a run's numbers do not depend on the machine's SIMD. They
can differ from the eager ops in the last bit where torch's vectorized ``lerp`` uses a fused
multiply-add (``tests/test_optim.py``: within 64 ulp of each tensor's largest entry).

One thread: torch's fused kernel also spreads a large tensor over threads; on a CPU with many
threads for the optimizer, the eager path may be the faster one (``optim.compile=false``).
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
#include <math.h>

#define ADAMW_PER_ELEMENT(NAME, T, SQRT)                                                          \
void NAME(int64_t n, T *restrict p, const T *restrict g, T *restrict m, T *restrict v,           \
          const uint8_t *restrict birth, const T *restrict t, T w1, T b2, T w2, T eps) {          \
    const int low = w1 < (T)0.5; /* torch's lerp: start + w (end - start) for |w| < 0.5 */        \
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
    """The loaded kernels: ``kernel(p, g, m, v, birth, table_row, (b1, b2, eps))`` on contiguous CPU
    tensors of one dtype, float32 or float64 (`supports`); ``table_row`` is the parameter's (S, 3)
    table of stage scalars, ``birth`` its uint8 stages."""

    def __init__(self, lib: Path):
        self._lib = ctypes.CDLL(str(lib))
        self._fns = {}
        for dtype, suffix in ((torch.float32, "f32"), (torch.float64, "f64")):
            fn = getattr(self._lib, f"grow_adamw_per_element_{suffix}")
            fn.restype = None
            fn.argtypes = [ctypes.c_int64] + [ctypes.c_void_p] * 6 + [_C_TYPES[dtype]] * 4
            self._fns[dtype] = fn

    @staticmethod
    def supports(dtype: torch.dtype) -> bool:
        return dtype in _C_TYPES

    def __call__(self, p, g, m, v, birth, table_row, constants: tuple[float, float, float]) -> None:
        """Update ``p``, ``m``, ``v`` in place; ``constants`` = (b1, b2, eps). The caller
        (`GrowthAwareAdamW`) passes contiguous CPU tensors; what a wrong call would corrupt memory
        with is checked here: one dtype, one size, uint8 births, a contiguous (S, 3) table."""
        n, (b1, b2, eps) = p.numel(), constants
        if not (p.dtype == g.dtype == m.dtype == v.dtype == table_row.dtype and birth.dtype == torch.uint8
                and n == g.numel() == m.numel() == v.numel() == birth.numel() and birth.is_contiguous()
                and table_row.is_contiguous() and table_row.shape[-1] == 3):
            raise ValueError("native AdamW kernel: tensors of one dtype and size, uint8 births, an (S, 3) table")
        self._fns[p.dtype](n, p.data_ptr(), g.data_ptr(), m.data_ptr(), v.data_ptr(), birth.data_ptr(),
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
