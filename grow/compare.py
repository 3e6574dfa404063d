"""``grow compare``: the arms of a comparison and their cost accounting (docs/statistics.md).

A Hydra sweep whose jobs each derive one arm (grown, ``baseline``, the matched baseline
``init=strategy``, ``equal_flops``) from the composed config by `grow.run.Run.changed` (`arm_run`), train
it in its own claimed directory (`claim`: a ``flock``) unless complete, and record ``arm.json``;
`ReportCallback` writes the sweep's report after the last job.
"""

from __future__ import annotations

import dataclasses
import json
import os
import re
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path

from omegaconf import DictConfig, OmegaConf

from grow import checkpoint
from grow import console as ui
from grow.checkpoint import exclusive
from grow.config import CONFIG_DIR, ConfigError, StrategyConfig
from grow.errors import NonFiniteLoss, options
from grow.growth import grow
from grow.hf.pretrained import pretrained_dir
from grow.model import Transformer, TransformerConfig
from grow.plan import GROWABLE, training_flops
from grow.report import build_report, short_key
from grow.run import Run
from grow.run import load as load_run
from grow.runs import is_complete
from grow.train import train

try:  # the callback base class (Hydra >= 1.1); a plain object otherwise
    from hydra.experimental.callback import Callback
except ImportError:  # pragma: no cover
    Callback = object


PSEUDO_STRATEGIES = ("baseline", "equal_flops")


# ---- arms ---------------------------------------------------------------------------------------


def _parse_overrides(texts: list[str]):
    from hydra.core.override_parser.overrides_parser import OverridesParser

    return OverridesParser.create().parse_overrides(list(texts))


def _affects_baseline(key: str) -> bool:
    """Does a swept key change the fixed-size baseline? (schedule and strategy keys do not)."""
    return not (key in ("schedule", "strategy") or key.startswith(("schedule.", "strategy.", "schedule/")))


def arm_setting(task_overrides: list[str], vary: list[str]) -> dict[str, str]:
    """The values of the swept keys ``vary`` in one job's overrides, e.g. {'schedule.width_rate': '0.5'}."""
    found = {}
    for o in _parse_overrides([t for t in task_overrides if not t.startswith("hydra")]):
        if o.key_or_group in vary:
            found[o.key_or_group] = o.get_value_element_as_str()
    return {k: found[k] for k in vary if k in found}


def arm_label(kind: str, strategy: str | None, setting: dict[str, str], tag: str | None = None) -> str:
    """The arm's name in the report: the strategy (or baseline, equal_flops), ``tag`` (a matched
    baseline's ``init=<parameterization>``, an equal-FLOPs arm's ``size=s<stage>``) and the swept
    values it depends on."""
    if kind in ("baseline", "matched"):
        keep = {k: v for k, v in setting.items() if _affects_baseline(k)}
    elif kind == "equal_flops":
        keep = {k: v for k, v in setting.items() if not (k == "strategy" or k.startswith("strategy."))}
    else:
        keep = setting
    name = {"grown": strategy, "matched": "baseline"}.get(kind, kind)
    return " ".join([name, *([tag] if tag else []), *(f"{short_key(k)}={v}" for k, v in keep.items())])


def arm_dirname(label: str, seed: int) -> str:
    """A file-name-safe directory for an arm and a seed: 'svd width_rate=0.5' -> 'svd_width_rate=0.5-seed0'."""
    slug = label.replace(" ", "_").replace(",", "+").replace("/", "-")
    slug = re.sub(r"[^A-Za-z0-9._=+-]", "", slug)
    return f"{slug}-seed{seed}"


def default_strategy() -> dict:
    """The strategy node `grow train` composes by default (train.yaml's defaults list)."""
    defaults = OmegaConf.to_container(OmegaConf.load(CONFIG_DIR / "train.yaml").defaults)
    name = next(d["strategy"] for d in defaults if isinstance(d, dict) and "strategy" in d)
    return OmegaConf.to_container(OmegaConf.load(CONFIG_DIR / "strategy" / f"{name}.yaml"))


def arm_options(compare: DictConfig) -> dict[str, dict]:
    """``compare.options``: per strategy, the options only its arms take (``{ligo: {steps: 10}}``); each name must be
    a strategy and each value a mapping (the keys are the strategy's to check, `base_run`)."""
    node = compare.get("options")
    if node is not None and not isinstance(node, DictConfig):
        raise ConfigError("compare.options", node, "a mapping of strategies to their options, e.g. {ligo: {steps: 10}}")
    given = OmegaConf.to_container(node, resolve=True) if node is not None else {}
    strategies = options("strategy")
    for name, value in given.items():
        if name not in strategies:
            raise ConfigError(f"compare.options.{name}", value, f"not a strategy; allowed: {', '.join(strategies)}")
        if not isinstance(value, dict):
            raise ConfigError(f"compare.options.{name}", value,
                              f"a mapping of strategy {name}'s options, e.g. compare.options.{name}.<key>=<value>")
    return given


def base_run(cfg: DictConfig) -> Run:
    """The `grow train` run of one compare job, validated once: the composed compare config without its
    ``compare`` and ``report`` keys, its strategy's `arm_options` over the strategy's (and `grow train`'s default
    strategy in a baseline or equal-FLOPs job, whose arms train none). Every arm of the job derives from it
    (`arm_run`)."""
    d = OmegaConf.to_container(cfg, resolve=False)
    for key in ("compare", "report"):
        d.pop(key, None)
    name = str(cfg.strategy.name)
    own = arm_options(cfg.compare).get(name, {})
    if name in PSEUDO_STRATEGIES:
        d["strategy"] = default_strategy()
    d["strategy"].update(own)
    try:
        return load_run(OmegaConf.create(d))
    except ConfigError as exc:  # an option compare.options gave: named as the command line named it
        key = exc.key.removeprefix("strategy.")
        if exc.key.startswith("strategy.") and key in own:
            raise ConfigError(f"compare.options.{name}.{key}", exc.value, exc.allowed) from None
        raise


def equal_flops_budget(base: Run) -> float:
    """The FLOPs the equal-FLOPs arms get: the grown arms' stage plan's, known before any arm runs.
    Only the ``fixed`` trigger trains that plan: any other moves the growths at run time (periodic,
    plateau, ...), so the grown arm's FLOPs differ from the plan's (1.47x on tiny with periodic) and the
    arms would not be at equal compute: refused in one line (the precheck calls this on every job)."""
    trigger = base.schedule.trigger["name"] if base.schedule is not None else "fixed"
    if trigger != "fixed":
        raise ConfigError("schedule.trigger.name", trigger, "compare.equal_flops=true gives its arms the stage plan's "
                          "FLOPs, which only trigger fixed trains; allowed: fixed, or compare.equal_flops=false")
    return base.plan.total_flops


def equal_flops_tokens(base: Run, size=None) -> int:
    """Tokens a fixed-size model (``size``, a `TransformerConfig`; default the final model) trains on
    to spend the grown arms' plan FLOPs (whole steps of trainer.batch_size, rounded down).

    ``base`` is the job's run (`base_run`, with its schedule). The growth passes' FLOPs are not in the
    budget (they are known only after a run; 0 for zero, random, net2net and vt)."""
    size = size or base.model
    budget = equal_flops_budget(base)
    per_step = base.trainer.batch_size * size.seq_len
    steps = budget // training_flops(size, per_step)
    if steps < 1:
        raise ConfigError("compare.equal_flops", True, f"the grown arms' plan ({budget:.3g} FLOPs) is less than one "
                          f"step of the final model; raise trainer.max_tokens")
    return int(steps * per_step)


def equal_flops_sizes(base: Run, which: str) -> list:
    """The fixed sizes of the equal-FLOPs arms: (stage number, `TransformerConfig`) of the final model
    (``compare.equal_flops_sizes: final``) or of every stage of the grown arms' plan (``stages``)."""
    plan = base.plan
    stages = list(plan) if which == "stages" else [plan[len(plan) - 1]]
    return [(s.number, s.cfg) for s in stages]


def arm_run(base: Run, kind: str, *, group: str, name: str, size=None) -> Run:
    """The `grow train` run of one arm, derived from the job's validated run ``base`` with
    `Run.changed` (typed fields and the config file alike; the arm assembled anew).

    ``grown`` is ``base``; ``baseline`` drops the schedule and takes `grow train`'s default strategy
    (unused without a schedule); ``matched`` drops the schedule and keeps the strategy with
    ``init=strategy`` (the final model in the strategy's parameterization); ``equal_flops`` is the model
    ``size`` (a stage's config, rotary table included: anchored at the final k as in the grown run, not
    plain RoPE at the stage's own k; the final model by default) with trainer.max_tokens =
    `equal_flops_tokens`. The W&B group is ``logger.group`` or ``group`` (the sweep's name), the run
    name the arm's label."""
    changes: dict = {"logger": dataclasses.replace(base.logger, group=base.logger.group or group, name=name)}
    if kind != "grown":
        changes["schedule"] = None
    if kind in ("baseline", "equal_flops"):
        changes["strategy"] = StrategyConfig.from_node(default_strategy())
        if pretrained_dir(base.init) is not None:  # from scratch: a checkpoint's model and tokenizer, not its weights
            changes["init"] = "auto"
    if kind == "matched":
        changes["init"] = "strategy"
    if kind == "equal_flops":
        changes["trainer"] = dataclasses.replace(base.trainer, max_tokens=equal_flops_tokens(base, size))
        if size is not None:  # the stage's model as the grown run has it: its rotary table anchored at the final k
            anchor = {"rope_dim": size.rope_dim} if size.rope_anchor != size.d_qk else {}
            changes["model"] = base.model.replace(**{dim: getattr(size, dim) for dim in GROWABLE}, **anchor)
    return base.changed(**changes)


@dataclass
class Arm:
    """One arm a job trains: its kind (grown | baseline | matched | equal_flops), label, `grow train`
    config, and what arm.json says of it besides the common fields."""

    kind: str
    label: str
    run: Run
    info: dict


def job_arms(cfg: DictConfig, hydra_cfg) -> list[Arm]:
    """The arms of one job: a grown arm and, with compare.matched_baseline, the baseline in its
    strategy's parameterization (when that is not the model's own); the baseline; or the
    equal-FLOPs fixed sizes."""
    strategy = str(cfg.strategy.name)
    kind = strategy if strategy in PSEUDO_STRATEGIES else "grown"
    setting = arm_setting(list(hydra_cfg.overrides.task), list(cfg.compare.vary or []))
    group = Path(str(hydra_cfg.sweep.dir)).name
    common = {"setting": setting, "baseline_arm": arm_label("baseline", None, setting)}
    base = base_run(cfg)

    def arm(kind, label, info=None, size=None):
        return Arm(kind, label, arm_run(base, kind, group=group, name=label, size=size), {**common, **(info or {})})

    if kind == "equal_flops":
        sizes = equal_flops_sizes(base, str(cfg.compare.equal_flops_sizes))
        budget = equal_flops_budget(base)
        return [arm("equal_flops", arm_label("equal_flops", None, setting, None if n == sizes[-1][0] or len(sizes) == 1
                                             else f"size=s{n}"), {"size": n, "budget_flops": budget}, size)
                for n, size in sizes]
    if kind == "baseline":
        return [arm("baseline", arm_label("baseline", None, setting))]

    param = base.growth_strategy.parameterization()
    arms = [arm("grown", arm_label("grown", strategy, setting), {"strategy": strategy, "parameterization": param})]
    if param and cfg.compare.get("matched_baseline", False):
        arms.append(arm("matched", arm_label("matched", None, setting, f"init={param}"), {"parameterization": param}))
    return arms


def has_checkpoint(arm_dir: Path) -> bool:
    """Whether an unfinished arm left a checkpoint to resume from (`grow.checkpoint`)."""
    return bool(checkpoint.list_checkpoints(Path(arm_dir)))


@contextmanager
def claim(arm_dir: Path, invocation: str | None = None):
    """Yields True when this process may train the arm: it holds an exclusive ``flock`` on
    ``<arm dir>/.lock``, which the kernel releases when the process ends (SIGKILL included), so a
    lock is never left behind. Any number of jobs and ``grow compare`` invocations may work on one
    sweep directory at once (two processes on a two-core machine, a cluster's array): an arm is
    trained by one of them, the others skip it. ``invocation`` is kept for the command line's id."""
    with exclusive(Path(arm_dir)) as mine:
        yield mine


_WARMED_UP = False


def warm_up() -> None:
    """One tiny growth, once per process, before any arm is timed.

    The first growth of a process pays one-time lazy imports (building the grown model on the meta
    device imports torch's reference ops and sympy: seconds on a CPU); without this they would land
    in the ``train_seconds`` of whichever grown arm runs first in the process."""
    global _WARMED_UP
    if _WARMED_UP:
        return
    import torch


    small = TransformerConfig(vocab_size=8, seq_len=4, n_layers=1, d_model=2, n_heads=1, d_qk=2, d_v=2, d_ff=2)
    grow(Transformer(small), small.replace(n_layers=2, d_model=4, n_heads=2, d_ff=4), strategy="zero",
         generator=torch.Generator().manual_seed(0))
    _WARMED_UP = True


def run_arm(cfg: DictConfig, hydra_cfg) -> float | None:
    """One job of a compare sweep: train each of its arms (`job_arms`) in its own directory, unless it
    finished earlier or another process trains it; the first arm's final validation loss."""
    losses = [train_arm(arm, cfg, hydra_cfg) for arm in job_arms(cfg, hydra_cfg)]
    return losses[0]


def train_arm(arm: Arm, cfg: DictConfig, hydra_cfg) -> float | None:
    """Train one arm in ``<sweep dir>/<arm>-seed<N>/`` (resuming an interrupted attempt)."""
    from rich.markup import escape


    seed = int(cfg.seed)
    arm_dir = Path(str(hydra_cfg.sweep.dir)).absolute() / arm_dirname(arm.label, seed)
    if is_complete(arm_dir):
        ui.console.print(escape(f"compare: {arm_dir.name}: finished earlier, skipped"))
        return json.loads((arm_dir / "summary.json").read_text())["final_val_loss"]
    run = arm.run
    final, plan = run.model, run.plan
    with claim(arm_dir, cfg.compare.invocation) as mine:
        if not mine or is_complete(arm_dir):
            ui.console.print(escape(f"compare: {arm_dir.name}: trained by another job of this sweep, skipped"))
            return None
        resume = has_checkpoint(arm_dir)  # an interrupted earlier attempt: go on from its last checkpoint
        for stale in ("summary.json", "failed.json") if resume else ("metrics.jsonl", "summary.json", "failed.json"):
            (arm_dir / stale).unlink(missing_ok=True)
        info = {"arm": arm.label, "kind": arm.kind, "strategy": None, "seed": seed, **arm.info,
                "job": int(hydra_cfg.job.num), "resumed": resume, "final_config": final.to_dict(),
                "command": os.environ.get("GROW_COMMAND"), "plan_tokens": plan.total_tokens, "plan_flops": plan.total_flops,
                "plan": [s.to_dict() for s in plan]}
        (arm_dir / "arm.json").write_text(json.dumps(info, indent=2))
        OmegaConf.save(OmegaConf.create(run.raw), arm_dir / "config.yaml")
        if resume:
            run = run.changed(resume=str(arm_dir))  # re-assembled: the checkpoint checked against the plan
        warm_up()
        # "(resumed)" before the directory: a rule cuts its title at the console's width, and the path is long
        ui.console.rule(escape(f"arm {arm.label}, seed {seed}" + (" (resumed)" if resume else "") + f": {len(plan)} "
                               f"stage(s), {ui.fmt_num(plan.total_tokens)} tokens, {ui.fmt_num(plan.total_flops)} "
                               f"FLOPs -> {arm_dir}"))
        try:
            summary = train(run, arm_dir)
        except NonFiniteLoss as exc:
            (arm_dir / "failed.json").write_text(json.dumps({"error": str(exc)}))
            ui.console.print(escape(f"compare: {arm_dir.name}: diverged ({exc}); the report lists it as failed"))
            return float("nan")
    return summary["final_val_loss"]


class ReportCallback(Callback):
    """Hydra callback (configs/compare.yaml): the report of the sweep directory after the last job
    (without the report extra: `grow.report.partial_report`)."""

    def on_multirun_end(self, config: DictConfig, **kwargs) -> None:
        sweep_dir = Path(str(config.hydra.sweep.dir))
        if not any(sweep_dir.glob("*/arm.json")):
            return
        logger_cfg = OmegaConf.to_container(config.logger, resolve=True) if "logger" in config else {}
        build_report([sweep_dir], sweep_dir, key="report", logger_cfg=logger_cfg, partial=True)
