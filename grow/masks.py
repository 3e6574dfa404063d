"""Growth masks: a `Transformer` whose new structure enters multiplied by a mask (the ``msg`` strategy; the
``upcycle`` strategy's new experts that start unused).

The model side of Masked Structural Growth (Yao et al., ICLR 2024): mask buffers on modules whose
class is swapped for a masked subclass (the plain classes of `grow.model` are untouched), the
mask-weighted RMSNorm, and `build_model`, which restores masks from a state dict. Which masks and
how they ramp: `grow.growth.msg`; both in docs/strategies.md, "stack, hyperclone, msg", "msg in detail".
Beside `grow.model`, below the strategies: a checkpoint's loader or FSDP's gather builds a masked model
without them.
"""

from __future__ import annotations

from collections.abc import Iterator, Mapping

import torch
import torch.nn as nn

from grow.model import Block, Linear, MoE, RMSNorm, Transformer, TransformerConfig

MASK_BUFFERS = ("mask_in", "mask_out", "mask_gate", "mask_stat", "mask_block", "mask_experts")


class MaskedLinear(Linear):
    """`Linear` with ``mask_in`` / ``mask_out`` / ``mask_gate`` (see the module docstring)."""

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if self.mask_in is not None:
            x = x * self.mask_in
        y = super().forward(x)
        if self.mask_out is not None:
            y = y * self.mask_out
        if self.mask_gate is not None:
            y = y * self.mask_gate
        return y


class MaskedEmbedding(nn.Embedding):
    """``nn.Embedding`` whose output is multiplied by ``mask_out``."""

    def forward(self, idx: torch.Tensor) -> torch.Tensor:
        return super().forward(idx) * self.mask_out


class MaskedRMSNorm(RMSNorm):
    """`RMSNorm` with mask-weighted statistics: g x / sqrt((sum m x^2 + eps) / sum m)."""

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        m = self.mask_stat
        ms = ((x * x * m).sum(-1, keepdim=True) + self.eps) / m.sum()
        return x * torch.rsqrt(ms) * self.weight


class MaskedBlock(Block):
    """`Block` blended with its input by ``mask_block`` (a scalar c): c block(x) + (1 - c) x, as
    MSG's encoder mixes a new layer's output (``BertEncoderEx.forward``)."""

    def forward(self, x: torch.Tensor, score_hook=None, rope=None) -> torch.Tensor:
        c = self.mask_block
        return super().forward(x, score_hook, rope) * c + x * (1 - c)


class MaskedMoE(MoE):
    """`MoE` whose experts enter by ``mask_experts`` (m_e in [0, 1], one per expert): each token's scores p_e m_e
    choose its top_k and, renormalized, weight them (``upcycle``'s new experts that start unused: m = 0 keeps them
    out of every top-k while k old experts remain, so the function is the old one; docs/model.md, "Experts")."""

    def route(self, probs: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        return super().route(probs * self.mask_experts)


MASKED: dict[type, type] = {
    Linear: MaskedLinear, nn.Embedding: MaskedEmbedding, RMSNorm: MaskedRMSNorm, Block: MaskedBlock, MoE: MaskedMoE,
}
PLAIN: dict[type, type] = {v: k for k, v in MASKED.items()}
ALLOWED: dict[type, tuple[str, ...]] = {
    MaskedLinear: ("mask_in", "mask_out", "mask_gate"),
    MaskedEmbedding: ("mask_out",),
    MaskedRMSNorm: ("mask_stat",),
    MaskedBlock: ("mask_block",),
    MaskedMoE: ("mask_experts",),
}


def _kind(module: nn.Module) -> type:
    """The model class of ``module``: its own, or under FSDP2, whose ``fully_shard`` makes a block an
    instance of a subclass ``FSDP<class>``, the class that subclass wraps."""
    return next(c for c in type(module).__mro__ if c in MASKED or c in PLAIN or c is nn.Module)


def _set_class(module: nn.Module, cls: type) -> None:
    """``module.__class__ = cls``, keeping a sharded module sharded: an FSDP2 module gets
    ``FSDP<cls>`` (made as ``fully_shard`` makes it, once per class)."""
    from torch.distributed.fsdp import FSDPModule

    if isinstance(module, FSDPModule):
        cls = _FSDP_CLASSES.setdefault(cls, type(f"FSDP{cls.__name__}", (FSDPModule, cls), {}))
    module.__class__ = cls


_FSDP_CLASSES: dict[type, type] = {}


def _ref(module: nn.Module) -> torch.Tensor:
    """A tensor of ``module`` whose device and dtype its masks take (its weight, or its first parameter)."""
    w = getattr(module, "weight", None)
    return w if isinstance(w, torch.Tensor) else next(module.parameters())


def set_mask(module: nn.Module, name: str, values: torch.Tensor) -> None:
    """Give ``module`` the mask buffer ``name`` (a copy of ``values`` on its device and dtype)."""
    cls = _kind(module)
    masked = MASKED.get(cls, cls)
    if masked not in ALLOWED or name not in ALLOWED[masked]:
        raise ValueError(f"a {cls.__name__} cannot hold a mask {name!r}")
    if masked is not cls:
        _set_class(module, masked)
        for buf in ALLOWED[masked]:
            module.register_buffer(buf, None)
    ref = _ref(module)
    module.register_buffer(name, values.detach().to(device=ref.device, dtype=ref.dtype).clone())


def remove_mask(module: nn.Module, name: str) -> None:
    """Drop the mask ``name``; a module left without masks gets its plain class back."""
    module._buffers[name] = None
    kind = _kind(module)
    if all(module._buffers.get(b) is None for b in ALLOWED[kind]):
        for b in ALLOWED[kind]:
            del module._buffers[b]
        _set_class(module, PLAIN[kind])


def mask_buffers(model: nn.Module) -> Iterator[tuple[str, nn.Module, str, torch.Tensor]]:
    """``(module name, module, buffer name, tensor)`` for every mask buffer of ``model``."""
    for mod_name, module in model.named_modules():
        for name in ALLOWED.get(_kind(module), ()):
            t = module._buffers.get(name)
            if t is not None:
                yield mod_name, module, name, t


def masks(model: nn.Module) -> dict[str, dict[str, torch.Tensor]]:
    """``{module name: {buffer name: tensor}}`` of every mask of ``model`` (the tensors themselves)."""
    out: dict[str, dict[str, torch.Tensor]] = {}
    for mod_name, _, name, t in mask_buffers(model):
        out.setdefault(mod_name, {})[name] = t
    return out


def has_masks(model: nn.Module) -> bool:
    return any(_kind(m) in ALLOWED for m in model.modules())


def install_from_state_dict(model: nn.Module, state_dict: Mapping[str, torch.Tensor]) -> None:
    """Create the masked modules that ``state_dict``'s mask keys (``<module>.mask_*``) name, with
    empty buffers of the right shape (on the module's device) for ``load_state_dict`` to fill."""
    for key, value in state_dict.items():
        mod_name, _, name = key.rpartition(".")
        if name in MASK_BUFFERS:
            module = model.get_submodule(mod_name)
            if module._buffers.get(name) is None or module._buffers[name].shape != value.shape:
                set_mask(module, name, torch.empty(value.shape, dtype=value.dtype, device=_ref(module).device))


def build_model(config: TransformerConfig, state_dict: Mapping[str, torch.Tensor]) -> Transformer:
    """A `Transformer` at ``config`` holding ``state_dict`` (growth masks included), built on the meta
    device and loaded by assignment (its tensors become the model's; tied W_out re-tied)."""
    with torch.device("meta"):
        model = Transformer(config)
    install_from_state_dict(model, state_dict)
    model.load_state_dict(state_dict, assign=True)
    if config.tie_embeddings:
        model.lm_head.weight = model.wte.weight
    return model
