"""The ``svd`` strategy (docs/strategies.md, "svd"): the whitened low-rank fit, the gradient statistics,
the descent direction and its line search, invariances, and composition.

Sources: L. Burgund, "Attention growing networks" (internship report; "Burgund's report"), and
L. Burgund, draft "Brouillon 2" on the first-order study of dS (unpublished; "Burgund's draft")."""

from __future__ import annotations

import math

import pytest
import torch

from grow.growth import Passes, get_strategy, grow, grow_model
from grow.growth.svd import (
    best_low_rank_bilinear,
    literal_low_rank_bilinear,
    low_rank_bilinear_residual,
)
from grow.growth.svd_stats import gradient_statistics
from grow.model import Transformer, TransformerConfig
from tests.helpers import F64, logits, make_batches
from tests.helpers import SVD_CFG as CFG
from tests.helpers import trained_like as growth_trained_like


# ---------------------------------------------------------------------------------------------
# helpers
# ---------------------------------------------------------------------------------------------
def ill_conditioned(s: int, e: int, cond: float, g: torch.Generator, rank: int | None = None) -> torch.Tensor:
    """s x e with singular values log-spaced from 1 to 1/cond (the last e - rank exactly 0)."""
    U, _ = torch.linalg.qr(torch.randn(s, e, generator=g, dtype=F64))
    V, _ = torch.linalg.qr(torch.randn(e, e, generator=g, dtype=F64))
    sv = torch.logspace(0, -math.log10(cond), e, dtype=F64)
    if rank is not None:
        sv[rank:] = 0
    return U @ torch.diag(sv) @ V.T


def optimum(X: torch.Tensor, B: torch.Tensor, r: int) -> float:
    """The brute-force optimum ||B||^2 - sum_{i<=r} sigma_i(U_x^T B U_x)^2 (U_x: X's range)."""
    U, s, _ = torch.linalg.svd(X, full_matrices=False)
    U = U[:, s > 1e-12 * s[0]]
    sig = torch.linalg.svdvals(U.T @ B @ U)
    return float(B.pow(2).sum() - sig[:r].pow(2).sum())


def als_residual(X, B, r, g, iters=400) -> float:
    """An independent brute force: alternating least squares over (A, C) from a random start."""
    e = X.shape[1]
    C = torch.randn(e, r, generator=g, dtype=F64)
    best = float("inf")
    for _ in range(iters):
        # B ~ X A (X C)^T: vec(X A (XC)^T) = ((XC) kron X) vec(A) (column-major vec)
        K = torch.kron(X @ C, X)
        A = torch.linalg.lstsq(K, B.T.reshape(-1, 1)).solution.reshape(r, e).T
        K = torch.kron(X @ A, X)
        C = torch.linalg.lstsq(K, B.reshape(-1, 1)).solution.reshape(r, e).T
        best = min(best, float(low_rank_bilinear_residual(X, B, A, C)))
    return best


def trained_like(cfg: TransformerConfig = CFG, seed: int = 0, scale: float = 1.5) -> Transformer:
    """float64 model with every parameter random and non-zero, attention far from uniform."""
    return growth_trained_like(cfg, F64, seed, scale)


def grow_svd(model, target, data, seed=0, **options):
    return grow(model, target, "svd", batch=data, generator=torch.Generator().manual_seed(seed), **options)


# ---------------------------------------------------------------------------------------------
# 1. best_low_rank_bilinear (Burgund's report's regression, corrected: SVD in the whitened basis)
# ---------------------------------------------------------------------------------------------
@pytest.mark.parametrize("seed", range(5))
def test_best_low_rank_bilinear_reaches_the_optimum_and_beats_the_literal_recipe(seed):
    g = torch.Generator().manual_seed(seed)
    s, e, r = 30, 10, 3
    X = ill_conditioned(s, e, 1e3, g)
    B = torch.randn(s, s, generator=g, dtype=F64)
    A, C = best_low_rank_bilinear(X, B, r)
    assert A.shape == (e, r) and C.shape == (e, r)
    assert torch.linalg.matrix_rank(A @ C.T) <= r
    ours = float(low_rank_bilinear_residual(X, B, A, C))
    ref = optimum(X, B, r)
    assert abs(ours - ref) <= 1e-8 * ref
    # Burgund's report's literal recipe (truncate X+ B X+^T itself) is clearly suboptimal on such X
    lit = float(low_rank_bilinear_residual(X, B, *literal_low_rank_bilinear(X, B, r)))
    assert lit > ref * (1 + 1e-3), (lit, ref)


def test_best_low_rank_bilinear_matches_an_independent_brute_force():
    g = torch.Generator().manual_seed(7)
    X = ill_conditioned(8, 4, 30.0, g)
    B = torch.randn(8, 8, generator=g, dtype=F64)
    ours = float(low_rank_bilinear_residual(X, B, *best_low_rank_bilinear(X, B, 2)))
    als = als_residual(X, B, 2, g)
    assert als >= ours * (1 - 1e-9)  # nothing beats it
    assert als <= ours * (1 + 1e-6)  # and it is reachable


def test_best_low_rank_bilinear_rank_deficient_and_damped():
    g = torch.Generator().manual_seed(3)
    X = ill_conditioned(25, 10, 10.0, g, rank=6)  # 4 exactly-zero singular values
    B = torch.randn(25, 25, generator=g, dtype=F64)
    ref = optimum(X, B, 3)
    A, C = best_low_rank_bilinear(X, B, 3)
    assert torch.isfinite(A).all() and torch.isfinite(C).all()
    assert abs(float(low_rank_bilinear_residual(X, B, A, C)) - ref) <= 1e-8 * ref
    # damping: finite, bounded weights, and the objective degrades smoothly (second order)
    for damping, tol in ((1e-8, 1e-9), (1e-4, 1e-5)):
        A, C = best_low_rank_bilinear(X, B, 3, damping=damping)
        val = float(low_rank_bilinear_residual(X, B, A, C))
        assert ref * (1 - 1e-12) <= val <= ref * (1 + tol)
    # the pooled (batched) path is exact for one sequence, and also safe when X^T X is singular
    A3, C3 = best_low_rank_bilinear(X[None], B[None], 3)
    assert abs(float(low_rank_bilinear_residual(X, B, A3, C3)) - ref) <= 1e-7 * ref
    # rank larger than X's rank: padded with zero columns, still optimal
    A, C = best_low_rank_bilinear(X, B, 9)
    assert A.shape == (10, 9)
    assert abs(float(low_rank_bilinear_residual(X, B, A, C)) - optimum(X, B, 9)) <= 1e-8 * ref


def test_pooled_batch_is_exact_for_one_sequence_and_invariant_to_duplication():
    g = torch.Generator().manual_seed(4)
    X = torch.stack([ill_conditioned(20, 8, 1e2, g) for _ in range(3)])
    B = torch.randn(3, 20, 20, generator=g, dtype=F64)
    A1, C1 = best_low_rank_bilinear(X[:1], B[:1], 2)
    A0, C0 = best_low_rank_bilinear(X[0], B[0], 2)
    torch.testing.assert_close(A1 @ C1.T, A0 @ C0.T, rtol=1e-7, atol=1e-9)
    A, C = best_low_rank_bilinear(X, B, 2)
    Ad, Cd = best_low_rank_bilinear(torch.cat([X, X]), torch.cat([B, B]), 2)
    torch.testing.assert_close(A @ C.T, Ad @ Cd.T, rtol=1e-9, atol=1e-12)


# ---------------------------------------------------------------------------------------------
# 2. The statistics pass
# ---------------------------------------------------------------------------------------------
def probe_gradient(model, x, y):
    """dL/dM of a probe S + X M X^T added to every layer's and head's scores at M = 0 (autograd)."""
    cfg = model.config
    M = torch.zeros(cfg.n_layers, cfg.n_heads, cfg.d_model, cfg.d_model, dtype=F64, requires_grad=True)
    xs = {}
    hooks = [layer.attn.register_forward_pre_hook(lambda mod, args, n=n: xs.__setitem__(n, args[0]))
             for n, layer in enumerate(model.layers)]

    def score_hook(n, s):
        X = xs[n]
        return s + torch.einsum("bti,eij,bsj->bets", X, M[n], X)

    try:
        _, loss = model(x, y, score_hook=score_hook)
        (grad,) = torch.autograd.grad(loss, M)
    finally:
        for h in hooks:
            h.remove()
    X_all = {n: xs[n].detach() for n in xs}
    return grad, X_all, float(loss.detach())


@pytest.mark.parametrize("bsz", [1, 3])
def test_statistics_T_is_the_gradient_of_a_probe_bilinear_form(bsz):
    model = trained_like()
    model.eval()
    (x, y), = make_batches(1, bsz=bsz)
    grad, X, loss = probe_gradient(model, x, y)
    st = gradient_statistics(model, [(x, y)])
    assert grad.abs().max() > 1e-4  # a real signal
    torch.testing.assert_close(st.t, grad, rtol=1e-10, atol=1e-14)
    for n in range(CFG.n_layers):
        torch.testing.assert_close(st.sigma[n], torch.einsum("bti,btj->ij", X[n], X[n]) / bsz, rtol=1e-12, atol=0)
    assert st.loss == pytest.approx(loss, rel=1e-12)
    assert all(p.grad is None for p in model.parameters())  # the pass leaves no parameter gradient
    assert all(p.requires_grad for p in model.parameters())  # and every parameter trainable, as before


def test_statistics_are_sums_chunking_is_exact_and_reduce_is_applied():
    model = trained_like()
    batches = make_batches(2, bsz=4)
    st = gradient_statistics(model, batches)
    st_chunked = gradient_statistics(model, batches, max_chunk_scores=1)  # one sequence per forward
    for a, b in zip(st.tensors(), st_chunked.tensors()):
        torch.testing.assert_close(a, b, rtol=1e-10, atol=1e-14)
    calls = []

    def fake_all_reduce(tensors):  # two identical ranks
        calls.append(len(tensors))
        for t in tensors:
            t.mul_(2)

    st2 = gradient_statistics(model, batches, reduce=fake_all_reduce)
    assert calls == [len(st.tensors())]
    torch.testing.assert_close(st2.sigma_sum, 2 * st.sigma_sum)
    torch.testing.assert_close(st2.sigma, st.sigma)
    torch.testing.assert_close(st2.t, st.t)
    # the whole run's T is the gradient of the token-mean loss over every statistics token
    x = torch.cat([b[0] for b in batches])
    y = torch.cat([b[1] for b in batches])
    grad, _, _ = probe_gradient(model, x, y)
    torch.testing.assert_close(st.t, grad, rtol=1e-10, atol=1e-14)


@pytest.mark.parametrize("cfg, bsz, chunk", [
    (CFG, 3, 2**28),
    (TransformerConfig(vocab_size=97, seq_len=12, n_layers=3, d_model=24, n_heads=3, d_qk=5, d_v=7, d_ff=40), 5, 2),
])
def test_statistics_flop_count_is_what_runs(cfg, bsz, chunk):
    """`stats_flops` against torch's own count of the pass (FlopCounterMode: every mm/bmm/addmm)."""
    from torch.utils.flop_counter import FlopCounterMode

    model = trained_like(cfg)
    batches = make_batches(2, bsz=bsz, cfg=cfg)
    with FlopCounterMode(display=False) as counter:
        st = gradient_statistics(model, batches, max_chunk_scores=chunk * cfg.n_layers * cfg.n_heads * cfg.seq_len**2)
    assert st.flops == counter.get_total_flops()


# ---------------------------------------------------------------------------------------------
# 3. The grown model: function preservation, descent, predicted vs actual
# ---------------------------------------------------------------------------------------------
MODES = [dict(mode="new"), dict(mode="new", update_existing="seed004"), dict(mode="new", update_existing="projected"),
         dict(mode="refactor")]
MODE_IDS = ["new", "new+seed004", "new+projected", "refactor"]


@pytest.mark.parametrize("opts", MODES, ids=MODE_IDS)
def test_gamma_zero_is_function_preserving(opts):
    model = trained_like()
    target = CFG.replace(d_qk=7)
    batches = make_batches(4)
    res = grow_svd(model, target, batches, gamma=0.0, heldout=0, **opts)
    assert res.model.config == target
    x = make_batches(1, bsz=5, seed=9)[0][0]
    assert (logits(res.model, x) - logits(model, x)).abs().max() <= 1e-10
    assert res.metrics["svd/gamma"] == 0.0
    assert res.flops > res.metrics["svd/stats_flops"] > 0
    if opts["mode"] == "new":  # new K columns zero, new Q columns free (trainable), as the base strategy
        k, m = CFG.d_qk, target.d_qk
        for layer in res.model.layers:
            kw = layer.attn.k.weight.view(CFG.n_heads, m, -1)
            assert kw[:, k:].abs().max() == 0
            assert layer.attn.q.weight.view(CFG.n_heads, m, -1)[:, k:].abs().min() > 0


@pytest.mark.parametrize("opts", MODES, ids=MODE_IDS)
def test_small_gamma_descends_as_predicted(opts):
    model = trained_like()
    target = CFG.replace(d_qk=7)
    batches = make_batches(4)
    errors = []
    for t, tol in ((1e-3, 0.1), (2e-4, 0.02)):  # the gap is second order: 5x smaller step, ~5x closer
        m = grow_svd(model, target, batches, gamma=t, heldout=0, **opts).metrics
        pred, actual = m["svd/pred_decrease"], m["svd/actual_decrease"]
        assert m["svd/gamma"] > 0
        assert pred > 0 and actual > 0, m  # a flipped sign makes the loss go up
        assert abs(actual - pred) <= tol * pred, (t, pred, actual)
        errors.append(abs(actual - pred) / pred)
    assert errors[1] < errors[0] / 2
    if opts.get("update_existing"):
        assert m["svd/quad_linear_ratio"] > 0


def test_gamma_auto_picks_the_best_heldout_grid_point():
    model = trained_like()
    target = CFG.replace(d_qk=7)
    batches = make_batches(6)
    res = grow_svd(model, target, batches)  # defaults: 4 statistics + 2 held-out batches, gamma auto
    m = res.metrics
    assert m["svd/heldout_decrease"] >= 0
    heldout = batches[4:]
    strat = get_strategy("svd")
    losses = {}
    for t in strat.grid:
        r = grow_svd(model, target, batches, gamma=t)
        losses[t] = r.metrics["svd/heldout_loss"]
    best_t = min(strat.grid, key=lambda t: (losses[t], t))
    assert m["svd/gamma_rel"] == best_t
    assert m["svd/heldout_loss"] == pytest.approx(losses[best_t], rel=1e-12)
    assert m["svd/heldout_decrease"] == pytest.approx(losses[0.0] - losses[best_t], rel=1e-9, abs=1e-15)
    # held-out loss computed independently
    x = torch.cat([b[0] for b in heldout])
    y = torch.cat([b[1] for b in heldout])
    res.model.eval()
    with torch.no_grad():
        assert float(res.model(x, y)[1]) == pytest.approx(m["svd/heldout_loss"], rel=1e-10)
    for n in range(CFG.n_layers):
        assert m[f"svd/sigma_top/L{n}"] > 0
    assert m["svd/stats_seconds"] >= 0


# ---------------------------------------------------------------------------------------------
# 4. Invariances
# ---------------------------------------------------------------------------------------------
@pytest.mark.parametrize("opts", [dict(mode="new"), dict(mode="refactor")], ids=["new", "refactor"])
def test_invariant_to_qk_rescaling_and_batch_duplication(opts):
    model = trained_like()
    target = CFG.replace(d_qk=7)
    batches = make_batches(6)
    x = make_batches(1, bsz=5, seed=9)[0][0]
    ref = grow_svd(model, target, batches, **opts)
    assert ref.metrics["svd/gamma_rel"] > 0  # the comparison is about a real growth

    scaled = trained_like()
    with torch.no_grad():
        for layer in scaled.layers:
            layer.attn.q.weight.mul_(3.0)
            layer.attn.k.weight.div_(3.0)
    res = grow_svd(scaled, target, batches, **opts)
    torch.testing.assert_close(logits(res.model, x), logits(ref.model, x), rtol=1e-8, atol=1e-9)
    assert res.metrics["svd/gamma_rel"] == ref.metrics["svd/gamma_rel"]
    assert res.metrics["svd/pred_decrease"] == pytest.approx(ref.metrics["svd/pred_decrease"], rel=1e-8)

    doubled = [(torch.cat([a, a]), torch.cat([b, b])) for a, b in batches]
    res = grow_svd(model, target, doubled, **opts)
    torch.testing.assert_close(logits(res.model, x), logits(ref.model, x), rtol=1e-8, atol=1e-9)
    for key in ("svd/gamma", "svd/pred_decrease", "svd/actual_decrease", "svd/heldout_decrease"):
        assert res.metrics[key] == pytest.approx(ref.metrics[key], rel=1e-7, abs=1e-12), key


# ---------------------------------------------------------------------------------------------
# 5. Composition, the interface, errors
# ---------------------------------------------------------------------------------------------
@pytest.mark.parametrize("base", ["zero", "vt"])
def test_composes_with_every_dimension_through_grow_model(base):
    model = trained_like()
    target = CFG.replace(d_model=24, d_qk=6, d_v=6, d_ff=40, n_heads=4, n_layers=3)
    batches = make_batches(6)
    x = make_batches(1, bsz=5, seed=9)[0][0]
    opts = dict(base=base, base_options={"noise_ratio": 0.0} if base == "vt" else {})
    zero = grow_model(model, target, "svd", batch=batches, gamma=0.0, **opts)
    assert zero.config == target
    assert (logits(zero, x) - logits(model, x)).abs().max() <= 1e-10
    res = grow_svd(model, target, batches, gamma=1e-3, **opts)
    assert res.model.config == target
    m = res.metrics
    assert m["svd/actual_decrease"] > 0 and abs(m["svd/actual_decrease"] - m["svd/pred_decrease"]) <= 0.1 * m["svd/pred_decrease"]
    if base == "vt":  # vt's h growth sets forward multipliers on q/k: the new temperature accounts for them
        assert res.model.layers[0].attn.q.mult != 1.0
        assert res.lr_multipliers
    # everything but the k rows is the base strategy's
    ref = grow(model, target, base, generator=torch.Generator().manual_seed(0), **opts["base_options"]).model
    for (name, a), (_, b) in zip(res.model.named_parameters(), ref.named_parameters()):
        if not (name.endswith("attn.q.weight") or name.endswith("attn.k.weight")):
            torch.testing.assert_close(a, b, rtol=0, atol=0, msg=name)


def test_no_key_growth_delegates_to_the_base_without_statistics():
    model = trained_like()
    target = CFG.replace(d_ff=40)
    res = grow(model, target, "svd")  # no batches needed: d_k does not grow
    assert res.flops == 0 and not any(k.startswith("svd/") for k in res.metrics)


def test_too_few_batches_says_how_many_are_needed():
    model = trained_like()
    with pytest.raises(ValueError, match=r"needs 6 batches \(4 for statistics \+ 2 held-out"):
        grow(model, CFG.replace(d_qk=6), "svd", batch=make_batches(3))
    with pytest.raises(ValueError, match="needs 4 batches"):
        grow(model, CFG.replace(d_qk=6), "svd", batch=make_batches(2), gamma=0.1)
    # a single (inputs, targets) pair with enough sequences is split into batches + heldout parts
    x, y = make_batches(1, bsz=6)[0]
    res = grow(model, CFG.replace(d_qk=6), "svd", batch=(x, y))
    assert res.model.config.d_qk == 6


def test_bad_options_are_refused():
    with pytest.raises(ValueError, match="mode"):
        get_strategy("svd", mode="sideways")
    with pytest.raises(ValueError, match="update_existing"):
        get_strategy("svd", mode="refactor", update_existing=True)
    with pytest.raises(ValueError, match=r"strategy.update_existing='steepest': allowed: false, seed004, projected"):
        get_strategy("svd", update_existing="steepest")
    assert get_strategy("svd", update_existing=True).update_existing == "seed004"  # the former boolean
    assert get_strategy("svd", update_existing=False).update_existing is None
    with pytest.raises(ValueError, match="gamma"):
        get_strategy("svd", gamma=-1.0)
    with pytest.raises(ValueError, match="not an option of strategy svd"):
        get_strategy("svd", rank=3)


@pytest.mark.parametrize("mode", ["new", "refactor"])
def test_refactor_marks_query_key_weights_fresh_for_the_optimizer(mode):
    """refactor rewrites the old W_Q/W_K rows in a new basis: their optimizer moments must restart."""
    model = trained_like()
    res = grow_svd(model, CFG.replace(d_qk=CFG.d_qk + 2), make_batches(6), mode=mode, gamma=0.05)
    qk = {n for n, _ in res.model.named_parameters() if n.endswith(("attn.q.weight", "attn.k.weight"))}
    assert res.fresh == (qk if mode == "refactor" else set())


# ---------------------------------------------------------------------------------------------
# 6. What is logged is what is returned (issue #15, item 1)
# ---------------------------------------------------------------------------------------------
def mean_loss(model, batches) -> float:
    x = torch.cat([b[0] for b in batches])
    y = torch.cat([b[1] for b in batches])
    model.eval()
    with torch.no_grad():
        return float(model(x, y)[1])


LOGGED_MODES = [dict(mode="new"), dict(mode="new", update_existing="seed004"),
                dict(mode="new", update_existing="projected"), dict(mode="refactor")]
LOGGED_IDS = ["new", "new+seed004", "new+projected", "refactor"]


@pytest.mark.parametrize("opts", LOGGED_MODES, ids=LOGGED_IDS)
@pytest.mark.parametrize("base", ["zero", "vt"])
def test_logged_losses_are_those_of_the_returned_model_when_h_grows_too(base, opts):
    """h 16 -> 32 and d_k 4 -> 6 in one growth: vt rescales the old W_Q, W_K by sqrt(h/h_hat) with
    compensating forward multipliers after the expansions; the rows svd writes must end up with the
    change svd chose (and logged), not that change times h_hat/h."""
    model = trained_like()
    target = CFG.replace(d_model=32, d_qk=6)
    batches = make_batches(6)
    stats, held = batches[:4], batches[4:]
    base_opts = dict(base=base, base_options={"noise_ratio": 0.0} if base == "vt" else {})
    res = grow_svd(model, target, batches, gamma=0.05, **base_opts, **opts)
    m = res.metrics
    ref = grow_svd(model, target, batches, gamma=0.0, **base_opts, **opts)  # the same growth at gamma = 0
    assert m["svd/gamma"] > 0
    if base == "vt":
        assert res.model.layers[0].attn.q.mult != 1.0  # the compensated rescaling did happen
    assert m["svd/heldout_loss"] == pytest.approx(mean_loss(res.model, held), rel=1e-10)
    assert m["svd/heldout_decrease"] == pytest.approx(mean_loss(ref.model, held) - mean_loss(res.model, held),
                                                      rel=1e-8, abs=1e-13)
    assert m["svd/actual_decrease"] == pytest.approx(mean_loss(ref.model, stats) - mean_loss(res.model, stats),
                                                     rel=1e-8, abs=1e-13)
    assert m["svd/actual_decrease"] > 0
    if base == "vt":  # Eq. 5's multipliers are those of the rows svd wrote (the returned values)
        from grow.growth.vt import stage_lr_multipliers

        for name, p in res.model.named_parameters():
            if name.endswith(("attn.q.weight", "attn.k.weight")) and name in res.lr_multipliers:
                want = stage_lr_multipliers(p, res.state["birth"][name], res.state["zero_born"].get(name, ()))
                assert res.lr_multipliers[name] == pytest.approx(want, rel=1e-12), name


def test_svd_hands_initialize_and_check_transition_to_its_base():
    from grow.growth import get_strategy as strategy

    a, b = (Transformer(CFG, generator=torch.Generator().manual_seed(0)) for _ in range(2))
    strategy("svd", base="vt").initialize(a, torch.Generator().manual_seed(3))
    strategy("vt").initialize(b, torch.Generator().manual_seed(3))
    for (name, x), (_, y) in zip(a.named_parameters(), b.named_parameters()):
        assert torch.equal(x, y), name
    assert float(a.lm_head.weight.std()) == pytest.approx(1 / CFG.d_model, rel=0.2)  # Table 1 (1/h^2), not 0.02
    seen = []
    base = strategy("svd", base="vt")
    base.base.check_transition = lambda s, t: seen.append((s, t))
    base.check_transition(CFG, CFG.replace(n_heads=3))
    assert seen == [(CFG, CFG.replace(n_heads=3))]


# ---------------------------------------------------------------------------------------------
# 7. The update of the existing columns: Burgund's draft's rule and the projected steepest descent
# ---------------------------------------------------------------------------------------------
def existing_update_instance(seed: int, h: int = 7, k: int = 3, n: int = 1, s: int = 12):
    """One layer, one head: X (n sequences of s tokens), G, T = sum_b X_b^T G_b X_b, Sigma = mean
    X_b^T X_b, M = c W_Q W_K^T of rank k; the directions dict the strategy builds (damping 0)."""
    from grow.growth.svd import whitening

    g = torch.Generator().manual_seed(seed)
    X = torch.stack([ill_conditioned(s, h, 10.0, g) for _ in range(n)])
    G = torch.randn(n, s, s, generator=g, dtype=F64)
    T = (X.mT @ G @ X).sum(0)
    sigma = (X.mT @ X).mean(0)
    Rq, Rk = torch.randn(k, h, generator=g, dtype=F64), torch.randn(k, h, generator=g, dtype=F64)
    c = 0.7
    inv_sqrt, sqrt = whitening(sigma)
    W = inv_sqrt @ T @ inv_sqrt
    U, sv, Vh = torch.linalg.svd(W)
    d = {"sigma": sigma[None], "T": T[None, None], "inv_sqrt": inv_sqrt[None], "sqrt": sqrt[None],
         "W": W[None, None], "U": U[None, None], "s": sv[None, None], "V": Vh.mT[None, None]}
    return d, X, Rq, Rk, c, T, sigma


def brute_force_best_rate(Rq, Rk, c, T, sigma) -> float:
    """max over (dW_Q, dW_K) of -<T, dM> / ||Sigma^1/2 dM Sigma^1/2||_F, dM = c (W_Q dW_K^T + dW_Q W_K^T):
    the norm of the projection of the whitened gradient onto the range of the linear map, by least
    squares on the explicit matrix of that map (2 k h columns)."""
    from grow.growth.svd import whitening

    inv_sqrt, sqrt = whitening(sigma)
    k, h = Rq.shape
    cols = []
    for which in range(2):
        for i in range(k * h):
            e = torch.zeros(k * h, dtype=F64)
            e[i] = 1
            dq, dk = (e.view(k, h), torch.zeros(k, h, dtype=F64)) if which == 0 else (torch.zeros(k, h, dtype=F64), e.view(k, h))
            dM = c * (Rq.T @ dk + dq.T @ Rk)
            cols.append((sqrt @ dM @ sqrt).reshape(-1))
    A = torch.stack(cols, 1)  # its kernel (k^2 dims: dW_Q = W_Q R, dW_K = -W_K R^T) is dropped below
    w = (inv_sqrt @ T @ inv_sqrt).reshape(-1)
    U, sv, _ = torch.linalg.svd(A, full_matrices=False)
    U = U[:, sv > 1e-9 * sv[0]]
    return float((U.T @ w).norm())  # decrease per unit radius of the best direction: ||proj of w on range A||


@pytest.mark.parametrize("seed", range(4))
def test_projected_update_attains_the_brute_force_optimum_and_beats_seed004(seed):
    from grow.growth.svd import _NewColumns, _pooled_sq

    n = 1 if seed < 2 else 3  # one sequence: the pooled metric is exact; three: the pooled problem
    d, X, Rq, Rk, c, T, sigma = existing_update_instance(seed, n=n)
    k = Rq.shape[0]
    Wq0 = torch.cat([Rq, torch.zeros(2, Rq.shape[1], dtype=F64)])[None, None]  # k old + 2 new rows
    Wk0 = torch.cat([Rk, torch.zeros(2, Rk.shape[1], dtype=F64)])[None, None]
    cc = torch.full((1, 1, 1, 1), c, dtype=F64)
    best = brute_force_best_rate(Rq, Rk, c, T, sigma)
    rates = {}
    for rule in ("seed004", "projected"):
        ch = _NewColumns(d, Wq0, Wk0, cc, k, rule)
        Xf, Yf = c * torch.cat([Rq[None, None], ch.dWq], -2), torch.cat([ch.dWk, Rk[None, None]], -2)
        dM = Xf.mT @ Yf  # first-order change of M per unit gamma (c folded in)
        decrease = -float((T * dM[0, 0]).sum())
        radius = float(_pooled_sq(d["sigma"], Xf, Yf).sqrt())
        if n == 1:  # the pooled metric is ||X dM X^T|| itself
            assert radius == pytest.approx(float((X[0] @ dM[0, 0] @ X[0].T).norm()), rel=1e-10)
        rates[rule] = decrease / radius
    assert rates["projected"] == pytest.approx(best, rel=1e-9)
    assert rates["seed004"] <= rates["projected"] * (1 + 1e-12)
    assert rates["seed004"] < 0.99 * rates["projected"]  # strictly worse on these instances


# ---------------------------------------------------------------------------------------------
# 8. Cost: the bracketing line search, chunks within a training step's memory, autocast
# ---------------------------------------------------------------------------------------------
def test_bracket_finds_the_minimum_of_a_unimodal_grid_with_fewer_evaluations():
    from grow.growth.svd import _bracket

    grid = get_strategy("svd").grid
    for best in range(len(grid)):
        for slope in (0.3, 1.0, 3.0):
            calls = []

            def loss(t, best=best, slope=slope, calls=calls):
                calls.append(t)
                i = grid.index(t)
                return 1.0 + slope * abs(i - best) + 0.01 * (i > best)

            losses = _bracket(grid, loss)
            assert min(losses, key=lambda t: (losses[t], t)) == grid[best]
            assert 0.0 in losses and len(calls) == len(set(calls)) <= 6
    flat = _bracket(grid, lambda t: 2.0)  # ties keep t = 0
    assert min(flat, key=lambda t: (flat[t], t)) == 0.0


@pytest.mark.parametrize("seed", range(3))
def test_bracketing_chooses_the_full_grid_point(seed):
    """On trained-looking models the ternary search picks the grid point the exhaustive search picks."""
    from grow.growth import svd as svd_mod

    model = trained_like(seed=seed)
    target = CFG.replace(d_qk=7)
    batches = make_batches(6, seed=seed + 10)
    res = grow_svd(model, target, batches)
    losses = {t: grow_svd(model, target, batches, gamma=t).metrics["svd/heldout_loss"]
              for t in svd_mod.SVD(**{}).grid}
    best = min(losses, key=lambda t: (losses[t], t))
    assert res.metrics["svd/gamma_rel"] == best or res.metrics["svd/heldout_loss"] <= losses[best]
    assert res.metrics["svd/linesearch_evals"] <= 7  # 6 held-out evaluations at most, 1 on the statistics batches


def test_statistics_chunks_fit_in_a_training_step():
    from grow.growth.svd_stats import activation_entries, stats_chunk

    big = TransformerConfig(vocab_size=4096, seq_len=128, n_layers=4, d_model=128, n_heads=4, d_qk=32, d_v=32, d_ff=512)
    for cfg, B in ((big, 32), (big.replace(seq_len=512), 8), (CFG, 3)):
        chunk = stats_chunk(cfg, B, cfg.seq_len)
        assert 1 <= chunk <= B
        train = B * activation_entries(cfg, cfg.seq_len, explicit_scores=False)
        assert chunk == 1 or chunk * activation_entries(cfg, cfg.seq_len, explicit_scores=True) <= train
    assert activation_entries(big, 128, False) > 128 * 3 * 4096  # the logits are counted
    assert stats_chunk(big, 32, 128, max_chunk_scores=4 * 4 * 128 * 128 * 5) == 5  # the explicit cap still caps


def test_statistics_and_line_search_run_under_the_training_autocast():
    model = trained_like().float()
    batches = make_batches(6)
    f32 = gradient_statistics(model, batches[:4])
    bf16 = gradient_statistics(model, batches[:4], amp=torch.bfloat16)
    assert bf16.loss != f32.loss and bf16.loss == pytest.approx(f32.loss, rel=2e-2)
    rel = float((bf16.t - f32.t).norm() / f32.t.norm())
    assert 0 < rel < 0.2
    a = grow(model, CFG.replace(d_qk=6), "svd", batch=batches, generator=torch.Generator().manual_seed(0))
    b = grow(model, CFG.replace(d_qk=6), "svd", batch=batches, generator=torch.Generator().manual_seed(0),
             passes=Passes(amp=torch.bfloat16))
    assert a.metrics["svd/stats_loss"] == pytest.approx(f32.loss, rel=1e-6)
    assert b.metrics["svd/stats_loss"] == pytest.approx(bf16.loss, rel=1e-6)


def test_planned_flops_bound_what_a_growth_counts_and_grow_schedule_shows_the_share(tmp_path):
    """`planned_flops` (what `grow schedule` adds up) is at least what a growth counts (statistics,
    the line search's evaluations, linear algebra) and at most the statistics and every grid point;
    `grow schedule` prints their share of the plan's FLOPs."""
    import re

    from grow.growth.svd import planned_flops
    from grow.growth.svd_stats import stats_flops
    from tests.conftest import grow_cli

    model, target = trained_like(), CFG.replace(d_qk=7)
    opts = {"batches": 4, "heldout": 2}
    res = grow_svd(model, target, make_batches(6), **opts)
    bound = planned_flops(CFG, target, opts, 3)
    assert res.flops <= bound
    assert bound - stats_flops(CFG, 12, CFG.seq_len) >= res.flops - res.metrics["svd/stats_flops"] > 0
    assert planned_flops(CFG, CFG, opts, 3) == 0.0
    out = grow_cli("schedule", "strategy=svd", "+schedule=exp", "model=tiny", cwd=tmp_path)
    assert out.returncode == 0, out.stderr[-2000:]
    text = " ".join(out.stdout.split())
    m = re.search(r"svd's statistics and line-search passes: at most (\S+) FLOPs .*?, ([0-9.]+)% of the plan's", text)
    assert m and float(m.group(2)) > 0


def test_line_search_flops_counted_are_what_runs(monkeypatch):
    """svd's counted line-search FLOPs (``svd/linesearch_flops``, a forward per evaluated token) against torch's
    count of the evaluations themselves (FlopCounterMode around each, the math attention kernel so that the counter
    sees the score products): equal to 1%. Before evaluations skipped dL/dW_out under torch.no_grad() it ran 1.9x."""
    from torch.nn.attention import SDPBackend, sdpa_kernel
    from torch.utils.flop_counter import FlopCounterMode

    import grow.growth.svd as svd_module

    cfg = CFG.replace(vocab_size=2000)
    ran = []
    evaluate = svd_module.token_mean_loss

    def counted(*args, **kwargs):
        with sdpa_kernel(SDPBackend.MATH), FlopCounterMode(display=False) as counter:
            out = evaluate(*args, **kwargs)
        ran.append(counter.get_total_flops())
        return out

    monkeypatch.setattr(svd_module, "token_mean_loss", counted)
    res = grow_svd(trained_like(cfg), cfg.replace(d_qk=6), make_batches(6, cfg=cfg))
    assert len(ran) == res.metrics["svd/linesearch_evals"] >= 3
    assert sum(ran) / res.metrics["svd/linesearch_flops"] == pytest.approx(1.0, abs=0.01)


@pytest.mark.parametrize("where", ["start", "end", "interleave", [1, 2]])
def test_new_layers_go_where_the_base_alone_puts_them(where):
    """svd grows d_k only: with ``base_options.layer_position`` every old layer lands where the base strategy
    alone puts it (the param maps agree), whatever else grows."""
    model, batches = trained_like(), make_batches(6)
    target = CFG.replace(d_qk=6, n_layers=4)
    res = grow_svd(model, target, batches, base_options={"layer_position": where})
    ref = grow(model, target, "zero", layer_position=where)
    assert {old: new for old, (new, _) in res.param_map.items()} == {old: new for old, (new, _) in ref.param_map.items()}
    moved = {new.split(".")[1] for old, (new, _) in ref.param_map.items() if old.startswith("layers.")}
    assert (moved == {"0", "1"}) == (where == "end")


@pytest.mark.parametrize("sweep", ["small-1m", "small-4m", "llama-small-1m"])
def test_planned_flops_bound_the_published_svd_growths(sweep):
    """`grow schedule`'s svd bound (statistics pass on the h-grown model it runs on, every grid point and the
    actual-decrease evaluation) summed over the published plan is at least every published svd run's counted
    growth FLOPs (today's count: a forward per evaluated token, `uncounted_eval_flops` taken back out). Costing
    the statistics on the model before h grows, it was 0.57x of them on llama-small-1m."""
    import json
    from pathlib import Path

    from grow.growth.svd import planned_flops

    summary = json.loads((Path(__file__).parent.parent / "docs/results" / sweep / "summary.json").read_text())
    fields = TransformerConfig.__dataclass_fields__
    stages = [(TransformerConfig(**{k: v for k, v in s["config"].items() if k in fields}), s["batch_size"])
              for s in summary["schedules"][0]["stages"]]
    bound = sum(planned_flops(a, b, {}, batch) for (a, _), (b, batch) in zip(stages, stages[1:]))
    runs = next(a for a in summary["arms"] if a["arm"] == "svd")["runs"]
    counted = [r["growth_flops"] - r.get("uncounted_eval_flops", 0.0) for r in runs]
    assert len(counted) == 3 and bound >= max(counted) > 0
