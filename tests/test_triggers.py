"""Growth triggers (``schedule.trigger``, grow/triggers/, docs/strategies.md): each rule on synthetic
progress, their refusals, and a plateau-triggered run that grows, is accounted and resumes bitwise."""

from __future__ import annotations

import json
import math
import re

import pytest

from grow.errors import ConfigError
from grow.triggers import Progress, build
from grow.triggers.gstack import gstack_tokens
from grow.triggers.plateau import slope
from tests.conftest import TINY_RUN, grow_cli
from tests.ranks import forked_grow


def progress(**kw) -> Progress:
    base = dict(stage=0, stages=4, tokens=0, stage_tokens=0, params=1000, final_params=8000, max_tokens=10 ** 6,
                budget_flops=1e12)
    return Progress(**{**base, **kw})


def test_fixed_is_the_plan():
    t = build(None)
    assert t.name == "fixed" and t.planned
    assert not t.after_step({}, progress(stage_tokens=10 ** 9))


def test_periodic_fires_once_the_stage_has_its_tokens():
    t = build({"name": "periodic", "every_tokens": 5000})
    assert not t.planned
    assert not t.after_step({}, progress(stage_tokens=4999)) and t.after_step({}, progress(stage_tokens=5000))


def test_plateau_fires_when_the_loss_falls_four_times_slower_than_at_the_stage_start():
    """A synthetic curve: loss = 1/sqrt(tokens), whose rate falls as tokens^-1.5: with window 3 and
    evaluations every 10k tokens the rate over the last window drops below 1/4 of the first window's
    at the evaluation the closed form says."""
    t = build({"name": "plateau", "window": 3, "min_ratio": 0.25})
    memory: dict = {}
    t.begin_stage(memory, progress())
    fired = None
    for i in range(1, 40):
        tokens = 10_000 * i
        if t.after_eval(memory, progress(tokens=tokens, stage_tokens=tokens), 1 / math.sqrt(tokens), None):
            fired = i
            break
    pts = lambda i: [(10_000 * j / 1e6, 1 / math.sqrt(10_000 * j)) for j in range(i - 2, i + 1)]
    first = -slope(pts(3))
    expect = next(i for i in range(3, 40) if -slope(pts(i)) < 0.25 * first)
    assert fired == expect and 3 < fired < 40
    # a loss that does not fall over the first window: a plateau at once
    flat: dict = {}
    t.begin_stage(flat, progress())
    assert [t.after_eval(flat, progress(tokens=k, stage_tokens=k), 2.0, None) for k in (1, 2, 3)] == [False, False, True]


def test_plateau_waits_for_min_tokens_and_forgets_the_last_stage():
    t = build({"name": "plateau", "window": 2, "min_ratio": 0.5, "min_tokens": 100})
    m: dict = {}
    t.begin_stage(m, progress())
    assert not t.after_eval(m, progress(tokens=10, stage_tokens=10), 3.0, None)
    assert not t.after_eval(m, progress(tokens=20, stage_tokens=20), 3.0, None)  # flat, but under min_tokens
    assert t.after_eval(m, progress(tokens=200, stage_tokens=200), 3.0, None)
    t.begin_stage(m, progress(stage=1))
    assert m["evals"] == []


def test_gap_fires_when_validation_exceeds_training_by_the_threshold():
    t = build({"name": "gap", "threshold": 0.1})
    assert not t.after_eval({}, progress(), 3.0, None)  # no training loss logged since the last evaluation
    assert not t.after_eval({}, progress(), 3.0, 2.95)
    assert t.after_eval({}, progress(), 3.0, 2.85)


def test_tokens_per_param_counts_the_runs_tokens_against_the_current_model():
    t = build({"name": "tokens_per_param", "ratio": 20})
    assert not t.after_step({}, progress(tokens=19_999, params=1000))
    assert t.after_step({}, progress(tokens=20_000, params=1000))


def test_gstack_is_du_et_al_eq_2():
    """log10 d = 0.88 log10 N + 163.27 / log10 C - 5.74; N = 1e9, C = 1e20 by hand: 10.34350."""
    assert math.log10(gstack_tokens(1e9, 1e20)) == pytest.approx(0.88 * 9 + 163.27 / 20 - 5.74, abs=1e-12)
    t = build({"name": "gstack"})
    m: dict = {}
    d = gstack_tokens(8000, 1e12)
    assert not t.after_step(m, progress(stage_tokens=int(d) - 1)) and t.after_step(m, progress(stage_tokens=int(d) + 1))


@pytest.mark.parametrize("node, key", [({"name": "sometimes"}, "schedule.trigger.name"),
                                       ({"name": "plateau", "window": 1}, "schedule.trigger.window"),
                                       ({"name": "periodic", "every": 5}, "schedule.trigger.every"),
                                       ({"name": "periodic", "every_tokens": 0}, "schedule.trigger.every_tokens"),
                                       ({"name": "gap", "threshold": "high"}, "schedule.trigger.threshold")])
def test_bad_trigger_options_name_their_key(node, key):
    with pytest.raises(ValueError, match=f"^{key}="):
        build(node)


# every option of every built-in trigger, the bad values of its type and range (before: NaN and inf passed as a
# threshold, a min_ratio or a ratio; a negative min_tokens was told "an integer >= 1" though 0 is its default)
BAD_OPTIONS = [
    ("gap", "threshold", ["abc", True, None, float("nan"), float("inf")], "must be a finite number"),
    ("gap", "min_tokens", ["abc", True, None, -5, 2.5], "must be an integer >= 0"),
    ("periodic", "every_tokens", ["abc", True, None, 0, 2.5, float("inf")], "must be an integer >= 1"),
    ("plateau", "window", ["abc", True, None, 1, 2.5], "must be an integer >= 2"),
    ("plateau", "min_ratio", ["abc", True, None, -0.1, float("nan"), float("inf")], "must be a number >= 0"),
    ("plateau", "min_tokens", ["abc", -1, 2.5], "must be an integer >= 0"),
    ("tokens_per_param", "ratio", ["abc", True, None, 0, -1.0, float("nan"), float("inf")], "must be a number > 0"),
]


@pytest.mark.parametrize("name, key, values, allowed", BAD_OPTIONS)
def test_each_trigger_option_refuses_a_bad_value_in_one_line(name, key, values, allowed):
    for value in values:
        with pytest.raises(ConfigError) as err:
            build({"name": name, key: value})
        assert str(err.value) == f"schedule.trigger.{key}={value!r}: {allowed}"


def test_bad_options_cover_every_option_of_every_trigger():
    from grow.triggers.base import REGISTRY, names

    for name in names():
        build({"name": name})  # registers it
        assert set(REGISTRY[name].option_defaults()) == {k for n, k, _, _ in BAD_OPTIONS if n == name}, name


@pytest.mark.parametrize("name", ["fixed", "gap", "gstack", "periodic", "plateau", "tokens_per_param"])
def test_a_triggers_yaml_is_the_one_place_of_its_options_defaults(name):
    """As a strategy's (tests/test_growth.py): the class declares no defaults, it checks them; a trigger built
    from its name alone has its YAML's options, each on a commented line."""
    from grow.config import CONFIG_DIR
    from grow.plugins import yaml_options
    from grow.triggers.base import GROUP, REGISTRY

    path = CONFIG_DIR / GROUP / f"{name}.yaml"
    trigger = build({"name": name})
    assert REGISTRY[name].defaults == {} and trigger.options == yaml_options(GROUP, name)
    for line in path.read_text().splitlines():
        if line and not line.startswith("#"):
            assert line.startswith(f"name: {name}") or "#" in line, line


@pytest.mark.parametrize("args, key", [
    (["schedule/trigger=plateau", "trainer.eval_every=0"], "trainer.eval_every"),
    (["schedule/trigger=periodic", "schedule.trigger.every_tokens=20000"], "schedule.trigger.every_tokens"),
    (["schedule/trigger=tokens_per_param", "schedule.trigger.ratio=0.001"], "schedule.trigger.ratio"),
    (["schedule/trigger=gap", "trainer.eval_every=2", "trainer.log_every=5"], "trainer.log_every"),
])
def test_a_trigger_the_plan_cannot_run_is_refused_before_work(tmp_path, args, key):
    """Two growths in one step, or a trigger without the evaluations it reads: one line, exit 2."""
    out = grow_cli("train", *TINY_RUN, "+schedule=exp", "trainer.max_tokens=40000", *args,
                   f"hydra.run.dir={tmp_path / 'run'}", cwd=tmp_path)
    assert out.returncode == 2, out.stderr[-2000:]
    assert out.stderr.strip().splitlines()[-1].startswith(f"error: {key}=")
    assert not (tmp_path / "run" / "metrics.jsonl").exists()


def test_run_config_checks_the_trigger():
    from hydra import compose, initialize_config_dir

    from grow.config import CONFIG_DIR
    from grow.run import load as load_run

    with initialize_config_dir(str(CONFIG_DIR), version_base="1.3"):
        cfg = compose("train", overrides=["+schedule=exp", "schedule/trigger=plateau", "trainer.eval_every=0"])
    with pytest.raises(ConfigError, match="trainer.eval_every"):
        load_run(cfg)


# ---- a triggered run ----------------------------------------------------------------------------

PLATEAU = [*TINY_RUN, "+schedule=exp", "schedule/trigger=plateau", "trainer.eval_every=3", "trainer.max_tokens=40000",
           "trainer.log_every=1"]


def _losses(run):
    return [(r["train/step"], r["train/loss"]) for r in map(json.loads, (run / "metrics.jsonl").open())
            if "train/loss" in r]


@pytest.fixture(scope="module")
def plateau_run(tmp_path_factory):
    d = tmp_path_factory.mktemp("plateau")
    out = grow_cli("train", *PLATEAU, f"hydra.run.dir={d / 'run'}", cwd=d)
    assert out.returncode == 0, out.stderr[-3000:]
    return d / "run"


def test_a_plateau_run_grows_where_its_trigger_fired_and_counts_what_it_trained(plateau_run):
    s = json.loads((plateau_run / "summary.json").read_text())
    assert s["trigger"].startswith("plateau(") and len(s["growth_events"]) >= 1
    trained = s["stages_trained"]
    assert [t["ended_by"] for t in trained[:-1]] == ["trigger"] * (len(trained) - 1)
    planned = [st["steps"] for st in s["stage_plan"]]
    assert [t["steps"] for t in trained] != planned[: len(trained)]  # not the plan's boundaries
    assert sum(t["tokens"] for t in trained) == s["tokens"] <= 40000
    assert sum(t["flops"] for t in trained) == pytest.approx(s["flops"], rel=1e-12)
    per_token = [st["config"] for st in s["stage_plan"]]
    from grow.model import TransformerConfig

    recount = sum(TransformerConfig.from_dict(per_token[t["stage"] - 1]).flops_per_token() * t["tokens"] for t in trained)
    assert recount == s["train_flops"]  # as trained, not as planned
    for ev, t in zip(s["growth_events"], trained[1:]):
        assert ev["train/step"] == t["start_step"] and ev["train/tokens"] == t["start_tokens"]
    if s["stayed_at_stage"] is not None:
        assert trained[-1]["ended_by"] == "budget"


@pytest.mark.crash
def test_a_killed_plateau_run_resumes_bitwise(tmp_path, plateau_run):
    s = json.loads((plateau_run / "summary.json").read_text())
    kill_at = s["growth_events"][0]["train/step"] - 4  # mid-stage, after its evaluations began
    run = tmp_path / "run"
    out = forked_grow("train", *PLATEAU, "trainer.ckpt_every=5", f"hydra.run.dir={run}", cwd=tmp_path,
                   env={"GROW_KILL_AT": f"step:{kill_at}"})
    assert out.returncode == -9, out.stderr[-2000:]
    out = forked_grow("train", f"resume={run}", cwd=tmp_path)
    assert out.returncode == 0, out.stderr[-3000:]
    assert _losses(run) == _losses(plateau_run)
    again = json.loads((run / "summary.json").read_text())
    assert again["stages_trained"] == s["stages_trained"]


def test_a_trigger_that_never_fires_ends_at_the_budget_and_says_so(tmp_path):
    out = grow_cli("train", *TINY_RUN, "+schedule=exp", "schedule/trigger=gstack", "trainer.max_tokens=20000",
                   f"hydra.run.dir={tmp_path / 'run'}", cwd=tmp_path)
    assert out.returncode == 0, out.stderr[-3000:]
    s = json.loads((tmp_path / "run" / "summary.json").read_text())
    assert s["stayed_at_stage"] == 1 and s["growth_events"] == [] and s["tokens"] <= 20000
    assert s["params"] == s["stage_plan"][0]["params"]
    assert "did not fire in stage 1" in out.stdout and "stays at stage 1's size" in out.stdout
    assert re.search(r"│ stages +│ 1 of 4 +│", out.stdout), out.stdout[-2000:]  # the stages trained, not the plan's 4


def test_compare_with_two_triggers_draws_each_arms_growths_where_they_happened(tmp_path):
    out = grow_cli("compare", "strategy=zero", "schedule/trigger=fixed,plateau", *TINY_RUN, "trainer.eval_every=3",
                   "trainer.max_tokens=20000", f"hydra.sweep.dir={tmp_path / 'sweep'}", cwd=tmp_path, timeout=600)
    assert out.returncode == 0, out.stderr[-3000:]
    sweep = tmp_path / "sweep"
    assert len(list(sweep.glob("baseline*/summary.json"))) == 1  # the trigger does not change the baseline
    report = (sweep / "report.md").read_text()
    fixed = json.loads(next(sweep.glob("zero_*fixed*/summary.json")).read_text())
    plateau = json.loads(next(sweep.glob("zero_*plateau*/summary.json")).read_text())
    at = lambda s: [ev["train/step"] for ev in s["growth_events"]]
    assert at(fixed) != at(plateau) and len(at(fixed)) == 3 and at(plateau)
    for s in (fixed, plateau):
        for i, step in enumerate(at(s), start=1):
            assert f"| {i} → {i + 1} | {step} |" in report
    assert "Check: every run's counted training FLOPs" in report and (sweep / "loss_vs_flops.png").is_file()


def test_grow_schedule_names_the_trigger(tmp_path):
    out = grow_cli("schedule", "+schedule=exp", "schedule/trigger=tokens_per_param", cwd=tmp_path)
    assert out.returncode == 0, out.stderr
    assert "growth trigger tokens_per_param(ratio=20.0)" in out.stdout
    out = grow_cli("schedule", "+schedule=exp", cwd=tmp_path)
    assert "growth trigger" not in out.stdout
