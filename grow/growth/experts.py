"""The expert-count expansion X -> X' (docs/model.md, "Experts", "Experts"): a dense feed-forward (X = 1) becomes X'
experts, each a copy of it (A. Komatsuzaki et al., "Sparse Upcycling: Training Mixture-of-Experts from Dense
Checkpoints", ICLR 2023), or X experts become X' by duplication (C. Dwivedi et al., "Expert Upcycling",
arXiv:2604.19835): expert j of the grown layer copies old expert j mod X, and so does its router row. The router
a dense layer gets has no old rows: the strategy's `Strategy.router_values` fills it.

Exact where the renormalized top-k makes it so: from a dense layer always (the k chosen copies' weights sum to
1); from X experts only with X' = mX and k' = mk (the m copies of each chosen expert are all chosen, each with
1/m of its weight). The input model is never modified; the param map sends each old expert (the dense MLP:
expert 0) and the old router rows to their places, so the copies start as new parameters.
"""

from __future__ import annotations

import torch
import torch.nn as nn

from grow.growth.base import GrowthContext, ParamMap
from grow.model import Linear, Transformer

MLP_PREFIX = "mlp."


def source_expert(j: int, n_old: int) -> int:
    """The old expert expert j of the grown layer copies (the dense MLP: 0)."""
    return j % n_old


def new_name(name: str, n_old: int) -> str:
    """An old parameter's name in the grown model: a dense layer's MLP becomes expert 0."""
    layer, rest = _split(name)
    if n_old == 1 and rest is not None and rest.startswith(MLP_PREFIX):
        return f"layers.{layer}.mlp.experts.0.{rest[len(MLP_PREFIX):]}"
    return name


def _split(name: str) -> tuple[int | None, str | None]:
    """(layer, the name inside the layer) of a layer's parameter, else (None, None)."""
    if not name.startswith("layers."):
        return None, None
    _, n, rest = name.split(".", 2)
    return int(n), rest


def grow_experts(model: Transformer, n_experts: int, strategy, *, ctx: GrowthContext) -> tuple[Transformer, ParamMap]:
    """``model`` with ``n_experts`` experts a layer and the target's top_k (module docstring): (grown, param map)."""
    cfg = model.config
    X = cfg.n_experts
    if n_experts < X:
        raise ValueError(f"cannot shrink n_experts from {X} to {n_experts}: growth only adds units (must be >= {X})")
    new_cfg = cfg.replace(n_experts=n_experts, top_k=ctx.target.top_k)
    old = dict(model.named_parameters())
    tensors = {new_name(n, X): p.detach().clone() for n, p in old.items()}
    for n in range(cfg.n_layers):
        _grow_layer(tensors, n, X, n_experts, strategy, ctx)
    grown = _build(model, new_cfg, tensors, X)
    pmap = {name: (new_name(name, X), torch.arange(p.numel(), device=p.device).view(p.shape)) for name, p in old.items()}
    return grown, pmap


def _grow_layer(tensors: dict, n: int, X: int, X_new: int, strategy, ctx: GrowthContext) -> None:
    """Layer n's copies of its experts and its router rows, in ``tensors`` (by their grown names)."""
    expert = f"layers.{n}.mlp.experts."
    keys = [k[len(expert) + 2:] for k in tensors if k.startswith(expert + "0.")]
    for j in range(X, X_new):
        src = source_expert(j, X)
        for key in keys:
            tensors[f"{expert}{j}.{key}"] = tensors[f"{expert}{src}.{key}"].clone()
    router = f"layers.{n}.mlp.router.weight"
    if X == 1:
        h = tensors[f"{expert}0.fc1.weight"].shape[1]
        tensors[router] = strategy.router_values(ctx, router, (X_new, h))
    else:
        rows = torch.tensor([source_expert(j, X) for j in range(X_new)], device=tensors[router].device)
        tensors[router] = tensors[router][rows].clone()


def _build(model: Transformer, cfg, tensors: dict, X: int) -> Transformer:
    """The grown Transformer holding ``tensors``, with the old modules' forward multipliers and train mode."""
    with torch.device("meta"):
        new = Transformer(cfg)
    grads = {new_name(n, X): p.requires_grad for n, p in model.named_parameters()}
    for name, t in tensors.items():
        module, attr = name.rsplit(".", 1)
        setattr(new.get_submodule(module), attr, nn.Parameter(t, requires_grad=grads.get(name, True)))
    if cfg.tie_embeddings:
        new.lm_head.weight = new.wte.weight
    mults = {new_name(n + ".weight", X)[:-len(".weight")]: m.mult for n, m in model.named_modules()
             if isinstance(m, Linear)}
    for name, m in new.named_modules():
        if isinstance(m, Linear):
            m.mult = float(mults.get(name, mults.get(_source_module(name, X), 1.0)))
    new.train(model.training)
    return new


def _source_module(module: str, X: int) -> str:
    """The old expert's module a copied expert's module copies (for its forward multiplier)."""
    parts = module.split(".")
    if len(parts) > 4 and parts[2] == "mlp" and parts[3] == "experts":
        parts[4] = str(source_expert(int(parts[4]), X))
    return ".".join(parts)
