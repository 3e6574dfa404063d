"""The transformer of docs/model.md, "The model": causality, precision agreement, parameter and FLOP counts."""

import math

import pytest
import torch

from grow.model import Transformer, TransformerConfig

CFG = TransformerConfig(vocab_size=97, seq_len=16, n_layers=2, d_model=24, n_heads=3, d_qk=5, d_v=7, d_ff=40)


def test_causal_mask_changing_token_t_never_changes_earlier_logits():
    torch.manual_seed(0)
    model = Transformer(CFG).double().eval()
    idx = torch.randint(0, CFG.vocab_size, (2, CFG.seq_len))
    base = model(idx)
    for t in (0, 5, CFG.seq_len - 1):
        changed = idx.clone()
        changed[:, t] = (changed[:, t] + 1) % CFG.vocab_size
        out = model(changed)
        assert torch.equal(out[:, :t], base[:, :t]), f"logits before {t} changed"
        assert not torch.allclose(out[:, t:], base[:, t:]), "changing token t should change logits at t"


def test_explicit_score_path_matches_sdpa():
    torch.manual_seed(0)
    model = Transformer(CFG).double().eval()
    idx = torch.randint(0, CFG.vocab_size, (2, CFG.seq_len))
    assert (model(idx) - model(idx, score_hook=lambda n, s: s)).abs().max() < 1e-12


def test_float64_and_float32_agree():
    torch.manual_seed(0)
    m32 = Transformer(CFG).eval()
    m64 = Transformer(CFG).double().eval()
    m64.load_state_dict(m32.state_dict())
    idx = torch.randint(0, CFG.vocab_size, (3, CFG.seq_len))
    l32, l64 = m32(idx).double(), m64(idx)
    assert (l32 - l64).abs().max() <= 1e-5 * l64.abs().max().clamp(min=1.0)


@pytest.mark.parametrize("tie", [False, True])
@pytest.mark.parametrize("bias", [False, True])
def test_parameter_count_matches_formula(tie, bias):
    cfg = CFG.replace(tie_embeddings=tie, mlp_bias=bias)
    model = Transformer(cfg)
    assert model.num_params() == cfg.num_params()
    lookup = cfg.vocab_size * cfg.d_model + cfg.seq_len * cfg.d_model
    assert cfg.num_params(non_embedding=True) == model.num_params() - lookup


def test_flops_per_token_formula():
    cfg = CFG
    h, E, k, v, p, N, V, s = (cfg.d_model, cfg.n_heads, cfg.d_qk, cfg.d_v, cfg.d_ff, cfg.n_layers,
                              cfg.vocab_size, cfg.seq_len)
    matmul = N * (h * E * k * 2 + h * E * v + E * v * h + 2 * h * p) + h * V
    # every matmul weight of the model, counted from the module
    counted = sum(p_.numel() for n, p_ in Transformer(cfg).named_parameters()
                  if n.endswith("weight") and "norm" not in n and not n.startswith(("wte", "wpe")))
    assert matmul == counted == cfg.matmul_params()
    assert cfg.flops_per_token() == 6 * matmul + 6 * N * s * E * (k + v)


def test_loss_at_init_is_near_uniform():
    torch.manual_seed(0)
    model = Transformer(CFG)
    idx = torch.randint(0, CFG.vocab_size, (4, CFG.seq_len))
    _, loss = model(idx, idx)
    assert abs(loss.item() - math.log(CFG.vocab_size)) < 0.1


def test_config_rejects_bad_values():
    with pytest.raises(ValueError, match="d_model"):
        TransformerConfig(d_model=0)
    with pytest.raises(ValueError, match="activation"):
        TransformerConfig(activation="tanh")


def test_a_model_key_is_checked_once_by_its_field_and_named_under_model():
    """Each model.* key's default and check sit on its TransformerConfig field: building one in code and reading
    the composed ``model`` node (`TransformerConfig.from_node`, what `grow.run.load` calls) refuse the same value
    with the same one line, the node's named under ``model.``; a null head size is d_model / n_heads."""
    from grow.errors import ConfigError

    for bad, key, said in [({"d_model": 0}, "d_model", "must be a positive integer"),
                           ({"d_model": 30, "n_heads": 4, "d_qk": None}, "d_model", "must be divisible by model.n_heads=4"),
                           ({"n_experts": 2, "top_k": 3}, "top_k", "must be <= model.n_experts=2"),
                           ({"dropout": "x"}, "dropout", "must be a number in [0, 1)"),
                           ({"parametrization": "mup"}, "mup_base_width", "must be an integer >= 1"),
                           ({"family": "qwen4"}, "family", "must be one of llama, mistral, qwen2, qwen3, gemma or null"),
                           ({"qk_norm_eps": -1e-6}, "qk_norm_eps", "must be a number >= 0"),
                           ({"sliding_window": -3}, "sliding_window", "must be a positive integer"),
                           ({"sliding_window": 2.5}, "sliding_window", "must be a positive integer"),
                           ({"embed_scale": "abc"}, "embed_scale", "must be a number > 0"),
                           ({"embed_scale": float("inf")}, "embed_scale", "must be a number > 0"),
                           ({"rope_factor": 0.5}, "rope_factor", "must be a number >= 1"),
                           ({"rope_low_freq_factor": 0}, "rope_low_freq_factor", "must be a number > 0"),
                           ({"rope_high_freq_factor": None}, "rope_high_freq_factor", "must be a number > 0"),
                           ({"rope_factor": 8.0, "rope_high_freq_factor": 1.0}, "rope_high_freq_factor",
                            "must be > model.rope_low_freq_factor=1.0 with model.rope_factor=8.0"),
                           ({"rope_original_positions": 0}, "rope_original_positions", "must be a positive integer"),
                           ({"rope_original_positions": True}, "rope_original_positions", "must be a positive integer")]:
        with pytest.raises(ConfigError) as built:
            TransformerConfig(**bad)
        with pytest.raises(ConfigError) as read:
            TransformerConfig.from_node(bad)
        assert (built.value.key, read.value.key) == (key, f"model.{key}") and said in str(read.value)
        assert built.value.allowed == read.value.allowed
    with pytest.raises(ConfigError, match=r"^model\.d_modle=64: not a key of model \(did you mean d_model\?\)"):
        TransformerConfig.from_node({"d_modle": 64})
    cfg = TransformerConfig.from_node({"d_model": 96.0, "n_heads": 3, "d_qk": None, "d_v": None, "d_ff": 2e2})
    assert (cfg.d_qk, cfg.d_v, cfg.d_ff) == (32, 32, 200) and isinstance(cfg.d_ff, int)
    assert TransformerConfig() == TransformerConfig.from_node({})  # the fields' defaults, one place


def test_every_model_key_has_its_check_on_its_field():
    """Before: the family flags (family, qk_norm_eps, sliding_window, embed_scale, the rope_* scaling) were plain
    fields checked apart in __post_init__ (a zero low_freq_factor, a division by zero, passed); now every field
    carries its default and its check (`_key`), and `FLAG_DEFAULTS` is read off the fields."""
    from dataclasses import fields

    from grow.model import FLAG_DEFAULTS

    assert [f.name for f in fields(TransformerConfig) if "check" not in f.metadata] == []
    assert FLAG_DEFAULTS == {name: getattr(TransformerConfig(), name) for name in FLAG_DEFAULTS}
    assert TransformerConfig.from_node({"rope_original_positions": 16.0, "sliding_window": 8.0,
                                        "qk_norm_eps": 0}).rope_original_positions == 16


@pytest.mark.parametrize("arg, key", [("model.sliding_window=-3", "model.sliding_window=-3"),
                                      ("model.embed_scale=abc", "model.embed_scale='abc'")])
def test_a_bad_family_flag_on_the_command_line_is_one_line_exit_2(tmp_path, arg, key):
    from tests.conftest import TINY_RUN, assert_one_line_error, grow_cli

    out = grow_cli("train", *TINY_RUN, arg, cwd=tmp_path)
    assert_one_line_error(out, key)
    assert not (tmp_path / "outputs").exists()  # refused before anything started


# ---- the loss path: chunked linear + cross-entropy ------------------------------------------------


def reference_loss(model, idx, targets):
    """The plain path: whole logits, then F.cross_entropy (float32 upcast under autocast)."""
    logits = model(idx)
    return torch.nn.functional.cross_entropy(logits.reshape(-1, logits.size(-1)).float()
                                             if logits.dtype == torch.bfloat16 else
                                             logits.reshape(-1, logits.size(-1)), targets.reshape(-1))


@pytest.mark.parametrize("chunk_tokens", [1000, 7, 1])
def test_chunked_loss_and_gradients_equal_the_plain_path_in_float64(monkeypatch, chunk_tokens):
    """Loss and every parameter gradient to 1e-12 relative, whatever the chunking, with ignored
    targets and a forward multiplier on W_out (as vt sets), and tied embeddings."""
    import grow.model as M

    monkeypatch.setattr(M, "CE_CHUNK_ENTRIES", chunk_tokens * CFG.vocab_size)
    monkeypatch.setattr(M, "CE_CHUNK_ENTRIES_CPU", chunk_tokens * CFG.vocab_size)
    torch.manual_seed(0)
    for tie in (False, True):
        model = Transformer(CFG.replace(tie_embeddings=tie)).double()
        model.lm_head.mult = 0.7
        idx = torch.randint(0, CFG.vocab_size, (3, CFG.seq_len))
        targets = torch.randint(0, CFG.vocab_size, (3, CFG.seq_len))
        targets[0, :5] = M.IGNORE_INDEX
        _, loss = model(idx, targets)
        loss.backward()
        got = {n: p.grad.clone() for n, p in model.named_parameters()}
        model.zero_grad()
        want_loss = reference_loss(model, idx, targets)
        want_loss.backward()
        assert abs(float(loss - want_loss)) <= 1e-12 * abs(float(want_loss))
        for n, p in model.named_parameters():
            assert (got[n] - p.grad).abs().max() <= 1e-12 * p.grad.abs().max().clamp(min=1e-30), n
        with torch.no_grad():
            assert float(model(idx, targets)[1]) == pytest.approx(float(want_loss), rel=1e-13)


def test_the_chunked_loss_has_no_data_dependent_op_so_no_host_sync_per_chunk():
    """On meta tensors (shapes, no values) the loss and its gradients run: no op whose output's size depends on
    the values, such as the boolean indexing that made a CUDA step wait for the device once per chunk
    (nonzero() has no meta kernel). The values are checked against the plain path in float64 above."""
    import grow.model as M

    x = torch.empty(10, 8, device="meta", requires_grad=True)
    w = torch.empty(50, 8, device="meta", requires_grad=True)
    loss = M._LinearCrossEntropy.apply(x, w, torch.zeros(10, dtype=torch.long, device="meta"), 1.0, torch.float32, True)
    loss.backward()
    assert loss.shape == () and x.grad.shape == x.shape and w.grad.shape == w.shape


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")
def test_on_a_gpu_the_chunked_loss_never_waits_for_the_device(monkeypatch):
    """torch.cuda's sync debug mode raises on an op that synchronizes with the host (5 chunks, ignored targets)."""
    import grow.model as M

    monkeypatch.setattr(M, "CE_CHUNK_ENTRIES", 1000 * 1024)
    g = torch.Generator(device="cuda").manual_seed(0)
    x = torch.randn(4096, 64, device="cuda", generator=g, requires_grad=True)
    w = torch.randn(1024, 64, device="cuda", generator=g, requires_grad=True)
    y = torch.randint(0, 1024, (4096,), device="cuda", generator=g)
    y[:100] = M.IGNORE_INDEX
    torch.cuda.synchronize()
    torch.cuda.set_sync_debug_mode("error")
    try:
        with torch.autocast("cuda", dtype=torch.bfloat16):
            loss = M._LinearCrossEntropy.apply(x, w, y, 1.0, torch.bfloat16, True)
        loss.backward()
    finally:
        torch.cuda.set_sync_debug_mode("default")
    assert torch.isfinite(loss.detach()).all()


def test_the_loss_chunks_are_cache_sized_on_a_cpu(monkeypatch):
    """On a CPU a chunk holds CE_CHUNK_ENTRIES_CPU logits (4 MB of float32), not the accelerator's 256 MB:
    the matmuls of the loss path run once per chunk of rows."""
    import grow.model as M

    calls = []
    linear = M.F.linear
    monkeypatch.setattr(M.F, "linear", lambda x, w, *a: calls.append(x.shape[0]) or linear(x, w, *a))
    V, N = 4096, 1000
    x, w = torch.randn(N, 8, requires_grad=True), torch.randn(V, 8, requires_grad=True)
    M.linear_cross_entropy(x, w, torch.randint(0, V, (N,)))
    rows = M.CE_CHUNK_ENTRIES_CPU // V
    assert M.ce_chunk_entries(torch.device("cpu")) == 1 << 20 and M.ce_chunk_entries(torch.device("cuda")) == 1 << 26
    assert calls == [rows] * (N // rows) + [N % rows]


def test_chunked_loss_under_bf16_autocast_is_close_to_the_plain_path():
    torch.manual_seed(0)
    model = Transformer(CFG)
    idx = torch.randint(0, CFG.vocab_size, (3, CFG.seq_len))
    with torch.autocast("cpu", dtype=torch.bfloat16):
        _, loss = model(idx, idx)
        want = reference_loss(model, idx, idx)
    assert abs(float(loss - want)) <= 1e-2 * float(want)


def test_cpu_dropout_is_the_same_on_every_cpu(monkeypatch):
    """On the CPU the dropout masks are ``torch.rand(...) >= p`` of the default generator (float32
    uniforms: the same on Intel, AMD and ARM), not torch's CPU dropout, whose masks come from MKL on
    Intel CPUs and from another generator elsewhere. A training forward with dropout never reaches
    torch's dropout or bernoulli, and the masks are the uniforms' (checked against a replay)."""
    import torch.nn.functional as F

    from grow.model import Transformer, TransformerConfig, dropout

    def refuse(*args, **kwargs):
        raise AssertionError("torch's CPU dropout (its masks depend on the CPU vendor)")

    torch.manual_seed(3)
    x = torch.randn(4, 8, 16, dtype=torch.float64)
    state = torch.get_rng_state()
    y = dropout(x, 0.25, True)
    torch.set_rng_state(state)
    keep = torch.rand(x.shape, dtype=torch.float32) >= 0.25
    assert torch.equal(y, x * keep * (1 / 0.75))
    assert torch.equal(dropout(x, 0.25, False), x) and torch.equal(dropout(x, 0.0, True), x)

    cfg = TransformerConfig(vocab_size=40, seq_len=8, n_layers=2, d_model=16, n_heads=2, d_qk=8, d_v=8, d_ff=32,
                            dropout=0.1)
    model = Transformer(cfg, generator=torch.Generator().manual_seed(0)).train()
    idx = torch.randint(0, 40, (2, 8))
    monkeypatch.setattr(F, "dropout", refuse)
    monkeypatch.setattr(torch.Tensor, "bernoulli_", refuse)
    monkeypatch.setattr(torch, "bernoulli", refuse)
    torch.manual_seed(5)
    a = model(idx)
    torch.manual_seed(5)
    b = model(idx)
    torch.manual_seed(6)
    c = model(idx)
    assert torch.equal(a, b) and not torch.equal(a, c)


def test_the_attention_kernels_agree_and_the_dispatch_picks_eager_only_when_needed():
    """`grow.model.ATTENTION`: the fused and the materialized kernel compute the same causal attention
    (float64, 1e-12); eager is chosen for a score hook or CPU dropout only, and a hook sees the scores."""
    from grow.model import ATTENTION, attention_kernel

    g = torch.Generator().manual_seed(0)
    q, k, v = (torch.randn(2, 3, 7, 4, generator=g, dtype=torch.float64) for _ in range(3))
    seen = []
    fused = ATTENTION["sdpa"](q, k, v, 0.5, 0.0)
    eager = ATTENTION["eager"](q, k, v, 0.5, 0.0, lambda s: seen.append(s.shape) or s)
    assert float((fused - eager).abs().max() / fused.abs().max()) <= 1e-12 and seen == [(2, 3, 7, 7)]
    cpu, meta = torch.device("cpu"), torch.device("meta")
    assert [attention_kernel(None, 0.0, cpu), attention_kernel(len, 0.0, cpu), attention_kernel(None, 0.1, cpu),
            attention_kernel(None, 0.1, meta)] == ["sdpa", "eager", "eager", "sdpa"]


def test_an_evaluation_under_no_grad_runs_a_forward_only():
    """Under torch.no_grad() (every evaluation, svd's line search) the loss path computes no gradient, although
    the weights require one: FlopCounterMode's count of ``model(x, y)`` is the forward's, flops_per_token / 3 per
    token (the math attention kernel, whose matmuls the counter sees; CPU's fused kernel it does not count).
    Computing dL/dW_out would add 2 h V a token (x 1.7 at V = 2,000)."""
    from torch.nn.attention import SDPBackend, sdpa_kernel
    from torch.utils.flop_counter import FlopCounterMode

    cfg = CFG.replace(vocab_size=2000)
    model = Transformer(cfg)
    assert all(p.requires_grad for p in model.parameters())
    idx = torch.randint(0, cfg.vocab_size, (3, cfg.seq_len))
    with torch.no_grad(), sdpa_kernel(SDPBackend.MATH), FlopCounterMode(display=False) as counter:
        model(idx, idx)
    assert counter.get_total_flops() == cfg.flops_per_token() // 3 * idx.numel()


def test_torch_compile_runs_the_chunked_loss_eagerly_behind_one_graph_break():
    """`linear_cross_entropy` under torch.compile: never traced (one graph break, as torch.compiler.disable
    makes; `grow.eager`), its loss and gradients those of the eager call (float64)."""
    import torch._dynamo

    import grow.model as M

    torch.manual_seed(0)
    x, w = torch.randn(40, 8, dtype=torch.float64, requires_grad=True), torch.randn(30, 8, dtype=torch.float64)
    targets = torch.randint(0, 30, (40,))

    def loss(x):
        return M.linear_cross_entropy(x.sin(), w, targets, 0.5) * 2

    breaks = torch._dynamo.explain(loss)(x).break_reasons
    assert len(breaks) == 1 and "torch.compiler.disable" in breaks[0].reason, breaks
    torch._dynamo.reset()
    compiled = torch.compile(loss, backend="eager")(x)
    (got,) = torch.autograd.grad(compiled, x)
    want = loss(x)
    assert torch.equal(compiled, want) and torch.equal(got, torch.autograd.grad(want, x)[0])
