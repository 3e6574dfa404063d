"""grow's Llama-family `Transformer` as a Hugging Face ``LlamaForCausalLM``, and back (docs/design.md §15).

A grow model exports as a ``LlamaForCausalLM`` when `llama_blockers` is empty; then the two compute
the same function once every ``mult`` is folded into its weight and ``rms_norm_eps`` = eps / h (grow
adds eps to the sum of squares). `from_llama` reads such a directory (config.json and safetensors)
into a grow model and refuses in one line what grow cannot express exactly. The mapping and the
exactness tests: docs/design.md §15.
"""

from __future__ import annotations

import torch

from grow.growth.masks import has_masks
from grow.model import Transformer, TransformerConfig


def llama_blockers(cfg: TransformerConfig) -> list[str]:
    """Why ``cfg`` is not a ``LlamaForCausalLM`` (empty: it is one), each a short phrase."""
    out = []
    if cfg.positions != "rope":
        out.append("positions=learned (Llama rotates queries and keys)")
    elif cfg.rope_anchor != cfg.d_qk:
        out.append(f"rotary frequencies anchored at rope_dim={cfg.rope_anchor}, not at its head size "
                   f"d_qk={cfg.d_qk} (a stage before the end of its plan)")
    if cfg.activation != "swiglu":
        out.append(f"activation={cfg.activation} (Llama's MLP is SwiGLU)")
    if cfg.mlp_bias:
        out.append("mlp_bias=true (Llama's MLP has no biases)")
    if cfg.d_qk != cfg.d_v:
        out.append(f"d_qk={cfg.d_qk} != d_v={cfg.d_v} (Llama has one head_dim)")
    if cfg.moe:
        out.append(f"n_experts={cfg.n_experts} (a mixture of experts: a MixtralForCausalLM, grow.hf.mixtral)")
    return out


def llama_config(cfg: TransformerConfig, *, tied: bool, dtype: torch.dtype = torch.float32):
    """The ``LlamaConfig`` of a grow model config that `llama_blockers` lets through."""
    from transformers import LlamaConfig

    return LlamaConfig(
        vocab_size=cfg.vocab_size, hidden_size=cfg.d_model, intermediate_size=cfg.d_ff,
        num_hidden_layers=cfg.n_layers, num_attention_heads=cfg.n_heads, num_key_value_heads=cfg.kv_heads,
        head_dim=cfg.d_qk, max_position_embeddings=cfg.seq_len, rms_norm_eps=cfg.norm_eps / cfg.d_model,
        rope_theta=cfg.rope_theta, hidden_act="silu", attention_bias=False, mlp_bias=False,
        tie_word_embeddings=tied, initializer_range=cfg.init_std, attention_dropout=0.0,
        torch_dtype=str(dtype).removeprefix("torch."),
    )


# grow's module -> transformers' module, per layer
LAYER_NAMES = {"attn.q": "self_attn.q_proj", "attn.k": "self_attn.k_proj", "attn.v": "self_attn.v_proj",
               "attn.o": "self_attn.o_proj", "mlp.gate": "mlp.gate_proj", "mlp.fc1": "mlp.up_proj",
               "mlp.fc2": "mlp.down_proj", "attn_norm": "input_layernorm", "mlp_norm": "post_attention_layernorm"}


def masks_blocker(model: Transformer) -> list[str]:
    """Why ``model`` cannot be exported as it is because of growth masks (empty: it holds none)."""
    return ["growth masks (msg's ramp is unfinished: export after it ends, ramp_steps steps after the growth)"] \
        if has_masks(model) else []


def folded(module) -> torch.Tensor:
    """The weight a module applies: a Linear's mult folded in (W_hf = mult W), a norm gain as it is."""
    w = module.weight.detach()
    mult = getattr(module, "mult", 1.0)
    return w if mult == 1.0 else w * mult


def to_llama_state(model: Transformer) -> tuple[dict[str, torch.Tensor], bool]:
    """(``LlamaForCausalLM`` state dict, tied): grow's parameters under transformers' names, multipliers
    folded. ``ValueError`` naming what differs when the model is not a Llama (`llama_blockers`, masks)."""
    cfg = model.config
    blockers = llama_blockers(cfg) + masks_blocker(model)
    if blockers:
        raise ValueError("not a LlamaForCausalLM: " + "; ".join(blockers))
    sd = {"model.embed_tokens.weight": model.wte.weight.detach(), "model.norm.weight": model.norm.weight.detach()}
    for n, layer in enumerate(model.layers):
        for ours, theirs in LAYER_NAMES.items():
            sd[f"model.layers.{n}.{theirs}.weight"] = folded(layer.get_submodule(ours))
    tied = cfg.tie_embeddings and model.lm_head.mult == 1.0
    if not tied:
        sd["lm_head.weight"] = folded(model.lm_head)
    return {k: v.contiguous() for k, v in sd.items()}, tied


def to_llama(model: Transformer, dtype: torch.dtype = torch.float32):
    """A ``LlamaForCausalLM`` computing what ``model`` computes (see the module docstring), in ``dtype``."""
    from transformers import LlamaForCausalLM

    sd, tied = to_llama_state(model)
    hf = LlamaForCausalLM(llama_config(model.config, tied=tied, dtype=dtype)).to(dtype)
    missing, unexpected = hf.load_state_dict({k: v.to(dtype) for k, v in sd.items()}, strict=False)
    allowed = {"lm_head.weight"} if tied else set()
    if set(missing) - allowed or unexpected:  # pragma: no cover - a transformers version with other names
        raise RuntimeError(f"LlamaForCausalLM names differ: missing {sorted(missing)}, unexpected {sorted(unexpected)}")
    if tied:
        hf.tie_weights()
    return hf.eval()


# ---- in: a LlamaForCausalLM directory as a grow model ------------------------------------------------------
def from_llama_config(hf_config, seq_len: int | None = None) -> TransformerConfig:
    """The grow config of a ``LlamaConfig`` (``seq_len``: the training context; default its
    ``max_position_embeddings``). ``ValueError`` naming the first thing grow cannot express exactly."""
    get = lambda key, default=None: getattr(hf_config, key, default)  # noqa: E731
    if get("model_type") != "llama":
        raise ValueError(f"model_type={get('model_type')!r}: only a LlamaForCausalLM or grow's own export loads (a "
                         f"{get('model_type')} model's layers are not grow's pre-RMSNorm decoder)")
    rope = get("rope_parameters") or get("rope_scaling") or {}
    theta = rope.get("rope_theta", get("rope_theta"))
    checks = [(get("hidden_act") == "silu", f"hidden_act={get('hidden_act')!r} (grow's SwiGLU uses silu)"),
              (not get("attention_bias", False), "attention_bias=true (grow's attention has no biases)"),
              (not get("mlp_bias", False), "mlp_bias=true"),
              (rope.get("rope_type", "default") == "default", f"rope scaling {rope.get('rope_type')!r} (grow "
                                                              "rotates at the plain frequencies)"),
              (get("pretraining_tp", 1) == 1, "pretraining_tp != 1"), (theta is not None, "no rope_theta")]
    for ok, what in checks:
        if not ok:
            raise ValueError(f"cannot be expressed exactly: {what}")
    h, E = get("hidden_size"), get("num_attention_heads")
    k = get("head_dim") or h // E
    return TransformerConfig(
        vocab_size=get("vocab_size"), seq_len=int(seq_len or get("max_position_embeddings")),
        n_layers=get("num_hidden_layers"), d_model=h, n_heads=E, d_qk=k, d_v=k, d_ff=get("intermediate_size"),
        activation="swiglu", positions="rope", rope_theta=float(theta), n_kv_heads=get("num_key_value_heads") or E,
        mlp_bias=False, tie_embeddings=bool(get("tie_word_embeddings", False)), norm_eps=get("rms_norm_eps") * h,
        init_std=get("initializer_range", 0.02))


def read_llama_weights(path) -> dict[str, torch.Tensor]:
    """The tensors of a model directory's safetensors files (one file, or the shards its index names)."""
    from pathlib import Path

    from safetensors.torch import load_file

    path = Path(path)
    index = path / "model.safetensors.index.json"
    if index.is_file():
        import json

        files = sorted(set(json.loads(index.read_text())["weight_map"].values()))
    elif (path / "model.safetensors").is_file():
        files = ["model.safetensors"]
    else:
        raise ValueError(f"no model.safetensors (nor model.safetensors.index.json) in {path}: save the model with "
                         "save_pretrained(..., safe_serialization=True)")
    out: dict[str, torch.Tensor] = {}
    for name in files:
        out.update(load_file(str(path / name)))
    return out


def llama_weights_as_grow(weights: dict[str, torch.Tensor], cfg: TransformerConfig) -> dict[str, torch.Tensor]:
    """A ``LlamaForCausalLM`` state dict under grow's names for a model of config ``cfg`` (``lm_head.weight``
    left out when ``cfg`` ties it). ``ValueError`` naming a missing tensor or a shape that differs."""
    ours = {"wte.weight": "model.embed_tokens.weight", "norm.weight": "model.norm.weight"}
    for n in range(cfg.n_layers):
        for mine, theirs in LAYER_NAMES.items():
            ours[f"layers.{n}.{mine}.weight"] = f"model.layers.{n}.{theirs}.weight"
    if not cfg.tie_embeddings:
        ours["lm_head.weight"] = "lm_head.weight"
    missing = [theirs for theirs in ours.values() if theirs not in weights]
    if missing:
        raise ValueError(f"the checkpoint lacks {missing[0]} (and {len(missing) - 1} more): not a complete "
                         "LlamaForCausalLM")
    with torch.device("meta"):
        shapes = {n: p.shape for n, p in Transformer(cfg).named_parameters()}
    for mine, theirs in ours.items():
        if weights[theirs].shape != shapes[mine]:
            raise ValueError(f"{theirs} has shape {tuple(weights[theirs].shape)}, grow's {mine} {tuple(shapes[mine])}")
    return {mine: weights[theirs] for mine, theirs in ours.items()}


def assemble(sd: dict[str, torch.Tensor], cfg: TransformerConfig, dtype: torch.dtype) -> Transformer:
    """A grow `Transformer` of config ``cfg`` holding the tensors ``sd`` (grow's names; W_out tied to E when
    ``cfg`` ties them), multipliers 1."""
    with torch.device("meta"):
        model = Transformer(cfg)
    model.load_state_dict({k: v.to(dtype) for k, v in sd.items()}, strict=False, assign=True)
    if cfg.tie_embeddings:
        model.lm_head.weight = model.wte.weight
    return model


def llama_model(path, cfg: TransformerConfig, dtype: torch.dtype = torch.float32) -> Transformer:
    """A grow `Transformer` of config ``cfg`` holding the directory's weights (`llama_weights_as_grow`)."""
    return assemble(llama_weights_as_grow(read_llama_weights(path), cfg), cfg, dtype)


def read_config(path) -> dict:
    """A model directory's config.json as a dict: read as data, so no code of the directory runs (transformers'
    ``AutoConfig`` would ask to run a custom-code model's). ``ValueError`` when it is not a JSON object."""
    import json
    from pathlib import Path

    try:
        config = json.loads((Path(path) / "config.json").read_text())
    except (OSError, ValueError) as exc:
        raise ValueError(f"config.json cannot be read: {exc}") from None
    if not isinstance(config, dict):
        raise ValueError("config.json is not a JSON object")
    return config


def llama_config_of(config: dict):
    """The ``LlamaConfig`` of a config.json's dict (transformers' defaults for what it leaves out); another
    model type as it is, for `from_llama_config` to name."""
    from types import SimpleNamespace

    from transformers import LlamaConfig

    return LlamaConfig.from_dict(config) if config.get("model_type") == "llama" else SimpleNamespace(**config)


def from_llama(path, seq_len: int | None = None, dtype: torch.dtype = torch.float32) -> Transformer:
    """A grow `Transformer` holding a ``LlamaForCausalLM`` directory's weights (config.json + safetensors),
    computing what it computes (the mapping of the module docstring, backwards: eps = rms_norm_eps x h)."""
    return llama_model(path, from_llama_config(llama_config_of(read_config(path)), seq_len), dtype).eval()
