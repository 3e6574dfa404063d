"""``svd`` on rotary and grouped-query heads (docs/strategies.md, "svd", "Rotary heads"): a new rotary pair's score
term turns with the relative position, so its first-order problem has the 2h x 2h form M = [[C, S], [-S, C]] of
`rotary_form`; under grouped-query attention a new key coordinate is read by the r query heads of its group, and
the forms of those heads are stacked. Checked against autograd (the form is the gradient of a probe pair added to
the scores), against a brute-force maximization of the linearized problem (the chosen rows reach its optimum),
and end to end (gamma 0 preserves the function; a small gamma descends as predicted)."""

from __future__ import annotations

import math

import pytest
import torch

from grow.growth import grow
from grow.growth.svd import new_pair_freqs, whitening
from grow.growth.svd_stats import gradient_statistics
from grow.model import TransformerConfig
from tests.helpers import F64, logits, make_batches, trained_like

CFG = TransformerConfig(vocab_size=50, seq_len=16, n_layers=2, d_model=12, n_heads=2, d_qk=4, d_v=4, d_ff=24,
                        activation="swiglu", positions="rope", rope_dim=8, rope_theta=100.0, mlp_bias=False)
TARGET = CFG.replace(d_qk=8)


def probe_pair_gradient(model, x, y, freqs):
    """dL/dD of a probe rotary pair per layer, head and frequency: S_mn += cos (x_m^T D11 x_n + x_m^T D22 x_n)
    + sin (x_m^T D12 x_n - x_m^T D21 x_n) at Delta = (m - n) omega (the pair's rotated q.k, written from
    q.k = q^T R(-Delta) k), D = 0, by autograd; the token-mean loss."""
    cfg = model.config
    h, P = cfg.d_model, len(freqs)
    D = torch.zeros(cfg.n_layers, cfg.n_heads, P, 2 * h, 2 * h, dtype=F64, requires_grad=True)
    T = x.shape[1]
    delta = (torch.arange(T)[:, None] - torch.arange(T)[None, :]).to(F64)[None] * freqs[:, None, None]  # (P, T, T)
    cos, sin = delta.cos(), delta.sin()
    xs = {}
    hooks = [layer.attn.register_forward_pre_hook(lambda mod, args, n=n: xs.__setitem__(n, args[0]))
             for n, layer in enumerate(model.layers)]

    def form(X, A):  # x_m^T A x_n per head and pair: (B, E, P, T, T)
        return torch.einsum("bmi,epij,bnj->bepmn", X, A, X)

    def score_hook(n, s):
        X, d = xs[n], D[n]
        a11, a12, a21, a22 = d[..., :h, :h], d[..., :h, h:], d[..., h:, :h], d[..., h:, h:]
        pair = cos * (form(X, a11) + form(X, a22)) + sin * (form(X, a12) - form(X, a21))
        return s + pair.sum(2)

    try:
        _, loss = model(x, y, score_hook=score_hook)
        (grad,) = torch.autograd.grad(loss, D)
    finally:
        for hk in hooks:
            hk.remove()
    return grad


def test_the_rotary_form_is_the_gradient_of_a_probe_pair():
    model = trained_like(CFG)
    model.eval()
    (x, y), = make_batches(1, bsz=2, cfg=CFG)
    freqs = new_pair_freqs(CFG, TARGET)
    assert torch.allclose(freqs, torch.tensor([100.0 ** (-2 * j / 8) for j in (2, 3)], dtype=F64))
    grad = probe_pair_gradient(model, x, y, freqs)
    st = gradient_statistics(model, [(x, y)], rotary_freqs=freqs)
    assert st.t.shape == (2, 2, 2, 24, 24) and grad.abs().max() > 1e-4
    torch.testing.assert_close(st.t, grad, rtol=1e-10, atol=1e-14)


def test_the_rotary_form_runs_where_the_activations_are():
    """The frequencies are made on the CPU; on a GPU the form must move them to the activations' device
    (the first H200 run failed here). The meta device stands in for CUDA: it refuses a CPU operand too."""
    from grow.growth.svd_stats import rotary_form

    freqs = new_pair_freqs(CFG, TARGET)
    x, g = torch.zeros(2, 5, 24, device="meta"), torch.zeros(2, 3, 5, 5, device="meta")
    form = rotary_form(x, g, freqs)
    assert form.device.type == "meta" and form.shape == (3, 2, 48, 48)


def test_the_rotary_statistics_flop_count_is_what_runs():
    from torch.utils.flop_counter import FlopCounterMode

    model = trained_like(CFG)
    with FlopCounterMode(display=False) as counter:
        st = gradient_statistics(model, make_batches(2, bsz=2, cfg=CFG), rotary_freqs=new_pair_freqs(CFG, TARGET))
    assert st.flops == counter.get_total_flops()


GROUPED = CFG.replace(n_heads=4, n_kv_heads=2)  # two query heads per key/value head
CASES = {"rotary": CFG, "rotary-grouped": GROUPED,
         "grouped": GROUPED.replace(positions="learned", rope_dim=None, activation="gelu", mlp_bias=True)}


def grow_k(cfg, model, batches, **options):
    return grow(model, cfg.replace(d_qk=8), "svd", batch=batches, generator=torch.Generator().manual_seed(0),
                heldout=0, damping=0.0, **options)


def new_pair_rows(model, head: int, pair: int, layer: int):
    """The query (or key) rows of new pair ``pair`` of a grown head, [first coordinate | second]."""
    k, m = CFG.d_qk, 8
    rows = head * m + k // 2 + pair, head * m + m // 2 + k // 2 + pair
    q, kk = model.layers[layer].attn.q.weight, model.layers[layer].attn.k.weight
    return lambda w: torch.cat([w[r] for r in rows]).detach().double(), q, kk


@pytest.mark.parametrize("cfg", [CFG, GROUPED], ids=["rotary", "rotary-grouped"])
def test_the_chosen_pairs_reach_the_brute_force_optimum_of_the_linearized_problem(cfg):
    """Per layer, key head g and new pair: the first-order decrease per unit pooled radius of the chosen rows,
    -sum_i a_i^T M_i b / (||Sigma_q^1/2 a|| ||Sigma2^1/2 b||) over the r query heads i of the group (a the
    stacked query rows, Sigma2 = diag(Sigma, Sigma), Sigma_q = diag(Sigma2 r times)), equals the best that a
    brute force finds (alternating exact maximization on the two spheres of the whitened rows, 20 random
    starts); no start does better."""
    model = trained_like(cfg)
    batches = make_batches(4, bsz=2, cfg=cfg)
    grown = grow_k(cfg, model, batches, gamma=0.05).model
    st = gradient_statistics(model, batches, rotary_freqs=new_pair_freqs(cfg, cfg.replace(d_qk=8)))
    r, g = cfg.group_size, torch.Generator().manual_seed(0)
    for n in range(cfg.n_layers):
        s2 = torch.block_diag(st.sigma[n], st.sigma[n])
        inv_sqrt, sqrt = whitening(s2)
        inv_q, sqrt_q = torch.block_diag(*[inv_sqrt] * r), torch.block_diag(*[sqrt] * r)
        for kv in range(cfg.kv_heads):
            for t in range(2):
                heads = range(kv * r, kv * r + r)
                M = torch.cat([st.t[n, e, t] for e in heads])  # (r 2h, 2h)
                a = torch.cat([new_pair_rows(grown, e, t, n)[0](grown.layers[n].attn.q.weight) for e in heads])
                b = new_pair_rows(grown, kv, t, n)[0](grown.layers[n].attn.k.weight)
                rate = float(-(a @ M @ b) / ((sqrt_q @ a).norm() * (sqrt @ b).norm()))
                W = inv_q @ M @ inv_sqrt  # in whitened rows u = Sigma_q^1/2 a, w = Sigma2^1/2 b: -u^T W w
                best = 0.0
                for _ in range(20):
                    w = torch.randn(W.shape[1], generator=g, dtype=F64)
                    for _ in range(300):
                        u = -(W @ w)
                        u = u / u.norm()
                        w = -(W.T @ u)
                        w = w / w.norm()
                    best = max(best, float(-(u @ W @ w)))
                assert rate == pytest.approx(best, rel=1e-8), (n, kv, t, rate, best)
                assert best > 0


@pytest.mark.parametrize("name", list(CASES))
def test_gamma_zero_preserves_and_a_small_gamma_descends_as_predicted(name):
    cfg = CASES[name]
    model = trained_like(cfg)
    batches = make_batches(4, bsz=3, cfg=cfg)
    x = make_batches(1, bsz=3, cfg=cfg, seed=9)[0][0]
    res0 = grow_k(cfg, model, batches, gamma=0.0)
    assert (logits(res0.model, x) - logits(model, x)).abs().max() <= 1e-10
    errors = []
    for t, tol in ((1e-5, 0.02), (2e-6, 0.005)):  # the gap is second order: 5x smaller step, ~5x closer
        m = grow_k(cfg, model, batches, gamma=t).metrics
        pred, actual = m["svd/pred_decrease"], m["svd/actual_decrease"]
        assert pred > 0 and actual > 0, m
        assert abs(actual - pred) <= tol * pred, (t, pred, actual)
        errors.append(abs(actual - pred) / pred)
    assert errors[1] < errors[0] / 2
    assert math.isfinite(m["svd/sigma_sq/L0"]) and m["svd/sigma_sq/L0"] > 0


def test_refactor_and_the_update_of_old_columns_are_refused_on_rotary_or_grouped_heads_in_one_line():
    from grow.growth.base import get_strategy

    for cfg in CASES.values():
        for opts in ({"mode": "refactor"}, {"update_existing": "projected"}):
            with pytest.raises(ValueError, match="adds new columns only") as err:
                get_strategy("svd", **opts).check_transition(cfg, cfg.replace(d_qk=8))
            assert "\n" not in str(err.value)
