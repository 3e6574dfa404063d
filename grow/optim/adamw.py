"""AdamW for growing models: the update rule on top of `grow.optim.bookkeeping` (docs/optimizer.md).

Adam's bias corrections of an element use the step count of its birth stage (Yuan et al., NeurIPS
2023, Appendix C, Table 9). Uniform tensors go to torch's fused or foreach AdamW; tensors mixing
stages to `GrowthAwareAdamW._mixed_update`: eager ops, or with ``compile=True`` one pass (the C
kernel of `grow.optim.native` on a CPU, `grow.optim.triton_adamw` on CUDA, else `grow.optim.compiled`).
"""

from __future__ import annotations

import warnings
from collections import Counter
from collections.abc import Mapping

import torch

from grow.optim.bookkeeping import GrowthAware, MixedBatch, check_hyperparameter
from grow.optim.compiled import compiled_adamw_per_element
from grow.optim.native import NativeAdamW, native_adamw
from grow.optim.triton_adamw import DTYPES as TRITON_DTYPES
from grow.optim.triton_adamw import adamw_multi_tensor
from grow.optim.triton_adamw import available as triton_available

_said: set[str] = set()
CPU_ONE_PASS = "native"  # the one-pass route on a CPU; "triton" (CUDA's) and "torch.compile" (other devices') run there in tests
_triton_failed: list[str] = []  # why the Triton kernel failed in this process, once it has


def _say_once(message: str) -> None:
    """A RuntimeWarning, once per process per message (a missing C compiler is not news each step)."""
    if message not in _said:
        _said.add(message)
        warnings.warn(message, RuntimeWarning, stacklevel=3)


class GrowthAwareAdamW(GrowthAware):
    """AdamW with per-element birth stages and per-stage step counts (see the module docstring).

    ``GrowthAwareAdamW(model.named_parameters(), lr=1e-3, betas=(0.9, 0.999), eps=1e-8,
    weight_decay=0.01, new_warmup_steps=0, fused=None, compile=False)``. ``fused=None``: torch's fused
    AdamW kernel on CUDA and CPU where this torch has it (else foreach ops, silently); ``True``: the
    fused kernel, an error where it is missing; ``False``: foreach ops (bitwise torch's
    foreach/for-loop AdamW on CPU). ``compile=True``: tensors with elements of several stages take
    one pass instead of about nine eager ones, all of them at once: on a CPU a C kernel
    (`grow.optim.native`, built once), on CUDA a Triton kernel (`grow.optim.triton_adamw`, compiled
    once), elsewhere torch.compile per tensor (`grow.optim.compiled`, compiled again when a growth
    adds a stage). Without growth the update is torch.optim.AdamW's with weight decay on the
    ``dim >= 2`` parameters only.
    """

    kind = "adamw"
    mixed_by_decay = False  # the decay is a column of the stage table: one pass over both groups
    _buffer_powers = {"exp_avg": 1, "exp_avg_sq": 2}  # units: gradient, gradient^2

    def __init__(self, named_params, lr: float = 1e-3, betas=(0.9, 0.999), eps: float = 1e-8,
                 weight_decay: float = 0.01, *, new_warmup_steps: int = 0, fused: bool | None = None,
                 compile: bool = False):
        if compile not in (True, False):
            raise ValueError(f"compile={compile!r}: must be true or false")
        self.compile = bool(compile)  # how the update runs, not what it computes: not in the state dict
        # mixed tensors updated per route ("triton", "native", "torch.compile", "eager"), summed over steps:
        # a fallback shows here (the GPU tests fail on it), not only in a warning said once
        self.routes: Counter = Counter()
        self._consts: dict[tuple, torch.Tensor] = {}  # the compiled pass's (1 - b1, b2, 1 - b2, eps) on a device
        self.set_hyperparameters({"betas": betas, "eps": eps, "fused": fused})
        super().__init__(named_params, lr=lr, weight_decay=weight_decay, new_warmup_steps=new_warmup_steps)

    def set_hyperparameters(self, h: Mapping) -> None:
        betas = h["betas"]
        if not (isinstance(betas, (tuple, list)) and len(betas) == 2):
            raise ValueError(f"betas={betas!r}: must be two numbers in [0, 1)")
        b1 = check_hyperparameter("betas[0]", betas[0], 0.0, 1.0, hi_open=True)
        b2 = check_hyperparameter("betas[1]", betas[1], 0.0, 1.0, hi_open=True)
        self.betas = (b1, b2)
        self.eps = check_hyperparameter("eps", h["eps"], 0.0)
        fused = h.get("fused")
        if fused not in (None, True, False):
            raise ValueError(f"fused={fused!r}: must be None (auto), True or False")
        self.fused = fused
        self._fused_ok: dict[str, bool] = {}
        if "weight_decay" in h:
            self.weight_decay = check_hyperparameter("weight_decay", h["weight_decay"], 0.0)
        if "new_warmup_steps" in h:
            self.new_warmup_steps = int(h["new_warmup_steps"])

    def hyperparameters(self) -> dict:
        return {"betas": list(self.betas), "eps": self.eps, "weight_decay": self.weight_decay,
                "new_warmup_steps": self.new_warmup_steps, "fused": self.fused}

    def _derived(self, s: int, scale: float, decays: bool) -> tuple[float, float, float]:
        n = self.stage_steps[s]
        b1, b2 = self.betas
        a = self.lr * scale
        decay = 1 - a * self.weight_decay if decays else 1.0
        # as torch's AdamW: step_size = lr / (1 - b1^n), denominator sqrt(v) / sqrt(1 - b2^n) + eps
        return ((a / (1 - b1 ** n)) * -1, (1 - b2 ** n) ** 0.5, decay)

    def _try_fused(self, ps, gs, ms, vs, lr_eff: float, n: int, decays: bool) -> bool:
        """torch's fused AdamW kernel on a uniform group; False where it is off or unavailable."""
        dev = ps[0].device.type
        if self.fused is False or (self.fused is None and dev not in ("cuda", "cpu")) \
                or not hasattr(torch, "_fused_adamw_") or not self._fused_ok.get(dev, True):
            return False
        b1, b2 = self.betas
        step = torch.full((), float(n), dtype=torch.float32, device=ps[0].device)
        try:
            torch._fused_adamw_(ps, gs, ms, vs, [], [step] * len(ps), lr=lr_eff, beta1=b1, beta2=b2,
                                weight_decay=self.weight_decay if decays else 0.0, eps=self.eps, amsgrad=False,
                                maximize=False, grad_scale=None, found_inf=None)
        except (RuntimeError, NotImplementedError):
            if self.fused:
                raise
            self._fused_ok[dev] = False  # e.g. torch < 2.4 has no CPU kernel: foreach from now on
            return False
        return True

    def _uniform_update(self, names, derived, lr_eff, n, decays) -> None:
        neg_step, bc2_sqrt, decay = derived
        b1, b2 = self.betas
        ps, gs, (ms, vs) = self._lists(names)
        if self._try_fused(ps, gs, ms, vs, lr_eff, n, decays):
            return
        if decays and decay != 1.0:
            torch._foreach_mul_(ps, decay)
        torch._foreach_lerp_(ms, gs, 1 - b1)
        torch._foreach_mul_(vs, b2)
        torch._foreach_addcmul_(vs, gs, gs, 1 - b2)
        denom = torch._foreach_sqrt(vs)
        torch._foreach_div_(denom, bc2_sqrt)
        torch._foreach_add_(denom, self.eps)
        torch._foreach_addcdiv_(ps, ms, denom, neg_step)

    def _mixed_update(self, names, mixed: MixedBatch, decays) -> None:
        """Elements of different stages in one tensor, decayed or not (``decays`` is None: the
        table's decay column, 1.0 where a tensor has none). With ``compile``, one pass over all the
        contiguous tensors (`_one_pass_update`). Otherwise eager ops: the moments by foreach ops (they do not
        depend on the stage), then per tensor ``p * decay + (neg_step m) / (sqrt(v) / bc2 + eps)``
        with each scalar that differs between its stages as a tensor gathered by birth stage. The
        arithmetic is the foreach path's, element by element (``addcdiv(p, m, d, value=s)`` computes
        ``p + (s m) / d``), so an element's update does not depend on which path its tensor took."""
        b1, b2 = self.betas
        ps, gs, (ms, vs) = self._lists(names)
        done = 0
        if self.compile and all(t.is_contiguous() for t in (*ps, *gs, *ms, *vs)):
            done = self._one_pass_update(names, mixed)
            if done == len(names):
                return
        self.routes["eager"] += len(names) - done
        ps, gs, ms, vs = ps[done:], gs[done:], ms[done:], vs[done:]
        torch._foreach_lerp_(ms, gs, 1 - b1)
        torch._foreach_mul_(vs, b2)
        torch._foreach_addcmul_(vs, gs, gs, 1 - b2)
        for p, m, v, (neg_step, bc2_sqrt, decay) in zip(ps, ms, vs, mixed.gathered()[done:]):
            if isinstance(decay, torch.Tensor) or decay != 1.0:  # 1.0: no decay (dim < 2), or none left in float
                p.mul_(decay)
            denom = v.sqrt().div_(bc2_sqrt).add_(self.eps)
            if isinstance(neg_step, torch.Tensor):
                p.addcdiv_(m * neg_step, denom)
            else:
                p.addcdiv_(m, denom, value=neg_step)

    def _one_pass_update(self, names, mixed: MixedBatch) -> int:
        """One pass over the mixed tensors; the number of tensors updated (the rest go the eager
        way). CPU: the C kernel of `grow.optim.native`, all tensors in one call (float32/float64;
        without a C compiler, or for another dtype, the eager path, said once); CUDA: the Triton
        kernel of `grow.optim.triton_adamw`, all tensors in one launch; where Triton is missing or
        fails, and on other devices, `_compiled_update` (torch.compile, one pass per tensor)."""
        p0 = self.params[names[0]]
        route = CPU_ONE_PASS if p0.device.type == "cpu" else "triton" if p0.device.type == "cuda" else "torch.compile"
        one_dtype = all(self.params[n].grad.dtype == p0.dtype for n in names)  # the kernels take one dtype
        if route == "triton":
            return self._triton_update(names, mixed, one_dtype) or self._compiled_update(names, mixed)
        if route == "torch.compile":
            return self._compiled_update(names, mixed)
        kernel, why = native_adamw()
        if kernel is None or not NativeAdamW.supports(p0.dtype) or not one_dtype:
            _say_once(f"optim.compile: {why or f'no C kernel for {p0.dtype} (or gradients of another dtype)'}: "
                      f"the eager per-element update")
            return 0
        ps, gs, (ms, vs) = self._lists(names)
        kernel(ps, gs, ms, vs, [self.birth[n] for n in names], mixed.table, (*self.betas, self.eps))
        self.routes["native"] += len(names)
        return len(names)

    def _triton_update(self, names, mixed: MixedBatch, one_dtype: bool) -> int:
        """Every tensor in one Triton launch; 0 (said once) where Triton does not import, for a
        dtype other than float32, float64 and bfloat16, or once it has failed in this process."""
        dtype = self.params[names[0]].dtype
        ok, why = triton_available()
        if ok and (dtype not in TRITON_DTYPES or not one_dtype):
            ok, why = False, f"no Triton kernel for {dtype} (or gradients of another dtype)"
        if ok and _triton_failed:
            ok, why = False, _triton_failed[0]
        if not ok:
            _say_once(f"optim.compile: {why}: one torch.compile pass per tensor")
            return 0
        ps, gs, (ms, vs) = self._lists(names)
        try:
            adamw_multi_tensor(ps, gs, ms, vs, [self.birth[n] for n in names], mixed.table, (*self.betas, self.eps))
        except Exception as exc:  # noqa: BLE001 - Triton's compile errors have no common base; it fails before it writes
            _triton_failed.append(f"the Triton kernel failed ({type(exc).__name__}: {str(exc).strip()[:200]})")
            _say_once(f"optim.compile: {_triton_failed[0]}: one torch.compile pass per tensor")
            return 0
        self.routes["triton"] += len(names)
        return len(names)

    def _compiled_update(self, names, mixed: MixedBatch) -> int:
        """The compiled pass on each tensor in turn; the number updated. Should torch.compile fail
        (no C++ compiler, a recompilation cap), it fails before its kernel writes anything: the
        optimizer says so once, turns ``compile`` off and the remaining tensors go the eager way."""
        from torch._dynamo.exc import (  # loaded by compiling anyway
            FailOnRecompileLimitHit,
            TorchDynamoException,
        )

        b1, b2 = self.betas
        table = mixed.table
        key = (b1, b2, self.eps, table.device, table.dtype)
        consts = self._consts.get(key)
        if consts is None:  # once per (betas, eps, device, dtype): no host-to-device copy per step
            consts = self._consts[key] = torch.tensor([1 - b1, b2, 1 - b2, self.eps], dtype=torch.float64).to(
                table.device, table.dtype)
        kernel = compiled_adamw_per_element(table.shape[1])
        for i, name in enumerate(names):
            p, st = self.params[name], self.state[name]
            try:
                kernel(p.view(-1), p.grad.view(-1), st["exp_avg"].view(-1), st["exp_avg_sq"].view(-1),
                       self.birth[name].view(-1), table[i], consts)
            except (TorchDynamoException, FailOnRecompileLimitHit) as exc:
                first = str(exc).strip().splitlines()[0] if str(exc).strip() else ""
                warnings.warn(f"optim.compile: the compiled per-element update failed ({type(exc).__name__}: "
                              f"{first[:200]}); the eager per-element update from now on", RuntimeWarning, stacklevel=2)
                self.compile = False
                self.routes["torch.compile"] += i
                return i
        self.routes["torch.compile"] += len(names)
        return len(names)
