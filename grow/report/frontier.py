"""The effective-compute multiplier of an arm against the sweep's fixed-size frontier (docs/statistics.md).

The frontier: one point per fixed-size arm from scratch in the model's own initializer (``baseline`` and
``equal_flops`` arms) and per WSD decay branch fraction of such an arm (optim.decay_branches), (mean training
FLOPs, mean final loss); the lower envelope in FLOPs order (a point stays when its loss is below every point of fewer or equal FLOPs), the loss linear in log FLOPs between
its points. An arm's multiplier is C_f(L) / C: the FLOPs at which the frontier reaches the arm's mean
loss L, over the arm's mean FLOPs C; None outside the frontier's losses. Its 95% interval: below
BOOTSTRAP_MIN_SEEDS seeds a t-interval over seeds of the per-seed log-multiplier (each seed's run against that
seed's own frontier, `per_seed`), from that many a percentile bootstrap over seeds (every arm's seeds resampled
independently, the frontier rebuilt each time): a percentile bootstrap over 2-3 seeds is not a 95% interval.
"""

from __future__ import annotations

import math

import numpy as np

from grow.report.inference import confidence_interval

MIN_POINTS = 3  # a frontier of fewer points is not shown (two points are one slope, no check of its shape)
RESAMPLES = 4000
SAME_BUDGET = 0.01  # FLOPs within 1% are one budget
FIXED_KINDS = ("baseline", "equal_flops")
# Below this many seeds (the fewest of the arm's and the frontier arms') the interval is a t-interval over seeds:
# with n seeds a bootstrap draws from at most C(2n-1, n) resamples (3 at n = 2) and its 2.5% and 97.5% order
# statistics are not a 95% interval.
BOOTSTRAP_MIN_SEEDS = 8


def frontier_arms(arms: list[dict]) -> list[dict]:
    """The fixed-size arms from scratch in the model's own initializer, with finished runs, and the budgets
    their runs' WSD decay branches measured (`branch_arms`)."""
    fixed = [e for e in arms if e["kind"] in FIXED_KINDS and not e.get("parameterization") and e["runs"]]
    return fixed + [b for e in fixed for b in branch_arms(e)]


def branch_arms(e: dict) -> list[dict]:
    """One arm per decay-branch fraction of the fixed-size arm ``e`` (optim.decay_branches, `grow.branches`): its
    seeds' branches of that fraction, each at the budget's whole FLOPs (the shared trunk + its decay) and final
    loss: the point a wsd run of that budget from scratch gives (equal to it, docs/optimizer.md)."""
    by_fraction: dict[float, list[dict]] = {}
    for m in e["runs"]:
        for b in m.get("decay_branches") or ():
            by_fraction.setdefault(b["fraction"], []).append(
                {"seed": m["seed"], "machine": m.get("machine"), "flops": b["flops"], "final_val_loss": b["final_val_loss"]})
    return [{"arm": f"{e['arm']} decay branch {f:g}", "kind": "branch", "runs": rs} for f, rs in sorted(by_fraction.items())]


def envelope(points: list[tuple[float, float]]) -> list[tuple[float, float]]:
    """The lower envelope of (FLOPs, loss) points: points within SAME_BUDGET of the smallest FLOPs of their
    group are one budget (equal-FLOPs arms differ by the rounding of their step counts), its lowest loss
    kept; then, in FLOPs order, the budgets whose loss is below every earlier one's."""
    budgets: list[tuple[float, float]] = []
    start = None
    for c, loss in sorted(p for p in points if math.isfinite(p[1])):
        if start is not None and c <= start * (1 + SAME_BUDGET):
            if loss < budgets[-1][1]:
                budgets[-1] = (c, loss)
            continue
        start = c
        budgets.append((c, loss))
    out: list[tuple[float, float]] = []
    for c, loss in budgets:
        if not out or loss < out[-1][1]:
            out.append((c, loss))
    return out


def compute_at(front: list[tuple[float, float]], loss: float) -> float | None:
    """The FLOPs at which the frontier reaches ``loss`` (linear in log FLOPs between its points); None
    when ``loss`` is above its first point or below its last."""
    if len(front) < 2 or not math.isfinite(loss):
        return None
    cs, ls = [math.log(c) for c, _ in front], [l for _, l in front]
    if loss > ls[0] or loss < ls[-1]:
        return None
    return float(math.exp(np.interp(-loss, [-x for x in ls], cs)))  # the losses fall: interpolate in −loss


def _multiplier(front, loss: float, flops: float) -> float | None:
    c = compute_at(front, loss)
    return None if c is None else c / flops


def bound(front: list, loss: float, flops: float) -> tuple[str, float] | None:
    """Where ``loss`` lies beyond the frontier, what its multiplier is at least or at most: ``(">", C_last / C)``
    below the frontier's lowest loss (no fixed size reached it, not even on the largest budget), ``("<",
    C_first / C)`` above its highest; None on the frontier or when it has no points."""
    if not front or not math.isfinite(loss):
        return None
    if loss < front[-1][1]:
        return ">", front[-1][0] / flops
    if loss > front[0][1]:
        return "<", front[0][0] / flops
    return None


def _point(e: dict) -> tuple[float, float]:
    runs = e["runs"]
    return (sum(m["flops"] for m in runs) / len(runs), sum(m["final_val_loss"] for m in runs) / len(runs))


def _bootstrap(arm: list[dict], fixed: list[dict], rng: np.random.Generator) -> list[float] | None:
    """The percentile 95% interval of the multiplier of the runs ``arm`` (one or several arms pooled):
    each arm's seeds resampled with replacement, the frontier rebuilt, RESAMPLES times; an estimate off
    the frontier counts as 0 (above it) or +∞ (below), so the interval may be open."""
    def means(e):
        x = np.array([m["final_val_loss"] for m in e["runs"]], dtype=np.float64)
        return x[rng.integers(0, len(x), size=(RESAMPLES, len(x)))].mean(axis=1)

    fixed_means = [(_point(e)[0], means(e)) for e in fixed]
    arm_loss = np.mean([means(e) for e in arm], axis=0)
    flops = float(np.mean([m["flops"] for e in arm for m in e["runs"]]))
    if np.isfinite(arm_loss).all() and all(np.isfinite(ls).all() for _, ls in fixed_means):
        est = _estimates([c for c, _ in fixed_means], np.stack([ls for _, ls in fixed_means]), arm_loss, flops)
    else:  # a diverged run: the points it leaves out change the budgets' grouping, resample by resample
        est = np.empty(RESAMPLES)
        for b in range(RESAMPLES):
            front = envelope([(c, float(ls[b])) for c, ls in fixed_means])
            m = _multiplier(front, float(arm_loss[b]), flops)
            est[b] = m if m is not None else (0.0 if arm_loss[b] > front[0][1] else math.inf)
    lo, hi = np.quantile(est, [0.025, 0.975], method="inverted_cdf")
    return [float(lo), float(hi)]


def per_seed(arm: list[dict], fixed: list[dict]) -> dict:
    """The multiplier seed by seed (the seeds share the batch order, so a seed is a block): for every seed that
    the runs ``arm`` (one or several arms pooled: their mean loss and FLOPs at that seed) all have, the frontier
    of the fixed-size runs of that seed (`envelope`, at least MIN_POINTS budgets) and the arm's multiplier on it;
    then the 95% t-interval of the mean log-multiplier over those seeds, exponentiated. A seed whose run lies
    off its frontier gives a bound, not a value: it is counted in ``off`` and the interval is None (as it is
    below two seeds). ``multiplier``: exp(mean log-multiplier), None with a seed off."""

    seeds = sorted(set.intersection(*({m["seed"] for m in e["runs"]} for e in arm))) if arm else []
    logs, off, used = [], [], []
    for s in seeds:
        front = envelope([(m["flops"], m["final_val_loss"]) for e in fixed for m in e["runs"] if m["seed"] == s])
        if len(front) < MIN_POINTS:
            continue
        runs = [next(m for m in e["runs"] if m["seed"] == s) for e in arm]
        loss = sum(m["final_val_loss"] for m in runs) / len(runs)
        m = _multiplier(front, loss, sum(m["flops"] for m in runs) / len(runs))
        used.append(s)
        if m is None:
            off.append(s)
        else:
            logs.append(math.log(m))
    out = {"method": "t", "seeds": used, "off": off, "log_multipliers": logs, "multiplier": None, "ci95": None}
    if logs and not off:
        mean = sum(logs) / len(logs)
        out["multiplier"] = math.exp(mean)
        if len(logs) > 1:
            se = float(np.std(logs, ddof=1)) / math.sqrt(len(logs))
            out["ci95"] = [math.exp(x) for x in confidence_interval(mean, se, len(logs) - 1)]
    return out


def _interval(arm: list[dict], fixed: list[dict], rng: np.random.Generator, front, loss: float, flops: float) -> dict:
    """The multiplier and its 95% interval: from BOOTSTRAP_MIN_SEEDS seeds the mean-frontier multiplier with a
    percentile bootstrap, below them the per-seed t-interval (`per_seed`; with a seed off its frontier, the
    mean-frontier multiplier and no interval)."""
    fewest = min(len(e["runs"]) for e in [*arm, *fixed])
    if fewest >= BOOTSTRAP_MIN_SEEDS:
        return {"multiplier": _multiplier(front, loss, flops), "ci95": _bootstrap(arm, fixed, rng),
                "method": "bootstrap"}
    out = per_seed(arm, fixed)
    if out["multiplier"] is None:
        out["multiplier"] = _multiplier(front, loss, flops)
    return out


def _estimates(cs: list[float], losses: np.ndarray, arm_loss: np.ndarray, flops: float) -> np.ndarray:
    """Every resample's multiplier at once (finite losses; ``losses`` (fixed arms, resamples)): what `envelope`
    and `_multiplier` give resample by resample, to the bit. The budgets are grouped by FLOPs alone, each
    resample's group keeps its lowest loss (the first of equal ones, at its FLOPs), the envelope is the
    budgets below the running minimum, and the loss is interpolated in log FLOPs as np.interp does."""
    order = sorted(range(len(cs)), key=lambda i: cs[i])
    groups: list[list[int]] = []
    for i in order:
        if groups and cs[i] <= cs[groups[-1][0]] * (1 + SAME_BUDGET):
            groups[-1].append(i)
        else:
            groups.append([i])
    cols = np.arange(losses.shape[1])
    first = [np.argmin(losses[g], axis=0) for g in groups]  # (resamples,) a member's position in its group
    loss = np.stack([losses[g][f, cols] for g, f in zip(groups, first)])  # (budgets, resamples)
    logc = np.stack([np.array([math.log(cs[i]) for i in g])[f] for g, f in zip(groups, first)])  # as compute_at
    running = np.minimum.accumulate(loss, axis=0)
    kept = loss < np.vstack([np.full((1, loss.shape[1]), np.inf), running[:-1]])  # below every earlier budget
    y = arm_loss
    inside = (kept.sum(0) >= 2) & (y <= loss[0]) & (y >= running[-1])
    idx = np.arange(loss.shape[0])[:, None]
    j = np.where(kept & (loss >= y), idx, -1).max(0)  # the last kept budget at or above y
    k = np.where(kept & (idx > j), idx, loss.shape[0]).min(0)  # the next kept one
    k = np.minimum(k, loss.shape[0] - 1)
    xj, xk, fj, fk = -loss[j, cols], -loss[k, cols], logc[j, cols], logc[k, cols]
    with np.errstate(divide="ignore", invalid="ignore"):
        at = np.where(-y == xj, fj, (fk - fj) / (xk - xj) * (-y - xj) + fj)
    off = np.where(y > loss[0], 0.0, math.inf)
    return np.array([math.exp(a) / flops if ok else o for a, ok, o in zip(at.tolist(), inside.tolist(), off.tolist())])


def point_arms(front: list[tuple[float, float]], fixed: list[dict], machine: str | None = None) -> list[dict]:
    """Which arm gave each frontier point, and the machines its runs trained on (``machine`` per run, else
    ``machine``: the summary's one machine, for summaries from before runs recorded theirs)."""
    out = []
    for p in front:
        e = next(e for e in fixed if _point(e) == p)
        out.append({"arm": e["arm"], "n": len(e["runs"]), "params": _params(e),
                    "machines": sorted({m.get("machine") or machine or "not recorded" for m in e["runs"]})})
    return out


def _params(e: dict) -> int | None:
    """The parameter count of a fixed-size arm's runs (a decay branch: None, its trunk's size is not recorded)."""
    ps = {m.get("params") for m in e["runs"]}
    return ps.pop() if len(ps) == 1 else None


NUMBERS = {1: "one", 2: "two", 3: "three", 4: "four", 5: "five", 6: "six"}


def shape(point_arms: list[dict]) -> str:
    """What the frontier is, in words: "one size at two budgets", "three sizes at three budgets" (a point whose
    size is not recorded counts as a size of its own)."""
    sizes = len({a["params"] if a.get("params") is not None else a["arm"] for a in point_arms})
    word = lambda n, noun: f"{NUMBERS.get(n, n)} {noun}{'' if n == 1 else 's'}"
    return f"{word(sizes, 'size')} at {word(len(point_arms), 'budget')}"


def effective_compute(arms: list[dict], pooled: list[str] | None = None, machine: str | None = None) -> dict:
    """The frontier (its points, and the arm and machines of each) and every arm's multiplier with its interval,
    and (``pooled``: arm labels) the multiplier of those arms' runs together: ``{"points": [[flops, loss], ...],
    "point_arms": [...], "arms": {label: {...}}, "pooled": {...}}``; no multipliers when the frontier has fewer
    than MIN_POINTS points. ``machine``: `point_arms`'."""
    fixed = frontier_arms(arms)
    front = envelope([_point(e) for e in fixed])
    pa = point_arms(front, fixed, machine)
    out = {"points": [list(p) for p in front], "point_arms": pa, "arms": {}, "pooled": None,
           "resamples": RESAMPLES, "shape": shape(pa)}
    if len(front) < MIN_POINTS:
        return out
    rng = np.random.default_rng(0)  # a fixed stream: summary.json is reproducible from its per-run values
    for e in arms:
        if not e["runs"]:
            continue
        c, loss = _point(e)
        out["arms"][e["arm"]] = _interval([e], fixed, rng, front, loss, c)
    chosen = [e for e in arms if e["arm"] in (pooled or []) and e["runs"]]
    if chosen:
        loss = sum(_point(e)[1] for e in chosen) / len(chosen)  # the mean of the arms' means, as resampled
        flops = float(np.mean([m["flops"] for e in chosen for m in e["runs"]]))
        out["pooled"] = {"arms": [e["arm"] for e in chosen], **_interval(chosen, fixed, rng, front, loss, flops)}
    return out
