"""``grow train init=<model directory>``: a run whose first stage is a pretrained ``LlamaForCausalLM`` or
grow's own custom-code export, read as data (config.json and safetensors: no code of the directory
runs, nothing asks): the premise of HyperCloning (M. Samragh et al., "Scaling Smart: Accelerating
Large Language Model Pre-training with Small Model Initialization", arXiv:2409.12903).

`prepare` makes the directory's tokenizer the run's, `reconcile` takes stage 0's sizes, epsilon,
vocabulary, tying and rotary base from it, `load` reads the weights. The rules (and why the rotary
base becomes theta^(K/K0)): docs/hf.md.
"""

from __future__ import annotations

import dataclasses
from pathlib import Path

import torch
from omegaconf import DictConfig

from grow.data.config import EOT
from grow.errors import ConfigError
from grow.hf import require
from grow.hf.llama import from_llama_config, llama_config_of, llama_model, read_config
from grow.hf.mixtral import from_mixtral_config, mixtral_model
from grow.hf.remote import is_remote_config, remote_config, remote_model
from grow.model import FLAG_DEFAULTS, FLAGS, Transformer, TransformerConfig
from grow.plan import GROWABLE

KEYWORDS = ("auto", "model", "strategy")  # the values of init that are not a directory
STRUCTURE = ("positions", "activation", "n_kv_heads", "mlp_bias")


def command_line(argv: list[str]) -> list[str]:
    """``grow train`` / ``grow schedule`` with ``init=<model directory>``: the run starts from the checkpoint, so
    without ``model=`` the model is the checkpoint's (``model=pretrained``, whose every null key `prepare` fills
    from it), not train.yaml's default ``small`` (a ``model=`` given is checked against the checkpoint,
    `reconcile`), and a schedule's YAML start sizes (depth.yaml's 2 layers) give way to the checkpoint's unless the
    command line states one (``~schedule.start``)."""
    keys = [a.partition("=")[0].lstrip("+~") for a in argv]
    init = [a.partition("=")[2] for a, key in zip(argv, keys) if key == "init"]
    if not init or init[-1] in KEYWORDS or "resume" in keys:
        return argv
    model = [] if "model" in keys or "experiment" in keys else ["model=pretrained"]
    start = ["~schedule.start"] if "schedule" in keys and not any(k.startswith("schedule.start") for k in keys) else []
    return [*model, *argv, *start]


def pretrained_dir(init) -> Path | None:
    """The directory ``init`` names, or None for init=auto | model | strategy."""
    return None if init is None or str(init) in KEYWORDS else Path(str(init)).expanduser()


def check_dir(path: Path) -> Path:
    """`ConfigError` (key ``init``) unless ``path`` holds a config.json and the hf extra is installed."""
    if not (path / "config.json").is_file():
        raise ConfigError("init", str(path), f"must be one of {', '.join(KEYWORDS)}, or a model directory (a "
                                             "LlamaForCausalLM or grow export: config.json + model.safetensors + "
                                             "tokenizer.json)")
    require("init", str(path), "safetensors", "transformers")
    return path


def prepare(cfg: DictConfig) -> None:
    """Before the config resolves: with init=<dir>, without a ``data.tokenizer``, the directory's tokenizer.json
    (`use_tokenizer`), and ``model=pretrained``'s null keys from the checkpoint (`fill_model`)."""
    path = pretrained_dir(cfg.get("init"))
    if path is not None:
        check_dir(path)
        if cfg.get("data") is not None and cfg.data.get("tokenizer") is None:
            use_tokenizer(cfg, path)
    fill_model(cfg, path)


def use_tokenizer(cfg: DictConfig, path: Path) -> None:
    """The run's tokenizer is the directory's tokenizer.json, its document end the checkpoint's own."""
    if not (path / "tokenizer.json").is_file():
        weights = "" if has_weights(path) else "no model.safetensors (the weights) and "
        raise ConfigError("init", str(path), f"has {weights}no tokenizer.json (the run's tokenizer comes from it; or "
                                             "give data.tokenizer=<a tokenizer.json of the same vocabulary>)")
    cfg.data.tokenizer = str(path / "tokenizer.json")
    eos = checkpoint_eos(path)
    if eos is not None and cfg.data.get("eot_token") == EOT:  # the checkpoint's own document end, not grow's
        cfg.data.eot_token = eos


def checkpoint_eos(path: Path) -> str | None:
    """The end-of-sequence token the checkpoint was trained with (tokenizer_config.json's ``eos_token``, else the
    token of config.json's ``eos_token_id``), read as data; None when neither names one."""
    import json

    try:
        eos = json.loads((path / "tokenizer_config.json").read_text()).get("eos_token")
    except (OSError, ValueError, AttributeError):
        eos = None
    eos = eos.get("content") if isinstance(eos, dict) else eos
    if isinstance(eos, str) and eos:
        return eos
    ids = read_config(path).get("eos_token_id")
    ids = ids[0] if isinstance(ids, list) and ids else ids
    if not isinstance(ids, int):
        return None
    from tokenizers import Tokenizer

    return Tokenizer.from_file(str(path / "tokenizer.json")).id_to_token(ids)


PRETRAINED_KEYS = ("n_layers", "d_model", "n_heads", "d_ff")  # null only in configs/model/pretrained.yaml


def fill_model(cfg: DictConfig, path: Path | None) -> None:
    """``model=pretrained`` (its sizes null): each null key of the model node becomes the checkpoint's (the
    keys given stay: the final model's); without init=<dir>, one line saying it needs one."""
    model = cfg.get("model")
    if model is None or not any(model.get(key, 0) is None for key in PRETRAINED_KEYS):
        return
    if path is None:
        raise ConfigError("model", "pretrained", "takes every null key from the checkpoint of init=<a model "
                                                 "directory>: give init=<dir>, or another model=")
    p0 = dataclasses.asdict(checkpoint_config(path, model.get("seq_len")))
    for key in list(model.keys()):
        if key != "vocab_size" and model[key] is None and key in p0:  # the vocabulary: data's, checked later
            model[key] = p0[key]


def has_weights(path: Path) -> bool:
    return (path / "model.safetensors").is_file() or (path / "model.safetensors.index.json").is_file()


def checkpoint_config(path: Path, seq_len: int) -> TransformerConfig:
    """The grow config of the directory's model, from its config.json read as data (`grow.hf.remote.remote_config`
    for grow's export, `grow.hf.llama.from_llama_config` otherwise); `ConfigError` naming what cannot be
    expressed, or a missing weights file. Nothing of transformers' auto classes runs: no remote code, no prompt."""
    check_dir(path)
    try:
        config = read_config(path)
        cfg = remote_config(config, seq_len) if is_remote_config(config) else \
            from_mixtral_config(config, seq_len) if config.get("model_type") == "mixtral" else \
            from_llama_config(llama_config_of(config), seq_len)
    except (ValueError, TypeError, OSError) as exc:
        raise ConfigError("init", str(path), str(exc).splitlines()[0]) from None
    if not has_weights(path):
        raise ConfigError("init", str(path), "has no model.safetensors (save it with save_pretrained(..., "
                                             "safe_serialization=True))")
    return cfg


def reconcile(path: Path, model: TransformerConfig, schedule, tokenizer_ids: int) -> dict:
    """The changes (`grow.config.RunConfig.replace`'s ``model=``, ``schedule=``) of a run starting from the
    checkpoint in ``path`` (module docstring): the checkpoint's vocabulary, epsilon, tying and (rescaled)
    rotary base in the final config, its sizes as the schedule's start. `ConfigError` naming the key that
    contradicts the checkpoint."""
    p0 = checkpoint_config(path, model.seq_len)
    for key in STRUCTURE:
        ours, theirs = getattr(model, key), getattr(p0, key)
        if key == "n_kv_heads":
            ours, theirs = model.kv_heads, p0.kv_heads
        if ours != theirs:
            raise ConfigError(f"model.{key}", ours, f"the pretrained model in {path} has {key}={theirs}")
    flags = {}
    for key in FLAGS:
        ours, theirs = getattr(model, key), getattr(p0, key)
        if ours != theirs and ours != FLAG_DEFAULTS[key]:
            raise ConfigError(f"model.{key}", ours, f"the pretrained model in {path} has {key}={theirs}")
        flags[key] = theirs
    for key, ours in model.flags:  # a plugin's flag (grow.flags): no checkpoint has its parameters
        raise ConfigError(f"model.{key}", ours, f"must be off (a plugin's flag) when a run starts from the pretrained "
                                                f"model in {path}, which has none of its parameters")
    if tokenizer_ids > p0.vocab_size:
        raise ConfigError("init", str(path), f"its tokenizer has {tokenizer_ids} ids, more than the model's "
                                             f"vocabulary of {p0.vocab_size}")
    start = dict(schedule.start) if schedule is not None else {}
    grows = set(schedule.grow) if schedule is not None else set()
    for dim in GROWABLE:
        a, b = getattr(p0, dim), getattr(model, dim)
        if dim == "top_k" and a == min(b, p0.n_experts) and "top_k" not in grows:
            continue  # the plan routes each stage to at most its experts (a dense checkpoint: 1)
        if a > b:
            raise ConfigError(f"model.{dim}", b, f"the pretrained model in {path} has {dim}={a}: a run only grows it")
        if a != b and dim not in grows:
            key, allowed = ("schedule.grow", f"grow {dim} (the pretrained {dim}={a}, the final {b})") \
                if schedule is not None else (f"model.{dim}", f"the pretrained model has {dim}={a} (without a "
                                                              "schedule a run trains it at its size)")
            raise ConfigError(key, list(grows) if schedule is not None else b, allowed)
        if dim in grows:
            if start.get(dim) not in (None, a):
                raise ConfigError(f"schedule.start.{dim}", start[dim], f"the run starts from the pretrained model, "
                                                                        f"whose {dim} is {a}")
            start[dim] = a
    if p0.positions == "learned" and p0.seq_len != model.seq_len:
        raise ConfigError("model.seq_len", model.seq_len, f"the pretrained model in {path} has learned positions "
                                                          f"for seq_len={p0.seq_len}")
    theta = p0.rope_theta ** (model.rope_anchor / p0.rope_anchor)  # theta^(K/K0): the old pairs' frequencies kept
    final = model.replace(vocab_size=p0.vocab_size, norm_eps=p0.norm_eps, tie_embeddings=p0.tie_embeddings,
                          rope_theta=theta, **flags)
    return {"model": final, **({"schedule": dataclasses.replace(schedule, start=start)} if schedule else {})}


def started(path: Path, config):
    """The run config (`grow.config.RunConfig`) of a run starting from the checkpoint in ``path``: `reconcile`'s
    changes made (a schedule that then reaches the final model before its last stage is the plan's refusal,
    `grow.plan.build_plan`, naming ``schedule.stages``)."""
    return config.replace(**reconcile(path, config.model, config.schedule, config.data.vocab_size))


def load(path: Path, stage0: TransformerConfig, dtype: torch.dtype) -> Transformer:
    """Stage 0's model holding the directory's weights (`grow.hf.remote`'s names for grow's export, else
    `grow.hf.llama`'s, mapped back; its rotary base and anchor are stage 0's, which keep the checkpoint's
    frequencies)."""
    try:
        config = read_config(path)
        read = remote_model if is_remote_config(config) else mixtral_model if config.get("model_type") == "mixtral" \
            else llama_model
        return read(path, stage0, dtype)
    except ValueError as exc:
        raise ConfigError("init", str(path), str(exc)) from None
