"""Statistical inference for the report, by SciPy and statsmodels (docs/statistics.md): Student's t,
paired and Welch differences with their intervals, equivalence (TOST), Holm's correction within a test
family (numpy: statsmodels' collects garbage each call), the minimum detectable effect, and the median of censored figures.
SciPy and statsmodels (the report extra) are imported on first use.

Censored figures (FLOPs to reach a target loss): a seed whose run never reached the target has a value
of +∞ (not reached), not a missing one; the median of n values is then the middle value (the mean of
the two middle ones for even n), +∞ when the unreached runs are at least half.
"""

from __future__ import annotations

import math
import statistics
import warnings

import numpy as np

ALPHA = 0.05  # the level of every test and interval in the report (two-sided)
POWER = 0.8  # the power at which the minimum detectable effect is stated
MARGIN = 0.02  # the default equivalence margin, nats (report.equivalence_margin)


def _st():
    from scipy import stats

    return stats


def t_two_sided_p(t: float, dof: float) -> float:
    """P(|T| ≥ |t|) for Student's T with ``dof`` degrees of freedom."""
    return float(2.0 * _st().t.sf(abs(t), dof))


def t_quantile(q: float, dof: float) -> float:
    """t_q(ν): the q-quantile of Student's t."""
    return float(_st().t.ppf(q, dof))


def confidence_interval(mean: float, se: float, dof: float, level: float = 1 - ALPHA) -> tuple[float, float]:
    """mean ± t_{(1+level)/2}(dof) · SE."""
    half = t_quantile((1.0 + level) / 2.0, dof) * se
    return mean - half, mean + half


def holm(ps: list[float]) -> list[float]:
    """Holm-adjusted p-values (Holm 1979, Scand. J. Statist.), in the order of ``ps``: the k-th smallest
    times (n - k + 1), running maximum, capped at 1. statsmodels' ``multipletests(method="holm")`` computes
    the same but calls gc.collect(), ~0.4 s in a process holding torch, once per test family of every report."""
    p = np.asarray(ps, dtype=np.float64)
    order = np.argsort(p)
    adjusted = np.empty_like(p)
    adjusted[order] = np.minimum(np.maximum.accumulate(p[order] * np.arange(len(p), 0, -1)), 1.0)
    return [float(x) for x in adjusted]


def _t_result(mean: float, se: float, dof: float, scale: float) -> dict:
    """t, p and the 95% interval of a difference ``mean`` with standard error ``se``; none when SE is 0
    up to rounding against the values' ``scale`` (identical runs)."""
    if se <= 1e-12 * scale:
        return {"se": 0.0, "t": None, "p": None, "ci95": None}
    t = mean / se
    return {"se": se, "t": t, "p": t_two_sided_p(t, dof), "ci95": list(confidence_interval(mean, se, dof))}


def paired_test(a: list[float], r: list[float]) -> dict:
    """The paired t-test of d = a − r (arms that share an initialization, seed by seed): mean(d), sd(d)
    (n − 1), SE = sd/√n, t with n − 1 dof (scipy.stats.ttest_rel), p, 95% interval."""
    n = len(a)
    diffs = [x - y for x, y in zip(a, r)]
    out = {"test": "paired", "n": n, "n_ref": n, "mean": sum(diffs) / n if n else None, "sd": None, "se": None,
           "t": None, "dof": n - 1 if n > 1 else None, "p": None, "ci95": None, "diffs": diffs}
    if n > 1:
        out["sd"] = statistics.stdev(diffs)
        out.update(_t_result(out["mean"], out["sd"] / math.sqrt(n), n - 1, max(map(abs, a + r))))
        if out["t"] is not None:  # the library's own t: the figure of record
            with warnings.catch_warnings():  # near-identical values (FLOPs to reach): SciPy warns, the t stands
                warnings.simplefilter("ignore", RuntimeWarning)
                out["t"], out["p"] = (float(v) for v in _st().ttest_rel(a, r))
    return out


def welch_test(a: list[float], r: list[float]) -> dict:
    """Welch's unpaired t-test of mean(a) − mean(r) (scipy.stats.ttest_ind, equal_var=False):
    SE = √(s_a²/n_a + s_r²/n_r), Welch–Satterthwaite dof, p, 95% interval; no SE with one value a side."""
    na, nr = len(a), len(r)
    mean = sum(a) / na - sum(r) / nr if na and nr else None
    out = {"test": "welch", "n": na, "n_ref": nr, "mean": mean, "sd": None, "se": None, "t": None, "dof": None,
           "p": None, "ci95": None}
    if na > 1 and nr > 1:
        va, vr = statistics.variance(a) / na, statistics.variance(r) / nr
        se = math.sqrt(va + vr)
        dof = (va + vr) ** 2 / (va ** 2 / (na - 1) + vr ** 2 / (nr - 1)) if se > 0 else float(na + nr - 2)
        out["dof"] = dof
        out.update(_t_result(mean, se, dof, max(map(abs, a + r))))
        if out["t"] is not None:
            with warnings.catch_warnings():
                warnings.simplefilter("ignore", RuntimeWarning)
                res = _st().ttest_ind(a, r, equal_var=False)
            out["t"], out["p"] = float(res.statistic), float(res.pvalue)
    return out


def tost(a: list[float], r: list[float], paired: bool, margin: float) -> float | None:
    """The p-value of the two one-sided tests (Schuirmann 1987) that |mean difference| < ``margin``
    (statsmodels' ttost_paired / ttost_ind with Welch's variance): < ALPHA means equivalent within it."""
    if len(a) < 2 or len(r) < 2:
        return None
    from statsmodels.stats.weightstats import ttost_ind, ttost_paired

    x, y = np.asarray(a, dtype=np.float64), np.asarray(r, dtype=np.float64)
    p = float(ttost_paired(x, y, -margin, margin)[0] if paired else ttost_ind(x, y, -margin, margin, usevar="unequal")[0])
    return p if math.isfinite(p) else None


def seed_blocked(y: np.ndarray) -> tuple[np.ndarray, float, int] | None:
    """The additive two-way model y[a, s] = μ_a + β_s + ε (arms × seeds, every arm at every seed; the seeds
    share the batch order, so a seed is a block): the arm means, the residual SD σ and its degrees of freedom
    (A − 1)(S − 1); the difference of two arms' means then has SE = σ·√(2/S). None below 2 arms or 2 seeds."""
    a, n = y.shape
    if a < 2 or n < 2:
        return None
    resid = y - y.mean(axis=1, keepdims=True) - y.mean(axis=0, keepdims=True) + y.mean()
    dof = (a - 1) * (n - 1)
    return y.mean(axis=1), float(math.sqrt((resid ** 2).sum() / dof)), dof


def blocked_difference(diff: float, sd: float, n: int, dof: int, margin: float) -> dict:
    """The difference of two arms' means under `seed_blocked`'s model: SE = sd·√(2/n), t with ``dof``, p, the
    95% interval and TOST at ±``margin`` (p = max of the two one-sided tests)."""
    se = sd * math.sqrt(2.0 / n)
    out = {"test": "seed-blocked", "n": n, "mean": diff, "sd": sd, "dof": dof, "se": se, "t": None, "p": None,
           "ci95": None, "margin": margin, "tost_p": None}
    if se > 1e-12 * max(abs(diff), 1.0):
        out.update(_t_result(diff, se, dof, max(abs(diff), 1.0)))
        out["tost_p"] = float(max(_st().t.sf((diff + margin) / se, dof), _st().t.cdf((diff - margin) / se, dof)))
    return out


def min_detectable_effect(sd: float, n: int, alpha: float = ALPHA, power: float = POWER) -> float | None:
    """The difference of means two arms of ``n`` seeds each detect with probability ``power`` at level
    ``alpha`` (two-sided two-sample t, statsmodels' TTestIndPower) when the seeds' SD is ``sd``."""
    if n < 2 or sd is None:
        return None
    from statsmodels.stats.power import TTestIndPower

    return float(TTestIndPower().solve_power(nobs1=n, alpha=alpha, power=power, ratio=1.0)) * sd


def censored_median(values: list[float | None]) -> float | None:
    """The median of ``values`` with None (never reached) counted as +∞; None when it is +∞ or there are none."""
    if not values:
        return None
    xs = sorted(math.inf if v is None else float(v) for v in values)
    n = len(xs)
    mid = xs[n // 2] if n % 2 else (xs[n // 2 - 1] + xs[n // 2]) / 2.0
    return None if math.isinf(mid) else mid
