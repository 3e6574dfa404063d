"""SGD with momentum for growing models: the update rule on top of `grow.optim.bookkeeping`.

The setting of the experiments of X. Yuan, P. Savarese and M. Maire, "Accelerated Training via
Incrementally Growing Neural Networks using Variance Transfer and Learning Rate Adaptation",
NeurIPS 2023: births select the per-stage learning-rate multipliers (their Eq. 5, set by the
``vt`` strategy) and the new-element warmup; SGD has no bias correction.
"""

from __future__ import annotations

from collections.abc import Mapping

import torch

from grow.optim.bookkeeping import GrowthAware, check_hyperparameter


class GrowthAwareSGD(GrowthAware):
    """SGD with momentum (the setting of Yuan et al.'s experiments), per-element birth stages and per-stage lr multipliers.

    ``GrowthAwareSGD(model.named_parameters(), lr=0.1, momentum=0.9, weight_decay=5e-4,
    nesterov=False, decoupled_weight_decay=False, new_warmup_steps=0)``. The update is
    torch.optim.SGD's (dampening 0): ``g += wd * p`` (``dim >= 2`` parameters only; or ``p *= 1 - lr
    * wd`` when ``decoupled_weight_decay``), ``buf = momentum * buf + g``, ``p -= lr * buf`` (Nesterov:
    ``p -= lr * (g + momentum * buf)``). A new element's buffer starts at 0, so its first update is
    ``lr * g``, as torch's first step. SGD has no bias correction: births only select multipliers
    and the new-element warmup, so ``on_growth="reset"`` zeroes the momentum and keeps the births
    (Yuan et al.'s setting: the momentum re-initialized at each growth, Eq. 5 per stage of birth).
    """

    kind = "sgd"
    reset_keeps_births = True  # on_growth="reset" clears the momentum only; births keep selecting Eq. 5's rates
    _buffer_powers = {"momentum_buffer": 1}  # units: gradient

    def __init__(self, named_params, lr: float = 0.1, momentum: float = 0.9, weight_decay: float = 0.0, *,
                 nesterov: bool = False, decoupled_weight_decay: bool = False, new_warmup_steps: int = 0):
        self.set_hyperparameters({"momentum": momentum, "nesterov": nesterov, "decoupled_weight_decay": decoupled_weight_decay,
                         "weight_decay": weight_decay})
        super().__init__(named_params, lr=lr, weight_decay=weight_decay, new_warmup_steps=new_warmup_steps)

    def set_hyperparameters(self, h: Mapping) -> None:
        self.momentum = check_hyperparameter("momentum", h["momentum"], 0.0, 1.0, hi_open=True)
        for key in ("nesterov", "decoupled_weight_decay"):
            if not isinstance(h[key], bool):
                raise ValueError(f"{key}={h[key]!r}: must be true or false")
        if h["nesterov"] and self.momentum == 0:
            raise ValueError("nesterov=True: needs momentum > 0")
        self.nesterov, self.decoupled_weight_decay = h["nesterov"], h["decoupled_weight_decay"]
        if "weight_decay" in h:
            self.weight_decay = check_hyperparameter("weight_decay", h["weight_decay"], 0.0)
        if "new_warmup_steps" in h:
            self.new_warmup_steps = int(h["new_warmup_steps"])
        # coupled L2 with momentum: the buffer's wd p part is tracked too (decay_buffer = sum_j mu^j p_j,
        # units: parameter), so that a growth's rescaling converts it x c, the gradient part / c (`_convert`)
        coupled = not self.decoupled_weight_decay and getattr(self, "weight_decay", 0.0) > 0 and self.momentum > 0
        self._buffer_powers = {"momentum_buffer": 1, **({"decay_buffer": -1} if coupled else {})}

    def hyperparameters(self) -> dict:
        return {"momentum": self.momentum, "nesterov": self.nesterov,
                "decoupled_weight_decay": self.decoupled_weight_decay, "weight_decay": self.weight_decay,
                "new_warmup_steps": self.new_warmup_steps}

    def _derived(self, s: int, scale: float, decays: bool) -> tuple[float, float]:
        a = self.lr * scale
        return (a, 1 - a * self.weight_decay if decays and self.decoupled_weight_decay else 1.0)

    def _convert(self, name: str, bufs: dict, c: float) -> dict:
        """A kept momentum buffer in the units of a growth that stored the parameter x c: its gradient
        part / c, its coupled-L2 part wd sum mu^j p_j x c (the parameters are x c):
        b' = (b - wd q) / c + wd c q, q' = c q."""
        if "decay_buffer" not in bufs or not self._decays(self.params[name]):  # no L2 part
            return super()._convert(name, bufs, c)
        b, q = bufs["momentum_buffer"], bufs["decay_buffer"]
        wd = self.weight_decay
        return {"momentum_buffer": (b - wd * q) / c + (wd * c) * q, "decay_buffer": q * c}

    def _direction(self, ps, gs, bufs, decays, qs=None):
        """Momentum update of ``bufs`` (and of ``qs``, the coupled-L2 history, when tracked); returns
        the update directions (before the lr)."""
        if decays and not self.decoupled_weight_decay:
            if qs is not None and self.momentum != 0.0:
                torch._foreach_mul_(qs, self.momentum)
                torch._foreach_add_(qs, ps)
            gs = torch._foreach_add(gs, ps, alpha=self.weight_decay)
        if self.momentum == 0.0:
            return gs
        torch._foreach_mul_(bufs, self.momentum)
        torch._foreach_add_(bufs, gs)
        if self.nesterov:
            return torch._foreach_add(gs, bufs, alpha=self.momentum)
        return bufs

    def _uniform_update(self, names, derived, lr_eff, n, decays) -> None:
        lr, decay = derived
        ps, gs, (bufs, *qs) = self._lists(names)
        if decay != 1.0:
            torch._foreach_mul_(ps, decay)
        d = self._direction(ps, gs, bufs, decays, qs[0] if qs else None)
        torch._foreach_add_(ps, d, alpha=-lr)

    def _mixed_update(self, names, mixed, decays) -> None:
        gathered = mixed.gathered()
        ps, gs, (bufs, *qs) = self._lists(names)
        if decays and self.decoupled_weight_decay:
            for p, (_, decay) in zip(ps, gathered):
                p.mul_(decay)
        d = self._direction(ps, gs, bufs, decays, qs[0] if qs else None)
        for p, di, (lr, _) in zip(ps, d, gathered):
            if isinstance(lr, torch.Tensor):
                p.sub_(di * lr)
            else:
                p.sub_(di, alpha=lr)
