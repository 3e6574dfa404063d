"""The run config's schema: one frozen dataclass per section, each key beside its type and range check.

A leaf: it imports nothing of ``grow`` but `grow.errors`, so every module may read a config without
pulling in the model, the data or the checkpoints. The YAML files in ``configs/`` hold each key's
default and comment; `grow.run.load` composes these sections with the components' own checks
(the model's, the data's, the strategy's, the schedule's and the trigger's) into one validated,
assembled run (docs/design.md, "Architecture", "The run config"). A bad value ends a command with one line,
``error: <key>=<value>: <what is allowed>``, and exit status 2 (`ConfigError`).
"""

from __future__ import annotations

import copy
import dataclasses
from dataclasses import MISSING, dataclass, field, fields
from typing import ClassVar

import torch
from omegaconf import DictConfig, OmegaConf

from grow.errors import (  # noqa: F401 - re-exported: the value checks every section uses
    CONFIG_DIR,
    ConfigError,
    check_bool,
    check_number,
    nearest,
    nearest_key,
    options,
    positive_int,
)
from grow.kernels import ATTENTION_BACKENDS, LOSS_KERNELS

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
    check.choices = choices  # what a script may offer (scripts/fsdp_growth_memory.py)
    return check


def _range(lo=None, hi=None, **open_ends):
    return lambda key, value: check_number(key, value, lo, hi, **open_ends)


def _fraction_of_tokens(key: str, value) -> float:
    if not isinstance(value, (int, float)) or isinstance(value, bool) or not 0 <= value < 1:
        raise ConfigError(key, value, "must be a fraction of trainer.max_tokens in [0, 1)")
    return float(value)


def _branch_fractions(key: str, value) -> tuple[float, ...]:
    """optim.decay_branches: fractions of trainer.max_tokens, each in (0, 1), increasing (grow.branches)."""
    if value is None:
        return ()
    if isinstance(value, (str, bytes)) or not hasattr(value, "__iter__"):
        raise ConfigError(key, value, "must be a list of fractions of trainer.max_tokens in (0, 1), e.g. [0.5, 0.75]")
    out = tuple(check_number(key, v, 0, 1, lo_open=True, hi_open=True) for v in value)
    if any(b <= a for a, b in zip(out, out[1:])):
        raise ConfigError(key, list(out), "must be increasing, each fraction once (e.g. [0.5, 0.75])")
    return out


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
    compile: bool = checked(check_bool)
    ckpt_every: int = checked(_nonneg_int)
    keep_checkpoints: int = checked(positive_int)
    skip_nonfinite: int = checked(_nonneg_int)
    progress: bool = checked(check_bool)
    parallel: str = checked(_one_of("ddp", "fsdp"), default="ddp")  # under torchrun (grow.parallel.fsdp)
    fsdp_reshard_after_forward: bool = checked(check_bool, default=True)
    fsdp_growth: str = checked(_one_of("auto", "sharded", "host"), default="auto")  # grow.fsdp_growth
    world_size: int | None = checked(_null_or(positive_int), default=None)  # the ranks grow schedule plans for
    ckpt_minutes: float = checked(_range(0), default=10.0)  # a checkpoint once this much wall-clock has passed
    train_new_only: bool = checked(check_bool, default=False)  # after a growth only its new layers train (LLaMA Pro)
    full_val: bool = checked(check_bool, default=True)  # the whole held-out split once at the end (grow.train.full_validation)
    loss_kernel: str = checked(_one_of(*LOSS_KERNELS), default="chunked")  # a training step's loss (grow.kernels)
    attention: str = checked(_one_of(*ATTENTION_BACKENDS), default="auto")  # SDPA's backend first tried (grow.kernels)


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
    decay_branches: tuple[float, ...] = checked(_branch_fractions, default=())  # wsd, fixed size: grow.branches
    new_warmup_steps: int = checked(lambda k, v: 0 if v is None else _nonneg_int(k, v), default=0)
    rewarm_steps: int = checked(lambda k, v: 0 if v is None else _nonneg_int(k, v), default=0)
    betas: tuple[float, float] = checked(_betas, default=(0.9, 0.999))  # adamw
    eps: float = checked(_range(0), default=1e-8)  # adamw
    fused: bool | None = checked(_null_or(check_bool), default=None)  # adamw: null = auto
    compile: bool | None = checked(_null_or(check_bool), default=None)  # adamw: null = on for CPU, else as trainer.compile
    momentum: float = checked(_range(0, 1, hi_open=True), default=0.9)  # sgd
    nesterov: bool = checked(check_bool, default=False)  # sgd
    decoupled_weight_decay: bool = checked(check_bool, default=False)  # sgd

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
    """The ``strategy:`` node: a registered strategy's name and its options (the strategy's constructor
    and `check` hook validate them; `grow.run.assemble` builds the one instance of a run)."""

    name: str
    options: dict

    @classmethod
    def from_node(cls, node) -> "StrategyConfig":
        opts = _plain(node)
        known = options("strategy")
        if opts.get("name") not in known:
            raise ConfigError("strategy", opts.get("name"), f"must be one of {', '.join(known)}")
        return cls(str(opts.pop("name")), opts)


DEVICES = "must be auto, cpu, cuda or cuda:N"


@dataclass(frozen=True)
class RunConfig:
    """A whole run's settings, each section checked (`grow.run.load` adds the checks across components
    and assembles the run: `grow.run.Run`, what `grow train` and each arm of `grow compare` run)."""

    seed: int
    device: str
    precision: str
    resume: str | None
    init: str  # auto | model | strategy: who initializes the stage-0 model
    # the components' types stay names (annotations are strings here): the schema imports none of them
    model: TransformerConfig  # noqa: F821 - grow.model's; the final model
    data: DataConfig  # noqa: F821 - grow.data's
    trainer: TrainerConfig
    optim: OptimConfig
    strategy: StrategyConfig
    schedule: ScheduleConfig | None  # noqa: F821 - grow.plan's; None = the fixed-size baseline
    logger: LoggerConfig
    raw: dict  # the resolved config as plain data (config.yaml, checkpoints, W&B)

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
        # a RunConfig of this class's fields only: an assembled run (grow.run.Run) re-assembles its own
        values = {f.name: getattr(self, f.name) for f in fields(RunConfig)}
        return RunConfig(**{**values, **changes, "raw": raw})

    @classmethod
    def from_node(cls, cfg: DictConfig, raw: dict, *, model, data, schedule) -> "RunConfig":
        """The run config of a composed ``cfg`` (``raw``: it resolved, as plain data): the top keys and the sections
        this schema defines checked here, the components' (``model``, ``data``, ``schedule``) by their own
        classes and handed in, then the rules across sections."""
        config = cls(seed=cfg.seed, device=str(cfg.device), precision=str(cfg.precision), resume=cfg.get("resume"),
                     init=str(cfg.get("init", "auto")), model=model, data=data,
                     trainer=TrainerConfig.from_node(cfg.trainer), optim=OptimConfig.from_node(cfg.optim),
                     strategy=StrategyConfig.from_node(cfg.strategy), schedule=schedule,
                     logger=LoggerConfig.from_node(cfg.logger), raw=raw)
        check_run_keys(cfg)
        check_vocab(model, data)
        if model.parametrization == "mup" and config.optim.name != "adamw":
            raise ConfigError("model.parametrization", "mup", f"standard with optim={config.optim.name} (mup's "
                                                             "rules are built for AdamW: optim=adamw)")
        return config

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


TOP_KEYS = ("seed", "device", "precision", "resume", "init", "model", "data", "trainer", "optim", "strategy",
            "schedule", "logger", "compare", "report")


# directories of configs/ that Hydra lists as groups but no command composes: what each holds instead
NOT_GROUPS = {"sweep": "configs/sweep/ holds the sweeps of make sweep EXP=<name>, read by scripts/sweep.py: "
                       "not a config group of a run"}


def check_run_keys(cfg: DictConfig) -> None:
    for key in cfg:
        if key in NOT_GROUPS:  # composed whole from the YAML: name the option given, not its contents
            value = cfg[key].get("name", ...) if isinstance(cfg.get(key), DictConfig) else cfg.get(key)
            raise ConfigError(str(key), value, NOT_GROUPS[key])
        if key not in TOP_KEYS:
            near, value = nearest(key, TOP_KEYS), cfg.get(key)
            hint = f" (did you mean +{near}={value}?)" if near and isinstance(value, str) and \
                (CONFIG_DIR / near / f"{value}.yaml").is_file() else nearest_key(key, TOP_KEYS)
            raise ConfigError(str(key), value, f"not a key of the config{hint}")
    validate_device(cfg)
    if not isinstance(cfg.seed, int) or isinstance(cfg.seed, bool) or cfg.seed < 0:
        raise ConfigError("seed", cfg.seed, "must be an integer >= 0")


def validate_device(cfg: DictConfig) -> None:
    """``device`` and ``precision``: every command that runs a model (train, compare, sample, eval)."""
    if str(cfg.device) not in ("auto", "cpu", "cuda") and not str(cfg.device).startswith("cuda:"):
        raise ConfigError("device", cfg.device, DEVICES)
    if str(cfg.device).startswith("cuda") and not torch.cuda.is_available():
        raise ConfigError("device", cfg.device, "no CUDA device is available here (use device=cpu or auto)")
    if cfg.precision not in ("auto", "float32", "bfloat16", "float64"):
        raise ConfigError("precision", cfg.precision, "must be auto, float32, bfloat16 or float64")


def check_vocab(model, data) -> None:
    """The final model (`grow.model.TransformerConfig`) has an embedding row for every token id of ``data``."""
    if model.vocab_size > int(data.vocab_size) and model.vocab_size > 65535:
        raise ConfigError("model.vocab_size", model.vocab_size, "must be <= 65535 (uint16 token cache)")
    if model.vocab_size < int(data.vocab_size):
        raise ConfigError("model.vocab_size", model.vocab_size, f"must be >= data.vocab_size={data.vocab_size} "
                                                                "(every token id needs an embedding row)")

