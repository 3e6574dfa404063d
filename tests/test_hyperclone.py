"""``hyperclone``: width growth by cloning (Samragh et al. 2024, arXiv 2409.12903)."""

from __future__ import annotations

import math

import pytest
import torch

from grow.growth import get_strategy, grow
from tests.conftest import TINY_RUN, assert_one_line_error, grow_cli
from tests.helpers import BASE, gen, max_delta, tokens, trained_like

# integer factors for h, p, E (k, v, N through base); "all" grows every dimension at once
TARGETS = {
    "h": dict(d_model=32),
    "h3": dict(d_model=48),
    "p": dict(d_ff=72),
    "E": dict(n_heads=6),
    "k": dict(d_qk=7),
    "v": dict(d_v=9),
    "N": dict(n_layers=4),
    "all": dict(d_model=48, d_ff=48, n_heads=4, d_qk=7, d_v=9, n_layers=3),
    "cloned": dict(d_model=48, d_ff=48, n_heads=4),
}


def clone(model, case: str, noise: float, **options):
    tgt = model.config.replace(**TARGETS[case])
    return grow(model, tgt, "hyperclone", generator=gen(), noise=noise, **options)


@pytest.mark.parametrize("noise", [0.0, 0.05], ids=["noise0", "noise"])
@pytest.mark.parametrize("case", list(TARGETS))
def test_preserves_the_logits_float64(case, noise):
    # a large eps: the 1/sqrt(n) scaling of the residual copies is what keeps RMSNorm exact
    model, idx = trained_like(BASE.replace(norm_eps=0.5)), tokens()
    res = clone(model, case, noise)
    assert max_delta(model, res.model, idx) <= 1e-10


def test_tied_embeddings_preserve_the_logits_through_the_output_multiplier():
    model, idx = trained_like(BASE.replace(tie_embeddings=True)), tokens()
    res = clone(model, "all", 0.05)
    assert res.model.lm_head.weight is res.model.wte.weight
    assert res.model.lm_head.mult == pytest.approx(1 / math.sqrt(3))
    assert max_delta(model, res.model, idx) <= 1e-10


def test_copies_are_tiled_and_scaled():
    """Noise 0: writers [W, W]/sqrt(2), readers [W, W]/2, gains [g, g]; MLP units copied, W2 / 2."""
    model = trained_like()
    g = clone(model, "h", 0.0).model
    h, s2 = BASE.d_model, math.sqrt(2)
    old = dict(model.named_parameters())
    new = dict(g.named_parameters())
    wte = old["wte.weight"]
    torch.testing.assert_close(new["wte.weight"], torch.cat([wte, wte], 1) / s2, rtol=1e-15, atol=0)
    q = old["layers.0.attn.q.weight"]
    torch.testing.assert_close(new["layers.0.attn.q.weight"], torch.cat([q, q], 1) / 2, rtol=1e-15, atol=0)
    fc2 = old["layers.1.mlp.fc2.weight"]
    torch.testing.assert_close(new["layers.1.mlp.fc2.weight"], torch.cat([fc2, fc2], 0) / s2, rtol=1e-15, atol=0)
    gain = old["layers.1.mlp_norm.weight"]
    assert torch.equal(new["layers.1.mlp_norm.weight"], torch.cat([gain, gain]))
    assert new["norm.weight"].shape == (2 * h,)
    gp = clone(model, "p", 0.0).model
    fc1, fc2 = old["layers.0.mlp.fc1.weight"], old["layers.0.mlp.fc2.weight"]
    torch.testing.assert_close(gp.layers[0].mlp.fc1.weight, torch.cat([fc1, fc1, fc1], 0), rtol=0, atol=0)
    torch.testing.assert_close(gp.layers[0].mlp.fc2.weight, torch.cat([fc2, fc2, fc2], 1) / 3, rtol=1e-15, atol=0)


def grads(model, idx) -> dict[str, torch.Tensor]:
    model.zero_grad()
    model(idx[:, :-1], idx[:, 1:])[1].backward()
    return {n: p.grad.clone() for n, p in model.named_parameters()}


@pytest.mark.parametrize("case", ["h", "p", "E", "cloned", "all"])
def test_old_entries_keep_their_adam_moments_in_the_grown_models_units_entry_by_entry(case):
    """SPARKLING's asymmetric reset on the optimizer's state: no parameter restarts whole (``fresh`` empty); every
    old entry keeps its birth stage (not re-warmed) and its moments divided by c (exp_avg / c, exp_avg_sq / c^2,
    c = ``rescaled``, n s per cloned dimension); every new entry starts at zero, born at the growth. c is exact: without
    noise the grown model's gradient at an old entry is the old gradient / c (float64, 1e-9), so the kept moments
    are those of the same gradient history seen through the grown model."""
    from grow.optim import GrowthAwareAdamW

    model = trained_like()
    opt = GrowthAwareAdamW(list(model.named_parameters()), lr=1e-2, weight_decay=0.1, new_warmup_steps=5)
    for seed in range(3):
        grads(model, tokens(BASE, B=4, seed=seed))
        opt.step()
    before = {n: {b: t.clone() for b, t in st.items()} for n, st in opt.state.items()}
    res = clone(model, case, 0.0)
    assert res.fresh == set()
    opt.grow(list(res.model.named_parameters()), res.param_map, stage=1, fresh=res.fresh, rescaled=res.rescaled)
    idx = tokens(BASE, B=4, seed=7)
    g_old, g_new = grads(model, idx), grads(res.model, idx)
    kept = old_total = 0
    for old, (new, pos) in res.param_map.items():
        c, flat = res.rescaled.get(new, 1.0), pos.reshape(-1)
        torch.testing.assert_close(g_new[new].view(-1)[flat], g_old[old].view(-1) / c, rtol=1e-9, atol=1e-12)
        m, v = opt.state[new]["exp_avg"].view(-1), opt.state[new]["exp_avg_sq"].view(-1)
        torch.testing.assert_close(m[flat], before[old]["exp_avg"].view(-1) / c, rtol=1e-15, atol=0)
        torch.testing.assert_close(v[flat], before[old]["exp_avg_sq"].view(-1) / c ** 2, rtol=1e-15, atol=0)
        fresh = torch.ones_like(m, dtype=torch.bool)
        fresh[flat] = False
        assert not m[fresh].any() and not v[fresh].any()
        birth = opt.birth_stage(new).reshape(-1)
        assert not birth[flat].any() and bool((birth[fresh] == 1).all())
        kept += int((v[flat] != 0).sum())
        old_total += int((before[old]["exp_avg_sq"] != 0).sum())
    assert kept == old_total > 0  # every old entry with a moment keeps it (was: 0 of them)
    if case in ("h", "all"):  # writers x 1/sqrt(n): c = sqrt(n); readers / n: c = 1; gains tiled: c = n
        n = TARGETS[case]["d_model"] // BASE.d_model
        assert res.rescaled["wte.weight"] == pytest.approx(math.sqrt(n))
        assert "layers.0.attn.q.weight" not in res.rescaled or case == "all"
        assert res.rescaled["norm.weight"] == pytest.approx(n)


def test_the_mapping_of_a_tied_embedding_and_of_mup_holds_entry_by_entry():
    """Tied embeddings (a writer, read through W_out's multiplier / sqrt(n)) and mup (W_out x m'/m): the gradient
    at every old entry is the old one / c."""
    for cfg in (BASE.replace(tie_embeddings=True), BASE.replace(parametrization="mup", mup_base_width=BASE.d_model)):
        model = trained_like(cfg)
        res = clone(model, "cloned", 0.0)
        idx = tokens(cfg, B=4)
        g_old, g_new = grads(model, idx), grads(res.model, idx)
        for old, (new, pos) in res.param_map.items():
            c = res.rescaled.get(new, 1.0)
            torch.testing.assert_close(g_new[new].view(-1)[pos.reshape(-1)], g_old[old].view(-1) / c, rtol=1e-9,
                                       atol=1e-12)


def test_the_residual_copies_must_be_scaled_for_eps_on_the_sum():
    """The reference code's plain copies [x, x] (writers not scaled, readers / n) change the function
    under this model's RMSNorm (eps on the sum of squares): an eps/n term."""
    model, idx = trained_like(BASE.replace(norm_eps=0.5)), tokens()
    grown = clone(model, "h", 0.0).model
    with torch.no_grad():
        for name, p in grown.named_parameters():
            if name.endswith(("wte.weight", "wpe.weight", "attn.o.weight", "mlp.fc2.weight", "mlp.fc2.bias")):
                p *= math.sqrt(2)
    assert max_delta(model, grown, idx) > 1e-4


def test_noise_cancels_between_pairs_of_copies_and_breaks_the_symmetry():
    model = trained_like()
    quiet, noisy = clone(model, "cloned", 0.0).model, clone(model, "cloned", 0.05).model
    for name in ("layers.0.attn.q.weight", "layers.0.mlp.fc1.weight", "layers.0.mlp.fc2.weight", "layers.0.attn.o.weight"):
        a, b = quiet.get_parameter(name), noisy.get_parameter(name)
        assert not torch.equal(a, b), name
    # W^Q reads the residual copies: columns of copy 0 and copy 1 got +N and -N, the pair sums alike
    h = BASE.d_model
    qa, qb = quiet.layers[0].attn.q.weight, noisy.layers[0].attn.q.weight
    torch.testing.assert_close(qb[:, :h] + qb[:, h:2 * h], qa[:, :h] + qa[:, h:2 * h], rtol=0, atol=1e-15)
    assert torch.equal(qb[:, 2 * h:], qa[:, 2 * h:])  # copy 2 of 3 has no partner: no noise
    # without noise the two copies of a residual channel get the same gradient; with noise not
    idx = tokens(BASE, B=4)

    def copy_grads(model):
        model.zero_grad()
        _, loss = model(idx[:, :-1], idx[:, 1:])
        loss.backward()
        g = model.wte.weight.grad
        return g[:, :h], g[:, h:2 * h]

    a0, a1 = copy_grads(quiet)
    torch.testing.assert_close(a0, a1, rtol=1e-9, atol=1e-15)
    b0, b1 = copy_grads(noisy)
    assert float((b0 - b1).abs().max()) > 1e-6


def test_a_non_integer_factor_is_refused():
    strategy = get_strategy("hyperclone")
    with pytest.raises(ValueError, match="d_model 16 -> 24"):
        strategy.check_transition(BASE, BASE.replace(d_model=24))
    with pytest.raises(ValueError, match="d_ff 24 -> 40"):
        strategy.check_transition(BASE, BASE.replace(d_ff=40))
    with pytest.raises(ValueError, match="n_heads 2 -> 3"):
        strategy.check_transition(BASE, BASE.replace(n_heads=3))
    strategy.check_transition(BASE, BASE.replace(d_model=48, d_qk=5, n_layers=3))  # k, N: base


def test_a_schedule_with_a_non_integer_factor_is_refused_before_training(tmp_path):
    out = grow_cli("train", "+schedule=exp", "strategy=hyperclone", *TINY_RUN, "schedule.width_rate=0.5",
                   f"hydra.run.dir={tmp_path / 'run'}", cwd=tmp_path)
    assert_one_line_error(out, "strategy")
    assert "d_model" in out.stderr and "integer" in out.stderr
    assert not (tmp_path / "run").exists()


def test_options_are_checked():
    with pytest.raises(ValueError, match="noise=-1"):
        get_strategy("hyperclone", noise=-1)
    with pytest.raises(ValueError, match="base='stack'"):
        get_strategy("hyperclone", base="stack")


def test_trains_through_the_exponential_schedule(tmp_path):
    """Tiny model: h, p double at every growth, heads 1 -> 2, k, v, N through zero; each growth exact."""
    from tests.helpers import growths, run_schedule

    _, records, summary = run_schedule(tmp_path, "hyperclone")
    events = growths(records)
    assert len(events) == 3
    for ev in events:
        assert abs(ev["growth/delta"]) < 1e-4, ev
        assert ev["hyperclone/factor_h"] == 2.0
    assert events[0]["hyperclone/factor_E"] == 2.0
    assert summary["final_config"]["d_model"] == 32


def test_every_copy_of_a_unit_or_head_gets_its_own_noise_and_the_logits_hold():
    """h, p and E all x2 (h first): the two copies of an MLP unit (W1 rows j and p + j) and of a
    head (W^Q, W^K, W^V rows of heads e and E + e) read the residual copies through different
    noise (the reference code draws it per block of output rows), and the logits are preserved."""
    cfg = BASE.replace(norm_eps=0.5)
    model, idx = trained_like(cfg), tokens()
    tgt = cfg.replace(d_model=2 * cfg.d_model, d_ff=2 * cfg.d_ff, n_heads=2 * cfg.n_heads)
    res = grow(model, tgt, "hyperclone", generator=gen(), noise=0.05)
    assert max_delta(model, res.model, idx) <= 1e-10
    layer = res.model.layers[0]
    p, rows = cfg.d_ff, cfg.n_heads * cfg.d_qk
    w1 = layer.mlp.fc1.weight
    assert float((w1[:p] - w1[p:]).abs().min()) > 0  # every entry of every unit copy differs
    for name in ("q", "k"):
        w = getattr(layer.attn, name).weight
        assert float((w[:rows] - w[rows:]).abs().min()) > 0, name
    v, vrows = layer.attn.v.weight, cfg.n_heads * cfg.d_v
    assert float((v[:vrows] - v[vrows:]).abs().min()) > 0
    # the pairs of residual-copy columns still sum to 2 W / n_h in every copy: the noise cancels
    quiet = grow(model, tgt, "hyperclone", generator=gen(), noise=0.0).model.layers[0].mlp.fc1.weight
    h = cfg.d_model
    torch.testing.assert_close(w1[:, :h] + w1[:, h:], quiet[:, :h] + quiet[:, h:], rtol=0, atol=1e-14)
