"""The maximal-update parametrization (``model.parametrization: mup``) and what a growth does to it.

G. Yang et al., "Tensor Programs V: Tuning Large Neural Networks via Zero-Shot Hyperparameter
Transfer", arXiv 2203.03466, Table 3 (Adam), with one width multiplier m = h / h0: hidden matrices
at sigma/sqrt(m) and eta/m, W_out's forward multiplier 1/m. A growth m -> m' keeps the model in muP
and its function (`regrow`). The rules and what is refused: docs/optimizer.md, "μP across growth".
"""

from __future__ import annotations

import torch

from grow.model import HIDDEN, TransformerConfig


def is_mup(cfg: TransformerConfig) -> bool:
    return cfg.parametrization == "mup"


def lr_multipliers(cfg: TransformerConfig, names, stage: int) -> dict[str, dict[int, float]]:
    """``{name: {s: 1/m}}`` for every hidden matrix among ``names`` and every stage s <= ``stage``
    (the growth-aware optimizer's per-parameter, per-stage learning-rate multipliers)."""
    m = cfg.width_mult
    return {n: {s: 1.0 / m for s in range(stage + 1)} for n in names if n.endswith(HIDDEN)}


@torch.no_grad()
def regrow(before: TransformerConfig, model, rescaled: dict) -> dict:
    """Keep a grown ``model`` (from a model at ``before``) in mup: W_out x c, its multiplier / c,
    c = m'/m; returns ``rescaled`` with W_out's c folded in (for the optimizer's moments)."""
    c = model.config.width_mult / before.width_mult
    if c == 1.0:
        return dict(rescaled)
    head = model.lm_head
    head.weight.mul_(c)
    head.mult = head.mult / c
    out = dict(rescaled)
    out["lm_head.weight"] = out.get("lm_head.weight", 1.0) * c
    return out
