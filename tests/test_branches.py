"""optim.decay_branches (issue 43, grow.branches): one fixed-size wsd run measures several budgets; each branch equals a
wsd run of its budget trained from scratch (float64, to 1e-10), its FLOPs are the budget's, and the report reads
branches as fixed-size frontier points."""

from __future__ import annotations

import json

import pytest

from grow import branches, cli
from grow import train as train_mod
from grow.checkpoint import Interrupted
from grow.plan import training_flops
from grow.report import build_report
from tests.conftest import TINY_RUN, run_config
from tests.helpers import StopAt, expect_refusal, fake_sweep

# tiny: 16 x 32 = 512 tokens a step; 32 steps, warmup 4 steps (2,048 tokens), the last quarter decaying
WSD = [*TINY_RUN, "precision=float64", "trainer.log_every=1", "optim.schedule=wsd", "optim.warmup=0.125",
       "optim.decay_fraction=0.25", "trainer.full_val=false"]
MAIN = [*WSD, "trainer.max_tokens=16384"]


def _steps(path) -> list[dict]:
    return [json.loads(line) for line in path.read_text().splitlines()]


def _train_rows(run_dir) -> dict[int, dict]:
    rows = [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines()]
    return {r["train/step"]: r for r in rows if "train/lr" in r}


def test_a_branch_equals_a_wsd_run_of_its_budget_from_scratch(tmp_path):
    """Branch 0.5 (8,192 tokens: 16 steps, its decay from 6,144 tokens: forks after step 12) against a wsd run with
    trainer.max_tokens=8192 and the same 2,048 warmup tokens (optim.warmup=0.25): the same lr and loss at every step
    (the same batches), the same final validation loss, to 1e-10; its FLOPs the budget's whole (trunk + decay), the
    marginal ones the decay's. The main run is what it is without branches (bit for bit)."""
    summary = train_mod.train(run_config(*MAIN, "optim.decay_branches=[0.5]"), tmp_path / "main")
    d = tmp_path / "main" / "branches" / "b0.5"
    got = json.loads((d / "summary.json").read_text())
    assert summary["decay_branches"] == ["branches/b0.5"]
    assert (got["fork_step"], got["steps"], got["tokens"]) == (12, 16, 8192)
    alone = train_mod.train(run_config(*WSD, "trainer.max_tokens=8192", "optim.warmup=0.25"), tmp_path / "alone")
    assert got["equivalent"]["trainer.max_tokens"] == 8192 and got["equivalent"]["optim.warmup"] == 0.25
    ref = _train_rows(tmp_path / "alone")
    trunk = _train_rows(tmp_path / "main")
    for step in range(1, 13):  # the shared trunk: the main run's steps
        assert trunk[step]["train/lr"] == ref[step]["train/lr"]
        assert trunk[step]["train/loss"] == pytest.approx(ref[step]["train/loss"], abs=1e-10, rel=0)
    rows = _steps(d / "steps.jsonl")
    assert [r["train/step"] for r in rows] == list(range(13, 17))
    for r in rows:  # the decay: the branch's steps
        assert r["train/lr"] == pytest.approx(ref[r["train/step"]]["train/lr"], abs=1e-15, rel=0)
        assert r["train/loss"] == pytest.approx(ref[r["train/step"]]["train/loss"], abs=1e-10, rel=0)
    assert rows[-1]["train/lr"] != trunk[16]["train/lr"]  # the main run was still stable there
    assert got["final_val_loss"] == pytest.approx(alone["final_val_loss"], abs=1e-10, rel=0)
    cfg = run_config(*MAIN).plan[0].cfg
    assert got["flops"] == alone["flops"] == training_flops(cfg, 8192)
    assert got["trunk_flops"] == training_flops(cfg, 12 * 512)
    assert got["marginal_flops"] == training_flops(cfg, 4 * 512) == got["flops"] - got["trunk_flops"]
    plain = train_mod.train(run_config(*MAIN), tmp_path / "plain")
    assert summary["final_val_loss"] == plain["final_val_loss"] and summary["flops"] == plain["flops"]


def test_the_fork_is_the_last_step_of_equal_learning_rates(tmp_path):
    """The fork step: the learning rates of the main run's and the budget's schedules agree on every step up to it
    and differ on the next."""
    cfg = run_config(*MAIN, "optim.decay_branches=[0.5,0.75]")
    for b in (0.5, 0.75):
        p = branches.plan(cfg, b)
        main = branches.branch_lr(cfg.optim, 16384, p["warmup_tokens"])
        mine = branches.branch_lr(cfg.optim, p["tokens"], p["warmup_tokens"])
        assert all(main(k * 512) == mine(k * 512) for k in range(1, p["fork_step"] + 1))
        assert main((p["fork_step"] + 1) * 512) != mine((p["fork_step"] + 1) * 512)
    assert branches.plan(cfg, 0.75)["fork_step"] == 18  # decay from 0.75 x 12,288 = 9,216 tokens


@pytest.mark.parametrize("args, message", [
    (["optim.decay_branches=[0.5,1.0]"], "optim.decay_branches=1.0: must be a number in (0, 1)"),
    (["optim.decay_branches=[0.75,0.5]"], "optim.decay_branches=[0.75, 0.5]: must be increasing"),
    (["optim.decay_branches=[0.5,0.5]"], "optim.decay_branches=[0.5, 0.5]: must be increasing"),
    (["optim.decay_branches=0.5"], "optim.decay_branches=0.5: must be a list of fractions"),
    (["optim.decay_branches=[0.5]", "optim.schedule=cosine"], "optim.decay_branches=[0.5]: needs optim.schedule=wsd"),
    (["optim.decay_branches=[0.5]", "+schedule=exp"], "optim.decay_branches=[0.5]: is for a fixed-size run"),
    (["optim.decay_branches=[0.1]"], "optim.decay_branches=0.1: budget 0.1's decay must start after the warmup"),
])
def test_bad_decay_branches_are_refused(args, message, capsys, tmp_path):
    expect_refusal(["train", *MAIN, *args], message, capsys, tmp_path)


def test_the_report_reads_branches_as_fixed_size_budget_points(tmp_path):
    """grow report on one fixed-size run with branches 0.5 and 0.75: the frontier has three points (the two branches'
    budgets and the main run's), each at its budget's whole FLOPs and final loss from the summaries, and an arm's
    effective-compute multiplier is read off it (three points: MIN_POINTS)."""
    summary = train_mod.train(run_config(*MAIN, "optim.decay_branches=[0.5,0.75]"), tmp_path / "run")
    got = [json.loads((tmp_path / "run" / "branches" / f"b{b}" / "summary.json").read_text()) for b in ("0.5", "0.75")]
    report = build_report([tmp_path / "run"], tmp_path / "report", show=False)
    ec = report["effective_compute"]
    want = [[g["flops"], g["final_val_loss"]] for g in got] + [[summary["flops"], summary["final_val_loss"]]]
    assert ec["points"] == want
    assert [p["arm"] for p in ec["point_arms"]] == ["baseline decay branch 0.5", "baseline decay branch 0.75", "baseline"]
    assert ec["arms"]["baseline"]["multiplier"] == pytest.approx(1.0, rel=1e-12)  # the frontier's own last point


def test_a_baseline_with_branches_is_the_reference_of_a_sweep_without(tmp_path):
    """Across sweeps a baseline is a reference only with the same optimizer settings; its decay branches leave the
    run as it is, so optim.decay_branches neither refuses the reference nor splits an arm."""
    a = fake_sweep(tmp_path / "A")
    b = fake_sweep(tmp_path / "B", {"zero": [4.0, 4.1, 4.2]})
    for run in [*a.iterdir(), *b.iterdir()]:
        extra = "  decay_branches: [0.5]\n" if run.parent == a else ""
        (run / "config.yaml").write_text(f"seed: 0\noptim:\n  lr: 0.003\n{extra}")
    summary = build_report([a, b], tmp_path / "report", show=False)
    arms = {e["arm"]: e for e in summary["arms"]}
    assert arms["zero [B]"]["comparisons"]["baseline"]["arm"] == "baseline"
    assert not any("decay_branches" in label for label in arms)


def test_grow_schedule_says_what_each_branch_costs_and_adds(capsys, tmp_path, monkeypatch):
    """grow schedule: per branch its budget, the steps it shares, its FLOPs as a budget (n_b steps) and those it adds
    to the run (its n_b − k_b decay steps), which training then spends (the branch summary's flops, marginal_flops)."""
    monkeypatch.chdir(tmp_path)
    cli.main(["schedule", *MAIN, "optim.decay_branches=[0.5]"])
    captured = capsys.readouterr()
    text = " ".join((captured.out + captured.err).split())
    per_step = training_flops(run_config(*MAIN).plan[0].cfg, 512)
    assert (f"decay branch 0.5: 8,192 tokens, 16 steps sharing the first 12 with the main run; {16 * per_step:.4g} "
            f"FLOPs as a budget, +{4 * per_step:.4g} FLOPs to the run (branches/b0.5/)") in text


@pytest.mark.parametrize("stop_step", [8, 12], ids=["before-the-fork", "at-the-fork"])
def test_a_stopped_run_resumes_to_the_same_branch_made_once(tmp_path, monkeypatch, stop_step):
    """Stopped (SIGTERM's path, a checkpoint) before the fork, the resumed run makes the branch; stopped at the fork step
    the branch is written before that step's checkpoint and the resumed run does not make it again. Either way the
    branch and the main run are those of a run never stopped (float64, bit for bit)."""
    made = []
    original = branches.run_branch
    monkeypatch.setattr(branches, "run_branch", lambda *a: made.append(a[1]) or original(*a))
    args = [*MAIN, "optim.decay_branches=[0.5]"]
    ref = train_mod.train(run_config(*args), tmp_path / "ref")
    want = json.loads((tmp_path / "ref" / "branches" / "b0.5" / "summary.json").read_text())
    made.clear()
    with pytest.raises(Interrupted):
        train_mod.train(run_config(*args), tmp_path / "run", stop=StopAt("step", step=stop_step))
    assert made == ([0.5] if stop_step == 12 else [])
    summary = train_mod.train(run_config(*args, f"resume={tmp_path / 'run'}"), tmp_path / "run")
    assert made == [0.5]
    got = json.loads((tmp_path / "run" / "branches" / "b0.5" / "summary.json").read_text())
    assert (got["final_val_loss"], got["flops"]) == (want["final_val_loss"], want["flops"])
    assert summary["final_val_loss"] == ref["final_val_loss"]


def test_branches_on_two_gloo_ranks_equal_one_process_and_only_rank_0_writes_them(tmp_path):
    """trainer.parallel=ddp on 2 gloo ranks (8 rows each of the 16-row global batch, each rank in its own working
    directory), a run of 16 steps (8,192 tokens; branch 0.5: 8 steps, forked after step 6), against one process:
    branch 0.5's summary (final validation loss, FLOPs, tokens) and its steps.jsonl (lr, global loss) are one
    process's (float64, 1e-10); only rank 0 writes files; the main run's losses and final loss are one process's with
    branches, which are a run's without them (test_a_branch_equals_a_wsd_run_of_its_budget_from_scratch)."""
    from tests.ranks import files_under, run_pair

    run_pair(tmp_path, [*MAIN, "trainer.max_tokens=8192", "optim.decay_branches=[0.5]", "trainer.parallel=ddp"])
    assert files_under(tmp_path / "ddp" / "rank1") == []
    ddp, one = ([p.parent for p in (tmp_path / d / "rank0").rglob("metrics.jsonl")] for d in ("ddp", "single"))
    (ddp,), (one,) = ddp, one
    assert files_under(ddp) == files_under(one) and "branches/b0.5/summary.json" in files_under(ddp)
    got, want = (json.loads((d / "branches" / "b0.5" / "summary.json").read_text()) for d in (ddp, one))
    assert (got["tokens"], got["flops"], got["fork_step"]) == (want["tokens"], want["flops"], 6)
    assert got["final_val_loss"] == pytest.approx(want["final_val_loss"], abs=1e-10, rel=0)
    rows, ref = _steps(ddp / "branches" / "b0.5" / "steps.jsonl"), _steps(one / "branches" / "b0.5" / "steps.jsonl")
    assert [r["train/step"] for r in rows] == [r["train/step"] for r in ref] == list(range(7, 9))
    for r, s in zip(rows, ref):
        assert r["train/lr"] == s["train/lr"]
        assert r["train/loss"] == pytest.approx(s["train/loss"], abs=1e-10, rel=0)
    main, alone = _train_rows(ddp), _train_rows(one)
    assert sorted(main) == sorted(alone) == list(range(1, 17))
    for step in main:
        assert main[step]["train/loss"] == pytest.approx(alone[step]["train/loss"], abs=1e-10, rel=0)
    summary, single = (json.loads((d / "summary.json").read_text()) for d in (ddp, one))
    assert summary["world_size"] == 2 and summary["flops"] == single["flops"]
    assert summary["final_val_loss"] == pytest.approx(single["final_val_loss"], abs=1e-10, rel=0)


@pytest.mark.crash
def test_a_two_rank_run_killed_after_the_fork_resumes_without_making_the_branch_again(tmp_path):
    """2 gloo ranks sharing the run directory, both SIGKILLed in step 13, after branch 0.5 (forked after step 12) was
    written: resumed on 2 ranks from the checkpoint of step 10, both find the branch's summary at step 12 and neither
    makes it again (its files untouched); the main run ends where one process's never stopped does (float64, 1e-10)."""
    from tests.ranks import finish, launch

    run, dump = tmp_path / "run", tmp_path / "dump"
    dump.mkdir()
    args = [*MAIN, "optim.decay_branches=[0.5]", "trainer.parallel=ddp", "trainer.ckpt_every=5"]
    killed = launch(2, [*args, f"hydra.run.dir={run}"], tmp_path / "first", dump, {"GROW_KILL_AT": "step:13"})
    ref = train_mod.train(run_config(*args), tmp_path / "ref")  # meanwhile, in this process
    assert [rc for rc, _, _ in finish(killed)] == [-9, -9]
    files = {p: p.stat().st_mtime_ns for p in (run / "branches" / "b0.5").iterdir()}
    assert sorted(p.name for p in files) == ["steps.jsonl", "summary.json"] and not (run / "summary.json").exists()
    for rc, out, err in finish(launch(2, [f"resume={run}"], tmp_path / "again", dump)):
        assert rc == 0 and "decay branch" not in out + err, err[-4000:]
    assert {p: p.stat().st_mtime_ns for p in (run / "branches" / "b0.5").iterdir()} == files
    summary = json.loads((run / "summary.json").read_text())
    assert summary["world_size"] == 2 and summary["final_val_loss"] == pytest.approx(ref["final_val_loss"], abs=1e-10,
                                                                                      rel=0)
