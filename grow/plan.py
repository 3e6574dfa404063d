"""Growth schedules (Yuan, Savarese & Maire, NeurIPS 2023, arXiv:2306.12700, §3.2, Eq. 6, 7, 8) and
the stage plan every command uses (docs/design.md, "Schedules").

`widths` (Eq. 6), `stage_lengths` (Eq. 7; floor, nearest or compound rounding) and `batch_sizes`
(Eq. 8, in reverse) are pure functions of integers, rates read as exact decimals. `build_plan` turns
the final model, the ``schedule`` node and the token budget into a `Plan` of `Stage`s;
`training_flops` is the one place training cost is computed.
"""

from __future__ import annotations

import math
import numbers
from dataclasses import dataclass, field, fields
from fractions import Fraction

from grow.console import DIM_LETTERS, LEGEND, fmt_num
from grow.errors import ConfigError
from grow.model import TransformerConfig
from grow.triggers import base as triggers

__all__ = [
    "GROWABLE", "EVEN_DIMS", "ScheduleConfig", "Stage", "Plan",
    "widths", "additive_depths", "stage_lengths", "prop_lengths", "batch_sizes", "training_flops", "frozen_flops_per_token", "build_plan", "normalize_schedule",
    "format_plan",
]

# Dimensions a schedule may grow, in TransformerConfig's names (Gesmundo & Maile's h, p, E, k, v, N).
GROWABLE = ("d_model", "d_ff", "n_heads", "d_qk", "d_v", "n_layers", "n_experts", "top_k")
# Widths follow Eq. 6 with even rounding; the other two are counts (nearest integer).
EVEN_DIMS = frozenset({"d_model", "d_ff", "d_qk", "d_v"})

ROUNDINGS = ("floor", "nearest", "compound")
UNITS = ("tokens", "steps")


# ---- small exact helpers ------------------------------------------------------------------------


def _is_int(value) -> bool:
    return isinstance(value, numbers.Integral) and not isinstance(value, bool)


def _as_int(key: str, value, minimum: int, what: str | None = None) -> int:
    """An integer >= minimum; integral floats (2e7 from YAML) are accepted. One-line ValueError otherwise."""
    if isinstance(value, float) and math.isfinite(value) and value.is_integer():
        value = int(value)
    if not _is_int(value) or value < minimum:
        raise ConfigError(key, value, f"must be {what or f'an integer >= {minimum}'}")
    return int(value)


def _as_rate(key: str, value) -> Fraction:
    """A finite rate >= 0 as an exact fraction of the decimal the user wrote."""
    if isinstance(value, bool) or not isinstance(value, (numbers.Integral, float, Fraction)):
        raise ConfigError(key, value, "must be a number >= 0")
    if isinstance(value, float) and not math.isfinite(value):
        raise ConfigError(key, value, "must be a finite number >= 0")
    exact = Fraction(str(value)) if isinstance(value, float) else Fraction(value)
    if exact < 0:
        raise ConfigError(key, value, "must be a number >= 0")
    return exact


def _round_half_up(x: Fraction) -> int:
    return math.floor(x + Fraction(1, 2))


def _round_even(x: Fraction) -> int:
    """Nearest even integer (the paper's ⌊x⌋₂); an odd integer x (a tie) rounds up."""
    return 2 * math.floor(x / 2 + Fraction(1, 2))


# ---- Eq. 6, 7, 8 --------------------------------------------------------------------------------


def widths(start: int, final: int, rate: float, stages: int, *, even: bool = True) -> list[int]:
    """Eq. 6: the value of one dimension at each of ``stages`` stages, from ``start`` to ``final``.

    ``C_0 = start``; ``C_t = min(final, C_{t-1} + round2(rate * C_{t-1}))`` for ``0 < t < N-1``;
    ``C_{N-1} = final``. ``even=True`` rounds the increment to the nearest even number (Eq. 6's
    ⌊·⌋₂, ties up), ``even=False`` to the nearest integer (ties up) for heads and layers. With
    ``stages == 1`` the single stage is ``final``.

    >>> widths(64, 512, 1.0, 4)
    [64, 128, 256, 512]
    """
    start = _as_int("start", start, 1)
    final = _as_int("final", final, 1)
    if start > final:
        raise ValueError(f"start={start}: must be <= final={final} (a schedule only grows)")
    p = _as_rate("rate", rate)
    stages = _as_int("stages", stages, 1)
    out = [start]
    for _ in range(1, stages - 1):
        prev = out[-1]
        step = _round_even(p * prev) if even else _round_half_up(p * prev)
        out.append(min(final, prev + step))
    if stages == 1:
        return [final]
    out.append(final)
    return out


def additive_depths(start: int, final: int, step: int, stages: int) -> list[int]:
    """MIDAS's gradual depth (Saunshi et al., NeurIPS 2024, §2): ``start + t * step`` layers in stage t, the
    last stage the model's ``final``, which must be exactly ``start + (stages - 1) * step`` (ValueError naming
    ``schedule.depth_step`` otherwise; one-stage plans are ``[final]``).

    >>> additive_depths(4, 24, 4, 6)
    [4, 8, 12, 16, 20, 24]
    """
    step = _as_int("schedule.depth_step", step, 1, "null or an integer >= 1 (layers added per stage)")
    if stages == 1:
        return [final]
    reach = start + (stages - 1) * step
    if reach != final:
        fits = Fraction(final - start, step) + 1
        allowed = (f"schedule.stages={fits}" if fits.denominator == 1 and fits >= 2 else
                   "start + (stages - 1) x depth_step = n_layers (start: schedule.start.n_layers, else depth_step)")
        raise ConfigError("schedule.depth_step", step, f"from {start} layers {stages} stages reach {reach}, not the "
                         f"model's n_layers={final}; allowed: {allowed}")
    return [start + t * step for t in range(stages)]


def prop_lengths(total: int, stages: int, power: int) -> list[int]:
    """MIDAS's PROP-alpha stage lengths (Saunshi et al., NeurIPS 2024): stage i = 1..k trains a share
    ``i^alpha / sum_j j^alpha`` of the run, ``floor(total * i^alpha / sum)``; the last stage gets what is left.
    Every stage needs at least 1 (ValueError naming ``schedule.prop_power`` otherwise).

    >>> prop_lengths(100, 4, 1)
    [10, 20, 30, 40]
    >>> prop_lengths(1000, 3, 2)
    [71, 285, 644]
    """
    power = _as_int("schedule.prop_power", power, 0, "null or an integer >= 0 (PROP-alpha's alpha)")
    weights = [i ** power for i in range(1, stages + 1)]
    out = [total * w // sum(weights) for w in weights[:-1]]
    out.append(total - sum(out))
    if min(out) < 1:
        raise ConfigError("schedule.prop_power", power, f"{stages} stages of {total} gives a stage of "
                         f"{min(out)} ({' + '.join(map(str, out))}); raise trainer.max_tokens or use fewer stages")
    return out


def stage_lengths(first: int, rate: float, total: int, stages: int, rounding: str = "floor") -> list[int]:
    """Eq. 7: the length of each stage (tokens, steps or epochs: any integer unit).

    ``T_0 = first``; ``T_t = T_{t-1} + floor(rate * T_{t-1})`` for ``0 < t < N-1`` (``rounding=
    "nearest"``: the increment rounded to the nearest integer, ties up; ``"compound"``: ``T_t =
    floor(first * (1 + rate)^t)``); ``T_{N-1} = total - sum(T_0 .. T_{N-2})``, which must be >= 1
    (ValueError otherwise). ``stages == 1`` gives ``[total]``.

    >>> stage_lengths(8, 0.2, 160, 9)
    [8, 9, 10, 12, 14, 16, 19, 22, 50]
    >>> stage_lengths(8, 0.2, 160, 9, rounding="compound")
    [8, 9, 11, 13, 16, 19, 23, 28, 33]
    """
    first = _as_int("first", first, 1)
    p = _as_rate("rate", rate)
    total = _as_int("total", total, 1)
    stages = _as_int("stages", stages, 1)
    if rounding not in ROUNDINGS:
        raise ValueError(f"rounding={rounding!r}: must be one of {', '.join(ROUNDINGS)}")
    if stages == 1:
        return [total]
    out = _eq7_prefix(first, p, stages, rounding)
    used = sum(out)
    last = total - used
    if last < 1:
        raise ValueError(
            f"total={total}: the first {stages - 1} stages take {used} ({' + '.join(map(str, out))}), "
            f"leaving {last} for the last stage, which needs at least 1; lower first={first} or rate={rate}, "
            f"use fewer stages, or raise total"
        )
    out.append(last)
    return out


def _eq7_prefix(first: int, p: Fraction, stages: int, rounding: str) -> list[int]:
    """T_0 .. T_{N-2} of Eq. 7 (the last stage is what is left)."""
    out = [first]
    for t in range(1, stages - 1):
        prev = out[-1]
        if rounding == "compound":
            out.append(math.floor(first * (1 + p) ** t))
        else:
            inc = math.floor(p * prev) if rounding == "floor" else _round_half_up(p * prev)
            out.append(prev + inc)
    return out


def batch_sizes(base: int, rate: float, stages: int) -> list[int]:
    """Eq. 8 in reverse order: ``B_{N-1} = base``, ``B_{t-1} = B_t + floor(rate * B_t)``.

    >>> batch_sizes(128, 0.5, 4)
    [432, 288, 192, 128]
    """
    base = _as_int("base", base, 1)
    p = _as_rate("rate", rate)
    stages = _as_int("stages", stages, 1)
    out = [base]
    for _ in range(stages - 1):
        out.append(out[-1] + math.floor(p * out[-1]))
    return out[::-1]


# ---- cost accounting (one place) ----------------------------------------------------------------


def training_flops(cfg: TransformerConfig, tokens: int) -> int:
    """Training FLOPs of ``cfg`` over ``tokens`` tokens (strategies' own passes counted apart)."""
    return int(cfg.flops_per_token()) * int(tokens)


def frozen_flops_per_token(cfg: TransformerConfig, trainable, seq_len: int | None = None) -> int:
    """Training FLOPs per token when only the layers ``trainable`` train (``trainer.train_new_only``): the
    full forward, the backward down to the lowest trainable layer only, weight gradients of the trainable
    ones (the terms: docs/costs.md)."""
    layers = sorted({int(n) for n in trainable})
    if not layers:
        return cfg.flops_per_token(seq_len) // 3  # a forward only
    s = cfg.seq_len if seq_len is None else seq_len
    attn, per_layer, head = s * cfg.n_heads * (cfg.d_qk + cfg.d_v), cfg._matmul_layer_params(), cfg.d_model * cfg.vocab_size
    forward = 2 * cfg.matmul_params() + 2 * cfg.n_layers * attn
    through = cfg.n_layers - layers[0]  # layers the activation gradient passes through
    return forward + 2 * head + through * (2 * per_layer + 4 * attn) + len(layers) * 2 * per_layer


# ---- the plan -----------------------------------------------------------------------------------


@dataclass(frozen=True)
class Stage:
    """One stage of a plan: ``cfg`` trains ``steps`` steps of ``batch_size`` sequences, ``tokens`` exactly
    steps x batch_size x seq_len, ``flops`` `training_flops` (or `frozen_flops_per_token`'s)."""

    index: int
    cfg: TransformerConfig
    batch_size: int
    steps: int
    tokens: int
    flops: int
    params: int

    @property
    def tokens_per_step(self) -> int:
        return self.batch_size * self.cfg.seq_len

    @property
    def number(self) -> int:
        """The stage's number as every output shows it: 1 for the first stage (``index`` is 0-based)."""
        return self.index + 1

    def to_dict(self) -> dict:
        return {"stage": self.number, "config": self.cfg.to_dict(), "batch_size": self.batch_size,
                "steps": self.steps, "tokens": self.tokens, "flops": self.flops, "params": self.params}


@dataclass(frozen=True)
class Plan:
    """The stages of a run, like a list of `Stage`; ``schedule`` the normalized node (None: the baseline);
    ``total_tokens`` <= ``max_tokens`` (whole steps)."""

    stages: tuple[Stage, ...]
    final_cfg: TransformerConfig
    max_tokens: int
    schedule: dict | None = None
    name: str = field(default="baseline")

    def __iter__(self):
        return iter(self.stages)

    def __len__(self) -> int:
        return len(self.stages)

    def __getitem__(self, i):
        return self.stages[i]

    @property
    def total_tokens(self) -> int:
        return sum(s.tokens for s in self.stages)

    @property
    def total_steps(self) -> int:
        return sum(s.steps for s in self.stages)

    @property
    def total_flops(self) -> int:
        """Training FLOPs of all stages (growth strategies' own passes not included)."""
        return sum(s.flops for s in self.stages)

    @property
    def baseline_flops(self) -> int:
        """FLOPs of training the final model on the same number of tokens (``total_tokens``)."""
        return training_flops(self.final_cfg, self.total_tokens)

    @property
    def cost_fraction(self) -> float:
        """``total_flops / baseline_flops`` (1.0 for the baseline plan itself)."""
        return self.total_flops / self.baseline_flops

    def start_step(self, index: int) -> int:
        """Optimizer steps of the run before stage ``index`` begins."""
        return sum(s.steps for s in self.stages[:index])

    def start_tokens(self, index: int) -> int:
        """Training tokens of the run before stage ``index`` begins."""
        return sum(s.tokens for s in self.stages[:index])

    def to_dict(self) -> dict:
        return {"name": self.name, "schedule": self.schedule, "max_tokens": self.max_tokens,
                "total_tokens": self.total_tokens, "total_steps": self.total_steps,
                "total_flops": self.total_flops, "baseline_flops": self.baseline_flops,
                "cost_fraction": self.cost_fraction, "stages": [s.to_dict() for s in self.stages]}


@dataclass(frozen=True)
class ScheduleConfig:
    """The ``schedule`` node, typed: each key's default here, its check in `normalize_schedule`; ``start``
    holds ``fraction`` and any explicit stage-0 value; `as_dict` is the node again."""

    name: str = "custom"
    stages: int = 4  # N: stages (N - 1 growths)
    grow: tuple[str, ...] = GROWABLE
    start: dict = field(default_factory=lambda: {"fraction": 0.125})  # stage 0 = round(fraction x final)
    width_rate: float = 1.0  # p_c of Eq. 6
    length_rate: float = 0.5  # p_t of Eq. 7
    first_stage: float = 0.1  # T_0 as a fraction of the run
    rounding: str = "floor"  # of Eq. 7's increments: ROUNDINGS
    batch_rate: float = 0.0  # p_b of Eq. 8
    unit: str = "tokens"  # what Eq. 7 counts: UNITS
    trigger: dict = field(default_factory=lambda: {"name": "fixed"})  # {name, its options}: grow.triggers
    depth_step: int | None = None  # MIDAS's block: layers added per stage (None: Eq. 6)
    prop_power: int | None = None  # MIDAS's PROP-alpha stage lengths (None: Eq. 7)

    @classmethod
    def from_node(cls, node: dict) -> "ScheduleConfig":
        """From the plain ``schedule`` node; ValueError naming the key (``schedule.stages=0: ...``)."""
        s = normalize_schedule(node)
        return cls(**{**s, "grow": tuple(s["grow"]), "start": dict(s["start"]), "trigger": dict(s["trigger"])})

    def as_dict(self) -> dict:
        return {**{f.name: getattr(self, f.name) for f in fields(self)}, "grow": list(self.grow),
                "start": dict(self.start), "trigger": dict(self.trigger)}


def normalize_schedule(schedule: dict) -> dict:
    """Fill `ScheduleConfig`'s defaults into a ``schedule`` node and check the types and ranges of every key.

    Raises ValueError whose message starts with the config key (``schedule.width_rate=-1: ...``).
    Checks that need the model (start values) are made by `build_plan`."""
    if not isinstance(schedule, dict):
        raise ConfigError("schedule", schedule, "must be a mapping of schedule keys (see configs/schedule/exp.yaml)")
    defaults = ScheduleConfig().as_dict()
    unknown = sorted(set(schedule) - set(defaults))
    if unknown:
        raise ConfigError(f"schedule.{unknown[0]}", ..., f"unknown key; allowed: {', '.join(defaults)}")
    s = {**defaults, **schedule}
    s["name"] = str(s["name"])
    s["stages"] = _as_int("schedule.stages", s["stages"], 1, "an integer >= 1 (number of stages)")
    if s["stages"] > 255:
        raise ConfigError("schedule.stages", s['stages'], "must be at most 255 (stage ids are uint8)")

    grow = s["grow"]
    if isinstance(grow, str):
        grow = [grow]
    if not isinstance(grow, (list, tuple)):
        raise ConfigError("schedule.grow", grow, f"must be a list of dimensions from {', '.join(GROWABLE)}")
    for d in grow:
        if d not in GROWABLE:
            raise ConfigError("schedule.grow", list(grow), f"unknown dimension {d!r}; allowed: {', '.join(GROWABLE)}")
    if len(set(grow)) != len(grow):
        raise ConfigError("schedule.grow", list(grow), "a dimension is listed twice")
    s["grow"] = [d for d in GROWABLE if d in grow]  # canonical order

    start = s["start"]
    if start is None:
        start = {}
    if not isinstance(start, dict):
        raise ConfigError("schedule.start", start, "must be a mapping (fraction: ..., or a value per dimension)")
    start = {**defaults["start"], **start}
    for key in start:
        if key != "fraction" and key not in GROWABLE:
            raise ConfigError(f"schedule.start.{key}", ..., f"unknown key; allowed: fraction, {', '.join(GROWABLE)}")
        if key != "fraction" and key not in s["grow"]:
            raise ConfigError(f"schedule.start.{key}", start[key], f"{key} is not in schedule.grow={s['grow']} "
                             f"(a dimension that does not grow stays at the model's value)")
    frac = start["fraction"]
    if isinstance(frac, bool) or not isinstance(frac, (numbers.Real,)) or not 0 < frac <= 1:
        raise ConfigError("schedule.start.fraction", frac, "must be a number in (0, 1] (start = fraction * final)")
    for key in s["grow"]:
        if key in start and start[key] is not None:
            start[key] = _as_int(f"schedule.start.{key}", start[key], 1, "an integer >= 1")
    s["start"] = start

    for key in ("width_rate", "length_rate", "batch_rate"):
        _as_rate(f"schedule.{key}", s[key])
    fs = s["first_stage"]
    if isinstance(fs, bool) or not isinstance(fs, numbers.Real) or not 0 < fs < 1:
        raise ConfigError("schedule.first_stage", fs, "must be a fraction in (0, 1) of the run's length "
                         "(trainer.max_tokens, in schedule.unit)")
    if s["rounding"] not in ROUNDINGS:
        raise ConfigError("schedule.rounding", s['rounding'], f"must be one of {', '.join(ROUNDINGS)}")
    if s["unit"] not in UNITS:
        raise ConfigError("schedule.unit", s['unit'], f"must be one of {', '.join(UNITS)}")
    if s["depth_step"] is not None:
        s["depth_step"] = _as_int("schedule.depth_step", s["depth_step"], 1,
                                  "null or an integer >= 1 (layers added per stage)")
        if "n_layers" not in s["grow"]:
            raise ConfigError("schedule.depth_step", s['depth_step'], f"n_layers is not in schedule.grow={s['grow']}; "
                             "allowed: null, or add n_layers to schedule.grow")
    if s["prop_power"] is not None:
        s["prop_power"] = _as_int("schedule.prop_power", s["prop_power"], 0,
                                  "null or an integer >= 0 (PROP-alpha's alpha)")
    trigger = s["trigger"] if s["trigger"] is not None else {"name": "fixed"}
    if not isinstance(trigger, dict):
        raise ConfigError("schedule.trigger", trigger, "must be a mapping (name: a trigger of configs/schedule/trigger/, and "
                          "its options)")

    s["trigger"] = triggers.checked(trigger)
    if s["unit"] == "steps" and _as_rate("schedule.batch_rate", s["batch_rate"]) != 0:
        raise ValueError(f"schedule.unit=steps: needs schedule.batch_rate=0 (got {s['batch_rate']!r}); steps of "
                         f"different batch sizes hold different token counts, use unit: tokens")
    return s


def _start_value(dim: str, final: int, fraction) -> int:
    """Default stage-0 value: round(fraction * final), even for widths (>= 2), >= 1 for counts, <= final."""
    x = Fraction(str(fraction)) * final
    v = max(2, _round_even(x)) if dim in EVEN_DIMS else max(1, _round_half_up(x))
    return min(v, final)


def _whole_groups(model_cfg: TransformerConfig, heads: list[int]) -> list[int]:
    """Under grouped-query attention (``n_kv_heads`` = G fixed) every stage's head count rounded to a
    multiple of G (half up, at least G): heads grow within their groups (docs/model.md, "Heads under grouped-query attention")."""
    if model_cfg.n_kv_heads is None:
        return heads
    G = model_cfg.kv_heads
    return [max(G, G * _round_half_up(Fraction(e, G))) for e in heads]


def _eq7_lengths(sch: dict, total: int, n: int, max_tokens: int) -> list[int]:
    """Eq. 7's stage lengths of a run of ``total`` (in ``schedule.unit``), ``T_0`` from ``first_stage``;
    ValueErrors naming the key whose value leaves a stage empty."""
    unit = sch["unit"]
    first = math.floor(Fraction(str(sch["first_stage"])) * total) if n > 1 else total
    if first < 1:
        raise ConfigError("schedule.first_stage", sch['first_stage'], f"gives an empty first stage "
                         f"(floor({sch['first_stage']} x {total} {unit}) = 0); raise it or trainer.max_tokens")
    if n > 1:
        prefix = _eq7_prefix(first, _as_rate("schedule.length_rate", sch["length_rate"]), n, sch["rounding"])
        if sum(prefix) >= total:
            raise ConfigError(
                "schedule.length_rate", sch['length_rate'], f"with schedule.first_stage={sch['first_stage']} "
                f"(T_0 = {first} {unit}) the first {n - 1} stages take {sum(prefix)} {unit} "
                f"({' + '.join(map(str, prefix))}) of the run's {total} (trainer.max_tokens={max_tokens}), leaving "
                f"{total - sum(prefix)} for the last stage; lower schedule.first_stage or schedule.length_rate, "
                f"use fewer schedule.stages, or raise trainer.max_tokens"
            )
    return stage_lengths(first, sch["length_rate"], total, n, sch["rounding"])


def _check_every_growth_grows(sch: dict, dims: dict[str, list[int]], cfgs: list[TransformerConfig]) -> None:
    """Refuse a plan with a growth that grows nothing (a stage the size of the one before): it would train a
    fixed-size model under a growth strategy's name. One line naming the start and final sizes."""
    same = [t for t in range(1, len(cfgs)) if cfgs[t] == cfgs[t - 1]]
    if not same:
        return
    sizes = ", ".join(f"{d} {dims[d][0]} -> {dims[d][-1]}" for d in sch["grow"])
    if cfgs[0] == cfgs[-1]:  # nothing grows at all: the start is the final size
        explicit = [d for d in sch["grow"] if sch["start"].get(d) is not None]
        key = f"schedule.start.{explicit[0]}" if explicit else "schedule.start.fraction"
        value = sch["start"][explicit[0]] if explicit else sch["start"]["fraction"]
        raise ConfigError(key, value, f"the schedule grows nothing (start -> final: {sizes}); allowed: a start below "
                                      f"the model's final size in some dimension of schedule.grow, or no schedule "
                                      f"(a fixed-size run)")
    t, n = same[0], len(cfgs)  # stage t (0-based) repeats stage t - 1; stages are numbered from 1 for the user
    if all(c == cfgs[-1] for c in cfgs[t - 1:]):  # the final model reached early, the stages after it idle
        raise ConfigError("schedule.stages", sch["stages"], f"from the start to the final sizes ({sizes}) the schedule "
                                                            f"reaches the final model at stage {t}, so the {n - t} "
                                                            f"stage(s) after it would grow nothing: schedule.stages={t}")
    path = ", ".join(f"{d} {dims[d]}" for d in sch["grow"])
    raise ConfigError("schedule.stages", sch["stages"], f"the growth into stage {t + 1} grows nothing (stage {t + 1} "
                                                        f"has stage {t}'s sizes: {path}; start -> final: {sizes}); "
                                                        f"allowed: fewer stages, a higher schedule.width_rate, or a "
                                                        f"smaller start")


def build_plan(model_cfg: TransformerConfig, schedule: ScheduleConfig | dict | None, *, max_tokens: int,
               batch_size: int) -> Plan:
    """The stage plan of a run: ``model_cfg`` the final model, ``schedule`` a `ScheduleConfig` or the plain
    node (None: the fixed-size baseline), ``max_tokens`` and ``batch_size`` (the last stage's) the trainer's.

    Sizes follow `widths` (or `additive_depths`), lengths `stage_lengths` (or `prop_lengths`), batches
    `batch_sizes`; tokens are spent in whole steps, the last stage absorbing the rounding, so a plan never
    exceeds ``max_tokens`` (docs/design.md, "Schedules (Yuan et al., Eq. 6–8) and the stage plan").
    One-line ValueErrors start with the config key (``schedule.start.d_model=600: ...``)."""
    if not isinstance(model_cfg, TransformerConfig):
        raise ValueError(f"model_cfg={model_cfg!r}: must be a TransformerConfig")
    max_tokens = _as_int("trainer.max_tokens", max_tokens, 1, "a positive integer (tokens)")
    batch_size = _as_int("trainer.batch_size", batch_size, 1, "a positive integer (sequences per step)")
    s_len = model_cfg.seq_len
    base_step = batch_size * s_len

    def make(index: int, cfg: TransformerConfig, bs: int, steps: int) -> Stage:
        tokens = steps * bs * cfg.seq_len
        return Stage(index, cfg, bs, steps, tokens, training_flops(cfg, tokens), cfg.num_params())

    if schedule is None:
        steps = max_tokens // base_step
        if steps < 1:
            raise ConfigError("trainer.max_tokens", max_tokens, f"less than one step of trainer.batch_size x seq_len "
                             f"= {batch_size} x {s_len} = {base_step} tokens")
        return Plan((make(0, model_cfg, batch_size, steps),), model_cfg, max_tokens, None, "baseline")

    sch = schedule.as_dict() if isinstance(schedule, ScheduleConfig) else normalize_schedule(schedule)
    n = sch["stages"]

    # architecture (Eq. 6)
    dims: dict[str, list[int]] = {}
    for dim in GROWABLE:
        final = getattr(model_cfg, dim)
        if dim not in sch["grow"]:
            dims[dim] = [final] * n
            continue
        explicit = sch["start"].get(dim)
        if explicit is not None:
            if explicit > final:
                raise ConfigError(f"schedule.start.{dim}", explicit, f"must be <= the model's final {dim}={final} "
                                 f"(a schedule only grows)")
            start = explicit
        else:
            start = _start_value(dim, final, sch["start"]["fraction"])
        if dim == "n_layers" and sch["depth_step"] is not None:
            dims[dim] = additive_depths(sch["depth_step"] if explicit is None else start, final, sch["depth_step"], n)
        else:
            dims[dim] = widths(start, final, sch["width_rate"], n, even=dim in EVEN_DIMS)
    dims["n_heads"] = _whole_groups(model_cfg, dims["n_heads"])
    # a token's experts never outnumber the layer's: a dense stage (n_experts 1) routes to 1 (docs/model.md, "Experts")
    dims["top_k"] = [min(k, x) for k, x in zip(dims["top_k"], dims["n_experts"])]
    # a rotary model keeps one frequency table in every stage, anchored at the final head size (docs/model.md, "k under rotary positions")
    anchor = {"rope_dim": model_cfg.rope_anchor} if model_cfg.positions == "rope" else {}
    cfgs = [model_cfg.replace(**{d: dims[d][t] for d in GROWABLE}, **anchor) for t in range(n)]
    _check_every_growth_grows(sch, dims, cfgs)

    # batch sizes (Eq. 8)
    batches = batch_sizes(batch_size, sch["batch_rate"], n)

    # lengths (Eq. 7)
    total = max_tokens if sch["unit"] == "tokens" else max_tokens // base_step
    unit = sch["unit"]
    if total < 1:
        raise ConfigError("trainer.max_tokens", max_tokens, f"less than one step of trainer.batch_size x seq_len "
                         f"= {base_step} tokens")
    lengths = (prop_lengths(total, n, sch["prop_power"]) if sch["prop_power"] is not None
               else _eq7_lengths(sch, total, n, max_tokens))

    stages: list[Stage] = []
    if unit == "steps":
        for t in range(n):
            stages.append(make(t, cfgs[t], batches[t], lengths[t]))
    else:
        used = 0
        for t in range(n):
            per_step = batches[t] * s_len
            if t < n - 1:
                steps = _round_half_up(Fraction(lengths[t], per_step))
                if steps < 1:
                    key = "prop_power" if sch["prop_power"] is not None else "first_stage"
                    raise ConfigError(
                        f"schedule.{key}", sch[key], f"stage {t + 1} gets {lengths[t]} tokens, less than "
                        f"half a step of {batches[t]} x {s_len} = {per_step} tokens; raise trainer.max_tokens, "
                        f"{'use fewer schedule.stages' if key == 'prop_power' else 'raise schedule.first_stage'} "
                        f"or lower trainer.batch_size"
                    )
            else:
                steps = (max_tokens - used) // per_step
                if steps < 1:
                    raise ConfigError(
                        "trainer.max_tokens", max_tokens, f"the last stage gets {max_tokens - used} tokens, less than "
                        f"one step of {batches[t]} x {s_len} = {per_step} tokens; raise trainer.max_tokens or lower "
                        f"schedule.first_stage / schedule.length_rate"
                    )
            st = make(t, cfgs[t], batches[t], steps)
            used += st.tokens
            stages.append(st)
    return Plan(tuple(stages), model_cfg, max_tokens, sch, sch["name"])


# ---- console -----------------------------------------------------------------------------------


def format_plan(plan: Plan):
    """A rich Table of the plan: per stage (numbered from 1) the six dimensions (the letters of
    Gesmundo & Maile, explained in the caption; a grown one in bold), params, batch, steps, tokens,
    FLOPs and share of the total; the footer has the totals and the caption the cost as % of training
    the final model on the same tokens."""
    from rich.table import Table

    title = f"stage plan: {plan.name}" if plan.schedule is not None else "stage plan: fixed-size baseline"
    pct = 100.0 * plan.cost_fraction
    table = Table(title=title, show_footer=True,
                  caption=(f"total {fmt_num(plan.total_flops)} FLOPs = {pct:.1f}% of training the final model on the "
                           f"same {fmt_num(plan.total_tokens)} tokens ({fmt_num(plan.baseline_flops)} FLOPs)\n"
                           f"{LEGEND}; bold: grown at the start of the stage"))
    table.add_column("stage", footer="total", justify="right")
    for head in DIM_LETTERS.values():
        table.add_column(head, justify="right")
    experts = any(st.cfg.moe for st in plan)  # a mixture of experts: X, top_k and the active parameters too
    if experts:
        for head in ("X", "top_k"):
            table.add_column(head, justify="right")
    table.add_column("params", justify="right")
    if experts:
        table.add_column("active", justify="right")
    table.add_column("batch", justify="right")
    table.add_column("steps", footer=str(plan.total_steps), justify="right")
    table.add_column("tokens", footer=fmt_num(plan.total_tokens), justify="right")
    table.add_column("FLOPs", footer=fmt_num(plan.total_flops), justify="right")
    table.add_column("% FLOPs", footer=f"{pct:.1f}% of baseline", justify="right")
    prev = None
    for st in plan:
        cells = [str(st.number)]
        for dim in DIM_LETTERS:
            v = getattr(st.cfg, dim)
            grown = prev is not None and getattr(prev, dim) != v
            cells.append(f"[bold]{v}[/bold]" if grown else str(v))
        if experts:
            cells += [f"[bold]{getattr(st.cfg, f)}[/bold]" if prev is not None and getattr(prev, f) != getattr(st.cfg, f)
                      else str(getattr(st.cfg, f)) for f in ("n_experts", "top_k")]
        cells += [fmt_num(st.params)] + ([fmt_num(st.cfg.active_params())] if experts else [])
        cells += [str(st.batch_size), str(st.steps), fmt_num(st.tokens), fmt_num(st.flops),
                  f"{100.0 * st.flops / max(plan.total_flops, 1):.1f}%"]
        table.add_row(*cells)
        prev = st.cfg
    return table
