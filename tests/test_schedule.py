"""Schedules against Eq. 6, 7, 8 of X. Yuan, P. Savarese and M. Maire, "Accelerated Training via
Incrementally Growing Neural Networks using Variance Transfer and Learning Rate Adaptation",
NeurIPS 2023 (hand computations written out), and the stage plan (docs/design.md, "Schedules")."""

from __future__ import annotations

from pathlib import Path

import pytest
import yaml

from grow.model import TransformerConfig
from grow.plan import (
    GROWABLE,
    Plan,
    additive_depths,
    batch_sizes,
    build_plan,
    format_plan,
    prop_lengths,
    stage_lengths,
    training_flops,
    widths,
)

CONFIGS = Path(__file__).resolve().parent.parent / "configs" / "schedule"
FINAL = TransformerConfig(vocab_size=512, seq_len=32, n_layers=4, d_model=128, n_heads=4, d_qk=32, d_v=32, d_ff=512)


def exp_schedule(**changes) -> dict:
    s = yaml.safe_load((CONFIGS / "exp.yaml").read_text())
    s.pop("defaults")  # Hydra's defaults list: the trigger group, fixed (ScheduleConfig's default says the same)
    s.update(changes)
    return s


# ---- Eq. 6 ---------------------------------------------------------------------------------------


def test_widths_paper_transformer():
    # Yuan et al. §4: a Transformer grown from d_model 64 to 512 within 4 stages
    assert widths(64, 512, 1.0, 4) == [64, 128, 256, 512]


def test_widths_pc_02_nine_stages_by_hand():
    # p_c = 0.2, C_0 = 64, C_final = 256, N = 9; round2 = nearest even number
    # C1 = 64  + round2(12.8) = 64  + 12 = 76
    # C2 = 76  + round2(15.2) = 76  + 16 = 92
    # C3 = 92  + round2(18.4) = 92  + 18 = 110
    # C4 = 110 + round2(22.0) = 110 + 22 = 132
    # C5 = 132 + round2(26.4) = 132 + 26 = 158
    # C6 = 158 + round2(31.6) = 158 + 32 = 190
    # C7 = 190 + round2(38.0) = 190 + 38 = 228
    # C8 = C_final = 256
    assert widths(64, 256, 0.2, 9) == [64, 76, 92, 110, 132, 158, 190, 228, 256]
    # Yuan et al.'s C_0 = C_final / 4 with a small layer: 16 -> 64
    # 16+round2(3.2)=20, 20+4=24, 24+round2(4.8)=28, 28+round2(5.6)=34, 34+round2(6.8)=40,
    # 40+8=48, 48+round2(9.6)=58, then 64
    assert widths(16, 64, 0.2, 9) == [16, 20, 24, 28, 34, 40, 48, 58, 64]


def test_widths_rounding_ties_clipping_and_counts():
    # tie: 0.5 * 6 = 3 (odd) rounds up to 4; capped at final; last = final
    assert widths(6, 100, 0.5, 3) == [6, 10, 100]
    assert widths(64, 100, 1.0, 4) == [64, 100, 100, 100]  # never above final
    # a rate too small to reach final: forced at the last stage (Eq. 6, C_{N-1} = C_final)
    assert widths(8, 512, 0.1, 3) == [8, 8 + 0, 512]  # round2(0.8) = 0
    # counts (heads, layers): nearest integer, ties up
    assert widths(1, 12, 1.0, 4, even=False) == [1, 2, 4, 12]
    assert widths(3, 12, 0.5, 4, even=False) == [3, 5, 8, 12]  # 3+round(1.5)=5, 5+round(2.5)=8
    assert widths(1, 4, 0.2, 5, even=False) == [1, 1, 1, 1, 4]
    assert widths(16, 64, 1.0, 1) == [64]
    # exact decimal rates: 0.29 * 100 = 29 exactly (binary floats give 28.999...)
    assert widths(100, 1000, 0.58, 3) == [100, 158, 1000]


@pytest.mark.parametrize(
    "args, kwargs, key",
    [
        ((0, 64, 1.0, 4), {}, "start=0"),
        ((65, 64, 1.0, 4), {}, "start=65"),
        ((8, 64, -0.5, 4), {}, "rate=-0.5"),
        ((8, 64, 1.0, 0), {}, "stages=0"),
        ((8.5, 64, 1.0, 4), {}, "start=8.5"),
        ((8, 64, "1", 4), {}, "rate='1'"),
        ((8, 64, float("nan"), 4), {}, "rate=nan"),
        ((True, 64, 1.0, 4), {}, "start=True"),
    ],
)
def test_widths_bad_input(args, kwargs, key):
    with pytest.raises(ValueError) as err:
        widths(*args, **kwargs)
    msg = str(err.value)
    assert msg.startswith(key) and "\n" not in msg


# ---- Eq. 7 ---------------------------------------------------------------------------------------


def test_stage_lengths_floor_by_hand():
    # T_0 = 8, p_t = 0.2, T_total = 160, N = 9, floor:
    # 8 -> 8+floor(1.6)=9 -> 9+floor(1.8)=10 -> 10+2=12 -> 12+floor(2.4)=14 -> 14+floor(2.8)=16
    # -> 16+floor(3.2)=19 -> 19+floor(3.8)=22; last = 160 - (8+9+10+12+14+16+19+22=110) = 50
    assert stage_lengths(8, 0.2, 160, 9) == [8, 9, 10, 12, 14, 16, 19, 22, 50]


def test_stage_lengths_nearest_by_hand():
    # nearest (ties up): 8+round(1.6)=10, 10+2=12, 12+round(2.4)=14, 14+round(2.8)=17,
    # 17+round(3.4)=20, 20+4=24, 24+round(4.8)=29; last = 160 - 134 = 26
    assert stage_lengths(8, 0.2, 160, 9, "nearest") == [8, 10, 12, 14, 17, 20, 24, 29, 26]
    # Yuan et al.'s CIFAR-100 table: T_0 = 10, 200 epochs
    assert stage_lengths(10, 0.2, 200, 9, "nearest") == [10, 12, 14, 17, 20, 24, 29, 35, 39]
    # a tie: 0.5 * 5 = 2.5 -> 3 (floor would give 2)
    assert stage_lengths(5, 0.5, 100, 3, "nearest") == [5, 8, 87]
    assert stage_lengths(5, 0.5, 100, 3, "floor") == [5, 7, 88]


def test_stage_lengths_compound_reproduces_the_seeds_tables():
    # T_t = floor(T_0 * 1.2^t): e.g. CIFAR-10 floor(8*1.2)=9, floor(8*1.44)=11, floor(8*1.728)=13 ...
    assert stage_lengths(8, 0.2, 160, 9, "compound") == [8, 9, 11, 13, 16, 19, 23, 28, 33]
    assert stage_lengths(10, 0.2, 200, 9, "compound") == [10, 12, 14, 17, 20, 24, 29, 35, 39]
    assert stage_lengths(4, 0.2, 90, 9, "compound") == [4, 4, 5, 6, 8, 9, 11, 14, 29]


def test_stage_lengths_linear_and_single():
    assert stage_lengths(25, 0.0, 100, 4) == [25, 25, 25, 25]
    assert stage_lengths(30, 0.0, 100, 4) == [30, 30, 30, 10]
    assert stage_lengths(30, 0.5, 1000, 1) == [1000]
    # exact decimal: floor(0.29 * 100) = 29
    assert stage_lengths(100, 0.29, 1000, 3) == [100, 129, 771]


def test_stage_lengths_refuses_empty_or_negative_last_stage():
    # 10 + 15 + 22 = 47 of 47 leaves 0 for the last stage
    with pytest.raises(ValueError) as err:
        stage_lengths(10, 0.5, 47, 4)
    msg = str(err.value)
    assert msg.startswith("total=47") and "10 + 15 + 22" in msg and "leaving 0" in msg and "\n" not in msg
    with pytest.raises(ValueError, match=r"leaving -3"):
        stage_lengths(10, 0.5, 44, 4)
    assert stage_lengths(10, 0.5, 48, 4) == [10, 15, 22, 1]


@pytest.mark.parametrize(
    "args, key",
    [((0, 0.2, 100, 4), "first=0"), ((10, -1, 100, 4), "rate=-1"), ((10, 0.2, 0, 4), "total=0"),
     ((10, 0.2, 100, 0), "stages=0"), ((10, 0.2, 100, 4, "ceil"), "rounding='ceil'")],
)
def test_stage_lengths_bad_input(args, key):
    with pytest.raises(ValueError) as err:
        stage_lengths(*args)
    assert str(err.value).startswith(key)


# ---- Eq. 8 ---------------------------------------------------------------------------------------


def test_batch_sizes():
    # B_3 = 128, B_2 = 128 + 64 = 192, B_1 = 192 + 96 = 288, B_0 = 288 + 144 = 432
    assert batch_sizes(128, 0.5, 4) == [432, 288, 192, 128]
    assert batch_sizes(32, 0.0, 3) == [32, 32, 32]
    # floor: 10 + floor(3.3) = 13, 13 + floor(4.29) = 17
    assert batch_sizes(10, 0.33, 3) == [17, 13, 10]
    assert batch_sizes(7, 1.0, 1) == [7]
    for bad, key in (((0, 0.5, 4), "base=0"), ((8, -0.1, 4), "rate=-0.1"), ((8, 0.5, 0), "stages=0")):
        with pytest.raises(ValueError) as err:
            batch_sizes(*bad)
        assert str(err.value).startswith(key)


# ---- MIDAS (Saunshi et al., NeurIPS 2024): b layers per stage, PROP-alpha lengths ------------------


def test_additive_depths_add_one_block_per_stage():
    # the paper's 1B model: 24 layers in blocks of b = 4, stage i has 4 i layers
    assert additive_depths(4, 24, 4, 6) == [4, 8, 12, 16, 20, 24]
    assert additive_depths(1, 4, 1, 4) == [1, 2, 3, 4]
    assert additive_depths(2, 8, 3, 3) == [2, 5, 8]  # an explicit start below b
    assert additive_depths(3, 7, 2, 1) == [7]  # one stage: the model
    for args, text in (((1, 4, 1, 3), "schedule.depth_step=1: from 1 layers 3 stages reach 3, not the model's "
                                      "n_layers=4; allowed: schedule.stages=4"),
                       ((2, 7, 2, 3), "schedule.depth_step=2: from 2 layers 3 stages reach 6"),
                       ((1, 4, 0, 4), "schedule.depth_step=0: must be null or an integer >= 1")):
        with pytest.raises(ValueError) as err:
            additive_depths(*args)
        assert str(err.value).startswith(text), str(err.value)


def test_prop_lengths_by_hand():
    # PROP-1, k = 4: 1/10, 2/10, 3/10 of 1000, the last what is left
    assert prop_lengths(1000, 4, 1) == [100, 200, 300, 400]
    # PROP-2, k = 3: weights 1, 4, 9 of 14: floor(1000/14) = 71, floor(4000/14) = 285, 1000 - 356 = 644
    assert prop_lengths(1000, 3, 2) == [71, 285, 644]
    assert prop_lengths(1001, 4, 0) == [250, 250, 250, 251]  # alpha = 0: equal stages
    assert prop_lengths(7, 1, 3) == [7]
    with pytest.raises(ValueError) as err:
        prop_lengths(5, 4, 2)  # weights 1, 4, 9, 16 of 30: floor(5/30) = 0
    assert str(err.value).startswith("schedule.prop_power=2: 4 stages of 5 gives a stage of 0")


def test_a_midas_plan_grows_depth_by_blocks_over_prop_stages():
    deep = FINAL.replace(n_layers=6)
    plan = build_plan(deep, exp_schedule(grow=["n_layers"], stages=3, start={"fraction": 0.125}, depth_step=2,
                                         prop_power=1), max_tokens=600 * 512, batch_size=16)
    assert [s.cfg.n_layers for s in plan] == [2, 4, 6]  # the start defaults to one block, not fraction x 6
    assert all(s.cfg.replace(n_layers=6) == deep for s in plan)
    assert [s.steps for s in plan] == [100, 200, 300]  # PROP-1: 1/6, 2/6, 3/6 of 600 steps of 512 tokens
    plan = build_plan(deep, exp_schedule(grow=["n_layers"], stages=3, start={"n_layers": 4}, depth_step=1,
                                         prop_power=None), max_tokens=1_000_000, batch_size=16)
    assert [s.cfg.n_layers for s in plan] == [4, 5, 6]  # an explicit start; Eq. 7's lengths
    assert [s.steps for s in plan][:2] == [195, 293]
    with pytest.raises(ValueError) as err:  # Eq. 6 would double 1 -> 2 -> 4 -> 6; 1 + 3 x 2 = 7 is refused
        build_plan(deep, exp_schedule(grow=["n_layers"], depth_step=2, start={"n_layers": 1}), max_tokens=10**6,
                   batch_size=16)
    assert str(err.value).startswith("schedule.depth_step=2: from 1 layers 4 stages reach 7")


def test_midas_recipe_lists_what_it_reproduces():
    """configs/experiment/midas.yaml: middle stacking, b layers per stage from one block, PROP-1."""
    recipe = yaml.safe_load((CONFIGS.parent / "experiment" / "midas.yaml").read_text())
    sch = recipe["schedule"]
    assert recipe["strategy"]["order"] == "middle" and sch["grow"] == ["n_layers"]
    assert sch["prop_power"] == 1 and sch["start"]["n_layers"] == sch["depth_step"]
    plan = build_plan(FINAL, sch, max_tokens=1_000_000, batch_size=16)  # FINAL: 4 layers
    assert [s.cfg.n_layers for s in plan] == [1, 2, 3, 4]


# ---- the plan ------------------------------------------------------------------------------------


def test_baseline_plan():
    plan = build_plan(FINAL, None, max_tokens=100_000, batch_size=8)
    assert isinstance(plan, Plan) and len(plan) == 1
    (st,) = plan
    assert st.cfg == FINAL and st.batch_size == 8
    assert st.steps == 100_000 // (8 * 32) == 390
    assert st.tokens == 390 * 8 * 32
    assert st.flops == FINAL.flops_per_token() * st.tokens == training_flops(FINAL, st.tokens)
    assert plan.cost_fraction == 1.0 and plan.baseline_flops == plan.total_flops


def test_exp_plan_stages_flops_and_final_dims():
    plan = build_plan(FINAL, exp_schedule(), max_tokens=1_000_000, batch_size=16)
    assert len(plan) == 4 and [s.index for s in plan] == [0, 1, 2, 3]
    assert plan[-1].cfg == FINAL  # the last stage is exactly the model config
    # fraction 0.125 and width_rate 1: every dimension doubles per stage
    assert [s.cfg.d_model for s in plan] == [16, 32, 64, 128]
    assert [s.cfg.d_ff for s in plan] == [64, 128, 256, 512]
    assert [s.cfg.d_qk for s in plan] == [4, 8, 16, 32]
    assert [s.cfg.n_heads for s in plan] == [1, 2, 4, 4]  # round(0.5) = 1 (ties up), 1 -> 2 -> 4
    assert [s.cfg.n_layers for s in plan] == [1, 2, 4, 4]
    for s in plan:
        assert s.tokens == s.steps * s.batch_size * s.cfg.seq_len
        assert s.flops == s.cfg.flops_per_token() * s.tokens
        assert s.params == s.cfg.num_params()
        assert s.steps >= 1
    # Eq. 7 in tokens: T = 100000, 150000, 225000, rest; steps = round(T / (16*32)) for the first three
    assert [s.steps for s in plan][:3] == [195, 293, 439]  # 195.3, 292.97, 439.45
    used = sum(s.tokens for s in plan[:3])
    assert plan[3].steps == (1_000_000 - used) // 512
    assert 1_000_000 - 512 < plan.total_tokens <= 1_000_000
    assert plan.total_flops == sum(s.flops for s in plan)
    assert plan.baseline_flops == FINAL.flops_per_token() * plan.total_tokens
    assert 0 < plan.cost_fraction < 1
    assert plan.start_step(2) == plan[0].steps + plan[1].steps
    assert plan.start_tokens(3) == used


def test_plan_batch_rate_units_and_explicit_start():
    s = exp_schedule(batch_rate=0.5, start={"fraction": 0.25, "d_model": 16}, grow=["d_model", "n_layers"])
    plan = build_plan(FINAL, s, max_tokens=2_000_000, batch_size=16)
    assert [st.batch_size for st in plan] == [54, 36, 24, 16]
    assert [st.cfg.d_model for st in plan] == [16, 32, 64, 128]
    assert [st.cfg.n_layers for st in plan] == [1, 2, 4, 4]  # every growth grows something: d_model in the last
    # a start of 48 reaches 128 in the third stage, and the fourth would grow nothing: refused, naming the sizes
    with pytest.raises(ValueError, match=r"schedule.stages=4: from the start to the final sizes \(d_model 48 -> 128, "
                                         r"n_layers 1 -> 4\) the schedule reaches the final model at stage 3, so the 1 "
                                         r"stage\(s\) after it would grow nothing: schedule.stages=3"):
        build_plan(FINAL, exp_schedule(start={"fraction": 0.25, "d_model": 48}, grow=["d_model", "n_layers"]),
                   max_tokens=2_000_000, batch_size=16)
    assert all(st.cfg.d_ff == 512 and st.cfg.n_heads == 4 for st in plan)  # not growing
    # a repeat in the middle: at rate 0 every dimension waits for the last stage (16 -> 128, 1 -> 4)
    with pytest.raises(ValueError, match=r"schedule.stages=3: the growth into stage 2 grows nothing \(stage 2 has "
                                         r"stage 1's sizes: d_model \[16, 16, 128\], n_layers \[1, 1, 4\]; start -> "
                                         r"final: d_model 16 -> 128, n_layers 1 -> 4\)"):
        build_plan(FINAL, exp_schedule(stages=3, start={"fraction": 0.25, "d_model": 16, "n_layers": 1},
                                       grow=["d_model", "n_layers"], width_rate=0.0), max_tokens=2_000_000,
                   batch_size=16)
    # unit: steps -- total = floor(1e6 / 512) = 1953 steps; T_0 = floor(0.1 * 1953) = 195
    plan = build_plan(FINAL, exp_schedule(unit="steps"), max_tokens=1_000_000, batch_size=16)
    assert [st.steps for st in plan] == [195, 292, 438, 1953 - 195 - 292 - 438]
    assert all(st.tokens == st.steps * 512 for st in plan)
    # linear.yaml: four equal stages
    lin = yaml.safe_load((CONFIGS / "linear.yaml").read_text())
    lin.pop("defaults")
    plan = build_plan(FINAL, lin, max_tokens=1_024_000, batch_size=16)
    assert [st.steps for st in plan] == [500, 500, 500, 500]
    # one stage: the final model
    plan = build_plan(FINAL, exp_schedule(stages=1), max_tokens=1_024_000, batch_size=16)
    assert len(plan) == 1 and plan[0].cfg == FINAL and plan[0].steps == 2000


def test_plan_accepts_integral_float_budget():
    # trainer.max_tokens=2e7 arrives from Hydra as a float
    a = build_plan(FINAL, exp_schedule(), max_tokens=2e7, batch_size=16)
    b = build_plan(FINAL, exp_schedule(), max_tokens=20_000_000, batch_size=16)
    assert a.stages == b.stages


@pytest.mark.parametrize(
    "changes, start",
    [
        ({"start": {"fraction": 0.25, "d_model": 600}}, "schedule.start.d_model=600: must be <= the model's final d_model=128"),
        ({"start": {"fraction": 0.25, "d_model": 0}}, "schedule.start.d_model=0"),
        ({"start": {"fraction": 0}}, "schedule.start.fraction=0"),
        ({"start": {"fraction": 0.25, "d_ff": 64}, "grow": ["d_model"]}, "schedule.start.d_ff=64"),
        ({"start": {"fraction": 0.25, "width": 64}}, "schedule.start.width"),
        ({"stages": 0}, "schedule.stages=0"),
        ({"stages": 2.5}, "schedule.stages=2.5"),
        ({"grow": ["d_model", "depth"]}, "schedule.grow=['d_model', 'depth']: unknown dimension 'depth'"),
        ({"grow": ["d_model", "d_model"]}, "schedule.grow"),
        ({"width_rate": -1}, "schedule.width_rate=-1"),
        ({"length_rate": "fast"}, "schedule.length_rate='fast'"),
        ({"batch_rate": -0.5}, "schedule.batch_rate=-0.5"),
        ({"first_stage": 0}, "schedule.first_stage=0"),
        ({"first_stage": 1.5}, "schedule.first_stage=1.5"),
        ({"rounding": "ceil"}, "schedule.rounding='ceil'"),
        ({"unit": "epochs"}, "schedule.unit='epochs'"),
        ({"unit": "steps", "batch_rate": 0.5}, "schedule.unit=steps"),
        ({"typo_key": 1}, "schedule.typo_key: unknown key"),
        ({"depth_step": 1.5}, "schedule.depth_step=1.5: must be null or an integer >= 1"),
        ({"depth_step": 1, "grow": ["d_model"]}, "schedule.depth_step=1: n_layers is not in schedule.grow"),
        ({"prop_power": -1}, "schedule.prop_power=-1: must be null or an integer >= 0"),
        # 0.5 + 1.0 of the run: "schedule.length_rate=1.0: ... the first 3 stages take 3500000 tokens ..."
        ({"first_stage": 0.5, "length_rate": 1.0}, "schedule.length_rate=1.0: with schedule.first_stage=0.5"),
    ],
)
def test_bad_schedules_are_refused_with_the_key(changes, start):
    with pytest.raises(ValueError) as err:
        build_plan(FINAL, exp_schedule(**changes), max_tokens=1_000_000, batch_size=16)
    msg = str(err.value)
    assert msg.startswith(start), msg
    assert "\n" not in msg


def test_plan_refuses_stages_without_steps():
    # 1% of 20480 tokens = 204 tokens < half a step of 16 x 32 = 512 tokens
    with pytest.raises(ValueError) as err:
        build_plan(FINAL, exp_schedule(first_stage=0.01), max_tokens=20_480, batch_size=16)
    assert str(err.value).startswith("schedule.first_stage=0.01: stage 1 gets 204 tokens")  # numbered from 1
    with pytest.raises(ValueError) as err:
        build_plan(FINAL, None, max_tokens=100, batch_size=16)
    assert str(err.value).startswith("trainer.max_tokens=100: less than one step")
    with pytest.raises(ValueError) as err:
        build_plan(FINAL, None, max_tokens=10_000, batch_size=0)
    assert str(err.value).startswith("trainer.batch_size=0")
    # Eq. 7 in tokens: 2000, 3000, 4500, 500 -> whole steps of 512: 4, 6, 9 (2048 + 3072 + 4608 = 9728),
    # leaving 10000 - 9728 = 272 tokens for the last stage: not a whole step
    with pytest.raises(ValueError) as err:
        build_plan(FINAL, exp_schedule(first_stage=0.2, length_rate=0.5), max_tokens=10_000, batch_size=16)
    assert str(err.value).startswith("trainer.max_tokens=10000: the last stage gets 272 tokens")


def test_every_dimension_grows_monotonically():
    plan = build_plan(FINAL, exp_schedule(width_rate=0.2, stages=9, start={"fraction": 0.25}, length_rate=0.2,
                                          first_stage=0.05), max_tokens=10_000_000, batch_size=16)
    for dim in GROWABLE:
        values = [getattr(s.cfg, dim) for s in plan]
        assert values == sorted(values) and values[-1] == getattr(FINAL, dim)


def test_format_plan_renders():
    from rich.console import Console

    plan = build_plan(FINAL, exp_schedule(), max_tokens=1_000_000, batch_size=16)
    console = Console(record=True, width=160)
    console.print(format_plan(plan))
    text = console.export_text()
    assert "stage plan: exp" in text and "% of baseline" in text
    assert f"{100 * plan.cost_fraction:.1f}%" in text
    assert text.count("\n") >= 8


def test_the_run_config_holds_a_typed_schedule_that_round_trips():
    """RunConfig.schedule is a ScheduleConfig (every key filled in and checked once); as_dict is the
    normalized node, and the plan built from either is the same."""
    from grow.plan import ScheduleConfig, normalize_schedule
    from tests.conftest import TINY_RUN, run_config

    run = run_config(*TINY_RUN, "+schedule=exp", "schedule.grow=[d_model,d_ff]", "schedule.stages=3")
    sch = run.schedule
    assert isinstance(sch, ScheduleConfig)
    assert sch.stages == 3 and sch.grow == ("d_model", "d_ff") and sch.start["fraction"] > 0
    assert sch.as_dict() == normalize_schedule(sch.as_dict())
    a = build_plan(run.model, sch, max_tokens=run.trainer.max_tokens, batch_size=run.trainer.batch_size)
    b = build_plan(run.model, sch.as_dict(), max_tokens=run.trainer.max_tokens, batch_size=run.trainer.batch_size)
    assert a == b and len(a) == 3
    with pytest.raises(ValueError, match=r"^schedule\.stages=0"):
        ScheduleConfig.from_node({"stages": 0})
    assert run_config(*TINY_RUN).schedule is None


def test_a_schedule_key_is_defaulted_once_and_a_file_holds_what_differs():
    """ScheduleConfig's fields are the one place of each schedule.* default (an empty node is every default);
    linear.yaml and depth.yaml inherit exp.yaml and set only keys whose value differs from it."""
    from grow.plan import ScheduleConfig, normalize_schedule

    assert ScheduleConfig.from_node({}) == ScheduleConfig()
    assert normalize_schedule({})["stages"] == ScheduleConfig().stages == 4
    exp = exp_schedule()
    for name in ("linear", "depth"):
        node = yaml.safe_load((CONFIGS / f"{name}.yaml").read_text())
        assert node.pop("defaults") == ["exp", "_self_"]
        same = [k for k, v in node.items() if k != "name" and exp.get(k) == v]
        assert not same, f"{name}.yaml repeats exp.yaml's {same}"
