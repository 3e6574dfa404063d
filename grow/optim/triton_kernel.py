"""The Triton source of `grow.optim.triton_adamw`'s one-launch AdamW pass (docs/optimizer.md "The
growth-aware optimizer"): imported only where Triton is, by `grow.optim.triton_adamw._kernel`, which
loads it once per value of ``TRITON_INTERPRET`` (read by ``triton.jit`` when this module runs)."""

import triton
import triton.language as tl


@triton.jit
def adamw_multi(meta, chunks, table, consts, DTYPE: tl.constexpr, LOW: tl.constexpr, BLOCK: tl.constexpr,
                ALIGNED: tl.constexpr):
    # meta: K, S, the K sizes, then the K addresses of each of p, g, m, v, birth; chunks: (tensor, block);
    # the update of the C kernel's ADAMW_RUN, the stage scalars gathered by birth byte
    ct: tl.constexpr = tl.float64 if DTYPE == tl.float64 else tl.float32  # bfloat16 computes in float32
    pid = tl.program_id(0)
    K, stages = tl.load(meta), tl.load(meta + 1)
    sizes, addresses = meta + 2, meta + 2 + K
    w1, b2, w2, eps = tl.load(consts), tl.load(consts + 1), tl.load(consts + 2), tl.load(consts + 3)
    k = tl.load(chunks + 2 * pid)
    start = tl.load(chunks + 2 * pid + 1) * BLOCK  # a multiple of BLOCK, as the compiler sees
    n = tl.load(sizes + k)
    p_ptr = tl.load(addresses + k).to(tl.pointer_type(DTYPE))
    g_ptr = tl.load(addresses + K + k).to(tl.pointer_type(DTYPE))
    m_ptr = tl.load(addresses + 2 * K + k).to(tl.pointer_type(DTYPE))
    v_ptr = tl.load(addresses + 3 * K + k).to(tl.pointer_type(DTYPE))
    b_ptr = tl.load(addresses + 4 * K + k).to(tl.pointer_type(tl.uint8))
    if ALIGNED:  # every address 16-byte aligned (checked on the host): 128-bit loads and stores
        p_ptr, g_ptr = tl.multiple_of(p_ptr, 16), tl.multiple_of(g_ptr, 16)
        m_ptr, v_ptr, b_ptr = tl.multiple_of(m_ptr, 16), tl.multiple_of(v_ptr, 16), tl.multiple_of(b_ptr, 16)
    offs = start + tl.arange(0, BLOCK)
    mask = offs < n
    full = start + BLOCK <= n  # inside the tensor: no mask, which would split the vector loads
    if full:
        g = tl.load(g_ptr + offs).to(ct)
        mo = tl.load(m_ptr + offs).to(ct)
        v = tl.load(v_ptr + offs).to(ct)
        p = tl.load(p_ptr + offs).to(ct)
        birth = tl.load(b_ptr + offs).to(tl.int64)
    else:  # the tensor's last, partial block
        g = tl.load(g_ptr + offs, mask=mask, other=0.0).to(ct)
        mo = tl.load(m_ptr + offs, mask=mask, other=0.0).to(ct)
        v = tl.load(v_ptr + offs, mask=mask, other=0.0).to(ct)
        p = tl.load(p_ptr + offs, mask=mask, other=0.0).to(ct)
        birth = tl.load(b_ptr + offs, mask=mask, other=0).to(tl.int64)
    row = table + (k * stages + birth) * 3
    neg_step, bc2_sqrt, decay = tl.load(row), tl.load(row + 1), tl.load(row + 2)  # a few bytes: cached on chip
    if LOW:  # torch's lerp: start + w (end - start) for |w| < 0.5, else end - (end - start)(1 - w)
        mi = mo + w1 * (g - mo)
    else:
        mi = g - (g - mo) * (1.0 - w1)
    vi = v * b2 + w2 * g * g
    if ct == tl.float64:  # float64's division and square root are IEEE-rounded as they are
        p = p * decay + (mi * neg_step) / (tl.sqrt(vi) / bc2_sqrt + eps)
    else:  # float32's default ones are approximate: the rounded ones by name
        p = p * decay + tl.math.div_rn(mi * neg_step, tl.math.div_rn(tl.sqrt_rn(vi), bc2_sqrt) + eps)
    if full:
        tl.store(m_ptr + offs, mi.to(DTYPE))
        tl.store(v_ptr + offs, vi.to(DTYPE))
        tl.store(p_ptr + offs, p.to(DTYPE))
    else:
        tl.store(m_ptr + offs, mi.to(DTYPE), mask=mask)
        tl.store(v_ptr + offs, vi.to(DTYPE), mask=mask)
        tl.store(p_ptr + offs, p.to(DTYPE), mask=mask)
