"""Statistical inference for the report: Student's t distribution, confidence intervals, Holm's correction
for the number of comparisons in a sweep, and the median of censored figures.

Student's t with ν degrees of freedom (no SciPy): the two-sided tail probability of |T| ≥ t is the
regularized incomplete beta function I_x(ν/2, 1/2) at x = ν / (ν + t²) (Abramowitz & Stegun 26.7.1 with
26.5.27), evaluated by its continued fraction (Numerical Recipes, 3rd ed., §6.4: betacf, modified Lentz);
the quantile t_q(ν) by bisection on it. Both agree with the printed tables to the table's 3 decimals
(tests/test_inference.py).

Holm's step-down correction (Holm 1979, "A simple sequentially rejective multiple test procedure",
Scand. J. Statist.): with m p-values sorted p_(1) ≤ ... ≤ p_(m), the adjusted value of the i-th is
max_{j ≤ i} min(1, (m − j + 1) p_(j)); a hypothesis is rejected at level α when its adjusted value is
< α. It controls the family-wise error rate at α for any dependence between the tests.

Censored figures (FLOPs to reach a target loss): a seed whose run never reached the target has a value
of +∞ (not reached), not a missing one; the median of n values is then the middle value (the mean of
the two middle ones for even n), +∞ when the unreached runs are at least half.
"""

from __future__ import annotations

import math

ALPHA = 0.05  # the level of every test and interval in the report (two-sided)


def _betacf(a: float, b: float, x: float) -> float:
    """The continued fraction of the incomplete beta function (modified Lentz), NR §6.4."""
    tiny, eps = 1e-300, 1e-15
    qab, qap, qam = a + b, a + 1.0, a - 1.0
    c, d = 1.0, 1.0 - qab * x / qap
    d = 1.0 / (d if abs(d) > tiny else tiny)
    h = d
    for m in range(1, 500):
        m2 = 2 * m
        aa = m * (b - m) * x / ((qam + m2) * (a + m2))
        d = 1.0 + aa * d
        d = 1.0 / (d if abs(d) > tiny else tiny)
        c = 1.0 + aa / c
        c = c if abs(c) > tiny else tiny
        h *= d * c
        aa = -(a + m) * (qab + m) * x / ((a + m2) * (qap + m2))
        d = 1.0 + aa * d
        d = 1.0 / (d if abs(d) > tiny else tiny)
        c = 1.0 + aa / c
        c = c if abs(c) > tiny else tiny
        delta = d * c
        h *= delta
        if abs(delta - 1.0) < eps:
            break
    return h


def betainc(a: float, b: float, x: float) -> float:
    """The regularized incomplete beta function I_x(a, b), 0 ≤ x ≤ 1."""
    if x <= 0.0:
        return 0.0
    if x >= 1.0:
        return 1.0
    front = math.exp(math.lgamma(a + b) - math.lgamma(a) - math.lgamma(b) + a * math.log(x) + b * math.log1p(-x))
    if x < (a + 1.0) / (a + b + 2.0):
        return front * _betacf(a, b, x) / a
    return 1.0 - front * _betacf(b, a, 1.0 - x) / b


def t_two_sided_p(t: float, dof: int) -> float:
    """P(|T| ≥ |t|) for Student's T with ``dof`` degrees of freedom."""
    if not math.isfinite(t):
        return 0.0
    return betainc(dof / 2.0, 0.5, dof / (dof + t * t))


def t_quantile(q: float, dof: int) -> float:
    """t_q(ν): the q-quantile (q > 0.5) of Student's t, by bisection on `t_two_sided_p` to 1e-12."""
    target = 2.0 * (1.0 - q)  # the two-sided tail beyond t_q
    lo, hi = 0.0, 1.0
    while t_two_sided_p(hi, dof) > target:
        hi *= 2.0
    while hi - lo > 1e-12 * max(hi, 1.0):
        mid = (lo + hi) / 2.0
        lo, hi = (mid, hi) if t_two_sided_p(mid, dof) > target else (lo, mid)
    return (lo + hi) / 2.0


def confidence_interval(mean: float, se: float, dof: int, level: float = 1 - ALPHA) -> tuple[float, float]:
    """mean ± t_{(1+level)/2}(dof) · SE."""
    half = t_quantile((1.0 + level) / 2.0, dof) * se
    return mean - half, mean + half


def holm(ps: list[float]) -> list[float]:
    """Holm-adjusted p-values, in the order of ``ps``."""
    m = len(ps)
    order = sorted(range(m), key=lambda i: ps[i])
    adjusted, running = [0.0] * m, 0.0
    for rank, i in enumerate(order):
        running = max(running, min(1.0, (m - rank) * ps[i]))
        adjusted[i] = running
    return adjusted


def censored_median(values: list[float | None]) -> float | None:
    """The median of ``values`` with None (never reached) counted as +∞; None when it is +∞ or there are none."""
    if not values:
        return None
    xs = sorted(math.inf if v is None else float(v) for v in values)
    n = len(xs)
    mid = xs[n // 2] if n % 2 else (xs[n // 2 - 1] + xs[n // 2]) / 2.0
    return None if math.isinf(mid) else mid
