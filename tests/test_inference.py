"""The report's inference (grow.report.inference): Student's t against the printed tables, Holm's
correction against its definition, the censored median. Tolerances: the tables print 3 decimals."""

from __future__ import annotations

import math

import pytest

from grow.report.inference import (
    betainc,
    censored_median,
    confidence_interval,
    holm,
    t_quantile,
    t_two_sided_p,
)
from grow.report.stats import T_975

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
    assert betainc(2.0, 3.0, 0.4) == pytest.approx(0.5248, abs=1e-12)  # 1 - sum_{j<2} C(4,j) .4^j .6^(4-j)


def test_the_interval_is_mean_plus_minus_t_times_se():
    lo, hi = confidence_interval(-0.0833, 0.0167, 2)
    assert (lo + hi) / 2 == pytest.approx(-0.0833) and (hi - lo) / 2 == pytest.approx(4.303 * 0.0167, rel=1e-4)


def test_holm_adjusts_by_rank_and_keeps_the_order_monotone():
    ps = [0.01, 0.04, 0.03, 0.005]
    # sorted: 0.005 (x4), 0.01 (x3), 0.03 (x2), 0.04 (x1, then the running max 0.06)
    assert holm(ps) == pytest.approx([0.03, 0.06, 0.06, 0.02])
    assert holm([0.5, 0.9]) == pytest.approx([1.0, 1.0]) and holm([]) == []
    assert holm([0.02]) == [0.02]  # one test: no correction


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
