"""Growth on the Llama family (docs/model.md, "The six expansions"): rotary k growth under a frequency table anchored at
the final head size, the SwiGLU MLP's three matrices, heads joining the groups of grouped-query attention.

Every strategy that claims preservation (`Strategy.exact_with`, the registry's: plugins included) is checked
on a Llama-style model trained a few AdamW steps, in float64, for each of the six dimensions alone and all
composed (each doubled, so hyperclone's integer factors hold), with grouped-query attention on and off, tied
and untied: max |Δlogits| <= 1e-10 relative to the logits' largest entry. Measured here: <= 1e-15."""

from __future__ import annotations

import math

import pytest
import torch

from grow.growth import grow
from grow.growth.base import available, get_strategy, strategy_class
from grow.model import Transformer, TransformerConfig
from tests.helpers import idx, rel, textbook_forward

TOL = 1e-10
SOURCE = TransformerConfig(vocab_size=61, seq_len=12, n_layers=2, d_model=16, n_heads=4, d_qk=4, d_v=4, d_ff=24,
                           activation="swiglu", positions="rope", rope_dim=8, rope_theta=500.0, mlp_bias=False)
DOUBLED = {"d_model": 32, "d_qk": 8, "d_v": 8, "d_ff": 48, "n_heads": 8, "n_layers": 4}
DIMS = [{k: v} for k, v in DOUBLED.items()] + [DOUBLED]


def exact_strategies() -> list[str]:
    return [n for n in available() if strategy_class(n).exact_with is not None]


def trained(cfg: TransformerConfig, steps: int = 3, seed: int = 0) -> Transformer:
    """A float64 model after a few AdamW steps on random tokens (weights off their initializer; norm gains
    away from 1), so that a wrong placement or a missed rescaling shows in the logits."""
    torch.manual_seed(seed)
    m = Transformer(cfg, generator=torch.Generator().manual_seed(seed)).double()
    opt = torch.optim.AdamW(m.parameters(), lr=3e-2)
    for step in range(steps):
        x = idx(cfg, B=4, seed=10 + step)
        _, loss = m(x[:, :-1], x[:, 1:])
        loss.backward()
        opt.step()
        opt.zero_grad()
    return m


def batches(cfg: TransformerConfig, n: int = 8):
    return [(idx(cfg, B=2, seed=100 + i), idx(cfg, B=2, seed=200 + i)) for i in range(n)]


def grown(name: str, source: TransformerConfig, target: TransformerConfig, model: Transformer):
    strategy = get_strategy(name, **strategy_class(name).exact_with)
    strategy.check_transition(source, target)
    return grow(model, target, strategy, batch=batches(source), generator=torch.Generator().manual_seed(3), stage=1)


@pytest.mark.parametrize("name", exact_strategies())
@pytest.mark.parametrize("n_kv_heads, tied", [(None, False), (2, False), (2, True), (None, True)])
def test_every_exact_strategy_preserves_a_llama_model_in_every_dimension(name, n_kv_heads, tied):
    source = SOURCE.replace(n_kv_heads=n_kv_heads, tie_embeddings=tied)
    model = trained(source)
    x = idx(source, B=3, seed=7)
    with torch.no_grad():
        before = model(x)
    for dims in DIMS:
        target = source.replace(**dims)
        with torch.no_grad():
            after = grown(name, source, target, model).model(x)
        assert rel(after, before) <= TOL, (name, dims, rel(after, before))


def test_svd_refuses_its_refactor_on_rotary_grouped_heads_before_training(tmp_path):
    """svd on rotary or grouped-query heads adds new columns only (tests/test_svd_rotary.py); its refactor
    mode is refused by the CLI in one line (exit 2), before any work."""
    from tests.conftest import assert_one_line_error, grow_cli
    from tests.helpers import LLAMA_RUN

    out = grow_cli("train", *LLAMA_RUN, "+schedule=exp", "strategy=svd", "strategy.mode=refactor",
                   "trainer.max_tokens=12000", cwd=tmp_path)
    assert_one_line_error(out, "strategy")
    assert not list(tmp_path.rglob("metrics.jsonl"))


def test_rotary_k_growth_moves_the_second_halves_and_keeps_the_old_frequencies():
    """Half-split layout: coordinate j < k/2 stays, j >= k/2 moves to j + (k_hat - k)/2, in W^Q and W^K alike
    (W^K's old rows x sqrt(k_hat/k), Def. 3.4); the new rows of W^K are zero (zero strategy)."""
    model = trained(SOURCE)
    res = grow(model, SOURCE.replace(d_qk=8), "zero")
    k, m = 4, 8
    q_old, q_new = model.layers[0].attn.q.weight, res.model.layers[0].attn.q.weight
    k_old, k_new = model.layers[0].attn.k.weight, res.model.layers[0].attn.k.weight
    for head in range(SOURCE.n_heads):
        for j in range(k):
            to = j if j < k // 2 else j + (m - k) // 2
            assert torch.equal(q_new[head * m + to], q_old[head * k + j])
            torch.testing.assert_close(k_new[head * m + to], k_old[head * k + j] * math.sqrt(m / k), rtol=1e-15, atol=0)
        for to in (2, 3, 6, 7):  # the new pairs 2 and 3: coordinates (2, 6) and (3, 7)
            assert not k_new[head * m + to].any()


def test_the_final_stage_is_plain_rope_at_its_own_head_size():
    """A model anchored at K = 8 grown from k = 4 to k = 8 is a standard Llama: its logits equal the textbook
    implementation (tests/test_llama.py, frequencies theta^(-2i/k) at its own k) to 1e-12, and the
    stage-0 model equals the textbook one whose pair i turns at theta^(-2i/K), K = 8 (not 4)."""
    for n_kv_heads in (None, 2):
        source = SOURCE.replace(n_kv_heads=n_kv_heads)
        model = trained(source)
        final = grow(model, source.replace(d_qk=8), "zero").model
        assert final.config.rope_anchor == final.config.d_qk == 8
        x = idx(source, B=2, seed=5)
        with torch.no_grad():
            assert rel(final(x), textbook_forward(final, x)) <= 1e-12
            assert rel(model(x), textbook_forward(model, x, anchor=8)) <= 1e-12
            assert rel(model(x), textbook_forward(model, x)) > 1e-3  # anchored at 4 it would differ


def test_new_heads_join_their_groups_and_read_the_groups_key_value_head():
    """E 4 -> 8 with G = 2 fixed: group g's heads 2g, 2g+1 become heads 4g, 4g+1; heads 4g+2, 4g+3 are new,
    with their W^O columns zero; W^K and W^V are untouched."""
    source = SOURCE.replace(n_kv_heads=2)
    model = trained(source)
    new = grow(model, source.replace(n_heads=8), "zero").model
    a, b = model.layers[1].attn, new.layers[1].attn
    k, v = source.d_qk, source.d_v
    for e in range(4):
        g, i = divmod(e, 2)
        to = 4 * g + i
        assert torch.equal(b.q.weight[to * k:(to + 1) * k], a.q.weight[e * k:(e + 1) * k])
        assert torch.equal(b.o.weight[:, to * v:(to + 1) * v], a.o.weight[:, e * v:(e + 1) * v])
    for to in (2, 3, 6, 7):
        assert not b.o.weight[:, to * v:(to + 1) * v].any()
    assert torch.equal(b.k.weight, a.k.weight) and torch.equal(b.v.weight, a.v.weight)
    assert new.config.kv_heads == 2 and new.config.n_heads == 8


def test_growth_refuses_a_change_of_the_rotary_anchor():
    from grow.growth.base import check_growth

    with pytest.raises(ValueError, match="anchor every stage at the final head size"):
        check_growth(SOURCE.replace(rope_dim=None), SOURCE.replace(d_qk=8, rope_dim=None))
    with pytest.raises(ValueError, match="n_kv_heads"):
        check_growth(SOURCE.replace(n_kv_heads=2), SOURCE.replace(n_kv_heads=4))


def test_the_plan_anchors_rope_at_the_final_head_size_and_keeps_whole_groups():
    from grow.plan import build_plan

    final = SOURCE.replace(d_model=64, n_heads=12, d_qk=16, d_v=16, d_ff=96, n_kv_heads=4, rope_dim=None)
    plan = build_plan(final, {"name": "exp", "stages": 4, "grow": ["d_model", "n_heads", "d_qk", "d_ff"]},
                      max_tokens=200_000, batch_size=8)
    assert [s.cfg.rope_dim for s in plan] == [16] * 4
    assert [s.cfg.d_qk for s in plan][-1] == 16 and plan[0].cfg.d_qk < 16
    heads = [s.cfg.n_heads for s in plan]
    assert all(e % 4 == 0 for e in heads) and heads == sorted(heads) and heads[-1] == 12, heads
    learned = build_plan(final.replace(positions="learned"), {"name": "exp", "stages": 2}, max_tokens=200_000,
                         batch_size=8)
    assert [s.cfg.rope_dim for s in learned] == [None, None]


@pytest.mark.parametrize("name", available())
def test_llama_tiny_trains_through_every_growth_of_the_default_schedule(name, tmp_path):
    """`grow train model=llama-tiny +schedule=exp strategy=<name>` (in process): every growth happens, the
    loss stays finite, the final model is llama-tiny (plain RoPE at its head size)."""
    from grow import train as train_mod
    from grow.metrics import read_metrics
    from tests.conftest import run_config
    from tests.helpers import LLAMA_RUN

    # 6000 tokens: 11 steps, each stage at least one; ligo's operator 10 AdamW steps a growth, not its default 100
    ligo = ["strategy.steps=10"] if name == "ligo" else []
    run = run_config(*LLAMA_RUN, "+schedule=exp", f"strategy={name}", "trainer.max_tokens=6000", *ligo)
    summary = train_mod.train(run, tmp_path / name)
    growths = [r for r in read_metrics(tmp_path / name) if "growth/loss_after" in r]
    assert [r["growth/stage"] for r in growths] == [2, 3, 4]
    assert all(math.isfinite(r["growth/loss_after"]) for r in growths)
    final = TransformerConfig.from_dict(summary["final_config"])
    assert final.rope_anchor == final.d_qk == run.model.d_qk and math.isfinite(summary["final_val_loss"])
    if strategy_class(name).exact_with == {}:  # exact with its defaults (zero, hyperclone, msg...)
        assert all(abs(r["growth/delta"]) <= 1e-4 for r in growths), growths
