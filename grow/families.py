"""The transformers families grow's one model can be (docs/design.md, "Checkpoint families"): Llama (3.x rotary
scaling included), Mistral, Qwen2, Qwen3 and Gemma, each a set of flags of `grow.model.TransformerConfig`, not
a second transformer. A family is a class that declares what it fixes; `check_family` is the one place its
rules are enforced (a model config naming a family is checked at construction), and `export_blockers` lists
why a model cannot be written as its family's transformers class (`grow.hf.llama` writes it).
"""

from __future__ import annotations

from typing import ClassVar

from grow.errors import ConfigError


class Family:
    """A decoder family of transformers: pre-RMSNorm, rotary, gated MLP without biases, one head_dim."""

    name: ClassVar[str] = ""
    hf_class: ClassVar[str] = ""  # the transformers class an export writes (model_type = name)
    # the flags every model of the family has (flag -> (value, why)); the others are free
    fixed: ClassVar[dict[str, tuple[object, str]]] = {}
    COMMON: ClassVar[dict[str, tuple[object, str]]] = {
        "positions": ("rope", "rotary positions"),
        "mlp_bias": (False, "its MLP has no biases"),
    }

    @classmethod
    def rules(cls) -> dict[str, tuple[object, str]]:
        return {**cls.COMMON, **cls.fixed}


class Llama(Family):
    name, hf_class = "llama", "LlamaForCausalLM"
    fixed = {"activation": ("swiglu", "SwiGLU"), "qkv_bias": (False, "attention_bias adds an output bias too"),
             "qk_norm": (False, "no q/k norms"), "sliding_window": (None, "full attention"),
             "embed_scale": (1.0, "unscaled embeddings")}


class Mistral(Family):
    name, hf_class = "mistral", "MistralForCausalLM"
    fixed = {"activation": ("swiglu", "SwiGLU"), "qkv_bias": (False, "no attention biases"),
             "qk_norm": (False, "no q/k norms"), "embed_scale": (1.0, "unscaled embeddings")}


class Qwen2(Family):
    name, hf_class = "qwen2", "Qwen2ForCausalLM"
    fixed = {"activation": ("swiglu", "SwiGLU"), "qkv_bias": (True, "q/k/v projections with biases"),
             "qk_norm": (False, "no q/k norms"), "sliding_window": (None, "full attention in every layer"),
             "embed_scale": (1.0, "unscaled embeddings")}


class Qwen3(Family):
    name, hf_class = "qwen3", "Qwen3ForCausalLM"
    fixed = {"activation": ("swiglu", "SwiGLU"), "qkv_bias": (False, "no attention biases"),
             "qk_norm": (True, "per-head q/k RMSNorms"), "sliding_window": (None, "full attention in every layer"),
             "embed_scale": (1.0, "unscaled embeddings")}


class Gemma(Family):
    name, hf_class = "gemma", "GemmaForCausalLM"
    fixed = {"activation": ("geglu", "GeGLU with tanh's gelu"), "qkv_bias": (False, "no attention biases"),
             "qk_norm": (False, "no q/k norms"), "sliding_window": (None, "full attention")}


FAMILIES: dict[str, type[Family]] = {f.name: f for f in (Llama, Mistral, Qwen2, Qwen3, Gemma)}


def family_of(cfg) -> type[Family] | None:
    """The family ``cfg`` names (None: grow's own model)."""
    return None if cfg.family is None else FAMILIES[cfg.family]


def violations(cfg, family: type[Family]) -> list[tuple[str, object, str]]:
    """(flag, value, what the family needs) for each rule of ``family`` that ``cfg`` breaks."""
    out = []
    for flag, (want, why) in family.rules().items():
        if getattr(cfg, flag) != want:
            out.append((flag, getattr(cfg, flag), f"must be {want} with family={family.name} ({why})"))
    return out


def check_family(cfg) -> None:
    """`ConfigError` (one line) naming a family grow does not know, or the first flag that breaks its rules."""
    if cfg.family is None:
        return
    if cfg.family not in FAMILIES:
        raise ConfigError("family", cfg.family, f"must be one of {', '.join(FAMILIES)} or null (grow's own model)")
    for flag, value, allowed in violations(cfg, FAMILIES[cfg.family])[:1]:
        raise ConfigError(flag, value, allowed)


def export_blockers(cfg) -> list[str]:
    """Why ``cfg`` cannot be written as its family's transformers class (grow's own model: as a Llama), each a
    short phrase; empty: it can. Beyond the family's flags, what a growth may leave on the way to its end: the
    rotary frequencies anchored above the head size, and d_qk != d_v (transformers has one head_dim); a plugin's flag."""
    family = family_of(cfg) or Llama
    out = [f"{flag}={value} ({allowed.split(' (', 1)[1].rstrip(')')})" if " (" in allowed else f"{flag}={value}"
           for flag, value, allowed in violations(cfg, family)]
    if cfg.positions == "rope" and cfg.rope_anchor != cfg.d_qk:
        out.append(f"rotary frequencies anchored at rope_dim={cfg.rope_anchor}, not at its head size "
                   f"d_qk={cfg.d_qk} (a stage before the end of its plan)")
    if cfg.d_qk != cfg.d_v:
        out.append(f"d_qk={cfg.d_qk} != d_v={cfg.d_v} ({family.hf_class} has one head_dim)")
    if cfg.moe:
        out.append(f"n_experts={cfg.n_experts} (a mixture of experts: a MixtralForCausalLM, grow.hf.mixtral)")
    return out + [f"{key}={value} (a plugin's model flag)" for key, value in cfg.flags]
