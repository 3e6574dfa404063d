"""``msg``: Masked Structural Growth (Yao et al., ICLR 2024): exact at mask 0, the ramp, the fold, resume, DDP."""

from __future__ import annotations

import copy

import pytest
import torch

from grow import masks as M
from grow.growth import get_strategy, grow, new_entry_mask
from grow.growth.msg import ramp
from grow.model import Linear, RMSNorm, Transformer
from tests.helpers import BASE, CASES, gen, max_delta, target, tokens, trained_like

R = 4  # ramp steps in the unit tests
# grow's earlier rules (the options that keep them): the mask after the activation, a new layer's
# branches masked, new layers from the initializer; the tests below that scale parameters use them
LEGACY = {"mlp_mask": "post_act", "new_layer": "branches", "new_layer_init": "init"}
# per dimension: the parameters whose new entries the mask multiplies (module docstring's table)
SCALED = {
    "p": ("mlp.fc2.weight",),
    "E": ("attn.q.weight", "attn.k.weight", "attn.v.weight"),
    "k": ("attn.q.weight", "attn.k.weight"),
    "v": ("attn.v.weight",),
    "N": ("attn.o.weight", "mlp.fc2.weight", "mlp.fc2.bias"),
    "h": ("wte.weight", "wpe.weight", "attn.o.weight", "mlp.fc2.weight", "mlp.fc2.bias"),
}


def grown(case: str, model=None, **options):
    model = trained_like() if model is None else model
    return model, grow(model, target(case, model.config), "msg", generator=gen(), ramp_steps=R, **options)


def strip_masks(model: Transformer) -> Transformer:
    """A copy of ``model`` with every mask removed: the plain grown model (every mask at 1)."""
    plain = copy.deepcopy(model)
    for _, module, name, _ in list(M.mask_buffers(plain)):
        M.remove_mask(module, name)
    return plain


def scaled_reference(res, case: str, c: float) -> Transformer:
    """The plain grown model with the masked new entries x c (and, for h, each RMSNorm with MSG's
    mask-weighted statistics, written out independently of `grow.masks`)."""
    ref = strip_masks(res.model)
    new = new_entry_mask(res.param_map, ref)
    with torch.no_grad():
        for name, p in ref.named_parameters():
            if name.endswith(SCALED[case]):
                p[new[name]] *= c
    if case == "h":
        h, H = BASE.d_model, res.model.config.d_model
        m = torch.cat([torch.ones(h), torch.full((H - h,), c)]).double()
        for mod in ref.modules():
            if isinstance(mod, RMSNorm):
                mod.forward = lambda x, g=mod.weight, eps=mod.eps: g * x / torch.sqrt(
                    ((m * x * x).sum(-1, keepdim=True) + eps) / m.sum())
    return ref


# ---------------------------------------------------------------------------------------------
# Mask 0: the function is preserved whatever the new weights
# ---------------------------------------------------------------------------------------------
@pytest.mark.parametrize("case", CASES)
def test_mask_zero_preserves_the_logits_float64(case):
    model, res = grown(case)
    assert M.has_masks(res.model)
    assert max_delta(model, res.model, tokens()) <= 1e-10
    # the new weights are the initializer's, none zero (Gesmundo & Maile's zero-constrained ones included):
    # the masks alone preserve the function
    new = new_entry_mask(res.param_map, res.model)
    params = dict(res.model.named_parameters())
    weights = [n for n in new if params[n].dim() == 2 and new[n].any()]
    assert weights and all(bool((params[n][new[n]] != 0).all()) for n in weights)


@pytest.mark.parametrize("case", CASES)
def test_without_the_masks_the_logits_change(case):
    """The same grown weights with the masks removed compute something else (so the test above
    would fail without the masks)."""
    model, res = grown(case)
    assert max_delta(model, strip_masks(res.model), tokens()) > 1e-4


def test_a_growth_in_the_middle_of_a_ramp_is_exact_and_keeps_the_old_masks():
    model, res = grown("p")
    ramp(res.model, R)  # the p masks at 1/R
    mid = res.model
    res2 = grow(mid, target("all", mid.config), "msg", generator=gen(1), ramp_steps=R)
    assert max_delta(mid, res2.model, tokens()) <= 1e-10
    units = res2.model.layers[0].mlp.fc1.mask_out  # MSG's rule: the units masked before the activation
    p_old, p_mid = BASE.d_ff, mid.config.d_ff
    assert torch.all(units[:p_old] == 1) and torch.all(units[p_old:p_mid] == 1 / R)
    assert torch.all(units[p_mid:] == 0)


# ---------------------------------------------------------------------------------------------
# The ramp: mask k/R = the plain model with the new entries x k/R; after R steps no masks
# ---------------------------------------------------------------------------------------------
@pytest.mark.parametrize("case", list(SCALED))
def test_mask_at_k_over_R_is_the_plain_model_with_new_entries_scaled(case):
    """grow's earlier rules (``LEGACY``): a mask at k/R is the plain model with its new entries x k/R."""
    _, res = grown(case, **LEGACY)
    idx = tokens()
    for k in range(1, R):
        assert ramp(res.model, R) is False
        values = {float(t.min()) for _, _, _, t in M.mask_buffers(res.model)}
        assert values == {k / R}, values
        assert max_delta(res.model, scaled_reference(res, case, k / R), idx) <= 1e-10


@pytest.mark.parametrize("case", CASES)
def test_after_ramp_steps_no_mask_is_left(case):
    _, res = grown(case)
    strategy = get_strategy("msg", ramp_steps=R)
    plain = strip_masks(res.model)
    changed = [strategy.after_step(res.model, None, k + 1) for k in range(R)]
    assert changed[-1] is True and not any(changed[:-1])
    model = res.model
    assert not M.has_masks(model) and not any("mask" in k for k in model.state_dict())
    assert all(type(m) in (Linear, RMSNorm, torch.nn.Embedding) for m in model.modules()
               if isinstance(m, (Linear, RMSNorm, torch.nn.Embedding)))
    assert max_delta(model, plain, tokens()) == 0.0
    assert ramp(model, R) is False  # nothing left to ramp


def test_new_entries_get_no_gradient_at_mask_zero_and_some_after_one_step():
    _, res = grown("all")
    new = new_entry_mask(res.param_map, res.model)
    idx = tokens(res.model.config, B=4)

    def grad_of_new():
        res.model.zero_grad()
        _, loss = res.model(idx[:, :-1], idx[:, 1:])
        loss.backward()
        return sum(float(p.grad[new[n]].abs().sum()) for n, p in res.model.named_parameters())

    assert grad_of_new() == 0.0
    ramp(res.model, R)
    assert grad_of_new() > 0.0


# ---------------------------------------------------------------------------------------------
# Masks in the state dict: a model rebuilt from its config and a state dict has them back
# ---------------------------------------------------------------------------------------------
@pytest.mark.parametrize("gate", ["mask_block", "mask_gate"])
def test_state_dict_rebuilds_the_masks(gate):
    _, res = grown("all", **({} if gate == "mask_block" else LEGACY))
    ramp(res.model, R)
    sd = res.model.state_dict()
    assert any(k.endswith(".mask_stat") for k in sd) and any(k.endswith("." + gate) for k in sd)
    fresh = M.build_model(res.model.config, sd)  # as grow.train.restore does
    assert max_delta(res.model, fresh, tokens()) == 0.0
    assert {k: v for k, v in fresh.state_dict().items() if "mask" in k}.keys() == \
        {k for k in sd if "mask" in k}
    plain = Transformer(res.model.config).double()  # a plain model given its masks loads it (strict)
    M.install_from_state_dict(plain, sd)
    plain.load_state_dict(sd)
    assert max_delta(res.model, plain, tokens()) == 0.0


def test_options_are_checked():
    with pytest.raises(ValueError, match="ramp_steps=0"):
        get_strategy("msg", ramp_steps=0)
    with pytest.raises(ValueError, match="ramp_steps=2.5"):
        get_strategy("msg", ramp_steps=2.5)


# ---------------------------------------------------------------------------------------------
# In the trainer: the exponential schedule, a resume in the middle of a ramp, two ranks
# ---------------------------------------------------------------------------------------------
def checkpoint_masks(meta) -> dict:
    from grow import checkpoint

    return {k: v for k, v in checkpoint.load(meta)["model"].items() if ".mask_" in k}


def test_trains_through_the_exponential_schedule(tmp_path):
    """Tiny model, 4 stages in 20000 tokens; ramp_steps=8 outlasts stage 1 (6 steps): its masks are carried
    through the second growth; the last stage (20 steps) ends with no mask left."""
    from grow import checkpoint
    from tests.helpers import growths, run_schedule

    _, records, summary = run_schedule(tmp_path, "msg", "strategy.ramp_steps=8", "trainer.max_tokens=20000")
    events = growths(records)
    assert len(events) == 3
    for ev in events:
        assert abs(ev["growth/delta"]) < 1e-4, ev
        assert ev["msg/masks"] > 0
    assert summary["final_config"]["d_model"] == 32
    meta = checkpoint.latest(tmp_path / "msg")
    assert meta["stage"] == 3 and checkpoint_masks(meta) == {}


def test_resume_in_the_middle_of_a_ramp_is_bitwise_equal_to_a_run_never_stopped(tmp_path):
    from grow import checkpoint
    from grow import train as train_mod
    from grow.checkpoint import Interrupted
    from grow.metrics import read_metrics
    from tests.conftest import TINY_RUN, run_config
    from tests.helpers import StopAt, comparable, losses, plan_of

    run = [*TINY_RUN, "+schedule=exp", "strategy=msg", "strategy.ramp_steps=8", "model.dropout=0.1",
           "trainer.max_tokens=20000", "trainer.recovery_steps=4", "trainer.eval_every=7", "trainer.ckpt_every=100"]
    ref_summary = train_mod.train(run_config(*run), tmp_path / "ref")
    ref_records = read_metrics(tmp_path / "ref")
    plan = plan_of(*run)
    stop = plan.start_step(1) + 4  # 4 steps into stage 1 (of 6): the masks at 4/8
    run_dir = tmp_path / "run"
    with pytest.raises(Interrupted):
        train_mod.train(run_config(*run), run_dir, stop=StopAt("step", step=stop))
    meta = checkpoint.latest(run_dir)
    assert (meta["stage"], meta["step_in_stage"]) == (1, 4)
    saved = checkpoint_masks(meta)
    assert saved and {float(v.min()) for v in saved.values()} == {4 / 8}
    summary = train_mod.train(run_config(*run, f"resume={run_dir}"), run_dir)
    assert summary["final_val_loss"] == ref_summary["final_val_loss"]  # bitwise
    records = read_metrics(run_dir)
    assert losses(records) == losses(ref_records)
    assert comparable(records) == comparable(ref_records)


def test_two_ranks_match_one_process_through_msg_growths(tmp_path):
    """ramp_steps=4 outlasts stage 1 (3 steps of the 19 in 10000 tokens): masks carried through a growth, under DDP."""
    from tests.conftest import TINY_RUN
    from tests.ranks import RUN, check_growth_run, run_pair

    dump = run_pair(tmp_path, [*TINY_RUN, *RUN, "strategy=msg", "strategy.ramp_steps=4", "trainer.max_tokens=10000"])
    worst = check_growth_run(tmp_path, dump, tol=1e-10)
    print(f"msg: max |param(2 ranks) - param(1 process)| = {worst:.3g}")


# ---------------------------------------------------------------------------------------------
# Mid-ramp: the reference code's rules (cofe-ai/MSG), written out here independently of grow.masks
# ---------------------------------------------------------------------------------------------
def msg_reference(old: Transformer, grown_plain: Transformer, case: str, c: float) -> Transformer:
    """cofe-ai/MSG's rules at mask value ``c``, on a plain `Transformer` with forward hooks:
    - p (``BertIntermediateEx``): act(m * (x W1 + b1)), m = 1 on the old units, c on the new;
    - N (``BertEncoderEx`` and ``stack_block``): new layers appended, copies of the old layers in
      the order [0 .. N-1] x (N_hat // N - 1) + the last N_hat mod N, each output mixed as
      c * layer(x) + (1 - c) * x.
    The new units' weights are the grown model's (any values: MSG draws them, grow too)."""
    ref = copy.deepcopy(grown_plain)
    n, N = old.config.n_layers, ref.config.n_layers
    if case == "N":
        order = list(range(n)) * (N // n - 1) + (list(range(n))[-(N % n):] if N % n else [])
        for i, src in enumerate(order):
            ref.layers[n + i] = copy.deepcopy(ref.layers[src])  # the reference's copy of the old block
        for i in range(n, N):
            ref.layers[i].register_forward_hook(lambda mod, args, out: c * out + (1 - c) * args[0])
    if case == "p":
        p_old = old.config.d_ff
        m = torch.cat([torch.ones(p_old), torch.full((ref.config.d_ff - p_old,), c)]).double()
        for layer in ref.layers:
            layer.mlp.fc1.register_forward_hook(lambda mod, args, out: out * m)
    return ref


@pytest.mark.parametrize("activation", ["gelu", "relu"])
@pytest.mark.parametrize("case", ["p", "N"])
def test_mid_ramp_equals_the_reference_codes_rules_float64(case, activation):
    cfg = BASE.replace(activation=activation)
    model = trained_like(cfg)
    tgt = cfg.replace(d_ff=40) if case == "p" else cfg.replace(n_layers=5)
    res = grow(model, tgt, "msg", generator=gen(), ramp_steps=R)
    plain = strip_masks(res.model)
    for _ in range(R // 2):
        ramp(res.model, R)
    assert {float(t.min()) for _, _, _, t in M.mask_buffers(res.model)} == {0.5}
    ref = msg_reference(model, plain, case, 0.5)
    idx = tokens()
    assert max_delta(res.model, ref, idx) <= 1e-10
    # grow's earlier rules differ mid-ramp (with GELU for p; for N always, the new layers being drawn)
    legacy = grow(model, tgt, "msg", generator=gen(), ramp_steps=R, **LEGACY)
    for _ in range(R // 2):
        ramp(legacy.model, R)
    if case == "N" or activation == "gelu":
        assert max_delta(legacy.model, ref, idx) > 1e-6


def test_new_layers_copy_the_old_ones_in_the_reference_order():
    """2 -> 5 layers at the end: copies of old layers 0, 1, 1 (stack_block's order); elsewhere (start)
    the old layer before, or old layer 0."""
    from grow.growth.msg import copied_layer

    model = trained_like()
    res = grow(model, BASE.replace(n_layers=5), "msg", generator=gen(), ramp_steps=R)
    for new, src in zip((2, 3, 4), (0, 1, 1)):
        for key, p in res.model.layers[new].named_parameters():
            assert torch.equal(p, model.layers[src].get_parameter(key)), (new, key)
    assert [copied_layer(2, [0, 1], i) for i in (0, 1)] == [0, 0]
    assert [copied_layer(4, [1, 3], i) for i in (1, 3)] == [0, 1]
    assert [copied_layer(3, [3, 4, 5, 6, 7], i) for i in range(3, 8)] == [0, 1, 2, 1, 2]


@pytest.mark.parametrize("optim", ["adamw", "sgd"])
def test_an_h_growth_reports_the_gains_unrescaled_and_keeps_their_moments(optim):
    """msg puts the old norm gains back as they were (its masked norm undoes Def. 3.5's sqrt(h/h_hat)), so the
    growth reports no rescaling of them (1), and the optimizer keeps their moments exactly (before: x sqrt(2) and
    x 2 at h 16 -> 32, gain updates 0.91x for ~5-20 steps under AdamW)."""
    from grow.optim import GrowthAwareAdamW, GrowthAwareSGD

    model = trained_like()
    opt = GrowthAwareAdamW(model.named_parameters(), lr=1e-3) if optim == "adamw" else \
        GrowthAwareSGD(model.named_parameters(), lr=1e-3, momentum=0.9)
    for step in range(3):
        model.zero_grad()
        model(tokens(B=4, seed=step), tokens(B=4, seed=step + 7))[1].backward()
        opt.step()
    before = {n: {b: t.clone() for b, t in st.items()} for n, st in opt.state.items()}
    _, res = grown("all", model)
    gains = [n for n in res.param_map if n.endswith("norm.weight")]
    assert len(gains) == 2 * BASE.n_layers + 1 and not any(res.rescaled.get(res.param_map[n][0], 1.0) != 1.0
                                                          for n in gains)
    opt.grow(list(res.model.named_parameters()), res.param_map, 1, rescaled=res.rescaled)
    for name in gains:
        new_name, pos = res.param_map[name]
        assert torch.equal(res.model.get_parameter(new_name).detach().reshape(-1)[pos.reshape(-1)],
                           model.get_parameter(name).detach().reshape(-1))
        for buf, old in before[name].items():
            if old.dim():
                torch.testing.assert_close(opt.state[new_name][buf].reshape(-1)[pos.reshape(-1)], old.reshape(-1),
                                           rtol=0, atol=0, msg=f"{new_name}.{buf}")


def test_msg_masks_a_dense_layer_that_becomes_experts_and_refuses_new_units_inside_them():
    """The masked modules come from the parameter schema of the grown model (its experts' W2 for h's channels);
    new MLP units copied into experts in the same growth would need a mask each: refused in one line."""
    model, x = trained_like(BASE), tokens()
    wide = grow(model, BASE.replace(d_model=24, n_experts=2, top_k=2), "msg", generator=gen(0)).model
    assert max_delta(model, wide, x) <= 1e-10
    assert {f"layers.0.mlp.experts.{j}.fc2" for j in range(2)} <= {m for m, *_ in M.mask_buffers(wide)}
    with pytest.raises(ValueError, match="grow d_ff and n_experts in two growths"):
        grow(model, BASE.replace(d_ff=40, n_experts=2, top_k=2), "msg", generator=gen(0))
