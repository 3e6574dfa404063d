"""``stack``: depth growth by copying blocks (G_stack, Du et al., NeurIPS 2024; MIDAS, Saunshi et al., NeurIPS 2024)."""

from __future__ import annotations

import copy
import math

import pytest
import torch

from grow.growth import get_strategy, grow, new_entry_mask
from grow.growth.stack import copy_positions, stack_order
from tests.helpers import BASE, gen, max_delta, target, tokens, trained_like

# (N, N_hat, order) -> the old block each block of the grown model copies
ORDERS = {
    (3, 6, "repeat"): [0, 1, 2, 0, 1, 2],
    (3, 7, "repeat"): [0, 1, 2, 0, 1, 2, 0],
    (2, 5, "repeat"): [0, 1, 0, 1, 0],
    (3, 6, "interleave"): [0, 0, 1, 1, 2, 2],
    (3, 7, "interleave"): [0, 0, 0, 1, 1, 2, 2],
    (4, 6, "middle"): [0, 1, 0, 1, 2, 3],  # b = 2: blocks (0 1)(2 3), block ceil(2/2) = 1 copied
    (4, 5, "middle"): [0, 1, 1, 2, 3],
    (3, 4, "middle"): [0, 1, 1, 2],
    (1, 2, "middle"): [0, 0],
    (1, 4, "middle"): [0, 0, 0, 0],
    (3, 7, "middle"): [0, 1, 2, 2, 0, 1, 2],
}


@pytest.mark.parametrize("key", list(ORDERS), ids=[f"{a}to{b}-{o}" for a, b, o in ORDERS])
def test_order_lists(key):
    n_old, n_new, order = key
    assert stack_order(n_old, n_new, order) == ORDERS[key]


@pytest.mark.parametrize("key", list(ORDERS), ids=[f"{a}to{b}-{o}" for a, b, o in ORDERS])
def test_every_block_of_the_grown_model_is_a_block_of_the_old_one_in_order(key):
    n_old, n_new, order = key
    model = trained_like(BASE.replace(n_layers=n_old), seed=n_old)
    for n, layer in enumerate(model.layers):  # distinct forward multipliers: copied with the block
        layer.attn.q.mult = 1.0 + 0.25 * n
    res = grow(model, model.config.replace(n_layers=n_new), "stack", generator=gen(), order=order)
    assert res.model.config.n_layers == n_new
    for i, layer in enumerate(res.model.layers):
        src = model.layers[ORDERS[key][i]]
        new, old = dict(layer.named_parameters()), dict(src.named_parameters())
        assert new.keys() == old.keys()
        for name in new:
            assert torch.equal(new[name], old[name]), (i, name)
        assert layer.attn.q.mult == src.attn.q.mult
    # embeddings, final norm and W_out unchanged
    for name in ("wte.weight", "wpe.weight", "norm.weight", "lm_head.weight"):
        assert torch.equal(res.model.get_parameter(name), model.get_parameter(name))


def midas_rule(n_layers: int, b: int) -> list[int]:
    """Saunshi et al.'s M for a model f_1 o ... of B = n_layers / b blocks of b layers, numbered from the embeddings:
    block ceil(B / 2) followed by its copy, written out block by block (the rule as the paper states it)."""
    blocks = [list(range(j * b, (j + 1) * b)) for j in range(n_layers // b)]
    mid = math.ceil(len(blocks) / 2)  # 1-based
    return [layer for block in blocks[:mid] + [blocks[mid - 1]] + blocks[mid:] for layer in block]


# b = 4 at 24 layers (the paper's 1B model): 8 -> 12 and 16 -> 20 copy blocks 1 and 2 (layers 0-3, 4-7), where a
# b-layer window centred on the middle layer would copy layers 2-5 and 6-9
MIDAS = {
    (2, 4): [0, 1, 0, 1], (4, 6): [0, 1, 0, 1, 2, 3], (6, 8): [0, 1, 2, 3, 2, 3, 4, 5],
    (4, 8): [0, 1, 2, 3, 0, 1, 2, 3], (8, 12): [0, 1, 2, 3, 0, 1, 2, 3, 4, 5, 6, 7],
    (16, 20): [0, 1, 2, 3, 4, 5, 6, 7, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15],
}


@pytest.mark.parametrize("b", [2, 4])
def test_middle_follows_the_midas_block_rule_for_blocks_of_b_layers(b):
    """Every growth of MIDAS's additive schedule (b -> 2b -> ... -> 6b layers) copies block ceil(B/2) of the B
    blocks of b layers and inserts the copy after it."""
    for n in range(b, 6 * b, b):
        assert stack_order(n, n + b, "middle") == midas_rule(n, b), (n, b)
    for (n, n_new), want in MIDAS.items():
        if n_new - n == b:
            assert stack_order(n, n_new, "middle") == want


@pytest.mark.parametrize("b", [2, 4])
def test_the_midas_recipe_as_its_comment_says_for_b_layers_a_block(b):
    """configs/experiment/midas.yaml with schedule.depth_step=b, schedule.start.n_layers=b, schedule.stages=6 on a
    6b-layer model: b, 2b, ..., 6b layers, and every growth copies the middle block of b (the paper's 1B model: b = 4)."""
    import yaml

    from grow.errors import CONFIG_DIR
    from grow.plan import build_plan

    sch = yaml.safe_load((CONFIG_DIR / "experiment" / "midas.yaml").read_text())["schedule"]
    sch.update(depth_step=b, stages=6, start={"n_layers": b})
    final = BASE.replace(n_layers=6 * b)
    depths = [st.cfg.n_layers for st in build_plan(final, sch, max_tokens=10**6, batch_size=4)]
    assert depths == [b * i for i in range(1, 7)]
    stack = get_strategy("stack", order="middle")
    for n, n_new in zip(depths, depths[1:]):
        stack.check_transition(BASE.replace(n_layers=n), BASE.replace(n_layers=n_new))
        assert stack.sources(n, n_new) == midas_rule(n, b)


def test_middle_refuses_a_growth_that_is_not_whole_blocks():
    """3 -> 5 layers adds a block of 2, and 3 layers are not blocks of 2: refused before training, naming the fix."""
    with pytest.raises(ValueError, match=r"3 layers are not whole blocks of b=2 \(3 -> 5 layers\); grow from "
                                         r"schedule.start.n_layers = b"):
        get_strategy("stack", order="middle").check_transition(BASE.replace(n_layers=3), BASE.replace(n_layers=5))


def test_first_occurrence_is_the_block_itself_and_copies_are_new_for_the_optimizer():
    model = trained_like(BASE.replace(n_layers=3))
    res = grow(model, model.config.replace(n_layers=6), "stack", generator=gen(), order="interleave")
    assert copy_positions(ORDERS[(3, 6, "interleave")]) == [1, 3, 5]
    mapped = {new.split(".")[1] for old, (new, _) in res.param_map.items() if old.startswith("layers.")}
    assert mapped == {"0", "2", "4"}  # the originals keep their names (and optimizer moments)
    new = new_entry_mask(res.param_map, res.model)
    for n in (1, 3, 5):  # every entry of a copy is new: fresh moments, its own step count
        assert all(bool(m.all()) for name, m in new.items() if name.startswith(f"layers.{n}."))


def test_stacking_is_not_function_preserving():
    model = trained_like()
    res = grow(model, model.config.replace(n_layers=4), "stack", generator=gen())
    assert max_delta(model, res.model, tokens()) > 1e-3


@pytest.mark.parametrize("case", ["h", "k", "v", "p", "E"])
def test_other_dimensions_go_through_base_exactly(case):
    model, idx = trained_like(), tokens()
    res = grow(model, target(case), "stack", generator=gen())
    assert max_delta(model, res.model, idx) <= 1e-10


def test_widths_grow_before_the_copies_are_taken():
    """h and N at once: the copies are blocks of the h-grown model (base zero: new writers 0)."""
    model = trained_like()
    tgt = model.config.replace(n_layers=4, d_model=24)
    res = grow(model, tgt, "stack", generator=gen(), order="repeat")
    for i in (2, 3):
        for (name, a), (_, b) in zip(res.model.layers[i].named_parameters(),
                                     res.model.layers[i - 2].named_parameters()):
            assert torch.equal(a, b), name


def test_options_are_checked():
    with pytest.raises(ValueError, match="order='top'"):
        get_strategy("stack", order="top")
    with pytest.raises(ValueError, match="base='msg'"):
        get_strategy("stack", base="msg")


# ---------------------------------------------------------------------------------------------
# In the trainer: the exponential schedule, two ranks
# ---------------------------------------------------------------------------------------------
@pytest.mark.parametrize("order", ["repeat", "middle"])
def test_trains_through_the_exponential_schedule(tmp_path, order):
    """Tiny model: 1 -> 2 layers at the first growth (with h, k, v, p, E through zero), the loss
    change of the copy logged like every growth's."""
    from tests.helpers import growths, run_schedule

    _, records, summary = run_schedule(tmp_path, "stack", f"strategy.order={order}", "trainer.max_tokens=20000")
    events = growths(records)
    assert len(events) == 3
    assert events[0]["stack/copied_layers"] == 1.0 and "growth/delta" in events[0]
    assert all(abs(ev["growth/delta"]) < 1e-4 for ev in events[1:])  # no new layer: zero for the widths
    assert summary["final_config"]["n_layers"] == 2


def test_two_ranks_match_one_process_through_a_stack_growth(tmp_path):
    from tests.conftest import TINY_RUN
    from tests.ranks import RUN, check_growth_run, run_pair

    # 19 steps in 10000 tokens: the exp schedule's 3 growths
    dump = run_pair(tmp_path, [*TINY_RUN, *RUN, "strategy=stack", "trainer.max_tokens=10000"])
    worst = check_growth_run(tmp_path, dump, tol=1e-10)
    print(f"stack: max |param(2 ranks) - param(1 process)| = {worst:.3g}")


# ---------------------------------------------------------------------------------------------
# G_stack's training recipe: the optimizer rebuilt, the learning rate re-warmed after the stacking
# ---------------------------------------------------------------------------------------------
def test_g_stack_recipe_rebuilds_adamw_and_rewarms_the_rate_in_process():
    """prts' pretrain/run_pretrain.py trains the stacked model with a new AdamW whose rate warms up
    linearly (get_lr: learning_rate * it / warmup_iters). With optim.on_growth=reset and
    optim.rewarm_steps=W: after the growth every moment is zero and every step count restarts, and
    the k-th step after it is a fresh torch AdamW's k-th step at the rate x min(1, k / W)."""
    from grow.optim import GrowthAwareAdamW, rewarm_factor

    model = trained_like()
    opt = GrowthAwareAdamW(list(model.named_parameters()), lr=1e-2, weight_decay=0.1)
    idx = tokens(B=4)
    for _ in range(3):
        model.zero_grad()
        model(idx[:, :-1], idx[:, 1:])[1].backward()
        opt.step()
    res = grow(model, BASE.replace(n_layers=4), "stack", generator=gen())
    big = res.model
    opt.grow(list(big.named_parameters()), res.param_map, 1, on_growth="reset", fresh=res.fresh)
    for st in opt.state.values():
        assert all(torch.count_nonzero(t) == 0 for t in st.values())
    ref_model = copy.deepcopy(big)
    ref = torch.optim.AdamW([p for n, p in ref_model.named_parameters() if p.dim() == 2], lr=1e-2, weight_decay=0.1)
    ref.add_param_group({"params": [p for n, p in ref_model.named_parameters() if p.dim() != 2], "weight_decay": 0.0})
    W, peak = 4, 1e-2
    for k in range(1, 4):
        lr = peak * rewarm_factor(k, W)
        assert lr == pytest.approx(peak * k / W)  # linear from 0 as get_lr, k counted from 1 (lr_at's convention)
        for m in (big, ref_model):
            m.zero_grad()
            m(idx[:, :-1], idx[:, 1:])[1].backward()
        for g in ref.param_groups:
            g["lr"] = lr
        opt.step(lr=lr)
        ref.step()
        for (name, p), q in zip(big.named_parameters(), ref_model.parameters()):
            assert torch.allclose(p, q, rtol=0, atol=1e-12), (k, name)
    assert rewarm_factor(W + 3, W) == 1.0 and rewarm_factor(1, 0) == 1.0


def test_g_stack_recipe_in_the_trainer_rewarms_the_logged_rate(tmp_path):
    """The trainer's logged rate after each growth: the run's schedule x min(1, k / W) at the k-th step
    after the growth (the run without re-warmup at the same tokens gives the schedule's value)."""
    from tests.helpers import growths, run_schedule

    W = 6
    runs = {}
    for rewarm in (0, W):
        (tmp_path / str(rewarm)).mkdir()
        _, records, _ = run_schedule(tmp_path / str(rewarm), "stack", "optim.on_growth=reset",
                                     f"optim.rewarm_steps={rewarm}", "trainer.log_every=1")
        lrs = {r["train/step"]: r["train/lr"] for r in records if "train/lr" in r}
        runs[rewarm] = (lrs, [ev["train/step"] for ev in growths(records)])
    (plain, g0), (warm, g1) = runs[0], runs[W]
    assert g0 == g1 and len(g0) == 3
    checked = 0
    for g in g0:
        for k in range(1, W + 3):
            if g + k in plain:
                assert warm[g + k] == pytest.approx(plain[g + k] * min(1.0, k / W), rel=1e-12), (g, k)
                checked += 1
    assert checked >= 3 * W
    assert all(warm[s] == pytest.approx(plain[s], rel=1e-12) for s in plain if s <= g0[0])  # stage 0 untouched
