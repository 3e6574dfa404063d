"""Fully sharded data parallelism (``trainer.parallel=fsdp``): PyTorch's FSDP2 under ``torchrun``
(docs/distributed.md, "FSDP2").

Each block and the root are FSDP units. `shard` distributes a plain model that rank 0 alone holds
(meta-device build, one tensor scattered at a time; buffers and ``mult`` broadcast whole); `gather`,
`gather_optimizer` and `shard_optimizer` bring model and optimizer state back to rank 0's host, where
a growth on the host path runs exactly as in one process (the other path: `grow.fsdp_growth.sharded`).
"""

from __future__ import annotations

import functools
import sys
from contextlib import contextmanager

import torch
import torch.distributed as dist

from grow.errors import ConfigError
from grow.masks import build_model, install_from_state_dict
from grow.model import Transformer, TransformerConfig
from grow.parallel import distributed

PARALLEL = ("ddp", "fsdp")


def enabled(parallel: str) -> bool:
    """Whether this process shards its model: ``trainer.parallel=fsdp`` in a multi-process run."""
    return parallel == "fsdp" and distributed.is_initialized()


def check(run) -> None:
    """Refuse, before any rank joins (`grow.run.assemble`), what FSDP cannot run exactly (a strategy's own
    limits under FSDP would be its `check` hook's)."""
    if run.trainer.train_new_only and run.trainer.parallel == "fsdp" and distributed.wants_distributed():
        raise ConfigError("trainer.train_new_only", True, "false under trainer.parallel=fsdp (frozen parameters "
                                                          "are not sharded apart from trained ones here); ddp runs it")


def is_sharded(t) -> bool:
    """Whether ``t`` is a DTensor (FSDP2's sharded tensor). No DTensor exists before its module is
    imported, so an unsharded run never imports it (with sympy, ~1 s of start-up)."""
    dtensor = sys.modules.get("torch.distributed.tensor")
    return dtensor is not None and isinstance(t, dtensor.DTensor)


def is_sharded_model(model) -> bool:
    """Whether ``model`` is an FSDP2 model: every rank must run each of its forwards (no FSDP2 model
    exists before torch.distributed.fsdp is imported, as `is_sharded`)."""
    fsdp = sys.modules.get("torch.distributed.fsdp")
    return fsdp is not None and isinstance(model, fsdp.FSDPModule)


def local(t: torch.Tensor) -> torch.Tensor:
    """This rank's rows of a sharded tensor, sharing its storage (a plain tensor: itself)."""
    return t.detach().to_local() if is_sharded(t) else t


@functools.lru_cache(maxsize=None)
def _mesh(device_type: str, world: int):
    """The 1-D mesh of every rank (made once per process and device type, not at every growth)."""
    from torch.distributed.device_mesh import init_device_mesh

    return init_device_mesh(device_type, (world,))


# ---- a model's shards -----------------------------------------------------------------------------


def apply_fully_shard(model: torch.nn.Module, device: torch.device, *, mixed: torch.dtype | None = None,
                      reshard_after_forward: bool = True) -> torch.nn.Module:
    """``fully_shard`` each block, then the root; ``mixed``: the dtype blocks compute in on CUDA
    (FSDP2's MixedPrecisionPolicy: parameters gathered in it, gradients reduced in float32)."""
    from torch.distributed.fsdp import MixedPrecisionPolicy, fully_shard

    kw = {"mesh": _mesh(device.type, distributed.world_size()), "reshard_after_forward": reshard_after_forward}
    if mixed is not None and device.type == "cuda":
        kw["mp_policy"] = MixedPrecisionPolicy(param_dtype=mixed, reduce_dtype=torch.float32)
    for block in model.layers:
        fully_shard(block, **kw)
    fully_shard(model, **kw)
    return model


def _skeleton(sd: dict) -> dict:
    """What the other ranks need to build the model's module tree: tensor shapes and dtypes, values."""
    return {k: (("tensor", tuple(v.shape), v.dtype) if isinstance(v, torch.Tensor) else ("value", v))
            for k, v in sd.items()}


def _scatter(full: torch.Tensor | None, like, dtype: torch.dtype | None = None) -> torch.Tensor:
    """This rank's shard of rank 0's ``full`` (None elsewhere) in ``dtype`` (default ``like``'s),
    laid out as ``like`` (a DTensor)."""
    from torch.distributed.tensor import distribute_tensor

    dtype = dtype or like.dtype
    t = (full.to(device=like.device, dtype=dtype) if full is not None
         else torch.empty(like.shape, dtype=dtype, device=like.device))
    return distribute_tensor(t, like.device_mesh, like.placements).to_local()


def _broadcast(full: torch.Tensor | None, like: torch.Tensor) -> torch.Tensor:
    t = full.to(like.device).clone() if full is not None else torch.empty_like(like)
    dist.broadcast(t, src=0)
    return t


def empty(config, tensors: dict, device: torch.device, options: "ShardOptions", fill=None) -> torch.nn.Module:
    """The FSDP2 model at ``config`` with the growth masks ``tensors`` (its state dict's tensors, on the
    meta device) name, its shards allocated on ``device`` and not yet filled. With ``fill``: allocated one
    FSDP unit at a time, the root's own modules then each block, ``fill(model, names)`` called with the
    state-dict names of each as soon as it is, so that a caller copying values in and freeing them never
    holds them and the whole model at once (docs/distributed.md, "FSDP2")."""
    with torch.device("meta"):
        model = Transformer(config)
    install_from_state_dict(model, tensors)
    model = model.to(dtype=options.param_dtype)
    apply_fully_shard(model, device, mixed=options.mixed, reshard_after_forward=options.reshard_after_forward)
    if fill is None:
        model.to_empty(device=device)
        return model
    in_blocks = {id(m) for m in model.layers.modules()}
    for mod in model.modules():
        if id(mod) not in in_blocks:
            mod.to_empty(device=device, recurse=False)
    fill(model, _names(model, lambda name: not name.startswith("layers.")))
    model._apply(lambda t: t, recurse=False)  # FSDPModule._apply: FSDP2 takes the root's allocated shards
    for i, block in enumerate(model.layers):
        block.to_empty(device=device)  # a block is an FSDPModule: FSDP2 takes its shards in the same call
        fill(model, _names(model, lambda name, prefix=f"layers.{i}.": name.startswith(prefix)))
    return model


def _names(model: torch.nn.Module, keep) -> list[str]:
    """The state-dict names of ``model``'s parameters (tied ones under each name) and buffers that ``keep``."""
    named = [*model.named_parameters(remove_duplicate=False), *model.named_buffers()]
    return [name for name, _ in named if keep(name)]


@torch.no_grad()
def shard(plain, device: torch.device, options: "ShardOptions") -> torch.nn.Module:
    """The FSDP2 model of rank 0's plain ``plain`` (a `Transformer`, growth masks included; None on
    the other ranks), its parameters in ``options.param_dtype`` on ``device``."""
    sd = plain.state_dict() if plain is not None else None
    head = distributed.broadcast_object((plain.config.to_dict(), _skeleton(sd)) if plain is not None else None)
    config, skel = TransformerConfig.from_dict(head[0]), head[1]
    model = empty(config, {k: torch.empty(v[1], dtype=v[2], device="meta") for k, v in skel.items() if v[0] == "tensor"},
                  device, options)
    params = dict(model.named_parameters(remove_duplicate=False))
    buffers = dict(model.named_buffers())
    done: set[int] = set()
    for key, (kind, *rest) in skel.items():
        if kind == "value":  # a module's extra state: every Linear's mult
            model.get_submodule(key.rpartition(".")[0]).set_extra_state(rest[0])
            continue
        full = sd[key] if sd is not None else None
        if key in params:
            p = params[key]
            if id(p) not in done:  # a tied W_out is the embedding: once
                local(p).copy_(_scatter(full, p.detach()))
                done.add(id(p))
        else:
            buffers[key].copy_(_broadcast(full, buffers[key]))
    return model


@torch.no_grad()
def gather(model: torch.nn.Module):
    """The plain model (on rank 0's host, a `Transformer` with the same masks and multipliers) of a
    sharded one; None on the other ranks. Every rank takes part (one full parameter at a time)."""
    full = {}
    for key, value in model.state_dict().items():
        if is_sharded(value):
            value = value.full_tensor()
        if distributed.is_main():
            full[key] = value.detach().cpu().clone() if isinstance(value, torch.Tensor) else value
    return build_model(model.config, full) if distributed.is_main() else None


# ---- the optimizer's shards -----------------------------------------------------------------------


def optimizer_tensors(opt):
    """``(name, buffer, DTensor)`` for every per-element tensor of a sharded growth-aware optimizer
    (its moments, and its births as uint8 even where a rank's rows share one stage), each rank's
    rows laid out as the parameter's (every rank takes part in what it is used for)."""
    from torch.distributed.tensor import DTensor

    for name, entry in opt.state_dict()["state"].items():
        like = opt.sharded[name]
        for b, t in entry.items():
            t = opt.birth_stage(name) if b == "birth" else t
            yield name, b, DTensor.from_local(t, like.device_mesh, like.placements, shape=like.shape,
                                             stride=like.stride(), run_check=False)


@torch.no_grad()
def gather_optimizer(opt) -> dict | None:
    """The state dict of a sharded growth-aware optimizer with whole tensors, on rank 0's host
    (None on the other ranks): `grow.optim.bookkeeping.GrowthAware.load_state_dict` of the plain
    model's optimizer takes it."""
    sd = opt.state_dict()
    state: dict = {name: {} for name in sd["state"]}
    for name, b, t in optimizer_tensors(opt):
        full = t.full_tensor()
        if distributed.is_main():
            state[name][b] = full.cpu()
    return {**sd, "state": state} if distributed.is_main() else None


@torch.no_grad()
def shard_optimizer(opt, full: dict | None) -> None:
    """Load rank 0's whole-tensor optimizer state dict ``full`` (None on the other ranks) into the
    optimizer of a sharded model: each rank keeps its shard of every buffer and birth tensor."""
    head = distributed.broadcast_object(
        {**full, "state": {n: _skeleton(e) for n, e in full["state"].items()}} if full is not None else None)
    state = {}
    for name, entry in head["state"].items():
        like = opt.sharded[name].detach()
        state[name] = {b: rest[0] if kind == "value" else
                       _scatter(full["state"][name][b] if full is not None else None, like, rest[1])
                       for b, (kind, *rest) in entry.items()}
    opt.load_state_dict({**head, "state": state})


# ---- what a run's sharding needs ------------------------------------------------------------------


class ShardOptions:
    """How a run shards its model: the parameters' dtype, the blocks' compute dtype on CUDA (FSDP2's
    mixed precision: the run's autocast dtype), and whether a block's gathered parameters are freed
    after its forward (``trainer.fsdp_reshard_after_forward``: less memory, one more all-gather in
    the backward)."""

    def __init__(self, param_dtype: torch.dtype, mixed: torch.dtype | None, reshard_after_forward: bool):
        self.param_dtype, self.mixed, self.reshard_after_forward = param_dtype, mixed, reshard_after_forward

    @classmethod
    def of(cls, cfg, precision) -> "ShardOptions":
        return cls(precision.param_dtype, precision.amp, bool(cfg.trainer.fsdp_reshard_after_forward))


@contextmanager
def gradient_sync(model: torch.nn.Module, on: bool):
    """FSDP2's counterpart of DDP's ``no_sync``: with ``on`` false, a micro-batch's gradients are
    accumulated unsharded and reduce-scattered with the last micro-batch's."""
    model.set_requires_gradient_sync(on)
    try:
        yield
    finally:
        model.set_requires_gradient_sync(True)
