"""``upcycle``: a dense feed-forward becomes experts, each a copy of it (A. Komatsuzaki et al., "Sparse Upcycling:
Training Mixture-of-Experts from Dense Checkpoints", ICLR 2023), and X experts become X' by duplication
(C. Dwivedi et al., "Expert Upcycling", arXiv:2604.19835); the expansion is `grow.growth.experts`
(docs/design.md §4.4, "Experts"). Other dimensions as ``zero``.

Options (``configs/strategy/upcycle.yaml``): ``router`` (``init``: the model's initializer, a new router as the
paper's; ``zero``: uniform routing at the start), ``moments`` (``copy``: every copied expert, and a copied router
row, starts with its source's optimizer state and births; ``fresh``: zero moments, born at the growth).
"""

from __future__ import annotations

from typing import Any

import torch

from grow.growth.base import GrowthContext, GrowthResult, register
from grow.growth.experts import source_expert
from grow.growth.zero import Zero

ROUTERS = ("init", "zero")
MOMENTS = ("copy", "fresh")


@register("upcycle")
class Upcycle(Zero):
    """Experts copied from the dense MLP or from each other; optimizer state copied or fresh."""

    own_dims = ("X",)
    exact_with: dict[str, Any] = {}  # dense -> experts always; X -> mX experts with top_k -> m top_k
    defaults: dict[str, Any] = {"router": "init", "moments": "copy", "layer_position": "end"}

    def __init__(self, **options):
        super().__init__(**options)
        if self.options["router"] not in ROUTERS:
            raise self.bad_option("router", self.options["router"], f"must be one of {', '.join(ROUTERS)}")
        if self.options["moments"] not in MOMENTS:
            raise self.bad_option("moments", self.options["moments"], f"must be one of {', '.join(MOMENTS)}")

    def router_values(self, ctx: GrowthContext, name: str, shape) -> torch.Tensor:
        if self.options["router"] == "zero":
            return torch.zeros(shape, dtype=ctx.dtype, device=ctx.device)
        return super().router_values(ctx, name, shape)

    def after_growth(self, opt, result: GrowthResult, optim_name: str) -> None:
        """``moments=copy``: the optimizer's buffers and births of each copied expert (and copied router row)
        become its source's, so the copies take the steps their source would."""
        if self.options["moments"] == "copy":
            for dst, src, rows in copies(result):
                copy_state(opt, dst, src, rows)


def copies(result: GrowthResult) -> list[tuple[str, str, torch.Tensor | None]]:
    """(copy, source, rows) for every parameter a growth by `grow.growth.experts` copied: an expert's parameter
    (rows None: all of it) or a router whose rows ``rows[j]`` copy rows j (the router of a dense layer: none)."""
    cfg, kept = result.model.config, {new for new, _ in result.param_map.values()}
    out = []
    for n in range(cfg.n_layers if cfg.moe else 0):
        expert = f"layers.{n}.mlp.experts."
        X = sum(1 for j in range(cfg.n_experts) if f"{expert}{j}.fc1.weight" in kept)
        if X in (0, cfg.n_experts):
            continue
        keys = [k[len(expert) + 2:] for k, _ in result.model.named_parameters() if k.startswith(expert + "0.")]
        out += [(f"{expert}{j}.{key}", f"{expert}{source_expert(j, X)}.{key}", None)
                for j in range(X, cfg.n_experts) for key in keys]
        router = f"layers.{n}.mlp.router.weight"
        if router in kept:
            out.append((router, router, torch.tensor([source_expert(j, X) for j in range(cfg.n_experts)])))
    return out


@torch.no_grad()
def copy_state(opt, dst: str, src: str, rows: torch.Tensor | None) -> None:
    """Parameter ``dst``'s optimizer buffers and births become those of ``src`` (``rows``: row j of ``dst`` takes
    row rows[j] of ``src``). A parameter the optimizer does not hold (frozen) is skipped; a router sharded over
    ranks keeps fresh rows (its rows are on other ranks)."""
    if dst not in opt.state or src not in opt.state or (rows is not None and dst in opt.sharded):
        return
    for b, buf in opt.state[src].items():
        opt.state[dst][b].copy_(buf if rows is None else buf[rows.to(buf.device)])
    births = opt.birth_stage(src)
    opt.birth[dst] = births.clone() if rows is None else births[rows.to(births.device)].clone()
    opt._compact_births()
