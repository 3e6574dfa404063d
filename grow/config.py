"""Configuration: the validated Hydra config turned into typed, frozen objects, once.

The YAML files in ``configs/`` are the interface: every knob with its default and a comment. Past
the command line nothing reads the Hydra config: `RunConfig.from_hydra` checks every key and
returns frozen dataclasses, one per concern,

    RunConfig(seed, device, precision, resume,
              model=TransformerConfig, data=<data node>, trainer=TrainerConfig, optim=OptimConfig,
              strategy=StrategyConfig, schedule=ScheduleConfig | None, logger=LoggerConfig, raw=dict)

and the trainer, the checkpoints and the compare arms take those. A key is defined (a dataclass
field beside its check) and documented (its YAML comment) in one place each; a strategy's options
are checked by its constructor (`grow.growth.base.Strategy`), the schedule's by
`grow.plan.normalize_schedule`.

Every command validates its whole configuration before any data or model work starts. A bad value
ends the command with one line, ``error: <key>=<value>: <what is allowed>``, and exit status 2
(`ConfigError`). `precheck` runs the same validation on the command line's overrides before
Hydra starts any job, expanding sweeps (``strategy=svd,zero``) so every job of a multirun is
checked first.
"""

from __future__ import annotations

import copy
import dataclasses
import difflib
import functools
import math
import re
from dataclasses import MISSING, dataclass, field, fields
from typing import ClassVar

import torch
from omegaconf import DictConfig, OmegaConf

from grow import (
    checkpoint,
    slurm,  # noqa: F401 - registers the launcher's grow_slurm_gpus resolver
)
from grow.data import DataConfig
from grow.errors import CONFIG_DIR, ConfigError, options  # noqa: F401 - re-exported
from grow.growth.base import DIMS, get_strategy, strategy_class, yaml_options
from grow.growth.expand import layer_positions
from grow.hf import pretrained
from grow.model import ACTIVATIONS, PARAMETRIZATIONS, POSITIONS, TransformerConfig
from grow.optim import lr_at
from grow.plan import ScheduleConfig, build_plan, frozen_flops_per_token

MODEL_INTS = ("vocab_size", "seq_len", "n_layers", "d_model", "n_heads", "d_ff")


# ---- value checks --------------------------------------------------------------------------------


def positive_int(key: str, value) -> int:
    if isinstance(value, float) and value.is_integer():
        value = int(value)
    if not isinstance(value, int) or isinstance(value, bool) or value < 1:
        raise ConfigError(key, value, "must be a positive integer")
    return value


def check_number(key: str, value, lo: float | None = None, hi: float | None = None, *, lo_open: bool = False,
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
    return positive_int(f"model.{key}", value)


def model_config(m: DictConfig, prefix: str = "model") -> TransformerConfig:
    """`TransformerConfig` from the ``model`` node, with one-line errors naming the key."""
    names = [f.name for f in fields(TransformerConfig)]
    for key in m:
        if key not in names:
            raise ConfigError(f"{prefix}.{key}", m.get(key), f"not a key of {prefix}{nearest_key(str(key), names)}")
    for key in MODEL_INTS:
        positive_int(f"{prefix}.{key}", m.get(key))
    if m.get("activation", "gelu") not in ACTIVATIONS:
        raise ConfigError(f"{prefix}.activation", m.activation, f"must be one of {', '.join(ACTIVATIONS)}")
    if m.get("positions", "learned") not in POSITIONS:
        raise ConfigError(f"{prefix}.positions", m.positions, f"must be one of {', '.join(POSITIONS)}")
    check_number(f"{prefix}.rope_theta", m.get("rope_theta", 10000.0), 1, lo_open=True)
    kv = m.get("n_kv_heads")
    if kv is not None and (positive_int(f"{prefix}.n_kv_heads", kv) > m.n_heads or m.n_heads % kv):
        raise ConfigError(f"{prefix}.n_kv_heads", kv, f"must divide model.n_heads={m.n_heads} (null: one per head)")
    check_number(f"{prefix}.dropout", m.get("dropout", 0.0), 0, 1, hi_open=True)
    check_number(f"{prefix}.init_std", m.get("init_std", 0.02), 0, lo_open=True)
    check_number(f"{prefix}.norm_eps", m.get("norm_eps", 1e-5), 0)
    for key in ("mlp_bias", "tie_embeddings"):
        if key in m:
            _bool(f"{prefix}.{key}", m[key])
    d = OmegaConf.to_container(m, resolve=True)
    d["d_qk"], d["d_v"] = _head_size(m, "d_qk"), _head_size(m, "d_v")
    if d.get("positions") == "rope" and d["d_qk"] % 2:
        raise ConfigError(f"{prefix}.d_qk", d["d_qk"], "must be even with model.positions=rope (the rotation "
                                                        "turns pairs of coordinates)")
    rd = d.get("rope_dim")
    if rd is not None and (positive_int(f"{prefix}.rope_dim", rd) < d["d_qk"] or rd % 2):
        raise ConfigError(f"{prefix}.rope_dim", rd, f"must be an even integer >= model.d_qk={d['d_qk']} (null: d_qk)")
    for key in MODEL_INTS:
        d[key] = int(d[key])
    if d.get("parametrization", "standard") not in PARAMETRIZATIONS:
        raise ConfigError(f"{prefix}.parametrization", d["parametrization"], f"must be one of {', '.join(PARAMETRIZATIONS)}")
    try:
        return TransformerConfig.from_dict(d)
    except ValueError as exc:  # the cross-key rules of TransformerConfig (mup's base width, tied embeddings)
        key, _, rest = str(exc).partition("=")
        value, _, allowed = rest.partition(": ")
        raise ConfigError(f"{prefix}.{key}", value, allowed) from None


# ---- data ------------------------------------------------------------------------------------


# ---- typed sections ------------------------------------------------------------------------------
# Each section of the run config is a frozen dataclass: a field per YAML key (the YAML holds the
# default and the comment a user reads), its type, and the check its value must pass. `from_node`
# builds one from the composed config node, refusing unknown and bad keys with one line.


def _nonneg_int(key: str, value) -> int:
    if not isinstance(value, int) or isinstance(value, bool) or value < 0:
        raise ConfigError(key, value, "must be an integer >= 0")
    return value


def _one_of(*choices):
    def check(key: str, value):
        if value not in choices:
            raise ConfigError(key, value, f"must be one of {', '.join(map(str, choices))}")
        return value
    return check


def _range(lo=None, hi=None, **open_ends):
    return lambda key, value: check_number(key, value, lo, hi, **open_ends)


def _fraction_of_tokens(key: str, value) -> float:
    if not isinstance(value, (int, float)) or isinstance(value, bool) or not 0 <= value < 1:
        raise ConfigError(key, value, "must be a fraction of trainer.max_tokens in [0, 1)")
    return float(value)


def _auto_or_positive(key: str, value) -> int | None:
    if value == "auto":
        return None
    if not isinstance(value, int) or isinstance(value, bool) or value < 1:
        raise ConfigError(key, value, "must be auto or a positive integer")
    return value


def _null_or(check):
    return lambda key, value: None if value is None else check(key, value)


def _text(key: str, value) -> str:
    return str(value)


def _betas(key: str, value) -> tuple[float, float]:
    ok = isinstance(value, (list, tuple)) and len(value) == 2 and all(
        isinstance(b, (int, float)) and not isinstance(b, bool) and 0 <= b < 1 for b in value)
    if not ok:
        raise ConfigError(key, list(value) if isinstance(value, (list, tuple)) else value,
                          "must be two numbers in [0, 1)")
    return float(value[0]), float(value[1])


def checked(check, **kw):
    """A dataclass field whose YAML value must pass ``check(key, value) -> value``."""
    return field(metadata={"check": check}, **kw)


def nearest(key: str, known) -> str:
    """The closest of ``known`` to ``key`` ('' when none is close)."""
    match = difflib.get_close_matches(key, list(known), n=1, cutoff=0.6)
    return match[0] if match else ""


def nearest_key(key: str, known) -> str:
    """`` (did you mean <k>?)`` naming the closest of ``known`` to ``key``, or ''."""
    match = nearest(key, known)
    return f" (did you mean {match}?)" if match else ""


# ---- unknown keys: the nearest valid key anywhere in the config ---------------------------------


def config_groups() -> list[str]:
    """The config groups a command line can pick an option of (model, data, strategy, schedule, ...)."""
    return sorted(p.name for p in CONFIG_DIR.iterdir() if p.is_dir() and p.name not in ("arms", "hydra"))


def _paths(node, prefix: str = "") -> list[str]:
    """The dotted path of every key of a plain nested dict (inner nodes included)."""
    out = []
    if isinstance(node, dict):
        for k, v in node.items():
            path = f"{prefix}{k}"
            out.append(path)
            out += _paths(v, path + ".")
    return out


def _strategy_hint(leaf: str, cfg: dict) -> str:

    current = (cfg.get("strategy") or {}).get("name")
    having = []
    for name in options("strategy"):
        try:
            known = set(strategy_class(name).defaults) | set(yaml_options(name))
        except ValueError:
            continue
        if leaf in known:
            having.append(name)
    if having:
        return f" (an option of strategy={', '.join(having)}; this config's strategy is {current})"
    mine = [k for k in (cfg.get("strategy") or {}) if k != "name"]
    near = nearest(leaf, mine)
    return f" (did you mean strategy.{near}?)" if near else f" (strategy {current} has: {', '.join(mine) or 'no options'})"


def suggest(key: str, value, cfg: dict | None) -> str:
    """`` (did you mean ...?)`` for an unknown ``key=value``, from the whole composed config ``cfg``
    (a plain dict) and the config groups: ``modle=tiny`` -> ``model=tiny``, ``trainer.lr`` ->
    ``optim.lr`` (the same key in another section), ``trainer.max_token`` -> ``trainer.max_tokens``,
    ``schedule.grow=...`` without a schedule -> add ``+schedule=exp`` first. '' when nothing is close."""
    cfg = cfg or {}
    key = key.lstrip("+~")
    parts = key.split(".")
    groups, present = config_groups(), list(cfg)
    if len(parts) == 1:
        near = nearest(key, [*groups, *present])
        if not near:
            return ""
        if near in groups and isinstance(value, str) and (CONFIG_DIR / near / f"{value}.yaml").is_file():
            return f" (did you mean {'' if near in present else '+'}{near}={value}?)"
        if near in groups and near not in present:
            return f" (did you mean +{near}=<{'|'.join(options(near))}>?)"
        return f" (did you mean {near}{'' if value is ... else '=' + str(value)}?)"
    head, leaf = parts[0], parts[-1]
    if head in groups and head not in present:
        return f" ({head} is not in this config: add +{head}=<{'|'.join(options(head))}> first)"
    if head not in present:
        near = nearest(head, present)
        return f" (did you mean {'.'.join([near, *parts[1:]])}?)" if near else ""
    if head == "strategy" and len(parts) == 2:
        return _strategy_hint(leaf, cfg)
    paths = _paths(cfg)
    same = [p for p in paths if p.rsplit(".", 1)[-1] == leaf and p != key]
    if same:
        return f" (did you mean {same[0]}?)"
    near = nearest(key, paths)
    return f" (did you mean {near}?)" if near else ""


def _plain(node) -> dict:
    return OmegaConf.to_container(node, resolve=True) if OmegaConf.is_config(node) else dict(node)


class Section:
    """A typed config section: `from_node` checks every key of its YAML node and builds the dataclass."""

    prefix: ClassVar[str] = ""

    @classmethod
    def from_node(cls, node, prefix: str | None = None):
        prefix, data = prefix or cls.prefix, _plain(node)
        names = [f.name for f in fields(cls)]
        for key in data:
            if key not in names:
                raise ConfigError(f"{prefix}.{key}", data[key], f"not a key of {prefix}{nearest_key(key, names)}")
        values = {}
        for f in fields(cls):
            if f.name in data:
                values[f.name] = f.metadata["check"](f"{prefix}.{f.name}", data[f.name])
            elif f.default is MISSING and f.default_factory is MISSING:
                raise ConfigError(f"{prefix}.{f.name}", ..., f"missing (every key of configs/train.yaml's {prefix} "
                                                            "block is needed)")
        return cls(**values)


@dataclass(frozen=True)
class TrainerConfig(Section):
    """The ``trainer:`` block of configs/train.yaml (its comments document each key)."""

    prefix: ClassVar[str] = "trainer"
    max_tokens: int = checked(positive_int)
    batch_size: int = checked(positive_int)
    micro_batch_size: int | None = checked(_auto_or_positive)  # None: auto
    device_memory_gb: float | None = checked(_null_or(_range(0, lo_open=True)))
    grad_clip: float = checked(_range(0))
    log_every: int = checked(positive_int)
    eval_every: int = checked(_nonneg_int)
    evals_per_stage: int = checked(positive_int)
    eval_batches: int = checked(positive_int)
    eval_batch_size: int = checked(positive_int)
    recovery_steps: int = checked(_nonneg_int)
    growth_batches: int = checked(_nonneg_int)
    compile: bool = checked(_bool)
    ckpt_every: int = checked(_nonneg_int)
    keep_checkpoints: int = checked(positive_int)
    skip_nonfinite: int = checked(_nonneg_int)
    progress: bool = checked(_bool)
    parallel: str = checked(_one_of("ddp", "fsdp"), default="ddp")  # under torchrun (grow.fsdp)
    fsdp_reshard_after_forward: bool = checked(_bool, default=True)
    world_size: int | None = checked(_null_or(positive_int), default=None)  # the ranks grow schedule plans for
    train_new_only: bool = checked(_bool, default=False)  # after a growth only its new layers train (LLaMA Pro)
    full_val: bool = checked(_bool, default=True)  # the whole held-out split once at the end (grow.train.full_validation)


@dataclass(frozen=True)
class OptimConfig(Section):
    """The ``optim:`` node (configs/optim/adamw.yaml, sgd.yaml): the growth-aware optimizer and the
    learning-rate schedule over the whole run. The keys of the other optimizer are refused."""

    prefix: ClassVar[str] = "optim"
    ADAMW_ONLY: ClassVar[tuple[str, ...]] = ("betas", "eps", "fused", "compile")
    SGD_ONLY: ClassVar[tuple[str, ...]] = ("momentum", "nesterov", "decoupled_weight_decay")

    name: str = checked(_one_of("adamw", "sgd"))
    lr: float = checked(_range(0, lo_open=True))
    weight_decay: float = checked(_range(0))
    schedule: str = checked(_one_of("cosine", "wsd", "constant"))
    warmup: float = checked(_fraction_of_tokens)
    min_lr_ratio: float = checked(_range(0, 1))
    on_growth: str = checked(_one_of("keep", "reset"))
    decay_fraction: float = checked(_range(0, 1, lo_open=True), default=0.2)
    new_warmup_steps: int = checked(lambda k, v: 0 if v is None else _nonneg_int(k, v), default=0)
    rewarm_steps: int = checked(lambda k, v: 0 if v is None else _nonneg_int(k, v), default=0)
    betas: tuple[float, float] = checked(_betas, default=(0.9, 0.999))  # adamw
    eps: float = checked(_range(0), default=1e-8)  # adamw
    fused: bool | None = checked(_null_or(_bool), default=None)  # adamw: null = auto
    compile: bool | None = checked(_null_or(_bool), default=None)  # adamw: null = on for CPU, else as trainer.compile
    momentum: float = checked(_range(0, 1, hi_open=True), default=0.9)  # sgd
    nesterov: bool = checked(_bool, default=False)  # sgd
    decoupled_weight_decay: bool = checked(_bool, default=False)  # sgd

    @classmethod
    def from_node(cls, node, prefix: str | None = None):
        data = _plain(node)
        name = data.get("name")
        if name not in ("adamw", "sgd"):
            raise ConfigError("optim.name", name, "must be adamw or sgd")
        for key in cls.SGD_ONLY if name == "adamw" else cls.ADAMW_ONLY:
            if key in data:
                raise ConfigError(f"optim.{key}", data[key], f"not an option of optim={name}")
        return super().from_node(data, prefix)

    def lr_schedule(self, max_tokens: int):
        """``tokens -> learning rate`` of the run (`grow.optim.lr_at` with these settings, bound once: a
        config lookup costs tens of microseconds and the loop asks every step)."""
        return functools.partial(lr_at, lr=self.lr, total_tokens=int(max_tokens),
                                 warmup_tokens=int(self.warmup * max_tokens), schedule=self.schedule,
                                 min_lr_ratio=self.min_lr_ratio, decay_fraction=self.decay_fraction)


@dataclass(frozen=True)
class LoggerConfig(Section):
    """The ``logger:`` node (configs/logger/wandb.yaml)."""

    prefix: ClassVar[str] = "logger"
    project: str = checked(_text)
    entity: str | None = checked(_null_or(_text))
    group: str | None = checked(_null_or(_text))
    name: str | None = checked(_null_or(_text))
    tags: tuple[str, ...] = checked(lambda k, v: tuple(str(t) for t in (v or ())), default=())
    init_timeout: float = checked(lambda k, v: check_number(k, v, 0.0, lo_open=True), default=10.0)


@dataclass(frozen=True)
class StrategyConfig:
    """The ``strategy:`` node: a registered strategy's name and its options (its constructor checks them).

    `build` makes the strategy once, on first use (validation), and returns that same object after:
    one strategy per run, the one that grows the model and whose training hooks run."""

    name: str
    options: dict

    def __post_init__(self) -> None:
        object.__setattr__(self, "_instance", None)  # a replace() with other options builds its own

    @classmethod
    def from_node(cls, node) -> "StrategyConfig":
        opts = _plain(node)
        known = options("strategy")
        if opts.get("name") not in known:
            raise ConfigError("strategy", opts.get("name"), f"must be one of {', '.join(known)}")
        spec = cls(str(opts.pop("name")), opts)
        try:
            spec.build()
        except ValueError as exc:
            raise _strategy_error(node, exc) from None
        return spec

    def build(self):
        """The run's `grow.growth.base.Strategy` (built on the first call, the same object after)."""
        if self._instance is None:
            object.__setattr__(self, "_instance", get_strategy({"name": self.name, **self.options}))
        return self._instance


DEVICES = "must be auto, cpu, cuda or cuda:N"


@dataclass(frozen=True)
class RunConfig:
    """A whole validated run: what `grow train` (and each arm of `grow compare`) runs."""

    seed: int
    device: str
    precision: str
    resume: str | None
    init: str  # auto | model | strategy: who initializes the stage-0 model
    model: TransformerConfig  # the final model
    data: DataConfig
    trainer: TrainerConfig
    optim: OptimConfig
    strategy: StrategyConfig
    schedule: ScheduleConfig | None  # the checked schedule node; None = the fixed-size baseline
    logger: LoggerConfig
    raw: dict  # the resolved config as plain data (config.yaml, checkpoints, W&B)

    @classmethod
    def from_hydra(cls, cfg: DictConfig) -> "RunConfig":
        """Validate a composed ``train`` (or compare arm) config and build the typed run config."""
        pretrained.prepare(cfg)  # init=<LlamaForCausalLM dir>: its tokenizer, before data.vocab_size resolves
        try:
            OmegaConf.resolve(cfg)
        except Exception as exc:  # noqa: BLE001 - an interpolation error becomes one line
            raise ConfigError("config", ..., f"cannot resolve: {str(exc).splitlines()[0]}") from None
        _check_run_keys(cfg)
        _check_section_keys(cfg)
        data = DataConfig.from_node(cfg.data)  # every data.* key is defined and checked in grow/data/config.py
        model = model_config(cfg.model)
        _check_vocab(model, data)
        run = cls(
            seed=cfg.seed, device=str(cfg.device), precision=str(cfg.precision), resume=cfg.get("resume"),
            init=str(cfg.get("init", "auto")),
            model=model, data=data, trainer=TrainerConfig.from_node(cfg.trainer),
            optim=OptimConfig.from_node(cfg.optim), strategy=StrategyConfig.from_node(cfg.strategy),
            schedule=_schedule(cfg), logger=LoggerConfig.from_node(cfg.logger),
            raw=OmegaConf.to_container(cfg, resolve=True))
        start = pretrained.pretrained_dir(run.init)
        if start is not None:  # the checkpoint's sizes as stage 0, its vocabulary, epsilon, rotary base
            run = run.replace(**pretrained.reconcile(start, model, run.schedule, data.vocab_size))
        if run.model.parametrization == "mup" and run.optim.name != "adamw":
            raise ConfigError("model.parametrization", "mup", f"standard with optim={run.optim.name} (mup's rules "
                                                             "are built for AdamW: optim=adamw)")
        run.check_mup_strategy()
        plan = run.plan()
        run.check_growths(plan)
        run.check_resume(plan)
        return run

    def replace(self, **changes) -> "RunConfig":
        """A copy with typed ``changes`` (`dataclasses.replace`: ``model=``, ``trainer=``, ``schedule=None``,
        ``strategy=``, ``init=``, ``resume=``...), its ``raw`` (config.yaml, checkpoints, W&B) changed to say
        the same: the keys of a section that differ, a dropped schedule, the strategy's node. `grow compare`
        derives its arms this way from one validated config."""
        raw = copy.deepcopy(self.raw)
        for key, value in changes.items():
            old = getattr(self, key)
            if key == "schedule" and value is None:
                raw.pop("schedule", None)
            elif key == "strategy":
                raw["strategy"] = {"name": value.name, **copy.deepcopy(value.options)}
            elif dataclasses.is_dataclass(value) and type(value) is type(old):
                for f in fields(value):
                    new = getattr(value, f.name)
                    if new != getattr(old, f.name):
                        raw[key][f.name] = list(new) if isinstance(new, tuple) else new
            elif key in ("seed", "device", "precision", "resume", "init"):
                raw[key] = value
            else:
                raise ValueError(f"RunConfig.replace: cannot change {key} to {value!r}")
        return dataclasses.replace(self, **changes, raw=raw)

    @functools.cached_property
    def resumed(self) -> "checkpoint.Resume | None":
        """The resume ``resume=`` names, resolved once for the run (`checkpoint.Resume`; ``latest`` keeps
        meaning the run it meant at validation), or None."""
        return checkpoint.Resume.of(self.resume)

    def check_resume(self, plan) -> None:
        """``resume=<run dir>|latest``: the run has a complete checkpoint of the same model and schedule."""
        if self.resume is None:
            return
        if self.raw.get("compare") is not None:
            raise ConfigError("resume", self.resume, "grow compare does not resume (rerun it with the same "
                                                     "hydra.sweep.dir: finished arms are skipped); resume one arm "
                                                     "with grow train resume=<arm dir>")
        meta = self.resumed.manifest()
        checkpoint.verify(meta, full=True)
        checkpoint.check_compatible(meta, self.model, plan, str(self.optim.name))

    @property
    def grows(self) -> bool:
        """A growth run (a schedule is given), as opposed to the fixed-size baseline."""
        return self.schedule is not None

    @property
    def init_by_strategy(self) -> bool:
        """Whether the strategy's ``initialize`` sets up the stage-0 model (``init``; auto: in a growth run)."""
        return self.init == "strategy" or (self.init == "auto" and self.grows)

    @property
    def strategy_name(self) -> str:
        """The strategy's name, or ``baseline`` without a schedule."""
        return self.strategy.name if self.grows else "baseline"

    def plan(self):
        """The stage plan (`grow.plan.build_plan`); its ValueErrors as `ConfigError` naming the key."""
        try:
            plan = build_plan(self.model, self.schedule, max_tokens=self.trainer.max_tokens,
                              batch_size=self.trainer.batch_size)
            if self.schedule is not None:
                self.check_trigger(plan)
            return self._frozen_costs(plan) if self.trainer.train_new_only and self.grows else plan
        except ValueError as exc:
            raise _value_error(exc, "schedule") from None

    def new_layers(self, before, after) -> list[int]:
        """The layers of ``after``'s model born at the growth from ``before`` (the strategy's positions)."""
        n_old, n_new = before.cfg.n_layers, after.cfg.n_layers
        return layer_positions(n_old, n_new, self.strategy.build().layer_positions(before.cfg, after.cfg))

    def _frozen_costs(self, plan):
        """``trainer.train_new_only``: every stage after a growth costs `grow.plan.frozen_flops_per_token` of the
        layers born at that growth (the others frozen); a growth that adds no layer would train nothing."""
        stages = [plan[0]]
        for before, after in zip(plan, list(plan)[1:]):
            born = self.new_layers(before, after) if after.cfg.n_layers > before.cfg.n_layers else []
            if not born:
                raise ValueError(f"trainer.train_new_only=true: the growth into stage {after.number} adds no layer, so "
                                 "no parameter would train; allowed: false, or a schedule whose every growth grows "
                                 "n_layers")
            stages.append(dataclasses.replace(after, flops=frozen_flops_per_token(after.cfg, born) * after.tokens))
        return dataclasses.replace(plan, stages=tuple(stages))

    def check_trigger(self, plan) -> None:
        """The schedule's trigger can run on this plan: no two growths in one step, and the
        evaluations a trigger that reads validation losses needs (ValueError naming the key)."""
        trigger = self.schedule.build_trigger()
        trigger.check_plan(plan, plan[0].tokens_per_step)
        t = self.trainer
        if trigger.needs_evals and t.eval_every == 0:
            raise ValueError(f"trainer.eval_every=0: trigger {trigger.name} reads the validation losses the run "
                             "makes during a stage; allowed: an integer >= 1 (steps between evaluations)")
        if trigger.name == "gap" and t.log_every > t.eval_every:
            raise ValueError(f"trainer.log_every={t.log_every}: trigger gap compares each evaluation with the "
                             f"training losses logged since the previous one; allowed: at most trainer.eval_every="
                             f"{t.eval_every}")

    def check_mup_strategy(self) -> None:
        """mup with a strategy that brings its own parameterization (vt's Table 1 and Eq. 5, also as svd's or
        another's base) is refused: the two would have to compose (vt's initialize replaces mup's stage-0 init,
        its growth multipliers stack on mup's 1/m rates), and they do not (docs/design.md §5.1)."""
        if self.model.parametrization != "mup" or not (self.grows or self.init == "strategy"):
            return
        own = self.strategy.build().parameterization()
        if own is not None:
            raise ConfigError("model.parametrization", "mup", f"standard with strategy={self.strategy.name} (its {own} "
                              "parameterization does not compose with mup's); allowed under mup: a strategy that "
                              "keeps the model's initializer (zero, msg, stack, ...)")

    def check_growths(self, plan) -> None:
        """The strategy can make every growth of the plan (e.g. vt's even numbers of new units), new
        layers have a place, and data-driven strategies get enough growth batches."""
        if not self.grows:
            return
        strategy = self.strategy.build()
        for before, after in zip(plan, list(plan)[1:]):
            try:
                strategy.check_transition(before.cfg, after.cfg)
            except ValueError as exc:
                raise ConfigError("strategy", self.strategy.name, f"growth into stage {after.index + 1}: {exc}") from None
        need = getattr(strategy, "batches_needed", lambda: 0)()  # a strategy that trains on them (ligo)
        if self.trainer.growth_batches < need:
            raise ConfigError("trainer.growth_batches", self.trainer.growth_batches,
                              f"must be >= {need}: strategy {self.strategy.name} trains on the growth batches")
        _check_growth_inputs(self, plan)

    def strategy_warnings(self, plan) -> list[str]:
        """One line when growths of the plan grow none of the dimensions the strategy grows by its
        own rule (`grow.growth.base.Strategy.own_dims`): there the run is its delegate's (svd with
        ``schedule.grow=[n_layers]`` is zero's run). Warned, not refused: a sweep over
        ``schedule.grow`` (make sweep-dims) runs such arms on purpose."""
        if not self.grows:
            return []

        strategy = self.strategy.build()
        own = set(strategy.own_dims)
        transitions = list(zip(plan, list(plan)[1:]))
        idle, grown_there, growths = [], [], 0
        for before, after in transitions:
            grown = [d for d, f in DIMS.items() if getattr(after.cfg, f) > getattr(before.cfg, f)]
            growths += bool(grown)
            if grown and not own & set(grown):
                idle.append(after.index + 1)
                grown_there += [DIMS[d] for d in grown if DIMS[d] not in grown_there]
        if not idle:
            return []
        mine = ", ".join(DIMS[d] for d in DIMS if d in own)
        other = strategy.delegate()
        where = ("in every growth of this plan" if len(idle) == growths
                 else f"in the growth{'s' if len(idle) > 1 else ''} into stage {', '.join(map(str, idle))}")
        return [f"strategy={self.strategy.name} grows only {mine} by its own rule, and {where} only "
                f"{', '.join(grown_there)} grow: it hands them to strategy {other}, so there the run is "
                f"strategy={other}'s (grow {mine} in schedule.grow, or pick another strategy)"]


TOP_KEYS = ("seed", "device", "precision", "resume", "init", "model", "data", "trainer", "optim", "strategy",
            "schedule", "logger", "compare", "report")


def _check_run_keys(cfg: DictConfig) -> None:
    for key in cfg:
        if key not in TOP_KEYS:
            near, value = nearest(key, TOP_KEYS), cfg.get(key)
            hint = f" (did you mean +{near}={value}?)" if near and isinstance(value, str) and \
                (CONFIG_DIR / near / f"{value}.yaml").is_file() else nearest_key(key, TOP_KEYS)
            raise ConfigError(str(key), value, f"not a key of the config{hint}")
    validate_device(cfg)
    if not isinstance(cfg.seed, int) or isinstance(cfg.seed, bool) or cfg.seed < 0:
        raise ConfigError("seed", cfg.seed, "must be an integer >= 0")
    if pretrained.pretrained_dir(cfg.get("init", "auto")) is not None:
        pretrained.check_dir(pretrained.pretrained_dir(cfg.init))


def validate_device(cfg: DictConfig) -> None:
    """``device`` and ``precision``: every command that runs a model (train, compare, sample, eval)."""
    if str(cfg.device) not in ("auto", "cpu", "cuda") and not str(cfg.device).startswith("cuda:"):
        raise ConfigError("device", cfg.device, DEVICES)
    if str(cfg.device).startswith("cuda") and not torch.cuda.is_available():
        raise ConfigError("device", cfg.device, "no CUDA device is available here (use device=cpu or auto)")
    if cfg.precision not in ("auto", "float32", "bfloat16", "float64"):
        raise ConfigError("precision", cfg.precision, "must be auto, float32, bfloat16 or float64")


SECTIONS = {"trainer": TrainerConfig, "optim": OptimConfig, "logger": LoggerConfig, "model": TransformerConfig}


def _check_section_keys(cfg: DictConfig) -> None:
    """Every key of the typed sections is known; an unknown one (``+trainer.lr=...``) is refused with
    the nearest key of the whole config (``optim.lr``)."""
    plain = None
    for section, cls in SECTIONS.items():
        node = cfg.get(section)
        if not isinstance(node, DictConfig):
            continue
        names = {f.name for f in fields(cls)}
        for key in node:
            if key not in names:
                plain = plain or OmegaConf.to_container(cfg, resolve=True)
                known = {k: v for k, v in plain.items()}
                known[section] = {k: v for k, v in plain[section].items() if k in names}
                raise ConfigError(f"{section}.{key}", node.get(key),
                                  f"not a key of {section}{suggest(f'{section}.{key}', node.get(key), known)}")


def _check_vocab(model: TransformerConfig, data) -> None:
    if model.vocab_size > int(data.vocab_size) and model.vocab_size > 65535:
        raise ConfigError("model.vocab_size", model.vocab_size, "must be <= 65535 (uint16 token cache)")
    if model.vocab_size < int(data.vocab_size):
        raise ConfigError("model.vocab_size", model.vocab_size, f"must be >= data.vocab_size={data.vocab_size} "
                                                                "(every token id needs an embedding row)")


def _schedule(cfg: DictConfig) -> ScheduleConfig | None:
    if cfg.get("schedule") is None:
        return None
    try:
        return ScheduleConfig.from_node(OmegaConf.to_container(cfg.schedule, resolve=True))
    except ValueError as exc:
        raise _value_error(exc, "schedule") from None


def _check_growth_inputs(run: RunConfig, plan) -> None:
    """Where new layers go; enough growth batches for a data-driven strategy."""
    s = {"name": run.strategy.name, **run.strategy.options}
    strategy = run.strategy.build()
    for before, after in zip(plan, list(plan)[1:]):
        n_old, n_new = before.cfg.n_layers, after.cfg.n_layers
        where = strategy.layer_positions(before.cfg, after.cfg)
        if n_new > n_old or not isinstance(where, list):
            try:
                layer_positions(n_old, max(n_new, n_old + 1), where)
            except (ValueError, TypeError) as exc:
                raise ConfigError(f"strategy.{strategy.layer_position_key}", where,
                                  f"{str(exc).split(': ', 1)[-1]} (growth into stage {after.index + 1})") from None
        if after.cfg.d_qk > before.cfg.d_qk and "batches" in s and "heldout" in s:
            need = int(s["batches"]) + (int(s["heldout"]) if s.get("gamma") == "auto" else 0)
            if run.trainer.growth_batches < need:
                raise ConfigError("trainer.growth_batches", run.trainer.growth_batches,
                                  f"must be >= {need}: strategy {s['name']} uses strategy.batches={s['batches']}"
                                  + (f" + strategy.heldout={s['heldout']}" if s.get("gamma") == "auto" else "")
                                  + f" at the growth into stage {after.index + 1}")


def validate(cfg: DictConfig) -> TransformerConfig:
    """Validate a composed run config (train or compare); returns the final model config."""
    return RunConfig.from_hydra(cfg).model


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


def _value_error(exc: ValueError, default_key: str) -> ConfigError:
    """A one-line ValueError that starts with ``key=value: ...`` (grow.plan's) as that key's `ConfigError`."""
    msg = (str(exc).strip().splitlines() or [type(exc).__name__])[0]
    m = re.match(r"([A-Za-z_][\w.]*)(=|: )", msg)
    err = ConfigError(m.group(1) if m else default_key, ..., msg)
    if m:
        err.args = (msg,)
    return err
