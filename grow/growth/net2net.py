"""``net2net``: grow by splitting existing units (Chen, Goodfellow & Shlens, Net2WiderNet / Net2DeeperNet).

T. Chen, I. Goodfellow, J. Shlens, "Net2Net: Accelerating Learning via Knowledge Transfer", ICLR 2016.
A new unit copies a source's incoming weights and shares its outgoing ones (p, E, v, k); h and N grow
as ``zero``; ``noise`` separates the copies (docs/strategies.md, "stack, hyperclone, msg", "net2net in detail").
"""

from __future__ import annotations

import torch

from grow.growth.base import GrowthContext, Site, Slot, Strategy, register, rms


@register("net2net")
class Net2Net(Strategy):
    """Split existing units (p, E, v, k); h and N as in ``zero``."""

    grows_by_units = True  # each grown tensor from its own old one and its own draws
    SPLIT_DIMS = ("p", "E", "v", "k")
    own_dims = SPLIT_DIMS  # h and N as zero does
    exact_with = {"noise": 0.0}

    def __init__(self, **options):
        super().__init__(**options)
        if self.options["choice"] not in ("random", "cycle"):
            raise self.bad_option("choice", self.options["choice"], "must be 'random' or 'cycle'")
        self.number_option("noise", 0)

    def sources(self, ctx: GrowthContext, site: Site) -> torch.Tensor:
        """(G, U_new) index of each new unit's source among its group's old units."""
        G, U_old, U_new = site.groups, site.n_old, site.n_new
        if self.options["choice"] == "cycle":
            src = torch.arange(U_new, device=ctx.device) % U_old
            return src.expand(G, U_new).clone()
        u = ctx.rand((G, U_new), key=f"sources.{site.layer}")  # one draw for the site's slots
        return (u * U_old).long().clamp_(max=U_old - 1)

    @staticmethod
    def _shared_gradient(ctx: GrowthContext, slot: Slot, counts: torch.Tensor) -> None:
        """A split unit's incoming weights keep their values, and each of its c_j copies now takes 1/c_j of its
        gradient (their outputs are read / c_j): ``rescaled`` c_j on the old unit's entries (its outgoing
        weights, stored / c_j and read as before, keep their gradient: c = 1)."""
        factor = torch.ones_like(slot.tensor)
        view = factor.movedim(slot.axis, 0)
        view[slot.old_idx] = counts.to(view.dtype).expand(*slot.old_idx.shape, *view.shape[1:])
        ctx.expansion_scales[slot.name] = ctx.expansion_scales.get(slot.name, 1.0) * factor

    def fill(self, ctx: GrowthContext, site: Site) -> None:
        if site.dim not in self.SPLIT_DIMS or (site.dim == "k" and ctx.source.positions == "rope"):
            return super().fill(ctx, site)
        G, U_old = site.groups, site.n_old
        src = self.sources(ctx, site)  # (G, U_new)
        counts = torch.ones(G, U_old, device=ctx.device, dtype=ctx.dtype)
        counts.scatter_add_(1, src, torch.ones_like(src, dtype=ctx.dtype))
        rows = torch.arange(G, device=ctx.device)[:, None]
        noise = float(self.options["noise"])
        for slot in site.slots:
            old = slot.get(slot.old_idx)  # (G, U_old, w, *rest)
            shape = counts.shape + (1,) * (old.dim() - 2)
            if slot.role == "in":
                new = old[rows, src].clone()
                if noise > 0:
                    new += ctx.randn(new.shape, noise * rms(old), key=slot.name)
                slot.set(slot.new_idx, new)
                self._shared_gradient(ctx, slot, counts.view(shape))
            elif slot.role == "out":
                shared = old / counts.view(shape)
                slot.set(slot.old_idx, shared)
                slot.set(slot.new_idx, shared[rows, src])
            else:  # pragma: no cover - width sites only have in/out slots
                raise RuntimeError(f"net2net: unexpected slot role {slot.role!r} in a {site.dim} site")
        ctx.metrics.setdefault(f"net2net/copies_{site.dim}", 0.0)
        ctx.metrics[f"net2net/copies_{site.dim}"] += float(src.numel())
