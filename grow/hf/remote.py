"""Any grow model as a ``transformers`` model with its own modeling file (``trust_remote_code=True``;
docs/design.md §15): what ``grow export`` writes when the model is not a ``LlamaForCausalLM``
(`grow.hf.llama.llama_blockers`). The modeling file is `grow.hf.modeling_grow` (self-contained: torch and
transformers), copied beside the weights by ``save_pretrained`` and named in ``config.json``'s ``auto_map``.
The weights keep grow's names with every forward multiplier folded in (W = mult W) and W_out written
untied; growth masks (an unfinished msg ramp) are refused."""

from __future__ import annotations

import torch

from grow.hf.llama import folded, masks_blocker
from grow.model import Linear, Transformer

CONFIG_KEYS = ("vocab_size", "seq_len", "n_layers", "d_model", "n_heads", "d_qk", "d_v", "d_ff", "activation",
               "positions", "rope_theta", "rope_dim", "n_kv_heads", "mlp_bias", "norm_eps")


def to_remote_state(model: Transformer) -> dict[str, torch.Tensor]:
    """grow's parameters under grow's names, multipliers folded, ``lm_head.weight`` always present."""
    if masks_blocker(model):
        raise ValueError(masks_blocker(model)[0])
    sd = {name: p.detach() for name, p in model.named_parameters()}
    for name, module in model.named_modules():
        if isinstance(module, Linear):  # W_out included: written untied whatever the model ties
            sd[f"{name}.weight"] = folded(module)
    return {k: v.contiguous() for k, v in sd.items()}


def to_remote(model: Transformer, dtype: torch.dtype = torch.float32):
    """A ``GrowForCausalLM`` (`grow.hf.modeling_grow`) computing what ``model`` computes, in ``dtype``,
    registered for the auto classes so that ``save_pretrained`` writes the modeling file and ``auto_map``."""
    from grow.hf.modeling_grow import GrowConfig, GrowForCausalLM

    GrowConfig.register_for_auto_class()
    GrowForCausalLM.register_for_auto_class("AutoModelForCausalLM")
    cfg = model.config
    config = GrowConfig(**{k: getattr(cfg, k) for k in CONFIG_KEYS}, torch_dtype=str(dtype).removeprefix("torch."))
    hf = GrowForCausalLM(config).to(dtype)
    hf.load_state_dict({k: v.to(dtype) for k, v in to_remote_state(model).items()}, strict=True)
    return hf.eval()
