"""``grow compare``: the arms of a comparison, their cost accounting, and the report (DESIGN §9).

Arms
----
`grow compare strategy=svd,zero` is a Hydra sweep (configs/compare.yaml, MULTIRUN mode). The
command line is rewritten before Hydra starts (`grow.commands.compare.expand_arms`): the
strategy list becomes ``strategy=baseline,svd,zero[,equal_flops]``, where ``baseline`` and
``equal_flops`` are pseudo-strategies that only ``grow compare`` can see (configs/arms/strategy/).
Each job of the sweep (one arm, one seed, one value of every other swept key) calls `run_arm`,
which derives from the composed config exactly the config ``grow train`` would run (`arm_config`):

* a grown arm: ``grow train +schedule=<schedule> strategy=<name>`` (the schedule of compare.yaml);
* ``baseline``: ``grow train`` -- the final model from scratch on the same tokens (no schedule);
* ``equal_flops``: ``grow train trainer.max_tokens=<T>`` -- the final model from scratch on as many
  FLOPs as the grown arms' stage plan: ``T`` is the plan's training FLOPs divided by the final
  model's FLOPs per token, rounded down to whole steps (`equal_flops_tokens`). The plan is the same
  for every strategy, so the budget is known before any arm runs (the arms can run in parallel on
  a cluster); the FLOPs the growth passes spend (svd's statistics and line search, 0 for zero,
  random, net2net and vt) are left out of that budget, and reported per arm.

Every arm trains in its own directory ``<sweep dir>/<arm>-seed<N>/`` (`arm_dirname`; the values of
the other swept keys are part of ``<arm>``, e.g. ``svd_width_rate=0.5-seed0``) with the same seed,
hence the same initialization stream and the same token stream. An arm whose ``summary.json`` says
``"complete": true`` is skipped, so rerunning a sweep with the same ``hydra.sweep.dir`` trains only
what is missing (an interrupted arm starts again from scratch). Two jobs of one sweep that map to
the same arm (the baseline of a ``schedule.width_rate=0.5,1.0`` sweep does not depend on the
rate) train it once: the first one takes ``<arm dir>/.lock-<invocation>``.

Cost accounting (the same code as ``grow schedule``)
---------------------------------------------------
``flops`` of a run is counted by the training loop: per step, `grow.schedule.training_flops` of the
stage's model (DESIGN §8: 6 x matmul weights + 6 N s E (k + v) per token) times the step's tokens,
plus the FLOPs every growth strategy reports for its own passes (statistics, line-search
evaluations). Validation passes are measurements, not training, and are not counted (every arm
runs the same ones). Each arm also records ``plan_flops``, the stage plan's FLOPs from
`grow.schedule.build_plan` (what ``grow schedule`` prints); the report checks that the counted
training FLOPs equal it. Wall-clock is ``train_seconds``: training steps and growths, with
``torch.compile`` time (the first step after each (re)compile) apart in ``compile_seconds``;
evaluations, data loading and start-up are not in it (``wall_seconds`` has the whole run).

The report
----------
`build_report` reads every arm directory of a sweep (``arm.json``, ``summary.json``,
``metrics.jsonl``) and writes ``summary.json``, ``report.md``, ``loss_vs_flops.png`` and
``loss_vs_time.png`` into the sweep directory, and prints the table. It runs after the last job
(`ReportCallback`, a Hydra callback, so it also runs under a cluster launcher) and on its own with
``grow compare report=<sweep dir>``. Per arm, over its seeds (mean and sample standard deviation,
n - 1; null with one seed), `COLUMNS`. Every ratio is taken per seed against the baseline of the
same seed (and the same values of the swept keys the baseline depends on), then averaged.

FLOPs to reach the baseline's loss (`flops_to_reach`): the validation curve of a run is the
sequence of its validation measurements in the order they were taken, as (cumulative FLOPs, loss)
points: every ``val/loss`` record (``trainer.eval_every``, each stage's end, the end of the run)
and, at each growth, ``growth/loss_before`` (at the FLOPs before the growth's own passes) and
``growth/loss_after`` (after them). The curve is linear between consecutive points; the answer is
the FLOPs of its first point at or below the target, found by interpolating linearly between that
point and the one before it, or None when no point reaches the target. The first point is not
interpolated from an assumed start. The resolution is that of the evaluations: set
``trainer.eval_every`` for finer curves.
"""

from __future__ import annotations

import json
import math
import os
import re
import statistics
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path

from omegaconf import DictConfig, OmegaConf

from grow.config import CONFIG_DIR, ConfigError, RunConfig, model_config

try:  # the callback base class (Hydra >= 1.1); a plain object otherwise
    from hydra.experimental.callback import Callback
except ImportError:  # pragma: no cover
    Callback = object

ARMS_DIR = CONFIG_DIR / "arms"  # configs/arms/strategy/{baseline,equal_flops}.yaml
PSEUDO_STRATEGIES = ("baseline", "equal_flops")
REPORT_FILES = ("summary.json", "report.md", "loss_vs_flops.png", "loss_vs_time.png")

# The columns of the report: summary.json key -> (header, how it is shown, description).
COLUMNS: dict[str, tuple[str, str, str]] = {
    "final_val_loss": ("final val loss", "loss", "validation loss at the end of the run"),
    "flops": ("FLOPs", "si", "training FLOPs (every stage) + the growth strategies' own passes"),
    "flops_pct_baseline": ("FLOPs % base", "pct", "flops as % of the baseline's (same seed)"),
    "train_seconds": ("train s", "sec", "wall-clock of training steps and growths, compile time apart"),
    "time_pct_baseline": ("time % base", "pct", "train_seconds as % of the baseline's (same seed)"),
    "compile_seconds": ("compile s", "sec", "torch.compile time (first step after each (re)compile)"),
    "flops_to_baseline_loss": ("FLOPs to base loss", "frac",
                               "FLOPs until the validation curve first reaches the baseline's final loss, as a "
                               "fraction of the baseline's FLOPs (null: never reached)"),
    "max_abs_growth_delta": ("max |Δ| growth", "loss", "largest |loss after - loss before| over the growths"),
    "mean_recovery": ("mean recovery", "loss",
                      "mean over growths of the val-loss change trainer.recovery_steps after the growth"),
}
EXTRA = ("tokens", "train_flops", "growth_flops", "plan_flops", "wall_seconds", "growths")


# ---- arms ---------------------------------------------------------------------------------------


def _parse_overrides(texts: list[str]):
    from hydra.core.override_parser.overrides_parser import OverridesParser

    return OverridesParser.create().parse_overrides(list(texts))


def _short_key(key: str) -> str:
    for prefix in ("schedule.", "strategy."):
        if key.startswith(prefix):
            return key[len(prefix):]
    return key


def _affects_baseline(key: str) -> bool:
    """Does a swept key change the fixed-size baseline? (schedule and strategy keys do not)."""
    return not (key in ("schedule", "strategy") or key.startswith(("schedule.", "strategy.")))


def arm_setting(task_overrides: list[str], vary: list[str]) -> dict[str, str]:
    """The values of the swept keys ``vary`` in one job's overrides, e.g. {'schedule.width_rate': '0.5'}."""
    found = {}
    for o in _parse_overrides([t for t in task_overrides if not t.startswith("hydra")]):
        if o.key_or_group in vary:
            found[o.key_or_group] = o.get_value_element_as_str()
    return {k: found[k] for k in vary if k in found}


def arm_label(kind: str, strategy: str | None, setting: dict[str, str]) -> str:
    """The arm's name in the report: the strategy (or baseline, equal_flops) and the swept values it depends on."""
    if kind == "baseline":
        keep = {k: v for k, v in setting.items() if _affects_baseline(k)}
    elif kind == "equal_flops":
        keep = {k: v for k, v in setting.items() if not (k == "strategy" or k.startswith("strategy."))}
    else:
        keep = setting
    name = strategy if kind == "grown" else kind
    return " ".join([name, *(f"{_short_key(k)}={v}" for k, v in keep.items())])


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


def _plan(cfg: DictConfig, with_schedule: bool):
    from grow.schedule import build_plan

    schedule = OmegaConf.to_container(cfg.schedule, resolve=True) if with_schedule else None
    return build_plan(model_config(cfg.model), schedule, max_tokens=int(cfg.trainer.max_tokens),
                      batch_size=int(cfg.trainer.batch_size))


def equal_flops_tokens(cfg: DictConfig) -> int:
    """Tokens the final model trains on to spend the grown arms' plan FLOPs (whole steps, rounded down).

    ``cfg`` is a compare config (with its schedule). The growth passes' FLOPs are not in the budget
    (they are known only after a run; 0 for zero, random, net2net and vt)."""
    from grow.schedule import training_flops

    final = model_config(cfg.model)
    budget = _plan(cfg, True).total_flops
    per_step = int(cfg.trainer.batch_size) * final.seq_len
    steps = budget // training_flops(final, per_step)
    if steps < 1:
        raise ConfigError("compare.equal_flops", True, f"the grown arms' plan ({budget:.3g} FLOPs) is less than one "
                          f"step of the final model; raise trainer.max_tokens")
    return int(steps * per_step)


def arm_config(cfg: DictConfig, kind: str, *, group: str, name: str) -> DictConfig:
    """The `grow train` config of one arm, from the composed compare config ``cfg``.

    Drops the ``compare`` and ``report`` keys; the baseline arms drop the schedule and take
    `grow train`'s default strategy node (unused without a schedule); equal_flops sets
    trainer.max_tokens (`equal_flops_tokens`). The W&B group is ``logger.group`` or ``group``
    (the sweep's name), the run name the arm's label."""
    d = OmegaConf.to_container(cfg, resolve=False)
    for key in ("compare", "report"):
        d.pop(key, None)
    if kind != "grown":
        d.pop("schedule", None)
        d["strategy"] = default_strategy()
    if kind == "equal_flops":
        d["trainer"]["max_tokens"] = equal_flops_tokens(cfg)
    d["logger"]["group"] = d["logger"].get("group") or group
    d["logger"]["name"] = name
    return OmegaConf.create(d)


def has_checkpoint(arm_dir: Path) -> bool:
    """Whether an unfinished arm left a checkpoint to resume from (`grow.checkpoint`)."""
    try:
        from grow import checkpoint
    except ImportError:  # pragma: no cover - a tree without checkpoints
        return False
    return bool(checkpoint.list_checkpoints(Path(arm_dir)))


def is_complete(arm_dir: Path) -> bool:
    try:
        return json.loads((Path(arm_dir) / "summary.json").read_text()).get("complete") is True
    except (OSError, ValueError):
        return False


@contextmanager
def claim(arm_dir: Path, invocation: str | None):
    """Yields True when this job may train the arm: it holds ``.lock-<invocation>`` (created exclusively).

    A lock of another invocation is a leftover of an interrupted sweep and is removed. Without an
    invocation id (the app run without `grow compare`) every job may train."""
    if not invocation:
        yield True
        return
    lock = Path(arm_dir) / f".lock-{invocation}"
    try:
        os.close(os.open(lock, os.O_CREAT | os.O_EXCL | os.O_WRONLY))
    except FileExistsError:
        yield False
        return
    for old in Path(arm_dir).glob(".lock-*"):
        if old != lock:
            old.unlink(missing_ok=True)
    try:
        yield True
    finally:
        lock.unlink(missing_ok=True)


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

    from grow.growth import grow
    from grow.model import Transformer, TransformerConfig

    small = TransformerConfig(vocab_size=8, seq_len=4, n_layers=1, d_model=2, n_heads=1, d_qk=2, d_v=2, d_ff=2)
    grow(Transformer(small), small.replace(n_layers=2, d_model=4, n_heads=2, d_ff=4), strategy="zero",
         generator=torch.Generator().manual_seed(0))
    _WARMED_UP = True


def run_arm(cfg: DictConfig, hydra_cfg) -> float | None:
    """One job of a compare sweep: train its arm in its own directory, unless it finished earlier."""
    from rich.markup import escape

    from grow import console as ui
    from grow.train import NonFiniteLoss, train

    strategy = str(cfg.strategy.name)
    kind = strategy if strategy in PSEUDO_STRATEGIES else "grown"
    sweep_dir = Path(str(hydra_cfg.sweep.dir)).absolute()
    setting = arm_setting(list(hydra_cfg.overrides.task), list(cfg.compare.vary or []))
    label = arm_label(kind, strategy, setting)
    seed = int(cfg.seed)
    arm_dir = sweep_dir / arm_dirname(label, seed)
    if is_complete(arm_dir):
        ui.console.print(escape(f"compare: {arm_dir.name}: finished earlier, skipped"))
        return json.loads((arm_dir / "summary.json").read_text())["final_val_loss"]
    arm = arm_config(cfg, kind, group=sweep_dir.name, name=label)
    run = RunConfig.from_hydra(arm)
    final, plan = run.model, run.plan()
    arm_dir.mkdir(parents=True, exist_ok=True)
    with claim(arm_dir, cfg.compare.invocation) as mine:
        if not mine or is_complete(arm_dir):
            ui.console.print(escape(f"compare: {arm_dir.name}: trained by another job of this sweep, skipped"))
            return None
        resume = has_checkpoint(arm_dir)  # an interrupted earlier attempt: go on from its last checkpoint
        for stale in ("summary.json", "failed.json") if resume else ("metrics.jsonl", "summary.json", "failed.json"):
            (arm_dir / stale).unlink(missing_ok=True)
        info = {"arm": label, "kind": kind, "strategy": strategy if kind == "grown" else None, "seed": seed,
                "setting": setting, "baseline_arm": arm_label("baseline", None, setting),
                "job": int(hydra_cfg.job.num), "resumed": resume, "final_config": final.to_dict(),
                "plan_tokens": plan.total_tokens, "plan_flops": plan.total_flops,
                "plan": [s.to_dict() for s in plan]}
        (arm_dir / "arm.json").write_text(json.dumps(info, indent=2))
        OmegaConf.save(arm, arm_dir / "config.yaml", resolve=True)
        if resume:
            arm.resume = str(arm_dir)
            run = RunConfig.from_hydra(arm)
        warm_up()
        ui.console.rule(escape(f"arm {label}, seed {seed}: {len(plan)} stage(s), {ui.fmt_num(plan.total_tokens)} "
                               f"tokens, {ui.fmt_num(plan.total_flops)} FLOPs -> {arm_dir}" + (" (resumed)" if resume else "")))
        try:
            summary = train(run, arm_dir)
        except NonFiniteLoss as exc:
            (arm_dir / "failed.json").write_text(json.dumps({"error": str(exc)}))
            ui.console.print(escape(f"compare: {arm_dir.name}: diverged ({exc}); the report lists it as failed"))
            return float("nan")
    return summary["final_val_loss"]


# ---- reading a sweep --------------------------------------------------------------------------


@dataclass
class Run:
    """One arm and seed of a sweep, as found on disk."""

    dir: Path
    arm: dict
    summary: dict | None = None
    failed: str | None = None
    records: list = field(default_factory=list)

    @property
    def label(self) -> str:
        return self.arm["arm"]

    @property
    def seed(self) -> int:
        return int(self.arm["seed"])

    @property
    def complete(self) -> bool:
        return self.summary is not None and self.summary.get("complete") is True


def load_runs(sweep_dir: Path) -> list[Run]:
    """Every arm directory (one with ``arm.json``) directly under ``sweep_dir``, in job order."""
    from grow.logging import read_metrics

    runs = []
    for arm_json in sorted(Path(sweep_dir).glob("*/arm.json")):
        d = arm_json.parent
        run = Run(d, json.loads(arm_json.read_text()))
        if is_complete(d):
            run.summary = json.loads((d / "summary.json").read_text())
            run.records = read_metrics(d)
        elif (d / "failed.json").exists():
            run.failed = json.loads((d / "failed.json").read_text()).get("error", "failed")
        runs.append(run)
    runs.sort(key=lambda r: (r.arm.get("job", 0), r.seed, r.dir.name))
    return runs


def curve(records: list[dict]) -> list[tuple[float, float, float, str]]:
    """The validation curve of a run: (cumulative FLOPs, val loss, train seconds, kind) in measurement order.

    ``val/loss`` records (kind "val"), and at each growth its loss before (kind "before", at the FLOPs
    before the growth's own passes) and after ("after"); a growth's time is that of the last record
    before it plus ``growth/seconds``."""
    points, t = [], 0.0
    for r in records:
        if "time/seconds" in r:
            t = float(r["time/seconds"])
        if "growth/loss_before" in r:
            f = float(r["train/flops"])
            points.append((f - float(r.get("growth/flops", 0.0)), float(r["growth/loss_before"]), t, "before"))
            t += float(r.get("growth/seconds", 0.0))
            points.append((f, float(r["growth/loss_after"]), t, "after"))
        elif "val/loss" in r:
            points.append((float(r["train/flops"]), float(r["val/loss"]), t, "val"))
    return points


def flops_to_reach(points, target: float) -> float | None:
    """FLOPs at which a curve [(flops, loss, ...), ...] first reaches ``target`` (loss <= target).

    Linear interpolation between the first point at or below the target and the point before it;
    the first point itself when it is already there; None when no point reaches the target."""
    for i, p in enumerate(points):
        f, loss = float(p[0]), float(p[1])
        if not math.isfinite(loss) or loss > target:
            continue
        if i == 0:
            return f
        f0, l0 = float(points[i - 1][0]), float(points[i - 1][1])
        if not math.isfinite(l0) or l0 <= loss:
            return f
        return f0 + (f - f0) * (l0 - target) / (l0 - loss)
    return None


def _mean(xs):
    return sum(xs) / len(xs) if xs else None


def run_metrics(run: Run, base: Run | None) -> dict:
    """The per-run figures of the report (ratios against ``base``, the baseline of the same seed)."""
    s = run.summary
    events = s.get("growth_events") or []
    deltas = [abs(float(e["growth/delta"])) for e in events if e.get("growth/delta") is not None]
    recoveries = [float(e["growth/recovery"]) for e in events if e.get("growth/recovery") is not None]
    m = {
        "seed": run.seed, "run_dir": run.dir.name, "final_val_loss": float(s["final_val_loss"]),
        "tokens": int(s["tokens"]), "flops": float(s["flops"]), "train_flops": float(s["train_flops"]),
        "growth_flops": float(s["growth_flops"]), "plan_flops": float(run.arm.get("plan_flops", float("nan"))),
        "train_seconds": float(s["train_seconds"]), "compile_seconds": float(s["compile_seconds"]),
        "wall_seconds": float(s["wall_seconds"]), "growths": len(events),
        "max_abs_growth_delta": max(deltas) if deltas else None, "mean_recovery": _mean(recoveries),
        "flops_pct_baseline": None, "time_pct_baseline": None, "flops_to_baseline_loss": None,
        "reached_baseline_loss": None,
    }
    if base is not None:
        b = base.summary
        m["flops_pct_baseline"] = 100.0 * m["flops"] / float(b["flops"])
        m["time_pct_baseline"] = 100.0 * m["train_seconds"] / max(float(b["train_seconds"]), 1e-12)
        reach = flops_to_reach(curve(run.records), float(b["final_val_loss"]))
        m["reached_baseline_loss"] = reach is not None
        m["flops_to_baseline_loss"] = None if reach is None else reach / float(b["flops"])
    return m


def stat(values: list) -> dict:
    """Mean and sample standard deviation (n - 1) of the non-null values; the values themselves."""
    xs = [float(v) for v in values if v is not None]
    return {"mean": _mean(xs), "std": statistics.stdev(xs) if len(xs) > 1 else None, "n": len(xs),
            "values": list(values)}


def summarize(sweep_dir: Path, runs: list[Run] | None = None) -> dict:
    """The comparison of a sweep directory: one entry per arm (mean ± std over seeds of every column)."""
    sweep_dir = Path(sweep_dir)
    runs = load_runs(sweep_dir) if runs is None else runs
    bases = {(r.label, r.seed): r for r in runs if r.arm["kind"] == "baseline" and r.complete}
    arms: dict[str, list[Run]] = {}
    for r in runs:
        arms.setdefault(r.label, []).append(r)
    entries = []
    for label, rs in arms.items():
        a = rs[0].arm
        done = [r for r in rs if r.complete]
        per_run = [run_metrics(r, bases.get((a["baseline_arm"], r.seed))) for r in done]
        entry = {"arm": label, "kind": a["kind"], "strategy": a.get("strategy"), "setting": a.get("setting", {}),
                 "baseline_arm": a["baseline_arm"] if a["kind"] != "baseline" else None,
                 "seeds": [m["seed"] for m in per_run],
                 "failed": {str(r.seed): r.failed for r in rs if r.failed},
                 "incomplete": [r.seed for r in rs if not r.complete and not r.failed],
                 "has_baseline": bool(per_run) and all(m["flops_pct_baseline"] is not None for m in per_run)}
        for key in (*COLUMNS, *EXTRA):
            entry[key] = stat([m[key] for m in per_run])
        entry["flops_to_baseline_loss"]["reached"] = sum(bool(m["reached_baseline_loss"]) for m in per_run)
        entry["accounting_check"] = all(abs(m["train_flops"] - m["plan_flops"]) <= 1e-9 * max(m["plan_flops"], 1)
                                        for m in per_run)
        entry["runs"] = per_run
        entries.append(entry)
    return {
        "sweep_dir": str(sweep_dir.absolute()),
        "group": sweep_dir.name,
        "columns": {k: v[2] for k, v in COLUMNS.items()},
        "statistics": "mean and sample standard deviation (n - 1) over seeds; std null with one seed; "
                      "ratios per seed against the baseline of the same seed",
        "accounting": ACCOUNTING,
        "arms": entries,
    }


ACCOUNTING = (
    "FLOPs: per stage, the stage model's training FLOPs per token (6 x matmul weights + 6 N s E (k + v), "
    "DESIGN §8) times the tokens it trains, summed over stages (grow.schedule.training_flops, the code of "
    "`grow schedule`), plus the FLOPs every growth strategy spends on its own passes (statistics, line "
    "search); validation passes are not counted. Wall-clock: training steps and growths; torch.compile time "
    "apart; evaluations and start-up not included. FLOPs to reach the baseline's final loss: the first point of "
    "the validation curve (val/loss records and the losses before and after each growth, in order, against "
    "cumulative FLOPs) at or below it, interpolated linearly from the point before; — when never reached. "
    "equal_flops: the final model from scratch on floor(plan FLOPs / (FLOPs per step of the final model)) "
    "steps, the growth passes left out of the budget."
)


# ---- output --------------------------------------------------------------------------------------


def _si(x: float) -> str:
    from grow.console import fmt_num

    return fmt_num(x)


def fmt_stat(s: dict, how: str, *, baseline_missing: bool = False) -> str:
    """'3.412 ± 0.012', '41.3% ± 0.2', '0.62 (2/3 reached)', '—'."""
    if s["mean"] is None:
        if how in ("pct", "frac") and baseline_missing:
            return "n/a"
        return "—"
    mean, std = s["mean"], s["std"]
    if how == "loss":
        text, err = f"{mean:.4f}", (f"{std:.4f}" if std is not None else None)
    elif how == "pct":
        text, err = f"{mean:.1f}%", (f"{std:.1f}" if std is not None else None)
    elif how == "frac":
        text, err = f"{mean:.3f}", (f"{std:.3f}" if std is not None else None)
    elif how == "sec":
        text, err = f"{mean:.2f}", (f"{std:.2f}" if std is not None else None)
    else:
        text, err = _si(mean), (_si(std) if std is not None else None)
    out = text if err is None else f"{text} ± {err}"
    if "reached" in s and s["reached"] < len(s["values"]):
        out += f" ({s['reached']}/{len(s['values'])} reached)"
    return out


def table_rows(summary: dict) -> tuple[list[str], list[list[str]]]:
    headers = ["arm", "seeds", *(v[0] for v in COLUMNS.values())]
    rows = []
    for e in summary["arms"]:
        seeds = ",".join(map(str, e["seeds"])) or "-"
        if e["failed"]:
            seeds += f" (failed: {','.join(e['failed'])})"
        if e["incomplete"]:
            seeds += f" (unfinished: {','.join(map(str, e['incomplete']))})"
        missing = not e["has_baseline"]
        rows.append([e["arm"], seeds, *(fmt_stat(e[k], how, baseline_missing=missing)
                                         for k, (_, how, _) in COLUMNS.items())])
    return headers, rows


def print_table(summary: dict) -> None:
    from rich.markup import escape
    from rich.table import Table

    from grow.console import console

    headers, rows = table_rows(summary)
    table = Table(title=escape(f"grow compare: {summary['group']}"),
                  caption="mean ± std over seeds; % and fractions against the baseline of the same seed; "
                          "— never reached; n/a no baseline")
    for i, h in enumerate(headers):
        table.add_column(h, justify="left" if i < 2 else "right")
    for row in rows:
        table.add_row(*(escape(str(c)) for c in row))
    console.print(table)
    console.print(escape(f"report: {Path(summary['sweep_dir']) / 'report.md'}"))


def _md_table(headers: list[str], rows: list[list[str]]) -> str:
    esc = lambda s: str(s).replace("|", "\\|")
    lines = ["| " + " | ".join(map(esc, headers)) + " |", "|" + "---|" * len(headers)]
    lines += ["| " + " | ".join(map(esc, r)) + " |" for r in rows]
    return "\n".join(lines)


def report_markdown(summary: dict, runs: list[Run]) -> str:
    headers, rows = table_rows(summary)
    first = next((r for r in runs if r.complete), None)
    lines = [f"# grow compare: {summary['group']}", ""]
    if first is not None:
        fc = first.summary["final_config"]
        lines += [f"Final model: N={fc['n_layers']} h={fc['d_model']} E={fc['n_heads']} k={fc['d_qk']} "
                  f"v={fc['d_v']} p={fc['d_ff']} s={fc['seq_len']} V={fc['vocab_size']}. "
                  f"Sweep directory: `{summary['sweep_dir']}`.", ""]
    lines += [_md_table(headers, rows), "",
              "Mean ± sample standard deviation (n − 1) over seeds. \"% base\" and \"FLOPs to base loss\" are "
              "taken per seed against the baseline of the same seed, then averaged; — never reached; n/a no "
              "baseline in the sweep.", "", "## Columns", ""]
    lines += [f"- **{h}** (`{k}`): {d}." for k, (h, _, d) in COLUMNS.items()]
    lines += ["", "## How costs are counted", "", ACCOUNTING, ""]
    bad = [e["arm"] for e in summary["arms"] if e["runs"] and not e["accounting_check"]]
    lines += [("Check: every run's counted training FLOPs equal its stage plan's (`grow schedule`)." if not bad else
               f"Check FAILED: counted training FLOPs differ from the stage plan for {', '.join(bad)}."), ""]
    lines += ["## Runs", ""]
    run_headers = ["arm", "seed", "dir", "final val loss", "tokens", "FLOPs", "growth FLOPs", "train s", "compile s",
                   "wall s", "growths", "FLOPs to base loss"]
    run_rows = []
    for e in summary["arms"]:
        for m in e["runs"]:
            reach = m["flops_to_baseline_loss"]
            run_rows.append([e["arm"], m["seed"], f"`{m['run_dir']}`", f"{m['final_val_loss']:.4f}", _si(m["tokens"]),
                             _si(m["flops"]), _si(m["growth_flops"]), f"{m['train_seconds']:.2f}",
                             f"{m['compile_seconds']:.2f}", f"{m['wall_seconds']:.1f}", m["growths"],
                             "—" if reach is None else f"{reach:.3f}"])
    lines += [_md_table(run_headers, run_rows), "", "## Curves", "",
              "Validation loss (lines with markers; training loss faint) against cumulative FLOPs and against "
              "training wall-clock; a vertical dotted segment and a triangle mark each growth (loss before → after).",
              "", "![loss vs FLOPs](loss_vs_flops.png)", "", "![loss vs time](loss_vs_time.png)", ""]
    return "\n".join(lines)


def plot(runs: list[Run], path: Path, axis: str, summary: dict) -> None:
    """Validation (and faint training) loss of every run against FLOPs or seconds; growths marked."""
    from matplotlib.figure import Figure

    fig = Figure(figsize=(9, 5.5), layout="constrained")
    ax = fig.subplots()
    labels = list(dict.fromkeys(r.label for r in runs if r.complete))
    colors = {lab: f"C{i % 10}" for i, lab in enumerate(labels)}
    xi = 0 if axis == "flops" else 2
    for r in runs:
        if not r.complete:
            continue
        c = colors[r.label]
        first = r is next(x for x in runs if x.label == r.label and x.complete)
        train = [(float(x["train/flops"] if axis == "flops" else x.get("time/seconds", 0.0)), float(x["train/loss"]))
                 for x in r.records if "train/loss" in x]
        if train:
            ax.plot(*zip(*train), color=c, lw=0.7, alpha=0.25)
        pts = curve(r.records)
        if pts:
            ax.plot([p[xi] for p in pts], [p[1] for p in pts], color=c, marker="o", ms=3, lw=1.4,
                    label=r.label if first else None)
        growth = [(pts[i], pts[i + 1]) for i in range(len(pts) - 1) if pts[i][3] == "before"]
        for before, after in growth:
            ax.plot([before[xi], after[xi]], [before[1], after[1]], color=c, ls=":", lw=1.2)
            ax.plot([after[xi]], [after[1]], color=c, marker="^", ms=7, mec="black", mew=0.5)
    for e in summary["arms"]:
        if e["kind"] == "baseline" and e["final_val_loss"]["mean"] is not None:
            ax.axhline(e["final_val_loss"]["mean"], color="gray", ls="--", lw=0.8)
    ax.plot([], [], color="gray", ls="--", lw=0.8, label="baseline final loss")
    ax.plot([], [], color="gray", ls="", marker="^", ms=7, mec="black", mew=0.5, label="growth (loss after)")
    ax.set_xlabel("cumulative training FLOPs (with growth passes)" if axis == "flops"
                  else "training wall-clock, s (compile time apart)")
    ax.set_ylabel("validation loss")
    ax.set_title(f"grow compare: {summary['group']}")
    ax.grid(alpha=0.3)
    ax.legend(fontsize=8)
    fig.savefig(path, dpi=120)


def log_wandb(summary: dict, sweep_dir: Path, logger_cfg: dict) -> None:
    """One W&B run in the sweep's group with the summary table and the two plots (`grow.logging.wandb_mode`:
    WANDB_MODE, or offline without credentials; never W&B's login prompt)."""
    from grow.logging import wandb_mode

    mode, _ = wandb_mode()
    if mode == "disabled":
        return
    from grow.console import console

    try:
        import wandb

        headers, rows = table_rows(summary)
        run = wandb.init(project=logger_cfg.get("project", "grow"), entity=logger_cfg.get("entity"),
                         group=logger_cfg.get("group") or summary["group"], name="compare-report",
                         job_type="compare-report", dir=str(sweep_dir), config={"sweep_dir": summary["sweep_dir"]},
                         mode=mode)
        try:
            data = {"compare/summary": wandb.Table(columns=headers, data=rows)}
            for name in ("loss_vs_flops", "loss_vs_time"):
                if (sweep_dir / f"{name}.png").exists():
                    data[f"compare/{name}"] = wandb.Image(str(sweep_dir / f"{name}.png"))
            run.log(data)
        finally:
            run.finish()
    except Exception as exc:  # noqa: BLE001 - W&B is a copy; the files are the record
        console.print(f"compare: W&B report table not logged: {str(exc).splitlines()[0] if str(exc) else exc}",
                      markup=False)


def build_report(sweep_dir: Path, *, logger_cfg: dict | None = None, show: bool = True) -> dict:
    """Write summary.json, report.md and the two plots into ``sweep_dir``; print the table; returns the summary."""
    sweep_dir = Path(sweep_dir)
    runs = load_runs(sweep_dir)
    if not runs:
        raise ConfigError("report", str(sweep_dir), "not a grow compare sweep directory (no <arm>/arm.json in it)")
    summary = summarize(sweep_dir, runs)
    (sweep_dir / "summary.json").write_text(json.dumps(summary, indent=2))
    (sweep_dir / "report.md").write_text(report_markdown(summary, runs))
    plot(runs, sweep_dir / "loss_vs_flops.png", "flops", summary)
    plot(runs, sweep_dir / "loss_vs_time.png", "time", summary)
    if show:
        print_table(summary)
    if logger_cfg is not None:
        log_wandb(summary, sweep_dir, logger_cfg)
    return summary


class ReportCallback(Callback):
    """Hydra callback (configs/compare.yaml): the report of the sweep directory after the last job."""

    def on_multirun_end(self, config: DictConfig, **kwargs) -> None:
        sweep_dir = Path(str(config.hydra.sweep.dir))
        if not any(sweep_dir.glob("*/arm.json")):
            return
        logger_cfg = OmegaConf.to_container(config.logger, resolve=True) if "logger" in config else {}
        build_report(sweep_dir, logger_cfg=logger_cfg)
