"""Configuration: composing, validating, and turning YAML into typed objects.

Every command validates its whole configuration before any data or model work starts. A bad value
ends the command with one line, ``error: <key>=<value>: <what is allowed>``, and exit status 2
(`ConfigError`). `precheck` runs the same validation on the command line's overrides before
Hydra starts any job, expanding sweeps (``strategy=svd,zero``) so every job of a multirun is
checked first.
"""

from __future__ import annotations

import math
import os
import re

import torch
from omegaconf import DictConfig, OmegaConf

from grow.errors import CONFIG_DIR, ConfigError, options  # noqa: F401 - re-exported
from grow.model import ACTIVATIONS, TransformerConfig

MODEL_INTS = ("vocab_size", "seq_len", "n_layers", "d_model", "n_heads", "d_ff")


# ---- typed views --------------------------------------------------------------------------------


def _positive_int(key: str, value) -> int:
    if isinstance(value, float) and value.is_integer():
        value = int(value)
    if not isinstance(value, int) or isinstance(value, bool) or value < 1:
        raise ConfigError(key, value, "must be a positive integer")
    return value


def _number(key: str, value, lo: float | None = None, hi: float | None = None, *, lo_open: bool = False,
            hi_open: bool = False) -> float:
    """A finite number in [lo, hi] (or open ends); a string, a bool, null, NaN or inf is refused."""
    ok = isinstance(value, (int, float)) and not isinstance(value, bool) and math.isfinite(value)
    if ok and lo is not None:
        ok = value > lo if lo_open else value >= lo
    if ok and hi is not None:
        ok = value < hi if hi_open else value <= hi
    if not ok:
        if lo is not None and hi is not None:
            rng = f"in {'(' if lo_open else '['}{lo:g}, {hi:g}{')' if hi_open else ']'}"
        elif lo is not None:
            rng = f"{'>' if lo_open else '>='} {lo:g}"
        else:
            rng = "finite"
        raise ConfigError(key, value, f"must be a number {rng}")
    return float(value)


def _bool(key: str, value) -> bool:
    if not isinstance(value, bool):
        raise ConfigError(key, value, "must be true or false")
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
    _number(f"{prefix}.dropout", m.get("dropout", 0.0), 0, 1, hi_open=True)
    _number(f"{prefix}.init_std", m.get("init_std", 0.02), 0, lo_open=True)
    _number(f"{prefix}.norm_eps", m.get("norm_eps", 1e-5), 0)
    for key in ("mlp_bias", "tie_embeddings"):
        if key in m:
            _bool(f"{prefix}.{key}", m[key])
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
    _number("trainer.grad_clip", t.grad_clip, 0)
    for key in ("compile", "progress"):
        _bool(f"trainer.{key}", t[key])


def validate_optim(o: DictConfig) -> None:
    if o.name not in ("adamw", "sgd"):
        raise ConfigError("optim.name", o.name, "must be adamw or sgd")
    _number("optim.lr", o.lr, 0, lo_open=True)
    _number("optim.weight_decay", o.weight_decay, 0)
    if o.schedule not in ("cosine", "wsd", "constant"):
        raise ConfigError("optim.schedule", o.schedule, "must be cosine, wsd or constant")
    if not isinstance(o.warmup, (int, float)) or isinstance(o.warmup, bool) or not 0 <= o.warmup < 1:
        raise ConfigError("optim.warmup", o.warmup, "must be a fraction of trainer.max_tokens in [0, 1)")
    _number("optim.min_lr_ratio", o.min_lr_ratio, 0, 1)
    _number("optim.decay_fraction", o.get("decay_fraction", 0.2), 0, 1, lo_open=True)
    if o.on_growth not in ("keep", "reset"):
        raise ConfigError("optim.on_growth", o.on_growth, "must be keep or reset")
    nw = o.get("new_warmup_steps", 0)
    if nw is not None and (not isinstance(nw, int) or isinstance(nw, bool) or nw < 0):
        raise ConfigError("optim.new_warmup_steps", nw, "must be an integer >= 0 (0 = off)")
    if o.name == "adamw":
        betas = o.betas
        if not (OmegaConf.is_list(betas) and len(betas) == 2 and all(
                isinstance(b, (int, float)) and not isinstance(b, bool) and 0 <= b < 1 for b in betas)):
            raise ConfigError("optim.betas", OmegaConf.to_container(betas) if OmegaConf.is_list(betas) else betas,
                              "must be two numbers in [0, 1)")
        _number("optim.eps", o.get("eps", 1e-8), 0)
        if o.get("fused") not in (None, True, False):
            raise ConfigError("optim.fused", o.fused, "must be null (auto), true or false")
    if o.name == "sgd":
        _number("optim.momentum", o.get("momentum", 0.9), 0, 1, hi_open=True)
        for key in ("nesterov", "decoupled_weight_decay"):
            if key in o:
                _bool(f"optim.{key}", o[key])


def validate_device(cfg: DictConfig) -> None:
    """``device`` and ``precision``: every command that runs a model (train, compare, sample, eval)."""
    if str(cfg.device) not in ("auto", "cpu", "cuda") and not str(cfg.device).startswith("cuda:"):
        raise ConfigError("device", cfg.device, "must be auto, cpu, cuda or cuda:N")
    if str(cfg.device).startswith("cuda") and not torch.cuda.is_available():
        raise ConfigError("device", cfg.device, "no CUDA device is available here (use device=cpu or auto)")
    if cfg.precision not in ("auto", "float32", "bfloat16", "float64"):
        raise ConfigError("precision", cfg.precision, "must be auto, float32, bfloat16 or float64")


def validate_run(cfg: DictConfig) -> None:
    validate_device(cfg)
    if not isinstance(cfg.seed, int) or isinstance(cfg.seed, bool) or cfg.seed < 0:
        raise ConfigError("seed", cfg.seed, "must be an integer >= 0")


def validate_strategy(s: DictConfig):
    """The strategy exists and accepts its options (its constructor checks names and values)."""
    known = options("strategy")
    if s.get("name") not in known:
        raise ConfigError("strategy", s.get("name"), f"must be one of {', '.join(known)}")
    from grow.growth.base import get_strategy

    try:
        return get_strategy(OmegaConf.to_container(s, resolve=True))
    except ValueError as exc:
        raise _strategy_error(s, exc) from None


def _strategy_error(s: DictConfig, exc: ValueError) -> ConfigError:
    """A strategy constructor's ValueError as a `ConfigError` naming the option (``strategy.noise_ratio``)."""
    msg = str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__
    opts = {k: v for k, v in OmegaConf.to_container(s, resolve=True).items() if k != "name"}
    unknown = re.search(r"unknown option\(s\) ([\w, ]+?) \(allowed: ([^)]*)\)", msg)
    if unknown:
        key = unknown.group(1).split(",")[0].strip()
        return ConfigError(f"strategy.{key}", opts.get(key), f"not an option of strategy {s.name}; allowed: "
                                                             f"{unknown.group(2)}")
    for key, value in opts.items():
        at = msg.find(f"{key}=")
        if at < 0:
            continue
        tail = msg[at + len(key) + 1:]
        text = repr(value)
        tail = tail[len(text):] if tail.startswith(text) else tail.split(":", 1)[-1] if ":" in tail else tail
        tail = tail.strip().lstrip(":").strip()
        if tail.startswith("(") and tail.endswith(")"):
            tail = tail[1:-1]
        return ConfigError(f"strategy.{key}", value, f"{tail or msg} (strategy {s.name})")
    return ConfigError("strategy", s.name, msg)


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
    if model.vocab_size < int(cfg.data.vocab_size):
        raise ConfigError("model.vocab_size", model.vocab_size, f"must be >= data.vocab_size={cfg.data.vocab_size} "
                                                                "(every token id needs an embedding row)")
    validate_trainer(cfg.trainer)
    validate_optim(cfg.optim)
    strategy = validate_strategy(cfg.strategy)
    if cfg.get("schedule") is not None:
        validate_schedule(cfg, model, strategy)
    plan = _plan(cfg, model)
    validate_growth_inputs(cfg, plan)
    validate_resume(cfg, model, plan)
    return model


def _plan(cfg: DictConfig, model: TransformerConfig):
    """The stage plan (one stage without a schedule); its ValueErrors as `ConfigError` naming the key."""
    from grow.schedule import build_plan

    schedule = OmegaConf.to_container(cfg.schedule, resolve=True) if cfg.get("schedule") is not None else None
    try:
        return build_plan(model, schedule, max_tokens=cfg.trainer.max_tokens, batch_size=cfg.trainer.batch_size)
    except ValueError as exc:
        raise _value_error(exc, "schedule") from None


def _value_error(exc: ValueError, default_key: str) -> ConfigError:
    """A one-line ValueError that starts with ``key=value: ...`` (grow.schedule's) as that key's `ConfigError`."""
    msg = (str(exc).strip().splitlines() or [type(exc).__name__])[0]
    m = re.match(r"([A-Za-z_][\w.]*)(=|: )", msg)
    err = ConfigError(m.group(1) if m else default_key, ..., msg)
    if m:
        err.args = (msg,)
    return err


def validate_growth_inputs(cfg: DictConfig, plan) -> None:
    """What the strategy needs at the plan's growths: where new layers go, enough growth batches."""
    from grow.growth.expand import layer_positions

    s = cfg.strategy
    where = s.get("layer_position", "end")
    where = OmegaConf.to_container(where) if OmegaConf.is_list(where) else where
    for before, after in zip(plan, list(plan)[1:]):
        n_old, n_new = before.cfg.n_layers, after.cfg.n_layers
        if n_new > n_old or not isinstance(where, list):
            try:
                layer_positions(n_old, max(n_new, n_old + 1), where)
            except (ValueError, TypeError) as exc:
                raise ConfigError("strategy.layer_position", where, f"{str(exc).split(': ', 1)[-1]} (growth into "
                                                                    f"stage {after.index + 1})") from None
        if after.cfg.d_qk > before.cfg.d_qk and "batches" in s and "heldout" in s:
            need = int(s.batches) + (int(s.heldout) if s.get("gamma") == "auto" else 0)
            if int(cfg.trainer.growth_batches) < need:
                raise ConfigError("trainer.growth_batches", cfg.trainer.growth_batches,
                                  f"must be >= {need}: strategy {s.name} uses strategy.batches={s.batches}"
                                  + (f" + strategy.heldout={s.heldout}" if s.get("gamma") == "auto" else "")
                                  + f" at the growth into stage {after.index + 1}")


def validate_resume(cfg: DictConfig, model: TransformerConfig, plan) -> None:
    """``resume=<run dir>|latest``: the run has a complete checkpoint of the same model and schedule."""
    value = cfg.get("resume")
    if value is None:
        return
    if cfg.get("compare") is not None:
        raise ConfigError("resume", value, "grow compare does not resume (rerun it with the same hydra.sweep.dir: "
                                           "finished arms are skipped); resume one arm with grow train resume=<arm dir>")
    from grow import checkpoint

    meta = checkpoint.latest(checkpoint.resolve_resume(value))
    checkpoint.verify(meta, full=True)
    checkpoint.check_compatible(meta, model, plan, str(cfg.optim.name))


def validate_schedule(cfg: DictConfig, model: TransformerConfig, strategy) -> None:
    """The stage plan must be buildable (grow.schedule raises one-line ValueErrors naming the key),
    and the strategy must be able to make every growth of it (e.g. vt's even numbers of new units)."""
    from grow.schedule import build_plan

    try:
        plan = build_plan(model, OmegaConf.to_container(cfg.schedule, resolve=True),
                          max_tokens=int(cfg.trainer.max_tokens), batch_size=int(cfg.trainer.batch_size))
    except ConfigError:
        raise
    except ValueError as exc:
        raise _value_error(exc, "schedule") from None
    for before, after in zip(plan, list(plan)[1:]):
        try:
            strategy.check_transition(before.cfg, after.cfg)
        except ValueError as exc:
            raise ConfigError("strategy", cfg.strategy.name, f"stage {after.index}: {exc}") from None


# ---- the command line, checked before Hydra runs anything --------------------------------------


def _hydra_error(exc: Exception) -> ConfigError:
    """Hydra's multi-line composition errors as one `ConfigError`."""
    text = str(exc).strip() or str(exc.__cause__ or "").strip()
    if "Could not find" in text:
        what = text.split("Could not find", 1)[1].split("\n", 1)[0].strip().strip("'")
        group, _, name = what.rpartition("/")
        return ConfigError(group, name, f"no such option; must be one of {', '.join(options(group))}")
    m = re.search(r"Could not override '([^']+)'", text)
    if m:
        return ConfigError(m.group(1), ..., f"not a key of the config (check the spelling; a new key needs "
                                            f"+{m.group(1)}=...)")
    lines = [ln.strip() for ln in text.splitlines() if ln.strip() and not ln.strip().startswith("See https")]
    override = getattr(exc, "override", None)
    if isinstance(override, str) and override:
        detail = [ln for ln in lines if not ln.startswith("Error parsing override")] or lines
        return ConfigError(override.split("=", 1)[0].lstrip("+~"), ...,
                           f"cannot parse the override {override!r}: {detail[0] if detail else 'bad syntax'}")
    return ConfigError("overrides", ..., lines[0] if lines else type(exc).__name__)


def precheck(config_name: str, argv: list[str], check=None) -> None:
    """Compose and validate every job the command line describes; raise `ConfigError` on the first bad one.
    ``check(cfg)`` validates a composed config (default `validate`: a run's; sample, eval and report
    bring their own)."""
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
            if config_name == "train":  # resume=<run dir>: that run's own overrides first (grow.checkpoint)
                from grow.checkpoint import resume_overrides

                job = [*resume_overrides(job), *job]
            with initialize_config_dir(str(CONFIG_DIR), version_base="1.3"):
                cfg = compose(config_name, overrides=job)
            (check or validate)(cfg)
    except ConfigError:
        raise
    except (HydraException, OmegaConfBaseException) as exc:
        raise _hydra_error(exc) from None
