"""``upcycle``: a dense feed-forward becomes experts, each a copy of it (A. Komatsuzaki et al., "Sparse Upcycling:
Training Mixture-of-Experts from Dense Checkpoints", ICLR 2023), and X experts become X' by duplication
(C. Dwivedi et al., "Expert Upcycling", arXiv:2604.19835) through `grow.growth.experts`; docs/model.md, "Experts".
Other dimensions as ``zero``. Options (``configs/strategy/upcycle.yaml``): ``router`` (``init``: the model's
initializer, as the paper's new router | ``zero``), ``moments`` (``copy``: a copied expert or router row starts
with its source's optimizer state and births | ``fresh``), ``new_experts`` (``used`` | ``unused``: their routing
scores x m, m ramped 0 -> 1 over ``ramp_steps`` steps as MSG's masks, `grow.masks.MaskedMoE`).
"""

from __future__ import annotations

from typing import Any

import torch

from grow import masks as M
from grow.growth.base import GrowthContext, GrowthResult, ParamMap, register
from grow.growth.experts import source_expert
from grow.growth.msg import ramp
from grow.growth.zero import Zero
from grow.model import Transformer

ROUTERS = ("init", "zero")
MOMENTS = ("copy", "fresh")
NEW_EXPERTS = ("used", "unused")


@register("upcycle")
class Upcycle(Zero):
    """Experts copied from the dense MLP or from each other; optimizer state copied or fresh."""

    own_dims = ("X",)
    exact_with: dict[str, Any] = {}  # dense -> experts always; X -> mX experts with top_k -> m top_k

    def __init__(self, **options):
        super().__init__(**options)
        for key, allowed in (("router", ROUTERS), ("moments", MOMENTS), ("new_experts", NEW_EXPERTS)):
            if self.options[key] not in allowed:
                raise self.bad_option(key, self.options[key], f"must be one of {', '.join(allowed)}")
        steps = self.options["ramp_steps"]
        if isinstance(steps, bool) or not isinstance(steps, int) or steps < 1:
            raise self.bad_option("ramp_steps", steps, "must be an integer >= 1 (optimizer steps)")
        self._left: dict = {}  # see `grow.growth.msg.ramp`

    def finish(self, ctx: GrowthContext, model: Transformer, param_map: ParamMap) -> None:
        """``new_experts=unused``: every layer's new experts enter at m = 0, the old ones at their mask (1 if none)."""
        if self.options["new_experts"] == "unused" and model.config.moe and ctx.source.n_experts < model.config.n_experts:
            X = ctx.source.n_experts
            for n, layer in enumerate(model.layers):
                old = ctx.model.layers[n].mlp._buffers.get("mask_experts") if ctx.source.moe else None
                mask = torch.zeros(model.config.n_experts, dtype=ctx.dtype, device=ctx.device)
                mask[:X] = 1.0 if old is None else old
                M.set_mask(layer.mlp, "mask_experts", mask)
            ctx.metrics["upcycle/masked_experts"] = float(model.config.n_experts - X)

    def after_step(self, model: Transformer, opt, step_in_stage: int) -> bool:
        return ramp(model, int(self.options["ramp_steps"]), self._left) if M.has_masks(model) else False

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
