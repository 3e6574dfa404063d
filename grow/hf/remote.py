"""Any grow model as a ``transformers`` model with its own code (``trust_remote_code=True``; docs/hf.md): what ``grow export`` writes when the model is not a ``LlamaForCausalLM`` (`grow.hf.llama.llama_blockers`).
The code is grow's own: `grow.hf.modeling_grow` (a thin ``PreTrainedModel`` around `grow.model.Transformer`)
and grow/model.py vendored verbatim beside it (`save_remote`). The weights keep grow's names under ``model.``,
with every forward multiplier folded in (W = mult W) and W_out written untied; growth masks (an unfinished
msg ramp) are refused. `remote_model` reads such a directory back without running its code."""

from __future__ import annotations

import shutil
from pathlib import Path

import torch

import grow.model
from grow.hf.llama import assemble, folded, masks_blocker, read_llama_weights
from grow.model import Linear, Transformer, TransformerConfig

MODELING_FILE = Path(__file__).with_name("modeling_grow.py")
VENDORED = "grow_model.py"  # grow/model.py's name in an export (modeling_grow.py imports it)
AUTO_MAP = {"AutoConfig": "modeling_grow.GrowConfig", "AutoModelForCausalLM": "modeling_grow.GrowForCausalLM"}
PREFIX = "model."  # GrowForCausalLM.model is the Transformer


def exported_config(cfg: TransformerConfig) -> TransformerConfig:
    """The config an export computes with: multipliers folded (so standard parametrization), W_out untied,
    no dropout."""
    return cfg.replace(tie_embeddings=False, dropout=0.0, parametrization="standard", mup_base_width=None)


def to_remote_state(model: Transformer) -> dict[str, torch.Tensor]:
    """grow's parameters under grow's names, multipliers folded, ``lm_head.weight`` always present."""
    if masks_blocker(model):
        raise ValueError(masks_blocker(model)[0])
    for key, value in model.config.flags:  # the vendored grow/model.py runs without the plugin
        raise ValueError(f"model.{key}={value!r} is a plugin's model flag (GROW_PLUGINS): grow's exported code has none")
    sd = {name: p.detach() for name, p in model.named_parameters()}
    for name, module in model.named_modules():
        if isinstance(module, Linear):  # W_out included: written untied whatever the model ties
            sd[f"{name}.weight"] = folded(module)
    return {k: v.contiguous() for k, v in sd.items()}


def to_remote(model: Transformer, dtype: torch.dtype = torch.float32):
    """A ``GrowForCausalLM`` (`grow.hf.modeling_grow`) computing what ``model`` computes, in ``dtype``; its
    config names the modeling file in ``auto_map``. Save it with `save_remote`."""
    state = to_remote_state(model)
    from grow.hf.modeling_grow import GrowConfig, GrowForCausalLM  # optional extra

    cfg = exported_config(model.config)
    config = GrowConfig(**cfg.to_dict(), auto_map=AUTO_MAP, torch_dtype=str(dtype).removeprefix("torch."))
    hf = GrowForCausalLM(config).to(dtype)
    params = dict(hf.model.named_parameters())
    if set(params) != set(state):  # pragma: no cover - the two are built from one config
        raise RuntimeError(f"parameter names differ: {sorted(set(params) ^ set(state))}")
    with torch.no_grad():
        for name, p in params.items():
            p.copy_(state[name])
    return hf.eval()


def save_remote(hf, out: Path) -> None:
    """``hf.save_pretrained(out)`` and the code it loads with: the wrapper and grow/model.py, verbatim."""
    hf.save_pretrained(out, safe_serialization=True)
    shutil.copyfile(MODELING_FILE, out / MODELING_FILE.name)
    shutil.copyfile(grow.model.__file__, out / VENDORED)


def is_remote_config(config: dict) -> bool:
    """Whether a config.json (as a dict) is grow's own export (`to_remote`)."""
    return config.get("model_type") == "grow"


def remote_config(config: dict, seq_len: int | None = None) -> TransformerConfig:
    """The grow config of an export's config.json (``seq_len``: the training context, for rotary positions;
    learned positions keep the export's, the size of their table)."""
    cfg = TransformerConfig.from_dict(config)
    return cfg.replace(seq_len=int(seq_len)) if seq_len and cfg.positions == "rope" else cfg


def remote_weights_as_grow(weights: dict[str, torch.Tensor], cfg: TransformerConfig) -> dict[str, torch.Tensor]:
    """An export's tensors under grow's names (``model.`` dropped; exports before the wrapper had none);
    ``ValueError`` naming a missing tensor or a shape that differs."""
    with torch.device("meta"):
        shapes = {n: p.shape for n, p in Transformer(cfg).named_parameters()}
    prefix = PREFIX if any(k.startswith(PREFIX) for k in weights) else ""
    missing = [prefix + n for n in shapes if prefix + n not in weights]
    if missing:
        raise ValueError(f"the checkpoint lacks {missing[0]} (and {len(missing) - 1} more): not a complete grow export")
    for name, shape in shapes.items():
        if weights[prefix + name].shape != shape:
            raise ValueError(f"{prefix + name} has shape {tuple(weights[prefix + name].shape)}, grow's {tuple(shape)}")
    return {name: weights[prefix + name] for name in shapes}


def remote_model(path, cfg: TransformerConfig, dtype: torch.dtype = torch.float32) -> Transformer:
    """A grow `Transformer` of config ``cfg`` holding an export's weights, read as data (no code of the
    directory runs); ``ValueError`` naming a missing tensor or a shape that differs."""
    return assemble(remote_weights_as_grow(read_llama_weights(path), cfg), cfg, dtype)
