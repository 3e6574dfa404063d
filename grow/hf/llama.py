"""grow's `Transformer` as a Hugging Face model of its family (``LlamaForCausalLM``, ``MistralForCausalLM``,
``Qwen2ForCausalLM``, ``Qwen3ForCausalLM``, ``GemmaForCausalLM``: `grow.families`), and back (docs/hf.md and "Checkpoint families").

A grow model exports as its family's class (grow's own model: a ``LlamaForCausalLM``) when `llama_blockers` is
empty; then the two compute the same function once every ``mult`` is folded into its weight and
``rms_norm_eps`` = eps / h (grow adds eps to the sum of squares). `from_llama` reads such a directory
(config.json and safetensors) into a grow model and refuses in one line, naming the config field and its
value, what grow cannot express exactly.
"""

from __future__ import annotations

import math

import torch

from grow import schema
from grow.families import FAMILIES, Family, Llama, export_blockers, family_of
from grow.masks import has_masks
from grow.model import Transformer, TransformerConfig


def llama_blockers(cfg: TransformerConfig) -> list[str]:
    """Why ``cfg`` is not its family's transformers class (grow's own model: a ``LlamaForCausalLM``), each a short
    phrase; empty: it is one (`grow.families.export_blockers`)."""
    return export_blockers(cfg)


def hf_family(cfg: TransformerConfig) -> type[Family]:
    """The family an export of ``cfg`` writes: its own, grow's own model as a Llama."""
    return family_of(cfg) or Llama


def rope_parameters(cfg: TransformerConfig) -> dict:
    """transformers' ``rope_parameters``: the base, and Llama 3's scaling when the config has it."""
    if cfg.rope_factor == 1.0:
        return {"rope_type": "default", "rope_theta": cfg.rope_theta}
    return {"rope_type": "llama3", "rope_theta": cfg.rope_theta, "factor": cfg.rope_factor,
            "low_freq_factor": cfg.rope_low_freq_factor, "high_freq_factor": cfg.rope_high_freq_factor,
            "original_max_position_embeddings": cfg.rope_original_positions}


def llama_config(cfg: TransformerConfig, *, tied: bool, dtype: torch.dtype = torch.float32):
    """The transformers config (``LlamaConfig``, ``Qwen3Config``, ...) of a grow model config that `llama_blockers`
    lets through. Its one ``rms_norm_eps`` is grow's eps / h (a Qwen3 whose h grew: eps_qk / k differs; the
    bound: docs/design.md, "Checkpoint families")."""
    from transformers import CONFIG_MAPPING

    family = hf_family(cfg)
    extra = {"mistral": {"sliding_window": cfg.sliding_window}, "qwen2": {"use_sliding_window": False},
             "qwen3": {"use_sliding_window": False, "attention_bias": False},
             "gemma": {"hidden_act": "gelu_pytorch_tanh", "attention_bias": False},
             "llama": {"hidden_act": "silu", "attention_bias": False, "mlp_bias": False}}[family.name]
    return CONFIG_MAPPING[family.name](
        vocab_size=cfg.vocab_size, hidden_size=cfg.d_model, intermediate_size=cfg.d_ff,
        num_hidden_layers=cfg.n_layers, num_attention_heads=cfg.n_heads, num_key_value_heads=cfg.kv_heads,
        head_dim=cfg.d_qk, max_position_embeddings=max(cfg.seq_len, cfg.rope_original_positions if cfg.rope_factor
                                                       != 1.0 else 0),
        rms_norm_eps=cfg.norm_eps / cfg.d_model, rope_parameters=rope_parameters(cfg),
        tie_word_embeddings=tied, initializer_range=cfg.init_std, attention_dropout=0.0,
        torch_dtype=str(dtype).removeprefix("torch."), **extra)


# grow's module -> transformers' module, per layer
LAYER_NAMES = {"attn.q": "self_attn.q_proj", "attn.k": "self_attn.k_proj", "attn.v": "self_attn.v_proj",
               "attn.o": "self_attn.o_proj", "mlp.gate": "mlp.gate_proj", "mlp.fc1": "mlp.up_proj",
               "mlp.fc2": "mlp.down_proj", "attn_norm": "input_layernorm", "mlp_norm": "post_attention_layernorm"}
QK_NORMS = {"attn.q_norm": "self_attn.q_norm", "attn.k_norm": "self_attn.k_norm"}
NORMS = ("attn_norm.weight", "mlp_norm.weight", "norm.weight")  # Gemma stores these gains as w = g - 1
TRUNK_NAMES = {"wte": "model.embed_tokens", "norm": "model.norm", "lm_head": "lm_head"}


def param_names(cfg: TransformerConfig) -> dict[str, str]:
    """grow's parameter name -> transformers', for every parameter of the model (`grow.schema.param_names`: the
    family's flags add theirs there, q/k/v biases, q/k norms; the output layer only when untied)."""
    modules = {**LAYER_NAMES, **QK_NORMS}
    out = {}
    for name in schema.param_names(cfg):
        module, attr = name.rsplit(".", 1)
        if module.startswith("layers."):
            _, n, inner = module.split(".", 2)
            out[name] = f"model.layers.{n}.{modules[inner]}.{attr}"
        else:
            out[name] = f"{TRUNK_NAMES[module]}.{attr}"
    return out


def gain_offset(cfg: TransformerConfig, name: str) -> float:
    """What transformers' gain adds to the stored weight: 1 for Gemma's (1 + w) RMSNorms, else 0."""
    return 1.0 if hf_family(cfg).name == "gemma" and name.endswith(NORMS) else 0.0


def embed_factor(cfg: TransformerConfig) -> float:
    """transformers' embedding table = grow's x this: Gemma multiplies by sqrt(d_model) of the model it builds,
    grow by the checkpoint's ``embed_scale`` (kept as d grows), so the table carries their ratio."""
    return cfg.embed_scale / math.sqrt(cfg.d_model) if hf_family(cfg).name == "gemma" else cfg.embed_scale


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
    """(transformers state dict, tied): grow's parameters under the family's names, multipliers folded, Gemma's
    gains as g - 1 and its embedding table rescaled (`embed_factor`; untied then, the output layer unscaled).
    ``ValueError`` naming what differs when the model is not its family's class (`llama_blockers`, masks)."""
    cfg = model.config
    blockers = llama_blockers(cfg) + masks_blocker(model)
    if blockers:
        raise ValueError(f"not a {hf_family(cfg).hf_class}: " + "; ".join(blockers))
    factor = embed_factor(cfg)
    tied = cfg.tie_embeddings and model.lm_head.mult == 1.0 and factor == 1.0
    sd = {}
    for ours, theirs in param_names(cfg.replace(tie_embeddings=tied)).items():
        module, attr = ours.rsplit(".", 1)
        w = folded(model.get_submodule(module)) if attr == "weight" else model.get_parameter(ours).detach()
        sd[theirs] = w - gain_offset(cfg, ours) if gain_offset(cfg, ours) else w
    if factor != 1.0:
        sd["model.embed_tokens.weight"] = sd["model.embed_tokens.weight"] * factor
    return {k: v.contiguous() for k, v in sd.items()}, tied


def to_llama(model: Transformer, dtype: torch.dtype = torch.float32):
    """The family's transformers model (``LlamaForCausalLM``, ``Qwen2ForCausalLM``, ...) computing what ``model``
    computes (see the module docstring), in ``dtype``."""
    import transformers

    sd, tied = to_llama_state(model)
    cls = getattr(transformers, hf_family(model.config).hf_class)
    return loaded(cls, llama_config(model.config, tied=tied, dtype=dtype), sd, tied, dtype)


def loaded(cls, config, sd: dict, tied: bool, dtype: torch.dtype):
    """``cls(config)`` holding the state dict ``sd`` in ``dtype`` (its output embedding tied where ``tied``), in
    eval mode; a name transformers does not expect is an error, not a silently random weight."""
    hf = cls(config).to(dtype)
    missing, unexpected = hf.load_state_dict({k: v.to(dtype) for k, v in sd.items()}, strict=False)
    allowed = {"lm_head.weight"} if tied else set()
    if set(missing) - allowed or unexpected:  # pragma: no cover - a transformers version with other names
        raise RuntimeError(f"{cls.__name__} names differ: missing {sorted(missing)}, unexpected {sorted(unexpected)}")
    if tied:
        hf.tie_weights()
    return hf.eval()


# ---- in: a LlamaForCausalLM directory as a grow model ------------------------------------------------------
def from_llama_config(hf_config, seq_len: int | None = None) -> TransformerConfig:
    """The grow config of a family's transformers config (``seq_len``: the training context; default its
    ``max_position_embeddings``). ``ValueError`` ``field=value: ...`` naming the first thing grow cannot express
    exactly."""
    get = lambda key, default=None: getattr(hf_config, key, default)  # noqa: E731
    family = FAMILIES.get(get("model_type"))
    if family is None:
        raise ValueError(f"model_type={get('model_type')!r}: grow imports {', '.join(FAMILIES)} (transformers' "
                         f"{', '.join(f.hf_class for f in FAMILIES.values())}) and its own export")
    rope = get("rope_parameters") or get("rope_scaling") or {}
    theta = rope.get("rope_theta", get("rope_theta"))
    act = "gelu_pytorch_tanh" if family.name == "gemma" else "silu"
    checks = [("hidden_act", get("hidden_act"), act, f"{family.hf_class}'s MLP is {family.fixed['activation'][1]}"),
              ("attention_bias", bool(get("attention_bias", False)), False, "grow's attention has no output bias"),
              ("mlp_bias", bool(get("mlp_bias", False)), False, "grow's gated MLP has no biases"),
              ("use_sliding_window", bool(get("use_sliding_window", False)), False, "a window in some layers only"),
              ("use_bidirectional_attention", bool(get("use_bidirectional_attention", False)), False, "causal only"),
              ("rope_type", rope.get("rope_type", "default"), ("default", "llama3"), "grow rotates at plain or "
                                                                                    "Llama 3-scaled frequencies"),
              ("partial_rotary_factor", rope.get("partial_rotary_factor", 1.0), 1.0, "every coordinate rotates"),
              ("pretraining_tp", get("pretraining_tp", 1), 1, "one tensor-parallel slice")]
    for key, value, allowed, why in checks:
        if value != allowed and not (isinstance(allowed, tuple) and value in allowed):
            raise ValueError(f"{key}={value!r}: cannot be expressed exactly (allowed: {allowed!r}; {why})")
    if theta is None:
        raise ValueError("rope_theta=None: cannot be expressed exactly (the rotary base is needed)")
    h, E = get("hidden_size"), get("num_attention_heads")
    k = get("head_dim") or h // E
    eps = get("rms_norm_eps")
    scaling = {} if rope.get("rope_type", "default") == "default" else {
        "rope_factor": float(rope["factor"]), "rope_low_freq_factor": float(rope["low_freq_factor"]),
        "rope_high_freq_factor": float(rope["high_freq_factor"]),
        "rope_original_positions": int(rope["original_max_position_embeddings"])}
    flags = {"qkv_bias": family.name == "qwen2", "qk_norm": family.name == "qwen3", "qk_norm_eps": eps * k,
             "sliding_window": get("sliding_window") if family.name == "mistral" else None,
             "embed_scale": math.sqrt(h) if family.name == "gemma" else 1.0,
             "activation": "geglu" if family.name == "gemma" else "swiglu"}
    return TransformerConfig(
        vocab_size=get("vocab_size"), seq_len=int(seq_len or get("max_position_embeddings")),
        n_layers=get("num_hidden_layers"), d_model=h, n_heads=E, d_qk=k, d_v=k, d_ff=get("intermediate_size"),
        positions="rope", rope_theta=float(theta), n_kv_heads=get("num_key_value_heads") or E,
        mlp_bias=False, tie_embeddings=bool(get("tie_word_embeddings", False)), norm_eps=eps * h,
        init_std=get("initializer_range", 0.02), family=family.name, **flags, **scaling)


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
    """A family's transformers state dict under grow's names for a model of config ``cfg`` (``lm_head.weight``
    left out when ``cfg`` ties it; Gemma's gains as 1 + w, its table as it is: grow's ``embed_scale`` is its
    sqrt(d)). ``ValueError`` naming a missing tensor or a shape that differs."""
    ours = param_names(cfg)
    missing = [theirs for theirs in ours.values() if theirs not in weights]
    if missing:
        raise ValueError(f"the checkpoint lacks {missing[0]} (and {len(missing) - 1} more): not a complete "
                         f"{hf_family(cfg).hf_class}")
    with torch.device("meta"):
        shapes = {n: p.shape for n, p in Transformer(cfg).named_parameters()}
    for mine, theirs in ours.items():
        if weights[theirs].shape != shapes[mine]:
            raise ValueError(f"{theirs} has shape {tuple(weights[theirs].shape)}, grow's {mine} {tuple(shapes[mine])}")
    out = {mine: weights[theirs] for mine, theirs in ours.items()}
    factor = embed_factor(cfg)
    if factor != 1.0:
        out["wte.weight"] = out["wte.weight"].double() / factor
    return {n: w.double() + gain_offset(cfg, n) if gain_offset(cfg, n) else w for n, w in out.items()}


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
    """The transformers config of a config.json's dict for a family grow imports (transformers' defaults for what
    it leaves out); another model type as it is, for `from_llama_config` to name."""
    from types import SimpleNamespace

    from transformers import CONFIG_MAPPING

    if config.get("model_type") not in FAMILIES:
        return SimpleNamespace(**config)
    return CONFIG_MAPPING[config["model_type"]].from_dict(config)


def from_llama(path, seq_len: int | None = None, dtype: torch.dtype = torch.float32) -> Transformer:
    """A grow `Transformer` holding a ``LlamaForCausalLM`` directory's weights (config.json + safetensors),
    computing what it computes (the mapping of the module docstring, backwards: eps = rms_norm_eps x h)."""
    return llama_model(path, from_llama_config(llama_config_of(read_config(path)), seq_len), dtype).eval()
