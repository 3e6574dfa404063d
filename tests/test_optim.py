"""The growth-aware optimizers (docs/optimizer.md) and the learning-rate schedule.

Growth is faked here with hand-built maps in the growth code's format: ``param_map[old] = (new,
positions)``, positions of the old parameter's shape holding each old element's flat index in the
new parameter.
"""

from __future__ import annotations

import copy
import io
import math
import warnings

import pytest
import torch

from grow.config import OptimConfig
from grow.errors import ConfigError
from grow.model import Transformer, TransformerConfig
from grow.optim import GrowthAwareAdamW, GrowthAwareSGD, build_optimizer, lr_at

CFG = TransformerConfig(vocab_size=64, seq_len=16, n_layers=2, d_model=32, n_heads=2, d_qk=8, d_v=8, d_ff=64)
needs_cuda = pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")


def torch_adamw(model, wd, **kw):
    dec = [p for p in model.parameters() if p.dim() >= 2]
    nod = [p for p in model.parameters() if p.dim() < 2]
    return torch.optim.AdamW([{"params": dec, "weight_decay": wd}, {"params": nod, "weight_decay": 0.0}], **kw)


def torch_sgd(model, wd, **kw):
    dec = [p for p in model.parameters() if p.dim() >= 2]
    nod = [p for p in model.parameters() if p.dim() < 2]
    return torch.optim.SGD([{"params": dec, "weight_decay": wd}, {"params": nod, "weight_decay": 0.0}], **kw)


def train_both(models_opts, steps, seed=0):
    g = torch.Generator().manual_seed(seed)
    for _ in range(steps):
        x = torch.randint(0, CFG.vocab_size, (4, CFG.seq_len), generator=g)
        y = torch.randint(0, CFG.vocab_size, (4, CFG.seq_len), generator=g)
        for model, opt in models_opts:
            opt.zero_grad(set_to_none=True)
            _, loss = model(x, y)
            loss.backward()
            opt.step()


def max_diff(m1, m2) -> float:
    return max((a - b).abs().max().item() for a, b in zip(m1.parameters(), m2.parameters()))


# ---- no growth: the same as torch ----------------------------------------------------------------


@pytest.mark.parametrize("dtype, tol", [(torch.float64, 1e-12), (torch.float32, 1e-6)])
@pytest.mark.parametrize("foreach", [None, True])
@pytest.mark.parametrize("fused", [None, False])
def test_adamw_matches_torch_without_growth(dtype, tol, foreach, fused):
    """20 steps: same parameters as torch.optim.AdamW (decay on dim >= 2 only) within ``tol`` (absolute;
    parameters are O(0.02-1)). Measured on CPU: bitwise equal with fused=False (foreach ops), one ulp
    with the fused kernel (the default where torch has it)."""
    torch.manual_seed(0)
    ours = Transformer(CFG).to(dtype)
    ref = copy.deepcopy(ours)
    hp = dict(lr=3e-3, betas=(0.9, 0.95), eps=1e-8)
    opt = GrowthAwareAdamW(ours.named_parameters(), weight_decay=0.1, fused=fused, **hp)
    train_both([(ours, opt), (ref, torch_adamw(ref, 0.1, foreach=foreach, **hp))], 20)
    assert max_diff(ours, ref) <= tol
    assert max_diff(ours, Transformer(CFG).to(dtype)) > 1e-3  # it did train
    assert opt.stage_steps == [20]


@pytest.mark.skipif(not hasattr(torch, "_fused_adamw_"), reason="torch has no fused AdamW kernel")
def test_adamw_fused_kernel_on_cpu_matches_torch():
    torch.manual_seed(1)
    ours = Transformer(CFG)
    ref = copy.deepcopy(ours)
    hp = dict(lr=3e-3, betas=(0.9, 0.95), eps=1e-8)
    try:
        opt = GrowthAwareAdamW(ours.named_parameters(), weight_decay=0.1, fused=True, **hp)
        train_both([(ours, opt), (ref, torch_adamw(ref, 0.1, **hp))], 20)
    except (RuntimeError, NotImplementedError) as exc:  # a torch build without the CPU kernel
        pytest.skip(f"fused AdamW unavailable on CPU: {exc}")
    assert max_diff(ours, ref) <= 1e-6


@pytest.mark.parametrize("nesterov", [False, True])
def test_sgd_matches_torch_without_growth(nesterov):
    torch.manual_seed(0)
    ours = Transformer(CFG).double()
    ref = copy.deepcopy(ours)
    opt = GrowthAwareSGD(ours.named_parameters(), lr=0.1, momentum=0.9, weight_decay=5e-4, nesterov=nesterov)
    train_both([(ours, opt), (ref, torch_sgd(ref, 5e-4, lr=0.1, momentum=0.9, nesterov=nesterov))], 20)
    assert max_diff(ours, ref) <= 1e-12


def test_sgd_decoupled_weight_decay():
    """p <- p (1 - lr wd) - lr buf: equal to torch SGD without decay plus the shrink, done by hand."""
    torch.manual_seed(0)
    ours = Transformer(CFG).double()
    ref = copy.deepcopy(ours)
    opt = GrowthAwareSGD(ours.named_parameters(), lr=0.1, momentum=0.9, weight_decay=0.01,
                         decoupled_weight_decay=True)
    ref_opt = torch.optim.SGD(ref.parameters(), lr=0.1, momentum=0.9)
    g = torch.Generator().manual_seed(0)
    for _ in range(10):
        x = torch.randint(0, CFG.vocab_size, (4, CFG.seq_len), generator=g)
        for model, o in ((ours, opt), (ref, ref_opt)):
            o.zero_grad()
            model(x, x)[1].backward()
            if o is ref_opt:
                with torch.no_grad():
                    for p in ref.parameters():
                        if p.dim() >= 2:
                            p.mul_(1 - 0.1 * 0.01)
            o.step()
    assert max_diff(ours, ref) <= 1e-12


# ---- growth --------------------------------------------------------------------------------------


def rows_map(old_rows: list[int], old_shape, new_cols: int | None = None) -> torch.Tensor:
    """Positions of an old (r, c) parameter whose row i lands on row old_rows[i] of a (R, new_cols) one."""
    r, c = old_shape
    cols = new_cols or c
    return torch.tensor(old_rows).view(r, 1) * cols + torch.arange(c).view(1, c)


def make(shape_w, shape_b, dtype=torch.float64, seed=0):
    g = torch.Generator().manual_seed(seed)
    w = torch.nn.Parameter(torch.randn(*shape_w, generator=g, dtype=dtype))
    b = torch.nn.Parameter(torch.randn(*shape_b, generator=g, dtype=dtype))
    return w, b


def set_grads(params, seed):
    g = torch.Generator().manual_seed(seed)
    for p in params:
        p.grad = torch.randn(p.shape, generator=g, dtype=p.dtype)


def grow_wb(opt, w, b, new_rows, stage, on_growth="keep", extra=None):
    """Grow w (4,3) -> (6,3) and b (4,) -> (6,) with old rows at ``new_rows``; copy old values in."""
    nw = torch.nn.Parameter(torch.zeros(6, 3, dtype=w.dtype))
    nb = torch.nn.Parameter(torch.zeros(6, dtype=b.dtype))
    with torch.no_grad():
        nw[new_rows] = w
        nb[new_rows] = b
    pmap = {"w": ("w", rows_map(new_rows, (4, 3))), "b": ("b", torch.tensor(new_rows))}
    named = [("w", nw), ("b", nb)] + (extra or [])
    opt.grow(named, pmap, stage, on_growth=on_growth)
    return nw, nb


@pytest.mark.parametrize("new_rows", [[0, 1, 2, 3], [0, 2, 3, 5]])
def test_growth_keeps_old_moments_and_zeroes_new_ones(new_rows):
    w, b = make((4, 3), (4,))
    opt = GrowthAwareAdamW([("w", w), ("b", b)], lr=1e-2, weight_decay=0.1)
    for s in range(5):
        set_grads([w, b], s)
        opt.step()
    before = {n: {k: v.clone() for k, v in st.items()} for n, st in opt.state.items()}
    nw, nb = grow_wb(opt, w, b, new_rows, stage=1)
    new = [i for i in range(6) if i not in new_rows]
    for name, old_idx in (("w", (new_rows, slice(None))), ("b", (new_rows,))):
        for buf in ("exp_avg", "exp_avg_sq"):
            after = opt.state[name][buf]
            assert torch.equal(after[old_idx], before[name][buf])  # exactly equal
            assert torch.count_nonzero(after[new]) == 0
            assert after.abs().sum() > 0
        birth = opt.birth_stage(name)
        assert birth.dtype == torch.uint8
        assert torch.all(birth[new_rows] == 0) and torch.all(birth[new] == 1)
    assert opt.stage == 1 and opt.stage_steps == [5, 0]
    assert opt.params["w"] is nw and opt.params["b"] is nb


def test_old_slices_continue_and_new_slices_start_fresh():
    """After a growth the old rows evolve exactly as if nothing had grown (same grads); the new rows
    exactly as a fresh AdamW on them alone (own step count from 0): the per-element path is right."""
    hp = dict(lr=1e-2, betas=(0.9, 0.999), eps=1e-8, weight_decay=0.1)
    w, b = make((4, 3), (4,))
    ref_w, ref_b = (torch.nn.Parameter(t.detach().clone()) for t in (w, b))
    opt = GrowthAwareAdamW([("w", w), ("b", b)], **hp)
    ref = torch_opt = torch.optim.AdamW([{"params": [ref_w], "weight_decay": 0.1},
                                         {"params": [ref_b], "weight_decay": 0.0}], lr=1e-2, eps=1e-8)
    for s in range(7):
        set_grads([w, b], s)
        set_grads([ref_w, ref_b], s)
        opt.step()
        torch_opt.step()
    new_rows = [0, 2, 3, 5]
    new = [1, 4]
    nw, nb = grow_wb(opt, w, b, new_rows, stage=1)
    fresh_w = torch.nn.Parameter(nw.detach()[new].clone())
    fresh_b = torch.nn.Parameter(nb.detach()[new].clone())
    fresh = torch.optim.AdamW([{"params": [fresh_w], "weight_decay": 0.1},
                               {"params": [fresh_b], "weight_decay": 0.0}], lr=1e-2, eps=1e-8)
    for s in range(10, 25):
        set_grads([nw, nb], s)
        ref_w.grad, ref_b.grad = nw.grad[new_rows].clone(), nb.grad[new_rows].clone()
        fresh_w.grad, fresh_b.grad = nw.grad[new].clone(), nb.grad[new].clone()
        opt.step()
        ref.step()
        fresh.step()
    assert torch.allclose(nw.detach()[new_rows], ref_w.detach(), rtol=0, atol=1e-12)
    assert torch.allclose(nb.detach()[new_rows], ref_b.detach(), rtol=0, atol=1e-12)
    assert torch.allclose(nw.detach()[new], fresh_w.detach(), rtol=0, atol=1e-12)
    assert torch.allclose(nb.detach()[new], fresh_b.detach(), rtol=0, atol=1e-12)
    assert opt.stage_steps == [22, 15]


def test_first_update_of_a_new_element_is_bounded_by_lr():
    """Own step count: |first update| = lr |g| / (|g| + eps) <= lr. With the step count carried over
    (the naive way) it would be lr (1-b1) / sqrt(1-b2) / (bias corrections ~1) = 3.16 lr."""
    lr, b1, b2, eps = 1e-2, 0.9, 0.999, 1e-8
    w, b = make((4, 3), (4,))
    opt = GrowthAwareAdamW([("w", w), ("b", b)], lr=lr, betas=(b1, b2), eps=eps, weight_decay=0.0)
    for s in range(30):
        set_grads([w, b], s)
        opt.step()
    opt.stage_steps = [10_000]  # as after a long first stage (only the count matters here)
    nw, nb = grow_wb(opt, w, b, [0, 1, 2, 3], stage=1)
    before = nw.detach().clone()
    set_grads([nw, nb], 1000)
    g = nw.grad[4:].clone()
    opt.step()
    first = (nw.detach()[4:] - before[4:]).abs()
    assert torch.all(first <= lr * (1 + 1e-12))
    assert torch.allclose(first, lr * g.abs() / (g.abs() + eps), rtol=1e-10, atol=0)
    # the naive carried count (t = 10001): m = (1-b1) g, v = (1-b2) g^2, corrections 1 - b^t ~ 1
    t = 10_001
    naive = lr * ((1 - b1) * g / (1 - b1 ** t)) / (((1 - b2) * g * g / (1 - b2 ** t)).sqrt() + eps)
    assert torch.all(naive.abs() > 3.1 * lr)  # 0.1 / sqrt(0.001) = 3.16
    assert naive.abs().max() / lr == pytest.approx((1 - b1) / math.sqrt(1 - b2), rel=1e-3)
    # and with a constant gradient it keeps growing: (1 - b1^n) / sqrt(1 - b2^n) peaks at n = 12
    peak = max((1 - b1 ** n) / math.sqrt(1 - b2 ** n) for n in range(1, 100))
    assert 6.5 < peak < 6.6


def test_grown_parameters_return_to_the_fast_path(monkeypatch):
    """Right after a growth the grown tensors need per-element bias corrections; once b2^n is below
    float32 resolution the stages' scalars are identical and the tensors rejoin the fused/foreach groups."""
    w, b = make((4, 3), (4,), dtype=torch.float32)
    opt = GrowthAwareAdamW([("w", w), ("b", b)], lr=1e-3, betas=(0.9, 0.95), weight_decay=0.1)
    for s in range(5):
        set_grads([w, b], s)
        opt.step()
    nw, nb = grow_wb(opt, w, b, [0, 1, 2, 3], stage=1)
    calls = []
    original = GrowthAwareAdamW._mixed_update
    monkeypatch.setattr(GrowthAwareAdamW, "_mixed_update",
                        lambda self, names, *a: (calls.append(len(names)), original(self, names, *a)))
    set_grads([nw, nb], 0)
    opt.step()
    assert calls == [2]  # w and b, decayed and not, in one group (the decay is a column of the stage table)
    for _ in range(400):  # 0.95^n < 2^-25 for n > 338
        opt.step()
    calls.clear()
    opt.step()
    assert calls == [] and opt.stage_steps == [407, 402]


def test_inserted_parameter_is_entirely_new():
    hp = dict(lr=1e-2, weight_decay=0.1)
    w, b = make((4, 3), (4,))
    opt = GrowthAwareAdamW([("w", w), ("b", b)], **hp)
    for s in range(3):
        set_grads([w, b], s)
        opt.step()
    v = torch.nn.Parameter(torch.randn(5, 5, dtype=torch.float64))
    fresh_v = torch.nn.Parameter(v.detach().clone())
    fresh = torch.optim.AdamW([fresh_v], lr=1e-2, weight_decay=0.1)
    nw, nb = grow_wb(opt, w, b, [0, 1, 2, 3], stage=2, extra=[("layers.9.v", v)])
    assert opt.birth["layers.9.v"] == 2 and torch.all(opt.birth_stage("layers.9.v") == 2)
    assert opt.stage_steps == [3, 0, 0]
    for s in range(5):
        set_grads([nw, nb, v], 50 + s)
        fresh_v.grad = v.grad.clone()
        opt.step()
        fresh.step()
    assert torch.allclose(v.detach(), fresh_v.detach(), rtol=0, atol=1e-12)


def test_reset_gives_a_fresh_state():
    w, b = make((4, 3), (4,))
    opt = GrowthAwareAdamW([("w", w), ("b", b)], lr=1e-2, weight_decay=0.0)
    for s in range(20):
        set_grads([w, b], s)
        opt.step()
    opt.set_lr_multipliers({"w": {0: 2.0}})
    nw, nb = grow_wb(opt, w, b, [0, 1, 2, 3], stage=1, on_growth="reset")
    for st in opt.state.values():
        assert all(torch.count_nonzero(t) == 0 for t in st.values())
    assert opt.birth == {"w": 1, "b": 1} and opt.multipliers == {}
    # a fresh torch AdamW on the grown parameters takes the same steps
    ref_w, ref_b = (torch.nn.Parameter(t.detach().clone()) for t in (nw, nb))
    ref = torch.optim.AdamW([ref_w, ref_b], lr=1e-2, weight_decay=0.0)
    for s in range(5):
        set_grads([nw, nb], 100 + s)
        ref_w.grad, ref_b.grad = nw.grad.clone(), nb.grad.clone()
        opt.step()
        ref.step()
    assert torch.allclose(nw.detach(), ref_w.detach(), rtol=0, atol=1e-12)
    assert torch.allclose(nb.detach(), ref_b.detach(), rtol=0, atol=1e-12)


def test_lr_multipliers_per_stage_and_new_warmup():
    lr = 1e-2
    w, b = make((4, 3), (4,))
    opt = GrowthAwareAdamW([("w", w), ("b", b)], lr=lr, weight_decay=0.0, new_warmup_steps=4)
    for s in range(10):
        set_grads([w, b], s)
        opt.step()
    nw, nb = grow_wb(opt, w, b, [0, 1, 2, 3], stage=1)
    # warmup: the new rows' first update is lr * (1/4) * g/(|g|+eps); old rows unaffected
    ref = copy.deepcopy(opt)
    before = nw.detach().clone()
    set_grads([nw, nb], 77)
    opt.step()
    assert torch.all((nw.detach()[4:] - before[4:]).abs() <= lr / 4 * (1 + 1e-12))
    assert (nw.detach()[4:] - before[4:]).abs().max() > 0.9 * lr / 4
    # multipliers: stage-1 elements of w frozen, stage-0 elements of w at 2x; b untouched
    opt2 = ref
    opt2.set_lr_multipliers({"w": {1: 0.0, 0: 2.0}})
    w2, b2 = opt2.params["w"], opt2.params["b"]
    with torch.no_grad():
        w2.copy_(before)
    w2.grad, b2.grad = nw.grad.clone(), nb.grad.clone()
    opt2.step()
    assert torch.equal(w2.detach()[4:], before[4:])
    # old rows moved twice as far as in `opt` (same state, same grads; 2x lr, no decay)
    assert torch.allclose(w2.detach()[:4] - before[:4], 2 * (nw.detach()[:4] - before[:4]), rtol=1e-10, atol=0)
    # the multipliers follow a later growth (renamed) and are cleared by a reset
    opt2.grow([("w_renamed", torch.nn.Parameter(torch.zeros(6, 3, dtype=torch.float64))),
               ("b", torch.nn.Parameter(torch.zeros(6, dtype=torch.float64)))],
              {"w": ("w_renamed", torch.arange(18).view(6, 3)), "b": ("b", torch.arange(6))}, 2)
    assert opt2.multipliers == {"w_renamed": {1: 0.0, 0: 2.0}}
    with pytest.raises(ValueError, match=r"multipliers\['nope'\]"):
        opt2.set_lr_multipliers({"nope": {0: 1.0}})
    with pytest.raises(ValueError, match=r"stage must be an integer in \[0, 2\]"):
        opt2.set_lr_multipliers({"b": {3: 1.0}})
    with pytest.raises(ValueError, match=r"multipliers\['b'\]\[0\]=-1"):
        opt2.set_lr_multipliers({"b": {0: -1}})


def test_sgd_growth_keeps_momentum_and_matches_torch_on_old_rows():
    w, b = make((4, 3), (4,))
    ref_w, ref_b = (torch.nn.Parameter(t.detach().clone()) for t in (w, b))
    opt = GrowthAwareSGD([("w", w), ("b", b)], lr=0.05, momentum=0.9, weight_decay=5e-4)
    ref = torch.optim.SGD([{"params": [ref_w], "weight_decay": 5e-4}, {"params": [ref_b], "weight_decay": 0.0}],
                          lr=0.05, momentum=0.9)
    for s in range(6):
        set_grads([w, b], s)
        set_grads([ref_w, ref_b], s)
        opt.step()
        ref.step()
    buf = opt.state["w"]["momentum_buffer"].clone()
    nw, nb = grow_wb(opt, w, b, [1, 2, 4, 5], stage=1)
    assert torch.equal(opt.state["w"]["momentum_buffer"][[1, 2, 4, 5]], buf)
    assert torch.count_nonzero(opt.state["w"]["momentum_buffer"][[0, 3]]) == 0
    before = nw.detach().clone()
    for s in range(10, 15):
        set_grads([nw, nb], s)
        ref_w.grad, ref_b.grad = nw.grad[[1, 2, 4, 5]].clone(), nb.grad[[1, 2, 4, 5]].clone()
        if s == 10:
            g_new = nw.grad[[0, 3]].clone()
        opt.step()
        ref.step()
        if s == 10:  # a new element's first SGD step: lr * (g + wd p), as torch's first step
            first = nw.detach()[[0, 3]] - before[[0, 3]]
            assert torch.allclose(first, -0.05 * (g_new + 5e-4 * before[[0, 3]]), rtol=0, atol=1e-14)
    assert torch.allclose(nw.detach()[[1, 2, 4, 5]], ref_w.detach(), rtol=0, atol=1e-12)
    assert torch.allclose(nb.detach()[[1, 2, 4, 5]], ref_b.detach(), rtol=0, atol=1e-12)


def test_transformer_mlp_growth_with_a_hand_built_map():
    """A real model: d_ff 64 -> 96 (fc1 rows, fc1 bias, fc2 columns) in one layer; every other
    parameter maps onto itself. Old moments keep, new ones are zero, training goes on."""
    torch.manual_seed(0)
    model = Transformer(CFG)
    opt = GrowthAwareAdamW(model.named_parameters(), lr=1e-3, weight_decay=0.1)
    train_both([(model, opt)], 3)
    big_cfg = CFG.replace(d_ff=96)
    big = Transformer(big_cfg)
    pmap = {}
    for name, p in model.named_parameters():
        if name == "layers.0.mlp.fc1.weight":
            pos = rows_map(list(range(64)), (64, 32))
        elif name == "layers.0.mlp.fc1.bias":
            pos = torch.arange(64)
        elif name == "layers.0.mlp.fc2.weight":  # (32, 64) -> (32, 96): columns 0..63
            pos = torch.arange(32).view(32, 1) * 96 + torch.arange(64).view(1, 64)
        else:
            pos = torch.arange(p.numel()).view(p.shape)
        pmap[name] = (name, pos)
    # layer 1 keeps d_ff = 64 in this fake: give it layer 1's old shapes
    for i, blk in enumerate(big.layers):
        if i == 1:
            blk.mlp = Transformer(CFG).layers[1].mlp
    before = {n: st["exp_avg"].clone() for n, st in opt.state.items()}
    opt.grow(big.named_parameters(), pmap, 1)
    st = opt.state["layers.0.mlp.fc2.weight"]["exp_avg"]
    assert st.shape == (32, 96)
    assert torch.equal(st[:, :64], before["layers.0.mlp.fc2.weight"]) and torch.count_nonzero(st[:, 64:]) == 0
    assert isinstance(opt.birth["wte.weight"], int) and opt.birth["wte.weight"] == 0
    assert opt._stages_in["layers.0.mlp.fc1.weight"] == (0, 1)
    train_both([(big, opt)], 3)
    assert all(torch.isfinite(p).all() for p in big.parameters())


def test_growth_rejects_bad_maps():
    w, b = make((4, 3), (4,))
    opt = GrowthAwareAdamW([("w", w), ("b", b)], lr=1e-2)
    nw = torch.nn.Parameter(torch.zeros(6, 3, dtype=torch.float64))
    nb = torch.nn.Parameter(torch.zeros(6, dtype=torch.float64))
    named = [("w", nw), ("b", nb)]
    good_w = ("w", rows_map([0, 1, 2, 3], (4, 3)))
    cases = [
        ({"w": good_w}, 1, "keep", r"param_map: no entry for old parameter 'b'"),
        ({"w": good_w, "b": ("b", torch.arange(4)), "c": ("b", torch.arange(4))}, 1, "keep", r"param_map\['c'\]"),
        ({"w": good_w, "b": ("zz", torch.arange(4))}, 1, "keep", r"new parameter 'zz'"),
        ({"w": good_w, "b": ("b", torch.arange(3))}, 1, "keep", r"positions have shape \(3,\)"),
        ({"w": good_w, "b": ("b", torch.tensor([0, 1, 2, 6]))}, 1, "keep", r"outside \[0, 5\]"),
        ({"w": good_w, "b": ("b", torch.tensor([0, 1, 1, 2]))}, 1, "keep", r"same position"),
        ({"w": good_w, "b": ("w", torch.arange(4))}, 1, "keep", r"also the target"),
        ({"w": good_w, "b": ("b", torch.arange(4.0))}, 1, "keep", r"integer tensor"),
        ({"w": good_w, "b": ("b", torch.arange(4))}, 0, "keep", r"stage=0: must be an integer in \(0, 255\]"),
        ({"w": good_w, "b": ("b", torch.arange(4))}, 1, "merge", r"on_growth='merge'"),
    ]
    for pmap, stage, mode, pattern in cases:
        with pytest.raises(ValueError, match=pattern):
            opt.grow(named, pmap, stage, on_growth=mode)
    assert opt.stage == 0 and opt.params["w"] is w  # nothing changed


# ---- state dict ----------------------------------------------------------------------------------


@pytest.mark.parametrize("kind", ["adamw", "sgd"])
def test_state_dict_round_trip_weights_only(kind):
    def build(w, b):
        if kind == "adamw":
            return GrowthAwareAdamW([("w", w), ("b", b)], lr=1e-2, betas=(0.8, 0.95), weight_decay=0.1,
                                    new_warmup_steps=3)
        return GrowthAwareSGD([("w", w), ("b", b)], lr=0.1, momentum=0.9, weight_decay=1e-3, nesterov=True,
                              new_warmup_steps=3)

    w, b = make((4, 3), (4,))
    opt = build(w, b)
    for s in range(4):
        set_grads([w, b], s)
        opt.step(lr=1e-2 * (s + 1))
    nw, nb = grow_wb(opt, w, b, [0, 2, 3, 5], stage=1)
    opt.set_lr_multipliers({"w": {1: 1.5}})
    set_grads([nw, nb], 9)
    opt.step()
    buf = io.BytesIO()
    torch.save({"optimizer": opt.state_dict()}, buf)
    buf.seek(0)
    loaded = torch.load(buf, weights_only=True)["optimizer"]

    cw, cb = (torch.nn.Parameter(t.detach().clone()) for t in (nw, nb))
    other = build(*make((6, 3), (6,), seed=5))
    other.params = {"w": cw, "b": cb}  # the checkpoint loader builds the grown model, then loads
    other.state = {n: other._zero_state(p) for n, p in other.params.items()}
    other.birth = {"w": 0, "b": 0}
    other.load_state_dict(loaded)
    assert other.stage == 1 and other.stage_steps == opt.stage_steps and other.lr == opt.lr
    assert other.multipliers == {"w": {1: 1.5}}
    assert torch.equal(other.birth_stage("w"), opt.birth_stage("w"))
    for n in opt.state:
        for k in opt.state[n]:
            assert torch.equal(other.state[n][k], opt.state[n][k])
            assert other.state[n][k] is not opt.state[n][k]
    for s in range(20, 25):
        set_grads([nw, nb], s)
        set_grads([cw, cb], s)
        opt.step()
        other.step()
    assert torch.equal(nw, cw) and torch.equal(nb, cb)


def test_load_state_dict_adopts_the_given_tensors_when_told():
    """``adopt=True`` (a sharded growth's rows, `grow.fsdp_growth.sharded.ShardedGrowth.build`): the state is the given
    tensors' storage, not copies, the zero state freed first; by default copies; both step the same."""
    w, b = make((4, 3), (4,))
    opt = GrowthAwareAdamW([("w", w), ("b", b)], lr=1e-2)
    for s in range(3):
        set_grads([w, b], s)
        opt.step()
    sd = opt.state_dict()
    copied, adopted = (GrowthAwareAdamW([(n, torch.nn.Parameter(p.detach().clone())) for n, p in (("w", w), ("b", b))],
                                        lr=1e-2) for _ in range(2))
    copied.load_state_dict(sd)
    adopted.load_state_dict(sd, adopt=True)
    for n in ("w", "b"):
        for k, t in sd["state"][n].items():
            if k != "birth":
                assert adopted.state[n][k].data_ptr() == t.data_ptr() != copied.state[n][k].data_ptr()
                assert torch.equal(copied.state[n][k], t)
    before = {n: {k: t.clone() for k, t in sd["state"][n].items() if k != "birth"} for n in ("w", "b")}
    for o in (copied, adopted):
        set_grads(list(o.params.values()), 7)
        o.step()
    assert all(torch.equal(copied.params[n], adopted.params[n]) for n in ("w", "b"))
    assert not torch.equal(sd["state"]["w"]["exp_avg"], before["w"]["exp_avg"])  # adopted: stepped in place


def test_load_state_dict_rejects_mismatches():
    w, b = make((4, 3), (4,))
    opt = GrowthAwareAdamW([("w", w), ("b", b)], lr=1e-2)
    sd = opt.state_dict()
    with pytest.raises(ValueError, match="holds a 'adamw' optimizer"):
        GrowthAwareSGD([("w", w), ("b", b)]).load_state_dict(sd)
    w2, b2 = make((5, 3), (4,))
    with pytest.raises(ValueError, match=r"w.exp_avg has shape \(4, 3\)"):
        GrowthAwareAdamW([("w", w2), ("b", b2)]).load_state_dict(sd)
    with pytest.raises(ValueError, match="names differ"):
        GrowthAwareAdamW([("w", w), ("c", b)]).load_state_dict(sd)
    with pytest.raises(ValueError, match="not a grow.optim/1"):
        opt.load_state_dict({"state": {}})


def test_constructor_validation_and_build_optimizer():
    model = Transformer(CFG)
    with pytest.raises(ValueError, match=r"^lr=-1"):
        GrowthAwareAdamW(model.named_parameters(), lr=-1)
    with pytest.raises(ValueError, match=r"^betas\[1\]=1.0"):
        GrowthAwareAdamW(model.named_parameters(), betas=(0.9, 1.0))
    with pytest.raises(ValueError, match=r"^new_warmup_steps=-2"):
        GrowthAwareAdamW(model.named_parameters(), new_warmup_steps=-2)
    with pytest.raises(ValueError, match=r"^momentum=1.5"):
        GrowthAwareSGD(model.named_parameters(), momentum=1.5)
    with pytest.raises(ValueError, match="same tensor"):
        p = torch.nn.Parameter(torch.zeros(2))
        GrowthAwareAdamW([("a", p), ("b", p)])
    common = {"schedule": "cosine", "warmup": 0.0, "min_lr_ratio": 0.1, "on_growth": "keep"}
    opt = build_optimizer(model, OptimConfig.from_node({"name": "adamw", "lr": 3e-3, "betas": [0.9, 0.95], "eps": 1e-8,
                                                        "weight_decay": 0.1, "new_warmup_steps": 5, **common}))
    assert isinstance(opt, GrowthAwareAdamW) and opt.betas == (0.9, 0.95) and opt.new_warmup_steps == 5
    assert set(opt.params) == {n for n, _ in model.named_parameters()}
    adamw = {"name": "adamw", "lr": 3e-3, "weight_decay": 0.1, **common}
    # optim.compile: null is on for a CPU model (the C kernel), else the caller's (trainer.compile); a value wins
    assert build_optimizer(model, OptimConfig.from_node(adamw)).compile is True
    assert build_optimizer(model.to("meta"), OptimConfig.from_node(adamw)).compile is False
    assert build_optimizer(model.to("meta"), OptimConfig.from_node(adamw), compile=True).compile is True
    model = Transformer(CFG)
    assert build_optimizer(model, OptimConfig.from_node({**adamw, "compile": False}), compile=True).compile is False
    assert "compile" not in opt.hyperparameters()  # how the update runs is not saved with what it computes
    with pytest.raises(ConfigError, match="optim.compile"):
        OptimConfig.from_node({**adamw, "compile": "yes"})
    with pytest.raises(ValueError, match=r"^compile='yes'"):
        GrowthAwareAdamW(model.named_parameters(), compile="yes")
    opt = build_optimizer(model, OptimConfig.from_node({"name": "sgd", "lr": 0.1, "momentum": 0.9, "nesterov": False,
                                                        "weight_decay": 5e-4, **common}))
    assert isinstance(opt, GrowthAwareSGD) and not opt.decoupled_weight_decay
    with pytest.raises(ValueError, match="optim.name='lion'"):
        build_optimizer(model, OptimConfig.from_node({"name": "lion"}))


# ---- GPU -----------------------------------------------------------------------------------------


@pytest.mark.gpu
@needs_cuda
def test_cuda_fused_matches_torch_and_grows():
    torch.manual_seed(0)
    ours = Transformer(CFG).cuda()
    ref = copy.deepcopy(ours)
    hp = dict(lr=3e-3, betas=(0.9, 0.95), eps=1e-8)
    opt = GrowthAwareAdamW(ours.named_parameters(), weight_decay=0.1, **hp)
    g = torch.Generator().manual_seed(0)
    ref_opt = torch_adamw(ref, 0.1, fused=True, **hp)
    for _ in range(20):
        x = torch.randint(0, CFG.vocab_size, (4, CFG.seq_len), generator=g).cuda()
        for m, o in ((ours, opt), (ref, ref_opt)):
            o.zero_grad()
            m(x, x)[1].backward()
            o.step()
    assert max_diff(ours, ref) <= 1e-6
    # a growth on the GPU: old moments kept, new zero, a step runs
    w = opt.params["layers.0.mlp.fc1.bias"]
    nb = torch.nn.Parameter(torch.zeros(96, device="cuda"))
    pmap = {n: (n, torch.arange(p.numel(), device="cuda").view(p.shape)) for n, p in opt.params.items()}
    named = [(n, p) for n, p in opt.params.items() if n != "layers.0.mlp.fc1.bias"] + [("layers.0.mlp.fc1.bias", nb)]
    old = opt.state["layers.0.mlp.fc1.bias"]["exp_avg"].clone()
    opt.grow(named, pmap, 1)
    assert torch.equal(opt.state["layers.0.mlp.fc1.bias"]["exp_avg"][:64], old)
    assert w.shape == (64,)
    for p in opt.params.values():
        p.grad = torch.randn_like(p)
    opt.step()
    assert torch.isfinite(nb).all() and nb[64:].abs().max() <= 3e-3 * 1.001


# ---- learning rate -------------------------------------------------------------------------------


def test_lr_warmup_is_linear():
    kw = dict(lr=1.0, total_tokens=1000, warmup_tokens=100)
    assert lr_at(0, **kw) == 0.0
    assert lr_at(25, **kw) == pytest.approx(0.25)
    assert lr_at(50, **kw) == pytest.approx(0.5)
    assert lr_at(100, **kw) == pytest.approx(1.0)
    for sched in ("cosine", "wsd", "constant"):
        assert lr_at(40, schedule=sched, **kw) == pytest.approx(0.4)


def test_lr_cosine_reaches_min_at_the_end():
    kw = dict(lr=2.0, total_tokens=1100, warmup_tokens=100, min_lr_ratio=0.1, schedule="cosine")
    assert lr_at(100, **kw) == pytest.approx(2.0)
    assert lr_at(600, **kw) == pytest.approx((2.0 + 0.2) / 2)  # halfway: the mean of max and min
    assert lr_at(1100, **kw) == pytest.approx(0.2)
    assert lr_at(5000, **kw) == pytest.approx(0.2)  # past the end: stays at min
    values = [lr_at(t, **kw) for t in range(100, 1101, 50)]
    assert all(a >= b for a, b in zip(values, values[1:]))
    assert lr_at(500, lr=1.0, total_tokens=1000, warmup_tokens=0, min_lr_ratio=0.0) == pytest.approx(0.5)


def test_lr_wsd_shape_and_constant():
    kw = dict(lr=1.0, total_tokens=1000, warmup_tokens=100, min_lr_ratio=0.1, decay_fraction=0.2, schedule="wsd")
    assert lr_at(100, **kw) == 1.0
    assert lr_at(500, **kw) == 1.0
    assert lr_at(800, **kw) == 1.0  # the decay starts at (1 - 0.2) * 1000
    assert lr_at(900, **kw) == pytest.approx(0.55)  # linear: halfway from 1.0 to 0.1
    assert lr_at(1000, **kw) == pytest.approx(0.1)
    assert lr_at(950, **kw) > lr_at(990, **kw)
    assert lr_at(999, lr=1.0, total_tokens=1000, warmup_tokens=10, schedule="constant") == 1.0


@pytest.mark.parametrize(
    "kw, start",
    [
        ({"schedule": "step"}, "schedule='step'"),
        ({"warmup_tokens": 2000}, "warmup_tokens=2000"),
        ({"total_tokens": 0}, "total_tokens=0"),
        ({"min_lr_ratio": 1.5}, "min_lr_ratio=1.5"),
        ({"decay_fraction": 0}, "decay_fraction=0"),
        ({"lr": -1.0}, "lr=-1.0"),
    ],
)
def test_lr_bad_input(kw, start):
    args = dict(lr=1.0, total_tokens=1000, warmup_tokens=10)
    args.update(kw)
    with pytest.raises(ValueError) as err:
        lr_at(10, **args)
    assert str(err.value).startswith(start)


def test_fresh_parameters_restart_although_mapped():
    """svd's refactor mode rewrites old W_Q/W_K rows in a new basis: their moments must restart."""
    w, b = make((4, 3), (4,))
    opt = GrowthAwareAdamW([("w", w), ("b", b)], lr=1e-2, weight_decay=0.1)
    for s in range(3):
        set_grads([w, b], s)
        opt.step()
    before_b = opt.state["b"]["exp_avg"].clone()
    nw = torch.nn.Parameter(torch.zeros(6, 3, dtype=w.dtype))
    nb = torch.nn.Parameter(torch.zeros(6, dtype=b.dtype))
    pmap = {"w": ("w", rows_map([0, 1, 2, 3], (4, 3))), "b": ("b", torch.tensor([0, 1, 2, 3]))}
    opt.grow([("w", nw), ("b", nb)], pmap, 1, fresh=["w"])
    assert torch.count_nonzero(opt.state["w"]["exp_avg"]) == 0
    assert torch.all(opt.birth_stage("w") == 1)
    assert torch.equal(opt.state["b"]["exp_avg"][:4], before_b)  # the others keep theirs


# ---- an independent per-element reference across growths -----------------------------------------


class ReferenceAdamW:
    """Per-element AdamW written from its definition, independently of grow.optim: each element is
    updated as torch's single-tensor AdamW updates a tensor holding it (``_single_tensor_adamw``'s
    ops, in its order) with the step count of the element's birth stage (Yuan et al., Appendix C).
    Births follow the growth maps; kept buffers follow the growth's compensated rescalings."""

    def __init__(self, model, lr, betas, eps, wd):
        self.lr, self.betas, self.eps, self.wd = lr, betas, eps, wd
        self.p = {n: p.detach().clone() for n, p in model.named_parameters()}
        self.m = {n: torch.zeros_like(p) for n, p in self.p.items()}
        self.v = {n: torch.zeros_like(p) for n, p in self.p.items()}
        self.birth = {n: torch.zeros(p.shape, dtype=torch.long) for n, p in self.p.items()}
        self.steps = [0]

    def step(self, grads):
        b1, b2 = self.betas
        self.steps = [n + 1 for n in self.steps]
        for name, g in grads.items():
            p, m, v, birth = self.p[name], self.m[name], self.v[name], self.birth[name]
            for s in birth.unique().tolist():
                sel = birth == s
                ps, gs, ms, vs = p[sel], g[sel], m[sel], v[sel]
                n = self.steps[s]
                if p.dim() >= 2:
                    ps.mul_(1 - self.lr * self.wd)
                ms.lerp_(gs, 1 - b1)
                vs.mul_(b2).addcmul_(gs, gs, value=1 - b2)
                step_size = self.lr / (1 - b1 ** n)
                denom = (vs.sqrt() / (1 - b2 ** n) ** 0.5).add_(self.eps)
                ps.addcdiv_(ms, denom, value=-step_size)
                p[sel], m[sel], v[sel] = ps, ms, vs

    def grow(self, res, stage):
        new = {n: p.detach().clone() for n, p in res.model.named_parameters()}
        m = {n: torch.zeros_like(p) for n, p in new.items()}
        v = {n: torch.zeros_like(p) for n, p in new.items()}
        birth = {n: torch.full(p.shape, stage, dtype=torch.long) for n, p in new.items()}
        for old, (name, pos) in res.param_map.items():
            c, flat = res.rescaled.get(name, 1.0), pos.reshape(-1)
            m[name].view(-1)[flat] = self.m[old].reshape(-1) / c
            v[name].view(-1)[flat] = self.v[old].reshape(-1) / c ** 2
            birth[name].view(-1)[flat] = self.birth[old].reshape(-1)
        self.p, self.m, self.v, self.birth = new, m, v, birth
        self.steps.append(0)


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
@pytest.mark.parametrize("fused,route", [(False, "eager"), (None, "eager"), (None, "native"), (None, "torch.compile")],
                         ids=["foreach", "fused", "fused+C-kernel", "fused+torch.compile"])
def test_adamw_matches_an_independent_per_element_reference_across_two_growths(dtype, fused, route, monkeypatch):
    """Bitwise with the foreach path (fused=False): the eager per-element path's arithmetic is the
    foreach path's element by element. With torch's fused kernel on the tensors of one stage, and
    with the one-pass routes (the C kernel of a CPU, torch.compile elsewhere, both run here), the
    results agree within rounding: max |difference| <= 64 eps x max |value| per tensor after 18 steps
    (measured: 1.9e-7 in float32, 3.5e-16 in float64, relative to the tensor's largest entry)."""
    from grow.growth import grow

    cfg = TransformerConfig(vocab_size=40, seq_len=8, n_layers=1, d_model=8, n_heads=2, d_qk=4, d_v=4, d_ff=16)
    torch.manual_seed(0)
    model = Transformer(cfg).to(dtype)
    hp = dict(lr=1e-2, betas=(0.9, 0.95), eps=1e-8)
    import grow.optim.adamw as adamw_module
    import grow.optim.native as native_module

    compile = route != "eager"
    monkeypatch.setattr(adamw_module, "CPU_ONE_PASS", "torch.compile" if route == "torch.compile" else "native")
    calls = {"torch.compile": [], "native": []}
    build, call = adamw_module.compiled_adamw_per_element, native_module.NativeAdamW.__call__
    monkeypatch.setattr(adamw_module, "compiled_adamw_per_element",
                        lambda *a: calls["torch.compile"].append(a) or build(*a))
    monkeypatch.setattr(native_module.NativeAdamW, "__call__",
                        lambda self, *a: calls["native"].append(1) or call(self, *a))
    opt = GrowthAwareAdamW(model.named_parameters(), weight_decay=0.1, fused=fused, compile=compile, **hp)
    ref = ReferenceAdamW(model, wd=0.1, **hp)
    g = torch.Generator().manual_seed(1)
    targets = [cfg.replace(d_model=12, d_ff=24, d_qk=6), cfg.replace(d_model=16, d_ff=32, d_qk=6, n_heads=3, n_layers=2)]
    worst = 0.0
    for stage in range(3):
        if stage:
            res = grow(model, targets[stage - 1], "zero", generator=torch.Generator().manual_seed(stage), stage=stage)
            model = res.model
            opt.grow(list(model.named_parameters()), res.param_map, stage, rescaled=res.rescaled)
            ref.grow(res, stage)
        for _ in range(6):
            grads = {n: torch.randn(p.shape, generator=g, dtype=dtype) for n, p in model.named_parameters()}
            for n, p in model.named_parameters():
                p.grad = grads[n].clone()
            opt.step()
            ref.step(grads)
            for n, p in model.named_parameters():
                for got, want in ((p.detach(), ref.p[n]), (opt.state[n]["exp_avg"], ref.m[n]),
                                  (opt.state[n]["exp_avg_sq"], ref.v[n])):
                    if fused is False:
                        assert torch.equal(got, want), (stage, n)
                    else:
                        worst = max(worst, float((got - want).abs().max() / want.abs().max().clamp_min(1e-30)))
        assert any(isinstance(opt.birth[n], torch.Tensor) for n in opt.params) or stage == 0  # mixed tensors ran
    assert {k: bool(v) for k, v in calls.items()} == {r: r == route for r in calls}  # the route asked for ran
    if fused is not False:
        assert worst <= 64 * torch.finfo(dtype).eps, worst


def test_a_run_with_the_one_pass_update_trains_the_same_model(tmp_path):
    """The default CPU run (``optim.compile`` null: the C kernel) through the exponential schedule's
    growths, float64: the same losses and final parameters as with ``optim.compile=false`` (eager) to
    1e-9 relative (they may differ in the last bit per step, ~1e-16), and no compile time counted
    (the kernel is built once, in ~0.1 s, not per stage)."""
    from hydra import compose, initialize_config_dir

    from grow import train as train_mod
    from grow.config import CONFIG_DIR
    from grow.metrics import read_metrics
    from grow.run import load as load_run
    from tests.conftest import TINY_RUN

    def run(name, *extra):
        with initialize_config_dir(str(CONFIG_DIR), version_base="1.3"):
            cfg = load_run(compose("train", overrides=[*TINY_RUN, "+schedule=exp", "precision=float64",
                                                                   "trainer.max_tokens=12000", "trainer.log_every=1",
                                                                   *extra]))
        trainer = train_mod.Trainer(cfg, tmp_path / name)
        summary = trainer.run()
        records = read_metrics(tmp_path / name)
        return summary, [(r["train/step"], r["train/loss"]) for r in records if "train/loss" in r], trainer

    eager, eager_losses, a = run("eager", "optim.compile=false")
    native, native_losses, b = run("native")
    assert b.opt.compile and not a.opt.compile and len(a.plan) > 1
    assert len(eager_losses) == len(native_losses) > 10
    for (s1, x), (s2, y) in zip(eager_losses, native_losses):
        assert s1 == s2 and abs(x - y) <= 1e-9 * abs(x), (s1, x, y)
    for (n, p), (_, q) in zip(a.model.named_parameters(), b.model.named_parameters()):
        assert (p - q).abs().max() <= 1e-9 * p.abs().max(), n
    assert native["compile_seconds"] == 0 == eager["compile_seconds"]


def grown_twins(dtype=torch.float32, **opt_kwargs):
    """The tiny model grown once by ``zero`` after one step (so its grown tensors hold two stage ages),
    under two growth-aware AdamWs, ``compile=True`` and ``False``, with the same gradients set for
    the first step after the growth: ``[(model, opt, generator)]`` for True, then False; the
    generators continue alike."""
    from grow.growth import grow

    cfg = TransformerConfig(vocab_size=40, seq_len=8, n_layers=1, d_model=8, n_heads=2, d_qk=4, d_v=4, d_ff=16)
    torch.manual_seed(0)
    base = Transformer(cfg).to(dtype)
    res = grow(base, cfg.replace(d_model=12, d_ff=24, d_qk=6), "zero", generator=torch.Generator().manual_seed(1),
               stage=1)
    twins = []
    for compile in (True, False):
        old, model = copy.deepcopy(base), copy.deepcopy(res.model)
        opt = GrowthAwareAdamW(old.named_parameters(), compile=compile, **opt_kwargs)
        g = torch.Generator().manual_seed(2)
        set_random_grads(old, g)
        opt.step()
        opt.grow(list(model.named_parameters()), res.param_map, 1)
        set_random_grads(model, g)
        twins.append((model, opt, g))
    return twins


def set_random_grads(model, g: torch.Generator) -> None:
    for p in model.parameters():
        p.grad = torch.randn(p.shape, generator=g, dtype=p.dtype)


def test_a_failing_compile_falls_back_to_the_eager_update_once(monkeypatch):
    """Should torch.compile fail (here: its recompilation cap, raised before any kernel runs), the
    optimizer warns once, turns ``compile`` off, and updates that tensor and the rest eagerly: each
    tensor updated once, as the eager optimizer does (float64, fused=False; to 1e-14 relative, the
    compiled pass's rounding on the tensors it did update)."""
    import torch._dynamo.exc as dynamo_exc

    import grow.optim.adamw as adamw_module

    calls, real = [], adamw_module.compiled_adamw_per_element

    def fails_on_the_third_tensor(*key):
        def kernel(*args):
            calls.append(key)
            if len(calls) == 3:
                raise dynamo_exc.FailOnRecompileLimitHit("recompile_limit reached (test)")
            real(*key)(*args)
        return kernel

    monkeypatch.setattr(adamw_module, "compiled_adamw_per_element", fails_on_the_third_tensor)
    monkeypatch.setattr(adamw_module, "CPU_ONE_PASS", "torch.compile")  # the route of a GPU, run on the CPU
    (m0, o0, _), (m1, o1, _) = grown_twins(torch.float64, weight_decay=0.1, fused=False)
    opts, models = [o0, o1], [m0, m1]
    with pytest.warns(RuntimeWarning, match="optim.compile: the compiled per-element update failed"):
        opts[0].step()
    opts[1].step()
    assert opts[0].compile is False and len(calls) == 3
    for (n, p), (_, q) in zip(models[0].named_parameters(), models[1].named_parameters()):
        assert (p - q).abs().max() <= 1e-14 * q.abs().max().clamp_min(1e-300), n
        for b in ("exp_avg", "exp_avg_sq"):
            x, y = opts[0].state[n][b], opts[1].state[n][b]
            assert (x - y).abs().max() <= 1e-14 * y.abs().max().clamp_min(1e-300), (n, b)


@pytest.mark.parametrize("betas,eps", [((0.9, 0.95), 1e-8), ((0.8, 0.999), 1e-6)])
def test_the_compiled_update_reads_this_optimizer_s_constants(betas, eps, monkeypatch):
    """The torch.compile route takes betas and eps as a tensor, not compiled in: after a kernel
    compiled for other constants (the previous case, or an earlier process's on-disk cache), it still
    equals the eager update of this optimizer (float32, two stage ages, within 64 ulp of the tensor's
    largest entry). A kernel with compiled-in constants was seen served for the wrong betas."""
    import grow.optim.adamw as adamw_module

    monkeypatch.setattr(adamw_module, "CPU_ONE_PASS", "torch.compile")
    models = []
    for model, opt, g in grown_twins(lr=1e-2, betas=betas, eps=eps):
        for k in range(3):
            if k:
                set_random_grads(model, g)
            opt.step()
        models.append(model)
    for (n, p), (_, q) in zip(models[0].named_parameters(), models[1].named_parameters()):
        assert (p - q).abs().max() <= 64 * torch.finfo(torch.float32).eps * q.abs().max(), n


def test_the_c_kernel_is_built_once_into_its_cache_and_a_missing_compiler_means_eager(tmp_path, monkeypatch):
    """`grow.optim.native`: the kernel is compiled into ``$GROW_KERNEL_CACHE`` once and reused (same
    file, not rebuilt); with no C compiler the optimizer warns once and steps eagerly, bitwise as
    ``compile=False``."""
    import grow.optim.adamw as adamw_module
    import grow.optim.native as native

    monkeypatch.setenv("GROW_KERNEL_CACHE", str(tmp_path / "kernels"))
    lib = native._build("cc")
    assert lib.parent == tmp_path / "kernels" and lib.exists()
    mtime = lib.stat().st_mtime_ns
    assert native._build("cc") == lib and lib.stat().st_mtime_ns == mtime  # reused, not rebuilt
    with pytest.raises(RuntimeError, match="failed"):
        monkeypatch.setattr(native, "SOURCE", native.SOURCE + "\nthis is not C;\n")
        native._build("cc")
    monkeypatch.undo()

    monkeypatch.setattr(adamw_module, "native_adamw", lambda: (None, "no C compiler ('cc' not found; set CC)"))
    monkeypatch.setattr(adamw_module, "_said", set())
    models = []
    for model, opt, _ in grown_twins():
        compile = opt.compile
        if compile:
            with pytest.warns(RuntimeWarning, match=r"optim.compile: no C compiler .*: the eager per-element update"):
                opt.step()
            with warnings.catch_warnings(record=True) as later:
                warnings.simplefilter("always")
                opt.step()
            assert not [w for w in later if "optim.compile" in str(w.message)]  # said once
        else:
            opt.step()
            opt.step()
        models.append(model)
    for (n, p), (_, q) in zip(models[0].named_parameters(), models[1].named_parameters()):
        assert torch.equal(p, q), n


@pytest.mark.parametrize("nesterov", [False, True])
def test_sgd_coupled_l2_momentum_is_converted_as_the_reparameterized_run_would_hold_it(nesterov):
    """Coupled L2 (g += wd p): the momentum holds sum_j mu^j (g_j + wd p_j). A growth that stores the
    weight x c makes every gradient x 1/c and every weight x c, so the kept buffer must be
    sum_j mu^j (g_j / c + wd c p_j): an SGD run on the reparameterized weight c p with gradients
    g / c from the start, written out here, holds exactly that; the next steps then agree too."""
    from grow.optim import GrowthAwareSGD

    torch.manual_seed(0)
    c, wd, mu, lr = 0.5, 0.3, 0.9, 0.05
    w = torch.nn.Parameter(torch.randn(4, 3, dtype=torch.float64))
    opt = GrowthAwareSGD([("w", w)], lr=lr, momentum=mu, weight_decay=wd, nesterov=nesterov)
    ref_buf = torch.zeros_like(w)  # the reparameterized run: weight c p, gradient g / c
    grads = [torch.randn(4, 3, dtype=torch.float64) for _ in range(6)]
    for g in grads[:4]:
        ref_buf = mu * ref_buf + (g / c + wd * c * w.detach())
        w.grad = g.clone()
        opt.step()
    new = torch.nn.Parameter(w.detach() * c)
    opt.grow([("w", new)], {"w": ("w", torch.arange(12).view(4, 3))}, 1, rescaled={"w": c})
    torch.testing.assert_close(opt.state["w"]["momentum_buffer"], ref_buf, rtol=1e-12, atol=1e-14)
    ref_w = new.detach().clone()
    for g in grads[4:]:
        d = g / c + wd * ref_w
        ref_buf = mu * ref_buf + d
        ref_w = ref_w - lr * ((d + mu * ref_buf) if nesterov else ref_buf)
        new.grad = g / c
        opt.step()
    torch.testing.assert_close(new.detach(), ref_w, rtol=1e-12, atol=1e-14)


# ---- one pass over all mixed tensors (grow.optim.native's one call, grow.optim.triton_adamw's one launch) ----


def run_through_two_growths(dtype, route: str, monkeypatch, device: str = "cpu", routes: list | None = None
                            ) -> list[list[torch.Tensor]]:
    """The tiny model's growth-aware AdamW (``compile=True``, one-pass ``route`` on a CPU) through two ``zero``
    growths (three stage ages: tensors whose elements belong to 1, 2 or 3 stages), 5 steps per stage
    on seeded gradients; after every step a copy of each parameter and both moments (on the CPU);
    the optimizer's `routes` (mixed tensors per route) appended to ``routes``."""
    import grow.optim.adamw as adamw_module
    from grow.growth import grow

    monkeypatch.setattr(adamw_module, "CPU_ONE_PASS", route)
    cfg = TransformerConfig(vocab_size=40, seq_len=8, n_layers=1, d_model=8, n_heads=2, d_qk=4, d_v=4, d_ff=16)
    targets = [cfg.replace(d_model=12, d_ff=24, d_qk=6), cfg.replace(d_model=16, d_ff=32, d_qk=6, n_heads=3, n_layers=2)]
    model = Transformer(cfg, generator=torch.Generator().manual_seed(0)).to(device=device, dtype=dtype)
    opt = GrowthAwareAdamW(model.named_parameters(), lr=1e-2, betas=(0.9, 0.95), weight_decay=0.1, compile=True)
    g, snapshots = torch.Generator().manual_seed(1), []
    for stage in range(3):
        if stage:
            res = grow(model.cpu(), targets[stage - 1], "zero", generator=torch.Generator().manual_seed(stage),
                       stage=stage)
            model = res.model.to(device)
            opt.grow(list(model.named_parameters()), res.param_map, stage, rescaled=res.rescaled)
        for _ in range(5):
            for p in model.parameters():
                p.grad = torch.randn(p.shape, generator=g, dtype=dtype).to(device)
            opt.step()
            snapshots.append([t.detach().cpu().clone() for n, p in model.named_parameters()
                              for t in (p, opt.state[n]["exp_avg"], opt.state[n]["exp_avg_sq"])])
    assert max(len(opt._stages_in[n]) for n in opt.params) == 3
    if routes is not None:
        routes.append(opt.routes)
    return snapshots


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
def test_the_one_call_c_pass_equals_the_per_tensor_kernel_bit_for_bit_through_growths(dtype, monkeypatch):
    """`NativeAdamW.__call__` updates every mixed tensor in one call, each in runs of equal birth with
    the stage's scalars broadcast; the per-tensor kernel it replaced (scalars gathered per element,
    `NativeAdamW.per_tensor`) gives the same bits, parameters and moments, at every step through two
    growths."""
    import grow.optim.native as native

    one_call = run_through_two_growths(dtype, "native", monkeypatch)
    calls = []

    def per_tensor(self, ps, gs, ms, vs, births, table, constants):
        calls.append(len(ps))
        for k in range(len(ps)):
            self.per_tensor(ps[k], gs[k], ms[k], vs[k], births[k], table[k], constants)

    monkeypatch.setattr(native.NativeAdamW, "__call__", per_tensor)
    reference = run_through_two_growths(dtype, "native", monkeypatch)
    assert len(calls) == len(reference) - 5 and max(calls) > 1  # one call per step after growths, decayed or not
    for step, (got, want) in enumerate(zip(one_call, reference)):
        assert all(torch.equal(a, b) for a, b in zip(got, want)), step


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
def test_the_one_call_c_pass_on_an_ungrown_model_is_torch_s_adamw(dtype):
    """On an ungrown model (every element of stage 0) the one-call C pass over all its tensors is
    torch.optim.AdamW (weight decay on dim >= 2): within 64 ulp of each tensor's largest entry after
    6 steps (torch's vectorized lerp may round its multiply-add in one step)."""
    from grow.optim.native import native_adamw

    kernel, why = native_adamw()
    if kernel is None:
        pytest.skip(why)
    torch.manual_seed(0)
    model = Transformer(CFG).to(dtype)
    twin = copy.deepcopy(model)
    ref = torch_adamw(twin, 0.1, lr=1e-2, betas=(0.9, 0.95), eps=1e-8, foreach=False)
    opt = GrowthAwareAdamW(model.named_parameters(), lr=1e-2, betas=(0.9, 0.95), weight_decay=0.1)
    ps = list(model.parameters())
    ms, vs = [torch.zeros_like(p) for p in ps], [torch.zeros_like(p) for p in ps]
    births = [torch.zeros(p.shape, dtype=torch.uint8) for p in ps]
    g = torch.Generator().manual_seed(1)
    for step in range(1, 7):
        grads = [torch.randn(p.shape, generator=g, dtype=dtype) for p in ps]
        for q, gr in zip(twin.parameters(), grads):
            q.grad = gr.clone()
        ref.step()
        opt.stage_steps = [step]
        table = torch.tensor([[opt._derived(0, 1.0, p.dim() >= 2)] for p in ps], dtype=torch.float64).to(dtype)
        with torch.no_grad():
            kernel(ps, grads, ms, vs, births, table, (0.9, 0.95, 1e-8))
    for (n, q), p, m, v in zip(twin.named_parameters(), ps, ms, vs):
        st = ref.state[q]
        for got, want in ((p, q), (m, st["exp_avg"]), (v, st["exp_avg_sq"])):
            assert (got - want).abs().max() <= 64 * torch.finfo(dtype).eps * want.abs().max(), n


def test_the_c_kernel_refuses_tensors_that_would_corrupt_memory():
    """One call reads K tensors by address: a size, dtype or table shape that does not match is an
    error before anything is written."""
    from grow.optim.native import native_adamw

    kernel, why = native_adamw()
    if kernel is None:
        pytest.skip(why)
    p, b = torch.zeros(8), torch.zeros(8, dtype=torch.uint8)
    table = torch.ones(1, 1, 3)
    for args in (([p], [torch.zeros(7)], [p.clone()], [p.clone()], [b], table),  # a shorter gradient
                 ([p], [p.clone()], [p.clone()], [p.clone()], [b.long()], table),  # births not uint8
                 ([p], [p.clone()], [p.clone()], [p.clone()], [b], torch.ones(2, 1, 3)),  # a table of 2 tensors
                 ([p], [p.double()], [p.clone()], [p.clone()], [b], table)):  # another dtype
        with pytest.raises(ValueError, match="native AdamW kernel"):
            kernel(*args, (0.9, 0.95, 1e-8))
    assert torch.equal(p, torch.zeros(8))


def _triton_or_skip():
    from grow.optim.triton_adamw import available

    ok, why = available()
    if not ok:
        pytest.skip(why)


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
def test_the_triton_launch_equals_the_c_pass_bit_for_bit_in_triton_s_interpreter(dtype, monkeypatch):
    """The CUDA route (`grow.optim.triton_adamw`: every mixed tensor in one launch) run by Triton's
    interpreter on the CPU (IEEE arithmetic as written, no fused multiply-add): the C pass's bits at
    every step through two growths. Skipped where Triton does not import (torch's CPU wheels)."""
    import grow.optim.adamw as adamw_module
    import grow.optim.triton_adamw as triton_adamw

    _triton_or_skip()
    monkeypatch.setenv("TRITON_INTERPRET", "1")
    launches = []
    real = triton_adamw.adamw_multi_tensor
    monkeypatch.setattr(adamw_module, "adamw_multi_tensor", lambda *a: launches.append(len(a[0])) or real(*a))
    got = run_through_two_growths(dtype, "triton", monkeypatch)
    want = run_through_two_growths(dtype, "native", monkeypatch)
    assert len(launches) == len(got) - 5 and max(launches) > 1  # after each growth one launch per step, not per tensor
    for step, (a, b) in enumerate(zip(got, want)):
        assert all(torch.equal(x, y) for x, y in zip(a, b)), step


@pytest.mark.gpu
@needs_cuda
def test_on_a_gpu_the_triton_launch_equals_the_c_pass_to_float_rounding(monkeypatch):
    """On CUDA (the default route of ``optim.compile``) the one-launch pass agrees with the C pass on
    the CPU within 64 ulp of each tensor's largest entry, float32, through two growths."""
    _triton_or_skip()
    got = run_through_two_growths(torch.float32, "native", monkeypatch, device="cuda")
    want = run_through_two_growths(torch.float32, "native", monkeypatch)
    for a, b in zip(got, want):
        for x, y in zip(a, b):
            assert (x - y).abs().max() <= 64 * torch.finfo(torch.float32).eps * y.abs().max().clamp_min(1e-30)


def test_a_failing_triton_launch_falls_back_to_one_compiled_pass_per_tensor_said_once(monkeypatch):
    """Should the Triton kernel fail (its compile raises before it writes), the optimizer says so once,
    and the mixed tensors take torch.compile's pass, per tensor, from then on: the same model as the C
    pass within 64 ulp of each tensor's largest entry (float32, two growths)."""
    import grow.optim.adamw as adamw_module

    tries = []

    def fails(*args):
        tries.append(len(args[0]))
        raise RuntimeError("PassManager::run failed (test)")

    monkeypatch.setattr(adamw_module, "triton_available", lambda: (True, None))
    monkeypatch.setattr(adamw_module, "adamw_multi_tensor", fails)
    monkeypatch.setattr(adamw_module, "_triton_failed", [])
    monkeypatch.setattr(adamw_module, "_said", set())
    with warnings.catch_warnings(record=True) as said:
        warnings.simplefilter("always")
        got = run_through_two_growths(torch.float32, "triton", monkeypatch)
    messages = [str(w.message) for w in said if "optim.compile" in str(w.message)]
    assert len(tries) == 1 and messages == ["optim.compile: the Triton kernel failed (RuntimeError: PassManager::run "
                                            "failed (test)): one torch.compile pass per tensor"]
    want = run_through_two_growths(torch.float32, "native", monkeypatch)
    for a, b in zip(got, want):
        for x, y in zip(a, b):
            assert (x - y).abs().max() <= 64 * torch.finfo(torch.float32).eps * y.abs().max().clamp_min(1e-30)
