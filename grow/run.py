"""The assembly of a run: a composed config checked whole, and its plan, strategy and trigger built once.

`load` turns Hydra's composed config into a `Run`: the schema's sections (`grow.config`) with the
model's, the data's, the strategy's, the schedule's and the trigger's own checks, then the stage
plan, the strategy and the trigger, each built here once and handed on: the trainer, ``grow
schedule``, ``grow compare`` and `grow.parallel.fsdp.check` read them from the `Run` and build none of their
own (docs/design.md, "Architecture", "The run config").
"""

from __future__ import annotations

import dataclasses
import functools
import json
from contextlib import contextmanager
from dataclasses import dataclass, field, fields

from omegaconf import DictConfig, OmegaConf

from grow import (
    branches,
    checkpoint,
    kernels,
    slurm,  # noqa: F401 - registers the launcher's grow_slurm_gpus resolver
)
from grow.config import RunConfig
from grow.data import DataConfig
from grow.errors import ConfigError
from grow.fsdp_growth import cost, sharded
from grow.growth.base import DIMS, Strategy, get_strategy
from grow.growth.expand import layer_positions
from grow.hf import pretrained
from grow.model import TransformerConfig
from grow.parallel import fsdp
from grow.plan import Plan, ScheduleConfig, build_plan, frozen_flops_per_token
from grow.suggest import check_section_keys
from grow.triggers import Trigger
from grow.triggers import build as build_trigger


@dataclass(frozen=True)
class Run(RunConfig):
    """A validated run with what it is made of, built once: the stage plan, the strategy (the one that
    grows the model and whose training hooks run) and the trigger. Equal when the configs are."""

    plan: Plan = field(compare=False, repr=False)
    growth_strategy: Strategy = field(compare=False, repr=False)
    trigger: Trigger = field(compare=False, repr=False)

    def changed(self, **changes) -> "Run":
        """`RunConfig.replace`, assembled (checked, its plan, strategy and trigger built) anew (named apart from
        the dataclasses' ``replace``, which builds nothing)."""
        return assemble(RunConfig.replace(self, **changes))

    @functools.cached_property
    def resumed(self) -> "checkpoint.Resume | None":
        """The resume ``resume=`` names, resolved once for the run (`checkpoint.Resume`; ``latest`` keeps
        meaning the run it meant at validation), or None."""
        return checkpoint.Resume.of(self.resume)

    def strategy_warnings(self) -> list[str]:
        """One line when growths of the plan grow none of the dimensions the strategy grows by its
        own rule (`grow.growth.base.Strategy.own_dims`): there the run is its delegate's (svd with
        ``schedule.grow=[n_layers]`` is zero's run). Warned, not refused: a sweep over
        ``schedule.grow`` (make sweep EXP=dims) runs such arms on purpose."""
        if not self.grows:
            return []
        strategy, plan = self.growth_strategy, self.plan
        own = set(strategy.own_dims)
        idle, grown_there, growths = [], [], 0
        for before, after in zip(plan, list(plan)[1:]):
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


# ---- from the composed config to a run -------------------------------------------------------------

_handed: dict[str, Run] | None = None  # runs the precheck validated, for the job to take (`handing_over`)


@contextmanager
def handing_over():
    """Within: a run `validate` assembles is kept for the `load` of the same config (the precheck's
    validation and the job's in one `grow` command build each plan, strategy and trigger once)."""
    global _handed
    _handed = {}
    try:
        yield
    finally:
        _handed = None


def _key(raw: dict) -> str:
    return json.dumps(raw, sort_keys=True, default=str)


def validate(cfg: DictConfig) -> TransformerConfig:
    """Validate a composed run config (train or compare); returns the final model config."""
    run = load(cfg)
    if _handed is not None:
        _handed[_key(run.raw)] = run
    return run.model


def load(cfg: DictConfig) -> Run:
    """Validate a composed ``train`` (or compare arm) config and assemble its run: each section checked once, by
    the class that defines its keys (docs/design.md, "The run config"), then the checks across them (`assemble`)."""
    pretrained.prepare(cfg)  # init=<LlamaForCausalLM dir>: its tokenizer, before data.vocab_size resolves
    try:
        OmegaConf.resolve(cfg)
    except Exception as exc:  # noqa: BLE001 - an interpolation error becomes one line
        raise ConfigError("config", ..., f"cannot resolve: {str(exc).splitlines()[0]}") from None
    raw = OmegaConf.to_container(cfg, resolve=True)
    if _handed is not None and _key(raw) in _handed:
        return _handed.pop(_key(raw))
    check_section_keys(cfg)  # an unknown key anywhere, with the nearest of the whole config
    config = RunConfig.from_node(
        cfg, raw, model=TransformerConfig.from_node(raw["model"]),
        data=DataConfig.from_node(cfg.data),  # every data.* key is defined and checked in grow/data/config.py
        schedule=ScheduleConfig.from_node(raw["schedule"]) if raw.get("schedule") is not None else None)
    start = pretrained.pretrained_dir(config.init)
    if start is not None:  # the checkpoint's sizes as stage 0, its vocabulary, epsilon, rotary base
        config = pretrained.started(start, config)
    return assemble(config)


def assemble(config: RunConfig) -> Run:
    """The run of a checked ``config``: its strategy, trigger and plan built once, and the checks across
    them (the strategy can make every growth, the trigger can run on the plan, the resume fits)."""
    strategy = get_strategy({"name": config.strategy.name, **config.strategy.options})
    trigger = build_trigger(config.schedule.trigger if config.grows else None)
    plan = build_plan(config.model, config.schedule, max_tokens=config.trainer.max_tokens,
                      batch_size=config.trainer.batch_size)
    if config.trainer.train_new_only and config.grows:
        plan = _frozen_costs(strategy, plan)
    values = {f.name: getattr(config, f.name) for f in fields(RunConfig)}
    run = Run(**values, plan=plan, growth_strategy=strategy, trigger=trigger)
    _check_mup_strategy(run)
    if run.grows:  # the components check themselves on the whole run
        trigger.check(run)
        _check_growths(run)
        strategy.check(run)
        cost.check_host(run)
        sharded.check(run)
    fsdp.check(run)
    kernels.check(run)
    branches.check(run)
    _check_resume(run)
    return run


# ---- the checks across components ------------------------------------------------------------------


def _new_layers(strategy: Strategy, before, after) -> list[int]:
    n_old, n_new = before.cfg.n_layers, after.cfg.n_layers
    try:  # a depth the strategy cannot reach is the strategy's error, worded as _check_growths words it
        where = strategy.layer_positions(before.cfg, after.cfg)
    except ValueError as exc:
        raise ConfigError("strategy", strategy.name, f"growth into stage {after.number}: {exc}") from None
    return layer_positions(n_old, n_new, where)


def _frozen_costs(strategy: Strategy, plan: Plan) -> Plan:
    """``trainer.train_new_only``: every stage after a growth costs `grow.plan.frozen_flops_per_token` of the
    layers born at that growth (the others frozen); a growth that adds no layer would train nothing."""
    stages = [plan[0]]
    for before, after in zip(plan, list(plan)[1:]):
        born = _new_layers(strategy, before, after) if after.cfg.n_layers > before.cfg.n_layers else []
        if not born:
            raise ConfigError("trainer.train_new_only", True, f"the growth into stage {after.number} adds no layer, so "
                              "no parameter would train; allowed: false, or a schedule whose every growth grows "
                              "n_layers")
        stages.append(dataclasses.replace(after, flops=frozen_flops_per_token(after.cfg, born) * after.tokens))
    return dataclasses.replace(plan, stages=tuple(stages))


def _check_mup_strategy(run: Run) -> None:
    """mup with a strategy that brings its own parameterization (vt's Table 1 and Eq. 5, also as svd's or
    another's base) is refused: the two would have to compose (vt's initialize replaces mup's stage-0 init,
    its growth multipliers stack on mup's 1/m rates), and they do not (docs/strategies.md, "vt")."""
    if run.model.parametrization != "mup" or not (run.grows or run.init_by_strategy):
        return
    own = run.growth_strategy.parameterization()
    if own is not None:
        raise ConfigError("model.parametrization", "mup", f"standard with strategy={run.strategy.name} (its {own} "
                          "parameterization does not compose with mup's); allowed under mup: a strategy that "
                          "keeps the model's initializer (zero, msg, stack, ...)")


def _check_growths(run: Run) -> None:
    """What every strategy's growths need: each growth of the plan is one the strategy can make (its
    `check_transition`: vt's even numbers of new units, say), new layers have a place, and the growth
    batches it trains on (`batches_needed`) are there."""
    strategy, plan = run.growth_strategy, run.plan
    for before, after in zip(plan, list(plan)[1:]):
        try:
            strategy.check_transition(before.cfg, after.cfg)
        except ValueError as exc:
            raise ConfigError("strategy", run.strategy.name, f"growth into stage {after.index + 1}: {exc}") from None
    need = strategy.batches_needed()
    if run.trainer.growth_batches < need:
        raise ConfigError("trainer.growth_batches", run.trainer.growth_batches,
                          f"must be >= {need}: strategy {run.strategy.name} trains on the growth batches")
    for before, after in zip(plan, list(plan)[1:]):
        n_old, n_new = before.cfg.n_layers, after.cfg.n_layers
        where = strategy.layer_positions(before.cfg, after.cfg)
        if n_new > n_old or not isinstance(where, list):
            try:
                layer_positions(n_old, max(n_new, n_old + 1), where, key=f"strategy.{strategy.layer_position_key}")
            except ConfigError as exc:
                raise ConfigError(exc.key, exc.value, f"{exc.allowed} (growth into stage {after.index + 1})") from None


def _check_resume(run: Run) -> None:
    """``resume=<run dir>|latest``: the run has a complete checkpoint of the same model and schedule."""
    if run.resume is None:
        return
    if run.raw.get("compare") is not None:
        raise ConfigError("resume", run.resume, "grow compare does not resume (rerun it with the same "
                                                "hydra.sweep.dir: finished arms are skipped); resume one arm "
                                                "with grow train resume=<arm dir>")
    meta = run.resumed.manifest()
    checkpoint.verify(meta, full=True)
    checkpoint.check_compatible(meta, run.model, run.plan, str(run.optim.name))

