"""What code and machine made a run: the package version, the git commit of a checkout, torch's
version, and the CPU (and GPU) it ran on.

``summary.json`` keeps it under ``code`` and a report names every version its runs came from, so a
sweep whose arms were trained by two versions of the code says so (a change that only reorders float32
sums, such as the loss path's chunking, already makes two runs of one seed differ in their last bits).
A wheel installed from PyPI or a copy without ``.git`` has no commit: ``commit`` is then null."""

from __future__ import annotations

import functools
import platform
import subprocess
from pathlib import Path

import torch

import grow

CHECKOUT = Path(grow.__file__).resolve().parent.parent


def _git(*args: str) -> str | None:
    try:
        out = subprocess.run(["git", "-C", str(CHECKOUT), *args], capture_output=True, text=True, timeout=10)
    except (OSError, subprocess.TimeoutExpired):
        return None
    return out.stdout.strip() if out.returncode == 0 else None


@functools.lru_cache(maxsize=1)
def code_version() -> dict:
    """``{"version", "commit", "dirty", "torch"}``: ``commit`` the HEAD of the checkout ``grow`` is
    imported from (null outside one), ``dirty`` whether tracked files differ from it (null likewise)."""
    inside = _git("rev-parse", "--show-toplevel")
    commit = _git("rev-parse", "HEAD") if inside and Path(inside).resolve() == CHECKOUT else None
    status = _git("status", "--porcelain", "--untracked-files=no") if commit else None
    return {"version": grow.__version__, "commit": commit, "dirty": None if status is None else bool(status),
            "torch": torch.__version__}


def describe(code: dict | None) -> str:
    """One line: ``grow 0.1.0 at 2dd7727 (torch 2.13.0)``, ``+ uncommitted changes`` where dirty;
    ``not recorded`` for a run from before the ``code`` entry."""
    if not code:
        return "not recorded"
    at = f" at {code['commit'][:7]}" + (" + uncommitted changes" if code.get("dirty") else "") if code.get("commit") else ""
    return f"grow {code.get('version')}{at} (torch {code.get('torch')})"


SIMD_LEVELS = ("avx512f", "avx2", "avx", "sse4_2", "sve", "asimd", "neon")  # best first, as /proc/cpuinfo names them


def cpu_info() -> dict:
    """The host CPU: model name, the best SIMD level its flags list (``SIMD_LEVELS``: avx512f, avx2,
    ... on x86-64; sve, asimd/neon on ARM), whether it has FMA, and torch's CPU capability (the
    kernels ATen picked: AVX512, AVX2, DEFAULT, SVE256, ...). The optimizer and step figures depend
    on all of them (docs/bench.md)."""
    name, flags = platform.processor() or platform.machine(), set()
    try:
        lines = open("/proc/cpuinfo").read().splitlines()
    except OSError:
        lines = []
    for ln in lines:
        key, _, value = ln.partition(":")
        if key.strip() in ("model name", "Model") and value.strip():
            name = value.strip()
        elif key.strip() in ("flags", "Features") and not flags:
            flags = set(value.split())
    try:
        capability = torch.backends.cpu.get_cpu_capability()
    except (AttributeError, RuntimeError):
        capability = None
    return {"model": name, "simd": next((s for s in SIMD_LEVELS if s in flags), None), "fma": "fma" in flags,
            "torch_capability": capability, "arch": platform.machine()}


@functools.lru_cache(maxsize=1)
def machine() -> dict:
    """summary.json's ``machine``: the CPU (`cpu_info`) and, where CUDA is available, the GPU's name. Float
    results differ in their last bits between CPUs, and wall-clock figures between machines."""
    gpu = torch.cuda.get_device_name() if torch.cuda.is_available() else None
    return {"cpu": cpu_info(), "gpu": gpu}


def describe_machine(m: dict | None) -> str:
    """One line: ``AMD EPYC (avx2, torch AVX2)``, the GPU first where there is one; ``not recorded``."""
    if not m:
        return "not recorded"
    cpu = m.get("cpu") or {}
    text = f"{cpu.get('model')} ({cpu.get('simd')}, torch {cpu.get('torch_capability')})"
    return f"{m['gpu']} on {text}" if m.get("gpu") else text
