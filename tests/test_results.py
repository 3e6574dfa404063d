"""The results: paired differences over seeds in the report, and docs/results.md rendered from the
committed sweep summaries (scripts/results.py).

Three kinds of test: the statistics on a sweep written by hand, whose answers are known; the whole
path (grow compare -> publish -> render -> check) on a tiny sweep these tests train; and the
committed page itself: docs/results.md is what scripts/results.py renders from docs/results/*/
summary.json, and (issue 21) a committed sweep has three seeds per arm and the baseline.
"""

from __future__ import annotations

import importlib.util
import json
import math
import shutil
import subprocess
import sys

import numpy as np
import pytest
import yaml

from grow.console import fmt_num
from grow.report import build_report, compare_arms, paired, stat
from tests.conftest import ROOT, TINY_RUN, assert_make_lists, grow_cli
from tests.helpers import LOSSES, fake_sweep

spec = importlib.util.spec_from_file_location("results", ROOT / "scripts" / "results.py")
results = importlib.util.module_from_spec(spec)
spec.loader.exec_module(results)

COMMITTED = sorted((ROOT / "docs" / "results").glob("*/summary.json"))


# ---- a sweep written by hand --------------------------------------------------------------------------

# final validation losses per seed; the grown arms spend 600 FLOPs, the baselines 1000


@pytest.fixture(scope="module")
def reported(tmp_path_factory):
    """fake_sweep's sweep and the report build_report wrote into it, built once for the file (about a second of
    plots each); `_reported` hands each test its own copy."""
    d = fake_sweep(tmp_path_factory.mktemp("reported") / "sweep")
    return d, build_report([d], d, show=False)


def _reported(reported, dest):
    """The module's reported sweep copied to ``dest`` and the summary build_report returned, each naming ``dest``
    where it named the sweep (its sources, report.md): what build_report at ``dest`` writes and returns."""
    src, summary = reported
    shutil.copytree(src, dest)
    for name in ("summary.json", "report.md"):
        (dest / name).write_text((dest / name).read_text().replace(str(src), str(dest)))
    return dest, json.loads(json.dumps(summary).replace(str(src), str(dest)))


def test_paired_difference_mean_se_and_t():
    p = paired([(0, 3.90, 4.00), (1, 4.05, 4.10), (2, 4.10, 4.20)])
    assert p["diffs"] == pytest.approx([-0.10, -0.05, -0.10])
    assert p["mean"] == pytest.approx(-0.25 / 3)
    assert p["sd"] == pytest.approx(math.sqrt(0.0016666667 / 2))
    assert p["se"] == pytest.approx(p["sd"] / math.sqrt(3)) and p["t"] == pytest.approx(-5.0) and p["dof"] == 2
    one = paired([(0, 3.9, 4.0), (1, None, 4.1), (2, 4.0, math.nan)])  # missing and non-finite pairs left out
    assert one["n"] == 1 and one["seeds"] == [0] and one["se"] is None and one["t"] is None
    same = paired([(0, 4.3, 4.2), (1, 4.4, 4.3)])  # equal differences (up to rounding): SE 0, no t
    assert same["se"] == 0.0 and same["t"] is None
    assert paired([])["n"] == 0 and paired([])["mean"] is None


def test_report_pairs_every_arm_with_its_references_by_seed(tmp_path, reported):
    d, summary = _reported(reported, tmp_path / "sweep")
    arms = {e["arm"]: e for e in summary["arms"]}
    # the order: baseline, matched baselines, grown arms, equal-FLOPs arms by size
    assert list(arms) == ["baseline", "baseline init=vt", "vt", "zero", "equal_flops size=s1", "equal_flops"]
    vt = arms["vt"]["comparisons"]
    # a grown arm shares no initialization with a reference (its start model is drawn at its own shape):
    # Welch, unpaired; by hand: SE = sqrt(s_vt²/3 + s_base²/3) with s_base = 0.1, s_vt² = 0.010833
    w = vt["baseline"]["final_val_loss"]
    assert vt["baseline"]["arm"] == "baseline" and w["test"] == "welch"
    assert w["se"] == pytest.approx(math.sqrt((0.0108333333333 + 0.01) / 3), rel=1e-9)
    assert w["t"] == pytest.approx(-0.25 / 3 / w["se"], rel=1e-9)  # the paired t of these seeds would be -5.0
    m = vt["matched"]["final_val_loss"]
    assert vt["matched"]["arm"] == "baseline init=vt" and m["mean"] == pytest.approx(-0.07 / 3) and m["test"] == "welch"
    # the best fixed size at equal FLOPs: the lowest mean final loss among the equal-FLOPs arms of the budget
    (best,) = summary["best_equal_flops"]
    assert best["arm"] == "equal_flops size=s1" and set(best["grown_arms"]) == {"vt", "zero"}
    b = vt["best_equal_flops"]["final_val_loss"]
    assert b["test"] == "welch" and b["family"] == "headline" and b["mean"] == pytest.approx(-0.8 / 3)
    # the final-size fixed arm starts where the baseline does (same shape and initializer): paired
    assert arms["equal_flops"]["comparisons"]["baseline"]["final_val_loss"]["test"] == "paired"
    assert summary["tests"] == {"headline": 2, "other": 7} and summary["equivalence_margin"] == 0.02
    assert summary["headline"]["arms"] == ["vt", "zero"] and summary["headline"]["final_val_loss"]["n"] == 6
    assert "matched" not in arms["zero"]["comparisons"]  # zero keeps the model's initializer: baseline is its own
    assert arms["baseline init=vt"]["comparisons"]["baseline"]["final_val_loss"]["mean"] == pytest.approx(-0.06)
    assert arms["baseline"]["comparisons"] == {}
    # FLOPs to reach the reference's final loss, paired against the reference reaching its own
    reach = vt["baseline"]["flops_to_reach"]
    want = [(300 + 300 * (4.52 - b) / (4.52 - v)) / 1000 - 1.0 for v, b in zip(LOSSES["vt"], LOSSES["baseline"])]
    assert reach["diffs"] == pytest.approx(want) and reach["n"] == 3 and reach["test"] == "welch"
    # seed 1: vt (4.05) never reaches the matched loss (4.02): censored, no difference over the other two
    assert vt["matched"]["flops_to_reach"]["n"] == 0 and vt["matched"]["flops_to_reach"]["censored"] == 1
    assert arms["vt"]["flops_to_matched_loss"]["reached"] == 2
    # summary.json's figures are those compare_arms recomputes from its per-run values
    on_disk = json.loads((d / "summary.json").read_text())
    again = compare_arms(on_disk["arms"])
    assert {e["arm"]: e["comparisons"] for e in on_disk["arms"]} == json.loads(json.dumps(again["arms"]))
    md = (d / "report.md").read_text()
    # mean ± SE [95% CI] and the test, t · two-sided p · Holm within its family; TOST at ±0.02
    assert "| vt | 0,1,2 | 4.0167 ± 0.1041 | -0.0833 ± 0.0833 [-0.3148, +0.1482] | Welch -1.0 · p 0.374 · Holm(other) " \
           "1.000 | -0.0233 ± 0.0839 [-0.2564, +0.2098] | Welch -0.3 · p 0.795 · Holm(other) 1.000 | -0.2667 ± 0.0850 " \
           "[-0.5026, -0.0307] | Welch -3.1 · p 0.035 · Holm(headline) 0.070 | p 0.978 |" in md
    assert "| zero | 0,1,2 | 4.3867 ± 0.1026 | +0.2867 ± 0.0827 [+0.0569, +0.5164] | Welch +3.5 · p 0.026 · " \
           "Holm(other) 0.127 |" in md
    assert "2 test(s) in the headline family" in md and "Minimum detectable effect: with n = 3 seeds" in md
    assert "frontier has 2 points" in md  # 600 FLOPs (the fixed sizes, best 4.2833) and 1000 (the baseline)
    # FLOPs to reach, censored: the median with the unreached counted, a difference only when all reached
    assert "| vt | 0.552 median (3/3 reached) |" in md and "| 0.576 median (2/3 reached) | censored: 1 of 3 seeds " \
           "not reached | — |" in md
    assert "| zero | not reached (0/3 reached) | censored: 3 of 3 seeds not reached | — |" in md
    assert "| baseline | 0,1,2 | 4.1000 ± 0.1000 | reference |  |" in md
    assert "Best fixed size at equal FLOPs: **`equal_flops size=s1`**" in md
    # Hoffmann et al.'s N ≈ √(C/120): 5.44T FLOPs (small-1m's grown arms) call for ~213k parameters
    from grow.report.tables import compute_optimal_params

    assert compute_optimal_params(5.44e12) == pytest.approx(212.9e3, rel=1e-3)
    assert "Compute-optimal size" in md and "for the baseline's 1k FLOPs" in md
    assert "a training split of 5k tokens" in md and "scores 4.9000 nats on the validation batches" in md
    assert "| vt | 600 ± 0 | 60.0% ± 0.0 | 2.00 ± 0.00 | 100.0% ± 0.0 | 1.0–1.5 | 0.200 ± 0.000 |" in md  # epochs
    assert "vt against `baseline init=vt`" in md
    # recovery against the baseline over the same steps 4 -> 9: (4.2 - 4.8) - (4.1 - 4.6) = -0.1
    assert "| zero | 1 ± 0 | 0.0200 ± 0.0000 | -0.1000 ± 0.0000 (@5 steps) | -0.1000 ± 0.0000 |" in md


def _fixed(label, kind, flops, losses, params=100):
    return {"arm": label, "kind": kind, "parameterization": None,
            "runs": [{"seed": i, "flops": flops, "final_val_loss": v, "params": params} for i, v in enumerate(losses)]}


def test_the_effective_compute_multiplier_reads_the_fixed_size_frontier_in_log_flops():
    """Frontier: 100 FLOPs → 4.0, 200 → 3.5 (two sizes at 200 within 1%: one budget, the lower kept), 400 →
    3.2; an arm at 3.3 mean loss on 300 FLOPs: log C = log 200 + (3.5 − 3.3)/(3.5 − 3.2) · log 2, so the
    multiplier is 200 · 2^(2/3) / 300. Fewer than three budgets: no multipliers."""
    from grow.report.frontier import compute_at, effective_compute, envelope

    arms = [_fixed("a", "equal_flops", 100.0, [4.01, 3.99]), _fixed("b", "equal_flops", 200.0, [3.49, 3.51]),
            _fixed("b2", "equal_flops", 201.0, [3.9, 3.9], params=50), _fixed("c", "baseline", 400.0, [3.21, 3.19]),
            {"arm": "g", "kind": "grown", "parameterization": None,
             "runs": [{"seed": i, "flops": 300.0, "final_val_loss": v} for i, v in enumerate([3.28, 3.32])]}]
    front = envelope([(100.0, 4.0), (200.0, 3.5), (201.0, 3.9), (400.0, 3.2), (500.0, 3.3)])
    assert front == [(100.0, 4.0), (200.0, 3.5), (400.0, 3.2)]  # 201 merged into 200; 500 is above 400's loss
    assert compute_at(front, 3.3) == pytest.approx(200 * 2 ** (2 / 3), rel=1e-12)
    assert compute_at(front, 4.1) is None and compute_at(front, 3.1) is None  # off the frontier
    ec = effective_compute(arms, ["g"])
    assert len(ec["points"]) == 3
    g = ec["arms"]["g"]
    # 2 seeds: each seed's run against its own seed's frontier (seed 0: 3.28 between 200 → 3.49 and 400 → 3.21;
    # seed 1: 3.32 between 3.51 and 3.19), the t-interval (1 dof, t = 12.706) of their log-multipliers
    logs = [math.log(200 * 2 ** ((3.49 - 3.28) / (3.49 - 3.21)) / 300), math.log(200 * 2 ** ((3.51 - 3.32) / (3.51 - 3.19)) / 300)]
    assert g["method"] == "t" and g["log_multipliers"] == pytest.approx(logs, rel=1e-12)
    mean, half = sum(logs) / 2, 12.706204736174707 * abs(logs[0] - logs[1]) / 2
    assert g["multiplier"] == pytest.approx(math.exp(mean), rel=1e-12)
    assert g["ci95"] == pytest.approx([math.exp(mean - half), math.exp(mean + half)], rel=1e-9)
    assert ec["arms"]["c"]["multiplier"] == pytest.approx(1.0) and ec["pooled"]["multiplier"] == g["multiplier"]
    assert ec["shape"] == "one size at three budgets"  # b2 (50 parameters) is not on it; a, b and c are 100
    # a seed below its own frontier is a bound, not a value: no interval over the seeds
    from grow.report.frontier import per_seed

    low = {**arms[4], "runs": [{"seed": 0, "flops": 300.0, "final_val_loss": 3.28}, {"seed": 1, "flops": 300.0, "final_val_loss": 3.1}]}
    off = per_seed([low], arms[:4])
    assert off["off"] == [1] and off["ci95"] is None and off["multiplier"] is None
    # from 8 seeds the percentile bootstrap over seeds, on the mean frontier
    eight = [_fixed(e["arm"], e["kind"], e["runs"][0]["flops"], [m["final_val_loss"] for m in e["runs"]] * 4) for e in arms[:4]]
    eight.append({**arms[4], "runs": [{"seed": i, "flops": 300.0, "final_val_loss": (3.28, 3.32)[i % 2]} for i in range(8)]})
    g8 = effective_compute(eight, ["g"])["arms"]["g"]
    assert g8["method"] == "bootstrap" and g8["multiplier"] == pytest.approx(200 * 2 ** (2 / 3) / 300, rel=1e-12)
    assert g8["ci95"][0] < g8["multiplier"] < g8["ci95"][1] < ec["arms"]["g"]["ci95"][1]
    assert effective_compute(arms, ["g"]) == ec  # a fixed random stream: summary.json is reproducible
    two = effective_compute([a for a in arms if a["arm"] != "c"], ["g"])
    assert len(two["points"]) == 2 and two["arms"] == {} and two["pooled"] is None
    # beyond the frontier: below its lowest loss the multiplier is at least C_last / C, above its highest at most
    from grow.report.frontier import bound
    from grow.report.tables import _fmt_mult

    assert bound(front, 3.1, 300.0) == (">", pytest.approx(400 / 300)) and bound(front, 4.1, 50.0) == ("<", 2.0)
    assert bound(front, 3.3, 300.0) is None and bound([], 3.3, 300.0) is None
    assert _fmt_mult({"multiplier": None, "ci95": [math.inf, math.inf]}, bound(front, 3.1, 300.0)) == "> 1.33"
    assert _fmt_mult({"multiplier": 0.5, "ci95": [0.4, math.inf]}) == "0.50 [0.40, ∞]"
    assert _fmt_mult(None) == "off the frontier"
    assert _fmt_mult({"multiplier": 0.86, "ci95": None, "off": [1]}) == "0.86 (no interval: seed 1 off its frontier)"


def test_the_bootstrap_s_resamples_at_once_are_each_resample_s_frontier_to_the_bit():
    """`frontier._estimates` (every resample at once) against `envelope` and `_multiplier` resample by resample:
    budgets within 1% merged, ties, frontiers that cross the arm's loss, points above an earlier one's loss."""
    from grow.report.frontier import _estimates, _multiplier, envelope

    rng = np.random.default_rng(3)
    for _ in range(50):
        cs = [float(c) for c in rng.choice([1e12, 1.005e12, 2e12, 4e12, 4.02e12, 8e12], size=rng.integers(1, 7))]
        losses = rng.choice([2.9, 3.0, 3.1, 3.2], size=(len(cs), 400)) + rng.normal(0, 0.05, (len(cs), 400)) * (
            rng.random((len(cs), 1)) < 0.5)
        arm = 3.0 + rng.normal(0, 0.1, 400)
        want = []
        for b in range(400):
            front = envelope([(c, float(ls[b])) for c, ls in zip(cs, losses)])
            m = _multiplier(front, float(arm[b]), 3e12)
            want.append(m if m is not None else (0.0 if arm[b] > front[0][1] else math.inf))
        assert _estimates(cs, losses, arm, 3e12).tolist() == want


def test_the_delta_and_flops_to_target_plots_follow_the_best_fixed_size(tmp_path, reported):
    """The report writes the Δ plot and the FLOPs-to-target plot beside report.md and links them; without an
    equal-FLOPs arm there is no best fixed size, so no Δ plot, no link to one, and none an earlier report left."""
    from PIL import Image

    d, _ = _reported(reported, tmp_path / "sweep")
    for name in ("delta_vs_flops.png", "flops_to_target.png"):
        assert Image.open(d / name).size[0] > 500 and f"]({name})" in (d / "report.md").read_text()
    no_eq = fake_sweep(tmp_path / "no_eq", {k: v for k, v in LOSSES.items() if not k.startswith("equal_flops")})
    (no_eq / "delta_vs_flops.png").write_bytes(b"an earlier report's")  # not published with these runs
    build_report([no_eq], no_eq, show=False)
    assert not (no_eq / "delta_vs_flops.png").exists() and (no_eq / "flops_to_target.png").is_file()
    text = (no_eq / "report.md").read_text()
    assert "(delta_vs_flops.png)" not in text and "](flops_to_target.png)" in text  # no link to a missing file
    from grow.report.plots import delta_reference

    front = {"effective_compute": {"points": [[1e12, 4.0], [2e12, 3.0], [4e12, 2.5]]}}
    assert delta_reference({"best_equal_flops": [{"arm": "equal_flops"}], **front}) == "best"
    assert delta_reference(front) == "frontier"  # fixed sizes at their own budgets (gpu-depth)
    assert delta_reference({"effective_compute": {"points": front["effective_compute"]["points"][:2]}}) is None


def test_one_seed_has_no_standard_error_and_pairs_only_shared_seeds(tmp_path):
    one = fake_sweep(tmp_path / "one", seeds=(0,))
    build_report([one], one, show=False)
    md = (one / "report.md").read_text()
    assert "| vt | 0 | 3.9000 | -0.1000 (n=1) | n=1 |" in md
    losses = {**LOSSES, "baseline": [4.00, 4.10, None]}  # the baseline of seed 2 is missing
    d = fake_sweep(tmp_path / "two", losses)
    summary = build_report([d], d, show=False)
    vt = next(e for e in summary["arms"] if e["arm"] == "vt")
    assert vt["comparisons"]["baseline"]["final_val_loss"]["seeds"] == [0, 1]


def test_across_sweeps_a_grown_arm_pairs_with_the_matched_baseline_of_another(tmp_path):
    """grow report over two sweeps: B has vt alone (compare.baseline=false, no matched baseline); its vt is
    paired with A's baseline and A's baseline init=vt (same final model and token budget)."""
    a = fake_sweep(tmp_path / "A")
    b = fake_sweep(tmp_path / "B", {"vt": [3.80, 3.90, 4.00]})
    summary = build_report([a, b], tmp_path / "report", show=False)
    arms = {e["arm"]: e for e in summary["arms"]}
    assert set(arms) == {"baseline", "baseline init=vt", "vt [A]", "vt [B]", "zero", "equal_flops size=s1",
                         "equal_flops"}
    vt_b = arms["vt [B]"]["comparisons"]
    assert vt_b["matched"]["arm"] == "baseline init=vt" and vt_b["baseline"]["arm"] == "baseline"
    assert vt_b["matched"]["final_val_loss"]["diffs"] == pytest.approx([-0.15, -0.12, -0.15])


def test_across_sweeps_a_baseline_trained_at_another_learning_rate_is_no_reference(tmp_path):
    """A learning-rate check's sweep (compare.baseline=false) beside the sweep of the baselines: its arms at
    another peak rate get no baseline from there (their configs' optim differs); at the same rate they do."""
    a = fake_sweep(tmp_path / "A")
    b = fake_sweep(tmp_path / "B", {"vt": [3.80, 3.90, 4.00], "zero": [4.0, 4.1, 4.2]})
    for run in [*a.iterdir(), *b.iterdir()]:
        lr = 0.01 if run.name.startswith("vt") and run.parent == b else 0.003
        (run / "config.yaml").write_text(f"seed: 0\noptim:\n  lr: {lr}\n")
    summary = build_report([a, b], tmp_path / "report", show=False)
    arms = {e["arm"]: e for e in summary["arms"]}
    assert {"vt optim.lr=0.003", "vt optim.lr=0.01", "zero [A]", "zero [B]"} <= set(arms)
    assert arms["vt optim.lr=0.01"]["comparisons"].get("baseline") is None
    assert arms["vt optim.lr=0.01"]["comparisons"].get("matched") is None
    assert arms["zero [B]"]["comparisons"]["baseline"]["arm"] == "baseline"


def test_two_sweeps_of_the_same_name_are_told_apart_by_their_parents(tmp_path):
    a = fake_sweep(tmp_path / "a" / "sweep", {"baseline": LOSSES["baseline"], "zero": LOSSES["zero"]})
    b = fake_sweep(tmp_path / "b" / "sweep", {"baseline": [4.0, 4.0, 4.0], "zero": [4.1, 4.2, 4.2]})
    summary = build_report([a, b], tmp_path / "report", show=False)
    arms = {e["arm"]: e for e in summary["arms"]}
    assert set(arms) == {"baseline [a/sweep]", "baseline [b/sweep]", "zero [a/sweep]", "zero [b/sweep]"}
    assert arms["zero [b/sweep]"]["comparisons"]["baseline"]["arm"] == "baseline [b/sweep]"
    assert arms["zero [b/sweep]"]["comparisons"]["baseline"]["final_val_loss"]["diffs"] == pytest.approx([0.1, 0.2, 0.2])


def test_a_grow_train_run_in_the_strategys_parameterization_is_a_matched_baseline():
    from grow.runs import arm_of_train_run

    cfg = {"seed": 1, "init": "strategy", "strategy": {"name": "vt"}, "schedule": None}
    arm = arm_of_train_run({"complete": True}, cfg, "run", 0)
    assert (arm["arm"], arm["kind"], arm["parameterization"]) == ("baseline init=vt", "matched", "vt")
    assert arm_of_train_run({}, {**cfg, "init": "auto"}, "run", 0)["kind"] == "baseline"
    grown = arm_of_train_run({}, {**cfg, "init": "auto", "schedule": {"name": "exp"}}, "run", 0)
    assert (grown["kind"], grown["parameterization"]) == ("grown", "vt")
    assert arm_of_train_run({}, {**cfg, "strategy": {"name": "zero"}}, "run", 0)["kind"] == "baseline"


# ---- publish, render, check ------------------------------------------------------------------------------


def _page(root, text="# Results\n\nHand-written prose.\n"):
    (root / "docs").mkdir(parents=True, exist_ok=True)
    (root / "docs" / "results.md").write_text(text)
    return root / "docs" / "results.md"


def test_publish_copies_the_report_files_and_the_check_catches_any_changed_figure(tmp_path, capsys, reported):
    d, _ = _reported(reported, tmp_path / "sweep")
    (d / "vt-seed0" / "checkpoints").mkdir()  # never copied
    root = tmp_path / "repo"
    page = _page(root)
    dest = results.publish(d, "fake", root)
    assert sorted(p.name for p in dest.iterdir()) == sorted(results.REPORT_FILES + results.EXTRA_PLOTS)
    text = page.read_text()
    assert text.startswith("# Results\n\nHand-written prose.\n") and "<!-- tables:fake -->" in text
    assert "| vt | 0,1,2 | 4.0167 ± 0.1041 | -0.0833 ± 0.0833 [-0.3148, +0.1482] | Welch -1.0 · p 0.374 · " \
           "Holm(other) 1.000 |" in text
    assert "](results/fake/loss_vs_flops.png)" in text
    assert results.check(root) == []
    # prose outside the blocks is the author's: rendering keeps it
    page.write_text(text.replace("Hand-written prose.", "Other prose."))
    assert results.check(root) == [] and not results.render(root)
    # a figure on the page that differs from its summary.json
    page.write_text(page.read_text().replace("-0.0833 ± 0.0833", "-0.0933 ± 0.0833"))
    assert results.check(root) == ["fake"]
    assert results.main(["--root", str(root), "check"]) == 1 and "fake" in capsys.readouterr().err  # in-process
    assert results.render(root) and results.check(root) == []
    # a per-run figure of summary.json changed: the page no longer matches
    path = dest / "summary.json"
    s = json.loads(path.read_text())
    next(e for e in s["arms"] if e["arm"] == "vt")["runs"][0]["final_val_loss"] = 3.80
    path.write_text(json.dumps(s))
    assert results.check(root) == ["fake"]
    # a block whose sweep is not published says so, and renders the same way every time
    page.write_text("# R\n\n<!-- tables:later -->\n<!-- /tables:later -->\n")
    shutil.rmtree(dest)
    results.render(root)
    assert "_Not published yet: no docs/results/later/summary.json." in page.read_text()
    assert results.check(root) == []


def test_refresh_recomputes_a_published_sweeps_statistics_from_its_per_run_values(tmp_path, reported):
    """After a change of the statistics, refresh rewrites what summary.json's per-run values determine (the
    comparisons, the number of tests, report.md's tables) and nothing else; a second refresh changes nothing."""
    d, _ = _reported(reported, tmp_path / "sweep")
    root = tmp_path / "repo"
    _page(root)
    dest = results.publish(d, "fake", root)
    path, md = dest / "summary.json", dest / "report.md"
    want_summary, want_md = path.read_text(), md.read_text()
    s = json.loads(want_summary)  # as an older grow wrote it: no intervals, no Holm, no censoring
    for e in s["arms"]:
        for c in e["comparisons"].values():
            for key in ("final_val_loss", "flops_to_reach"):
                for k in ("p", "ci95", "p_holm", "censored", "of"):
                    c.get(key, {}).pop(k, None)
    del s["tests"]
    path.write_text(json.dumps(s, indent=2))
    md.write_text(want_md.replace(" [-0.3148, +0.1482] | Welch -1.0 · p 0.374 · Holm(other) 1.000 |", " | -1.0 |"))
    assert results.check(root) == []  # the page's tables are recomputed from the per-run values anyway
    assert results.refresh(root) == ["fake"]
    assert json.loads(path.read_text()) == json.loads(want_summary) and md.read_text() == want_md
    assert results.check(root) == []
    assert results.refresh(root) == []


def test_publish_refuses_a_stale_or_unfinished_report(tmp_path, reported):
    d = fake_sweep(tmp_path / "sweep")
    root = tmp_path / "repo"
    _page(root)
    with pytest.raises(results.ResultsError, match="no summary.json"):
        results.publish(d, "fake", root)
    shutil.rmtree(d)
    d, _ = _reported(reported, d)  # the same sweep, its report built (once for the file)
    with pytest.raises(results.ResultsError, match="letters, digits"):
        results.publish(d, "../x", root)
    (d / "late-seed0").mkdir()  # a run that finished after the report
    late = json.loads((d / "vt-seed0" / "summary.json").read_text())
    (d / "late-seed0" / "summary.json").write_text(json.dumps(late))
    with pytest.raises(results.ResultsError, match="older than the runs"):
        results.publish(d, "fake", root)
    shutil.rmtree(d / "late-seed0")
    (d / "zero-seed2" / "summary.json").unlink()  # an arm not finished
    build_report([d], d, show=False)
    with pytest.raises(results.ResultsError, match="unfinished arms"):
        results.publish(d, "fake", root)
    assert results.publish(d, "fake", root, allow_unfinished=True).is_dir()
    assert "| zero | 0,1 (unfinished: 2) |" in (root / "docs" / "results.md").read_text()


def test_publish_counts_a_grow_reports_runs_in_the_sweeps_it_read(tmp_path):
    """A `grow report` over two sweeps writes its summary.json elsewhere: publish counts the finished runs
    in the directories it names (its sources), and refuses it once one of them has a run it lacks."""
    a, b = fake_sweep(tmp_path / "A"), fake_sweep(tmp_path / "B", {"vt": [3.80, 3.90, 4.00]})
    out = tmp_path / "report"
    build_report([a, b], out, show=False)
    root = tmp_path / "repo"
    _page(root)
    assert results.publish(out, "two", root).is_dir()
    (b / "late-seed0").mkdir()
    (b / "late-seed0" / "summary.json").write_text((b / "vt-seed0" / "summary.json").read_text())
    with pytest.raises(results.ResultsError, match=r"older than the runs \(rebuild it: grow report runs=\["):
        results.publish(out, "two", root)
    shutil.rmtree(b)
    with pytest.raises(results.ResultsError, match="are not here"):
        results.publish(out, "two", root)
    # a sweep moved since its report was written (another machine, another path) counts the runs beside it
    build_report([a], a, show=False)
    moved = tmp_path / "elsewhere" / "A"
    shutil.move(str(a), str(moved))
    assert results.publish(moved, "moved", root).is_dir()


def test_a_tiny_sweep_from_grow_compare_to_the_page(tmp_path, capsys):
    """grow compare with the equal-FLOPs stage sizes and two seeds, published and rendered by the script."""
    d = tmp_path / "sweep"
    out = grow_cli("compare", "strategy=zero", "seed=0,1", "compare.equal_flops=true", "compare.equal_flops_sizes=stages",
                   *TINY_RUN, "trainer.max_tokens=4096", f"hydra.sweep.dir={d}", cwd=tmp_path)
    assert out.returncode == 0, out.stderr[-3000:]
    assert "best fixed size at equal FLOPs: equal_flops" in out.stdout
    zero = json.loads((d / "zero-seed0" / "arm.json").read_text())
    eq = json.loads((d / "equal_flops_size=s1-seed0" / "arm.json").read_text())
    assert zero["parameterization"] is None and eq["size"] == 1 and eq["budget_flops"] == zero["plan_flops"]
    summary = json.loads((d / "summary.json").read_text())
    assert [e["kind"] for e in summary["arms"]] == ["baseline", "grown", *["equal_flops"] * 4]
    # the regime and bits per byte (the validation split's bytes per token, recorded by every run)
    bpt = summary["scale"]["data"]["val_bytes_per_token"]
    assert 1.0 < bpt < 8.0 and summary["scale"]["data"]["bytes_per_token_tokens"] == summary["scale"]["data"]["val_tokens"]
    md = (d / "report.md").read_text()
    assert f"{bpt:.3f} bytes of text per validation token" in md and "non-embedding parameters of" in md
    zero = next(e for e in summary["arms"] if e["arm"] == "zero")
    bpb = zero["final_val_loss"]["mean"] / (math.log(2) * bpt)
    n = len(summary["effective_compute"]["points"])
    row = next(line for line in md.splitlines() if line.startswith(f"| zero | {fmt_num(zero['flops']['mean'])} | "))
    assert row.endswith(f"| {bpb:.4f} | frontier has {n} point{'' if n == 1 else 's'} |"), row
    root = tmp_path / "repo"
    _page(root)
    script = ["--root", str(root)]  # scripts/results.py's main, in-process
    assert results.main([*script, "publish", str(d), "tiny"]) == 0, capsys.readouterr().err
    text = (root / "docs" / "results.md").read_text()
    assert "| zero | 0,1 |" in text and "Best fixed size at equal FLOPs: **`equal_flops" in text
    assert "grow compare strategy=zero seed=0,1" in text  # the command that made it
    assert results.main([*script, "check"]) == 0


def test_make_has_the_results_sweeps_and_targets():
    """make sweep runs the published sweeps (configs/sweep/<name>.yaml: tests/test_sweep.py checks each against the
    command lines its summary.json says made it), with the eight strategies the committed sweeps ran pinned:
    strategy=all grows with every new strategy (#65)."""
    assert_make_lists("sweep ", "publish-results", "results ")
    pinned = "zero,vt,svd,random,net2net,stack,hyperclone,msg"
    for name in ("small-1m", "small-4m", "llama-small-1m"):
        summary = json.loads((ROOT / "docs" / "results" / name / "summary.json").read_text())
        grown = {a["arm"] for a in summary["arms"] if not a["arm"].startswith(("baseline", "equal_flops"))}
        assert grown == set(pinned.split(",")), name
        spec = yaml.safe_load((ROOT / "configs" / "sweep" / f"{name}.yaml").read_text())
        assert spec["arms"]["strategies"]["overrides"] == [f"strategy={pinned}"], name
    dry = subprocess.run(["make", "-n", "results", "ARGS="], cwd=ROOT, capture_output=True, text=True).stdout.splitlines()
    assert any(line.endswith("scripts/results.py --root . render") for line in dry), dry


# ---- the committed page -------------------------------------------------------------------------------


def test_docs_results_md_is_what_the_committed_summaries_render():
    """Every generated block of docs/results.md equals what scripts/results.py renders from its committed
    summary.json (a block of a sweep not committed yet says so); every committed sweep has a block.
    Fix a failure with `make results` (after changing a summary) -- never by editing the block."""
    assert results.check(ROOT) == [], "docs/results.md differs from docs/results/*/summary.json: run make results"


def _rounded(x):
    """``x`` with every float rounded to 12 significant digits (nested dicts and lists)."""
    if isinstance(x, float):
        return float(f"{x:.12g}")
    if isinstance(x, dict):
        return {k: _rounded(v) for k, v in x.items()}
    if isinstance(x, list):
        return [_rounded(v) for v in x]
    return x


@pytest.mark.skipif(not COMMITTED, reason="no sweep committed under docs/results/ yet")
@pytest.mark.parametrize("path", COMMITTED, ids=[p.parent.name for p in COMMITTED])
def test_a_committed_summary_agrees_with_its_own_per_run_figures(path):
    """The aggregates in a committed summary.json are those of its per-run values (nothing edited by hand)."""
    s = json.loads(path.read_text())
    again = compare_arms(s["arms"])
    # p-values and intervals go through lgamma, exp and log, whose last bits may differ with another libm or
    # CPU (glibc picks FMA variants at run time): compared to 12 significant digits, everything else exactly
    assert _rounded({e["arm"]: e["comparisons"] for e in s["arms"]}) == _rounded(json.loads(json.dumps(again["arms"])))
    for e in s["arms"]:
        for key in ("final_val_loss", "flops", "flops_pct_baseline", "flops_to_baseline_loss", "max_abs_growth_delta"):
            want = stat([m[key] for m in e["runs"]])
            assert e[key]["mean"] == pytest.approx(want["mean"]) and e[key]["n"] == want["n"], (e["arm"], key)
    for f in results.REPORT_FILES:
        assert (path.parent / f).is_file(), f
    assert not any(p.is_dir() for p in path.parent.iterdir()), "only the report files: no run directories"


# ACTIVE ONCE docs/results/ HOLDS A SWEEP (issue 21, "Must show"): skipped until the lead commits one.
@pytest.mark.skipif(not COMMITTED, reason="no sweep committed under docs/results/ yet")
def test_a_committed_sweep_has_three_seeds_per_arm_and_the_baseline():
    """At least one committed sweep has the baseline with three finished seeds, and three seeds per arm
    (finished, or diverged: a diverged run is a result), none unfinished."""
    good = []
    for path in COMMITTED:
        arms = json.loads(path.read_text())["arms"]
        base = [e for e in arms if e["kind"] == "baseline"]
        if (base and all(len(e["seeds"]) >= 3 for e in base)
                and all(len(set(e["seeds"]) | {int(k) for k in e["failed"]}) >= 3 and not e["incomplete"] for e in arms)):
            good.append(path.parent.name)
    assert good, f"no committed sweep with three seeds per arm and the baseline among {[p.parent.name for p in COMMITTED]}"


def one_growth_budgets() -> list[tuple[str, str, int]]:
    """(experiment, growth point, token budget) of configs/sweep/one-growth*-45/-60.yaml."""
    out = []
    for path in sorted((ROOT / "configs" / "sweep").glob("one-growth*.yaml")):
        if not path.stem.endswith(("-45", "-60")):
            continue
        spec = yaml.safe_load(path.read_text())
        arm = dict(o.split("=", 1) for o in spec["arms"]["strategies"]["overrides"])
        out.append((spec["common"][0].split("=")[1], arm["schedule.first_stage"][2:], int(arm["trainer.max_tokens"])))
    return out


def test_the_one_growth_sweeps_spend_the_small_1m_grown_arms_flops():
    """Each one-growth sweep (configs/sweep/one-growth[-llama]-45, -60) trains one growth from the small-1m plan's
    stage-1 size to its stage-2 size (llama-small-1m's for one-growth-llama), hundreds of steps in, on the budget
    at which its plan spends that multi-stage plan's grown arms' FLOPs (to 0.1%), as `grow schedule` counts them."""
    from hydra import compose, initialize_config_dir

    from grow.config import CONFIG_DIR
    from grow.run import load as load_run

    budgets = one_growth_budgets()
    assert sorted((e, at) for e, at, _ in budgets) == [("one-growth", "45"), ("one-growth", "60"),
                                                       ("one-growth-llama", "45"), ("one-growth-llama", "60")]

    def run(overrides):
        with initialize_config_dir(str(CONFIG_DIR), version_base="1.3"):
            return load_run(compose("train", overrides=overrides))

    multi = {"one-growth": run(["model=small", "+schedule=exp", "+schedule.start.n_heads=2"]).plan,
             "one-growth-llama": run(["model=llama-small", "+schedule=exp", "+schedule.start.n_heads=2"]).plan}
    for experiment, at, tokens in budgets:
        plan = run([f"+experiment={experiment}", f"schedule.first_stage=0.{at}", f"trainer.max_tokens={tokens}"]).plan
        ref = multi[experiment]
        assert abs(plan.total_flops / ref.total_flops - 1) < 1e-3, (experiment, at, plan.total_flops, ref.total_flops)
        keys = ("n_layers", "d_model", "n_heads", "n_kv_heads", "d_qk", "d_v", "d_ff", "activation", "positions")
        for s, r in zip(plan, ref):
            assert [getattr(s.cfg, k) for k in keys] == [getattr(r.cfg, k) for k in keys], (experiment, at)
        assert len(plan) == 2 and plan[0].steps >= 500 and abs(plan[0].tokens / plan.total_tokens - int(at) / 100) < 0.01
        assert run([f"+experiment={experiment}"]).trainer.max_tokens == int(dict(
            (a, t) for e, a, t in budgets if e == experiment)["45"])  # the experiment's own default: the 45% budget


def test_the_learning_rate_check_reuses_the_one_growth_sweeps_own_rate():
    """The learning-rate check (configs/sweep/one-growth-lr.yaml) trains only the rates that one-growth-45 did not:
    its arms at that sweep's own rate would be the same `grow train` runs (compared field by field but for the
    W&B names), so the combined report (its `then`) reads them from one-growth-45, whose growth point and budget
    it shares."""
    import dataclasses

    from hydra import compose, initialize_config_dir

    from grow.compare import arm_run, base_run
    from grow.config import CONFIG_DIR, RunConfig

    spec = yaml.safe_load((ROOT / "configs" / "sweep" / "one-growth-lr.yaml").read_text())
    lr = dict(o.split("=", 1) for o in spec["arms"]["rates"]["overrides"])
    rates = lr["optim.lr"].split(",")
    g45 = yaml.safe_load((ROOT / "configs" / "sweep" / "one-growth-45.yaml").read_text())
    at45 = dict(o.split("=", 1) for o in g45["arms"]["strategies"]["overrides"])
    assert [lr[k] for k in ("schedule.first_stage", "trainer.max_tokens", "strategy")] == [
        at45[k] for k in ("schedule.first_stage", "trainer.max_tokens", "strategy")]
    assert spec["then"] == ["grow", "report", "runs=[{sweeps}/one-growth-45,{out}]", "out={out}-report"]
    common = ["+experiment=one-growth", "strategy=msg", "seed=1", "schedule.first_stage=0.45", "trainer.max_tokens=7190306"]
    with initialize_config_dir(str(CONFIG_DIR), version_base="1.3"):
        sweep = compose("compare", overrides=common)
        own = float(sweep.optim.lr)
        checked = compose("compare", overrides=[*common, f"optim.lr={own}", "compare.baseline=false",
                                                "compare.matched_baseline=false"])
    assert own not in [float(r) for r in rates]  # not trained twice
    for kind in ("grown", "equal_flops"):
        a, b = (arm_run(base_run(c), kind, group="g", name="n") for c in (sweep, checked))
        config = [f.name for f in dataclasses.fields(RunConfig)]  # the Run's built objects compare by identity
        assert [getattr(a, n) for n in config] == [getattr(b, n) for n in config] and a.plan == b.plan, kind


def test_the_headline_says_what_the_one_growth_sweeps_found():
    """docs/results.md's headline against the published one-growth sweeps: the tuned rate is the best of the
    four for every arm; the operators pooled at that rate are worse than the best fixed size (Welch: the
    mean, interval and p the page gives, p < 0.05) and not equivalent within the margin; each operator's
    gap (their range, stack's interval) is the summary's, none below the fixed size at any rate, and the one
    significant after Holm within the headline family is named; after 60% every gap is significant; the
    minimum detectable effect is the summary's; the effective-compute multiplier (pooled, with its interval, and
    each operator's range) is one-growth-frontier's, whose three budgets come from the CPU (3.63T) and the H100,
    and the CPU's offset on one rerun H100 run (one-growth-cpu-check) is the page's and far below the gaps. (The README's first screen
    is the lead's: the line to use is in the branch's report.)"""
    import re

    def load(name):
        return json.loads((ROOT / "docs" / "results" / name / "summary.json").read_text())

    s_lr, s_late = load("one-growth-lr"), load("one-growth-60")
    lr = {e["arm"]: e for e in s_lr["arms"]}
    late = {e["arm"]: e for e in s_late["arms"]}
    rates = ("0.001", "0.003", "0.01", "0.03")
    kinds = ("msg", "vt", "zero", "stack", "equal_flops", "equal_flops size=s1")
    best = {k: min(rates, key=lambda r: lr[f"{k} optim.lr={r}"]["final_val_loss"]["mean"]) for k in kinds}
    assert set(best.values()) == {"0.01"}, best
    head = " ".join((ROOT / "docs" / "results.md").read_text().split("## What each sweep runs")[0].split())
    pooled = s_lr["headline"]
    assert sorted(pooled["arms"]) == sorted(f"{s} optim.lr=0.01" for s in kinds[:4])
    p = pooled["final_val_loss"]
    assert p["test"] == "welch" and p["p"] < 0.05 < p["tost_p"] and p["margin"] == 0.02
    ci = p["ci95"]
    assert (f"pooled end +{p['mean']:.3f} nats above the best fixed size trained from scratch on the same FLOPs "
            f"(95% CI [+{ci[0]:.3f}, +{ci[1]:.3f}], Welch p = {p['p']:.3f})") in head
    assert f"equivalence to it within ±0.02 nats is not shown (TOST p = {p['tost_p']:.2f})" in head
    assert "not equivalent" not in head  # a failed TOST is not a showing of a difference
    gap = {s: lr[f"{s} optim.lr=0.01"]["comparisons"]["best_equal_flops"]["final_val_loss"] for s in kinds[:4]}
    assert all(g["family"] == "headline" and g["test"] == "welch" for g in gap.values())
    assert all(lr[f"{s} optim.lr={r}"]["comparisons"]["best_equal_flops"]["final_val_loss"]["mean"] > 0
               for s in kinds[:4] for r in rates)
    lo, hi = min(g["mean"] for g in gap.values()), max(g["mean"] for g in gap.values())
    assert f"Each operator ends {lo:.3f}–{hi:.3f} nats above the best fixed size" in head
    readme = " ".join((ROOT / "README.md").read_text().split("\n## ")[0].split())  # its first screen
    assert f"each operator {lo:.3f}–{hi:.3f} nats above" in readme and "loses to the best fixed size" in readme, readme
    ci = gap["stack"]["ci95"]
    assert f"`stack` +{gap['stack']['mean']:.3f}, 95% CI [−{-ci[0]:.3f}, +{ci[1]:.3f}]" in head
    significant = [s for s, g in gap.items() if g["p_holm"] < 0.05]
    assert significant == ["msg"] and f"`msg` +{gap['msg']['mean']:.3f}, the one significant after Holm's correction" in head
    late_gaps = [late[s]["comparisons"]["best_equal_flops"]["final_val_loss"] for s in kinds[:4]]
    assert all(g["p_holm"] < 0.05 for g in late_gaps)
    m = re.search(r"after 60%\) ends (\d\.\d+)–(\d\.\d+) above it", head)
    assert m and (m.group(1), m.group(2)) == (f"{min(g['mean'] for g in late_gaps):.3f}", f"{max(g['mean'] for g in late_gaps):.3f}")
    assert f"Five seeds detect {s_lr['mde']['nats']:.3f} nats" in head and s_lr["mde"]["n"] == 5
    # the effective-compute multiplier (issue 43): one-growth-lr with a third fixed-size budget from a CPU, whose
    # offset from the H100 one rerun measures (one-growth-cpu-check)
    s_fr, s_cpu = load("one-growth-frontier"), load("one-growth-cpu-check")
    ec = s_fr["effective_compute"]
    assert len(s_lr["effective_compute"]["points"]) == 2 and len(ec["points"]) == 3
    assert [a["arm"] for a in ec["point_arms"]] == ["baseline [one-growth-frontier]", "equal_flops optim.lr=0.01", "baseline"]
    devices = [" ".join(a["machines"]) for a in ec["point_arms"]]
    assert "NVIDIA" not in devices[0] and all(d.startswith("NVIDIA H100") for d in devices[1:])
    assert s_fr["headline"] == s_lr["headline"] and s_fr["tests"] == s_lr["tests"]  # the third budget changes no test
    m, (lo, hi) = ec["pooled"]["multiplier"], ec["pooled"]["ci95"]
    assert ec["pooled"]["method"] == "t" and lo < 1 < hi and ec["pooled"]["arms"] == pooled["arms"]
    assert ec["shape"] == "one size at three budgets" and "one size at three budgets" in head
    worth = f"worth {m:.2f} of the FLOPs they spend (95% t-interval over seeds [{lo:.2f}, {hi:.2f}]"
    assert worth in head and worth in readme and "not shown to differ from 1" in head + readme
    each = [ec["arms"][a]["multiplier"] for a in pooled["arms"]]
    assert f"each operator {min(each):.2f}–{max(each):.2f}" in head
    n = len(next(e for e in s_fr["arms"] if e["arm"] == "baseline [one-growth-frontier]")["runs"])
    assert f"({n} seeds at 1e-2)" in head
    gpu = next(r for r in lr["equal_flops optim.lr=0.01"]["runs"] if r["seed"] == 0)["final_val_loss"]
    offset = s_cpu["arms"][0]["runs"][0]["final_val_loss"] - gpu
    assert abs(offset) < 0.01 * abs(gap["stack"]["mean"]) and f"{abs(offset) * 1e5:.1f} × 10⁻⁵ nats" in head
    assert "the regime where the literature reports gains" not in head.lower()


def test_published_svd_runs_carry_the_evaluation_flops_they_ran_uncounted(tmp_path):
    """scripts/svd_eval_flops.py (issue 42): each published svd run's growth FLOPs, less what it adds, decompose
    exactly and in one way into the statistics pass, the linear algebra and whole batch-evaluations of the line
    search; what it adds is 2 h V a token of those evaluations. Undoing it on a scratch copy and running the script
    gives back the committed summary, report and page; a second run changes nothing."""
    sys.path.insert(0, str(ROOT / "scripts"))
    import svd_eval_flops as fix

    checked = 0
    for path in (p for p in COMMITTED if p.parent.name in fix.SWEEPS):
        summary = json.loads(path.read_text())
        for arm in (a for a in summary["arms"] if a.get("strategy") == "svd"):
            per = fix.growths(next(s for s in summary["schedules"] if arm["arm"] in s["arms"])["stages"])
            for run in arm["runs"]:
                ns = fix.evaluations(run["growth_flops"] - run[fix.KEY], per)
                assert run[fix.KEY] == sum(n * g["uncounted"] for n, g in zip(ns, per)) > 0
                checked += 1
    assert checked == 9  # small-1m, small-4m, llama-small-1m: 3 seeds each
    # a scratch root of the page and these sweeps alone (the script refreshes and renders every published sweep,
    # and the others' bootstrap intervals take seconds): the page outside the blocks and their blocks come back
    for name in fix.SWEEPS:
        shutil.copytree(ROOT / "docs/results" / name, tmp_path / "docs/results" / name)
    shutil.copy(ROOT / "docs/results.md", tmp_path / "docs/results.md")
    target = tmp_path / "docs/results/llama-small-1m"
    want = {p: (tmp_path / p).read_text() for p in ("docs/results.md", "docs/results/llama-small-1m/report.md",
                                                     "docs/results/llama-small-1m/summary.json")}

    def page(text):
        blocks = {m["name"]: m["body"] for m in results.BLOCK.finditer(text) if m["name"] in fix.SWEEPS}
        return results.BLOCK.sub("", text), blocks
    summary = json.loads((target / "summary.json").read_text())
    arm = next(a for a in summary["arms"] if a["arm"] == "svd")
    for run in arm["runs"]:
        extra = run.pop(fix.KEY)
        ratio = (run["flops"] - extra) / run["flops"]
        run["growth_flops"] -= extra
        run["flops"] -= extra
        run["flops_pct_baseline"] *= ratio
    (target / "summary.json").write_text(json.dumps(summary, indent=2))
    assert fix.main(["--root", str(tmp_path)]) == 0
    got = {p: (tmp_path / p).read_text() for p in want}
    assert got["docs/results/llama-small-1m/report.md"] == want["docs/results/llama-small-1m/report.md"]
    assert page(got["docs/results.md"]) == page(want["docs/results.md"]) and len(page(want["docs/results.md"])[1]) == 3

    def svd_runs(text):
        return next(a for a in json.loads(text)["arms"] if a["arm"] == "svd")["runs"]

    for a, b in zip(svd_runs(got["docs/results/llama-small-1m/summary.json"]),
                    svd_runs(want["docs/results/llama-small-1m/summary.json"])):
        assert [a[k] for k in (fix.KEY, "flops", "growth_flops")] == [b[k] for k in (fix.KEY, "flops", "growth_flops")]
        assert a["flops_pct_baseline"] == pytest.approx(b["flops_pct_baseline"], rel=1e-12)
    again = (target / "summary.json").read_text()
    fix.main(["--root", str(tmp_path)])
    assert (target / "summary.json").read_text() == again



def test_grow_report_tests_equivalence_at_the_margin_it_is_given(tmp_path):
    """equivalence_margin= reaches every TOST of the report and summary.json (which refresh reuses): vt is
    0.27 nats below the best fixed size, not within ±0.02 (TOST p ≈ 1) but within ±1.0 (p < 0.05)."""
    from grow import cli

    d = fake_sweep(tmp_path / "sweep")
    for margin, out in ((0.02, tmp_path / "narrow"), (1.0, tmp_path / "wide")):
        try:
            cli.main(["report", f"runs=[{d}]", f"out={out}", f"equivalence_margin={margin}"])
        except SystemExit as exc:  # Hydra may end with exit status 0
            assert exc.code in (0, None)
        s = json.loads((out / "summary.json").read_text())
        vt = next(e for e in s["arms"] if e["arm"] == "vt")["comparisons"]["best_equal_flops"]["final_val_loss"]
        assert s["equivalence_margin"] == margin and vt["margin"] == margin
        assert (vt["tost_p"] < 0.05) == (margin == 1.0)
        assert ("(equivalent within ±1)" in (out / "report.md").read_text()) == (margin == 1.0)


H100 = "NVIDIA H100 80GB HBM3 on Intel(R) Xeon(R) Processor (avx512f, torch AVX512)"


def _published_and_new(tmp_path, reported):
    """A published report (a sweep's summary.json alone, from before runs recorded their machine, one H100 named)
    and a sweep of one more fixed size on another machine: 'baseline' at 300 FLOPs, losses 4.50, 4.55, 4.60."""
    a, _ = _reported(reported, tmp_path / "A")
    pub = tmp_path / "docs" / "results" / "pub"
    pub.mkdir(parents=True)
    s = json.loads((a / "summary.json").read_text())
    for e in s["arms"]:
        for m in e["runs"]:
            m.pop("machine")
    s["machines"] = [H100]
    (pub / "summary.json").write_text(json.dumps(s))
    b = fake_sweep(tmp_path / "B", {"baseline": [4.50, 4.55, 4.60]})
    for run in b.iterdir():
        summary = json.loads((run / "summary.json").read_text())
        summary.update(flops=300.0, train_flops=300.0, machine={"gpu": None, "cpu": {
            "model": "Intel Xeon", "simd": "avx2", "torch_capability": "AVX2"}})
        (run / "summary.json").write_text(json.dumps(summary))
        arm = json.loads((run / "arm.json").read_text())
        (run / "arm.json").write_text(json.dumps({**arm, "plan_flops": 300.0}))
    return a, pub, b


def test_a_published_summary_is_a_source_of_grow_report(tmp_path, reported):
    """grow report runs=[<published report>,<sweep>]: the published arms join by their per-run values, unchanged
    and still their own references (the new sweep's baseline is renamed 'baseline [B]', its runs' references
    with it); the frontier has the three budgets 300 → 4.55, 600 → 4.2833 (the best of the two equal-FLOPs
    sizes), 1000 → 4.10, each with its arm and device; zero (4.38667 on 600 FLOPs) is worth
    300 · 2^((4.55 − 4.38667)/(4.55 − 4.28333)) / 600 of its FLOPs; every statistic is derived again over the
    union; publish counts the published runs as the summary's, the sweep's on disk."""
    from grow.report.stats import derived_statistics

    a, pub, b = _published_and_new(tmp_path, reported)
    old = json.loads((pub / "summary.json").read_text())
    out = tmp_path / "merged"
    r = grow_cli("report", f"runs=[{pub},{b}]", f"out={out}", cwd=tmp_path)
    assert r.returncode == 0, r.stderr
    s = json.loads((out / "summary.json").read_text())
    arms = {e["arm"]: e for e in s["arms"]}
    assert list(arms) == [e["arm"] for e in old["arms"]] + ["baseline [B]"]
    assert [m["baseline_arm"] for m in arms["baseline [B]"]["runs"]] == ["baseline [B]"] * 3
    assert all(m["run_dir"].startswith("B/") for m in arms["baseline [B]"]["runs"])
    for e in old["arms"]:  # the published arms' figures and comparisons as they were
        assert arms[e["arm"]]["comparisons"] == e["comparisons"], e["arm"]
        assert [m["final_val_loss"] for m in arms[e["arm"]]["runs"]] == [m["final_val_loss"] for m in e["runs"]]
        assert {m["machine"] for m in arms[e["arm"]]["runs"]} == {H100}
    again = derived_statistics(s["arms"], s["equivalence_margin"])
    assert json.loads(json.dumps(again["effective_compute"])) == s["effective_compute"]
    ec = s["effective_compute"]
    assert ec["points"] == [[300.0, pytest.approx(4.55)], [600.0, pytest.approx(12.85 / 3)], [1000.0, pytest.approx(4.1)]]
    assert [p["arm"] for p in ec["point_arms"]] == ["baseline [B]", "equal_flops size=s1", "baseline"]
    assert [p["machines"] for p in ec["point_arms"]] == [["Intel Xeon (avx2, torch AVX2)"], [H100], [H100]]
    # 3 seeds: seed by seed against that seed's frontier (baseline [B] 4.50, 4.55, 4.60 at 300 FLOPs), geometric mean
    logs = [math.log(300 * 2 ** ((b - z) / (b - s1)) / 600)
            for b, z, s1 in zip([4.50, 4.55, 4.60], LOSSES["zero"], LOSSES["equal_flops size=s1"])]
    assert ec["arms"]["zero"]["log_multipliers"] == pytest.approx(logs, rel=1e-12)
    assert ec["arms"]["zero"]["multiplier"] == pytest.approx(math.exp(sum(logs) / 3), rel=1e-12)
    assert s["published"] == [{"path": str(pub.absolute()), "title": old["title"], "runs": 18}]
    assert s["title"] == old["title"] and s["machines"] == [H100, "Intel Xeon (avx2, torch AVX2)"]
    md = (out / "report.md").read_text()
    assert "Arms from published reports" in md and f"`{pub.absolute()}`" in md
    assert "`baseline [B]` on CPU Intel Xeon" in md and "`baseline` on NVIDIA H100 80GB HBM3" in md
    assert "The frontier's points come from 2 devices" in md
    root = tmp_path / "repo"
    _page(root)
    assert results.publish(out, "merged", root).is_dir()
    (b / "baseline-seed9").mkdir()
    (b / "baseline-seed9" / "summary.json").write_text((b / "baseline-seed0" / "summary.json").read_text())
    with pytest.raises(results.ResultsError, match="older than the runs"):
        results.publish(out, "merged", root)


def test_grow_report_refuses_a_summary_that_is_not_a_reports(tmp_path, reported):
    """A summary.json without arms (a run's own) is refused in one line naming runs=, exit 2, before any work."""
    a, pub, b = _published_and_new(tmp_path, reported)
    (pub / "summary.json").write_text(json.dumps({"complete": True, "final_val_loss": 4.0}))
    r = grow_cli("report", f"runs=[{pub},{b}]", f"out={tmp_path / 'merged'}", cwd=tmp_path)
    assert r.returncode == 2 and r.stderr.count("\n") == 1, r.stderr
    assert r.stderr.startswith(f"error: runs='{pub}'") and "not the summary.json of a grow compare" in r.stderr
    assert not (tmp_path / "merged").exists()


def test_the_cpu_arms_are_what_the_page_and_the_readme_say():
    """one-growth-cpu (issue 43's CPU arms, read with one-growth-lr and the 3.63T frontier runs): the frontier's
    top budget is the final model at the tuned rate trained on the CPU, the 214k size is not the best fixed size,
    and the page's and the README's sentence on growing earlier (G_stack after 15%), HyperCloning and svd is the
    summary's, as is the section's Welch comparison of the 15% growth with the best fixed size."""
    from grow.report.inference import welch_test

    s = json.loads((ROOT / "docs" / "results" / "one-growth-cpu" / "summary.json").read_text())
    arms, ec = {e["arm"]: e for e in s["arms"]}, s["effective_compute"]
    assert len(ec["points"]) == 3 and "max_tokens=7190306" in ec["point_arms"][2]["arm"]
    assert "NVIDIA" not in " ".join(ec["point_arms"][2]["machines"])
    best = s["best_equal_flops"][0]
    h24 = next(e for a, e in arms.items() if "d_model=24" in a)
    assert best["arm"] == "equal_flops optim.lr=0.01" and h24["final_val_loss"]["mean"] > best["final_val_loss"]
    m = {a: ec["arms"][a] for a in ("stack", "hyperclone", "svd")}
    w45 = welch_test([r["final_val_loss"] for r in arms["stack"]["runs"]],
                     [r["final_val_loss"] for r in arms["stack optim.lr=0.01"]["runs"]])
    assert w45["p"] > 0.05  # hence "not shown to help"
    early = (f"Growing earlier was not shown to help: G_stack grown after 15% of the tokens instead of 45% is worth "
             f"{m['stack']['multiplier']:.2f} [{m['stack']['ci95'][0]:.2f}, {m['stack']['ci95'][1]:.2f}] of its FLOPs "
             f"({len(arms['stack']['runs'])} seeds, one-growth-cpu; {-w45['mean']:.3f} nats below the 45% growth, "
             f"Welch p = {w45['p']:.2f})")
    page = " ".join((ROOT / "docs" / "results.md").read_text().split())
    readme = " ".join((ROOT / "README.md").read_text().split("\n## ")[0].split())
    tail = f"are worth {m['hyperclone']['multiplier']:.2f} and {m['svd']['multiplier']:.2f}."
    assert early in page and early in readme and tail in page and tail in readme
    w = welch_test([r["final_val_loss"] for r in arms["stack"]["runs"]],
                   [r["final_val_loss"] for r in arms[best["arm"]]["runs"]])
    assert f"{w['mean']:+.3f} nats from the best fixed size (Welch 95% CI [{w['ci95'][0]:+.3f}, {w['ci95'][1]:+.3f}]" in page


def test_the_gpu_depth_window_is_what_the_page_and_the_readme_say():
    """gpu-depth (issue 43's GPU sweep, two windows, 2 seeds), as docs/results.md and the README's first screen state
    it after issue 60's re-read: the seed-blocked differences of the depth growths (2 -> 4 and MIDAS 1 -> 2 -> 3 -> 4)
    from the baseline, which of their intervals exclude 0, the arms above it (shrink_perturb, G_stack at 3e-3), the
    residual SD, their FLOPs share, no measured multiplier (every seed below its own frontier: no interval, and the
    bound is only the FLOPs ratio), the validation split's composition (from the committed manifest), the Welch
    detectable effect and the rate check; and none of the statements the re-read removed."""
    import gzip
    from collections import Counter

    s = json.loads((ROOT / "docs" / "results" / "gpu-depth" / "summary.json").read_text())
    arms = {e["arm"]: e for e in s["arms"]}
    base = arms["fixed-L4-w256-b3"]
    depth = [a for a in arms if a.split("-")[0] in ("stack", "msg", "llama_pro", "midas")
             and ("2to4" in a or a.startswith("midas")) and "-lr" not in a]
    assert len(depth) == 8 and all(arms[a]["seeds"] == base["seeds"] == [0, 1] for a in depth)
    b = s["seed_blocked"]
    vs = {a: c["baseline"]["final_val_loss"] for a, c in b["comparisons"].items()}
    assert all(c["baseline"]["arm"] == "fixed-L4-w256-b3" for c in b["comparisons"].values())
    d = [vs[a]["mean"] for a in depth]
    assert max(d) < 0
    page = " ".join((ROOT / "docs" / "results.md").read_text().split())
    readme = " ".join((ROOT / "README.md").read_text().split("\n## ")[0].split())
    share = [arms[a]["flops"]["mean"] / base["flops"]["mean"] for a in depth]
    assert (f"MIDAS (1 → 2 → 3 → 4) ended {-max(d):.2f}–{-min(d):.2f} nats below the final model from scratch on "
            f"{min(share) * 100:.0f}–{max(share):.0%} of its FLOPs") in page
    assert f"ended {-max(d):.2f}–{-min(d):.2f} nats below the final model from scratch (seed-blocked;" in readme
    midas = vs["midas-1to4-prop1"]
    assert f"MIDAS {midas['mean']:+.3f}, 95% CI [{midas['ci95'][0]:+.3f}, {midas['ci95'][1]:+.3f}]".replace("-", "−") in readme
    excl = {a for a in depth if vs[a]["ci95"][1] < 0}
    assert excl == {"midas-1to4-prop1", "msg-2to4-10", "msg-2to4-25", "stack-2to4-10", "stack-2to4-25"}
    assert "the intervals of MIDAS, MSG at 10% and 25% and G_stack at 10% and 25% exclude 0" in page
    above = {a: vs[a]["mean"] for a in ("shrink_perturb-2to4-25", "stack-2to4-25-lr3e-3")}
    assert min(above.values()) > 0
    sp, lr = f"{above['shrink_perturb-2to4-25']:+.3f}", f"{above['stack-2to4-25-lr3e-3']:+.3f}"
    assert f"shrink-and-perturb ({sp}) and G_stack at the rate 3e-3 ({lr}) above it" in page + readme
    assert f"shrink-and-perturb ended {sp} above it" in page and f"G_stack at the rate 3e-3 {lr}. Below every" in page
    assert f"residual SD of {b['sd']:.3f} nats ({b['dof']} dof)" in page and f"residual SD {b['sd']:.3f} nats" in page
    # no multiplier: every depth growth is below its seed's own frontier at every seed, so no interval over seeds
    ec = s["effective_compute"]["arms"]
    assert all(ec[a]["off"] == [0, 1] and ec[a]["ci95"] is None for a in depth)
    assert "the multiplier is unmeasured" in readme and "multiplier at least" not in readme
    assert "their effective-compute multipliers are at least" not in page
    # the validation split: from the committed corpus manifest
    m = json.loads(gzip.open(ROOT / "docs" / "runs" / "gpu-depth" / "corpus" / "manifest.json.gz").read())
    val = [e for e in m["files"] if e["split"] == "val"]
    by = Counter()
    for e in val:
        by[e["package"]] += e["bytes"]
    total = sum(by.values())
    top = [(p, round(100 * n / total)) for p, n in by.most_common(3)]
    assert top == [("encodings", 35), ("pydoc_data", 20), ("coverage", 15)]
    assert (f"{len(by)} packages, {total / 1e6:.1f} MB: 35% of its bytes `encodings` "
            f"({sum(e['package'] == 'encodings' for e in val)} near-identical codec tables)") in page
    assert f"{top[0][1] + top[1][1]}% of the validation split's bytes are two packages" in readme
    mde = s["mde"]["nats"]
    assert f"over two seeds detects {mde:.2f} nats" in page
    # the rate check: 1e-2 the best of three for the baseline and for G_stack 2 -> 4 at 25%
    for ref, claim in (("fixed-L4-w256-b3", "for the baseline (+{:.3f} and +{:.3f} nats"),
                       ("stack-2to4-25", "for G_stack 2 → 4 at 25% (+{:.3f} and +{:.3f})")):
        gaps = [arms[f"{ref}-lr{r}"]["final_val_loss"]["mean"] - arms[ref]["final_val_loss"]["mean"] for r in ("3e-3", "3e-2")]
        assert min(gaps) > 0 and claim.format(*gaps) in page, claim.format(*gaps)
    # the 2-layer model is on the frontier only at 0.61x the baseline's FLOPs
    l2 = arms["fixed-L2-w256-b3"]["flops"]["mean"] / base["flops"]["mean"]
    assert f"{l2:.2f}× the baseline's FLOPs" in page
    for gone in ("the sign turns", "2 → 4 (MIDAS", "nproc said", "they are not equivalent", "FLOPs, p = 0.005 before Holm"):
        assert gone not in page + readme, gone


def test_the_report_says_what_auto_ran_on():
    """``device=auto`` / ``precision=auto`` are reported with what they resolved to (grow.device): the GPU the
    run's machine names and bf16 autocast, or the CPU and float32; as asked where a run asked for one, or where a
    summary records no machine."""
    from types import SimpleNamespace

    from grow.report.stats import _device, _precision

    run = lambda device, precision, machine: SimpleNamespace(config={"device": device, "precision": precision},
                                                             summary={"machine": machine} if machine else {})
    h200, cpu = {"gpu": "NVIDIA H200", "cpu": {}}, {"gpu": None, "cpu": {}}
    cases = [(("auto", "auto", h200), ("auto (NVIDIA H200)", "auto (bf16 autocast)")),
             (("auto", "auto", cpu), ("auto (cpu)", "auto (float32)")),
             (("cpu", "auto", h200), ("cpu", "auto (float32)")),
             (("cuda", "auto", h200), ("cuda", "auto (bf16 autocast)")),
             (("auto", "float64", h200), ("auto (NVIDIA H200)", "float64")),
             (("auto", "auto", None), ("auto", "auto"))]
    for args, want in cases:
        assert (_device(run(*args)), _precision(run(*args))) == want, args
    report = (ROOT / "docs" / "results" / "gpu-depth" / "report.md").read_text()
    assert "device auto (NVIDIA H200), precision auto (bf16 autocast)" in report


def test_the_seed_blocked_model_is_ordinary_least_squares_with_arm_and_seed_effects():
    """`seed_blocked_comparisons` against statsmodels' OLS of loss ~ C(arm) + C(seed) (float64, rel 1e-10): the
    difference, its SE, dof, p and interval; the block removes the seeds' shared shift, so a grown arm 0.01 below
    the reference at every seed is significant although the seeds differ by 0.5; TOST within ±0.02."""
    import numpy as np
    import pandas as pd
    import statsmodels.formula.api as smf

    from grow.report.stats import seed_blocked_comparisons

    rng = np.random.default_rng(1)
    shift = np.array([0.0, 0.5, -0.3, 0.2])
    ref = 3.0 + shift + rng.normal(0, 0.002, 4)
    grown = 2.99 + shift + rng.normal(0, 0.002, 4)
    other = 3.05 + shift + rng.normal(0, 0.002, 4)
    run = lambda ys, base: [{"seed": s, "final_val_loss": float(y), "baseline_arm": base} for s, y in enumerate(ys)]
    arms = [{"arm": "base", "kind": "baseline", "runs": run(ref, "base")},
            {"arm": "g", "kind": "grown", "runs": run(grown, "base")},
            {"arm": "h", "kind": "grown", "runs": run(other, "base")},
            {"arm": "plateau", "kind": "equal_flops", "runs": run(rng.normal(4, 0.3, 4), "base")}]  # not compared: left out
    b = seed_blocked_comparisons(arms, [])
    assert b["arms"] == ["base", "g", "h"] and b["seeds"] == [0, 1, 2, 3] and b["dof"] == 6
    df = pd.DataFrame([(e["arm"], m["seed"], m["final_val_loss"]) for e in arms[:3] for m in e["runs"]],
                      columns=["arm", "seed", "loss"])
    fit = smf.ols("loss ~ C(arm, Treatment('base')) + C(seed)", df).fit()
    key = "C(arm, Treatment('base'))[T.g]"
    got = b["comparisons"]["g"]["baseline"]["final_val_loss"]
    assert got["mean"] == pytest.approx(fit.params[key], rel=1e-10) and got["se"] == pytest.approx(fit.bse[key], rel=1e-10)
    assert got["dof"] == fit.df_resid and got["p"] == pytest.approx(fit.pvalues[key], rel=1e-8)
    assert got["ci95"] == pytest.approx(list(fit.conf_int().loc[key]), rel=1e-10)
    assert got["p"] < 0.01 and got["tost_p"] < 0.05  # -0.01: below the reference, and within ±0.02 of it
    from scipy import stats

    assert stats.ttest_ind(grown, ref, equal_var=False).pvalue > 0.5  # without the blocks the seeds' spread hides it


def test_the_moe_comparison_is_what_the_page_and_the_readme_say():
    """moe-upcycle-cpu (#64): the regime (total and active parameters, tokens per active non-embedding parameter),
    every mixture's paired-by-seed difference from the dense model and from the experts from scratch (t-intervals
    over the 6 seeds, which share the batch order), the detectable effect, the marginal equivalence of 4 -> 8 and
    the README's sentence: all recomputed from the committed summary.json."""
    from grow.report.inference import paired_test

    s = json.loads((ROOT / "docs" / "results" / "moe-upcycle-cpu" / "summary.json").read_text())
    arms = {e["arm"]: e for e in s["arms"]}
    assert set(arms) == {"dense", "moe-scratch", "upcycle-25", "upcycle-50", "experts-4to8-50"}
    assert all(arms[a]["seeds"] == [0, 1, 2, 3, 4, 5] for a in arms)
    labels = {"moe-scratch": "the experts from scratch", "upcycle-25": "upcycled at 25%",
              "upcycle-50": "upcycled at 50%", "experts-4to8-50": "4 → 8 experts"}

    def paired(a, ref):
        per = {x: [r["final_val_loss"] for r in sorted(arms[x]["runs"], key=lambda r: r["seed"])] for x in (a, ref)}
        return paired_test(per[a], per[ref])

    def cell(a, ref, p=False):
        t = paired(a, ref)
        return (f"{labels[a]} {t['mean']:+.3f} [{t['ci95'][0]:+.3f}, {t['ci95'][1]:+.3f}]"
                + (f" (p = {t['p']:.2g})" if p else ""))

    page = " ".join((ROOT / "docs" / "results.md").read_text().split())
    readme = " ".join((ROOT / "README.md").read_text().split("\n## ")[0].split())
    mixtures = ("moe-scratch", "upcycle-25", "upcycle-50", "experts-4to8-50")
    assert all(paired(a, "dense")["ci95"][0] > 0 for a in mixtures)  # "every mixture ends above it"
    assert ", ".join(cell(a, "dense") for a in mixtures) + " nats (95% CI)" in page
    assert ", ".join(cell(a, "moe-scratch", True) for a in ("upcycle-50", "upcycle-25", "experts-4to8-50")) in page
    assert f"Welch over 6 seeds detects {s['mde']['nats']:.3f} nats" in page
    blocked = s["seed_blocked"]["comparisons"]["experts-4to8-50"]["baseline"]["final_val_loss"]
    wide = paired("experts-4to8-50", "moe-scratch")["ci95"]
    assert blocked["tost_p"] < 0.05 and (wide[0] < -0.02 or wide[1] > 0.02)  # hence "marginal"
    assert f"(TOST p = {blocked['tost_p']:.3f})" in page
    fc, scale = s["scale"]["final_config"], s["scale"]
    emb = 2 * fc["vocab_size"] * fc["d_model"]
    active = 252_480  # a token's parameters with top-1 of 8 (TransformerConfig.active_params, checked below)
    from grow.model import TransformerConfig

    assert TransformerConfig(**fc).active_params() == active
    assert (f"{scale['params']:,} parameters, {active:,} active a token; {scale['params'] - emb:,} not embeddings, "
            f"{active - emb:,} of them active") in page
    assert f"{scale['tokens'] / (active - emb):.0f} tokens per active non-embedding parameter" in page
    d50, scratch = paired("upcycle-50", "dense"), paired("moe-scratch", "dense")
    assert (f"every mixture of experts ended above the dense model at equal active FLOPs, from +{d50['mean']:.3f} "
            f"(upcycled at 50%) to +{scratch['mean']:.3f} nats (from scratch)") in readme
