"""configs/model/<name>.yaml hold only what differs from `TransformerConfig`'s defaults: each starts from the
``model/_base`` node that `grow.plugins.store_model_base` builds from the dataclass (docs/design.md, "The run
config"), and every model composes to the dataclass-complete node, each key at the value it had when each YAML
still listed every key."""

from __future__ import annotations

import pytest
import yaml
from hydra import compose, initialize_config_dir
from omegaconf import OmegaConf

from grow.config import CONFIG_DIR
from grow.errors import options
from grow.model import TransformerConfig
from tests.ranks import forked_grow

DEFAULTS = TransformerConfig.defaults()  # the fields (no plugin flag is registered in this process)
MODELS = sorted(p.stem for p in (CONFIG_DIR / "model").glob("*.yaml"))
# values each model had before the base (when every YAML listed every key), a few per file
PINNED = {
    "tiny": {"d_model": 32, "d_qk": 16, "activation": "gelu", "mlp_bias": True, "dropout": 0.0, "family": None},
    "gpt-124m": {"d_model": 768, "n_layers": 12, "n_heads": 12, "d_ff": 3072, "init_std": 0.02, "top_k": 1},
    "llama-7b": {"d_model": 4096, "activation": "swiglu", "positions": "rope", "mlp_bias": False, "n_experts": 1},
    "gemma-tiny": {"activation": "geglu", "family": "gemma", "embed_scale": 5.656854249492381, "norm_eps": 3.2e-05},
    "qwen3-tiny": {"qk_norm": True, "family": "qwen3", "qk_norm_eps": 8e-06},
    "pretrained": {"d_model": None, "d_qk": None, "family": None, "rope_factor": None, "dropout": 0.0,
                   "router_aux_coef": 0.01},
}


def composed(*overrides: str) -> dict:
    with initialize_config_dir(str(CONFIG_DIR), version_base="1.3"):
        return OmegaConf.to_container(compose("train", overrides=list(overrides)).model, resolve=False)


def own_keys(name: str) -> dict:
    node = yaml.safe_load((CONFIG_DIR / "model" / f"{name}.yaml").read_text())
    assert node.pop("defaults") == ["_base", "_self_"], name
    return node


@pytest.mark.parametrize("name", MODELS)
def test_each_model_composes_every_key_of_the_dataclass(name):
    node = composed(f"model={name}")
    assert list(node) == list(DEFAULTS)  # every key, in the dataclass's order
    assert node == {**DEFAULTS, **own_keys(name)}
    for key, value in PINNED.get(name, {}).items():
        assert node[key] == value and type(node[key]) is type(value), (name, key)


@pytest.mark.parametrize("name", MODELS)
def test_a_model_yaml_holds_only_what_differs_from_the_default(name):
    for key, value in own_keys(name).items():
        same = value == DEFAULTS[key] and type(value) is type(DEFAULTS[key])
        assert not same or (name == "pretrained" and value is None), (name, key, value)  # null: the checkpoint's


def test_every_key_overrides_on_a_model_that_leaves_it_to_the_base():
    node = composed("model=tiny", "model.family=llama", "model.sliding_window=8", "model.dropout=0.1")
    assert (node["family"], node["sliding_window"], node["dropout"]) == ("llama", 8, 0.1)


def test_the_base_is_no_model_to_choose():
    assert "_base" not in options("model") and "tiny" in options("model")


def test_grow_train_cfg_job_shows_every_model_key(tmp_path):
    """A process of its own (not this one, whose conftest stored the base; forked from tests/growd.py's server,
    which imported grow but stored nothing): the CLI stores it before composing."""
    out = forked_grow("train", "model=tiny", "--cfg", "job", cwd=tmp_path)
    assert out.returncode == 0, out.stderr
    assert list(yaml.safe_load(out.stdout)["model"]) == list(DEFAULTS)
