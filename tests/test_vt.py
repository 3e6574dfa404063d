"""The ``vt`` strategy (docs/strategies.md, "vt"): Table 1, Eq. 2-5, Appendix A and C of X. Yuan,
P. Savarese and M. Maire, "Accelerated Training via Incrementally Growing Neural Networks using
Variance Transfer and Learning Rate Adaptation", NeurIPS 2023."""

from __future__ import annotations

import copy
import math

import pytest
import torch
from torch.func import functional_call, jvp

from grow.growth import grow, grow_model, new_entry_mask
from grow.model import Transformer, TransformerConfig
from tests.helpers import BASE, gen, max_delta, tokens, trained_like

# even increments everywhere (vt adds units in pairs)
VT_TARGETS = {
    "h": dict(d_model=24),
    "k": dict(d_qk=8),
    "v": dict(d_v=10),
    "p": dict(d_ff=40),
    "E": dict(n_heads=4),
    "N": dict(n_layers=4),
}
VT_ALL = {k: v for d in VT_TARGETS.values() for k, v in d.items()}
CASES = list(VT_TARGETS) + ["all"]


def vt_target(case: str, cfg: TransformerConfig = BASE) -> TransformerConfig:
    return cfg.replace(**(VT_ALL if case == "all" else VT_TARGETS[case]))


# Table 1 factors, written out independently of grow.growth.vt
def expected_old_scale(key: str, a: TransformerConfig, b: TransformerConfig) -> float:
    if key in ("attn.q.weight", "attn.k.weight", "attn.v.weight", "mlp.fc1.weight"):
        return math.sqrt(a.d_model / b.d_model)  # hidden rule when h grows, input rule (1) otherwise
    if key == "attn.o.weight":
        return (a.n_heads * a.d_v) / (b.n_heads * b.d_v)
    if key == "mlp.fc2.weight":
        return a.d_ff / b.d_ff
    if key == "lm_head.weight":
        return a.d_model / b.d_model
    return 1.0


def key_of(name: str) -> str:
    return name.split(".", 2)[2] if name.startswith("layers.") else name


# ---------------------------------------------------------------------------------------------
# Function preservation, noise, closed form
# ---------------------------------------------------------------------------------------------
@pytest.mark.parametrize("case", CASES)
def test_vt_without_noise_preserves_function(case):
    model, idx = trained_like(), tokens()
    res = grow(model, vt_target(case), "vt", generator=gen(), stage=1, noise_ratio=0.0)
    assert res.model.config == vt_target(case)
    assert max_delta(model, res.model, idx) <= 1e-10


@pytest.mark.parametrize("case", CASES)
def test_vt_constraint_variant_preserves_function(case):
    model, idx = trained_like(), tokens()
    grown = grow_model(model, vt_target(case), "vt", generator=gen(), noise_ratio=0.0, variant="constraint")
    assert max_delta(model, grown, idx) <= 1e-10


def test_vt_compensation_moves_scale_into_multipliers():
    model = trained_like()
    tgt = vt_target("all")
    grown = grow_model(model, tgt, "vt", generator=gen(), noise_ratio=0.0)
    assert grown.layers[0].mlp.fc2.mult == pytest.approx(tgt.d_ff / BASE.d_ff)
    assert grown.layers[1].attn.o.mult == pytest.approx((tgt.n_heads * tgt.d_v) / (BASE.n_heads * BASE.d_v))
    assert grown.lm_head.mult == pytest.approx(tgt.d_model / BASE.d_model)
    assert grown.layers[0].attn.q.mult == pytest.approx(math.sqrt(tgt.d_model / BASE.d_model))
    assert grown.layers[3].mlp.fc2.mult == 1.0  # a new layer has nothing to compensate
    new, pos = grow(model, tgt, "vt", generator=gen(), noise_ratio=0.0).param_map["layers.0.mlp.fc2.weight"]
    stored = dict(grown.named_parameters())[new].view(-1)[pos]
    torch.testing.assert_close(stored, model.layers[0].mlp.fc2.weight.detach() * BASE.d_ff / tgt.d_ff)


@pytest.mark.parametrize("case", CASES)
def test_vt_noise_change_matches_first_order_bound(case):
    """Noise r on the paired entries: Delta logits = r J d + O(r^2) (module docstring). The slope
    J d is computed here by a forward-mode JVP along the noise direction d, independently."""
    model, idx = trained_like(), tokens()
    tgt, r = vt_target(case), 1e-3
    clean = grow_model(model, tgt, "vt", generator=gen(), noise_ratio=0.0)
    noisy = grow_model(model, tgt, "vt", generator=gen(), noise_ratio=r)
    names = [n for n, _ in clean.named_parameters()]
    p0 = {n: p.detach() for n, p in clean.named_parameters()}
    p1 = {n: p.detach() for n, p in noisy.named_parameters()}
    direction = {n: (p1[n] - p0[n]) / r for n in names}
    if case == "h":  # nothing is paired in an h growth (writers stay zero): no noise, no change
        assert all(float(d.abs().max()) == 0 for d in direction.values())
        assert max_delta(model, noisy, idx) <= 1e-10
        return
    assert any(float(d.abs().max()) > 0 for d in direction.values())

    def f(*params):
        return functional_call(clean, dict(zip(names, params)), (idx,))

    with torch.no_grad():
        base, slope = jvp(f, tuple(p0[n] for n in names), tuple(direction[n] for n in names))
        delta = noisy(idx) - base
    first_order = r * slope
    bound = float(first_order.abs().max())
    assert bound > 0
    # the actual change is the first-order figure, up to a second-order remainder
    assert float((delta - first_order).abs().max()) <= 0.05 * bound
    assert float(delta.abs().max()) <= 1.05 * bound
    # and it is small: O(r) relative to the logits
    assert float(delta.abs().max()) <= 50 * r * float(base.abs().max())
    # half the noise, half the change
    half = grow_model(model, tgt, "vt", generator=gen(), noise_ratio=r / 2)
    with torch.no_grad():
        d_half = half(idx) - base
    torch.testing.assert_close(d_half, delta / 2, rtol=0, atol=0.05 * bound)


@pytest.mark.parametrize("case", CASES)
def test_vt_without_compensation_equals_closed_form(case):
    """compensate: false = the old network with every old weight W replaced by c_W W (Table 1),
    new pairs cancelling and new residual coordinates zero (module docstring)."""
    model, idx = trained_like(), tokens()
    tgt = vt_target(case)
    grown = grow_model(model, tgt, "vt", generator=gen(), noise_ratio=0.0, compensate=False)
    assert all(m.mult == 1.0 for m in grown.modules() if hasattr(m, "mult"))
    reference = copy.deepcopy(model)
    changed = False
    with torch.no_grad():
        for name, p in reference.named_parameters():
            c = expected_old_scale(key_of(name), BASE, tgt)
            changed |= c != 1.0
            p.mul_(c)
    assert changed or case in ("k", "N")
    assert max_delta(reference, grown, idx) <= 1e-10
    if case in ("h", "p", "E", "v", "all"):
        assert max_delta(model, grown, idx) > 1e-3  # the literal rescaling does change the function


def test_vt_hidden_growth_closed_form_on_logits():
    """h alone, uncompensated and with the branch inputs left alone: logits x h/h_hat exactly."""
    model, idx = trained_like(), tokens()
    tgt = vt_target("h")
    grown = grow_model(model, tgt, "vt", generator=gen(), noise_ratio=0.0, compensate=False)
    with torch.no_grad():  # undo the sqrt(h/h_hat) of the branch inputs to isolate W^out
        for layer in grown.layers:
            for lin in (layer.attn.q, layer.attn.k, layer.attn.v, layer.mlp.fc1):
                lin.weight.mul_(math.sqrt(tgt.d_model / BASE.d_model))
        torch.testing.assert_close(grown(idx), model(idx) * BASE.d_model / tgt.d_model, rtol=0, atol=1e-10)


# ---------------------------------------------------------------------------------------------
# Table 1 variances
# ---------------------------------------------------------------------------------------------
BIG = TransformerConfig(
    vocab_size=512, seq_len=8, n_layers=1, d_model=64, n_heads=4, d_qk=16, d_v=16, d_ff=128
)


def _new_entries(res, name):
    mask = new_entry_mask(res.param_map, res.model)[name]
    return dict(res.model.named_parameters())[name].detach()[mask]


def _check_var(values: torch.Tensor, target: float, paired: bool):
    n = values.numel() // (2 if paired else 1)  # a pair repeats (or negates) the same draw
    assert n >= 2000
    ratio = float(values.pow(2).mean()) / target
    assert abs(ratio - 1) <= 6 * math.sqrt(2 / n), (ratio, n)


@pytest.mark.parametrize(
    "change, expected",
    [
        (dict(d_ff=256), {"mlp.fc1.weight": 1 / 64, "mlp.fc2.weight": 1 / 256**2}),
        (
            dict(n_heads=8),
            {"attn.q.weight": 1 / 64, "attn.v.weight": 1 / 64, "attn.o.weight": 1 / (8 * 16) ** 2},
        ),
        (dict(d_v=32), {"attn.v.weight": 1 / 64, "attn.o.weight": 1 / (4 * 32) ** 2}),
        (dict(d_qk=32), {"attn.q.weight": 1 / 64, "attn.k.weight": 1 / 64}),
        (
            dict(d_model=128),
            {"attn.q.weight": 1 / 128, "mlp.fc1.weight": 1 / 128, "lm_head.weight": 1 / 128**2},
        ),
    ],
)
def test_vt_new_weights_follow_table1_variance(change, expected):
    model = Transformer(BIG, generator=gen()).double()
    tgt = BIG.replace(**change)
    res = grow(model, tgt, "vt", generator=gen(1))
    for key, var in expected.items():
        name = key if key == "lm_head.weight" else f"layers.0.{key}"
        values = _new_entries(res, name)
        _check_var(values, var, paired="d_model" not in change)  # h readers are not paired


def test_vt_new_layer_follows_table1_variance():
    model = Transformer(BIG, generator=gen()).double()
    res = grow(model, BIG.replace(n_layers=2), "vt", generator=gen(1))
    layer = res.model.layers[1]
    _check_var(layer.attn.q.weight.detach(), 1 / 64, paired=False)
    _check_var(layer.mlp.fc1.weight.detach(), 1 / 64, paired=True)
    _check_var(layer.mlp.fc2.weight.detach(), 1 / 128**2, paired=True)
    _check_var(layer.attn.o.weight.detach(), 1 / 64**2, paired=True)
    assert torch.count_nonzero(layer.mlp.fc2.bias) == 0


def test_vt_pairs_have_the_paper_structure():
    model = trained_like()
    grown = grow_model(model, BASE.replace(d_ff=32), "vt", generator=gen(), noise_ratio=0.0)
    p, half = BASE.d_ff, 4
    w1, w2 = grown.layers[0].mlp.fc1.weight, grown.layers[0].mlp.fc2.weight
    torch.testing.assert_close(w1[p : p + half], w1[p + half :], rtol=0, atol=0)  # (V, V)
    torch.testing.assert_close(w2[:, p : p + half], -w2[:, p + half :], rtol=0, atol=0)  # (Z, -Z)


def test_vt_constraint_rescales_to_unit_feature_variance():
    """Appendix A (Theorem A.1): old weights rescaled to V = 1/C_t (input/hidden); the output
    layer's extension V = 1/C_t^2."""
    model = trained_like()
    tgt = vt_target("all")
    res = grow(model, tgt, "vt", generator=gen(), noise_ratio=0.0, variant="constraint")
    params = dict(res.model.named_parameters())
    targets = {
        "layers.0.attn.q.weight": 1 / BASE.d_model,
        "layers.1.mlp.fc1.weight": 1 / BASE.d_model,
        "layers.0.attn.o.weight": 1 / (BASE.n_heads * BASE.d_v) ** 2,
        "layers.1.mlp.fc2.weight": 1 / BASE.d_ff**2,
        "lm_head.weight": 1 / BASE.d_model**2,
    }
    for old, var in targets.items():
        new, pos = res.param_map[old]
        ms = float(params[new].detach().view(-1)[pos].pow(2).mean())
        assert ms == pytest.approx(var, rel=1e-12)


# ---------------------------------------------------------------------------------------------
# Refusals
# ---------------------------------------------------------------------------------------------
# ---------------------------------------------------------------------------------------------
# An odd number of new units: pairs plus one lone unit (readers from Table 1, writers 0)
# ---------------------------------------------------------------------------------------------
ODD = {  # (source, target) configs: the heads 1 -> 2, 1 -> 3, 2 -> 3, 1 -> 4, and odd p, v, k and new layers
    "E1-2": (BASE.replace(n_heads=1), BASE.replace(n_heads=2)),
    "E1-3": (BASE.replace(n_heads=1), BASE.replace(n_heads=3)),
    "E2-3": (BASE, BASE.replace(n_heads=3)),
    "E1-4": (BASE.replace(n_heads=1), BASE.replace(n_heads=4)),
    "p": (BASE, BASE.replace(d_ff=27)),
    "v": (BASE, BASE.replace(d_v=9)),
    "k": (BASE, BASE.replace(d_qk=7)),
    "N-odd-p-v": (BASE.replace(d_ff=25, d_v=7), BASE.replace(d_ff=25, d_v=7, n_layers=3)),
    "all": (BASE.replace(n_heads=1), BASE.replace(n_heads=2, d_model=24, d_ff=27, d_v=9, d_qk=7, n_layers=3)),
}


@pytest.mark.parametrize("case", ODD)
def test_vt_odd_new_units_preserve_function_float64(case):
    """max |delta logits| <= 1e-10 relative to the largest logit (float64), noise off; the lone
    unit's writers are exactly 0."""
    src, tgt = ODD[case]
    model, idx = trained_like(src), tokens(src)
    res = grow(model, tgt, "vt", generator=gen(), stage=1, noise_ratio=0.0)
    with torch.no_grad():
        scale = float(model(idx).abs().max())
    assert res.model.config == tgt
    assert max_delta(model, res.model, idx) <= 1e-10 * scale


@pytest.mark.parametrize("case", ["E1-2", "E2-3"])
def test_vt_a_single_new_head_keeps_the_function_even_with_noise(case):
    """One new head is the lone unit only: its W^O columns stay exactly 0 under noise, so the
    function is kept at the default noise ratio too, and its Q, K, V are not zero."""
    src, tgt = ODD[case]
    model, idx = trained_like(src), tokens(src)
    res = grow(model, tgt, "vt", generator=gen(), stage=1)  # noise_ratio 0.001
    with torch.no_grad():
        scale = float(model(idx).abs().max())
    assert max_delta(model, res.model, idx) <= 1e-10 * scale
    attn, (k, v) = res.model.layers[0].attn, (tgt.d_qk, tgt.d_v)
    e = tgt.n_heads - 1
    assert torch.count_nonzero(attn.o.weight[:, e * v:(e + 1) * v]) == 0
    for w, size in ((attn.q.weight, k), (attn.k.weight, k), (attn.v.weight, v)):
        assert torch.count_nonzero(w[e * size:(e + 1) * size]) == w[e * size:(e + 1) * size].numel()


def test_vt_lone_head_readers_follow_table1_and_pairs_keep_their_structure():
    """4 -> 9 heads: the pairs (4, 6), (5, 7) and the lone head 8: pairs as in
    Eq. 2-4, the lone head's W^Q, W^K, W^V with Table 1's variance 1/h, its W^O columns 0."""
    model = Transformer(BIG, generator=gen()).double()
    tgt = BIG.replace(n_heads=9)
    res = grow(model, tgt, "vt", generator=gen(1), noise_ratio=0.0)
    attn, k, v = res.model.layers[0].attn, BIG.d_qk, BIG.d_v
    q = attn.q.weight.detach().view(9, k, -1)
    torch.testing.assert_close(q[4:6], q[6:8], rtol=0, atol=0)  # (V, V): pairs (u, u + 2)
    o = attn.o.weight.detach().view(-1, 9, v)
    torch.testing.assert_close(o[:, 4:6], -o[:, 6:8], rtol=0, atol=0)  # (Z, -Z)
    assert torch.count_nonzero(o[:, 8]) == 0
    lone = torch.cat([w.detach().view(9, -1, BIG.d_model)[8].reshape(-1)
                      for w in (attn.q.weight, attn.k.weight, attn.v.weight)])
    _check_var(lone, 1 / BIG.d_model, paired=False)


def test_vt_eq5_for_a_lone_head():
    """Eq. 5 with a lone head: 1 -> 2 heads gives W^O's new entries norm 0 at birth (multiplier 1:
    left out), W^Q's the norm ratio; 1 -> 4 (a pair and the lone head) gives W^O's stage the norm of
    the pair's Z over the old entries'. Both written out independently (`_expected_multipliers`)."""
    for src, tgt in (ODD["E1-2"], ODD["E1-4"]):
        model = trained_like(src)
        res = grow(model, tgt, "vt", generator=gen(), stage=1, noise_ratio=0.0)
        births = _births(res.param_map, res.model, 1)
        zero_born = _zero_at_birth(res.model, births, 1)
        assert (("layers.0.attn.o.weight", 1) in zero_born) == (tgt.n_heads == 2)
        want = _expected_multipliers(res.model, births, zero_born)
        for name in ("layers.0.attn.q.weight", "layers.0.attn.o.weight"):
            assert res.lr_multipliers[name].keys() == want[name].keys()
            for s, m in want[name].items():
                assert res.lr_multipliers[name][s] == pytest.approx(m, rel=1e-12)
        assert 1 in res.lr_multipliers["layers.0.attn.q.weight"]
        assert (1 in res.lr_multipliers["layers.0.attn.o.weight"]) == (tgt.n_heads == 4)


def test_vt_odd_hidden_growth_is_fine():
    model, idx = trained_like(), tokens()
    grown = grow_model(model, BASE.replace(d_model=17), "vt", noise_ratio=0.0)
    assert max_delta(model, grown, idx) <= 1e-10


def test_vt_bad_options():
    with pytest.raises(ValueError, match="variant"):
        grow(trained_like(), vt_target("p"), "vt", variant="nope")
    with pytest.raises(ValueError, match="not an option of strategy vt"):
        grow(trained_like(), vt_target("p"), "vt", noise=0.1)


# ---------------------------------------------------------------------------------------------
# Learning-rate adaptation (Eq. 5)
# ---------------------------------------------------------------------------------------------
def _births(param_map, model, stage, previous=None):
    """Stage of birth of every element, built from the param map alone (independent of vt)."""
    births = {n: torch.full(p.shape, stage, dtype=torch.long) for n, p in model.named_parameters()}
    for old, (new, pos) in param_map.items():
        births[new].view(-1)[pos.reshape(-1)] = 0 if previous is None else previous[old].reshape(-1)
    return births


def _expected_multipliers(model, births, zero_born=frozenset()):
    """Eq. 5 written out: ||W_Dk|| / ||W_Dref|| per 2-D weight and stage present, except the
    (name, stage) pairs in ``zero_born`` (norm 0 at birth: left out, i.e. 1)."""
    out = {}
    for name, p in model.named_parameters():
        if p.dim() != 2:
            continue
        w, b = p.detach().reshape(-1), births[name].reshape(-1)
        stages = sorted(set(b.tolist()))
        ref = float(w[b == stages[0]].norm())
        out[name] = {}
        for k in stages:
            nk = float(w[b == k].norm())
            if (name, k) not in zero_born:
                out[name][k] = nk / ref if ref > 0 and nk > 0 else 1.0
    return out


def _zero_at_birth(model, births, stage):
    return {(name, stage) for name, p in model.named_parameters()
            if p.dim() == 2 and (births[name] == stage).any() and float(p.detach()[births[name] == stage].norm()) == 0}


def test_vt_lr_multipliers_are_norm_ratios_over_two_growths():
    model = trained_like()
    mid = BASE.replace(d_model=20, d_ff=32, n_heads=4)
    r1 = grow(model, mid, "vt", generator=gen(), stage=1)
    b1 = _births(r1.param_map, r1.model, 1)
    zero1 = _zero_at_birth(r1.model, b1, 1)
    assert ("wte.weight", 1) in zero1 and ("wpe.weight", 1) in zero1  # new residual columns of E, P
    exp1 = _expected_multipliers(r1.model, b1, zero1)
    assert set(r1.lr_multipliers) == set(exp1)
    for name, m in exp1.items():
        assert r1.lr_multipliers[name].keys() == m.keys()
        for k in m:
            assert r1.lr_multipliers[name][k] == pytest.approx(m[k], rel=1e-12)
    assert r1.lr_multipliers["layers.0.mlp.fc2.weight"][1] != 1.0
    assert (
        # logged by stage number (from 1): the entries born at index 1 are stage 2's
        r1.metrics["vt/lr_mult/layers.0.mlp.fc2.weight/2"] == r1.lr_multipliers["layers.0.mlp.fc2.weight"][1]
    )
    # training gives the zero-born entries a scale; they keep the multiplier 1 all the same
    with torch.no_grad():
        for name, p in r1.model.named_parameters():
            if (name, 1) in zero1:
                p[b1[name] == 1] = 0.01
    r2 = grow(r1.model, vt_target("all"), "vt", generator=gen(1), stage=2, state=r1.state)
    b2 = _births(r2.param_map, r2.model, 2, previous=b1)
    for name, b in b2.items():
        assert torch.equal(r2.state["birth"][name].long(), b)
    zero2 = {(r1_new, k) for (old, k) in zero1 for r1_new in [r2.param_map[old][0]]}
    zero2 |= _zero_at_birth(r2.model, b2, 2)
    exp2 = _expected_multipliers(r2.model, b2, zero2)
    assert set(exp2["layers.0.mlp.fc2.weight"]) == {0, 1, 2}
    assert set(exp2["layers.3.mlp.fc2.weight"]) == {2}  # an inserted layer is its own reference
    assert 1 not in r2.lr_multipliers["wte.weight"]
    for name, m in exp2.items():
        assert r2.lr_multipliers[name].keys() == m.keys(), name
        for k in m:
            assert r2.lr_multipliers[name][k] == pytest.approx(m[k], rel=1e-12)


def test_vt_sgd_step_moves_each_stage_by_its_own_rate():
    """Eq. 5: W_Dk <- W_Dk - eta_k G_Dk with eta_k = eta_0 * multiplier; a plain SGD step with
    per-element rates built from the stages of birth."""
    model = trained_like()
    res = grow(model, vt_target("all"), "vt", generator=gen(), stage=1)
    grown, lrm, birth = res.model, res.lr_multipliers, res.state["birth"]
    eta0 = 0.1
    idx = tokens(B=4)
    _, loss = grown(idx[:, :-1], idx[:, 1:])
    loss.backward()
    checked = 0
    for name, p in grown.named_parameters():
        if name not in lrm:
            continue
        b = birth[name].long()
        rate = torch.zeros_like(p)
        for k, m in lrm[name].items():
            rate[b == k] = eta0 * m
        before = p.detach().clone()
        with torch.no_grad():
            p.sub_(rate * p.grad)
        for k, m in lrm[name].items():
            sel = b == k
            torch.testing.assert_close(
                (p.detach() - before)[sel], -(eta0 * m) * p.grad[sel], rtol=1e-12, atol=1e-15
            )
            checked += 1
    assert checked > 20


def _train_after_growth(res, opt, steps, strat, seed=20):
    model = res.model
    for step in range(1, steps + 1):
        idx = tokens(B=4, seed=seed + step)
        _, loss = model(idx[:, :-1], idx[:, 1:])
        opt.zero_grad()
        loss.backward()
        opt.step()
        strat.after_step(model, opt, step)


@pytest.mark.parametrize("optim", ["sgd", "adamw"])
def test_vt_refreshes_eq5_on_the_current_weights(optim):
    """Yuan et al.'s Eq. 5 is eta_k = eta_0 ||W_Dk|| / ||W_D0|| on the *current* weights (its Fig. 5:
    the ratio moves). Every lr_refresh_every steps the multipliers the optimizer holds (SGD: the
    trainer's rule) become the ratios of the current weights; zero-born pairs stay out (1)."""
    from grow.growth import get_strategy
    from grow.optim import GrowthAwareAdamW, GrowthAwareSGD

    model = trained_like()
    build = GrowthAwareSGD if optim == "sgd" else GrowthAwareAdamW
    opt = build(model.named_parameters(), lr=0.05 if optim == "sgd" else 1e-2, weight_decay=0.0)
    res = grow(model, vt_target("all"), "vt", generator=gen(), stage=1, lr_refresh_every=5)
    opt.grow(list(res.model.named_parameters()), res.param_map, 1)
    if optim == "sgd":  # the trainer's rule: Eq. 5 with SGD only
        opt.set_lr_multipliers(res.lr_multipliers)
    strat = get_strategy("vt", lr_refresh_every=5)
    at_growth, born = copy.deepcopy(opt.multipliers), copy.deepcopy(res.model)
    _train_after_growth(res, opt, 4, strat)
    assert opt.multipliers == at_growth and strat.step_metrics() == {}  # not yet: every 5 steps
    _train_after_growth(res, opt, 1, strat, seed=40)  # step_in_stage 1 again: no refresh
    assert opt.multipliers == at_growth
    strat.after_step(res.model, opt, 5)
    if optim == "adamw":  # the optimizer holds no Eq. 5 multiplier: nothing to refresh
        assert opt.multipliers == {} and strat.step_metrics() == {}
        return
    births = _births(res.param_map, res.model, 1)
    zero = _zero_at_birth(born, births, 1)  # norm 0 when born, whatever they hold now
    expected = _expected_multipliers(res.model, births, zero)  # on the current (trained) weights
    moved = 0
    for name, per in expected.items():
        assert opt.multipliers[name].keys() == per.keys(), name
        for k, m in per.items():
            assert opt.multipliers[name][k] == pytest.approx(m, rel=1e-10), (name, k)
            # logged by stage number, k + 1 (the optimizer's k is the 0-based stage-of-birth index)
            assert strat.step_metrics()[f"vt/lr_mult/{name}/{k + 1}"] == opt.multipliers[name][k]
            moved += abs(m - at_growth[name][k]) > 1e-6
    assert moved > 10  # the weights moved, and so did the ratios
    assert ("wte.weight", 1) in zero and 1 not in opt.multipliers["wte.weight"]


def _grads(model, idx):
    model.zero_grad()
    _, loss = model(idx[:, :-1], idx[:, 1:])
    loss.backward()
    return {n: p.grad.detach().clone() for n, p in model.named_parameters()}


@pytest.mark.parametrize("case", CASES)
def test_vt_rescaled_is_the_gradient_ratio_of_every_old_entry(case):
    """GrowthResult.rescaled[name] = c: old entries stored x c, read x 1/c. At the growth point
    (noise 0: the same function) the gradient of every old entry is then the old one x 1/c
    exactly, for every parameter (c = 1 where absent): vt's Table 1 factors and the expansions'
    own (W_K x sqrt(k_hat/k), gains x sqrt(h/h_hat))."""
    model, idx = trained_like(), tokens(B=4)
    res = grow(model, vt_target(case), "vt", generator=gen(), stage=1, noise_ratio=0.0)
    if case in ("h", "k", "v", "p", "E", "all"):
        assert res.rescaled
    old, new = _grads(model, idx), _grads(res.model, idx)
    for name, (new_name, pos) in res.param_map.items():
        c = res.rescaled.get(new_name, 1.0)
        torch.testing.assert_close(new[new_name].reshape(-1)[pos.reshape(-1)] * c, old[name].reshape(-1),
                                   rtol=1e-9, atol=1e-15, msg=f"{name} (c={c})")
    if case in ("h", "all"):
        h, H = BASE.d_model, vt_target(case).d_model
        assert res.rescaled["lm_head.weight"] == pytest.approx(h / H)  # Table 1, output layer
        assert res.rescaled["layers.0.attn_norm.weight"] == pytest.approx(math.sqrt(h / H))  # Def. 3.5
    if case == "k":
        assert res.rescaled["layers.1.attn.k.weight"] == pytest.approx(math.sqrt(8 / 4))  # Def. 3.4
    assert not grow(model, vt_target(case), "vt", generator=gen(), noise_ratio=0.0, compensate=False).rescaled.get(
        "lm_head.weight")


@pytest.mark.parametrize("optim", ["adamw", "sgd"])
def test_kept_moments_follow_the_compensated_rescaling(optim):
    """exp_avg / c and exp_avg_sq / c^2 (SGD's momentum / c) on the old entries of a rescaled
    parameter: the moments in the units of the gradients to come (issue #15, item 3)."""
    from grow.optim import GrowthAwareAdamW, GrowthAwareSGD

    model = trained_like()
    opt = (GrowthAwareAdamW if optim == "adamw" else GrowthAwareSGD)(model.named_parameters(), lr=1e-3)
    for step in range(3):
        _grads(model, tokens(B=4, seed=step))
        opt.step()
    before = {n: {b: t.clone() for b, t in st.items()} for n, st in opt.state.items()}
    res = grow(model, vt_target("all"), "vt", generator=gen(), stage=1)
    opt.grow(list(res.model.named_parameters()), res.param_map, 1, rescaled=res.rescaled)
    checked = 0
    for name, (new_name, pos) in res.param_map.items():
        c = res.rescaled.get(new_name, 1.0)
        checked += c != 1.0
        for buf, old in before[name].items():
            power = 2 if buf == "exp_avg_sq" else 1
            got = opt.state[new_name][buf].reshape(-1)[pos.reshape(-1)]
            torch.testing.assert_close(got, old.reshape(-1) / c**power, rtol=1e-14, atol=0, msg=f"{new_name}.{buf}")
    assert checked >= 10


def test_vt_lr_adaptation_off():
    res = grow(trained_like(), vt_target("p"), "vt", lr_adaptation=False)
    assert res.lr_multipliers is None
    assert "birth" in res.state  # the stages are still carried


# ---------------------------------------------------------------------------------------------
# Persistence and training
# ---------------------------------------------------------------------------------------------
def test_vt_grown_model_and_state_save_and_reload(tmp_path):
    model, idx = trained_like(), tokens()
    res = grow(model, vt_target("all"), "vt", generator=gen(), stage=1)
    path = tmp_path / "ckpt.pt"
    torch.save(
        {
            "config": res.model.config.to_dict(),
            "model": res.model.state_dict(),
            "state": res.state,
            "lr": res.lr_multipliers,
        },
        path,
    )
    blob = torch.load(path, weights_only=True)
    again = Transformer(TransformerConfig.from_dict(blob["config"])).double()
    again.load_state_dict(blob["model"])
    assert again.layers[0].mlp.fc2.mult == res.model.layers[0].mlp.fc2.mult != 1.0
    with torch.no_grad():
        assert torch.equal(again(idx), res.model(idx))
    r2 = grow(again, again.config.replace(d_ff=48), "vt", stage=2, state=blob["state"])
    assert set(r2.lr_multipliers["layers.0.mlp.fc2.weight"]) == {0, 1, 2}


def test_vt_new_units_train():
    """Every new row/column of a vt growth gets a gradient within two AdamW steps."""
    from tests.helpers import _new_slices

    res = grow(trained_like(), vt_target("all"), "vt", generator=gen())
    grown = res.model
    masks = new_entry_mask(res.param_map, grown)
    opt = torch.optim.AdamW(grown.parameters(), lr=1e-2, weight_decay=0.0)
    seen = {n: torch.zeros_like(p) for n, p in grown.named_parameters()}
    for step in range(2):
        idx = tokens(B=8, seed=10 + step)
        _, loss = grown(idx[:, :-1], idx[:, 1:])
        opt.zero_grad()
        loss.backward()
        for n, p in grown.named_parameters():
            seen[n] += p.grad.abs()
        opt.step()
    dead = [
        (n, a, i)
        for n, mask in masks.items()
        for a, i in _new_slices(mask)
        if not (n in ("wte.weight", "wpe.weight") and a == 0)
        and float(seen[n].select(a, i).abs().sum()) == 0.0
    ]
    assert not dead, dead[:10]


def test_vt_yaml():
    from grow.growth.base import configs_dir, get_strategy, yaml_options

    assert get_strategy("vt").options == yaml_options("vt")
    text = (configs_dir() / "strategy" / "vt.yaml").read_text()
    assert "p_c = 1.0" in text and "4 stages" in text and "1/8" in text


def _applied_multipliers(model, opt, lr, seed):
    """One SGD step; per element the multiplier it applied, m with delta p = -lr m buf (buf the momentum
    buffer after the step), returned as (delta p, lr buf) for a least-squares fit per stage."""
    before = {n: p.detach().clone() for n, p in model.named_parameters()}
    idx = tokens(B=4, seed=seed)
    opt.zero_grad()
    model(idx[:, :-1], idx[:, 1:])[1].backward()
    opt.step()
    out = {}
    for n, p in model.named_parameters():
        out[n] = (-(p.detach() - before[n]), lr * opt.state[n]["momentum_buffer"])
    return out, before


@pytest.mark.parametrize("on_growth", ["keep", "reset"])
def test_vt_sgd_applies_eq5_by_the_stage_of_birth_under_keep_and_reset(on_growth):
    """Yuan et al.'s SGD setting re-initializes the momentum at each growth (on_growth=reset): the
    rate each element trains at must still be Eq. 5's for its own stage of birth, ||W_Dk|| / ||W_D0||
    on the current weights, at the growth and after a refresh (keep alike)."""
    from grow.growth import get_strategy
    from grow.optim import GrowthAwareSGD

    model, lr = trained_like(), 0.05
    opt = GrowthAwareSGD(model.named_parameters(), lr=lr, momentum=0.9, weight_decay=0.0)
    for s in range(3):  # some momentum before the growth
        idx = tokens(B=4, seed=s)
        opt.zero_grad()
        model(idx[:, :-1], idx[:, 1:])[1].backward()
        opt.step()
    res = grow(model, vt_target("all"), "vt", generator=gen(), stage=1, lr_refresh_every=2)
    opt.grow(list(res.model.named_parameters()), res.param_map, 1, on_growth=on_growth,
             rescaled=res.rescaled)
    strat = get_strategy("vt", lr_refresh_every=2)
    strat.after_growth(opt, res, "sgd")  # the hook the trainer calls after every growth
    assert opt.multipliers and set(opt.multipliers) == set(res.lr_multipliers)
    if on_growth == "reset":
        assert all(torch.count_nonzero(st["momentum_buffer"]) == 0 for st in opt.state.values())
    births = _births(res.param_map, res.model, 1)
    zero = _zero_at_birth(res.model, births, 1)
    checked = 0
    for step in (1, 2, 3):  # step 3 runs on the multipliers refreshed after step 2
        applied, weights = _applied_multipliers(res.model, opt, lr, seed=10 + step)
        current = copy.deepcopy(res.model)
        with torch.no_grad():
            for n, p in current.named_parameters():
                p.copy_(weights[n])
        if step in (1, 3):
            expected = _expected_multipliers(current, births, zero)
            for name, per in expected.items():
                delta, base = applied[name]
                for k, m in per.items():
                    sel = births[name] == k
                    if float(base[sel].norm()) > 0:  # least squares: sum(delta base) / sum(base^2)
                        got = float((delta[sel] * base[sel]).sum() / (base[sel] ** 2).sum())
                        assert got == pytest.approx(m, rel=1e-9), (name, k, step, got, m)
                        checked += 1
        strat.after_step(res.model, opt, step)
    assert checked > 40


@pytest.mark.parametrize("strategy", ["vt", "svd"])
def test_after_growth_sets_eq5_rates_under_sgd_only(strategy):
    """The trainer's one call after a growth: vt (and svd on vt) set Eq. 5's rates for SGD; with
    AdamW nothing (Appendix C's per-stage step counts apply instead)."""
    from grow.growth import get_strategy
    from grow.optim import GrowthAwareAdamW, GrowthAwareSGD

    options = {"base": "vt"} if strategy == "svd" else {}
    model = trained_like()
    res = grow(model, vt_target("all"), "vt", generator=gen(), stage=1)
    assert res.lr_multipliers
    for build, name, held in [(GrowthAwareSGD, "sgd", True), (GrowthAwareAdamW, "adamw", False)]:
        opt = build(model.named_parameters(), lr=0.05, weight_decay=0.0)
        opt.grow(list(res.model.named_parameters()), res.param_map, 1)
        get_strategy(strategy, **options).after_growth(opt, res, name)
        assert bool(getattr(opt, "multipliers", None)) == held, name
