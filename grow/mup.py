"""The maximal-update parametrization (``model.parametrization: mup``) and what a growth does to it.

G. Yang, E. J. Hu, I. Babuschkin, S. Sidor, X. Liu, D. Farhi, N. Ryder, J. Pachocki, W. Chen and
J. Gao, "Tensor Programs V: Tuning Large Neural Networks via Zero-Shot Hyperparameter Transfer"
(arXiv 2203.03466, 2022), Table 3 (Adam), with the readout's multiplier 1/m where their ``mup``
package's MuReadout puts it (the package itself was not compared line by line; the coordinate check
in tests/test_mup.py is what this module is held to):
with the width multiplier m = h / h0 (``d_model / model.mup_base_width``; at h = h0 mup is standard),

==================================  ===================  =================  ==================
parameter                           initialization std   Adam learning rate forward multiplier
==================================  ===================  =================  ==================
hidden matrices (W^Q, W^K, W^V,     sigma / sqrt(m)      eta / m            1
W^O, W1, W_gate, W2)
embeddings E, P; norm gains;        sigma (as standard)  eta                1
biases
output layer W_out                  sigma                eta                1 / m
==================================  ===================  =================  ==================

(sigma: the model's standard std, W^O and W2 already / sqrt(2N).) One m for every hidden matrix:
the schedules grow the widths h, p, k, v together (Eq. 6), so every fan-in grows by about the same
factor. Attention keeps the 1/sqrt(k) score scale (mup's 1/k is a statement about k -> infinity;
the width multiplier here is h's). FLM-101B (Li et al., arXiv 2309.03852) grows under mup so that
hyperparameters found on a small model carry to the grown one.

A growth from h to h' (m -> m') keeps the grown model in mup and its function unchanged
(`regrow`): W_out is stored x c = m'/m and its multiplier becomes mult / c (the product, hence the
logits, unchanged; its AdamW moments move into the new units as every compensated rescaling's do,
`grow.optim.bookkeeping.GrowthAware.grow`'s ``rescaled``), and every hidden matrix's learning rate
becomes eta / m' for all its elements, old and new (`lr_multipliers`, per parameter and stage of
birth in the growth-aware optimizer). New weights a strategy draws come from the model's
initializer (`grow.model.init_like`) at the grown width: sigma / sqrt(m'); W_out's new columns end at
sigma (the h expansion draws them at m/m' x sigma, then `regrow` multiplies W_out by m'/m). mup is built for AdamW
(SGD's column of Table 3 is not: refused).
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
