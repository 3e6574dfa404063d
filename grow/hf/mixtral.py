"""grow's Llama-family mixture of experts (``n_experts`` > 1, docs/model.md, "Mixture of experts") as a Hugging Face
``MixtralForCausalLM``, and back (docs/hf.md, "Mixtral").

The attention, norms and embeddings map as `grow.hf.llama` maps them; layer n's router is Mixtral's ``gate``
and expert e's gate / up / down projections (``mlp.experts.e.gate``, ``fc1``, ``fc2``) are the checkpoint's
``w1`` / ``w3`` / ``w2`` (transformers' in-memory ``experts.gate_up_proj`` stacks [gate; up] per expert, and
``down_proj``). Mixtral's router is a softmax, top-k and renormalization, grow's `MoE`; no sliding window. Reading
takes the hub's per-expert layout (``block_sparse_moe.experts.e.w1``) and transformers' stacked one.
"""

from __future__ import annotations

import torch

from grow.hf.llama import (
    LAYER_NAMES,
    assemble,
    folded,
    from_llama_config,
    llama_blockers,
    loaded,
    masks_blocker,
    read_llama_weights,
)
from grow.model import Transformer, TransformerConfig

ATTENTION = {k: v for k, v in LAYER_NAMES.items() if not k.startswith("mlp.")}  # grow's -> transformers' names


def mixtral_blockers(cfg: TransformerConfig) -> list[str]:
    """Why ``cfg`` is not a ``MixtralForCausalLM`` (empty: it is one)."""
    out = [] if cfg.moe else ["n_experts=1 (a dense model: a LlamaForCausalLM when it is one)"]
    if cfg.family not in (None, "llama"):  # an upcycled Qwen2, Gemma, ...: grow's own export keeps its flags
        out.append(f"family={cfg.family} (Mixtral's layers are Llama's)")
    return out + [b for b in llama_blockers(cfg.replace(n_experts=1, top_k=1))]


def mixtral_config(cfg: TransformerConfig, *, tied: bool, dtype: torch.dtype = torch.float32):
    """The ``MixtralConfig`` of a grow config that `mixtral_blockers` lets through."""
    from transformers import MixtralConfig

    return MixtralConfig(
        vocab_size=cfg.vocab_size, hidden_size=cfg.d_model, intermediate_size=cfg.d_ff,
        num_hidden_layers=cfg.n_layers, num_attention_heads=cfg.n_heads, num_key_value_heads=cfg.kv_heads,
        head_dim=cfg.d_qk, max_position_embeddings=cfg.seq_len, rms_norm_eps=cfg.norm_eps / cfg.d_model,
        rope_theta=cfg.rope_theta, hidden_act="silu", tie_word_embeddings=tied, initializer_range=cfg.init_std,
        attention_dropout=0.0, sliding_window=None, num_local_experts=cfg.n_experts,
        num_experts_per_tok=cfg.top_k, router_aux_loss_coef=cfg.router_aux_coef, router_jitter_noise=0.0,
        torch_dtype=str(dtype).removeprefix("torch."),
    )


def to_mixtral_state(model: Transformer) -> tuple[dict[str, torch.Tensor], bool]:
    """(``MixtralForCausalLM`` state dict in transformers' in-memory layout, tied), multipliers folded."""
    cfg = model.config
    blockers = mixtral_blockers(cfg) + masks_blocker(model)
    if blockers:
        raise ValueError("not a MixtralForCausalLM: " + "; ".join(blockers))
    sd = {"model.embed_tokens.weight": model.wte.weight.detach(), "model.norm.weight": model.norm.weight.detach()}
    for n, layer in enumerate(model.layers):
        pre = f"model.layers.{n}."
        for ours, theirs in ATTENTION.items():
            sd[f"{pre}{theirs}.weight"] = folded(layer.get_submodule(ours))
        sd[f"{pre}mlp.gate.weight"] = folded(layer.mlp.router)
        experts = layer.mlp.experts
        sd[f"{pre}mlp.experts.gate_up_proj"] = torch.stack([torch.cat([folded(e.gate), folded(e.fc1)]) for e in experts])
        sd[f"{pre}mlp.experts.down_proj"] = torch.stack([folded(e.fc2) for e in experts])
    tied = cfg.tie_embeddings and model.lm_head.mult == 1.0
    if not tied:
        sd["lm_head.weight"] = folded(model.lm_head)
    return {k: v.contiguous() for k, v in sd.items()}, tied


def to_mixtral(model: Transformer, dtype: torch.dtype = torch.float32):
    """A ``MixtralForCausalLM`` computing what ``model`` computes, in ``dtype``."""
    from transformers import MixtralForCausalLM

    sd, tied = to_mixtral_state(model)
    return loaded(MixtralForCausalLM, mixtral_config(model.config, tied=tied, dtype=dtype), sd, tied, dtype)


# ---- in: a MixtralForCausalLM directory as a grow model -----------------------------------------------------
def from_mixtral_config(config: dict, seq_len: int | None = None) -> TransformerConfig:
    """The grow config of a Mixtral config.json's dict; ``ValueError`` naming what grow cannot express exactly."""
    from transformers import LlamaConfig

    if config.get("sliding_window") not in (None, 0) and config["sliding_window"] < (seq_len or config.get(
            "max_position_embeddings", 0)):
        raise ValueError(f"cannot be expressed exactly: sliding_window={config['sliding_window']} (grow attends to "
                         "the whole context)")
    if config.get("router_jitter_noise"):
        raise ValueError(f"cannot be expressed exactly: router_jitter_noise={config['router_jitter_noise']}")
    llama = LlamaConfig.from_dict({k: v for k, v in config.items() if k not in ("model_type", "architectures")})
    dense = from_llama_config(llama, seq_len)
    return dense.replace(family=None, n_experts=int(config.get("num_local_experts", 8)), top_k=int(config.get(
        "num_experts_per_tok", 2)), router_aux_coef=float(config.get("router_aux_loss_coef", 0.001)))


def _expert_weights(weights: dict, n: int, X: int) -> dict[str, torch.Tensor]:
    """Layer n's router and experts under grow's names, from the hub layout or transformers' stacked one."""
    pre, out = f"model.layers.{n}.", {}
    stacked = f"{pre}mlp.experts.gate_up_proj"
    if stacked in weights:
        out[f"layers.{n}.mlp.router.weight"] = weights[f"{pre}mlp.gate.weight"]
        for e in range(X):
            gate, up = weights[stacked][e].chunk(2, dim=0)
            out.update({f"layers.{n}.mlp.experts.{e}.gate.weight": gate, f"layers.{n}.mlp.experts.{e}.fc1.weight": up,
                        f"layers.{n}.mlp.experts.{e}.fc2.weight": weights[f"{pre}mlp.experts.down_proj"][e]})
        return out
    moe = f"{pre}block_sparse_moe."
    names = {f"layers.{n}.mlp.router.weight": f"{moe}gate.weight"}
    for e in range(X):
        for ours, theirs in (("gate", "w1"), ("fc1", "w3"), ("fc2", "w2")):
            names[f"layers.{n}.mlp.experts.{e}.{ours}.weight"] = f"{moe}experts.{e}.{theirs}.weight"
    missing = [t for t in names.values() if t not in weights]
    if missing:
        raise ValueError(f"the checkpoint lacks {missing[0]} (and {len(missing) - 1} more): not a complete "
                         "MixtralForCausalLM")
    return {ours: weights[theirs] for ours, theirs in names.items()}


def mixtral_weights_as_grow(weights: dict[str, torch.Tensor], cfg: TransformerConfig) -> dict[str, torch.Tensor]:
    """A ``MixtralForCausalLM`` state dict under grow's names for a model of config ``cfg``; ``ValueError`` naming a
    missing tensor or a shape that differs."""
    ours = {"wte.weight": "model.embed_tokens.weight", "norm.weight": "model.norm.weight"}
    for n in range(cfg.n_layers):
        for mine, theirs in ATTENTION.items():
            ours[f"layers.{n}.{mine}.weight"] = f"model.layers.{n}.{theirs}.weight"
    if not cfg.tie_embeddings:
        ours["lm_head.weight"] = "lm_head.weight"
    missing = [theirs for theirs in ours.values() if theirs not in weights]
    if missing:
        raise ValueError(f"the checkpoint lacks {missing[0]} (and {len(missing) - 1} more): not a complete "
                         "MixtralForCausalLM")
    sd = {mine: weights[theirs] for mine, theirs in ours.items()}
    for n in range(cfg.n_layers):
        sd.update(_expert_weights(weights, n, cfg.n_experts))
    with torch.device("meta"):
        shapes = {n: p.shape for n, p in Transformer(cfg).named_parameters()}
    for name, t in sd.items():
        if t.shape != shapes[name]:
            raise ValueError(f"the checkpoint's tensor for {name} has shape {tuple(t.shape)}, grow's {tuple(shapes[name])}")
    return sd


def mixtral_model(path, cfg: TransformerConfig, dtype: torch.dtype = torch.float32) -> Transformer:
    """A grow `Transformer` of config ``cfg`` holding a Mixtral directory's weights."""
    return assemble(mixtral_weights_as_grow(read_llama_weights(path), cfg), cfg, dtype)
