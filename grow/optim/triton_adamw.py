"""The per-element AdamW update of every mixed tensor in one Triton kernel launch (docs/design.md §6):
the route of `grow.optim.adamw.GrowthAwareAdamW` with ``compile=True`` on a CUDA device where Triton
imports; on a CPU the C kernel of `grow.optim.native` takes it.

The arithmetic is the C kernel's, element by element, with IEEE-rounded square root and divisions
(``sqrt_rn``, ``div_rn``), so results agree with the CPU's to float rounding (the GPU compiler may
fuse a multiply and an add). One launch covers every block of every tensor (addresses in one int64
table), compiled once per dtype, so a growth compiles nothing. ``TRITON_INTERPRET=1`` runs it on
CPU tensors (the tests).
"""

from __future__ import annotations

import os

import torch

BLOCK = 1024
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


def _kernel():
    """The jitted kernel, built on first use (``TRITON_INTERPRET`` is read when it is built)."""
    interpret = os.environ.get("TRITON_INTERPRET", "0") == "1"
    if interpret in _kernels:
        return _kernels[interpret]
    import triton
    import triton.language as tl

    @triton.jit
    def adamw_multi(meta, chunks, table, consts, DTYPE: tl.constexpr, LOW: tl.constexpr, BLOCK: tl.constexpr):
        # meta: K, S, the K sizes, then the K addresses of each of p, g, m, v, birth
        pid = tl.program_id(0)
        K, stages = tl.load(meta), tl.load(meta + 1)
        sizes, addresses = meta + 2, meta + 2 + K
        w1, b2, w2, eps = tl.load(consts), tl.load(consts + 1), tl.load(consts + 2), tl.load(consts + 3)
        k = tl.load(chunks + 2 * pid)
        start = tl.load(chunks + 2 * pid + 1)
        n = tl.load(sizes + k)
        p_ptr = tl.load(addresses + k).to(tl.pointer_type(DTYPE))
        g_ptr = tl.load(addresses + K + k).to(tl.pointer_type(DTYPE))
        m_ptr = tl.load(addresses + 2 * K + k).to(tl.pointer_type(DTYPE))
        v_ptr = tl.load(addresses + 3 * K + k).to(tl.pointer_type(DTYPE))
        b_ptr = tl.load(addresses + 4 * K + k).to(tl.pointer_type(tl.uint8))
        offs = start + tl.arange(0, BLOCK)
        mask = offs < n
        g = tl.load(g_ptr + offs, mask=mask, other=0.0)
        mo = tl.load(m_ptr + offs, mask=mask, other=0.0)
        v = tl.load(v_ptr + offs, mask=mask, other=0.0)
        p = tl.load(p_ptr + offs, mask=mask, other=0.0)
        row = table + (k * stages + tl.load(b_ptr + offs, mask=mask, other=0).to(tl.int64)) * 3
        neg_step = tl.load(row, mask=mask, other=0.0)
        bc2_sqrt = tl.load(row + 1, mask=mask, other=1.0)
        decay = tl.load(row + 2, mask=mask, other=1.0)
        if LOW:  # torch's lerp: start + w (end - start) for |w| < 0.5, else end - (end - start)(1 - w)
            mi = mo + w1 * (g - mo)
        else:
            mi = g - (g - mo) * (1.0 - w1)
        vi = v * b2 + w2 * g * g
        if DTYPE == tl.float64:  # float64's division and square root are IEEE-rounded as they are
            p = p * decay + (mi * neg_step) / (tl.sqrt(vi) / bc2_sqrt + eps)
        else:  # float32's default ones are approximate: the rounded ones by name
            p = p * decay + tl.math.div_rn(mi * neg_step, tl.math.div_rn(tl.sqrt_rn(vi), bc2_sqrt) + eps)
        tl.store(m_ptr + offs, mi, mask=mask)
        tl.store(v_ptr + offs, vi, mask=mask)
        tl.store(p_ptr + offs, p, mask=mask)

    _kernels[interpret] = adamw_multi
    return adamw_multi


def _chunk_table(sizes: tuple[int, ...], device: torch.device) -> torch.Tensor:
    """(tensor, first element) of every block, on the device; cached per list of sizes (a growth
    changes them, a step does not)."""
    key = (sizes, str(device))
    chunks = _chunks.get(key)
    if chunks is None:
        rows = [(k, start) for k, n in enumerate(sizes) for start in range(0, n, BLOCK)]
        if len(_chunks) > 8:  # the sizes of earlier stages are not coming back
            _chunks.clear()
        chunks = _chunks[key] = torch.tensor(rows, dtype=torch.int64).to(device)
    return chunks


def adamw_multi_tensor(ps, gs, ms, vs, births, table: torch.Tensor, constants: tuple[float, float, float]) -> None:
    """Update every ``ps[k]``, ``ms[k]``, ``vs[k]`` in place in one launch; ``table`` (K, S, 3) on
    their device in their dtype (float32 or float64), ``births`` uint8, every tensor contiguous;
    ``constants`` = (b1, b2, eps)."""
    import triton.language as tl

    b1, b2, eps = constants
    dtype, device, k = table.dtype, table.device, len(ps)
    sizes, u8 = [], torch.uint8
    for p, g, m, v, birth in zip(ps, gs, ms, vs, births):  # a tight loop: it runs at every step
        n = p.numel()
        if not (p.dtype is dtype and g.dtype is dtype and m.dtype is dtype and v.dtype is dtype and birth.dtype is u8
                and g.numel() == n and m.numel() == n and v.numel() == n and birth.numel() == n
                and p.is_contiguous() and g.is_contiguous() and m.is_contiguous() and v.is_contiguous()
                and birth.is_contiguous()):
            raise ValueError("triton AdamW kernel: contiguous tensors of one dtype and size, uint8 births")
        sizes.append(n)
    sizes = tuple(sizes)
    host = torch.tensor([k, table.shape[1], *sizes, *(t.data_ptr() for ts in (ps, gs, ms, vs, births) for t in ts)],
                        dtype=torch.int64)
    if device.type == "cuda":  # pinned and non-blocking: no host sync
        host = host.pin_memory()
    meta = host.to(device, non_blocking=True)
    chunks = _chunk_table(sizes, device)
    key = (b1, b2, eps, str(device), dtype)
    if key not in _consts:  # in the tensors' dtype: a Python float would reach the kernel as float32
        _consts[key] = torch.tensor([1 - b1, b2, 1 - b2, eps], dtype=torch.float64).to(device, dtype)
    _kernel()[(chunks.shape[0],)](
        meta, chunks, table.contiguous(), _consts[key], DTYPE={torch.float32: tl.float32, torch.float64: tl.float64}[dtype],
        LOW=(1 - b1) < 0.5, BLOCK=BLOCK)
