"""`grow train +schedule=exp` end to end: stages, growths, deltas, recovery, final dims
(docs/design.md, "Architecture"; docs/design.md, "Schedules"; docs/design.md, "Metrics, logging and the console")."""


import pytest
import torch

from tests.conftest import TINY_RUN, grow_cli
from tests.helpers import growths, run_schedule

# 20000 tokens: 39 steps of 16 x 32, the exp schedule's 3 growths (run_schedule's 40000 is twice as many)
TOKENS = "trainer.max_tokens=20000"
GROWTH_KEYS = {"growth/stage", "growth/loss_before", "growth/loss_after", "growth/delta", "growth/params_before",
               "growth/params_after", "growth/seconds", "train/tokens", "train/flops"}


def test_zero_strategy_grows_through_every_stage_preserving_the_loss(tmp_path):
    out, records, summary = run_schedule(tmp_path, "zero", TOKENS)
    events = growths(records)
    assert len(events) >= 3 and summary["stages"] == len(events) + 1
    for ev in events:
        assert GROWTH_KEYS <= set(ev)
        assert abs(ev["growth/delta"]) < 1e-4, ev
        assert ev["growth/params_after"] > ev["growth/params_before"]
    # the loss change `recovery_steps` after each growth is measured and logged
    assert {r["growth/stage"] for r in records if "growth/recovery" in r} == {e["growth/stage"] for e in events}
    # the final model has the model config's dims (configs/model/tiny.yaml)
    final = summary["final_config"]
    assert (final["n_layers"], final["d_model"], final["n_heads"], final["d_qk"], final["d_v"], final["d_ff"]) == (
        2, 32, 2, 16, 16, 64)
    # FLOPs: the stage plan's per-stage FLOPs, summed (zero spends nothing on growth passes)
    assert summary["flops"] == pytest.approx(sum(s["flops"] for s in summary["stage_plan"]), rel=1e-12)
    assert "growth into stage 2" in out.stdout


def test_random_strategy_changes_the_loss_at_growth(tmp_path):
    _, records, _ = run_schedule(tmp_path, "random", TOKENS)
    deltas = [abs(e["growth/delta"]) for e in growths(records)]
    assert len(deltas) >= 3 and max(deltas) > 1e-4, deltas


def test_schedule_command_prints_the_plan_and_writes_nothing(tmp_path):
    out = grow_cli("schedule", "+schedule=exp", "model=tiny", "data.vocab_size=512", "trainer.max_tokens=40000",
                   cwd=tmp_path)
    assert out.returncode == 0, out.stderr
    assert "stage plan" in out.stdout and "of training the final model" in out.stdout.replace("\n", " ")
    assert list(tmp_path.iterdir()) == []


def test_schedule_with_an_empty_last_stage_is_refused(tmp_path):
    out = grow_cli("schedule", "+schedule=exp", "model=tiny", "data.vocab_size=512", "trainer.max_tokens=40000",
                   "schedule.first_stage=0.6", cwd=tmp_path)
    assert out.returncode == 2, out.stderr
    assert "schedule" in out.stderr and "Traceback" not in out.stderr


def test_vt_run_preserves_the_loss_and_logs_its_learning_rate_factors(tmp_path):
    # vt pairs new units, so every growing dimension must grow by an even number: heads and
    # layers (1 -> 2 in the tiny schedule) stay at their final size here.
    _, records, summary = run_schedule(tmp_path, "vt", TOKENS, "strategy.noise_ratio=0",
                                       "schedule.grow=[d_model,d_ff,d_qk,d_v]")
    events = growths(records)
    assert len(events) == 3
    for ev in events:
        assert abs(ev["growth/delta"]) < 1e-4, ev
        factors = {k: v for k, v in ev.items() if k.startswith("vt/lr_mult/")}
        # one factor per 2-D weight and per stage present so far, keyed by the stage number as
        # growth/stage (the stage the growth enters, from 1); the first stage is the reference (1)
        stage = ev["growth/stage"]
        assert factors[f"vt/lr_mult/layers.0.mlp.fc1.weight/{stage}"] > 0
        assert factors["vt/lr_mult/layers.0.mlp.fc1.weight/1"] == 1.0
        assert sorted({int(k.rsplit("/", 1)[1]) for k in factors}) == list(range(1, stage + 1))
    assert summary["final_config"]["d_model"] == 32


def test_vt_grows_the_default_schedules_single_new_head_keeping_the_loss(tmp_path):
    """The default schedule grows the heads 1 -> 2: vt's lone new head (writers 0) with its pairs
    elsewhere keeps the loss at every growth without noise (float32 evaluations: 1e-4, as zero's)."""
    _, records, summary = run_schedule(tmp_path, "vt", TOKENS, "strategy.noise_ratio=0")
    events = growths(records)
    assert len(events) == 3 and summary["final_config"]["n_heads"] == 2
    for ev in events:
        assert abs(ev["growth/delta"]) < 1e-4, ev


def test_svd_run_grows_dk_from_the_gradient_and_logs_its_figures(tmp_path):
    _, records, summary = run_schedule(tmp_path, "svd", TOKENS)
    events = growths(records)
    assert len(events) == 3
    for ev in events:
        for key in ("svd/gamma", "svd/pred_decrease", "svd/actual_decrease", "svd/heldout_decrease",
                    "svd/stats_seconds", "svd/stats_flops", "svd/sigma_top/L0"):
            assert key in ev, (key, sorted(ev))
        assert ev["growth/flops"] > 0  # the statistics pass and line search are counted
    # growth passes are part of the run's cost
    assert summary["growth_flops"] == pytest.approx(sum(e["growth/flops"] for e in events))
    assert summary["flops"] == pytest.approx(summary["train_flops"] + summary["growth_flops"])
    assert summary["final_config"]["d_qk"] == 16


def test_init_strategy_trains_the_final_model_in_the_strategys_parameterization(tmp_path):
    """`grow train strategy=vt init=strategy`: no growth, the final model set up by vt's Table 1 (its
    W_out rescaled by the compensating multiplier as vt's initialize does), unlike `init=model`."""
    from grow import train as train_mod
    from grow.model import Transformer
    from grow.run import load as load_run
    from tests.helpers import make_cfg

    base = [*TINY_RUN, "strategy=vt", "trainer.max_tokens=3000"]
    runs = {}
    for init in ("model", "strategy"):
        cfg = load_run(make_cfg(*base, f"init={init}"))
        trainer = train_mod.Trainer(cfg, tmp_path / init)
        runs[init] = ({k: v.clone() for k, v in trainer.model.state_dict().items() if torch.is_tensor(v)},
                      trainer.run())
    (m0, s0), (m1, s1) = runs["model"], runs["strategy"]
    assert s0["init"] == "model" and s1["init"] == "vt" and s0["stages"] == s1["stages"] == 1
    assert s0["strategy"] == s1["strategy"] == "baseline"
    plain = Transformer(cfg.model, generator=torch.Generator().manual_seed(cfg.seed)).state_dict()
    assert all(torch.equal(m0[k], plain[k]) for k in m0)  # init=model: the model's own initializer
    assert any(not torch.equal(m1[k], plain[k]) for k in m1)  # init=strategy: vt's Table 1 instead


def test_recovery_is_measured_within_the_stage_it_follows_and_says_after_how_many_steps(tmp_path):
    """recovery_steps=1000 is longer than every stage: each growth's recovery is measured at the end of
    the stage it entered (min(recovery_steps, the stage's steps)), before the next growth, labelled with
    that step count; and the last step has one val/loss record, not two."""
    _, records, summary = run_schedule(tmp_path, "zero", TOKENS, "trainer.recovery_steps=1000")
    stage_steps = {s["stage"]: s["steps"] for s in summary["stage_plan"]}
    recoveries = [r for r in records if "growth/recovery" in r]
    assert [r["growth/stage"] for r in recoveries] == [2, 3, 4]
    for r in recoveries:
        assert r["growth/recovery_steps"] == stage_steps[r["growth/stage"]]
        growth = next(g for g in growths(records) if g["growth/stage"] == r["growth/stage"])
        assert r["train/step"] == growth["train/step"] + r["growth/recovery_steps"]
    assert all(ev["growth/recovery_steps"] == stage_steps[ev["growth/stage"]] for ev in summary["growth_events"])
    last = max(r["train/step"] for r in records)
    assert len([r for r in records if "val/loss" in r and r["train/step"] == last]) == 1


def test_a_run_builds_its_strategy_once_and_that_object_grows_the_model(tmp_path, monkeypatch):
    """The Trainer's one strategy object is the one `grow` is handed at every growth and the one whose
    training hooks (after_step) run; it is built once per run (before: a new one in every growth)."""
    from hydra import compose, initialize_config_dir

    from grow import growing as growing_mod
    from grow import train as train_mod
    from grow.config import CONFIG_DIR
    from grow.growth.vt import VarianceTransfer
    from grow.run import load as load_run

    built, grown_with, hooked = [], [], set()
    init, after_step, grow_fn = VarianceTransfer.__init__, VarianceTransfer.after_step, growing_mod.grow

    def counting_init(self, **options):
        built.append(self)
        init(self, **options)

    def spying_after_step(self, *args, **kwargs):
        hooked.add(id(self))
        return after_step(self, *args, **kwargs)

    def spying_grow(model, target, strategy="zero", **kwargs):
        grown_with.append(strategy)
        return grow_fn(model, target, strategy, **kwargs)

    monkeypatch.setattr(VarianceTransfer, "__init__", counting_init)
    monkeypatch.setattr(VarianceTransfer, "after_step", spying_after_step)
    monkeypatch.setattr(growing_mod, "grow", spying_grow)  # the name a growth calls (grow.growing)
    with initialize_config_dir(str(CONFIG_DIR), version_base="1.3"):
        cfg = compose("train", overrides=[*TINY_RUN, "+schedule=exp", "strategy=vt", "trainer.max_tokens=20000"])
    train_mod.train(load_run(cfg), tmp_path / "run")  # validated once, as the command's job does
    assert len(grown_with) >= 3
    assert {id(s) for s in grown_with} == hooked == {id(built[-1])}
    assert len(built) == 1, built  # validation, the growths and the hooks: one object
