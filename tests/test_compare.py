"""`grow compare`: arms, cost accounting, the report, resuming a sweep, bad input (docs/design.md, "Commands"; docs/costs.md)."""

from __future__ import annotations

import json
import math
import signal
import sys
import time

import pytest
from hydra.experimental.callback import Callback
from omegaconf import OmegaConf

from grow.compare import arm_dirname, arm_label, arm_run, arm_setting, base_run, equal_flops_tokens
from grow.report import COLUMNS, REPORT_FILES, curve, flops_to_reach, run_metrics, stat
from grow.runs import FoundRun
from tests.conftest import TINY_RUN, assert_one_line_error, grow_cli
from tests.ranks import forked_grow

MAX_TOKENS = 15000  # the module's sweep: 29 steps of 16 x 32 tokens, four stages
TOKENS = f"trainer.max_tokens={MAX_TOKENS}"


def read_jsonl(path):
    return [json.loads(line) for line in path.read_text().splitlines() if line.strip()]


def flops_per_token(c: dict) -> int:
    """docs/costs.md written out from the dimensions: 6 x matmul weights + 6 N s E (k + v)."""
    h, E, k, v, p, N = c["d_model"], c["n_heads"], c["d_qk"], c["d_v"], c["d_ff"], c["n_layers"]
    matmul = N * (h * E * (2 * k + v) + E * v * h + 2 * h * p) + h * c["vocab_size"]
    return 6 * matmul + 6 * N * c["seq_len"] * E * (k + v)


# ---- FLOPs to reach a loss, on curves where the answer is known ----------------------------------


@pytest.mark.parametrize("target,expected", [
    (3.5, 150.0),    # between the 2nd and 3rd points: linear interpolation
    (4.0, 100.0),    # exactly at a point
    (6.0, 0.0),      # the first point is already below: its FLOPs, nothing assumed before it
    (3.0, 200.0),    # reached at the last point
    (2.9, None),     # never reached
])
def test_flops_to_reach_on_known_curves(target, expected):
    pts = [(0.0, 5.0), (100.0, 4.0), (200.0, 3.0)]
    got = flops_to_reach(pts, target)
    assert got == (None if expected is None else pytest.approx(expected))


def test_flops_to_reach_takes_the_first_crossing_and_skips_non_finite_points():
    # down to 3.9 at 100 FLOPs, a growth raises it to 4.2, then 3.0 at 200 FLOPs
    pts = [(0.0, 5.0), (100.0, 3.9), (100.0, 4.2), (200.0, 3.0)]
    assert flops_to_reach(pts, 4.0) == pytest.approx(100 * (5.0 - 4.0) / (5.0 - 3.9))
    assert flops_to_reach(pts, 3.5) == pytest.approx(100 + 100 * (4.2 - 3.5) / (4.2 - 3.0))
    assert flops_to_reach([(0.0, math.nan), (10.0, 2.0)], 3.0) == 10.0


def _records():
    """metrics.jsonl of a 2-stage run: evaluations at 100 and 200 FLOPs, a growth with a 10-FLOP pass."""
    return [
        {"train/loss": 5.5, "train/flops": 50.0, "time/seconds": 0.5},
        {"val/loss": 5.0, "train/flops": 100.0, "time/seconds": 1.0},
        {"growth/stage": 1, "growth/loss_before": 5.0, "growth/loss_after": 5.2, "growth/delta": 0.2,
         "growth/flops": 10.0, "growth/seconds": 0.25, "train/flops": 110.0},
        {"val/loss": 4.2, "train/flops": 210.0, "time/seconds": 2.0},
        {"val/loss": 4.2, "train/flops": 210.0, "time/seconds": 2.0},
    ]


def test_the_curve_holds_evaluations_and_both_sides_of_each_growth():
    pts = curve(_records())
    assert [(p[0], p[1], p[3]) for p in pts] == [(100.0, 5.0, "val"), (100.0, 5.0, "before"), (110.0, 5.2, "after"),
                                                 (210.0, 4.2, "val"), (210.0, 4.2, "val")]
    assert [p[2] for p in pts] == [1.0, 1.0, 1.25, 2.0, 2.0]  # a growth's time: the last record's + its seconds


def test_run_metrics_are_ratios_to_the_baseline_of_the_same_seed(tmp_path):
    summary = {"final_val_loss": 4.2, "tokens": 1000, "flops": 210.0, "train_flops": 200.0, "growth_flops": 10.0,
               "train_seconds": 2.0, "compile_seconds": 0.5, "wall_seconds": 3.0, "complete": True,
               "growth_events": [{"growth/delta": -0.3, "growth/recovery": -0.5},
                                 {"growth/delta": 0.2, "growth/recovery": -0.1}]}
    run = FoundRun(tmp_path, {"arm": "zero", "kind": "grown", "seed": 0, "plan_flops": 200.0}, summary, None, _records())
    base = FoundRun(tmp_path, {"arm": "baseline", "kind": "baseline", "seed": 0},
               {"final_val_loss": 4.6, "flops": 400.0, "train_seconds": 4.0})
    m = run_metrics(run, base)
    assert m["flops_pct_baseline"] == pytest.approx(52.5)
    assert m["time_pct_baseline"] == pytest.approx(50.0)
    # 4.6 is reached between (110, 5.2) and (210, 4.2): 110 + 100 * 0.6 / 1.0 = 170 FLOPs, of the baseline's 400
    assert m["flops_to_baseline_loss"] == pytest.approx(170.0 / 400.0)
    assert m["max_abs_growth_delta"] == pytest.approx(0.3)
    assert m["mean_recovery"] == pytest.approx(-0.3)
    base.summary["final_val_loss"] = 4.0  # never reached
    m = run_metrics(run, base)
    assert m["flops_to_baseline_loss"] is None and m["reached_baseline_loss"] is False
    m = run_metrics(run, None)  # no baseline in the sweep
    assert m["flops_pct_baseline"] is None and m["flops_to_baseline_loss"] is None


def test_stat_is_mean_and_sample_std_of_the_known_values():
    s = stat([1.0, 2.0, None, 3.0])
    assert s["mean"] == 2.0 and s["std"] == pytest.approx(1.0) and s["n"] == 3 and s["values"][2] is None
    assert stat([5.0])["std"] is None and stat([None])["mean"] is None


# ---- arms ------------------------------------------------------------------------------------------


def test_arm_names_carry_the_swept_values_each_arm_depends_on():
    overrides = ["strategy=zero", "seed=1", "schedule.width_rate=0.5", "model=tiny", "trainer.batch_size=16"]
    setting = arm_setting(overrides, ["schedule.width_rate", "model"])
    assert setting == {"schedule.width_rate": "0.5", "model": "tiny"}
    assert arm_label("grown", "zero", setting) == "zero width_rate=0.5 model=tiny"
    assert arm_label("baseline", None, setting) == "baseline model=tiny"  # the schedule does not change it
    assert arm_label("equal_flops", None, setting) == "equal_flops width_rate=0.5 model=tiny"
    assert arm_dirname("zero grow=[d_model,d_ff]", 2) == "zero_grow=d_model+d_ff-seed2"


def test_expand_arms_rewrites_the_strategy_sweep():
    from grow.commands.compare import expand_arms

    out = expand_arms(["strategy=zero,random", "seed=0,1", "schedule.width_rate=0.5,1.0", "strategy.layer_position=start",
                       "compare.equal_flops=true", "-m"], invocation="abc")
    assert out[0] == "-m" and out[1] == "strategy=baseline,zero,random,equal_flops"
    assert "++strategy.layer_position=start" in out
    assert "compare.vary=['schedule.width_rate']" in out and "compare.invocation=abc" in out
    assert any(a.startswith("hydra.searchpath=") and "grow/arms" in a for a in out)
    assert expand_arms(["compare.baseline=false"], invocation="x")[0] == "strategy=zero"  # train.yaml's default


def test_expand_arms_reads_an_experiments_compare_block():
    """The arms come from the composed config: an experiment's ``compare:`` block counts (one-growth sets
    equal_flops), and the command line still wins over it."""
    from grow.commands.compare import expand_arms

    out = expand_arms(["+experiment=one-growth", "strategy=msg,zero", "seed=0,1"], invocation="x")
    assert out[1] == "strategy=baseline,msg,zero,equal_flops"
    out = expand_arms(["+experiment=one-growth", "strategy=msg", "compare.equal_flops=false", "compare.baseline=false"],
                      invocation="x")
    assert out[1] == "strategy=msg"
    assert expand_arms(["strategy=msg"], invocation="x")[0] == "strategy=baseline,msg"  # compare.yaml's defaults


def _compose(name, overrides):
    from hydra import compose, initialize_config_dir

    from grow.config import CONFIG_DIR

    with initialize_config_dir(str(CONFIG_DIR), version_base="1.3"):
        return compose(name, overrides=overrides)


def _run(cfg):
    """A composed `grow train` config as the run it validates to, its W&B group and name cleared."""
    from grow.run import load as load_run

    return _unnamed(load_run(cfg))


def _unnamed(run):
    import dataclasses

    return run.changed(logger=dataclasses.replace(run.logger, group=None, name=None))


def test_each_arm_is_what_grow_train_would_run():
    """An arm is the job's validated run changed by `RunConfig.replace`: its typed fields and its config
    file (``raw``) both equal those of the `grow train` command it stands for."""
    args = ["model=tiny", "trainer.max_tokens=30000", "seed=2", "schedule.length_rate=0.25"]
    base = base_run(_compose("compare", ["strategy=random", *args]))
    grown = arm_run(base, "grown", group="g", name="random")
    assert grown.logger.group == "g" and grown.logger.name == "random"
    assert grown.raw["logger"]["group"] == "g" and grown.raw["logger"]["name"] == "random"
    want = _compose("train", ["+schedule=exp", "strategy=random", "model=tiny", "trainer.max_tokens=30000", "seed=2",
                              "schedule.length_rate=0.25"])
    assert _unnamed(grown) == _run(want)
    baseline = arm_run(base, "baseline", group="g", name="baseline")
    assert _unnamed(baseline) == _run(_compose("train", ["model=tiny", "trainer.max_tokens=30000", "seed=2"]))
    # equal FLOPs: the final model on the plan's FLOPs, whole steps, never more
    eq = arm_run(base, "equal_flops", group="g", name="equal_flops")
    final, plan = base.model, base.plan
    per_step = 32 * final.seq_len
    tokens = equal_flops_tokens(base)
    assert eq.trainer.max_tokens == eq.raw["trainer"]["max_tokens"] == tokens and tokens % per_step == 0
    assert tokens * final.flops_per_token() <= plan.total_flops < (tokens + per_step) * final.flops_per_token()
    assert _unnamed(eq) == _run(_compose("train", ["model=tiny", f"trainer.max_tokens={tokens}", "seed=2"]))


class _Hydra:
    """The bits of HydraConfig that `job_arms` reads."""

    def __init__(self, overrides):
        self.overrides = OmegaConf.create({"task": list(overrides)})
        self.sweep = OmegaConf.create({"dir": "/tmp/sweep-x"})


def test_a_strategy_with_its_own_parameterization_brings_its_matched_baseline():
    """vt (and svd over a vt base) puts the model in Table 1's parameterization: its job also trains
    `baseline init=vt`, the final model from scratch with init=strategy; zero needs none."""
    from grow.compare import job_arms

    args = ["model=tiny", "trainer.max_tokens=30000"]
    vt = job_arms(_compose("compare", ["strategy=vt", *args]), _Hydra(["strategy=vt"]))
    assert [(a.kind, a.label) for a in vt] == [("grown", "vt"), ("matched", "baseline init=vt")]
    matched = vt[1].run
    want = _run(_compose("train", ["strategy=vt", "init=strategy", "model=tiny", "trainer.max_tokens=30000"]))
    assert _unnamed(matched) == want  # exactly `grow train strategy=vt init=strategy`: no schedule
    assert vt[1].info["parameterization"] == "vt" and vt[1].info["baseline_arm"] == "baseline"
    assert vt[0].info["parameterization"] == "vt"  # arm.json of the grown arm: the report pairs it by this
    svd = job_arms(_compose("compare", ["strategy=svd", "strategy.base=vt", *args]), _Hydra(["strategy=svd"]))
    assert [a.label for a in svd] == ["svd", "baseline init=vt"]  # the same arm directory: trained once
    zero = job_arms(_compose("compare", ["strategy=zero", *args]), _Hydra(["strategy=zero"]))
    assert [a.kind for a in zero] == ["grown"] and zero[0].info["parameterization"] is None
    off = job_arms(_compose("compare", ["strategy=vt", "compare.matched_baseline=false", *args]), _Hydra([]))
    assert [a.kind for a in off] == ["grown"]


def test_equal_flops_stages_trains_every_stage_size_on_the_plans_flops():
    from grow.compare import job_arms
    from grow.run import load as load_run

    cfg = _compose("compare", ["compare.equal_flops_sizes=stages", "model=tiny", "trainer.max_tokens=30000"])
    OmegaConf.set_struct(cfg, False)
    cfg.strategy = {"name": "equal_flops"}  # grow/arms/strategy/equal_flops.yaml, which grow compare adds
    arms = job_arms(cfg, _Hydra(["strategy=equal_flops"]))
    assert [a.label for a in arms] == ["equal_flops size=s1", "equal_flops size=s2", "equal_flops size=s3",
                                      "equal_flops"]
    grown = base_run(_compose("compare", ["strategy=zero", "model=tiny", "trainer.max_tokens=30000"]))
    budget = grown.plan.total_flops
    for a, stage in zip(arms, grown.plan):
        run = a.run
        assert run.model == stage.cfg and run.schedule is None and a.info["size"] == stage.number
        assert load_run(OmegaConf.create(run.raw)) == run  # its config file says the same
        assert a.info["budget_flops"] == budget  # the grown arms' plan FLOPs: the report groups by it
        per_step = run.trainer.batch_size * run.model.seq_len * run.model.flops_per_token()
        assert run.plan.total_flops <= budget < run.plan.total_flops + per_step  # whole steps, never more
    assert arms[0].run.trainer.max_tokens > arms[-1].run.trainer.max_tokens  # the small model gets more tokens


# ---- the real command -------------------------------------------------------------------------------


class JobCounter(Callback):
    """A Hydra callback (public API, registered on the command line) that records each job Hydra's launcher starts."""

    started: list[str] = []

    def on_job_start(self, config, **kwargs) -> None:
        JobCounter.started.append(str(config.strategy.name))


@pytest.fixture(scope="module")
def sweep(tmp_path_factory):
    """One `grow compare strategy=zero,random compare.equal_flops=true` on the tiny model (four arms), counted through
    public names: grow's composes (`hydra.compose`), the jobs Hydra starts (`JobCounter`) and the run configs checked
    (`RunConfig.from_node`)."""
    import hydra

    from grow.config import RunConfig

    cwd = tmp_path_factory.mktemp("compare")
    d = cwd / "sweep"
    counts = {"compose": 0, "checked": 0}
    compose, from_node = hydra.compose, RunConfig.from_node.__func__

    def counted(key, call):
        return lambda *a, **k: counts.update({key: counts[key] + 1}) or call(*a, **k)

    JobCounter.started.clear()
    with pytest.MonkeyPatch.context() as m:
        m.setattr(hydra, "compose", counted("compose", compose))
        m.setattr(RunConfig, "from_node", classmethod(counted("checked", from_node)))
        out = grow_cli("compare", "strategy=zero,random", "compare.equal_flops=true", *TINY_RUN, TOKENS,
                       f"hydra.sweep.dir={d}", f"+hydra.callbacks.count._target_={__name__}.JobCounter", cwd=cwd)
    assert out.returncode == 0, out.stderr[-4000:]
    out.counts = {**counts, "jobs": list(JobCounter.started)}
    return d, out


def test_a_sweep_composes_each_job_to_check_it_and_each_arm_to_run_it(sweep):
    """Before Hydra starts, grow composes each strategy job of the command line (zero, random) and checks it, and
    composes the ``compare`` block once (`composed_compare`); Hydra's launcher then starts each arm once, and each arm
    checks its run config once (the pseudo-strategy arms, baseline and equal_flops, are checked in their job only).
    A job composed or checked twice, by grow, fails here; Hydra's own composes inside its launcher are not counted
    (no public hook sees them in Hydra 1.3)."""
    d, out = sweep
    arms = json.loads((d / "summary.json").read_text())["arms"]
    assert out.counts["jobs"] == [a["arm"] for a in arms] == ["baseline", "zero", "random", "equal_flops"]
    assert out.counts["compose"] == 2 + 1
    assert out.counts["checked"] == 2 + len(arms)


def test_compare_writes_the_report_with_every_column(sweep):
    d, out = sweep
    for name in REPORT_FILES:
        assert (d / name).is_file() and (d / name).stat().st_size > 0, name
    summary = json.loads((d / "summary.json").read_text())
    arms = {a["arm"]: a for a in summary["arms"]}
    assert list(arms) == ["baseline", "zero", "random", "equal_flops"]
    for a in arms.values():
        assert a["seeds"] == [0]
        for col in COLUMNS:
            assert col in a and set(a[col]) >= {"mean", "std", "n", "values"}, (a["arm"], col)
        assert a["final_val_loss"]["mean"] < math.log(512)
        assert a["accounting_check"] is True
    assert arms["baseline"]["flops_pct_baseline"]["mean"] == pytest.approx(100.0)
    assert arms["baseline"]["flops_to_baseline_loss"]["mean"] == pytest.approx(1.0)
    assert arms["zero"]["max_abs_growth_delta"]["mean"] < 1e-4  # zero growth preserves the function
    assert arms["zero"]["flops_pct_baseline"]["mean"] < 100.0
    assert arms["zero"]["mean_recovery"]["n"] == 1
    # the console table and the report
    # the title says what the experiment is, not the directory's name
    assert "zero, random, equal_flops vs the baseline: growing to 50.5k parameters on 14.8k tokens of stdlib" in out.stdout
    assert summary["title"].startswith("zero, random, equal_flops vs the baseline")
    md = (d / "report.md").read_text()
    assert "| zero |" in md and "How costs are counted" in md and "loss_vs_flops.png" in md
    from grow.provenance import code_version, describe

    assert summary["code"] == [describe(code_version())]  # every arm by this code, said once
    assert f"Code: {describe(code_version())}." in md
    from grow.provenance import describe_machine, machine

    assert summary["machines"] == [describe_machine(machine())] and f"Machine: {describe_machine(machine())}." in md


def test_flops_of_each_arm_are_the_sum_over_its_stage_plan(sweep):
    from grow.plan import build_plan
    from tests.helpers import model_of

    d, _ = sweep
    cfg = _compose("train", ["+schedule=exp", *TINY_RUN, TOKENS])
    final = model_of(cfg.model)
    plan = build_plan(final, OmegaConf.to_container(cfg.schedule, resolve=True), max_tokens=MAX_TOKENS, batch_size=16)
    for arm in ("zero", "random"):
        s = json.loads((d / f"{arm}-seed0" / "summary.json").read_text())
        stages = s["stage_plan"]
        assert [(st["config"], st["tokens"]) for st in stages] == [(p.cfg.to_dict(), p.tokens) for p in plan]
        expected = sum(flops_per_token(st["config"]) * st["tokens"] for st in stages) + s["growth_flops"]
        assert s["flops"] == pytest.approx(expected, rel=1e-12), arm
        assert len(stages) == 4 and s["growth_flops"] == 0.0
    base = json.loads((d / "baseline-seed0" / "summary.json").read_text())
    assert base["flops"] == pytest.approx(flops_per_token(base["final_config"]) * base["tokens"], rel=1e-12)
    eq = json.loads((d / "equal_flops-seed0" / "summary.json").read_text())
    zero = json.loads((d / "zero-seed0" / "summary.json").read_text())
    step_flops = flops_per_token(eq["final_config"]) * 16 * 32
    assert zero["flops"] - step_flops < eq["flops"] <= zero["flops"]
    # every arm saw the same token stream: the same first tokens at the same seed (stage 0 of the baseline
    # and of the grown arms have the same batch size, so the same samples)
    assert base["tokens"] == zero["tokens"]


def test_report_alone_rebuilds_the_files_without_training(sweep):
    d, _ = sweep
    before = {p.name: p.stat().st_mtime_ns for p in d.glob("*/metrics.jsonl")}
    old = json.loads((d / "summary.json").read_text())
    for name in REPORT_FILES:
        (d / name).unlink()
    out = grow_cli("compare", f"report={d}", cwd=d.parent)
    assert out.returncode == 0, out.stderr[-3000:]
    for name in REPORT_FILES:
        assert (d / name).is_file(), name
    assert json.loads((d / "summary.json").read_text()) == old
    assert {p.name: p.stat().st_mtime_ns for p in d.glob("*/metrics.jsonl")} == before
    assert "arm baseline, seed 0" not in out.stdout and "run summary" not in out.stdout  # no arm started


@pytest.mark.crash
def test_a_killed_sweep_trains_only_the_missing_arms_on_rerun(tmp_path, sweep):
    """SIGKILL in the middle of the second stage of the second arm (zero, seed 0; the first arm,
    baseline seed 0, finished), W&B offline as a user runs it (#16: the rerun used to die on
    ``run ID ... is in use``); the rerun skips the first arm, resumes the second from its checkpoint,
    trains the other two. The kill is a `grow.faults` kill point: the n-th training step of the process."""
    from grow.plan import build_plan
    from tests.helpers import model_of

    d = tmp_path / "sweep"
    args = ["compare", "seed=0,1", "strategy=zero", *TINY_RUN, TOKENS, f"hydra.sweep.dir={d}"]
    cfg = _compose("train", ["+schedule=exp", *TINY_RUN, TOKENS])
    plan = build_plan(model_of(cfg.model), OmegaConf.to_container(cfg.schedule, resolve=True), max_tokens=MAX_TOKENS,
                      batch_size=16)
    baseline_steps = MAX_TOKENS // (16 * 32)
    kill_at = baseline_steps + plan.start_step(1) + plan[1].steps // 2  # zero's stage 2, half way
    env = {"WANDB_MODE": "offline", "WANDB_SILENT": "true"}
    killed = forked_grow(*args, cwd=tmp_path, env={**env, "GROW_KILL_AT": f"step:{kill_at}"})
    assert killed.returncode == -signal.SIGKILL, killed.stderr[-3000:]
    first = d / "baseline-seed0" / "summary.json"
    second = d / "zero-seed0"  # the jobs run seed-major: baseline, zero for seed 0, then seed 1
    assert first.exists(), "the first arm did not finish"
    assert not (second / "summary.json").exists() and any(second.glob("checkpoints/ckpt-*.json"))
    done = first.stat().st_mtime_ns
    out = forked_grow(*args, cwd=tmp_path, env=env)
    assert out.returncode == 0, out.stderr[-3000:]
    assert "baseline-seed0: finished earlier, skipped" in out.stdout
    assert "arm baseline, seed 0" not in out.stdout  # not trained again
    assert "arm zero, seed 0 (resumed)" in out.stdout  # before the directory, which a narrow console cuts
    for arm in ("arm baseline, seed 1", "arm zero, seed 1"):
        assert arm in out.stdout, arm
    assert first.stat().st_mtime_ns == done
    # the interrupted arm's metrics are those of the same arm never stopped (the module's sweep), bitwise
    timing = ("seconds", "tokens_per_s", "train/mfu")
    same = lambda rs: [{k: v for k, v in r.items() if not any(t in k for t in timing)} for r in rs]
    whole_dir = sweep[0] / "zero-seed0"
    assert same(read_jsonl(second / "metrics.jsonl")) == same(read_jsonl(whole_dir / "metrics.jsonl"))
    resumed = json.loads((second / "summary.json").read_text())
    whole = json.loads((whole_dir / "summary.json").read_text())
    assert resumed["final_val_loss"] == whole["final_val_loss"]
    assert resumed["flops"] == whole["flops"] and resumed["tokens"] == whole["tokens"]
    for arm in ("baseline-seed0", "zero-seed0", "baseline-seed1", "zero-seed1"):  # every arm has its W&B run
        assert list((d / arm / "wandb").glob("offline-run-*")), arm
    summary = json.loads((d / "summary.json").read_text())
    arms = {a["arm"]: a for a in summary["arms"]}
    assert set(arms) == {"baseline", "zero"}
    for a in arms.values():
        assert a["seeds"] == [0, 1] and a["final_val_loss"]["std"] is not None


BAD = [
    (["strategy=nonexistent"], "strategy"),
    (["strategy="], "strategy"),
    (["strategy=[]"], "strategy"),
    (["compare.baseline=maybe"], "compare.baseline"),
]


@pytest.mark.parametrize("overrides,key", BAD, ids=[" ".join(o) for o, _ in BAD])
def test_bad_input_is_one_line_and_exit_2(tmp_path, overrides, key):
    out = grow_cli("compare", "model=tiny", *overrides, f"hydra.sweep.dir={tmp_path / 'sweep'}", cwd=tmp_path)
    assert_one_line_error(out, key)
    assert not (tmp_path / "sweep").exists()


def test_strategy_all_and_glob_train_every_strategy(tmp_path, monkeypatch):
    """``strategy=all`` (configs/sweep/strategies.yaml's) and ``strategy=glob(*)`` through `grow.cli.main`: the command
    line's check composes the strategies they name (it once refused ``all`` as a config name and could not
    list a glob), and every strategy trains beside the baseline. ``all`` trains (its precheck runs inside
    `grow.cli.main`); ``glob(*)`` becomes the same jobs for the precheck and the same command line Hydra runs,
    so it would be checked and trained the same way."""
    from grow import cli
    from grow.commands.compare import composable, expand_arms
    from grow.errors import options

    monkeypatch.chdir(tmp_path)
    monkeypatch.setattr(sys, "argv", ["grow"])
    monkeypatch.setenv("GROW_COMMAND", "")
    d = tmp_path / "sweep"
    args = [*TINY_RUN, "trainer.max_tokens=1024", "schedule.stages=2", "schedule.first_stage=0.5",
            "trainer.eval_batches=1"]  # one growth each, a step either side: the arms are what is asserted
    checked = {value: composable([f"strategy={value}", *args]) for value in ("all", "glob(*)")}
    assert checked["glob(*)"] == checked["all"] and f"strategy={','.join(options('strategy'))}" in checked["all"]
    runs = {value: expand_arms([f"strategy={value}", *args], invocation="x") for value in ("all", "glob(*)")}
    assert runs["glob(*)"] == runs["all"] and f"strategy=baseline,{','.join(options('strategy'))}" in runs["all"]
    cli.main(["compare", "strategy=all", *args, "compare.options.ligo.steps=2", f"hydra.sweep.dir={d}"])  # not 100
    arms = [a["arm"] for a in json.loads((d / "summary.json").read_text())["arms"]]
    assert [a for a in arms if not a.startswith("baseline")] == options("strategy"), arms
    assert {"ligo", "shrink_perturb", "llama_pro", "dus"} <= set(arms)  # issue 48's, by the registry alone
    assert "baseline" in arms


def test_report_of_a_directory_without_arms_is_one_line_and_exit_2(tmp_path):
    out = grow_cli("compare", f"report={tmp_path}", cwd=tmp_path)
    assert out.returncode == 2 and out.stderr.startswith("error: report=") and len(out.stderr.splitlines()) == 1


def _claim_in_a_child(arm_dir, hold: bool):
    """A forked process (grow already imported: no interpreter start) that claims ``arm_dir`` and sends
    what `claim` yielded; with ``hold`` it keeps the claim until it is killed."""
    import multiprocessing

    from grow.compare import claim

    def child(conn):
        with claim(arm_dir) as mine:
            conn.send(mine)
            if hold:
                time.sleep(60)

    ctx = multiprocessing.get_context("fork")
    ours, theirs = ctx.Pipe()
    proc = ctx.Process(target=child, args=(theirs,), daemon=True)
    proc.start()
    assert ours.poll(60), "the child did not answer"
    return proc, ours.recv()


def test_an_arm_is_claimed_by_one_live_process_and_freed_when_it_dies(tmp_path):
    """The arm lock is a flock: a second claimant is refused while the holder lives, and a holder killed
    by SIGKILL leaves nothing that blocks the next run."""
    from grow.compare import claim

    holder, mine = _claim_in_a_child(tmp_path, hold=True)
    try:
        assert mine is True
        with claim(tmp_path) as mine:
            assert mine is False
    finally:
        holder.kill()  # SIGKILL
        holder.join()
    assert holder.exitcode == -signal.SIGKILL
    with claim(tmp_path) as mine:
        assert mine is True
        with claim(tmp_path) as again:  # re-entrant in the holding process: the arm's run takes the same lock
            assert again is True
        assert mine is True
    other, mine = _claim_in_a_child(tmp_path, hold=False)
    other.join()
    assert mine is True  # released when the holder's block ended


TRIGGERS = [["schedule/trigger=periodic", "schedule.trigger.every_tokens=14000"],
            ["schedule/trigger=plateau", "trainer.eval_every=10"]]


@pytest.mark.parametrize("trigger", TRIGGERS, ids=["periodic", "plateau"])
def test_equal_flops_arms_under_a_moving_trigger_are_refused(tmp_path, capsys, trigger):
    """The equal-FLOPs arms get the stage plan's FLOPs; a trigger other than fixed moves the growths, so the grown
    arm trains other FLOPs (1.47x the arm's with periodic every 14,000 tokens on tiny): one line, exit 2, before
    any work, and the arms of such a job are never built (the report never calls unequal compute equal)."""
    from grow.compare import job_arms
    from tests.helpers import expect_refusal

    name = trigger[0].split("=")[1]
    expect_refusal(["compare", "model=tiny", "strategy=zero", "compare.equal_flops=true", *trigger,
                    f"hydra.sweep.dir={tmp_path / 'sweep'}"],
                   f"schedule.trigger.name='{name}': compare.equal_flops=true", capsys, tmp_path)
    assert not (tmp_path / "sweep").exists()
    from grow.commands.compare import check

    cfg = _compose("compare", ["model=tiny", *trigger])
    check(cfg)  # without equal-FLOPs arms the trigger is fine
    OmegaConf.set_struct(cfg, False)
    cfg.strategy = {"name": "equal_flops"}
    with pytest.raises(ValueError, match=f"schedule.trigger.name='{name}'"):
        job_arms(cfg, _Hydra(["strategy=equal_flops"]))
    fixed = _compose("compare", ["model=tiny", "compare.equal_flops=true"])
    check(fixed)  # the plan's own boundaries: the budget is the grown arm's


def test_an_earlier_stage_equal_flops_arm_has_the_grown_stages_rotary_table():
    """``equal_flops size=s<k>`` is stage k's model as the grown run has it: on rotary heads whose k grows, its
    frequencies are anchored at the final k (model.rope_dim), not plain RoPE at the stage's own k; the final-size
    arm is the final model unchanged."""
    from grow.compare import job_arms

    over = ["compare.equal_flops_sizes=stages", "model=llama-tiny", "trainer.max_tokens=30000"]
    cfg = _compose("compare", over)
    OmegaConf.set_struct(cfg, False)
    cfg.strategy = {"name": "equal_flops"}
    arms = job_arms(cfg, _Hydra(["strategy=equal_flops"]))
    grown = base_run(_compose("compare", ["strategy=zero", *over[1:]]))
    final = grown.model
    assert grown.plan[0].cfg.d_qk < final.d_qk and final.positions == "rope"
    for a, stage in zip(arms, grown.plan):
        model = a.run.model
        assert model.replace(rope_dim=None) == stage.cfg.replace(rope_dim=None)
        assert model.rope_anchor == stage.cfg.rope_anchor == final.d_qk
    assert arms[-1].run.model == final


def test_hydras_info_flags_go_after_or_before_the_overrides(tmp_path):
    """``grow compare <overrides> --cfg job`` prints the composed config: the search path Hydra needs is
    put on the overrides' side of the flag (argparse takes the overrides as one run of arguments)."""
    for args in (["model=tiny", "strategy=zero", "--cfg", "job"], ["--cfg", "job", "model=tiny"]):
        out = grow_cli("compare", *args, cwd=tmp_path)
        assert out.returncode == 0 and "n_layers: 2" in out.stdout, (args, out.stderr[-500:])


@pytest.mark.parametrize("option, refusal", [
    ("compare.options.lgo.steps=7", "compare.options.lgo={'steps': 7}: not a strategy; allowed: "),
    ("compare.options.ligo.stepz=7", "compare.options.ligo.stepz=7: not an option of strategy ligo; allowed: grad_clip"),
    ("compare.options.ligo.steps=-1", "compare.options.ligo.steps=-1: must be an integer >= 0"),
    ("compare.options.ligo=5", "compare.options.ligo=5: a mapping of strategy ligo's options"),
    ("compare.options=5", "compare.options=5: a mapping of strategies to their options"),
    ("compare.options.ligo.steps=7,10", "compare.options.ligo.steps='7,10': one value, not a sweep"),
    ("++compare.options.ligo.steps=7,10", "compare.options.ligo.steps='7,10': one value, not a sweep"),
    ("compare.options.svd.steps=1", "compare.options.svd={'steps': 1}: not a strategy of this comparison; its "
                                    "strategies: ligo, zero"),
])
def test_one_strategys_options_are_checked_as_the_command_line_names_them(tmp_path, capsys, option, refusal):
    """``compare.options.<strategy>.<key>``: a name that is not a strategy or not one of the comparison's, a key the
    strategy does not have or a value it refuses, a non-mapping and a sweep each end in one line, exit 2, before any
    arm runs; the line names the key as typed (not the ``strategy.<key>`` it becomes in the arm)."""
    from tests.helpers import expect_refusal

    expect_refusal(["compare", "model=tiny", "strategy=ligo,zero", "trainer.max_tokens=30000", option,
                    f"hydra.sweep.dir={tmp_path / 'sweep'}"], refusal, capsys, tmp_path)
    assert not (tmp_path / "sweep").exists()
