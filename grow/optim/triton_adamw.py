"""The per-element AdamW update of every mixed tensor in one Triton kernel launch (docs/optimizer.md
"The growth-aware optimizer"): the route of `grow.optim.adamw.GrowthAwareAdamW` with ``compile=True``
on CUDA where Triton imports. The C kernel's arithmetic (`grow.optim.native`) with IEEE division and
square root and no FMA (`FP_FUSION`): its bits in float32/float64; bfloat16 computed in float32 and
rounded once. One launch covers every block of every tensor (a (tensor, block) table built on the
device), compiled once per dtype and alignment, never per growth; a block inside its tensor takes
unmasked 128-bit loads where every address is 16-byte aligned. ``TRITON_INTERPRET=1`` runs it on CPU
tensors (the tests); the source is `grow.optim.triton_kernel`.
"""

from __future__ import annotations

import os

import torch

BLOCK = 1024
FP_FUSION = False  # the FMA policy: never contract a * b + c (the C pass's bits; a memory-bound pass pays nothing for it)
ALIGN = 16  # bytes: what a 128-bit load needs
DTYPES = (torch.float32, torch.float64, torch.bfloat16)  # the parameters' dtypes it takes
_kernels: dict[bool, object] = {}
_chunks: dict[tuple, torch.Tensor] = {}
_consts: dict[tuple, torch.Tensor] = {}


def available() -> tuple[bool, str | None]:
    """Whether Triton imports here, else why not."""
    try:
        import triton  # noqa: F401
    except ImportError as exc:  # torch's CPU wheels come without it
        return False, f"triton does not import ({exc})"
    return True, None


def scalar_dtype(dtype: torch.dtype) -> torch.dtype:
    """The dtype of the stage table and the arithmetic for parameters of ``dtype``."""
    return torch.float64 if dtype == torch.float64 else torch.float32


def _kernel():
    """The jitted kernel, built on first use (``TRITON_INTERPRET`` is read when it is built)."""
    interpret = os.environ.get("TRITON_INTERPRET", "0") == "1"
    if interpret in _kernels:
        return _kernels[interpret]
    import importlib.util

    path = os.path.join(os.path.dirname(__file__), "triton_kernel.py")  # its own copy per mode: @triton.jit reads it
    spec = importlib.util.spec_from_file_location(f"grow.optim.triton_kernel_{int(interpret)}", path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    _kernels[interpret] = module.adamw_multi
    return module.adamw_multi


def chunk_table(sizes: tuple[int, ...], device: torch.device) -> torch.Tensor:
    """(tensor, block) of every BLOCK-element block of every tensor, (blocks, 2) int64, built on ``device``
    (a repeat of each tensor's index by its block count: no Python loop over the blocks, no host sync);
    cached per list of sizes (a growth changes them, a step does not)."""
    key = (sizes, str(device))
    chunks = _chunks.get(key)
    if chunks is None:
        counts = [-(-n // BLOCK) for n in sizes]
        total = sum(counts)  # host integers: the output size, so repeat_interleave never reads the device
        counts_d = torch.tensor(counts, dtype=torch.int64).to(device)
        tensor = torch.repeat_interleave(torch.arange(len(sizes), device=device), counts_d, output_size=total)
        first = torch.cumsum(counts_d, 0) - counts_d  # each tensor's first row
        block = torch.arange(total, device=device) - first[tensor]
        if len(_chunks) > 8:  # the sizes of earlier stages are not coming back
            _chunks.clear()
        chunks = _chunks[key] = torch.stack([tensor, block], dim=1).contiguous()
    return chunks


def adamw_multi_tensor(ps, gs, ms, vs, births, table: torch.Tensor, constants: tuple[float, float, float]) -> None:
    """Update every ``ps[k]``, ``ms[k]``, ``vs[k]`` in place in one launch; every tensor contiguous, of one
    dtype of `DTYPES`, ``births`` uint8; ``table`` (K, S, 3) on their device in ``scalar_dtype`` of theirs;
    ``constants`` = (b1, b2, eps)."""
    import triton.language as tl

    b1, b2, eps = constants
    dtype, device, k = ps[0].dtype, table.device, len(ps)
    sizes, u8, aligned = [], torch.uint8, True
    if dtype not in DTYPES or table.dtype != scalar_dtype(dtype):
        raise ValueError(f"triton AdamW kernel: {dtype} parameters with a {table.dtype} table")
    for p, g, m, v, birth in zip(ps, gs, ms, vs, births):  # a tight loop: it runs at every step
        n = p.numel()
        if not (p.dtype is dtype and g.dtype is dtype and m.dtype is dtype and v.dtype is dtype and birth.dtype is u8
                and g.numel() == n and m.numel() == n and v.numel() == n and birth.numel() == n
                and p.is_contiguous() and g.is_contiguous() and m.is_contiguous() and v.is_contiguous()
                and birth.is_contiguous()):
            raise ValueError("triton AdamW kernel: contiguous tensors of one dtype and size, uint8 births")
        sizes.append(n)
    sizes = tuple(sizes)
    addresses = [t.data_ptr() for ts in (ps, gs, ms, vs, births) for t in ts]
    aligned = all(a % ALIGN == 0 for a in addresses)  # views at odd offsets: the scalar loads
    host = torch.tensor([k, table.shape[1], *sizes, *addresses], dtype=torch.int64)
    if device.type == "cuda":  # pinned and non-blocking: no host sync
        host = host.pin_memory()
    meta = host.to(device, non_blocking=True)
    chunks = chunk_table(sizes, device)
    key = (b1, b2, eps, str(device), table.dtype)
    if key not in _consts:  # in the arithmetic's dtype: a Python float would reach the kernel as float32
        _consts[key] = torch.tensor([1 - b1, b2, 1 - b2, eps], dtype=torch.float64).to(device, table.dtype)
    tl_dtype = {torch.float32: tl.float32, torch.float64: tl.float64, torch.bfloat16: tl.bfloat16}[dtype]
    _kernel()[(chunks.shape[0],)](
        meta, chunks, table.contiguous(), _consts[key], DTYPE=tl_dtype, LOW=(1 - b1) < 0.5, BLOCK=BLOCK,
        ALIGNED=aligned, enable_fp_fusion=FP_FUSION)
