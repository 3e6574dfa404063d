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

import pytest

from grow.report import build_report, compare_arms, paired, stat
from tests.conftest import ROOT, TINY_RUN, assert_make_lists, grow_cli

spec = importlib.util.spec_from_file_location("results", ROOT / "scripts" / "results.py")
results = importlib.util.module_from_spec(spec)
spec.loader.exec_module(results)

COMMITTED = sorted((ROOT / "docs" / "results").glob("*/summary.json"))


# ---- a sweep written by hand --------------------------------------------------------------------------

# final validation losses per seed; the grown arms spend 600 FLOPs, the baselines 1000
LOSSES = {
    "baseline": [4.00, 4.10, 4.20],
    "baseline init=vt": [3.95, 4.02, 4.15],
    "vt": [3.90, 4.05, 4.10],
    "zero": [4.30, 4.36, 4.50],
    "equal_flops size=s1": [4.20, 4.25, 4.40],
    "equal_flops": [4.50, 4.60, 4.70],
}
KINDS = {"baseline": ("baseline", {}), "baseline init=vt": ("matched", {"parameterization": "vt"}),
         "vt": ("grown", {"strategy": "vt", "parameterization": "vt"}),
         "zero": ("grown", {"strategy": "zero", "parameterization": None}),
         "equal_flops size=s1": ("equal_flops", {"size": 1, "budget_flops": 600.0}),
         "equal_flops": ("equal_flops", {"size": 2, "budget_flops": 600.0})}
FINAL = {"n_layers": 1, "d_model": 2, "n_heads": 1, "d_qk": 2, "d_v": 2, "d_ff": 4, "seq_len": 4, "vocab_size": 8}


def _records(kind: str, loss: float, flops: float) -> list[dict]:
    """A baseline-like curve (250, 5.0), (500, 4.6), (flops, loss); a grown one (300, 4.5), a growth
    to 4.52, (flops, loss). Training losses: the baseline's 5.0 at step 0 to 4.0 at step 10 (4.6 -> 4.1 over
    steps 4 -> 9); a grown run's 4.8 at step 4 (its growth) and 4.2 at step 9 (its recovery's end):
    0.1 more than the baseline's fall over the same steps."""
    if kind == "grown":
        return [{"train/loss": 5.2, "train/step": 0, "train/flops": 0.0}, {"train/loss": 4.8, "train/step": 4, "train/flops": 240.0},
                {"val/loss": 4.5, "train/flops": 300.0, "time/seconds": 1.0},
                {"growth/stage": 2, "growth/loss_before": 4.5, "growth/loss_after": 4.52, "growth/delta": 0.02,
                 "growth/flops": 0.0, "growth/seconds": 0.0, "train/flops": 300.0},
                {"train/loss": 4.2, "train/step": 9, "train/flops": 540.0}, {"val/loss": loss, "train/flops": flops, "time/seconds": 2.0}]
    return [{"train/loss": 5.0, "train/step": 0, "train/flops": 0.0}, {"train/loss": 4.0, "train/step": 10, "train/flops": 600.0},
            {"val/loss": 5.0, "train/flops": 250.0, "time/seconds": 0.5},
            {"val/loss": 4.6, "train/flops": 500.0, "time/seconds": 1.0},
            {"val/loss": loss, "train/flops": flops, "time/seconds": 2.0}]


def fake_sweep(d, losses=LOSSES, seeds=(0, 1, 2)):
    """A sweep directory as grow compare writes it (arm.json, summary.json, metrics.jsonl per arm and seed)."""
    for job, (label, values) in enumerate(losses.items()):
        kind, info = KINDS[label]
        flops = 600.0 if kind in ("grown", "equal_flops") else 1000.0
        for seed in seeds:
            if seed >= len(values) or values[seed] is None:
                continue
            run = d / f"{label.replace(' ', '_')}-seed{seed}"
            run.mkdir(parents=True)
            arm = {"arm": label, "kind": kind, "strategy": None, "seed": seed, "setting": {}, "baseline_arm": "baseline",
                   "job": job, "plan_flops": flops, **info}
            events = [{"growth/stage": 2, "growth/loss_before": 4.5, "growth/loss_after": 4.52, "growth/delta": 0.02,
                       "growth/recovery": -0.1, "growth/recovery_steps": 5, "train/step": 4, "train/flops": 240.0}] if kind == "grown" else []
            summary = {"complete": True, "final_val_loss": values[seed], "tokens": 1000, "flops": flops,
                       "train_flops": flops, "growth_flops": 0.0, "train_seconds": 2.0, "compile_seconds": 0.0,
                       "wall_seconds": 3.0, "params": 100, "final_config": FINAL, "growth_events": events,
                       "load_average": [1.0, 1.5], "stage_plan": [],
                       "data": {"train_tokens": 5000, "val_tokens": 500, "epochs": 1000 / 5000, "bigram_val_loss": 4.9,
                                "bigram_lambda": 0.9, "bigram_train_tokens": 5000}}
            (run / "arm.json").write_text(json.dumps(arm))
            (run / "summary.json").write_text(json.dumps(summary))
            recs = _records(kind, values[seed], flops)
            (run / "metrics.jsonl").write_text("".join(json.dumps(r) + "\n" for r in recs))
    return d


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


def test_report_pairs_every_arm_with_its_references_by_seed(tmp_path):
    d = fake_sweep(tmp_path / "sweep")
    summary = build_report([d], d, show=False)
    arms = {e["arm"]: e for e in summary["arms"]}
    # the order: baseline, matched baselines, grown arms, equal-FLOPs arms by size
    assert list(arms) == ["baseline", "baseline init=vt", "vt", "zero", "equal_flops size=s1", "equal_flops"]
    vt = arms["vt"]["comparisons"]
    assert vt["baseline"]["arm"] == "baseline" and vt["baseline"]["final_val_loss"]["t"] == pytest.approx(-5.0)
    m = vt["matched"]["final_val_loss"]  # d = (-0.05, +0.03, -0.05)
    assert vt["matched"]["arm"] == "baseline init=vt" and m["mean"] == pytest.approx(-0.07 / 3)
    assert m["t"] == pytest.approx(-0.875)
    # the best fixed size at equal FLOPs: the lowest mean final loss among the equal-FLOPs arms of the budget
    (best,) = summary["best_equal_flops"]
    assert best["arm"] == "equal_flops size=s1" and set(best["grown_arms"]) == {"vt", "zero"}
    assert vt["best_equal_flops"]["final_val_loss"]["t"] == pytest.approx(-8.0)  # d = (-0.3, -0.2, -0.3)
    assert "matched" not in arms["zero"]["comparisons"]  # zero keeps the model's initializer: baseline is its own
    assert arms["baseline init=vt"]["comparisons"]["baseline"]["final_val_loss"]["mean"] == pytest.approx(-0.06)
    assert arms["baseline"]["comparisons"] == {}
    # FLOPs to reach the reference's final loss, paired against the reference reaching its own
    reach = vt["baseline"]["flops_to_reach"]
    want = [(300 + 300 * (4.52 - b) / (4.52 - v)) / 1000 - 1.0 for v, b in zip(LOSSES["vt"], LOSSES["baseline"])]
    assert reach["diffs"] == pytest.approx(want) and reach["n"] == 3
    # seed 1: vt (4.05) never reaches the matched loss (4.02): censored, no difference over the other two
    assert vt["matched"]["flops_to_reach"]["n"] == 0 and vt["matched"]["flops_to_reach"]["censored"] == 1
    assert arms["vt"]["flops_to_matched_loss"]["reached"] == 2
    # summary.json's figures are those compare_arms recomputes from its per-run values
    on_disk = json.loads((d / "summary.json").read_text())
    again = compare_arms(on_disk["arms"])
    assert {e["arm"]: e["comparisons"] for e in on_disk["arms"]} == json.loads(json.dumps(again["arms"]))
    md = (d / "report.md").read_text()
    # mean ± SE [95% CI: ± t_0.975(2) = 4.303 SE] and t · two-sided p · Holm over the sweep's 9 tests
    assert "| vt | 0,1,2 | 4.0167 ± 0.1041 | -0.0833 ± 0.0167 [-0.1550, -0.0116] | -5.0 · p 0.038 · Holm 0.102 | " \
           "-0.0233 ± 0.0267 [-0.1381, +0.0914] | -0.9 · p 0.474 · Holm 0.474 | -0.2667 ± 0.0333 [-0.4101, -0.1232] | " \
           "-8.0 · p 0.015 · Holm 0.076 |" in md
    assert summary["tests"] == 9 and "over the 9 tests of this sweep" in md
    assert "| zero | 0,1,2 | 4.3867 ± 0.1026 | +0.2867 ± 0.0133 [+0.2293, +0.3440] | +21.5 · p 0.002 · Holm 0.015* |" in md
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
    assert "vt against `baseline init=vt`" in md and "|t| > 4.30 at n = 3" in md
    # recovery against the baseline over the same steps 4 -> 9: (4.2 - 4.8) - (4.1 - 4.6) = -0.1
    assert "| zero | 1 ± 0 | 0.0200 ± 0.0000 | -0.1000 ± 0.0000 (@5 steps) | -0.1000 ± 0.0000 |" in md


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
    from grow.runs import train_arm

    cfg = {"seed": 1, "init": "strategy", "strategy": {"name": "vt"}, "schedule": None}
    arm = train_arm({"complete": True}, cfg, "run", 0)
    assert (arm["arm"], arm["kind"], arm["parameterization"]) == ("baseline init=vt", "matched", "vt")
    assert train_arm({}, {**cfg, "init": "auto"}, "run", 0)["kind"] == "baseline"
    grown = train_arm({}, {**cfg, "init": "auto", "schedule": {"name": "exp"}}, "run", 0)
    assert (grown["kind"], grown["parameterization"]) == ("grown", "vt")
    assert train_arm({}, {**cfg, "strategy": {"name": "zero"}}, "run", 0)["kind"] == "baseline"


# ---- publish, render, check ------------------------------------------------------------------------------


def _page(root, text="# Results\n\nHand-written prose.\n"):
    (root / "docs").mkdir(parents=True, exist_ok=True)
    (root / "docs" / "results.md").write_text(text)
    return root / "docs" / "results.md"


def test_publish_copies_the_report_files_and_the_check_catches_any_changed_figure(tmp_path):
    d = fake_sweep(tmp_path / "sweep")
    build_report([d], d, show=False)
    (d / "vt-seed0" / "checkpoints").mkdir()  # never copied
    root = tmp_path / "repo"
    page = _page(root)
    dest = results.publish(d, "fake", root)
    assert sorted(p.name for p in dest.iterdir()) == sorted(results.REPORT_FILES)
    text = page.read_text()
    assert text.startswith("# Results\n\nHand-written prose.\n") and "<!-- tables:fake -->" in text
    assert "| vt | 0,1,2 | 4.0167 ± 0.1041 | -0.0833 ± 0.0167 [-0.1550, -0.0116] | -5.0 · p 0.038 · Holm 0.102 |" in text
    assert "](results/fake/loss_vs_flops.png)" in text
    assert results.check(root) == []
    # prose outside the blocks is the author's: rendering keeps it
    page.write_text(text.replace("Hand-written prose.", "Other prose."))
    assert results.check(root) == [] and not results.render(root)
    # a figure on the page that differs from its summary.json
    page.write_text(page.read_text().replace("-0.0833 ± 0.0167", "-0.0933 ± 0.0167"))
    assert results.check(root) == ["fake"]
    out = subprocess.run([sys.executable, str(ROOT / "scripts" / "results.py"), "--root", str(root), "check"],
                         capture_output=True, text=True)
    assert out.returncode == 1 and "fake" in out.stderr
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


def test_refresh_recomputes_a_published_sweeps_statistics_from_its_per_run_values(tmp_path):
    """After a change of the statistics, refresh rewrites what summary.json's per-run values determine (the
    comparisons, the number of tests, report.md's tables) and nothing else; a second refresh changes nothing."""
    d = fake_sweep(tmp_path / "sweep")
    build_report([d], d, show=False)
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
    md.write_text(want_md.replace(" [-0.1550, -0.0116] | -5.0 · p 0.038 · Holm 0.102 |", " | -5.0 |"))
    assert results.check(root) == []  # the page's tables are recomputed from the per-run values anyway
    assert results.refresh(root) == ["fake"]
    assert json.loads(path.read_text()) == json.loads(want_summary) and md.read_text() == want_md
    assert results.check(root) == []
    assert results.refresh(root) == []


def test_publish_refuses_a_stale_or_unfinished_report(tmp_path):
    d = fake_sweep(tmp_path / "sweep")
    root = tmp_path / "repo"
    _page(root)
    with pytest.raises(results.ResultsError, match="no summary.json"):
        results.publish(d, "fake", root)
    build_report([d], d, show=False)
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


def test_a_tiny_sweep_from_grow_compare_to_the_page(tmp_path):
    """grow compare with the equal-FLOPs stage sizes and two seeds, published and rendered by the script."""
    d = tmp_path / "sweep"
    out = grow_cli("compare", "strategy=zero", "seed=0,1", "compare.equal_flops=true", "compare.equal_flops_sizes=stages",
                   *TINY_RUN, "trainer.max_tokens=8000", f"hydra.sweep.dir={d}", cwd=tmp_path)
    assert out.returncode == 0, out.stderr[-3000:]
    assert "best fixed size at equal FLOPs: equal_flops" in out.stdout
    zero = json.loads((d / "zero-seed0" / "arm.json").read_text())
    eq = json.loads((d / "equal_flops_size=s1-seed0" / "arm.json").read_text())
    assert zero["parameterization"] is None and eq["size"] == 1 and eq["budget_flops"] == zero["plan_flops"]
    summary = json.loads((d / "summary.json").read_text())
    assert [e["kind"] for e in summary["arms"]] == ["baseline", "grown", *["equal_flops"] * 4]
    root = tmp_path / "repo"
    _page(root)
    script = [sys.executable, str(ROOT / "scripts" / "results.py"), "--root", str(root)]
    pub = subprocess.run([*script, "publish", str(d), "tiny"], capture_output=True, text=True)
    assert pub.returncode == 0, pub.stderr
    text = (root / "docs" / "results.md").read_text()
    assert "| zero | 0,1 |" in text and "Best fixed size at equal FLOPs: **`equal_flops" in text
    assert "grow compare strategy=zero seed=0,1" in text  # the command that made it
    assert subprocess.run([*script, "check"], capture_output=True, text=True).returncode == 0


def test_make_has_the_results_sweeps_and_targets():
    assert_make_lists("sweep-results ", "sweep-results-4x", "publish-results", "results ")
    dry = subprocess.run(["make", "-n", "sweep-results", "sweep-results-4x", "results", "ARGS="], cwd=ROOT,
                         capture_output=True, text=True).stdout.splitlines()  # ARGS=: whatever the caller exported
    args = ("strategy=all seed=0,1,2 compare.equal_flops=true "
            "compare.equal_flops_sizes=stages +schedule.start.n_heads=2 model=small")
    assert any(args in line and line.rstrip().endswith("hydra.sweep.dir=outputs/sweeps/small-1m") for line in dry), dry
    args_4x = ("strategy=all seed=0,1,2 compare.equal_flops=true "
               "compare.equal_flops_sizes=final +schedule.start.n_heads=2 model=small")
    assert any(args_4x in line and "trainer.max_tokens=4000000 hydra.sweep.dir=outputs/sweeps/small-4m" in line
               for line in dry), dry
    assert any(line.endswith("scripts/results.py render") for line in dry), dry


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


def test_make_sweep_one_growth_spends_the_small_1m_grown_arms_flops():
    """Each of the two sweeps of make sweep-one-growth trains one growth from the small-1m plan's stage-1
    size to its stage-2 size (llama-small-1m's for one-growth-llama), hundreds of steps in, on the budget
    at which its plan spends that multi-stage plan's grown arms' FLOPs (to 0.1%), as `grow schedule`
    counts them."""
    import re
    from pathlib import Path

    from hydra import compose, initialize_config_dir

    from grow.config import CONFIG_DIR, RunConfig

    text = (Path(__file__).resolve().parent.parent / "Makefile").read_text()
    budgets = re.findall(r"^TOKENS_(one-growth(?:-llama)?)_(\d+) = (\d+)", text, re.M)
    assert sorted((e, at) for e, at, _ in budgets) == [("one-growth", "45"), ("one-growth", "60"),
                                                       ("one-growth-llama", "45"), ("one-growth-llama", "60")]
    exp = "$(strip $(ONE_GROWTH_EXPERIMENT))"
    for at in ("45", "60"):  # the two sweeps use them; the learning-rate check picks one by ONE_GROWTH_LR_AT
        assert f"schedule.first_stage=0.{at} trainer.max_tokens=$(strip $(TOKENS_{exp}_{at}))" in text
    assert f"trainer.max_tokens=$(strip $(TOKENS_{exp}_$(strip $(ONE_GROWTH_LR_AT))))" in text

    def run(overrides):
        with initialize_config_dir(str(CONFIG_DIR), version_base="1.3"):
            return RunConfig.from_hydra(compose("train", overrides=overrides))

    multi = {"one-growth": run(["model=small", "+schedule=exp", "+schedule.start.n_heads=2"]).plan(),
             "one-growth-llama": run(["model=llama-small", "+schedule=exp", "+schedule.start.n_heads=2"]).plan()}
    for experiment, at, tokens in budgets:
        plan = run([f"+experiment={experiment}", f"schedule.first_stage=0.{at}", f"trainer.max_tokens={tokens}"]).plan()
        ref = multi[experiment]
        assert abs(plan.total_flops / ref.total_flops - 1) < 1e-3, (experiment, at, plan.total_flops, ref.total_flops)
        keys = ("n_layers", "d_model", "n_heads", "n_kv_heads", "d_qk", "d_v", "d_ff", "activation", "positions")
        for s, r in zip(plan, ref):
            assert [getattr(s.cfg, k) for k in keys] == [getattr(r.cfg, k) for k in keys], (experiment, at)
        assert len(plan) == 2 and plan[0].steps >= 500 and abs(plan[0].tokens / plan.total_tokens - int(at) / 100) < 0.01
        assert run([f"+experiment={experiment}"]).trainer.max_tokens == int(dict(
            (a, t) for e, a, t in budgets if e == experiment)["45"])  # the experiment's own default: the 45% budget
    bad = subprocess.run(["make", "-o", ".venv/.grow-installed", "sweep-one-growth", "ONE_GROWTH_EXPERIMENT=gpt"], cwd=ROOT,
                         capture_output=True, text=True)
    assert bad.returncode == 2 and "ONE_GROWTH_EXPERIMENT='gpt'" in bad.stdout + bad.stderr


def test_make_sweep_one_growth_lr_reuses_the_one_growth_sweeps_own_rate():
    """The learning-rate check trains only the rates that make sweep-one-growth did not: its arms at the
    sweep's own rate would be the same `grow train` runs (compared field by field but for the W&B
    names), so the combined report reads them from the one-growth sweep. A growth point other than 45
    or 60 is refused with one line and exit status 2."""
    import dataclasses
    import re
    import subprocess

    from hydra import compose, initialize_config_dir

    from grow.compare import arm_run, base_run
    from grow.config import CONFIG_DIR

    text = (ROOT / "Makefile").read_text()
    rates = re.search(r"^ONE_GROWTH_LRS \?= (\S+)", text, re.M).group(1).split(",")
    common = ["+experiment=one-growth", "strategy=msg", "seed=1", "schedule.first_stage=0.45", "trainer.max_tokens=7190306"]
    with initialize_config_dir(str(CONFIG_DIR), version_base="1.3"):
        sweep = compose("compare", overrides=common)
        own = float(sweep.optim.lr)
        checked = compose("compare", overrides=[*common, f"optim.lr={own}", "compare.baseline=false",
                                                "compare.matched_baseline=false"])
    assert own not in [float(r) for r in rates]  # not trained twice
    for kind in ("grown", "equal_flops"):
        a, b = (arm_run(base_run(c), kind, group="g", name="n") for c in (sweep, checked))
        assert a == b and dataclasses.asdict(a) == dataclasses.asdict(b), kind
    dry = subprocess.run(["make", "-n", "sweep-one-growth-lr", "ARGS=", "ONE_GROWTH_LR_AT=60"], cwd=ROOT,
                         capture_output=True, text=True).stdout.splitlines()
    assert any(f"optim.lr={','.join(rates)}" in line and "schedule.first_stage=0.60" in line for line in dry), dry
    # one copy of each grow compare by default (make test's JOBS, pytest's workers, is another variable)
    assert any(line.startswith("scripts/jobs.sh 1 ") for line in dry), dry
    assert any("runs=[outputs/sweeps/one-growth-60,outputs/sweeps/one-growth-lr]" in line for line in dry), dry
    llama = subprocess.run(["make", "-n", "sweep-one-growth-lr", "ARGS=", "ONE_GROWTH_EXPERIMENT=one-growth-llama"], cwd=ROOT,
                           capture_output=True, text=True).stdout
    assert "+experiment=one-growth-llama " in llama and "hydra.sweep.dir=outputs/sweeps/one-growth-llama-lr" in llama
    bad = subprocess.run(["make", "-o", ".venv/.grow-installed", "sweep-one-growth-lr", "ONE_GROWTH_LR_AT=50"], cwd=ROOT,
                         capture_output=True, text=True)  # -o: the refusal comes before any install
    assert bad.returncode == 2 and "ONE_GROWTH_LR_AT='50'" in bad.stdout + bad.stderr


def test_the_headline_says_what_the_one_growth_sweeps_found():
    """docs/results.md's headline and the README's first screen, against the published one-growth sweeps:
    the tuned rate is the best of the four for every arm; the grown arms' gaps to the best fixed size at
    that rate (their range, and stack's interval) are the summary's; none is significant after Holm and
    none is below the fixed size at any rate; after 60% every gap is significant after Holm."""
    import re

    def arms(name):
        return {e["arm"]: e for e in json.loads((ROOT / "docs" / "results" / name / "summary.json").read_text())["arms"]}

    lr, late = arms("one-growth-lr"), arms("one-growth-60")
    rates = ("0.001", "0.003", "0.01", "0.03")
    kinds = ("msg", "vt", "zero", "stack", "equal_flops", "equal_flops size=s1")
    best = {k: min(rates, key=lambda r: lr[f"{k} optim.lr={r}"]["final_val_loss"]["mean"]) for k in kinds}
    assert set(best.values()) == {"0.01"}, best
    gap = {s: lr[f"{s} optim.lr=0.01"]["comparisons"]["best_equal_flops"]["final_val_loss"] for s in kinds[:4]}
    assert all(g["p_holm"] > 0.05 for g in gap.values())
    assert all(lr[f"{s} optim.lr={r}"]["comparisons"]["best_equal_flops"]["final_val_loss"]["mean"] > 0
               for s in kinds[:4] for r in rates)
    lo, hi = min(g["mean"] for g in gap.values()), max(g["mean"] for g in gap.values())
    head = (ROOT / "docs" / "results.md").read_text().split("## What each sweep runs")[0]
    readme = (ROOT / "README.md").read_text().split("## Two commands")[0]
    for text in (head, readme):
        assert f"{lo:.3f}–{hi:.3f} nats above the best fixed size" in " ".join(text.split()), text[:400]
    ci = gap["stack"]["ci95"]
    assert f"`stack` +{gap['stack']['mean']:.3f}, 95% CI [−{-ci[0]:.3f}, +{ci[1]:.3f}]" in " ".join(head.split())
    late_gaps = [late[s]["comparisons"]["best_equal_flops"]["final_val_loss"] for s in kinds[:4]]
    assert all(g["p_holm"] < 0.05 for g in late_gaps)
    m = re.search(r"after 60%\) ends (\d\.\d+)–(\d\.\d+) above it", " ".join(head.split()))
    assert m and (m.group(1), m.group(2)) == (f"{min(g['mean'] for g in late_gaps):.3f}", f"{max(g['mean'] for g in late_gaps):.3f}")
