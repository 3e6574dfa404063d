"""The mixture-of-experts feed-forward (`grow.model.MoE`, docs/design.md "Mixture of experts"): Mixtral's routing
checked against transformers' own block, the router losses against transformers' load-balancing loss, FLOPs and
parameters counted (total and active) against the module and FlopCounterMode."""

from __future__ import annotations

import pytest
import torch

from grow.model import MoE, Transformer, TransformerConfig, router_losses
from tests.helpers import MOE_GPT as GPT
from tests.helpers import MOE_LLAMA as LLAMA
from tests.helpers import random_like

F64 = torch.float64


def textbook_moe(moe: MoE, x: torch.Tensor) -> torch.Tensor:
    """Token by token: the top_k logits' softmax (= softmax, top-k, renormalized) weighting their experts."""
    flat, out = x.reshape(-1, x.shape[-1]), torch.zeros_like(x.reshape(-1, x.shape[-1]))
    for t in range(flat.shape[0]):
        r = flat[t] @ moe.router.weight.T
        top = r.topk(moe.top_k)
        for w, e in zip(torch.softmax(top.values, dim=0), top.indices.tolist()):
            out[t] += w * moe.experts[e](flat[t:t + 1])[0]
    return out.view_as(x)


@pytest.mark.parametrize("cfg", [LLAMA, GPT], ids=["llama", "gpt"])
def test_the_dropless_dispatch_is_the_token_by_token_mixture(cfg):
    moe = random_like(cfg).layers[0].mlp
    x = torch.randn(3, 7, cfg.d_model, dtype=F64, generator=torch.Generator().manual_seed(1))
    with torch.no_grad():
        got, want = moe(x), textbook_moe(moe, x)
    assert float((got - want).abs().max()) <= 1e-12 * float(want.abs().max())


def test_a_layer_is_transformers_mixtral_block():
    """Our router and experts copied into transformers' MixtralSparseMoeBlock give the same output. In float64 but
    for transformers' router, whose softmax is float32 whatever the model's dtype (``.float()``): its weights carry
    a float32 rounding (2^-24 relative), so 1e-6 relative; a different choice of experts would be O(1)."""
    from transformers import MixtralConfig
    from transformers.models.mixtral.modeling_mixtral import MixtralSparseMoeBlock

    cfg = LLAMA
    moe = random_like(cfg).layers[1].mlp
    hf = MixtralSparseMoeBlock(MixtralConfig(hidden_size=cfg.d_model, intermediate_size=cfg.d_ff,
                                             num_local_experts=cfg.n_experts, num_experts_per_tok=cfg.top_k)).to(F64)
    with torch.no_grad():
        hf.gate.weight.copy_(moe.router.weight)
        hf.experts.gate_up_proj.copy_(torch.stack([torch.cat([e.gate.weight, e.fc1.weight]) for e in moe.experts]))
        hf.experts.down_proj.copy_(torch.stack([e.fc2.weight for e in moe.experts]))
    x = torch.randn(2, 9, cfg.d_model, dtype=F64, generator=torch.Generator().manual_seed(2))
    with torch.no_grad():
        got, want = moe(x), hf(x)
    assert float((got - want).abs().max()) <= 1e-6 * float(want.abs().max())


def test_the_balance_loss_is_transformers_and_the_z_loss_st_moes():
    from transformers.models.mixtral.modeling_mixtral import load_balancing_loss_func

    g = torch.Generator().manual_seed(3)
    logits = torch.randn(40, 5, dtype=F64, generator=g) * 2
    probs = torch.softmax(logits, dim=-1)
    chosen = probs.topk(2, dim=-1).indices
    balance, z = router_losses(logits, probs, chosen)
    want = load_balancing_loss_func((logits,), num_experts=5, top_k=2)  # sums in float32 whatever the input's dtype
    assert abs(float(balance) - float(want)) <= 1e-6 * float(want)
    assert abs(float(z) - float(torch.logsumexp(logits, -1).pow(2).mean())) <= 1e-12
    # balanced routing gives top_k: every expert chosen by a share k/X of the tokens with mean probability 1/X
    flat = torch.zeros(10, 5, dtype=F64)
    even = torch.stack([torch.arange(10) % 5, (torch.arange(10) + 1) % 5], dim=1)
    assert abs(float(router_losses(flat, torch.softmax(flat, -1), even)[0]) - 2.0) <= 1e-12


def test_the_training_loss_adds_the_router_losses_and_an_evaluation_does_not():
    cfg = GPT.replace(router_aux_coef=0.3, router_z_coef=0.05)
    model = random_like(cfg)
    x = torch.randint(0, cfg.vocab_size, (2, cfg.seq_len), generator=torch.Generator().manual_seed(4))
    model.eval()
    _, ce = model(x, x)
    model.train()
    _, loss = model(x, x)
    balance, z = model.router_losses()
    assert abs(float(loss - ce - 0.3 * balance - 0.05 * z)) <= 1e-12
    assert float(balance) > 0 and float(z) > 0
    assert set(model.router_metrics()) == {"train/router_balance", "train/router_z"}
    assert Transformer(cfg.replace(n_experts=1, top_k=1)).router_metrics() == {}


@pytest.mark.parametrize("cfg", [LLAMA, GPT, LLAMA.replace(n_experts=1, top_k=1)], ids=["llama", "gpt", "dense"])
def test_parameters_total_and_active(cfg):
    model = Transformer(cfg)
    assert cfg.num_params() == model.num_params()
    experts = sum(p.numel() for n, p in model.named_parameters() if ".experts." in n)
    per_expert = experts // (cfg.n_layers * cfg.n_experts) if cfg.moe else 0
    assert cfg.active_params() == cfg.num_params() - cfg.n_layers * (cfg.n_experts - cfg.top_k) * per_expert
    if cfg.moe:
        assert per_expert == cfg.expert_params() and cfg.active_params() < cfg.num_params()


@pytest.mark.parametrize("cfg", [LLAMA, GPT], ids=["llama", "gpt"])
def test_the_flops_of_a_training_step_are_flopcountermodes(cfg):
    """Forward and backward of a step: router, the top_k experts of each token (dropless: exactly top_k), attention
    and W_out, as counted by `TransformerConfig.flops_per_token` and seen by torch's counter (math attention)."""
    from torch.nn.attention import SDPBackend, sdpa_kernel
    from torch.utils.flop_counter import FlopCounterMode

    model = Transformer(cfg)
    x = torch.randint(0, cfg.vocab_size, (3, cfg.seq_len), generator=torch.Generator().manual_seed(5))
    with sdpa_kernel(SDPBackend.MATH), FlopCounterMode(display=False) as counter:
        _, loss = model(x, x)
        loss.backward()
    assert counter.get_total_flops() == cfg.flops_per_token() * x.numel()
    dense = cfg.replace(n_experts=1, top_k=1)
    per_layer = 6 * (cfg.d_model * cfg.n_experts + (cfg.top_k - 1) * (cfg.expert_params() - (cfg.d_ff + cfg.d_model) * cfg.mlp_bias))
    assert cfg.flops_per_token() - dense.flops_per_token() == cfg.n_layers * per_layer


def test_a_dense_config_keeps_its_keys():
    d = LLAMA.replace(n_experts=1, top_k=1).to_dict()
    assert "n_experts" not in d and "top_k" not in d
    assert TransformerConfig.from_dict(LLAMA.to_dict()) == LLAMA


@pytest.mark.parametrize("changes,text", [(dict(top_k=5), "top_k=5"), (dict(n_experts=0), "n_experts=0"),
                                          (dict(router_aux_coef=-1.0), "router_aux_coef=-1.0")])
def test_bad_expert_settings_are_refused(changes, text):
    with pytest.raises(ValueError, match=text):
        LLAMA.replace(**changes)


def test_the_regime_line_says_active_parameters_and_tokens_per_active_one():
    from grow.report.regime import regime_lines

    line = regime_lines({"scale": {"final_config": LLAMA.to_dict(), "tokens": 10 ** 6}})[0]
    active = LLAMA.active_params(non_embedding=True)  # tied embeddings: no separate W_out
    assert f"top {LLAMA.top_k} of {LLAMA.n_experts}" in line and f"{10 ** 6 / active:.0f} training tokens per active" in line
    assert "experts" not in regime_lines({"scale": {"final_config": GPT.replace(n_experts=1, top_k=1).to_dict(),
                                                    "tokens": 10 ** 6}})[0]
