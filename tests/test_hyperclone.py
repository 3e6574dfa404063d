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


def test_rescaled_parameters_restart_their_optimizer_state():
    model = trained_like()
    res = clone(model, "p", 0.0)
    assert res.fresh == {f"layers.{n}.mlp.{w}" for n in range(2) for w in ("fc1.weight", "fc1.bias", "fc2.weight")}
    res = clone(model, "all", 0.0)  # h touches every parameter; N (base zero) renames nothing at the end
    assert res.fresh == {new for new, _ in res.param_map.values()}


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
