"""The Llama-style options of `grow.model` (docs/model.md, "The model"): rotary positions, a SwiGLU MLP, grouped-query
attention. Each is checked against an implementation written here from its definition, in float64 to
1e-12 relative; the counts (parameters, FLOPs) against the module and torch's FLOP counter; the configs
through the CLI: a Llama-style model trains, resumes bitwise, samples and evaluates. Its growth:
tests/test_llama_growth.py."""

from __future__ import annotations

import pytest
import torch

from grow.model import Transformer, TransformerConfig
from tests.conftest import assert_one_line_error, grow_cli, run_config
from tests.helpers import LLAMA_RUN, idx, rel, textbook_forward

LLAMA = TransformerConfig(vocab_size=97, seq_len=16, n_layers=2, d_model=24, n_heads=4, d_qk=8, d_v=6, d_ff=40,
                          activation="swiglu", positions="rope", n_kv_heads=2, mlp_bias=False, rope_theta=500.0)


def model_of(cfg: TransformerConfig, seed: int = 0) -> Transformer:
    torch.manual_seed(seed)
    m = Transformer(cfg, generator=torch.Generator().manual_seed(seed)).double()
    with torch.no_grad():  # norms away from 1, so a wrong gain shows
        for n, p in m.named_parameters():
            if n.endswith("norm.weight"):
                p.uniform_(0.5, 1.5)
    return m


@pytest.mark.parametrize("n_kv_heads", [1, 2, 4])
def test_the_model_equals_the_textbook_llama_in_float64(n_kv_heads):
    m = model_of(LLAMA.replace(n_kv_heads=n_kv_heads))
    tokens = idx(m.config)
    assert rel(m(tokens), textbook_forward(m, tokens)) <= 1e-12


def test_the_rotary_table_is_built_once_per_forward(monkeypatch):
    """One `rope_table` per forward, whatever the layers (it was one per layer), and the logits those
    per-layer tables gave: float64, layer by layer with rope=None (each layer its own table), to 1e-15; still
    the textbook model's (anchored at K = 2k, as a growth run's earlier stage) to 1e-12."""
    import grow.model

    m = model_of(LLAMA.replace(n_layers=3, rope_dim=2 * LLAMA.d_qk))
    tokens = idx(m.config)
    calls = []
    built = grow.model.rope_table
    monkeypatch.setattr(grow.model, "rope_table", lambda *a, **k: calls.append(a) or built(*a, **k))
    with torch.no_grad():
        logits = m(tokens)
        assert len(calls) == 1
        x = m.wte(tokens)
        for layer in m.layers:
            x = layer(x)
        per_layer = m.lm_head(m.norm(x))
    assert len(calls) == 1 + m.config.n_layers
    assert rel(logits, per_layer) <= 1e-15
    assert rel(logits, textbook_forward(m, tokens, anchor=2 * LLAMA.d_qk)) <= 1e-12


def test_rotary_scores_depend_on_the_relative_position_only():
    """q_m . k_n = q_{m+d} . k_{n+d}: the same vectors placed d positions later score the same."""
    from grow.model import rope_table, rotate

    g = torch.Generator().manual_seed(0)
    q, k = torch.randn(1, 1, 1, 8, generator=g, dtype=torch.float64), torch.randn(1, 1, 1, 8, generator=g,
                                                                                 dtype=torch.float64)
    cos, sin = rope_table(12, 8, 10000.0, "cpu", torch.float64)

    def score(m, n):
        return float(rotate(q, cos[m], sin[m]) @ rotate(k, cos[n], sin[n]).transpose(-2, -1))

    assert score(5, 2) == pytest.approx(score(9, 6), rel=1e-12)
    assert score(5, 2) != pytest.approx(score(5, 3), rel=1e-3)


def test_grouped_query_attention_is_multi_head_attention_with_repeated_kv_heads():
    """G kv heads equal E heads whose W^K, W^V rows are the group's, repeated E/G times."""
    gqa = model_of(LLAMA)
    mha = Transformer(LLAMA.replace(n_kv_heads=None)).double()
    E, G, k, v = LLAMA.n_heads, LLAMA.kv_heads, LLAMA.d_qk, LLAMA.d_v
    sd = gqa.state_dict()
    for n in range(LLAMA.n_layers):
        for name, size in (("k", k), ("v", v)):
            key = f"layers.{n}.attn.{name}.weight"
            sd[key] = sd[key].view(G, size, -1).repeat_interleave(E // G, dim=0).reshape(E * size, -1)
    mha.load_state_dict(sd)
    tokens = idx(LLAMA)
    assert rel(gqa(tokens), mha(tokens)) <= 1e-12


@pytest.mark.parametrize("cfg", [LLAMA, LLAMA.replace(tie_embeddings=True, mlp_bias=True, n_kv_heads=None),
                                 LLAMA.replace(positions="learned", activation="gelu")],
                         ids=["llama", "tied-biases-mha", "learned-gelu-gqa"])
def test_counts_equal_the_module_and_torch_flop_counter(cfg):
    from torch.utils.flop_counter import FlopCounterMode

    m = Transformer(cfg)
    assert cfg.num_params() == sum(p.numel() for p in m.parameters())
    tokens = idx(cfg, B=2)
    with FlopCounterMode(display=False) as counter:
        _, loss = m(tokens, tokens)
        loss.backward()
    # the counter sees the matmuls of forward and backward; SDPA's backward is counted as 2x its forward,
    # as in flops_per_token's 6 N s E (k + v)
    assert counter.get_total_flops() == cfg.flops_per_token() * tokens.numel()


def test_configs_refuse_what_the_model_cannot_be_in_one_line(tmp_path):
    for override, key in [("model.n_kv_heads=3", "model.n_kv_heads"), ("model.positions=alibi", "model.positions"),
                          ("model.d_qk=7", "model.d_qk"), ("model.rope_theta=1", "model.rope_theta")]:
        out = grow_cli("train", *LLAMA_RUN, override, "trainer.max_tokens=2000", cwd=tmp_path)
        assert_one_line_error(out, key)


def test_rope_dim_below_the_head_size_is_refused_in_one_line(tmp_path):
    out = grow_cli("train", *LLAMA_RUN, "model.rope_dim=4", "trainer.max_tokens=2000", cwd=tmp_path)
    assert_one_line_error(out, "model.rope_dim")


def test_llama_tiny_trains_resumes_bitwise_and_samples(tmp_path):
    """The baseline on llama-tiny: trains (the loss falls); stopped at step 7 and resumed, its losses are
    bitwise those of the run never stopped; grow sample and grow eval read its checkpoint (CLI)."""
    from grow import train as train_mod
    from grow.checkpoint import Interrupted
    from grow.metrics import read_metrics
    from tests.helpers import StopAt, comparable, losses

    args = [*LLAMA_RUN, "trainer.ckpt_every=5", "trainer.max_tokens=6000"]
    ref = train_mod.train(run_config(*args), tmp_path / "ref")
    assert ref["final_config"]["positions"] == "rope" and ref["params"] == run_config(*args).model.num_params()
    ref_records = read_metrics(tmp_path / "ref")
    train_losses = [r["train/loss"] for r in ref_records if "train/loss" in r]
    assert train_losses[-1] < train_losses[0] - 0.05  # 6.04 -> 5.93 here
    run = tmp_path / "run"
    with pytest.raises(Interrupted):
        train_mod.train(run_config(*args), run, stop=StopAt("step", step=7))
    summary = train_mod.train(run_config(*args, f"resume={run}"), run)
    assert summary["final_val_loss"] == ref["final_val_loss"]  # bitwise, the same machine
    assert losses(read_metrics(run)) == losses(ref_records)
    assert comparable(read_metrics(run)) == comparable(ref_records)
    sample = grow_cli("sample", f"run={run}", "max_new_tokens=8", "prompt=def", cwd=tmp_path)
    assert sample.returncode == 0 and sample.stdout.strip(), sample.stderr[-2000:]
    ev = grow_cli("eval", f"run={run}", "max_tokens=2000", cwd=tmp_path)
    assert ev.returncode == 0 and "bits" in ev.stdout + ev.stderr, ev.stderr[-2000:]
