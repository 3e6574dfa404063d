"""The per-element AdamW update in one torch.compile pass (docs/optimizer.md), for tensors whose
elements belong to several stages, where neither the C kernel (`grow.optim.native`, CPU) nor the
Triton kernel (`grow.optim.triton_adamw`, CUDA) applies or works. Compiled once per (device, dtype,
number of stages) with flat tensors (``dynamic=True``); a growth adds a stage and the next step
compiles again.
"""

from __future__ import annotations

import types

import torch


def _pick(birth: torch.Tensor, table: torch.Tensor, col: int) -> torch.Tensor:
    """``table[birth, col]`` as a chain of selects over the table's rows (S is static)."""
    out = table[-1, col]
    for s in range(table.shape[0] - 2, -1, -1):
        out = torch.where(birth == s, table[s, col], out)
    return out


def adamw_per_element_(p: torch.Tensor, g: torch.Tensor, m: torch.Tensor, v: torch.Tensor, birth: torch.Tensor,
                       table: torch.Tensor, consts: torch.Tensor) -> None:
    """One AdamW update of flat ``p``, ``m``, ``v`` (in place) with per-element stage scalars (module
    docstring). ``birth`` is the flat uint8 stage of each element; ``table`` (S, 3) and ``consts``
    = (1 - b1, b2, 1 - b2, eps) on p's device, in the table's dtype. The constants come as a tensor,
    not as Python floats: a float is compiled into the kernel, and torch's on-disk compile cache
    was seen to serve a kernel compiled for other betas (a wrong update, silently)."""
    b = birth.to(table.dtype)  # compare in the table's precision: a uint8 mask does not vectorize
    m.lerp_(g, consts[0])
    v.mul_(consts[1]).add_(g * g * consts[2])
    neg_step, bc2_sqrt, decay = _pick(b, table, 0), _pick(b, table, 1), _pick(b, table, 2)
    denom = v.sqrt() / bc2_sqrt + consts[3]
    p.mul_(decay).addcdiv_(m * neg_step, denom)


_compiled: dict[int, object] = {}


def compiled_adamw_per_element(stages: int):
    """``f(p, g, m, v, birth, table, consts)``: `adamw_per_element_` for a table of ``stages`` rows
    under ``torch.compile`` (built on first use: importing this module compiles nothing). Each
    number of stages gets its own copy of the function's code object, hence its own compile cache:
    torch.compile caps the recompilations of one code object (8), which a run of many stages, or a
    process that trains several runs, would otherwise exhaust."""
    if stages not in _compiled:
        code = adamw_per_element_.__code__.replace(co_name=f"adamw_per_element_{stages}_stages")
        fn = types.FunctionType(code, adamw_per_element_.__globals__, code.co_name)
        _compiled[stages] = torch.compile(fn, dynamic=True, fullgraph=True)
    return _compiled[stages]
