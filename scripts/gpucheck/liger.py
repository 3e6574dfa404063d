"""liger-kernel's Triton kernels for the Llama family against grow's own, forward and backward on a GPU
(bf16): the fused linear cross-entropy against grow's chunked loss (`grow.model.linear_cross_entropy`),
RMSNorm, SwiGLU's silu(a) * b and rotary, each against grow's op eager and under torch.compile (the
training run compiles the model). Per kernel: milliseconds, grow's / liger's time, and the largest
difference of outputs and input gradients relative to the largest entry (bf16 rounding: <= 1e-2).
Skipped with the reason where there is no CUDA device or ``liger_kernel`` does not import (the
optional extra ``pip install -e .[gpu]``)."""

from __future__ import annotations

import statistics
import time

import torch
import torch.nn.functional as F

AGREE = 1e-2  # bf16 keeps 8 bits: a relative difference within a few of its roundings


def _time_ms(fn, reps: int = 10, warmup: int = 3) -> float:
    out = []
    for i in range(warmup + reps):
        torch.cuda.synchronize()
        t0 = time.perf_counter()
        fn()
        torch.cuda.synchronize()
        if i >= warmup:
            out.append((time.perf_counter() - t0) * 1e3)
    return statistics.median(out)


def _fwd_bwd(fn, inputs):
    """``fn(*inputs)`` and the gradients of its sum-with-a-fixed-weight by the inputs."""
    leaves = [t.detach().clone().requires_grad_(t.is_floating_point()) for t in inputs]
    out = fn(*leaves)
    weight = torch.ones_like(out) if out.dim() == 0 else torch.linspace(-1, 1, out.numel(), device=out.device).view_as(out)
    (out.float() * weight.float()).sum().backward()
    return [out.detach().float(), *(t.grad.float() for t in leaves if t.grad is not None)]


def _compare(ours, theirs, inputs, compiled=None) -> dict:
    """grow's op (eager, and ``compiled``) against liger's on the same inputs; an error is recorded, so
    one kernel's API change does not lose the others' figures."""
    try:
        return _measure(ours, theirs, inputs, compiled)
    except Exception as exc:  # noqa: BLE001 - recorded in the JSON
        return {"error": f"{type(exc).__name__}: {str(exc)[:300]}"}


def _measure(ours, theirs, inputs, compiled) -> dict:
    a, b = _fwd_bwd(ours, inputs), _fwd_bwd(theirs, inputs)
    diff = max(float((x - y).abs().max() / y.abs().max().clamp_min(1e-30)) for x, y in zip(a, b))
    row = {"grow_ms": _time_ms(lambda: _fwd_bwd(ours, inputs)), "liger_ms": _time_ms(lambda: _fwd_bwd(theirs, inputs)),
           "max_rel_diff": diff, "agree": diff <= AGREE}
    if compiled is not None:
        row["grow_compiled_ms"] = _time_ms(lambda: _fwd_bwd(compiled, inputs))
    best = min(row["grow_ms"], row.get("grow_compiled_ms", float("inf")))
    row["grow_over_liger"] = best / row["liger_ms"]
    return row


def check_liger(gpu: bool, tokens: int = 8192, h: int = 768, vocab: int = 16384, p: int = 2048, heads: int = 12,
                kv_heads: int = 4, k: int = 64, eps: float = 1e-5) -> dict:
    """Each kernel at llama-124m's shapes (``tokens`` rows of 1024 positions)."""
    if not gpu:
        return {"skipped": "no CUDA device (liger-kernel's kernels are Triton kernels for a GPU)"}
    try:
        from liger_kernel.ops.swiglu import LigerSiLUMulFunction
        from liger_kernel.transformers import LigerFusedLinearCrossEntropyLoss, LigerRMSNorm
        from liger_kernel.transformers.rope import liger_rotary_pos_emb
    except ImportError as exc:
        return {"skipped": f"liger_kernel does not import ({exc}); pip install -e '.[gpu]'"}
    import liger_kernel

    from grow.model import RMSNorm, linear_cross_entropy, rope_table, rotate

    dev, bf = torch.device("cuda"), torch.bfloat16
    g = torch.Generator(device=dev).manual_seed(0)
    rand = lambda *shape, dtype=bf: torch.randn(*shape, generator=g, device=dev, dtype=dtype)
    out = {"version": getattr(liger_kernel, "__version__", None), "agree_limit": AGREE}

    x, w = rand(tokens, h, dtype=torch.float32), rand(vocab, h, dtype=torch.float32) * 0.02
    y = torch.randint(0, vocab, (tokens,), generator=g, device=dev)
    flce = LigerFusedLinearCrossEntropyLoss()

    def ours_ce(x, w):
        with torch.autocast("cuda", dtype=bf):
            return linear_cross_entropy(x, w, y)

    out["fused_linear_cross_entropy"] = _compare(ours_ce, lambda x, w: flce(w.to(bf), x.to(bf), y), [x, w])

    norm, liger_norm = RMSNorm(h, eps).to(dev, bf), LigerRMSNorm(h, eps=eps / h).to(dev, bf)  # grow's eps is on the sum
    out["rms_norm"] = _compare(norm, liger_norm, [rand(tokens, h)], torch.compile(norm))

    swiglu = lambda a, b: F.silu(a) * b
    out["swiglu"] = _compare(swiglu, LigerSiLUMulFunction.apply, [rand(tokens, p), rand(tokens, p)],
                             torch.compile(swiglu))

    T, B = 1024, max(1, tokens // 1024)
    cos, sin = rope_table(T, k, 10000.0, dev, bf)
    ours_rope = lambda q, kk: torch.cat([rotate(q, cos, sin), rotate(kk, cos, sin)], dim=1)
    theirs_rope = lambda q, kk: torch.cat(liger_rotary_pos_emb(q.clone(), kk.clone(), cos[None], sin[None]), dim=1)  # it may work in place
    out["rotary"] = _compare(ours_rope, theirs_rope, [rand(B, heads, T, k), rand(B, kv_heads, T, k)],
                             torch.compile(ours_rope))
    return out
