"""The parameter schema (grow/schema.py; docs/model.md, "Parameter schema"): for every flag that adds or removes
a parameter, the schema names exactly the model's parameters, and each entry's axis is as long as its dimension
(times its heads or head size). A flag that adds a parameter the schema misses fails here."""

from __future__ import annotations

import pytest
import torch

from grow import schema
from grow.config import CONFIG_DIR
from grow.model import HIDDEN, Transformer, param_role
from grow.run import validate
from tests.helpers import BASE, MOE_GPT, MOE_LLAMA, SVD_CFG, make_cfg

LLAMA = BASE.replace(activation="swiglu", positions="rope", n_heads=4, n_kv_heads=2, mlp_bias=False, d_v=4)
CONFIGS = {
    "gpt": BASE,
    "gpt-tied": BASE.replace(tie_embeddings=True),
    "gpt-relu-nobias": SVD_CFG.replace(activation="relu", mlp_bias=False),
    "llama": LLAMA,
    "llama-tied-mha": LLAMA.replace(n_kv_heads=None, tie_embeddings=True),
    "qwen2-biases": LLAMA.replace(qkv_bias=True),
    "qwen2-biases-mha": LLAMA.replace(qkv_bias=True, n_kv_heads=None),
    "qwen3-qk-norms": LLAMA.replace(qk_norm=True),
    "gemma-geglu": LLAMA.replace(activation="geglu", d_qk=6, d_v=6, embed_scale=4.0),
    "moe-llama": MOE_LLAMA,
    "moe-gpt": MOE_GPT,
}


def sizes(cfg) -> dict[str, int]:
    return {"h": cfg.d_model, "k": cfg.d_qk, "v": cfg.d_v, "p": cfg.d_ff, "E": cfg.n_heads, "G": cfg.kv_heads,
            "X": cfg.n_experts, "": 1}


def model_params(cfg) -> dict[str, torch.Tensor]:
    with torch.device("meta"):
        return dict(Transformer(cfg).named_parameters())


MODEL_YAMLS = sorted(p.stem for p in (CONFIG_DIR / "model").glob("*.yaml") if p.stem != "pretrained")


@pytest.mark.parametrize("name", MODEL_YAMLS)
def test_every_model_yaml_is_named_exactly_by_the_schema(name):
    cfg = validate(make_cfg(f"model={name}"))
    assert set(schema.param_names(cfg)) == set(model_params(cfg))


@pytest.mark.parametrize("name", CONFIGS)
def test_the_schema_names_exactly_the_models_parameters(name):
    cfg = CONFIGS[name]
    names = schema.param_names(cfg)
    assert len(names) == len(set(names))
    assert set(names) == set(model_params(cfg))


@pytest.mark.parametrize("name", CONFIGS)
def test_each_entry_grows_along_an_axis_of_its_dimensions_length(name):
    cfg = CONFIGS[name]
    params, size = model_params(cfg), sizes(cfg)
    for dim in schema.LAYER:
        entries = [(e, f"layers.1.{e.key}") for e in schema.layer(cfg, dim)]
        for e, full in entries + [(e, e.key) for e in schema.trunk(cfg, dim)]:
            assert e.role in ("in", "out", "gain", "unit"), (dim, e)
            if e.role != "unit":  # an expert's parameters are whole units of X
                assert params[full].shape[e.axis] == size[dim] * size[e.per], (dim, e)
                assert schema.length(cfg, e.key, e.axis) == params[full].shape[e.axis], (dim, e)


def test_flags_add_their_parameters_in_the_schema():
    keys = set(schema.layer_keys(LLAMA))
    assert {"attn.q.bias", "attn.q_norm.weight", "mlp.fc1.bias"}.isdisjoint(keys)
    assert "mlp.gate.weight" in keys and "mlp.gate.weight" not in schema.layer_keys(BASE)
    assert {"attn.q.bias", "attn.k.bias", "attn.v.bias"} <= set(schema.layer_keys(LLAMA.replace(qkv_bias=True)))
    assert {"attn.q_norm.weight", "attn.k_norm.weight"} <= set(schema.layer_keys(LLAMA.replace(qk_norm=True)))
    assert [e.key for e in schema.trunk(BASE, "h")] == ["wte.weight", "wpe.weight", "norm.weight", "lm_head.weight"]
    assert [e.key for e in schema.trunk(MOE_LLAMA, "h")] == ["wte.weight", "norm.weight"]  # rope, tied
    experts = [f"mlp.experts.{j}.fc2.{w}" for j in range(3) for w in ("weight", "bias")]
    assert schema.layer_writers(MOE_GPT) == ["attn.o.weight", *experts]
    assert schema.layer_writers(LLAMA) == ["attn.o.weight", "mlp.fc2.weight"]


def test_the_models_own_name_lists_agree_with_the_schema():
    """grow/model.py is vendored alone in an export (grow.hf.remote), so it keeps mup's hidden matrices and the
    initializer's "out" role as names: they must be the schema's layer matrices and its zero writers."""
    cfg = LLAMA
    h = schema.layer(cfg, "h")
    assert set(HIDDEN) == {e.key for e in h if e.role != "gain" and e.key.endswith(".weight")}
    outs = {key for key in schema.layer_keys(cfg) if param_role(key) == "out"}
    assert outs == {key for key in schema.layer_writers(cfg) if key.endswith(".weight")}
