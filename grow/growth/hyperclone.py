"""``hyperclone``: width growth by cloning every unit n times (HyperCloning), other dimensions through ``base``.

Mohammad Samragh et al., "Scaling Smart: Accelerating Large Language Model Pre-training with Small
Model Initialization", arXiv 2409.12903 (code: ``apple/ml-hypercloning``). h, p and E grow by integer
factors; readers of copies divide by n, residual copies are scaled by 1/sqrt(n) (this RMSNorm has eps
on the sum), and ±noise on pairs of copies breaks the symmetry exactly: docs/strategies.md, "stack, hyperclone, msg",
"hyperclone in detail". Old entries keep their optimizer state, mapped into the grown model's units
(``rescaled``: n x the entry's scale, the factor that divides its gradients); only new entries are new.
"""

from __future__ import annotations

import math

import torch

from grow.growth.base import GrowthContext, Site, Slot, Strategy, get_strategy, register, rms
from grow.model import TransformerConfig

CLONED = {"h": "d_model", "p": "d_ff", "E": "n_heads"}
BASES = ("zero", "random", "net2net")


@register("hyperclone")
class HyperClone(Strategy):
    """Clone every residual channel, MLP unit and head n times (module docstring); k, v, N from ``base``."""

    grows_by_units = True  # each grown tensor from its own old one and its own draws
    own_dims = tuple(CLONED)

    def __init__(self, **options):
        super().__init__(**options)
        o = self.options
        self.number_option("noise", 0)
        if o["base"] not in BASES:
            raise self.bad_option("base", o["base"], f"must be one of {', '.join(BASES)}")
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
        self._scales: dict[str, float] = {}  # this expansion's c per parameter it cloned (`fill`)

    def before_expansion(self, ctx: GrowthContext, dim: str) -> None:
        self.base.before_expansion(ctx, dim)

    def after_expansion(self, ctx: GrowthContext, dim: str, model, param_map) -> None:
        if dim not in CLONED:
            return self.base.after_expansion(ctx, dim, model, param_map)
        # the old entries' scale is the copies', not the expansion's (gains: its sqrt(h/h_hat) undone)
        ctx.expansion_scales.update(self._scales)
        self._scales = {}

    def finish(self, ctx: GrowthContext, model, param_map) -> None:
        self.base.finish(ctx, model, param_map)
        for dim, fld in CLONED.items():
            if getattr(ctx.target, fld) > getattr(ctx.source, fld):
                ctx.metrics[f"hyperclone/factor_{dim}"] = float(getattr(ctx.target, fld) // getattr(ctx.source, fld))

    def fill(self, ctx: GrowthContext, site: Site) -> None:
        if site.dim not in CLONED:
            return self.base.fill(ctx, site)
        n = site.new_size // site.old_size
        for slot in site.slots:
            blocks = self._clone(ctx, site, slot, n)  # n blocks of shape (G, U_old, w, *rest)
            slot.set(slot.old_idx, blocks[0])
            slot.set(slot.new_idx, torch.cat(blocks[1:], dim=1))
            self._scales[slot.name] = n * self._scale(site.dim, slot.role, n)
        if site.dim == "h" and ctx.source.tie_embeddings:
            site.mults["lm_head"] = site.mults.get("lm_head", 1.0) / math.sqrt(n)

    @staticmethod
    def _scale(dim: str, role: str, n: int) -> float:
        """s: what every copy of an old entry is stored as, x s (docs/strategies.md, "stack, hyperclone, msg", "hyperclone in detail").
        Without noise each of the n copies then takes 1/(n s) of the old entry's gradient, so the growth stores
        the old entry x s and its gradients come x 1/c, c = n s (`GrowthResult.rescaled`)."""
        if dim == "h":
            return {"in": 1 / math.sqrt(n), "out": 1 / n, "gain": 1.0, "scale": 1.0}[role]  # scale: a plugin flag's
        return {"in": 1.0, "out": 1 / n}[role]

    def _clone(self, ctx: GrowthContext, site: Site, slot: Slot, n: int) -> list[torch.Tensor]:
        """The n copies of the slot's old units, each scaled as its role asks, noise added."""
        old = self._original(ctx, site, slot)
        blocks = [old * self._scale(site.dim, slot.role, n) for _ in range(n)]
        if slot.role == "out" and slot.key != "lm_head.weight":
            self._add_pair_noise(ctx, blocks, slot.name)
        if slot.role == "in" and site.dim in ("p", "E") and slot.tensor.dim() == 2:
            n_h = ctx.target.d_model // ctx.source.d_model
            for r in range(1, n):  # copy 0 keeps the noise the h growth gave it
                blocks[r] = self._redraw_column_noise(ctx, blocks[r], n_h, slot.name)
        return blocks

    def _redraw_column_noise(self, ctx: GrowthContext, block: torch.Tensor, n_h: int, key: str) -> torch.Tensor:
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
            noise = ctx.randn(w.shape, r * rms(w), key=key)
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

    def _add_pair_noise(self, ctx: GrowthContext, blocks: list[torch.Tensor], key: str) -> None:
        """+N on copy 2t, -N on copy 2t+1 (reads of identical inputs: the sum is unchanged)."""
        r = float(self.options["noise"])
        if r == 0:
            return
        for t in range(len(blocks) // 2):
            a, b = blocks[2 * t], blocks[2 * t + 1]
            noise = ctx.randn(a.shape, r * rms(a), key=key)
            blocks[2 * t], blocks[2 * t + 1] = a + noise, b - noise
