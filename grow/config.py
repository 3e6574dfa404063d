"""Configuration: composing, validating, and turning YAML into typed objects.

Every command validates its whole configuration before any data or model work starts. A bad value
ends the command with one line, ``error: <key>=<value>: <what is allowed>``, and exit status 2
(`ConfigError`). `precheck` runs the same validation on the command line's overrides before
Hydra starts any job, expanding sweeps (``strategy=svd,zero``) so every job of a multirun is
checked first.
"""

from __future__ import annotations

import os
from pathlib import Path

import torch
from omegaconf import DictConfig, OmegaConf

from grow.model import ACTIVATIONS, TransformerConfig

CONFIG_DIR = Path(__file__).resolve().parent.parent / "configs"
MODEL_INTS = ("vocab_size", "seq_len", "n_layers", "d_model", "n_heads", "d_ff")


class ConfigError(ValueError):
    """A bad configuration value: ``key=value: allowed``."""

    def __init__(self, key: str, value, allowed: str):
        self.key, self.value, self.allowed = key, value, allowed
        super().__init__(f"{key}={value!r}: {allowed}" if value is not ... else f"{key}: {allowed}")


def options(group: str) -> list[str]:
    """The YAML options of a config group, e.g. options('strategy') -> ['net2net', 'random', ...]."""
    return sorted(p.stem for p in (CONFIG_DIR / group).glob("*.yaml"))


# ---- typed views --------------------------------------------------------------------------------


def _positive_int(key: str, value) -> int:
    if isinstance(value, float) and value.is_integer():
        value = int(value)
    if not isinstance(value, int) or isinstance(value, bool) or value < 1:
        raise ConfigError(key, value, "must be a positive integer")
    return value


def _head_size(m, key: str) -> int:
    """d_qk / d_v: explicit per-head size, or null = d_model / n_heads (which must then divide)."""
    value = m.get(key)
    if value is None:
        if m.d_model % m.n_heads:
            raise ConfigError(
                "model.d_model", m.d_model,
                f"must be divisible by model.n_heads={m.n_heads} when model.{key} is null (or set model.{key})",
            )
        return m.d_model // m.n_heads
    return _positive_int(f"model.{key}", value)


def model_config(m: DictConfig, prefix: str = "model") -> TransformerConfig:
    """`TransformerConfig` from the ``model`` node, with one-line errors naming the key."""
    for key in MODEL_INTS:
        _positive_int(f"{prefix}.{key}", m.get(key))
    if m.get("activation", "gelu") not in ACTIVATIONS:
        raise ConfigError(f"{prefix}.activation", m.activation, f"must be one of {', '.join(ACTIVATIONS)}")
    if not 0 <= float(m.get("dropout", 0.0)) < 1:
        raise ConfigError(f"{prefix}.dropout", m.dropout, "must be in [0, 1)")
    if not float(m.get("init_std", 0.02)) > 0:
        raise ConfigError(f"{prefix}.init_std", m.init_std, "must be > 0")
    if not float(m.get("norm_eps", 1e-5)) >= 0:
        raise ConfigError(f"{prefix}.norm_eps", m.norm_eps, "must be >= 0")
    d = OmegaConf.to_container(m, resolve=True)
    d["d_qk"], d["d_v"] = _head_size(m, "d_qk"), _head_size(m, "d_v")
    for key in MODEL_INTS:
        d[key] = int(d[key])
    return TransformerConfig.from_dict(d)


# ---- validation ---------------------------------------------------------------------------------


def validate_data(d: DictConfig) -> None:
    if d.name not in ("stdlib", "text", "hf"):
        raise ConfigError("data.name", d.name, "must be one of stdlib, text, hf")
    vocab = _positive_int("data.vocab_size", d.vocab_size)
    if not 257 <= vocab <= 65535:
        raise ConfigError("data.vocab_size", vocab, "must be in [257, 65535] (256 bytes + <|endoftext|>; uint16 cache)")
    _positive_int("data.max_bytes", d.max_bytes)
    if _positive_int("data.val_every", d.val_every) < 2:
        raise ConfigError("data.val_every", d.val_every, "must be >= 2 (every n-th document is held out)")
    if d.name == "text":
        if OmegaConf.is_missing(d, "files") or not d.files:
            raise ConfigError("data.files", None, "give one or more text files, e.g. data.files=[corpus.txt]")
        import glob

        for pattern in d.files:
            if not glob.glob(os.path.expanduser(str(pattern))):
                raise ConfigError("data.files", str(pattern), "no such file (paths or globs of local text files)")
    if d.name == "hf" and (OmegaConf.is_missing(d, "path") or not d.path):
        raise ConfigError("data.path", None, "name a dataset, e.g. data.path=roneneldan/TinyStories")


def validate_trainer(t: DictConfig) -> None:
    for key in ("max_tokens", "batch_size", "log_every", "eval_batches", "eval_batch_size", "keep_checkpoints"):
        _positive_int(f"trainer.{key}", t[key])
    for key in ("eval_every", "recovery_steps", "ckpt_every", "skip_nonfinite", "growth_batches"):
        v = t[key]
        if not isinstance(v, int) or isinstance(v, bool) or v < 0:
            raise ConfigError(f"trainer.{key}", v, "must be an integer >= 0")
    if not float(t.grad_clip) >= 0:
        raise ConfigError("trainer.grad_clip", t.grad_clip, "must be >= 0 (0 = no clipping)")


def validate_optim(o: DictConfig) -> None:
    if o.name not in ("adamw", "sgd"):
        raise ConfigError("optim.name", o.name, "must be adamw or sgd")
    if not float(o.lr) > 0:
        raise ConfigError("optim.lr", o.lr, "must be > 0")
    if not float(o.weight_decay) >= 0:
        raise ConfigError("optim.weight_decay", o.weight_decay, "must be >= 0")
    if o.schedule not in ("cosine", "wsd", "constant"):
        raise ConfigError("optim.schedule", o.schedule, "must be cosine, wsd or constant")
    if not 0 <= float(o.warmup) < 1:
        raise ConfigError("optim.warmup", o.warmup, "must be a fraction of trainer.max_tokens in [0, 1)")
    if not 0 <= float(o.min_lr_ratio) <= 1:
        raise ConfigError("optim.min_lr_ratio", o.min_lr_ratio, "must be in [0, 1]")
    if o.on_growth not in ("keep", "reset"):
        raise ConfigError("optim.on_growth", o.on_growth, "must be keep or reset")
    if o.name == "adamw":
        b1, b2 = o.betas
        if not (0 <= float(b1) < 1 and 0 <= float(b2) < 1):
            raise ConfigError("optim.betas", list(o.betas), "must be two numbers in [0, 1)")


def validate_run(cfg: DictConfig) -> None:
    if str(cfg.device) not in ("auto", "cpu", "cuda") and not str(cfg.device).startswith("cuda:"):
        raise ConfigError("device", cfg.device, "must be auto, cpu, cuda or cuda:N")
    if str(cfg.device).startswith("cuda") and not torch.cuda.is_available():
        raise ConfigError("device", cfg.device, "no CUDA device is available here (use device=cpu or auto)")
    if cfg.precision not in ("auto", "float32", "bfloat16", "float64"):
        raise ConfigError("precision", cfg.precision, "must be auto, float32, bfloat16 or float64")
    if not isinstance(cfg.seed, int) or cfg.seed < 0:
        raise ConfigError("seed", cfg.seed, "must be an integer >= 0")


def validate_strategy(s: DictConfig) -> None:
    known = options("strategy")
    if s.get("name") not in known:
        raise ConfigError("strategy", s.get("name"), f"must be one of {', '.join(known)}")


def validate(cfg: DictConfig) -> TransformerConfig:
    """Validate a composed run config (train or compare); returns the final model config."""
    try:
        OmegaConf.resolve(cfg)
    except Exception as exc:  # noqa: BLE001 - an interpolation error becomes one line
        raise ConfigError("config", ..., f"cannot resolve: {str(exc).splitlines()[0]}") from None
    validate_run(cfg)
    validate_data(cfg.data)
    model = model_config(cfg.model)
    if model.vocab_size > int(cfg.data.vocab_size) and model.vocab_size > 65535:
        raise ConfigError("model.vocab_size", model.vocab_size, "must be <= 65535 (uint16 token cache)")
    validate_trainer(cfg.trainer)
    validate_optim(cfg.optim)
    validate_strategy(cfg.strategy)
    if cfg.get("schedule") is not None:
        validate_schedule(cfg, model)
    return model


def validate_schedule(cfg: DictConfig, model: TransformerConfig) -> None:
    """The stage plan must be buildable (grow.schedule raises one-line ValueErrors naming the key)."""
    from grow.schedule import build_plan

    try:
        build_plan(model, OmegaConf.to_container(cfg.schedule, resolve=True),
                   max_tokens=int(cfg.trainer.max_tokens), batch_size=int(cfg.trainer.batch_size))
    except ConfigError:
        raise
    except ValueError as exc:
        raise ConfigError("schedule", ..., str(exc)) from None


# ---- the command line, checked before Hydra runs anything --------------------------------------


def _hydra_error(exc: Exception) -> ConfigError:
    """Hydra's multi-line composition errors as one `ConfigError`."""
    text = str(exc).strip() or str(exc.__cause__ or "").strip()
    if "Could not find" in text:
        what = text.split("Could not find", 1)[1].split("\n", 1)[0].strip().strip("'")
        group, _, name = what.rpartition("/")
        return ConfigError(group, name, f"no such option; must be one of {', '.join(options(group))}")
    lines = [ln.strip() for ln in text.splitlines() if ln.strip()]
    return ConfigError("overrides", ..., lines[0] if lines else type(exc).__name__)


def precheck(config_name: str, argv: list[str]) -> None:
    """Compose and validate every job the command line describes; raise `ConfigError` on the first bad one."""
    from hydra import compose, initialize_config_dir
    from hydra._internal.core_plugins.basic_sweeper import BasicSweeper
    from hydra.core.override_parser.overrides_parser import OverridesParser
    from hydra.errors import HydraException
    from omegaconf.errors import OmegaConfBaseException

    args = [a for a in argv if not a.startswith("-") and not a.split("=")[0].lstrip("+~").startswith("hydra")]
    try:
        parsed = OverridesParser.create().parse_overrides(args)
        batches = BasicSweeper.split_arguments(parsed, None)
        jobs = [job for batch in batches for job in batch] or [[]]
        for job in jobs:
            if config_name == "compare" and any(o.startswith("strategy=") and o == "strategy=" for o in job):
                raise ConfigError("strategy", "", "name at least one strategy, e.g. strategy=svd,zero")
            with initialize_config_dir(str(CONFIG_DIR), version_base="1.3"):
                cfg = compose(config_name, overrides=job)
            validate(cfg)
    except ConfigError:
        raise
    except (HydraException, OmegaConfBaseException) as exc:
        raise _hydra_error(exc) from None
