"""strategy=ligo (docs/strategies.md, "ligo"): the function-preserving initial map, the operator's training, its
FLOPs, the reference's map, bad options (`grow compare` on both families: test_operators'
`test_compare_ligo_zero_counts_the_operators_learning_steps`, one sweep for several strategies' tests)."""

from __future__ import annotations

import math

import pytest
import torch
from torch.utils.flop_counter import FlopCounterMode

from grow.growth import Passes, grow
from grow.growth.base import GrowthContext
from grow.growth.ligo import Operator
from grow.growth.svd_stats import token_mean_loss
from grow.model import Transformer, TransformerConfig
from tests.conftest import TINY_DATA, grow_cli, run_config
from tests.helpers import expect_refusal

GPT = TransformerConfig(vocab_size=61, seq_len=12, n_layers=2, d_model=16, n_heads=4, d_qk=4, d_v=4, d_ff=24)
LLAMA = GPT.replace(activation="swiglu", positions="rope", rope_dim=8, rope_theta=500.0, mlp_bias=False,
                    n_kv_heads=2, tie_embeddings=True)
GROWTHS = {"N": {"n_layers": 4}, "h": {"d_model": 32}, "p": {"d_ff": 48},
           "all": {"n_layers": 3, "d_model": 24, "d_ff": 40, "n_heads": 8, "d_qk": 8, "d_v": 6}}


def trained(cfg: TransformerConfig) -> Transformer:
    """A float64 model a few AdamW steps off its initializer (norm gains away from 1)."""
    torch.manual_seed(0)
    m = Transformer(cfg, generator=torch.Generator().manual_seed(0)).double()
    opt = torch.optim.AdamW(m.parameters(), lr=3e-2)
    for _ in range(3):
        x = torch.randint(0, cfg.vocab_size, (4, cfg.seq_len + 1))
        _, loss = m(x[:, :-1], x[:, 1:])
        loss.backward()
        opt.step()
        opt.zero_grad()
    return m


def batches(cfg: TransformerConfig, n: int = 3):
    g = torch.Generator().manual_seed(5)
    return [tuple(torch.randint(0, cfg.vocab_size, (2, cfg.seq_len), generator=g) for _ in range(2)) for _ in range(n)]


def gen():
    return torch.Generator().manual_seed(3)


def operator(small: Transformer, target: TransformerConfig) -> Operator:
    """The initial LiGO map from ``small`` (h, p, N may differ) to ``target``."""
    ctx = GrowthContext(source=small.config, target=target, model=small, batches=[], generator=gen(), stage=1,
                        state=None)
    return Operator(small, target, ctx)


@pytest.mark.parametrize("family", [GPT, LLAMA], ids=["gpt", "llama"])
@pytest.mark.parametrize("dims", list(GROWTHS), ids=list(GROWTHS))
def test_ligo_initial_map_without_steps_keeps_the_logits_float64(family, dims):
    """Zero steps: the grown model is the initial map's, which preserves the function (max |Δlogits| <=
    1e-10 of the largest logit), and its loss figures are equal."""
    model, idx = trained(family), torch.randint(0, family.vocab_size, (3, family.seq_len))
    res = grow(model, family.replace(**GROWTHS[dims]), "ligo", batch=batches(family), generator=gen(), steps=0)
    with torch.no_grad():
        before, after = model(idx), res.model(idx)
    assert (after - before).abs().max() <= 1e-10 * before.abs().max()
    assert res.metrics["ligo/steps"] == 0 and res.metrics["ligo/loss_start"] == res.metrics["ligo/loss_end"]
    assert all(m.mult == 1.0 for m in res.model.modules() if hasattr(m, "mult"))


@pytest.mark.parametrize("family", [GPT, LLAMA], ids=["gpt", "llama"])
@pytest.mark.parametrize("dims", ["N", "h", "all"])
def test_ligo_training_lowers_its_loss_and_the_grown_model_is_the_trained_map(family, dims):
    """With steps, the operator's mean loss on its batches falls (loss_end < loss_start), and the grown
    model's loss on those batches is loss_end: the trained map is the one applied."""
    model, bs = trained(family), batches(family)
    res = grow(model, family.replace(**GROWTHS[dims]), "ligo", batch=bs, generator=gen(), steps=20, lr=1e-2)
    m = res.metrics
    assert m["ligo/steps"] == 20 and m["ligo/loss_end"] < m["ligo/loss_start"] - 1e-3, m
    assert token_mean_loss(res.model, bs)[0] == pytest.approx(m["ligo/loss_end"], abs=1e-12)
    assert res.fresh == {n for n, _ in res.model.named_parameters()}  # no kept optimizer state


def test_operator_flops_equal_torch_flop_counter_forward_and_backward():
    """The operator's own count of one materialization equals torch's FlopCounterMode, forward and backward
    (a loss reading every grown parameter: every operator parameter gets its gradient). The backward is not
    2x the forward: the depth mix and the embeddings' maps have one operand with a gradient (issue 59)."""
    for family in (GPT, LLAMA):
        model = trained(family)
        small = grow(model, family.replace(n_heads=8, d_qk=8), "zero", generator=gen()).model
        op = operator(small, family.replace(n_heads=8, d_qk=8, n_layers=3, d_model=24, d_ff=40))
        with FlopCounterMode(display=False) as counter:
            out = op()
        assert op.flops == counter.get_total_flops() > 0
        loss = sum((w * w).sum() for w in out.values())
        with FlopCounterMode(display=False) as counter:
            loss.backward()
        assert op.backward_flops == counter.get_total_flops() > 0
        assert op.flops < op.backward_flops < 2 * op.flops
        assert all(p.grad is not None for p in op.parameters())


def count_growth(family, tgt, bs, steps):
    """(the growth's result, FlopCounterMode's count of it: every matmul of the operator's training and
    evaluations; the math attention kernel, whose matmuls the counter sees, as `flops_per_token` counts them)."""
    from torch.nn.attention import SDPBackend, sdpa_kernel

    model = trained(family)
    with sdpa_kernel(SDPBackend.MATH), FlopCounterMode(display=False) as counter:
        res = grow(model, tgt, "ligo", batch=bs, generator=gen(), steps=steps)
    return res, counter.get_total_flops()


@pytest.mark.parametrize("family", [GPT, LLAMA], ids=["gpt", "llama"])
@pytest.mark.parametrize("steps", [0, 3])
def test_ligo_growth_flops_equal_flop_counter_around_the_growth(family, steps):
    """GrowthResult.flops equals FlopCounterMode's count around the whole growth (the math attention kernel,
    whose score matmuls the counter sees as `flops_per_token` counts them; the zero growth of heads and
    key/value sizes that sets up the operator's source has no matmul): steps x (the model's forward and
    backward, the map's forward and backward) and the evaluations (two; one at steps=0). The old count took
    the map's backward as 2x its forward and, at steps=0 with growth batches, planned two evaluations."""
    bs, tgt = batches(family), family.replace(d_model=32, n_layers=3, d_ff=40)
    res, counted = count_growth(family, tgt, bs, steps)
    assert res.flops == pytest.approx(counted, rel=1e-12) and counted > 0
    assert res.metrics["ligo/operator_flops"] == res.flops
    from grow.growth.ligo import planned_flops

    assert planned_flops(family, tgt, {"steps": steps}, bs[0][0].shape[0], len(bs)) == pytest.approx(counted, rel=1e-12)


def test_ligo_growth_flops_are_its_steps_evaluations_and_maps():
    """GrowthResult.flops = steps x tokens x the grown model's FLOPs per token, two evaluations of every
    batch at a third of it, steps + 2 materializations of the map and steps backwards of it; the panel's
    ``ligo/operator_flops`` is that whole cost (not one map's)."""
    bs, steps = batches(GPT), 7
    tgt = GPT.replace(d_model=32, n_layers=3)
    res = grow(trained(GPT), tgt, "ligo", batch=bs, generator=gen(), steps=steps)
    tok = bs[0][1].numel()
    fpt = tgt.flops_per_token(GPT.seq_len)
    m = res.metrics
    expect = (steps * tok * fpt + 2 * len(bs) * tok * fpt / 3 + (steps + 2) * m["ligo/map_flops"]
              + steps * m["ligo/map_backward_flops"])
    assert res.flops == pytest.approx(expect, rel=1e-12)
    assert m["ligo/operator_flops"] == res.flops
    assert m["ligo/map_flops"] < m["ligo/map_backward_flops"] < 2 * m["ligo/map_flops"]


@pytest.mark.parametrize("family", [GPT, LLAMA], ids=["gpt", "llama"])
def test_planned_flops_equal_a_growths_count(family):
    """`grow schedule`'s figure for a growth (the map built on the meta device) is what the growth counts:
    with steps, at steps=0 with growth batches (one evaluation; it was planned as two), without batches."""
    from grow.growth.ligo import planned_flops

    bs, tgt = batches(family), family.replace(**GROWTHS["all"])
    for steps in (3, 0):
        res = grow(trained(family), tgt, "ligo", batch=bs, generator=gen(), steps=steps)
        assert planned_flops(family, tgt, {"steps": steps}, bs[0][0].shape[0], len(bs)) == pytest.approx(
            res.flops, rel=1e-12)
    res0 = grow(trained(family), tgt, "ligo", generator=gen(), steps=0)
    assert planned_flops(family, tgt, {"steps": 0}, 2, 0) == res0.flops > 0


def test_grow_schedule_prints_ligos_share(tmp_path):
    import re

    out = grow_cli("schedule", "strategy=ligo", "strategy.steps=10", "+schedule=exp", "model=tiny", cwd=tmp_path)
    assert out.returncode == 0, out.stderr[-2000:]
    m = re.search(r"ligo's operator training \(10 steps per growth on trainer.growth_batches=6\): (\S+) FLOPs, "
                  r"([0-9.e+]+)% of the plan's", " ".join(out.stdout.split()))
    assert m and float(m.group(2)) > 0


# the reference's map (VITA-Group/LiGO, ligo.py: FusedLinear / FusedLayeredNorm / FusedEmbedding.get_params),
# transcribed: small weights stacked on the last axis, depth coefficients, then in- and out-expansions
def ref_linear(stack, coeffs, in_expand, out_expand):
    weight = torch.sum(stack * coeffs, -1)
    if in_expand is not None:
        weight = torch.cat([weight, torch.matmul(weight, torch.transpose(in_expand, 0, 1))], 1)
    if out_expand is not None:
        weight = torch.cat([weight, torch.matmul(out_expand, weight)], 0)
    return weight


def test_ligo_map_equals_the_reference_code_with_its_ties():
    """With the reference's ties (one residual map for writers and readers, C = R; one MLP map for W1 and W2,
    F_l = G_l) and random coefficients, every grown weight equals the reference's get_params; the norm gains
    are the reference's times sqrt(h/h') (this RMSNorm, eps on the sum)."""
    small = trained(GPT)
    tgt = GPT.replace(n_layers=3, d_model=24, d_ff=40)
    op = operator(small, tgt)
    g = torch.Generator().manual_seed(9)
    with torch.no_grad():
        for p in op.parameters():
            p.copy_(torch.rand(p.shape, generator=g, dtype=p.dtype))
        op.writer.copy_(op.reader)
        for u, w in zip(op.unit_in, op.unit_out):
            w.copy_(u)
    new = op()
    sp = dict(small.named_parameters())
    r, scale = op.reader, math.sqrt(GPT.d_model / tgt.d_model)
    for l in range(tgt.n_layers):
        f = op.unit_in[l]
        spec = {"attn.q.weight": (r, None), "attn.k.weight": (r, None), "attn.v.weight": (r, None),
                "attn.o.weight": (None, r), "mlp.fc1.weight": (r, f), "mlp.fc2.weight": (f, r),
                "attn_norm.weight": (None, r), "mlp_norm.weight": (None, r), "mlp.fc1.bias": (None, f),
                "mlp.fc2.bias": (None, r)}
        for key, (a, b) in spec.items():
            stack = torch.stack([sp[f"layers.{j}.{key}"] for j in range(GPT.n_layers)], -1)
            vec = stack.dim() == 2
            want = ref_linear(stack.unsqueeze(1) if vec else stack, op.depth[key.replace(".", "_")][l], a, b)
            want = want.squeeze(1) * (scale if key.endswith("norm.weight") else 1.0) if vec else want
            assert torch.allclose(new[f"layers.{l}.{key}"], want, rtol=0, atol=1e-13), key
    assert torch.allclose(new["wte.weight"], torch.cat([sp["wte.weight"], sp["wte.weight"] @ r.t()], 1))
    assert torch.allclose(new["lm_head.weight"], ref_linear(sp["lm_head.weight"].unsqueeze(-1), torch.ones(1), r, None))


@pytest.mark.parametrize("option,text", [("strategy.lr=-1", "strategy.lr=-1"), ("strategy.steps=2.5", "strategy.steps=2.5"),
                                         ("trainer.growth_batches=0", "trainer.growth_batches=0")])
def test_bad_ligo_option_is_one_line_exit_2(option, text, tmp_path, monkeypatch, capsys):
    monkeypatch.chdir(tmp_path)
    line = expect_refusal(["train", "model=tiny", *TINY_DATA, "+schedule=exp", "strategy=ligo", option], text, capsys,
                          tmp_path)
    assert "ligo" in line


def test_ligo_reduces_token_weighted_gradients_across_ranks():
    """Under a distributed run's reduce (here one rank: the sum is the identity) the operator's gradients and
    token count go through it each step, and the grown model is the one-process one (to rounding)."""
    model, bs, tgt = trained(GPT), batches(GPT), GPT.replace(d_model=32, n_layers=3)
    plain = grow(model, tgt, "ligo", batch=bs, generator=gen(), steps=4, lr=1e-2)
    sizes = []
    reduced = grow(model, tgt, "ligo", batch=bs, generator=gen(), steps=4, lr=1e-2,
                   passes=Passes(reduce=lambda ts: sizes.append(len(ts))))
    n_params = len(list(operator(model, tgt).parameters()))
    assert sizes == [2] + [n_params + 1] * 4 + [2]  # the evaluations' (loss, count); each step's grads + count
    for p, q in zip(plain.model.parameters(), reduced.model.parameters()):
        assert torch.allclose(p, q, rtol=0, atol=1e-12)


def test_ligo_under_fsdp_above_its_host_size_is_refused_with_its_memory_and_time(capsys, tmp_path, monkeypatch):
    """Under FSDP on 2 ranks (torchrun's environment) with trainer.fsdp_growth=auto, ligo (which does not grow
    by units: its operator trains through the whole grown model on rank 0's CPU) is refused in one line when a
    growth goes above `LiGO.host_max_params` (`grow.fsdp_growth.cost.check_host`), with the memory and time that
    training would take there; accepted with trainer.fsdp_growth=host (knowingly), in one process, and below the size."""
    from grow.fsdp_growth.cost import host_training
    from grow.growth.ligo import LiGO

    monkeypatch.setenv("WORLD_SIZE", "2")  # what torchrun sets; the check reads it before any rank joins
    for k, v in {"RANK": "0", "MASTER_ADDR": "127.0.0.1", "MASTER_PORT": "29999"}.items():
        monkeypatch.setenv(k, v)
    base = ["train", "model=llama-124m", *TINY_DATA, "+schedule=exp", "strategy=ligo", "trainer.parallel=fsdp",
            "trainer.world_size=2"]
    line = expect_refusal(base, "error: trainer.fsdp_growth='auto': host (accepting it) or a strategy that grows "
                          "by units", capsys, tmp_path)
    assert "rank 0's CPU" in line and "GiB on rank 0's host" in line and " h at " in line, line
    run = run_config(*base[1:], "trainer.fsdp_growth=host")  # accepted: the user chose the host path
    stages = list(run.plan)
    big = next(b for b in stages[1:] if b.cfg.num_params() > LiGO.host_max_params)
    a = stages[big.index - 1]
    gib, seconds = host_training(run.growth_strategy, a.cfg, big.cfg, run.trainer.batch_size,
                                 run.trainer.growth_batches, 2)
    assert f"{gib:.1f} GiB" in line and f"{seconds / 3600:.1f} h" in line, (line, gib, seconds)
    assert gib > 1 and seconds > 600
    run_config("model=tiny", *base[2:])  # small: grown on the host
    monkeypatch.delenv("WORLD_SIZE")
    run_config(*base[1:], "trainer.world_size=1")  # one process: nothing to shard
