"""The report's inference (grow.report.inference, SciPy and statsmodels): Student's t against the printed
tables, Welch's test and TOST against their formulas, Holm's correction against its definition, the
minimum detectable effect, the censored median. Tolerances: the tables print 3 decimals."""

from __future__ import annotations

import math
import statistics

import pytest

_st = pytest.importorskip("scipy.stats")  # the report extra; make test installs it

from grow.report.inference import (  # noqa: E402
    censored_median,
    confidence_interval,
    holm,
    min_detectable_effect,
    paired_test,
    t_quantile,
    t_two_sided_p,
    tost,
    welch_test,
)

# Two-sided 5% critical values of Student's t, t_0.975(dof) (NIST/SEMATECH e-Handbook 1.3.6.7.2)
T_975 = {1: 12.706, 2: 4.303, 3: 3.182, 4: 2.776, 5: 2.571, 6: 2.447, 7: 2.365, 8: 2.306, 9: 2.262, 10: 2.228,
         11: 2.201, 12: 2.179, 13: 2.160, 14: 2.145, 15: 2.131, 16: 2.120, 17: 2.110, 18: 2.101, 19: 2.093,
         20: 2.086}

# Student's t, two-sided 1% and 10% critical values (any statistics table, e.g. NIST/SEMATECH e-Handbook 1.3.6.7.2)
T_995 = {1: 63.657, 2: 9.925, 3: 5.841, 5: 4.032, 10: 3.169, 20: 2.845}
T_95 = {1: 6.314, 2: 2.920, 3: 2.353, 5: 2.015, 10: 1.812, 20: 1.725}


@pytest.mark.parametrize("dof", sorted(T_975))
def test_the_t_quantile_is_the_printed_table(dof):
    assert t_quantile(0.975, dof) == pytest.approx(T_975[dof], abs=6e-4)
    if dof in T_995:
        assert t_quantile(0.995, dof) == pytest.approx(T_995[dof], abs=6e-4)
        assert t_quantile(0.95, dof) == pytest.approx(T_95[dof], abs=6e-4)


def test_the_two_sided_p_value_inverts_the_quantile_and_has_closed_forms():
    for dof in (1, 2, 3, 7, 30):
        for q in (0.9, 0.975, 0.999):
            assert t_two_sided_p(t_quantile(q, dof), dof) == pytest.approx(2 * (1 - q), rel=1e-9)
    for t in (0.3, 1.0, 4.303, 25.0):
        assert t_two_sided_p(t, 1) == pytest.approx(1 - 2 * math.atan(t) / math.pi, rel=1e-12)  # Cauchy
        assert t_two_sided_p(t, 2) == pytest.approx(1 - t / math.sqrt(2 + t * t), rel=1e-12)
        assert t_two_sided_p(-t, 2) == t_two_sided_p(t, 2)
    assert t_two_sided_p(1.959964, 10**7) == pytest.approx(0.05, abs=1e-6)  # the normal limit
    assert t_two_sided_p(0.0, 4) == pytest.approx(1.0) and t_two_sided_p(math.inf, 4) == 0.0


def test_welch_is_the_unpooled_t_with_satterthwaite_degrees_of_freedom():
    """Welch's test by hand in float64: SE = sqrt(s_a²/n_a + s_r²/n_r), ν = (va + vr)² / (va²/(n_a−1) + vr²/(n_r−1))."""
    a, r = [3.90, 4.05, 4.10, 3.95], [4.00, 4.10, 4.20]
    w = welch_test(a, r)
    va, vr = statistics.variance(a) / 4, statistics.variance(r) / 3
    dof = (va + vr) ** 2 / (va ** 2 / 3 + vr ** 2 / 2)
    mean = sum(a) / 4 - sum(r) / 3
    assert w["test"] == "welch" and w["mean"] == pytest.approx(mean, abs=1e-15)
    assert w["se"] == pytest.approx(math.sqrt(va + vr), rel=1e-12) and w["dof"] == pytest.approx(dof, rel=1e-12)
    assert w["t"] == pytest.approx(mean / math.sqrt(va + vr), rel=1e-12)
    assert w["p"] == pytest.approx(t_two_sided_p(w["t"], dof), rel=1e-10)
    half = t_quantile(0.975, dof) * w["se"]
    assert w["ci95"] == pytest.approx([mean - half, mean + half], rel=1e-12)
    # the paired test of the same first three values differs: it uses the differences' spread
    p = paired_test(a[:3], r)
    assert p["test"] == "paired" and p["t"] == pytest.approx(-5.0) and p["dof"] == 2
    assert welch_test([4.0], r)["se"] is None  # one value a side: no SE


def test_tost_is_the_larger_of_two_one_sided_p_values():
    """Equivalence within ±m: p = max(P(T > (Δ + m)/SE), P(T < (Δ − m)/SE)) with the test's own SE and dof."""
    a, r = [3.90, 4.05, 4.10, 3.95], [4.00, 4.10, 4.20]
    w = welch_test(a, r)
    for m in (0.02, 0.2, 0.5):
        lower = 1 - _st.t.cdf((w["mean"] + m) / w["se"], w["dof"])
        upper = _st.t.cdf((w["mean"] - m) / w["se"], w["dof"])
        assert tost(a, r, False, m) == pytest.approx(max(lower, upper), rel=1e-9)
    assert tost(a, r, False, 0.5) < 0.05 < tost(a, r, False, 0.02)  # a wide margin is met, a narrow one not
    d = [x - y for x, y in zip(a[:3], r)]
    se = statistics.stdev(d) / math.sqrt(3)
    m = 0.2
    want = max(1 - _st.t.cdf((statistics.mean(d) + m) / se, 2), _st.t.cdf((statistics.mean(d) - m) / se, 2))
    assert tost(a[:3], r, True, m) == pytest.approx(want, rel=1e-9)


def test_the_minimum_detectable_effect_is_the_power_analysis_of_a_two_sample_t():
    """At n = 5 per arm, alpha 0.05, power 0.8: d = 2.024 SDs (statsmodels; any power table: 2.02); the
    noncentral t at that d has power 0.8."""
    d = min_detectable_effect(1.0, 5)
    assert d == pytest.approx(2.0244, abs=1e-3)
    nc, dof = d * math.sqrt(5 / 2), 8
    crit = _st.t.ppf(0.975, dof)
    assert 1 - _st.nct.cdf(crit, dof, nc) + _st.nct.cdf(-crit, dof, nc) == pytest.approx(0.8, abs=1e-6)
    assert min_detectable_effect(0.01, 5) == pytest.approx(0.01 * d) and min_detectable_effect(0.01, 1) is None


def test_the_interval_is_mean_plus_minus_t_times_se():
    lo, hi = confidence_interval(-0.0833, 0.0167, 2)
    assert (lo + hi) / 2 == pytest.approx(-0.0833) and (hi - lo) / 2 == pytest.approx(4.303 * 0.0167, rel=1e-4)


def test_holm_adjusts_by_rank_and_keeps_the_order_monotone():
    ps = [0.01, 0.04, 0.03, 0.005]
    # sorted: 0.005 (x4), 0.01 (x3), 0.03 (x2), 0.04 (x1, then the running max 0.06)
    assert holm(ps) == pytest.approx([0.03, 0.06, 0.06, 0.02])
    assert holm([0.5, 0.9]) == pytest.approx([1.0, 1.0]) and holm([]) == []
    assert holm([0.02]) == [0.02]  # one test: no correction


def test_holm_equals_statsmodels_multipletests_without_collecting_garbage(monkeypatch):
    """Exactly statsmodels' Holm (float64, ties and values above 1/n included), and no gc.collect()
    (statsmodels' calls it, ~0.4 s in a process holding torch)."""
    import gc

    import numpy as np
    from statsmodels.stats.multitest import multipletests

    rng = np.random.default_rng(0)
    families = [list(rng.uniform(0, 1, n) ** 3) for n in (2, 5, 17, 40)] + [[0.01, 0.01, 0.2, 0.01, 0.9]]
    monkeypatch.setattr(gc, "collect", lambda *a: 0)  # the reference's collections change no value: skipped (1 s)
    want = [[float(x) for x in multipletests(ps, alpha=0.05, method="holm")[1]] for ps in families]

    def refuse():
        raise AssertionError("gc.collect() called")

    monkeypatch.setattr(gc, "collect", refuse)
    assert [holm(ps) for ps in families] == want


def test_the_censored_median_counts_the_unreached_as_not_reached():
    assert censored_median([0.5, None, 0.7]) == 0.7
    assert censored_median([None, None, 0.7]) is None and censored_median([0.2, None]) is None
    assert censored_median([0.2, 0.4]) == pytest.approx(0.3) and censored_median([]) is None


def test_a_censored_cell_without_a_baseline_is_not_applicable_not_unreached():
    """A sweep with ``compare.baseline=false`` (the learning-rate check) has no loss to reach."""
    from grow.report.tables import fmt_stat

    unreached = {"values": [None, None, None], "mean": None, "std": None, "reached": 0}
    assert fmt_stat(unreached, "frac", baseline_missing=True) == "n/a"
    assert fmt_stat(unreached, "frac") == "not reached (0/3 reached)"
    assert fmt_stat({"values": [0.5, None, 0.7], "mean": None, "std": None, "reached": 2}, "frac") == \
        "0.700 median (2/3 reached)"


def test_the_significance_star_is_holms_rule_p_holm_at_most_alpha():
    """Holm's step-down rejects a hypothesis when its adjusted p is <= alpha: 0.05 exactly is starred, above not."""
    from grow.report.inference import ALPHA
    from grow.report.tables import fmt_t

    pair = {"n": 3, "t": -5.0, "p": 0.01}
    assert fmt_t({**pair, "p_holm": ALPHA}).endswith("Holm 0.050*")
    assert fmt_t({**pair, "p_holm": 0.0501}).endswith("Holm 0.050")
