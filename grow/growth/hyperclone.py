"""``hyperclone``: width growth by cloning every unit n times (HyperCloning), other dimensions through ``base``.

Paper: Mohammad Samragh, Iman Mirzadeh, Keivan Alizadeh Vahid, Fartash Faghri, Minsik Cho, Moin
Nabi, Devang Naik, Mehrdad Farajtabar, "Scaling Smart: Accelerating Large Language Model
Pre-training with Small Model Initialization", 2024, arXiv 2409.12903 (code:
``apple/ml-hypercloning``).

The rule
--------
HyperCloning grows h, p and E by integer factors n_h = h_hat/h, n_p = p_hat/p, n_E = E_hat/E. Every
unit becomes n copies, laid out in blocks as the reference code's ``Tensor.repeat`` does: copy r
of unit j sits at r * (old size) + j (for heads: copy r of head e is head r*E + e, with its k
query/key and v value coordinates). Each copy computes what its unit computed, and every weight
that reads n copies is divided by n (the reference code's ``clone_matrix(..., normalize=True)``
divides by the input's repetition count), so every reader sees the old value.

Residual channels and RMSNorm. This model's RMSNorm puts epsilon on the *sum* of squares,
Norm(x) = g x / sqrt((sum_j x_j^2 + eps) / h). The reference code (and the paper's Llama, whose
RMSNorm puts eps on the mean) clones the residual stream as n plain copies [x, ..., x]: the mean of
squares is unchanged, (n sum x^2)/(n h), but with eps on the sum it becomes (sum x^2 + eps/n)/h,
so the function would change by an eps/n term. Here the residual copies are scaled by 1/sqrt(n),
x_hat = [x, ..., x] / sqrt(n): then

    sum_j x_hat_j^2 = sum_j x_j^2,    (sum x_hat^2 + eps) / (n h) = (sum x^2 + eps) / (n h)
    rms(x_hat) = rms(x) / sqrt(n),    Norm_hat(x_hat) = g_hat x_hat / rms(x_hat) = [Norm(x), ..., Norm(x)]

exactly, for any eps, with the gains tiled unchanged, g_hat = [g, ..., g]. In words: over n
copies the sum of squares is kept and the channel count grows n-fold, so the RMS falls by
sqrt(n), exactly as the copies did. Hence, for an h growth:

- writers of the residual stream (E, P: columns; W^O, W2: rows; b2) are tiled and scaled by
  1/sqrt(n_h): each writes its 1/sqrt(n_h)-scaled value into every copy, so the stream stays
  x_hat (by induction over the layers: I_hat_n = [I_n, ..., I_n] / sqrt(n_h));
- readers of the normalized stream (W^Q, W^K, W^V, W1: columns; W^out) are tiled and divided by
  n_h: sum over the n_h identical copies of (W/n_h) Norm(x) = W Norm(x);
- norm gains are tiled as they are (the expansion's sqrt(h/h_hat) rescaling is undone).

With tied embeddings (W^out = E^T) one matrix cannot be scaled by 1/sqrt(n_h) and by 1/n_h:
it is scaled as a writer, and W^out's forward multiplier ``mult`` is divided by sqrt(n_h)
(logits = mult Norm(x_hat) E_hat^T = (1/sqrt(n_h)) sqrt(n_h) Norm(x) E^T).

MLP (p): W1 rows and b1 copied; W2 columns (which read the n_p copies) divided by n_p.
Heads (E): each head's W^Q, W^K, W^V rows copied (same scores, same temperature 1/sqrt(k)); the
head's v columns of W^O divided by n_E.

Symmetry breaking (``noise``). Exact copies get identical gradients and stay copies. As the
reference code's ``add_noise``: in a weight that reads copies, blocks of copies are taken in pairs
(copy 2t, copy 2t+1) and the pair gets +N and -N (N Gaussian, ``noise`` x the RMS of the block's
values; with an odd n the last copy gets none). The pair reads identical inputs, so
(W + N) x + (W - N) x = 2 W x: the function is still exact, while the backward pass
(W + N)^T g != (W - N)^T g tells the copies apart. Applied to the readers of residual copies
(W^Q, W^K, W^V, W1; not W^out, as in the reference code), of MLP unit copies (W2) and of head
copies (W^O). The reference code sets the noise by a signal-to-noise ratio in dB: noise = r
corresponds to SNR = -20 log10(r) dB (0.01: 40 dB). The noise is drawn for every copy: a unit
or head copy's incoming weights (W1 rows, W^Q, W^K, W^V rows) carry the h growth's noise on their
residual-copy columns, and the p and E growths (after h) redraw it for copies 1..n-1, as the
reference code draws it for every block of output rows. The reference code's default is no
noise; 0.01 here: without noise (and without dropout, this project's default) copies get
identical gradients and updates and stay copies for ever, so the grown model would train as the
small one.

Optimizer state. The copies are new entries (zero moments, their own step count). The
originals (copy 0) are rescaled (readers / n, writers / sqrt(n_h)) and their gradients change
scale with them (a W2 column of a copied unit: the same gradient for a weight n_p times smaller;
a residual writer: a gradient / sqrt(n_h)), so their moments no longer match: every parameter a
cloned dimension touches is reported in ``GrowthResult.fresh`` and restarts its optimizer state,
as HyperCloning trains the cloned model with a new optimizer.

The Llama family (docs/design.md §4.2-4.3): under SwiGLU a unit copy copies its gate row and its up row
(W_gate is one more reader of the residual copies for h). Under grouped-query attention the key/value
heads stay: copy c of head i of a group of r heads is head c r + i of the grown group and reads the same
key/value head (the reference code's ``clone_llama`` multiplies the key/value heads by n_E instead; the
function is the same).

k, v and N are grown by ``base`` (``zero``, ``random`` or ``net2net``). A factor that is not an
integer for h, p or E is refused by `HyperClone.check_transition`, before training.

Options (``configs/strategy/hyperclone.yaml``): ``noise``, ``base``, ``base_options``,
``layer_position``.
"""

from __future__ import annotations

import math
from typing import Any

import torch

from grow.growth.base import GrowthContext, Site, Slot, Strategy, get_strategy, register, rms
from grow.model import TransformerConfig

CLONED = {"h": "d_model", "p": "d_ff", "E": "n_heads"}
BASES = ("zero", "random", "net2net")


@register("hyperclone")
class HyperClone(Strategy):
    """Clone every residual channel, MLP unit and head n times (module docstring); k, v, N from ``base``."""

    own_dims = tuple(CLONED)

    defaults: dict[str, Any] = {"noise": 0.01, "base": "zero", "base_options": {}, "layer_position": "end"}

    def __init__(self, **options):
        super().__init__(**options)
        o = self.options
        noise = o["noise"]
        if isinstance(noise, bool) or not isinstance(noise, (int, float)) or not noise >= 0:
            raise ValueError(f"strategy 'hyperclone': noise={noise!r}: must be a number >= 0")
        if o["base"] not in BASES:
            raise ValueError(f"strategy 'hyperclone': base={o['base']!r}: must be one of {', '.join(BASES)}")
        self.base = get_strategy(o["base"], **{"layer_position": o["layer_position"],
                                               **dict(o["base_options"] or {})})

    def check_transition(self, source: TransformerConfig, target: TransformerConfig) -> None:
        super().check_transition(source, target)
        for fld in CLONED.values():
            a, b = getattr(source, fld), getattr(target, fld)
            if b % a:
                raise ValueError(
                    f"hyperclone copies every unit an integer number of times: {fld} {a} -> {b} is x{b / a:.3g}; "
                    f"grow {fld} by an integer factor (e.g. schedule.width_rate=1.0 doubles it) or leave it out "
                    "of schedule.grow")
        self.base.check_transition(source, target.replace(**{f: getattr(source, f) for f in CLONED.values()}))

    # ---- hooks: h, p, E here, the rest through base ----------------------------------------
    def initialize(self, model, generator=None) -> None:
        self.base.initialize(model, generator)

    def setup(self, ctx: GrowthContext) -> None:
        self.base.setup(ctx)
        self._touched: set[str] = set()  # parameters of the cloned dimensions (names before N grows)

    def before_expansion(self, ctx: GrowthContext, dim: str) -> None:
        self.base.before_expansion(ctx, dim)

    def after_expansion(self, ctx: GrowthContext, dim: str, model, param_map) -> None:
        self.base.after_expansion(ctx, dim, model, param_map)

    def finish(self, ctx: GrowthContext, model, param_map) -> None:
        self.base.finish(ctx, model, param_map)
        ctx.fresh |= {param_map[name][0] for name in self._touched if name in param_map}
        for dim, fld in CLONED.items():
            if getattr(ctx.target, fld) > getattr(ctx.source, fld):
                ctx.metrics[f"hyperclone/factor_{dim}"] = float(getattr(ctx.target, fld) // getattr(ctx.source, fld))

    def fill(self, ctx: GrowthContext, site: Site) -> None:
        if site.dim not in CLONED:
            return self.base.fill(ctx, site)
        n = site.new_size // site.old_size
        self._touched |= {slot.name for slot in site.slots}
        for slot in site.slots:
            blocks = self._clone(ctx, site, slot, n)  # n blocks of shape (G, U_old, w, *rest)
            slot.set(slot.old_idx, blocks[0])
            slot.set(slot.new_idx, torch.cat(blocks[1:], dim=1))
        if site.dim == "h" and ctx.source.tie_embeddings:
            site.mults["lm_head"] = site.mults.get("lm_head", 1.0) / math.sqrt(n)

    def _clone(self, ctx: GrowthContext, site: Site, slot: Slot, n: int) -> list[torch.Tensor]:
        """The n copies of the slot's old units, each scaled as its role asks, noise added."""
        old = self._original(ctx, site, slot)
        if site.dim == "h":
            scale = {"in": 1 / math.sqrt(n), "out": 1 / n, "gain": 1.0}[slot.role]
        else:
            scale = {"in": 1.0, "out": 1 / n}[slot.role]
        blocks = [old * scale for _ in range(n)]
        if slot.role == "out" and slot.key != "lm_head.weight":
            self._add_pair_noise(ctx, blocks)
        if slot.role == "in" and site.dim in ("p", "E") and slot.tensor.dim() == 2:
            n_h = ctx.target.d_model // ctx.source.d_model
            for r in range(1, n):  # copy 0 keeps the noise the h growth gave it
                blocks[r] = self._redraw_column_noise(ctx, blocks[r], n_h)
        return blocks

    def _redraw_column_noise(self, ctx: GrowthContext, block: torch.Tensor, n_h: int) -> torch.Tensor:
        """A unit copy's incoming weights (rows of W1, or a head's rows of W^Q, W^K, W^V) with the
        +N/-N noise on their residual-copy columns drawn anew: the h growth (before p and E) gave
        the unit's row that noise, and the row was copied, so every copy would share it. The
        reference code draws it for every output copy (``add_noise``'s loop over row blocks).
        Each pair of column blocks (a, b) = (W + N, W - N) becomes (W + N', W - N'), W = (a + b)/2."""
        r = float(self.options["noise"])
        if r == 0 or n_h < 2:
            return block
        h = block.shape[-1] // n_h
        out = block.clone()
        for t in range(n_h // 2):
            a, b = block[..., 2 * t * h:(2 * t + 1) * h], block[..., (2 * t + 1) * h:(2 * t + 2) * h]
            w = (a + b) / 2
            noise = ctx.randn(w.shape, r * rms(w))
            out[..., 2 * t * h:(2 * t + 1) * h] = w + noise
            out[..., (2 * t + 1) * h:(2 * t + 2) * h] = w - noise
        return out

    @staticmethod
    def _original(ctx: GrowthContext, site: Site, slot: Slot) -> torch.Tensor:
        """The slot's old units as the model had them (the h expansion has already rescaled the
        gains by sqrt(h/h_hat): take them from the model before the expansion)."""
        if slot.role != "gain":
            return slot.get(slot.old_idx)
        g = ctx.model.get_parameter(slot.name).detach()
        return g.view(slot.old_shape())

    def _add_pair_noise(self, ctx: GrowthContext, blocks: list[torch.Tensor]) -> None:
        """+N on copy 2t, -N on copy 2t+1 (reads of identical inputs: the sum is unchanged)."""
        r = float(self.options["noise"])
        if r == 0:
            return
        for t in range(len(blocks) // 2):
            a, b = blocks[2 * t], blocks[2 * t + 1]
            noise = ctx.randn(a.shape, r * rms(a))
            blocks[2 * t], blocks[2 * t + 1] = a + noise, b - noise
