"""Per-run figures, per-arm statistics over seeds, and the paired differences between arms.

Per arm: mean and sample standard deviation over seeds (`COLUMNS`). Differences from a reference
(`paired`, `compare_arms`): paired t where the arms share an initialization (`shares_init`), else
Welch, each with its 95% interval, p, TOST and Holm within its family; FLOPs to reach a loss
(`flops_to_reach`) and the recovery control. The maths: docs/statistics.md, "The report's statistics".
"""

from __future__ import annotations

import json
import math
import statistics
from pathlib import Path

import numpy as np

from grow.branches import read_branches
from grow.console import fmt_num
from grow.provenance import describe, describe_machine
from grow.report.collect import run_parameterization
from grow.report.frontier import effective_compute
from grow.report.inference import (
    ALPHA,
    MARGIN,
    POWER,
    blocked_difference,
    holm,
    min_detectable_effect,
    paired_test,
    seed_blocked,
    tost,
    welch_test,
)
from grow.runs import FoundRun

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
                               "fraction of the baseline's FLOPs (null: never reached); per arm the median over "
                               "seeds, a seed that never reached it counted as not reached"),
    "max_abs_growth_delta": ("max |Δ| growth", "loss", "largest |loss after - loss before| over the growths"),
    "mean_recovery": ("mean recovery", "loss",
                      "mean over growths of the validation-loss change since the growth, measured "
                      "growth/recovery_steps steps after it (min(trainer.recovery_steps, steps left in the "
                      "stage); the cell says how many)"),
}


EXTRA = ("tokens", "train_flops", "growth_flops", "plan_flops", "wall_seconds", "growths", "recovery_steps",
         "recovery_vs_baseline", "epochs",
         "flops_to_matched_loss", "params", "budget_flops", "full_val_loss", "full_val_flops")


KIND_ORDER = ("baseline", "matched", "grown", "equal_flops")  # the order of the arms in the report


ACCOUNTING = (
    "FLOPs: per stage, the stage model's training FLOPs per token (6 x matmul weights + 6 N s E (k + v), "
    "docs/design.md) times the tokens it trains, summed over stages (grow.plan.training_flops, the code of "
    "`grow schedule`), plus the FLOPs every growth strategy spends on its own passes (statistics, line "
    "search); validation passes are not counted. Wall-clock: training steps and growths; torch.compile time "
    "apart; evaluations and start-up not included. FLOPs to reach the baseline's final loss: the first point of "
    "the validation curve (val/loss records and the losses before and after each growth, in order, against "
    "cumulative FLOPs) at or below it, interpolated linearly from the point before; — when never reached. "
    "equal_flops (equal_flops size=s<k>): the final model (stage k's model as the grown run has it, rotary table "
    "anchored at the final k) from scratch on floor(plan FLOPs / "
    "(FLOPs per step of that model)) steps, the growth passes left out of the budget."
)


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


def _reach(run: FoundRun, ref: FoundRun) -> float | None:
    """FLOPs for ``run``'s validation curve to reach ``ref``'s final loss, as a fraction of ``ref``'s FLOPs."""
    reach = flops_to_reach(curve(run.records), float(ref.summary["final_val_loss"]))
    return None if reach is None else reach / float(ref.summary["flops"])


def expected_flops(run: FoundRun) -> float:
    """The training FLOPs a run should have counted: its stage plan's (``grow schedule``), or under a
    growth trigger (whose stages end when it fires) each planned stage's FLOPs per token (its FLOPs over
    its tokens: the frozen count under ``trainer.train_new_only``, docs/costs.md) times the tokens that stage
    trained (``stages_trained`` in summary.json), recomputed here."""
    s = run.summary
    trained = s.get("stages_trained") or []
    if not s.get("trigger") or str(s["trigger"]).startswith("fixed") or not trained:
        return float(run.arm.get("plan_flops", float("nan")))
    per_token = [int(st["flops"]) // int(st["tokens"]) for st in s["stage_plan"]]  # exact: flops = rate x tokens
    return float(sum(per_token[t["stage"] - 1] * t["tokens"] for t in trained))


def _train_curve(records: list[dict]) -> list[tuple[float, float]]:
    """(step, training loss) of every log point, in step order."""
    pts = {float(r["train/step"]): float(r["train/loss"]) for r in records if "train/loss" in r and "train/step" in r}
    return sorted(pts.items())


def _loss_at(curve: list[tuple[float, float]], step: float) -> float | None:
    """The training loss at ``step``, linear between the log points around it; None outside them."""
    for (s0, l0), (s1, l1) in zip(curve, curve[1:]):
        if s0 <= step <= s1:
            return l0 if s1 == s0 else l0 + (l1 - l0) * (step - s0) / (s1 - s0)
    return curve[0][1] if curve and curve[0][0] == step else None


def recovery_vs_baseline(run: FoundRun, base: FoundRun | None) -> float | None:
    """The recovery after a growth against a run that did not grow: per growth at step g measured r steps
    later, (the run's training loss at g + r - at g) - (the baseline's, same seed, at the same steps),
    each interpolated between log points; the mean over growths. The baseline trains on the same batches
    at the same steps (same seed and token stream), so the difference is the part of the recovery that
    ordinary training over those steps does not give; negative: the grown run fell faster. The training
    loss (logged every ``trainer.log_every`` steps) and not the validation loss, which a baseline measures
    only every ``trainer.eval_every`` steps. None without a baseline, a growth with a recovery, or log
    points around both steps."""
    if base is None:
        return None
    mine, theirs = _train_curve(run.records), _train_curve(base.records)
    diffs = []
    for e in run.summary.get("growth_events") or []:
        g, r = e.get("train/step"), e.get("growth/recovery_steps")
        if g is None or r is None:
            continue
        ends = [_loss_at(c, x) for c in (mine, theirs) for x in (float(g), float(g) + float(r))]
        if None not in ends:
            diffs.append((ends[1] - ends[0]) - (ends[3] - ends[2]))
    return _mean(diffs)


def run_metrics(run: FoundRun, base: FoundRun | None, matched: FoundRun | None = None) -> dict:
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
        "full_val_loss": s.get("full_val_loss"), "full_val_flops": s.get("full_val_flops"),
        "tokens": int(s["tokens"]), "flops": float(s["flops"]), "train_flops": float(s["train_flops"]),
        "growth_flops": float(s["growth_flops"]), "plan_flops": expected_flops(run),
        "train_seconds": float(s["train_seconds"]), "compile_seconds": float(s["compile_seconds"]),
        "wall_seconds": float(s["wall_seconds"]), "growths": len(events),
        "max_abs_growth_delta": max(deltas) if deltas else None,
        "mean_recovery": _mean([float(e["growth/recovery"]) for e in recovered]),
        "recovery_vs_baseline": recovery_vs_baseline(run, base) if events else None,
        "recovery_steps": _mean(steps), "recovery_steps_each": [e.get("growth/recovery_steps") for e in recovered],
        "load_average": s.get("load_average"), "params": s.get("params"), "machine": describe_machine(s.get("machine")),
        "epochs": (s.get("data") or {}).get("epochs"),
        "size": run.arm.get("size"), "budget_flops": run.arm.get("budget_flops"),
        "baseline_arm": None if base is None else base.label, "matched_arm": None if matched is None else matched.label,
        "flops_pct_baseline": None, "time_pct_baseline": None, "flops_to_baseline_loss": None,
        "reached_baseline_loss": None, "flops_to_matched_loss": None, "reached_matched_loss": None,
        "decay_branches": read_branches(run.dir),  # optim.decay_branches: fixed-size budgets of this run (grow.branches)
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


STATISTICS = ("mean and sample standard deviation (n - 1) over seeds; std null with one seed; ratios per seed "
              "against the baseline of the same seed. Differences from a reference: paired t (d_s = arm_s - "
              "reference_s, n - 1 dof) where the two arms share an initialization (fixed-size arms of one shape "
              "and initializer), Welch's unpaired t (Welch-Satterthwaite dof) otherwise, on the seeds both "
              "finished (scipy.stats); the 95% interval mean ± t_0.975(dof) SE; tost_p: two one-sided tests of "
              "|difference| < margin (statsmodels); p_holm: p adjusted by Holm's step-down correction within its "
              "family (headline: each operator at its tuned setting against the best fixed size; other: the "
              "rest). FLOPs to reach a loss are censored: differenced only when every seed reached it on both "
              "sides, summarized per arm by the median with the unreached counted as not reached. seed_blocked: the "
              "additive model loss = arm + seed + error over the seeds the grown arms and their best fixed sizes "
              "share (those arms, with those seeds, in it), residual SD with (A - 1)(S - 1) dof, each grown arm "
              "against its best fixed size and its baseline with SE = SD sqrt(2/S) and TOST. mde: the "
              "difference two arms of n seeds detect at alpha 0.05 with power 0.8, from the pooled SD. "
              "effective_compute: grow.report.frontier (docs/statistics.md)")


def _finite_pairs(pairs) -> list[tuple[int, float, float]]:
    return [(int(seed), float(a), float(r)) for seed, a, r in pairs
            if a is not None and r is not None and math.isfinite(float(a)) and math.isfinite(float(r))]


def paired(pairs, shared_init: bool = True) -> dict:
    """The difference of an arm from a reference over seeds: ``pairs`` is [(seed, arm value, reference
    value)]; a pair with a missing or non-finite value is left out. Arms that share an initialization
    (``shared_init``): the paired t-test of d_s = arm_s - ref_s (`grow.report.inference.paired_test`);
    otherwise Welch's unpaired test of the same seeds' values (`welch_test`). With one pair: the
    difference, no SE, t, p or interval; with SE = 0, no t, p or interval."""
    ok = _finite_pairs(pairs)
    a, r = [x for _, x, _ in ok], [y for _, _, y in ok]
    out = paired_test(a, r) if shared_init else welch_test(a, r)
    out["seeds"] = [seed for seed, _, _ in ok]
    if not shared_init:
        out["diffs"] = [x - y for x, y in zip(a, r)]
    return out


def shares_init(e: dict, ref: dict) -> bool:
    """Do an arm and its reference start from the same model at each seed? Only fixed-size arms from
    scratch in the model's own initializer with the same parameter count (the baseline and the
    final-size equal-FLOPs arm): a grown arm's start model is drawn at its own shape, and a matched
    baseline in another parameterization, so those share the batch order only (docs/statistics.md)."""
    fixed = ("baseline", "equal_flops")
    if e["kind"] not in fixed or ref["kind"] not in fixed or e.get("parameterization") or ref.get("parameterization"):
        return False
    params = lambda x: {m["seed"]: m.get("params") for m in x["runs"]}
    mine, theirs = params(e), params(ref)
    return all(theirs.get(s) == p and p is not None for s, p in mine.items() if s in theirs)


def _with_tost(p: dict, pairs, shared_init: bool, margin: float) -> dict:
    """``p`` with the equivalence test at ``margin`` (TOST) of the same values."""
    ok = _finite_pairs(pairs)
    p["margin"] = margin
    p["tost_p"] = tost([x for _, x, _ in ok], [y for _, _, y in ok], shared_init, margin) if p.get("se") else None
    return p


def headline_arms(arms: list[dict], best: list[dict]) -> list[str]:
    """The arms of the headline family: per strategy, its grown arm (of those with a best fixed size) with
    the lowest mean final loss, i.e. each operator at its tuned setting where a sweep tried several."""
    compared = {a for g in best for a in g["grown_arms"]}
    pick: dict[str, dict] = {}
    for e in arms:
        if e["arm"] not in compared:
            continue
        loss = stat([m["final_val_loss"] for m in e["runs"]])["mean"]
        key = e.get("strategy") or e["arm"].split()[0]
        if key not in pick or loss < pick[key][1]:
            pick[key] = (e["arm"], loss)
    return [a for a, _ in pick.values()]


def adjust_holm(comparisons: dict, headline: list[str]) -> dict:
    """Holm's correction within each test family (`grow.report.inference.holm`): ``headline`` (the final-loss
    differences of the headline arms from the best fixed size) and ``other`` (every other test with a
    p-value, final loss and FLOPs to reach); each gets ``family`` and ``p_holm``; returns {family: m}."""
    families: dict[str, list[dict]] = {"headline": [], "other": []}
    for arm, comps in comparisons.items():
        for ref, c in comps.items():
            for key in ("final_val_loss", "flops_to_reach"):
                p = c.get(key)
                if not p or p.get("p") is None:
                    continue
                fam = "headline" if (arm in headline and ref == "best_equal_flops" and key == "final_val_loss") else "other"
                p["family"] = fam
                families[fam].append(p)
    for tests in families.values():
        for p, adjusted in zip(tests, holm([p["p"] for p in tests])):
            p["p_holm"] = adjusted
    return {k: len(v) for k, v in families.items()}


def _reach_pairs(reach: list, shared_init: bool) -> dict:
    """The paired FLOPs to reach a reference's loss, censored: a seed where the arm or the reference never
    reached it has no finite difference, so the pairs are differenced only when every seed reached it on
    both sides; otherwise n = 0 and ``censored`` counts the seeds that did not."""
    censored = sum(a is None or r is None for _, a, r in reach)
    out = paired(reach if not censored else [], shared_init)
    out["censored"], out["of"] = censored, len(reach)
    return out


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


def _reference_arm(by_label: dict, labels: list[str]) -> dict | None:
    return by_label.get(labels[0]) if labels else None


def compare_arms(arms: list[dict], margin: float = MARGIN) -> dict:
    """The differences (`paired`: paired where the arms share an initialization, else Welch) of every arm
    from its references, from the per-run figures of ``summary.json``'s arms alone (the report and
    scripts/results.py compute them the same way): ``{"arms": {label: {"baseline": ..., "matched": ...,
    "best_equal_flops": ...}}, "best_equal_flops": [...], "headline": {...}, "tests": {family: m}}``.
    Each reference: its ``arm`` and the difference of ``final_val_loss`` (with its equivalence test at
    ``margin``); against the baseline and the matched baseline also ``flops_to_reach``, the FLOPs to reach
    the reference's final loss as a fraction of the reference's FLOPs (the reference's own value: itself
    reaching its final loss). ``headline``: the headline arms' runs pooled against the best fixed size
    (Welch), when they share one."""
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
                shared = shares_init(e, _reference_arm(by_label, labels))
                comps[name] = {"arm": labels[0] if len(set(labels)) == 1 else ", ".join(dict.fromkeys(labels)),
                               "final_val_loss": _with_tost(paired(loss, shared), loss, shared, margin),
                               "flops_to_reach": _reach_pairs(reach, shared),
                               "reached": sum(v is not None for _, v, _ in reach), "of": len(reach)}
        group = next((g for g in best if e["arm"] in g["grown_arms"]), None)
        if group is not None:
            ref = _by_seed(by_label[group["arm"]])
            loss = [(m["seed"], m["final_val_loss"], ref[m["seed"]]["final_val_loss"]) for m in e["runs"] if m["seed"] in ref]
            comps["best_equal_flops"] = {"arm": group["arm"],
                                         "final_val_loss": _with_tost(paired(loss, False), loss, False, margin)}
        out[e["arm"]] = comps
    heads = headline_arms(arms, best)
    return {"arms": out, "best_equal_flops": best, "headline": pooled_headline(arms, best, heads, margin),
            "tests": adjust_holm(out, heads)}


def pooled_headline(arms: list[dict], best: list[dict], heads: list[str], margin: float) -> dict | None:
    """The headline arms' runs pooled against their best fixed size (Welch; with TOST at ``margin``): how
    much worse or better growth is, over the operators at their tuned settings. None without one shared
    best fixed size."""
    groups = {g["arm"] for g in best if set(heads) & set(g["grown_arms"])}
    if not heads or len(groups) != 1:
        return None
    label = groups.pop()
    ref = next(e for e in arms if e["arm"] == label)
    a = [m["final_val_loss"] for e in arms if e["arm"] in heads for m in e["runs"]]
    r = [m["final_val_loss"] for m in ref["runs"]]
    p = welch_test(a, r)
    p["margin"], p["tost_p"] = margin, tost(a, r, False, margin)
    return {"arms": heads, "reference": ref["arm"], "final_val_loss": p}


def _loss_at_seeds(e: dict, seeds: list[int]) -> list[float] | None:
    by = {m["seed"]: m.get("final_val_loss") for m in e["runs"]}
    xs = [by.get(s) for s in seeds]
    return [float(x) for x in xs] if all(x is not None and math.isfinite(x) for x in xs) else None


def seed_blocked_comparisons(arms: list[dict], best: list[dict], margin: float = MARGIN) -> dict | None:
    """The final-loss differences under the seed-blocked model (`grow.report.inference.seed_blocked`): each grown
    arm against its best fixed size at equal FLOPs (where the sweep has one) and against its baseline, on the
    seeds all of these share; these arms (with a finite loss at each of those seeds) enter the model, so the
    residual SD pools the compared arms' (not the other fixed sizes', whose plateaus would inflate it); each
    difference with TOST at ±``margin``. None below 2 such seeds."""
    by_label = {e["arm"]: e for e in arms}
    pairs = [("best_equal_flops", g["arm"], a) for g in best for a in g["grown_arms"]]
    for e in arms:
        base = {m.get("baseline_arm") for m in e["runs"]}
        if e["kind"] == "grown" and e["runs"] and len(base) == 1 and (b := base.pop()) in by_label:
            pairs.append(("baseline", b, e["arm"]))
    if not pairs:
        return None
    seeds = sorted(set.intersection(*({m["seed"] for m in by_label[x]["runs"]} for p in pairs for x in p[1:])))
    members = {x for p in pairs for x in p[1:]}
    rows = {e["arm"]: ys for e in arms if e["arm"] in members and (ys := _loss_at_seeds(e, seeds)) is not None}
    fit = seed_blocked(np.array(list(rows.values()), dtype=np.float64)) if len(seeds) >= 2 else None
    if fit is None:
        return None
    means, sd, dof = fit
    mean = dict(zip(rows, means.tolist()))
    comps: dict = {}
    for kind, ref, a in pairs:
        if a in mean and ref in mean:
            comps.setdefault(a, {})[kind] = {"arm": ref, "final_val_loss": blocked_difference(
                mean[a] - mean[ref], sd, len(seeds), dof, margin)}
    return {"seeds": seeds, "arms": list(rows), "sd": sd, "dof": dof, "comparisons": comps}


def min_detectable(arms: list[dict]) -> dict | None:
    """The minimum detectable effect of the sweep (`grow.report.inference.min_detectable_effect`): from the
    pooled SD of the final loss over seeds (the root mean of the arms' variances, arms of ≥ 2 seeds) and
    the arms' most common seed count n."""
    var, ns = [], []
    for e in arms:
        xs = [m["final_val_loss"] for m in e["runs"]]
        if len(xs) > 1:
            var.append(statistics.variance(xs))
            ns.append(len(xs))
    if not var:
        return None
    n = max(set(ns), key=lambda k: (ns.count(k), -k))
    sd = math.sqrt(sum(var) / len(var))
    return {"sd": sd, "n": n, "alpha": ALPHA, "power": POWER, "nats": min_detectable_effect(sd, n)}


def derived_statistics(arms: list[dict], margin: float = MARGIN, machine: str | None = None) -> dict:
    """What summary.json derives from its arms' per-run values: each arm's ``comparisons`` (set on the arm),
    and the sweep's best fixed sizes, headline test, test families, minimum detectable effect, effective-
    compute multipliers and descriptions of the statistics and columns. `summarize` and scripts/results.py's
    refresh both use it. ``machine``: the runs' machine where they did not record one (`one_machine`)."""
    compared = compare_arms(arms, margin)
    for e in arms:
        e["comparisons"] = compared["arms"][e["arm"]]
    head = compared["headline"]
    return {"best_equal_flops": compared["best_equal_flops"], "tests": compared["tests"],
            "headline": head, "equivalence_margin": margin, "mde": min_detectable(arms),
            "seed_blocked": seed_blocked_comparisons(arms, compared["best_equal_flops"], margin),
            "effective_compute": effective_compute(arms, head["arms"] if head else None, machine),
            "statistics": STATISTICS, "columns": {k: v[2] for k, v in COLUMNS.items()}}


def one_machine(summary: dict) -> str | None:
    """The machine of every run of a summary that names one (``machines``), else None."""
    machines = summary.get("machines") or []
    return machines[0] if len(machines) == 1 else None


def _arm_entry(label: str, rs: list[FoundRun], several_sources: bool) -> dict:
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


def summarize(runs: list[FoundRun], out_dir: Path, title: str | None = None, margin: float = MARGIN, *,
              derive: bool = True) -> dict:
    """The report's figures: one entry per arm (mean ± std over seeds of every column), the sources,
    the command lines and stage plans that made the runs; with ``derive``, `derived_statistics` (the report extra)."""
    out_dir = Path(out_dir)
    sources = list(dict.fromkeys(r.source for r in runs))
    arms: dict[str, list[FoundRun]] = {}
    for r in sorted(runs, key=_arm_order(runs)):
        arms.setdefault(r.label, []).append(r)
    entries = [_arm_entry(label, rs, len(sources) > 1) for label, rs in arms.items()]
    return {
        "title": title or experiment_title(runs),
        "sweep_dir": str((sources[0] if len(sources) == 1 else out_dir).absolute()),
        "sources": [str(s.absolute()) for s in sources],
        "group": (sources[0] if len(sources) == 1 else out_dir).name,
        "commands": list(dict.fromkeys(r.command for r in runs if r.command)),
        "code": list(dict.fromkeys(describe(r.summary.get("code")) for r in runs if r.complete)),
        "machines": list(dict.fromkeys(describe_machine(r.summary.get("machine")) for r in runs if r.complete)),
        "accounting": ACCOUNTING,
        "scale": scale(runs),
        "arms": entries,
        **(derived_statistics(entries, margin) if derive else {"columns": {k: v[2] for k, v in COLUMNS.items()}}),
        "schedules": schedules(runs),
    }


def _arm_order(runs: list[FoundRun]):
    """Sort key of the runs: baseline, matched baselines, grown arms, equal-FLOPs arms (smallest size first);
    within a kind, the order in which the arms first appear (job order)."""
    first: dict[str, int] = {}
    for i, r in enumerate(runs):
        first.setdefault(r.label, i)

    def key(r: FoundRun):
        kind = r.arm.get("kind")
        rank = KIND_ORDER.index(kind) if kind in KIND_ORDER else len(KIND_ORDER)
        size = r.arm.get("size") if kind == "equal_flops" and r.arm.get("size") is not None else 0
        return rank, size, first[r.label], r.seed
    return key


def scale(runs: list[FoundRun]) -> dict:
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
            "data": ref[0].summary.get("data") if ref else None,  # split sizes, bigram floor (grow.data.floor)
            "reference": (ref[0].arm.get("kind") if ref else None),
            "final_sizes": len({json.dumps(r.summary.get("final_config"), sort_keys=True) for r in done
                                if r.arm.get("kind") != "equal_flops"}),
            "corpus": sorted({str(c.get("data", {}).get("name")) for c in cfgs}),
            "seeds": sorted({r.seed for r in runs}),
            "devices": sorted({_device(r) for r in runs if r.config}),
            "precision": sorted({_precision(r) for r in runs if r.config})}


def _ran_on(r: FoundRun) -> tuple[str, str] | None:
    """(device type, name) a run trained on (`grow.device.resolve_device`: ``auto`` is the GPU its summary's
    machine names, else the CPU); None for ``auto`` in a summary without a machine."""
    asked, machine = str(r.config.get("device")), (r.summary or {}).get("machine")
    if asked != "auto":
        return asked.split(":")[0], asked
    if not machine:
        return None
    return ("cuda", machine["gpu"]) if machine.get("gpu") else ("cpu", "cpu")


def _device(r: FoundRun) -> str:
    """The device a run's config asked for; for ``auto``, with what it ran on (`_ran_on`)."""
    asked, on = str(r.config.get("device")), _ran_on(r)
    return f"auto ({on[1]})" if asked == "auto" and on else asked


def _precision(r: FoundRun) -> str:
    """The precision a run's config asked for; for ``auto``, what it ran in (`grow.device.resolve_precision`:
    bf16 autocast on a GPU, float32 on the CPU)."""
    asked, on = str(r.config.get("precision")), _ran_on(r)
    if asked != "auto" or on is None:
        return asked
    return f"auto ({'bf16 autocast' if on[0] == 'cuda' else 'float32'})"


def experiment_title(runs: list[FoundRun]) -> str:
    """What the runs are, from their configs: 'zero, random vs the baseline: growing to 50.5k parameters
    on 29.7k tokens of stdlib'."""
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


def schedules(runs: list[FoundRun]) -> list[dict]:
    """The distinct stage plans of the grown runs, each with the arms that used it; stages numbered from 1."""
    plans: dict[str, dict] = {}
    for r in runs:
        if r.arm.get("kind") != "grown":
            continue
        stages = (r.summary or {}).get("stage_plan") or r.arm.get("plan") or []
        rows = [{"stage": i, "config": s["config"], "batch_size": s["batch_size"], "steps": s["steps"],
                 "tokens": s["tokens"], "flops": s["flops"], "params": s.get("params"),
                 **({"active_params": s["active_params"]} if (s["config"].get("n_experts") or 1) > 1 else {})}
                for i, s in enumerate(stages, start=1)]
        if not rows:
            continue
        key = json.dumps(rows, sort_keys=True)
        plans.setdefault(key, {"arms": [], "stages": rows, "triggered": []})
        if r.label not in plans[key]["arms"]:
            plans[key]["arms"].append(r.label)
        trigger = str((r.summary or {}).get("trigger") or "fixed")
        if not trigger.startswith("fixed") and r.label not in plans[key]["triggered"]:
            plans[key]["triggered"].append(r.label)  # its stages ended where its growth trigger fired
    return list(plans.values())
