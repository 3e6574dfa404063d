"""The report of any set of runs: ``grow report runs=[...]`` and ``grow compare report=<sweep dir>``.

`build_report` reads runs (`grow.runs.find_runs`: run directories, ``grow compare`` sweeps and
``grow train -m`` multiruns, mixed) and writes ``summary.json``, ``report.md``, ``loss_vs_flops.png``
and ``loss_vs_time.png`` into an output directory, and prints the table. ``grow compare`` writes
into its sweep directory after the last job (`grow.compare.ReportCallback`) and on
``grow compare report=<sweep dir>``; ``grow report`` into ``out=`` (default
``outputs/report/<date_time>/``). Both go through the code below, so the columns are the same.

Arms. Runs with the same label (``arm.json``'s arm, or for a ``grow train`` run its strategy, or
``baseline`` without a schedule) are the seeds of one arm. When runs from different places would
make one arm hold two runs of the same seed, their labels get the config keys in which they differ
(``zero width_rate=0.5``), and, when their configs agree, the directory they came from
(``baseline [sweepA]``) (`distinguish`). Each run's ratios are taken against a baseline of the same
seed (`assign_baselines`): in its own sweep, the one ``arm.json`` names; across sweeps, a baseline
run with the same final model and token budget, its own sweep's first.

Kinds of arms (``arm.json``'s kind): ``grown`` (a strategy through the schedule), ``baseline`` (the
final model from scratch on the same tokens), ``matched`` (``baseline init=<p>``: that baseline in
strategy family ``<p>``'s parameterization, e.g. vt's Table 1; every grown run whose strategy has
parameterization ``<p>`` is paired with it, `assign_baselines`), ``equal_flops`` (fixed-size models
from scratch on the grown arms' plan FLOPs: ``equal_flops`` the final model, ``equal_flops size=s<k>``
stage k's).

Per arm, over its seeds (mean and sample standard deviation, n - 1; null with one seed), `COLUMNS`.
Every ratio is taken per seed against that seed's baseline, then averaged; `stat` keeps the values
per seed.

Differences from a reference (`paired`, `compare_arms`). Arms share seeds: the same seed gives every
arm the same initialization stream and the same token stream, so an arm and its reference are
compared seed by seed. For each seed s where both finished, d_s = arm_s - reference_s; the report
gives mean(d), its standard error SE = sd(d) / sqrt(n) (sd with n - 1) and t = mean(d) / SE, the
difference in units of its standard error (Student's t with n - 1 degrees of freedom; |t| > 4.30 is
the two-sided 5% level at n = 3 seeds). With one seed there is no SE ("n=1"). This is done for the
final validation loss and for the FLOPs to reach a reference's final loss (over the seeds where both
reached it). The references: ``baseline`` (every arm but the baseline); the matched baseline, "the
baseline in its own parameterization" (grown arms whose strategy has one: the loss difference, and
the FLOPs to reach the matched baseline's loss); and the best fixed size at equal FLOPs (grown arms):
the ``equal_flops`` arm of the same budget with the lowest mean final loss (`best_equal_flops`;
chosen on the same seeds it is compared on, which favours it slightly). `results_tables` renders
these tables from ``summary.json`` alone, for ``report.md`` and for docs/results.md
(scripts/results.py).

FLOPs to reach the baseline's loss (`flops_to_reach`): the validation curve of a run is the
sequence of its validation measurements in the order they were taken, as (cumulative FLOPs, loss)
points: every ``val/loss`` record (``trainer.eval_every``, each stage's end, the end of the run)
and, at each growth, ``growth/loss_before`` (at the FLOPs before the growth's own passes) and
``growth/loss_after`` (after them). The curve is linear between consecutive points; the answer is
the FLOPs of its first point at or below the target, found by interpolating linearly between that
point and the one before it, or None when no point reaches the target. The first point is not
interpolated from an assumed start. The resolution is that of the evaluations.

Recovery: a run logs, after each growth, the change of the validation loss since the growth,
``growth/recovery``, measured ``growth/recovery_steps`` steps later (``min(trainer.recovery_steps,
steps left in the stage)``); the report shows the mean over growths with that step count.

Stages are numbered from 1 (the first stage is stage 1; the first growth enters stage 2).
"""

from __future__ import annotations

import json
import math
import statistics
import textwrap
import time
from pathlib import Path

from grow.errors import ConfigError
from grow.runs import Run, find_runs, is_run_dir, parameterization

REPORT_FILES = ("summary.json", "report.md", "loss_vs_flops.png", "loss_vs_time.png")

# The columns of the report: summary.json key -> (header, how it is shown, description).
COLUMNS: dict[str, tuple[str, str, str]] = {
    "final_val_loss": ("final val loss", "loss", "validation loss at the end of the run"),
    "flops": ("FLOPs", "si", "training FLOPs (every stage) + the growth strategies' own passes"),
    "flops_pct_baseline": ("FLOPs % base", "pct", "flops as % of the baseline's (same seed)"),
    "train_seconds": ("train s", "sec", "wall-clock of training steps and growths, compile time apart"),
    "time_pct_baseline": ("time % base", "pct", "train_seconds as % of the baseline's (same seed); depends on "
                                                "the machine's load while each run ran (see Wall-clock)"),
    "compile_seconds": ("compile s", "sec", "torch.compile time (first step after each (re)compile)"),
    "flops_to_baseline_loss": ("FLOPs to base loss", "frac",
                               "FLOPs until the validation curve first reaches the baseline's final loss, as a "
                               "fraction of the baseline's FLOPs (null: never reached)"),
    "max_abs_growth_delta": ("max |Δ| growth", "loss", "largest |loss after - loss before| over the growths"),
    "mean_recovery": ("mean recovery", "loss",
                      "mean over growths of the validation-loss change since the growth, measured "
                      "growth/recovery_steps steps after it (min(trainer.recovery_steps, steps left in the "
                      "stage); the cell says how many)"),
}
EXTRA = ("tokens", "train_flops", "growth_flops", "plan_flops", "wall_seconds", "growths", "recovery_steps",
         "flops_to_matched_loss", "params", "budget_flops")
KIND_ORDER = ("baseline", "matched", "grown", "equal_flops")  # the order of the arms in the report

ACCOUNTING = (
    "FLOPs: per stage, the stage model's training FLOPs per token (6 x matmul weights + 6 N s E (k + v), "
    "docs/design.md) times the tokens it trains, summed over stages (grow.schedule.training_flops, the code of "
    "`grow schedule`), plus the FLOPs every growth strategy spends on its own passes (statistics, line "
    "search); validation passes are not counted. Wall-clock: training steps and growths; torch.compile time "
    "apart; evaluations and start-up not included. FLOPs to reach the baseline's final loss: the first point of "
    "the validation curve (val/loss records and the losses before and after each growth, in order, against "
    "cumulative FLOPs) at or below it, interpolated linearly from the point before; — when never reached. "
    "equal_flops (equal_flops size=s<k>): the final model (stage k's model) from scratch on floor(plan FLOPs / "
    "(FLOPs per step of that model)) steps, the growth passes left out of the budget."
)
# Config keys that do not make two runs different experiments (they never name an arm).
NOT_AN_ARM = ("seed", "resume", "device", "logger", "trainer.progress", "trainer.keep_checkpoints",
              "trainer.ckpt_every", "data.cache_dir", "compare", "report")


# ---- which runs: arms and baselines ---------------------------------------------------------------


def collect(paths: list[Path], key: str = "runs") -> list[Run]:
    """Every run of ``paths`` (runs and sweeps, mixed; a run named twice counts once), labelled and
    matched with its baseline."""
    runs, seen = [], set()
    for path in paths:
        for r in find_runs(Path(path), key):
            if r.dir.resolve() not in seen:
                seen.add(r.dir.resolve())
                runs.append(r)
    assign_baselines(runs)
    distinguish(runs)
    return runs


def _flat(d, prefix: str = "") -> dict:
    out = {}
    for k, v in (d or {}).items():
        name = f"{prefix}{k}"
        if isinstance(v, dict):
            out.update(_flat(v, f"{name}."))
        else:
            out[name] = v
    return out


def short_key(key: str) -> str:
    for prefix in ("schedule.", "strategy."):
        if key.startswith(prefix):
            return key[len(prefix):]
    return key


def _differences(runs: list[Run]) -> list[str]:
    flats = [_flat(r.config) for r in runs]
    keys = sorted({k for f in flats for k in f})
    return [k for k in keys if not any(k == n or k.startswith(n + ".") for n in NOT_AN_ARM)
            and len({json.dumps(f.get(k), sort_keys=True) for f in flats}) > 1]


def _collides(runs: list[Run]) -> bool:
    seeds = [r.seed for r in runs]
    return len(seeds) != len(set(seeds))


def distinguish(runs: list[Run]) -> None:
    """Relabel the runs of a label that holds one seed twice: by the config keys their configs differ
    in, then (identical configs) by the directory they were found through."""
    by_label: dict[str, list[Run]] = {}
    for r in runs:
        by_label.setdefault(r.label, []).append(r)
    for label, rs in by_label.items():
        if not _collides(rs):
            continue
        keys = _differences(rs)
        for r in rs:
            flat = _flat(r.config)
            r.arm["arm"] = " ".join([label, *(f"{short_key(k)}={flat.get(k)}" for k in keys)])
        groups: dict[str, list[Run]] = {}
        for r in rs:
            groups.setdefault(r.label, []).append(r)
        for same in groups.values():
            if _collides(same):
                names = _source_names([r.source for r in same])
                for r in same:
                    r.arm["arm"] += f" [{names[r.source]}]"


def _source_names(sources: list[Path]) -> dict[Path, str]:
    """The shortest trailing parts of the source directories that tell them apart: 'sweepA', or
    'a/sweep' and 'b/sweep' for two sweeps of the same name."""
    unique = list(dict.fromkeys(Path(s).absolute() for s in sources))
    for k in range(1, max(len(s.parts) for s in unique) + 1):
        names = {s: "/".join(s.parts[-k:]) for s in unique}
        if len(set(names.values())) == len(unique):
            break
    return {s: names[Path(s).absolute()] for s in sources}


def _budget(r: Run):
    return (r.config or {}).get("trainer", {}).get("max_tokens")


def _final(r: Run):
    return (r.summary or {}).get("final_config") or r.arm.get("final_config")


def run_parameterization(r: Run) -> str | None:
    """The parameterization of a grown or matched run: ``arm.json``'s, else its config's strategy's."""
    if r.arm.get("kind") not in ("grown", "matched"):
        return None
    if "parameterization" in r.arm:
        return r.arm["parameterization"]
    return parameterization(r.config)


def matched_label(baseline_arm: str | None, param: str) -> str:
    """The label of the matched baseline beside a baseline label: 'baseline model=tiny' ->
    'baseline init=vt model=tiny' (`grow.compare.arm_label`: the name, the tag, the swept values)."""
    base = baseline_arm or "baseline"
    return f"baseline init={param}{base[len('baseline'):]}" if base.startswith("baseline") else f"{base} init={param}"


def _pick(candidates: list[Run], r: Run, label: str | None) -> Run | None:
    """The candidate of ``r``'s seed named ``label``, from ``r``'s own sweep first; from elsewhere only
    with the same final model and token budget."""
    same = [b for b in candidates if b.label == label and b.seed == r.seed]
    own = [b for b in same if b.source == r.source]
    other = [b for b in same if b.source != r.source and _final(b) == _final(r) and _budget(b) == _budget(r)]
    return (own or other or [None])[0]


def assign_baselines(runs: list[Run]) -> None:
    """``run.base``: the complete baseline run of the same seed named by the run's ``baseline_arm``, from its
    own sweep first; from elsewhere only with the same final model and token budget. ``run.matched``: for a
    grown run whose strategy has a parameterization, the complete matched baseline of that
    parameterization and seed, found the same way; a matched run is its own."""
    bases = [r for r in runs if r.arm.get("kind") == "baseline" and r.complete]
    matched = [r for r in runs if r.arm.get("kind") == "matched" and r.complete]
    for r in runs:
        r.base = _pick(bases, r, r.arm.get("baseline_arm"))
        kind, param = r.arm.get("kind"), run_parameterization(r)
        if kind == "matched":
            r.matched = r if r.complete else None
        elif kind == "grown" and param:
            r.matched = _pick(matched, r, matched_label(r.arm.get("baseline_arm"), param))


# ---- figures ---------------------------------------------------------------------------------------------


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


def _reach(run: Run, ref: Run) -> float | None:
    """FLOPs for ``run``'s validation curve to reach ``ref``'s final loss, as a fraction of ``ref``'s FLOPs."""
    reach = flops_to_reach(curve(run.records), float(ref.summary["final_val_loss"]))
    return None if reach is None else reach / float(ref.summary["flops"])


def run_metrics(run: Run, base: Run | None, matched: Run | None = None) -> dict:
    """The per-run figures of the report: ratios against ``base``, the baseline of the same seed; the FLOPs
    to reach ``matched``'s final loss (the baseline in the run's parameterization, same seed); the labels
    of both (by which `compare_arms` pairs the seeds)."""
    s = run.summary
    events = s.get("growth_events") or []
    deltas = [abs(float(e["growth/delta"])) for e in events if e.get("growth/delta") is not None]
    recovered = [e for e in events if e.get("growth/recovery") is not None]
    steps = [float(e["growth/recovery_steps"]) for e in recovered if e.get("growth/recovery_steps") is not None]
    m = {
        "seed": run.seed, "run_dir": run.dir.name, "final_val_loss": float(s["final_val_loss"]),
        "tokens": int(s["tokens"]), "flops": float(s["flops"]), "train_flops": float(s["train_flops"]),
        "growth_flops": float(s["growth_flops"]), "plan_flops": float(run.arm.get("plan_flops", float("nan"))),
        "train_seconds": float(s["train_seconds"]), "compile_seconds": float(s["compile_seconds"]),
        "wall_seconds": float(s["wall_seconds"]), "growths": len(events),
        "max_abs_growth_delta": max(deltas) if deltas else None,
        "mean_recovery": _mean([float(e["growth/recovery"]) for e in recovered]),
        "recovery_steps": _mean(steps), "recovery_steps_each": [e.get("growth/recovery_steps") for e in recovered],
        "load_average": s.get("load_average"), "params": s.get("params"),
        "size": run.arm.get("size"), "budget_flops": run.arm.get("budget_flops"),
        "baseline_arm": None if base is None else base.label, "matched_arm": None if matched is None else matched.label,
        "flops_pct_baseline": None, "time_pct_baseline": None, "flops_to_baseline_loss": None,
        "reached_baseline_loss": None, "flops_to_matched_loss": None, "reached_matched_loss": None,
    }
    if base is not None:
        b = base.summary
        m["flops_pct_baseline"] = 100.0 * m["flops"] / float(b["flops"])
        m["time_pct_baseline"] = 100.0 * m["train_seconds"] / max(float(b["train_seconds"]), 1e-12)
        m["flops_to_baseline_loss"] = _reach(run, base)
        m["reached_baseline_loss"] = m["flops_to_baseline_loss"] is not None
    if matched is not None:
        m["flops_to_matched_loss"] = _reach(run, matched)
        m["reached_matched_loss"] = m["flops_to_matched_loss"] is not None
    return m


def stat(values: list) -> dict:
    """Mean and sample standard deviation (n - 1) of the non-null values; the values themselves."""
    xs = [float(v) for v in values if v is not None]
    return {"mean": _mean(xs), "std": statistics.stdev(xs) if len(xs) > 1 else None, "n": len(xs),
            "values": list(values)}


# ---- differences from the references, paired over seeds ----------------------------------------------

STATISTICS = ("mean and sample standard deviation (n - 1) over seeds; std null with one seed; ratios per seed "
              "against the baseline of the same seed. Differences from a reference (baseline, the baseline in "
              "the arm's own parameterization, the best fixed size at equal FLOPs) are paired by seed (the same "
              "seed gives every arm the same initialization and token streams): d_s = arm_s - reference_s, "
              "mean(d), SE = sd(d) / sqrt(n) (sd with n - 1), t = mean(d) / SE with n - 1 degrees of freedom; "
              "no SE with one seed")

# Two-sided 5% critical values of Student's t, t_{0.975}(dof), to read a t at the report's seed counts.
T_975 = {1: 12.706, 2: 4.303, 3: 3.182, 4: 2.776, 5: 2.571, 6: 2.447, 7: 2.365, 8: 2.306, 9: 2.262, 10: 2.228,
         11: 2.201, 12: 2.179, 13: 2.160, 14: 2.145, 15: 2.131, 16: 2.120, 17: 2.110, 18: 2.101, 19: 2.093,
         20: 2.086}


def paired(pairs) -> dict:
    """The paired difference of an arm from a reference over seeds: ``pairs`` is [(seed, arm value,
    reference value)]; a pair with a missing or non-finite value is left out. d_s = arm_s - ref_s;
    mean(d), sd(d) (n - 1), SE = sd / sqrt(n), t = mean / SE (n - 1 dof). With one pair: the
    difference, no sd, SE or t; with SE = 0, no t."""
    ok = [(int(seed), float(a), float(r)) for seed, a, r in pairs
          if a is not None and r is not None and math.isfinite(float(a)) and math.isfinite(float(r))]
    diffs = [a - r for _, a, r in ok]
    n = len(diffs)
    mean = sum(diffs) / n if n else None
    sd = statistics.stdev(diffs) if n > 1 else None
    se = sd / math.sqrt(n) if sd is not None else None
    # differences equal up to rounding (identical runs): SE 0, no t
    scale = max((max(abs(a), abs(r)) for _, a, r in ok), default=0.0)
    if se is not None and se <= 1e-12 * scale:
        se = 0.0
    return {"seeds": [seed for seed, _, _ in ok], "diffs": diffs, "n": n, "mean": mean, "sd": sd, "se": se,
            "t": mean / se if se else None, "dof": n - 1 if n > 1 else None}


def _by_seed(entry: dict | None) -> dict:
    return {m["seed"]: m for m in entry["runs"]} if entry else {}


def _same_budget(grown: dict, eq: dict) -> bool:
    """Was the equal-FLOPs arm ``eq`` given ``grown``'s plan FLOPs? By ``budget_flops`` where the arm
    recorded it, else by the swept values besides the strategy's."""
    budget, plan = (eq.get("budget_flops") or {}).get("mean"), (grown.get("plan_flops") or {}).get("mean")
    if budget is not None and plan is not None and math.isfinite(plan):
        return abs(budget - plan) <= 1e-9 * max(abs(plan), 1.0)
    keep = lambda st: {k: v for k, v in (st or {}).items() if not (k == "strategy" or k.startswith("strategy."))}
    return keep(grown.get("setting")) == keep(eq.get("setting"))


def best_equal_flops(arms: list[dict]) -> list[dict]:
    """The best fixed size at equal FLOPs: per budget, the ``equal_flops`` arm with the lowest mean final
    validation loss over its seeds, its candidates, and the grown arms it is the reference of."""
    groups: list[dict] = []
    eqs = [e for e in arms if e["kind"] == "equal_flops" and e["runs"]]
    for g in (e for e in arms if e["kind"] == "grown" and e["runs"]):
        cands = [e for e in eqs if _same_budget(g, e)]
        if not cands:
            continue
        means = {e["arm"]: stat([m["final_val_loss"] for m in e["runs"]]) for e in cands}
        best = min(cands, key=lambda e: means[e["arm"]]["mean"])["arm"]
        group = next((x for x in groups if x["arm"] == best), None)
        if group is None:
            group = {"arm": best, "final_val_loss": means[best]["mean"], "n": means[best]["n"],
                     "candidates": [{"arm": a, "final_val_loss": v["mean"], "n": v["n"]} for a, v in means.items()],
                     "grown_arms": []}
            groups.append(group)
        group["grown_arms"].append(g["arm"])
    return groups


def compare_arms(arms: list[dict]) -> dict:
    """The paired differences (`paired`) of every arm from its references, from the per-run figures of
    ``summary.json``'s arms alone (the report and scripts/results.py compute them the same way):
    ``{"arms": {label: {"baseline": ..., "matched": ..., "best_equal_flops": ...}}, "best_equal_flops": [...]}``.
    Each reference: its ``arm`` and the paired difference of ``final_val_loss``; against the baseline and
    the matched baseline also ``flops_to_reach``, the FLOPs to reach the reference's final loss as a
    fraction of the reference's FLOPs (the reference's own value: itself reaching its final loss)."""
    by_label = {e["arm"]: e for e in arms}
    best = best_equal_flops(arms)
    out = {}
    for e in arms:
        comps: dict = {}
        refs = {"baseline": ("baseline_arm", "flops_to_baseline_loss"), "matched": ("matched_arm", "flops_to_matched_loss")}
        for name, (ref_key, reach_key) in refs.items():
            if (name == "baseline" and e["kind"] == "baseline") or (name == "matched" and e["kind"] != "grown"):
                continue
            loss, reach, labels = [], [], []
            for m in e["runs"]:
                ref = _by_seed(by_label.get(m.get(ref_key))).get(m["seed"])
                if ref is None:
                    continue
                labels.append(m[ref_key])
                loss.append((m["seed"], m["final_val_loss"], ref["final_val_loss"]))
                reach.append((m["seed"], m.get(reach_key), ref.get(reach_key)))
            if labels:
                comps[name] = {"arm": labels[0] if len(set(labels)) == 1 else ", ".join(dict.fromkeys(labels)),
                               "final_val_loss": paired(loss), "flops_to_reach": paired(reach),
                               "reached": sum(v is not None for _, v, _ in reach), "of": len(reach)}
        group = next((g for g in best if e["arm"] in g["grown_arms"]), None)
        if group is not None:
            ref = _by_seed(by_label[group["arm"]])
            comps["best_equal_flops"] = {"arm": group["arm"], "final_val_loss": paired(
                [(m["seed"], m["final_val_loss"], ref[m["seed"]]["final_val_loss"]) for m in e["runs"] if m["seed"] in ref])}
        out[e["arm"]] = comps
    return {"arms": out, "best_equal_flops": best}


def _arm_entry(label: str, rs: list[Run], several_sources: bool) -> dict:
    a = rs[0].arm
    done = [r for r in rs if r.complete]
    per_run = []
    for r in done:
        m = run_metrics(r, r.base, r.matched)
        if several_sources and r.source != r.dir:
            m["run_dir"] = f"{r.source.name}/{r.dir.name}"
        per_run.append(m)
    bases = [r.base.label for r in done if r.base is not None]
    matched = [r.matched.label for r in done if r.matched is not None and r.matched is not r]
    entry = {"arm": label, "kind": a["kind"], "strategy": a.get("strategy"), "setting": a.get("setting", {}),
             "parameterization": run_parameterization(rs[0]), "size": a.get("size"),
             "baseline_arm": (bases[0] if bases else a.get("baseline_arm")) if a["kind"] != "baseline" else None,
             "matched_arm": matched[0] if matched else None,
             "seeds": [m["seed"] for m in per_run],
             "failed": {str(r.seed): r.failed for r in rs if r.failed},
             "incomplete": [r.seed for r in rs if not r.complete and not r.failed],
             "has_baseline": bool(per_run) and all(m["flops_pct_baseline"] is not None for m in per_run)}
    for key in (*COLUMNS, *EXTRA):
        entry[key] = stat([m[key] for m in per_run])
    entry["flops_to_baseline_loss"]["reached"] = sum(bool(m["reached_baseline_loss"]) for m in per_run)
    entry["flops_to_matched_loss"]["reached"] = sum(bool(m["reached_matched_loss"]) for m in per_run)
    entry["accounting_check"] = all(abs(m["train_flops"] - m["plan_flops"]) <= 1e-9 * max(m["plan_flops"], 1)
                                    for m in per_run)
    entry["runs"] = per_run
    return entry


def summarize(runs: list[Run], out_dir: Path, title: str | None = None) -> dict:
    """The report's figures: one entry per arm (mean ± std over seeds of every column), the sources,
    the command lines and stage plans that made the runs."""
    out_dir = Path(out_dir)
    sources = list(dict.fromkeys(r.source for r in runs))
    arms: dict[str, list[Run]] = {}
    for r in sorted(runs, key=_arm_order(runs)):
        arms.setdefault(r.label, []).append(r)
    entries = [_arm_entry(label, rs, len(sources) > 1) for label, rs in arms.items()]
    compared = compare_arms(entries)
    for e in entries:
        e["comparisons"] = compared["arms"][e["arm"]]
    return {
        "title": title or experiment_title(runs),
        "sweep_dir": str((sources[0] if len(sources) == 1 else out_dir).absolute()),
        "sources": [str(s.absolute()) for s in sources],
        "group": (sources[0] if len(sources) == 1 else out_dir).name,
        "commands": list(dict.fromkeys(r.command for r in runs if r.command)),
        "columns": {k: v[2] for k, v in COLUMNS.items()},
        "statistics": STATISTICS,
        "accounting": ACCOUNTING,
        "scale": scale(runs),
        "arms": entries,
        "best_equal_flops": compared["best_equal_flops"],
        "schedules": schedules(runs),
    }


def _arm_order(runs: list[Run]):
    """Sort key of the runs: baseline, matched baselines, grown arms, equal-FLOPs arms (smallest size first);
    within a kind, the order in which the arms first appear (job order)."""
    first: dict[str, int] = {}
    for i, r in enumerate(runs):
        first.setdefault(r.label, i)

    def key(r: Run):
        kind = r.arm.get("kind")
        rank = KIND_ORDER.index(kind) if kind in KIND_ORDER else len(KIND_ORDER)
        size = r.arm.get("size") if kind == "equal_flops" and r.arm.get("size") is not None else 0
        return rank, size, first[r.label], r.seed
    return key


def scale(runs: list[Run]) -> dict:
    """What the experiment is: the final model's parameters, the baseline's tokens, tokens per parameter,
    the corpus, the seeds, the devices the configs asked for."""
    done = [r for r in runs if r.complete]
    ref = [r for r in done if r.arm.get("kind") == "baseline"] or [r for r in done if r.arm.get("kind") == "grown"]
    params = ref[0].summary.get("params") if ref else None
    tokens = int(ref[0].summary["tokens"]) if ref else None
    cfgs = [r.config for r in runs if r.config]
    return {"params": params, "tokens": tokens,
            "tokens_per_param": tokens / params if params and tokens else None,
            "final_config": ref[0].summary.get("final_config") if ref else None,
            "reference": (ref[0].arm.get("kind") if ref else None),
            "final_sizes": len({json.dumps(r.summary.get("final_config"), sort_keys=True) for r in done
                                if r.arm.get("kind") != "equal_flops"}),
            "corpus": sorted({str(c.get("data", {}).get("name")) for c in cfgs}),
            "seeds": sorted({r.seed for r in runs}),
            "devices": sorted({str(c.get("device")) for c in cfgs}),
            "precision": sorted({str(c.get("precision")) for c in cfgs})}


def experiment_title(runs: list[Run]) -> str:
    """What the runs are, from their configs: 'zero, random vs the baseline: growing to 50.5k parameters
    on 29.7k tokens of stdlib'."""
    from grow.console import fmt_num

    done = [r for r in runs if r.complete]
    grown = list(dict.fromkeys(r.arm.get("strategy") or r.arm.get("kind") or r.label for r in runs
                               if r.arm.get("kind") not in ("baseline", "matched")))
    what = ", ".join(grown[:4]) + (f" and {len(grown) - 4} more" if len(grown) > 4 else "")
    if any(r.arm.get("kind") == "baseline" for r in runs):
        what = f"{what} vs the baseline" if what else "the fixed-size baseline"
    if any(r.arm.get("kind") == "matched" for r in runs):
        what += " (also in each strategy's own parameterization)"
    params = sorted({int(r.summary["params"]) for r in done if "params" in r.summary
                     and r.arm.get("kind") != "equal_flops"})
    tokens = sorted({int(r.summary["tokens"]) for r in done if r.arm.get("kind") != "equal_flops"})
    data = sorted({str((r.config or {}).get("data", {}).get("name")) for r in runs if r.config})
    size = (f"{fmt_num(params[0])} parameters" if len(params) == 1 else
            f"{fmt_num(params[0])}–{fmt_num(params[-1])} parameters" if params else "")
    budget = (f"{fmt_num(tokens[0])} tokens" if len(tokens) == 1 else
              f"{fmt_num(tokens[0])}–{fmt_num(tokens[-1])} tokens" if tokens else "")
    on = " on ".join(p for p in (size, budget) if p)
    corpus = f" of {', '.join(data)}" if data and budget else ""
    return f"{what}: {'growing to ' if grown else ''}{on}{corpus}" if on else what


def schedules(runs: list[Run]) -> list[dict]:
    """The distinct stage plans of the grown runs, each with the arms that used it; stages numbered from 1."""
    plans: dict[str, dict] = {}
    for r in runs:
        if r.arm.get("kind") != "grown":
            continue
        stages = (r.summary or {}).get("stage_plan") or r.arm.get("plan") or []
        rows = [{"stage": i, "config": s["config"], "batch_size": s["batch_size"], "steps": s["steps"],
                 "tokens": s["tokens"], "flops": s["flops"], "params": s.get("params")}
                for i, s in enumerate(stages, start=1)]
        if not rows:
            continue
        key = json.dumps(rows, sort_keys=True)
        plans.setdefault(key, {"arms": [], "stages": rows})
        if r.label not in plans[key]["arms"]:
            plans[key]["arms"].append(r.label)
    return list(plans.values())


# ---- output --------------------------------------------------------------------------------------


def _si(x: float) -> str:
    from grow.console import fmt_num

    return fmt_num(x)


def fmt_stat(s: dict, how: str, *, baseline_missing: bool = False) -> str:
    """'3.412 ± 0.012', '41.3% ± 0.2', '0.62 (2/3 reached)', '—'."""
    if s["mean"] is None:
        if how in ("pct", "frac") and baseline_missing:
            return "n/a"
        if s.get("reached") == 0 and s["values"]:
            return f"— (0/{len(s['values'])} reached)"
        return "—"
    mean, std = s["mean"], s["std"]
    if how == "loss":
        text, err = f"{mean:.4f}", (f"{std:.4f}" if std is not None else None)
    elif how == "pct":
        text, err = f"{mean:.1f}%", (f"{std:.1f}" if std is not None else None)
    elif how == "frac":
        text, err = f"{mean:.3f}", (f"{std:.3f}" if std is not None else None)
    elif how == "count":
        text, err = f"{mean:g}", (f"{std:.2g}" if std is not None else None)
    elif how == "sec":
        text, err = f"{mean:.2f}", (f"{std:.2f}" if std is not None else None)
    else:
        text, err = _si(mean), (_si(std) if std is not None else None)
    out = text if err is None else f"{text} ± {err}"
    if "reached" in s and s["reached"] < len(s["values"]):
        out += f" ({s['reached']}/{len(s['values'])} reached)"
    return out


def _steps_note(entry: dict) -> str:
    """' (@5 steps)' or ' (@3–5 steps)': when a recovery was measured."""
    steps = [v for m in entry["runs"] for v in m["recovery_steps_each"] if v is not None]
    if entry["mean_recovery"]["mean"] is None or not steps:
        return ""
    lo, hi = int(min(steps)), int(max(steps))
    return f" (@{lo} steps)" if lo == hi else f" (@{lo}–{hi} steps)"


def _seeds_cell(e: dict) -> str:
    """'0,1,2', or '0 (failed: 1) (unfinished: 2)'."""
    seeds = ",".join(map(str, e["seeds"])) or "-"
    if e["failed"]:
        seeds += f" (failed: {','.join(e['failed'])})"
    if e["incomplete"]:
        seeds += f" (unfinished: {','.join(map(str, e['incomplete']))})"
    return seeds


def table_rows(summary: dict) -> tuple[list[str], list[list[str]]]:
    headers = ["arm", "seeds", *(v[0] for v in COLUMNS.values())]
    rows = []
    for e in summary["arms"]:
        seeds = _seeds_cell(e)
        missing = not e["has_baseline"]
        cells = {k: fmt_stat(e[k], how, baseline_missing=missing) for k, (_, how, _) in COLUMNS.items()}
        cells["mean_recovery"] += _steps_note(e)
        rows.append([e["arm"], seeds, *cells.values()])
    return headers, rows


def print_table(summary: dict, out_dir: Path) -> None:
    from rich.markup import escape
    from rich.table import Table

    from grow.console import console

    headers, rows = table_rows(summary)
    table = Table(title=escape(summary["title"]),
                  caption="mean ± std over seeds; % and fractions against the baseline of the same seed; "
                          "— never reached; n/a no baseline")
    for i, h in enumerate(headers):
        table.add_column(h, justify="left" if i < 2 else "right")
    for row in rows:
        table.add_row(*(escape(str(c)) for c in row))
    console.print(table)
    comps = compare_arms(summary["arms"])
    if any(comps["arms"].values()):
        headers, rows = loss_rows(summary, comps)
        table = Table(title="final validation loss: differences from the references, paired by seed",
                      caption="Δ = mean over seeds of (arm - reference) ± its standard error; t = Δ / SE (n - 1 dof)")
        for i, h in enumerate(headers):
            table.add_column(h, justify="left" if i < 2 else "right")
        for row in rows:
            table.add_row(*(escape(str(c)) for c in row))
        console.print(table)
    for g in comps["best_equal_flops"]:
        console.print(escape(f"best fixed size at equal FLOPs: {g['arm']} (mean final loss {g['final_val_loss']:.4f})"))
    console.print(escape(f"report: {Path(out_dir) / 'report.md'}"))


def _md_table(headers: list[str], rows: list[list[str]]) -> str:
    esc = lambda s: str(s).replace("|", "\\|")
    lines = ["| " + " | ".join(map(esc, headers)) + " |", "|" + "---|" * len(headers)]
    lines += ["| " + " | ".join(map(esc, r)) + " |" for r in rows]
    return "\n".join(lines)


# ---- the tables of results: report.md and docs/results.md (scripts/results.py), from summary.json alone ----


def fmt_diff(p: dict | None, digits: int = 4) -> str:
    """A paired difference: '-0.1530 ± 0.0120' (mean ± SE), '-0.1530 (n=1)', '—' (no pair)."""
    if not p or not p["n"]:
        return "—"
    text = f"{p['mean']:+.{digits}f}"
    return f"{text} (n=1)" if p["se"] is None else f"{text} ± {p['se']:.{digits}f}"


def fmt_t(p: dict | None) -> str:
    """t = mean / SE of a paired difference: '-12.8'; 'n=1'; '—' (no pair, or SE = 0)."""
    if not p or not p["n"]:
        return "—"
    if p["n"] == 1:
        return "n=1"
    return "—" if p["t"] is None else f"{p['t']:+.1f}"


def _runs_stat(e: dict, key: str, reached: str | None = None) -> dict:
    """`stat` of one per-run figure of an arm, recomputed from summary.json's per-run values."""
    st = stat([m.get(key) for m in e["runs"]])
    if reached:
        st["reached"] = sum(bool(m.get(reached)) for m in e["runs"])
    return st


def _scale_line(summary: dict) -> list[str]:
    sc = summary.get("scale") or {}
    if not sc.get("params"):
        return []
    fc = sc.get("final_config") or {}
    dims = (f" (N={fc['n_layers']} h={fc['d_model']} E={fc['n_heads']} k={fc['d_qk']} v={fc['d_v']} p={fc['d_ff']} "
            f"s={fc['seq_len']} V={fc['vocab_size']})" if fc else "")
    seeds = sc.get("seeds") or []
    what = ("Final model" if (sc.get("final_sizes") or 1) <= 1 else
            f"Final models of {sc['final_sizes']} sizes (the {sc.get('reference') or 'first'} run's)")
    return [f"{what}: {_si(sc['params'])} parameters{dims}; {_si(sc['tokens'])} training tokens "
            f"({sc['tokens_per_param']:.2f} tokens per parameter, embeddings included); corpus "
            f"{', '.join(sc.get('corpus') or ['?'])}; seeds {','.join(map(str, seeds))}; device "
            f"{', '.join(sc.get('devices') or ['?'])}, precision {', '.join(sc.get('precision') or ['?'])}.", ""]


def loss_rows(summary: dict, comps: dict | None = None) -> tuple[list[str], list[list[str]]]:
    """The final-loss table: per arm, mean ± std and the paired differences from the baseline, the
    baseline in its own parameterization and the best fixed size at equal FLOPs, each with its t."""
    comps = comps or compare_arms(summary["arms"])
    best = {g["arm"] for g in comps["best_equal_flops"]}
    rows = []
    for e in summary["arms"]:
        c = comps["arms"][e["arm"]]
        cells = [e["arm"], _seeds_cell(e), fmt_stat(_runs_stat(e, "final_val_loss"), "loss")]
        for ref, is_ref in (("baseline", e["kind"] == "baseline"), ("matched", e["kind"] == "matched"),
                            ("best_equal_flops", e["arm"] in best)):
            p = (c.get(ref) or {}).get("final_val_loss")
            cells += ["reference", ""] if is_ref and e["runs"] else [fmt_diff(p), fmt_t(p)]
        rows.append(cells)
    return ["arm", "seeds", "final val loss", "Δ vs baseline", "t", "Δ vs baseline in own parameterization", "t",
            "Δ vs best fixed size at equal FLOPs", "t"], rows


def results_tables(summary: dict, images: str | None = None) -> list[str]:
    """The tables of results as markdown lines, from ``summary.json`` alone (the per-run figures of its
    arms; the statistics recomputed with `stat` and `compare_arms`): final validation loss with the
    paired differences from the baseline, the baseline in the arm's own parameterization and the best
    fixed size at equal FLOPs; FLOPs and wall-clock as % of the baseline; FLOPs to reach the baseline's
    final loss; the largest |Δloss| at a growth. ``images``: a directory to link the two plots from."""
    arms = [e for e in summary["arms"] if e["runs"]]
    comps = compare_arms(summary["arms"])
    cmp = lambda e, ref: comps["arms"][e["arm"]].get(ref) or {}
    ns = sorted({p["n"] for e in arms for c in comps["arms"][e["arm"]].values() for p in [c["final_val_loss"]]})
    dofs = [n - 1 for n in ns if n > 1]
    crit = "; ".join(f"|t| > {T_975[d]:.2f} at n = {d + 1}" for d in dofs if d in T_975)
    lines = [*_scale_line(summary)]

    headers, rows = loss_rows(summary, comps)
    lines += ["**Final validation loss** (nats per token). Mean ± sample std (n − 1) over seeds. Each Δ is the "
              "difference from a reference paired by seed (every arm of a seed has the same initialization and "
              "token streams): d_s = arm_s − reference_s, shown as mean(d) ± SE, SE = sd(d)/√n; t = mean(d)/SE, the "
              "difference in units of its standard error (Student's t, n − 1 degrees of freedom"
              + (f"; two-sided 5% level: {crit}" if crit else "") + "); n=1: one seed, no SE. Negative: lower loss "
              "than the reference.", "",
              _md_table(headers, rows), ""]
    own = {}
    for e in arms:
        ref = cmp(e, "matched").get("arm")
        if ref and e["kind"] == "grown":
            own.setdefault(ref, []).append(e["arm"])
    for ref, names in own.items():
        lines += [f"Baseline in own parameterization: {', '.join(names)} against `{ref}` (the final model from "
                  "scratch on the same tokens, initialized by the strategy's parameterization).", ""]
    if any(e["kind"] == "grown" for e in arms) and not own:
        lines += ["Baseline in own parameterization: none of these strategies has one (they keep the model's own "
                  "initializer, so `baseline` is theirs).", ""]
    for g in comps["best_equal_flops"]:
        cands = ", ".join(f"`{c['arm']}` {c['final_val_loss']:.4f}" for c in g["candidates"])
        lines += [f"Best fixed size at equal FLOPs: **`{g['arm']}`**, mean final loss {g['final_val_loss']:.4f} over "
                  f"{g['n']} seed(s), the lowest of the fixed sizes trained on the grown arms' plan FLOPs ({cands}); "
                  "it is picked on the same seeds it is compared on, which favours it slightly.", ""]

    rows = []
    for e in arms:
        loads = [float(v) for m in e["runs"] for v in (m.get("load_average") or [])]
        rows.append([e["arm"], fmt_stat(_runs_stat(e, "flops"), "si"),
                     fmt_stat(_runs_stat(e, "flops_pct_baseline"), "pct", baseline_missing=not e["has_baseline"]),
                     fmt_stat(_runs_stat(e, "train_seconds"), "sec"),
                     fmt_stat(_runs_stat(e, "time_pct_baseline"), "pct", baseline_missing=not e["has_baseline"]),
                     f"{min(loads):.1f}–{max(loads):.1f}" if loads else "—"])
    loads = [float(v) for e in arms for m in e["runs"] for v in (m.get("load_average") or [])]
    lines += ["**Cost.** Training FLOPs (every stage, plus the growth strategies' own passes) and training wall-clock "
              "(steps and growths, compile time apart) as % of the baseline of the same seed, mean ± std. FLOPs are "
              "counted and do not depend on the machine; wall-clock does: "
              + (f"the 1-minute load average was {min(loads):.1f}–{max(loads):.1f} while these runs ran (per arm, at "
                 "each run's start and end, in the last column), and other processes on a loaded machine take time "
                 "from a run." if loads else "the machine's load was not recorded for these runs."), "",
              _md_table(["arm", "FLOPs", "FLOPs % baseline", "train s", "wall-clock % baseline", "load average"], rows),
              ""]

    rows = []
    for e in arms:
        b, m = cmp(e, "baseline"), cmp(e, "matched")
        own_reach = (fmt_stat(_runs_stat(e, "flops_to_matched_loss", "reached_matched_loss"), "frac")
                     if e["kind"] == "grown" and m else "—")
        rows.append([e["arm"], fmt_stat(_runs_stat(e, "flops_to_baseline_loss", "reached_baseline_loss"), "frac",
                                        baseline_missing=not e["has_baseline"]),
                     fmt_diff(b.get("flops_to_reach"), 3), fmt_t(b.get("flops_to_reach")),
                     own_reach,
                     fmt_diff(m.get("flops_to_reach"), 3), fmt_t(m.get("flops_to_reach"))])
    lines += ["**FLOPs to reach the baseline's final loss**, as a fraction of the baseline's FLOPs (same seed): the "
              "first point of the arm's validation curve (evaluations, and the loss before and after each growth, "
              "against cumulative FLOPs) at or below the baseline's final validation loss, interpolated linearly "
              "from the point before; its resolution is that of the evaluations. — never reached, (k/n reached) "
              "when some seeds did not. Δ: paired by seed against the reference's own value (the reference "
              "reaching its own final loss, 1.000 unless its curve dipped below it earlier), over the seeds where "
              "both reached it. The last three columns do the same against the baseline in the arm's own "
              "parameterization.", "",
              _md_table(["arm", "FLOPs to baseline's loss", "Δ vs baseline", "t", "FLOPs to own-parameterization "
                         "baseline's loss", "Δ", "t"], rows), ""]

    rows = []
    for e in arms:
        if e["kind"] != "grown":
            continue
        rows.append([e["arm"], fmt_stat(_runs_stat(e, "growths"), "count"),
                     fmt_stat(_runs_stat(e, "max_abs_growth_delta"), "loss"),
                     fmt_stat(_runs_stat(e, "mean_recovery"), "loss") + _steps_note(e)])
    if rows:
        lines += ["**Growths.** The largest |validation loss after − before| over a run's growths (0: the growth "
                  "kept the function), and the mean change of the validation loss since each growth, measured the "
                  "given number of steps after it (negative: recovering), mean ± std over seeds.", "",
                  _md_table(["arm", "growths", "largest |Δloss| at a growth", "mean recovery"], rows), ""]
    if images is not None:
        lines += [f"![validation loss vs FLOPs]({images}/loss_vs_flops.png)", "",
                  f"![validation loss vs wall-clock]({images}/loss_vs_time.png)", ""]
    return lines


def _dims(c: dict, prev: dict | None = None) -> list[str]:
    from grow.console import DIM_LETTERS

    return [f"**{c[f]}**" if prev is not None and prev[f] != c[f] else str(c[f]) for f in DIM_LETTERS]


def _schedule_md(summary: dict) -> list[str]:
    from grow.console import DIM_LETTERS, LEGEND

    lines = []
    for plan in summary["schedules"]:
        total = sum(s["flops"] for s in plan["stages"]) or 1
        rows, prev = [], None
        for s in plan["stages"]:
            rows.append([s["stage"], *_dims(s["config"], prev), _si(s["params"]) if s["params"] else "—",
                         s["batch_size"], s["steps"], _si(s["tokens"]), _si(s["flops"]),
                         f"{100.0 * s['flops'] / total:.1f}%"])
            prev = s["config"]
        lines += [f"Stage plan of {', '.join(plan['arms'])} (bold: grown at the start of the stage):", "",
                  _md_table(["stage", *DIM_LETTERS.values(), "params", "batch", "steps", "tokens", "FLOPs",
                             "% FLOPs"], rows), ""]
    if lines:
        lines += [f"{LEGEND}.", ""]
    return lines


def _load_note(summary: dict) -> list[str]:
    loads = [(e["arm"], m["seed"], m["load_average"]) for e in summary["arms"] for m in e["runs"]
             if m.get("load_average")]
    if not loads:
        return ["The machine's load was not recorded for these runs. Wall-clock figures (train s, time % base) "
                "depend on what else the machine was doing; FLOPs are counted and do not.", ""]
    values = [float(v) for _, _, la in loads for v in la]
    return [f"Wall-clock figures (train s, time % base) were measured while the machine's 1-minute load average "
            f"was between {min(values):.1f} and {max(values):.1f} (per run at its start → end in the Runs table). "
            "On a loaded machine other processes take CPU time from a run, so two arms of equal FLOPs can differ in "
            "time % base; FLOPs are counted and do not depend on the load.", ""]


def _growth_rows(runs: list[Run]) -> list[list]:
    """One row per growth of every complete run: the stages it joins (numbered from 1), the validation
    loss before and after, Δ, the recovery and its steps, and a note when a figure hit its grid's edge."""
    from grow.console import edge_message, fmt_delta, grid_edge_hits

    labels = list(dict.fromkeys(r.label for r in runs))
    rows = []
    for r in sorted((r for r in runs if r.complete), key=lambda r: (labels.index(r.label), r.seed)):
        for i, ev in enumerate(r.summary.get("growth_events") or [], start=1):
            rec, steps = ev.get("growth/recovery"), ev.get("growth/recovery_steps")
            rows.append([r.label, r.seed, f"{i} → {i + 1}", f"{ev['growth/loss_before']:.4f}",
                         f"{ev['growth/loss_after']:.4f}", fmt_delta(float(ev["growth/delta"])),
                         "—" if rec is None else fmt_delta(float(rec)) + (f" @{int(steps)}" if steps else ""),
                         "; ".join(edge_message(h) for h in grid_edge_hits(ev))])
    return rows


def _final_dims(fc: dict) -> str:
    return (f"N={fc['n_layers']} h={fc['d_model']} E={fc['n_heads']} k={fc['d_qk']} v={fc['d_v']} p={fc['d_ff']} "
            f"s={fc['seq_len']} V={fc['vocab_size']}")


def report_markdown(summary: dict, runs: list[Run]) -> str:
    headers, rows = table_rows(summary)
    lines = [f"# {summary['title']}", ""]
    finals = list(dict.fromkeys(_final_dims(r.summary["final_config"]) for r in runs if r.complete))
    if finals:  # one final model, or each of the runs' different ones
        label = "Final model" if len(finals) == 1 else f"Final models ({len(finals)} sizes)"
        lines += [f"{label}: {'; '.join(finals)}. Runs from: {', '.join(f'`{s}`' for s in summary['sources'])}.", ""]
    if summary["commands"]:
        lines += ["Made by:", "", "```bash", *summary["commands"], "```", ""]
    lines += _schedule_md(summary)
    lines += [_md_table(headers, rows), "",
              "Mean ± sample standard deviation (n − 1) over seeds. \"% base\" and \"FLOPs to base loss\" are "
              "taken per seed against the baseline of the same seed, then averaged; — never reached; n/a no "
              "baseline among the runs.", "", "## Compared with the references", "", *results_tables(summary),
              "## Columns", ""]
    lines += [f"- **{h}** (`{k}`): {d}." for k, (h, _, d) in COLUMNS.items()]
    lines += ["", "## How costs are counted", "", ACCOUNTING, ""]
    bad = [e["arm"] for e in summary["arms"] if e["runs"] and not e["accounting_check"]]
    lines += [("Check: every run's counted training FLOPs equal its stage plan's (`grow schedule`)." if not bad else
               f"Check FAILED: counted training FLOPs differ from the stage plan for {', '.join(bad)}."), ""]
    lines += ["## Wall-clock", "", *_load_note(summary)]
    lines += ["## Runs", ""]
    run_headers = ["arm", "seed", "dir", "final val loss", "tokens", "FLOPs", "growth FLOPs", "train s", "compile s",
                   "wall s", "load avg", "growths", "FLOPs to base loss"]
    run_rows = []
    for e in summary["arms"]:
        for m in e["runs"]:
            reach, load = m["flops_to_baseline_loss"], m.get("load_average")
            run_rows.append([e["arm"], m["seed"], f"`{m['run_dir']}`", f"{m['final_val_loss']:.4f}", _si(m["tokens"]),
                             _si(m["flops"]), _si(m["growth_flops"]), f"{m['train_seconds']:.2f}",
                             f"{m['compile_seconds']:.2f}", f"{m['wall_seconds']:.1f}",
                             " → ".join(f"{float(v):.1f}" for v in load) if load else "—", m["growths"],
                             "—" if reach is None else f"{reach:.3f}"])
    lines += [_md_table(run_headers, run_rows), ""]
    growth_rows = _growth_rows(runs)
    if growth_rows:
        lines += ["## Growths", "",
                  "Each growth ends a stage and enters the next (stages numbered from 1); recovery is the "
                  "validation-loss change since the growth, @ the steps after it at which it was measured.", "",
                  _md_table(["arm", "seed", "stages", "val loss before", "after", "Δ", "recovery", "note"],
                            growth_rows), ""]
    lines += ["## Curves", "",
              "Validation loss (lines with markers; training loss faint) against cumulative FLOPs and against "
              "training wall-clock; a vertical dotted segment and a triangle mark each growth (loss before → after).",
              "", "![loss vs FLOPs](loss_vs_flops.png)", "", "![loss vs time](loss_vs_time.png)", ""]
    return "\n".join(lines)


def plot(runs: list[Run], path: Path, axis: str, summary: dict) -> None:
    """Validation (and faint training) loss of every run against FLOPs or seconds; growths marked."""
    import matplotlib
    from matplotlib.figure import Figure

    fig = Figure(figsize=(11, 5.5), layout="constrained")
    ax = fig.subplots()
    labels = list(dict.fromkeys(r.label for r in runs if r.complete))
    palette = matplotlib.colormaps["tab10" if len(labels) <= 10 else "tab20"].colors
    colors = {lab: palette[i % len(palette)] for i, lab in enumerate(labels)}
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
        growth = [(pts[i], pts[i + 1]) for i in range(len(pts) - 1) if pts[i][3] == "before"]
        if pts:  # fixed-size runs (baselines, equal-FLOPs sizes) dashed, grown runs solid
            ax.plot([p[xi] for p in pts], [p[1] for p in pts], color=c, marker="o", ms=3, lw=1.4,
                    ls="-" if growth else "--", label=r.label if first else None)
        for before, after in growth:
            ax.plot([before[xi], after[xi]], [before[1], after[1]], color=c, ls=":", lw=1.2)
            ax.plot([after[xi]], [after[1]], color=c, marker="^", ms=7, mec="black", mew=0.5)
    baselines = [e["final_val_loss"]["mean"] for e in summary["arms"]
                 if e["kind"] == "baseline" and e["final_val_loss"]["mean"] is not None]
    for loss in baselines:
        ax.axhline(loss, color="gray", ls="--", lw=0.8)
    if baselines:  # no legend entry for a line that is not drawn
        ax.plot([], [], color="gray", ls="--", lw=0.8, label="baseline final loss")
    ax.plot([], [], color="gray", ls="", marker="^", ms=7, mec="black", mew=0.5, label="growth (loss after)")
    ax.set_xlabel("cumulative training FLOPs (with growth passes)" if axis == "flops"
                  else "training wall-clock, s (compile time apart)")
    ax.set_ylabel("validation loss")
    ax.set_title(textwrap.fill(summary["title"], 110) + ("\nvalidation loss vs FLOPs" if axis == "flops" else
                 "\nvalidation loss vs wall-clock" + _load_caption(summary)), fontsize=9)
    ax.grid(alpha=0.3)
    ax.legend(fontsize=8, loc="upper left", bbox_to_anchor=(1.01, 1.0))
    fig.savefig(path, dpi=120)


def _load_caption(summary: dict) -> str:
    values = [float(v) for e in summary["arms"] for m in e["runs"] for v in (m.get("load_average") or [])]
    if not values:
        return " (machine load not recorded)"
    return f" (machine load average {min(values):.1f}–{max(values):.1f})"


def log_wandb(summary: dict, out_dir: Path, logger_cfg: dict) -> None:
    """One W&B run in the sweep's group with the summary table and the two plots (`grow.logging.wandb_mode`:
    WANDB_MODE, or offline without credentials; never W&B's login prompt)."""
    from grow.logging import wandb_mode

    mode, _ = wandb_mode()
    if mode == "disabled":
        return
    from grow.console import console
    from grow.logging import server_url, unreachable

    timeout = float(logger_cfg.get("init_timeout") or 10.0)
    if mode == "online" and unreachable(server_url(), timeout):
        mode = "offline"  # the runs said so already, each in one line

    try:
        import wandb

        headers, rows = table_rows(summary)
        run = wandb.init(project=logger_cfg.get("project", "grow"), entity=logger_cfg.get("entity"),
                         group=logger_cfg.get("group") or summary["group"], name="compare-report",
                         job_type="compare-report", dir=str(out_dir), config={"sweep_dir": summary["sweep_dir"]},
                         mode=mode)
        try:
            data = {"compare/summary": wandb.Table(columns=headers, data=rows)}
            headers, rows = loss_rows(summary)
            data["compare/differences"] = wandb.Table(columns=headers, data=rows)
            for name in ("loss_vs_flops", "loss_vs_time"):
                if (out_dir / f"{name}.png").exists():
                    data[f"compare/{name}"] = wandb.Image(str(out_dir / f"{name}.png"))
            run.log(data)
        finally:
            run.finish()
    except Exception as exc:  # noqa: BLE001 - W&B is a copy; the files are the record
        console.print(f"compare: W&B report table not logged: {str(exc).splitlines()[0] if str(exc) else exc}",
                      markup=False)


def default_out_dir(root: Path | str = "outputs/report") -> Path:
    return Path(root) / time.strftime("%Y-%m-%d_%H-%M-%S")


def build_report(paths: list[Path], out_dir: Path, *, title: str | None = None, key: str = "runs",
                 logger_cfg: dict | None = None, show: bool = True) -> dict:
    """Write summary.json, report.md and the two plots of the runs in ``paths`` into ``out_dir``; print
    the table; returns the summary. ``out_dir`` may be a sweep directory, never a run directory (whose
    own summary.json it would overwrite)."""
    out_dir = Path(out_dir)
    if is_run_dir(out_dir):
        raise ConfigError("out" if key == "runs" else key, str(out_dir),
                          "is a run directory: the report would overwrite its summary.json (write the report "
                          "elsewhere: grow report runs=[<dir>] out=<new dir>)")
    runs = collect(list(paths), key)
    summary = summarize(runs, out_dir, title)
    out_dir.mkdir(parents=True, exist_ok=True)
    (out_dir / "summary.json").write_text(json.dumps(summary, indent=2))
    (out_dir / "report.md").write_text(report_markdown(summary, runs))
    plot(runs, out_dir / "loss_vs_flops.png", "flops", summary)
    plot(runs, out_dir / "loss_vs_time.png", "time", summary)
    if show:
        print_table(summary, out_dir)
    if logger_cfg is not None:
        log_wandb(summary, out_dir, logger_cfg)
    return summary
