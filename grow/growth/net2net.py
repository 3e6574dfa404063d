"""``net2net``: grow by splitting existing units (Chen, Goodfellow & Shlens, Net2WiderNet / Net2DeeperNet).

The classical competitor of X. Yuan, P. Savarese and M. Maire, "Accelerated Training via
Incrementally Growing Neural Networks using Variance Transfer and Learning Rate Adaptation",
NeurIPS 2023. For a width dimension whose units are read linearly by the next operation, each new
unit is a copy of a randomly chosen old unit (its *source*): it gets the source's incoming
weights, and the outgoing weights of the source are divided among the source and its copies. With
c_j copies of unit j (1 + the number of new units split from it) and the units' activations a, the
next operation sees

    sum_{old j} (W_out_j / c_j) a_j  +  sum_{copies u of j} (W_out_j / c_j) a_u
      = sum_{old j} (W_out_j / c_j) a_j c_j  =  sum_j W_out_j a_j,

since a copy's activation equals its source's (same incoming weights): the function is
unchanged. In the transformer this applies to (``SPLIT_DIMS``):

- p: a copy of an MLP neuron: W1 column and b1 entry copied, W2 row divided;
- E: a copy of a head: its W^Q, W^K, W^V copied, its v rows of W^O divided;
- v: a copy of a value coordinate of a head: W^V column copied, W^O row divided;
- k: a copy of a query/key coordinate: W^Q column copied, W^K column divided (the score
  sum_j q_j k_j / sqrt(k) is linear in each k_j), on top of the sqrt(k_hat/k) rescaling of the
  old W^K for the new temperature in A. Gesmundo and K. Maile, "Composable Function-preserving
  Expansions for Transformer Architectures", arXiv:2308.06103 (2023), Def. 3.4.

It does not apply to:

- h: a residual channel is read through RMSNorm, whose mean of squares would count a copied
  channel twice, so splitting it changes every normalization; h grows as in ``zero`` (new
  writers zero, Gesmundo & Maile Thm 3.5), which is function-preserving;
- N: Net2DeeperNet inserts an identity layer; in a residual network that is the zero-output
  layer of Gesmundo & Maile Thm 3.6, as in ``zero``;
- k under rotary positions: a copy of a query/key coordinate would sit in a new rotary pair, which
  turns at a frequency of its own, so the copy's score term no longer equals its source's; k grows as
  in ``zero`` (new W^K rows zero, docs/design.md §4.1).

Under SwiGLU a copied MLP unit copies its gate row and its up row, so it computes silu(g) u as its
source does and the identity above holds. Under grouped-query attention a unit of k or v is one
coordinate of a key/value head together with the r query-side entries that read it (W^Q rows or
W^O columns of the group's r heads); a new head (E) joins a group and copies one of that group's
heads, so it reads the same key/value head as its source.

With ``noise: 0`` the growth is exactly function-preserving for every dimension (split ones by
the identity above, h and N by Gesmundo & Maile). Copies with identical incoming weights and equal
outgoing shares receive identical gradients and never separate, so by default a little noise
(``noise`` x the RMS of the parameter's old entries, Gaussian) is added to the copies' incoming
weights; that changes the function, only through the split dimensions.

Options (``configs/strategy/net2net.yaml``): ``noise``, ``choice`` (``random``: each new unit's
source drawn uniformly from the old units of its group, as in Net2Net; ``cycle``: sources
0, 1, 2, ... so the copies spread evenly), ``layer_position``.
"""

from __future__ import annotations

import torch

from grow.growth.base import GrowthContext, Site, Strategy, register, rms


@register("net2net")
class Net2Net(Strategy):
    """Split existing units (p, E, v, k); h and N as in ``zero``."""

    SPLIT_DIMS = ("p", "E", "v", "k")
    own_dims = SPLIT_DIMS  # h and N as zero does
    exact_with = {"noise": 0.0}
    defaults = {"noise": 0.01, "choice": "random", "layer_position": "end"}

    def __init__(self, **options):
        super().__init__(**options)
        if self.options["choice"] not in ("random", "cycle"):
            raise ValueError(f"net2net: choice={self.options['choice']!r}: must be 'random' or 'cycle'")
        if not float(self.options["noise"]) >= 0.0:
            raise ValueError(f"net2net: noise={self.options['noise']!r}: must be >= 0")

    def sources(self, ctx: GrowthContext, site: Site) -> torch.Tensor:
        """(G, U_new) index of each new unit's source among its group's old units."""
        G, U_old, U_new = site.groups, site.n_old, site.n_new
        if self.options["choice"] == "cycle":
            src = torch.arange(U_new, device=ctx.device) % U_old
            return src.expand(G, U_new).clone()
        u = ctx.rand((G, U_new))
        return (u * U_old).long().clamp_(max=U_old - 1)

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
                    new += ctx.randn(new.shape, noise * rms(old))
                slot.set(slot.new_idx, new)
            elif slot.role == "out":
                shared = old / counts.view(shape)
                slot.set(slot.old_idx, shared)
                slot.set(slot.new_idx, shared[rows, src])
            else:  # pragma: no cover - width sites only have in/out slots
                raise RuntimeError(f"net2net: unexpected slot role {slot.role!r} in a {site.dim} site")
        ctx.metrics.setdefault(f"net2net/copies_{site.dim}", 0.0)
        ctx.metrics[f"net2net/copies_{site.dim}"] += float(src.numel())
