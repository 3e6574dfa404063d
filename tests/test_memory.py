"""The memory plan (grow/memory.py): its activation formula against what autograd really saves, the
micro-batch it picks, and the GPT-2-small experiment on one 80 GB GPU."""

from __future__ import annotations

import pytest
import torch
from hydra import compose, initialize_config_dir

from grow.config import CONFIG_DIR
from grow.memory import (
    MARGIN,
    activation_bytes_per_token,
    auto_micro_batch,
    measured_bytes_per_token,
    step_memory,
)
from grow.model import Transformer, TransformerConfig
from grow.run import load as load_run
from tests.conftest import ROOT


def empty_model(cfg: TransformerConfig, dtype=torch.float32) -> Transformer:
    """The model's structure with uninitialized weights (what is saved depends on shapes only)."""
    with torch.device("meta"):
        model = Transformer(cfg)
    return model.to_empty(device="cpu").to(dtype)


CONFIGS = [
    TransformerConfig(vocab_size=512, seq_len=64, n_layers=2, d_model=64, n_heads=2, d_qk=16, d_v=32, d_ff=256),
    TransformerConfig(vocab_size=1024, seq_len=64, n_layers=3, d_model=96, n_heads=4, d_qk=8, d_v=24, d_ff=128),
    TransformerConfig(vocab_size=4096, seq_len=64, n_layers=1, d_model=128, n_heads=1, d_qk=64, d_v=64, d_ff=512),
    TransformerConfig(vocab_size=512, seq_len=64, n_layers=2, d_model=64, n_heads=4, d_qk=16, d_v=16, d_ff=172,
                      activation="swiglu", positions="rope", n_kv_heads=2, mlp_bias=False),
    # mixtures of experts: top_k experts' tensors a token (docs/model.md, "Mixture of experts")
    TransformerConfig(vocab_size=512, seq_len=64, n_layers=2, d_model=64, n_heads=4, d_qk=16, d_v=16, d_ff=172,
                      activation="swiglu", positions="rope", n_kv_heads=2, mlp_bias=False, n_experts=4, top_k=2),
    TransformerConfig(vocab_size=512, seq_len=64, n_layers=2, d_model=64, n_heads=2, d_qk=16, d_v=32, d_ff=256,
                      n_experts=8, top_k=1),
]


@pytest.mark.parametrize("amp", [None, torch.bfloat16], ids=["float32", "bf16-autocast"])
@pytest.mark.parametrize("cfg", CONFIGS, ids=["small", "narrow-heads", "one-head", "llama", "llama-moe", "moe"])
def test_the_activation_formula_is_within_25_percent_of_saved_tensors(cfg, amp):
    measured = measured_bytes_per_token(empty_model(cfg), 32, amp)
    formula = activation_bytes_per_token(cfg, torch.float32, amp)
    assert 0.75 <= formula / measured <= 1.25, (formula, measured)


def gpt124m_final() -> TransformerConfig:
    with initialize_config_dir(str(CONFIG_DIR), version_base="1.3"):
        cfg = compose("train", overrides=["+experiment=gpt124m-exp"])
    return load_run(cfg).model


def test_the_final_gpt124m_stage_keeps_at_most_470_kb_per_token_under_bf16():
    """Measured with saved-tensor hooks on the real shapes (12 layers, h 768, vocab 16384), on short
    sequences (flash attention keeps O(T) per token, so a token costs the same at T = 1024)."""
    cfg = gpt124m_final()
    assert (cfg.n_layers, cfg.d_model, cfg.vocab_size) == (12, 768, 16384)
    per_token = measured_bytes_per_token(empty_model(cfg), 32, torch.bfloat16)
    assert per_token <= 470 * 1024, per_token / 1024


def test_auto_micro_batch_is_the_largest_that_fits():
    cfg = CONFIGS[0]
    budget = step_memory(cfg, 10).peak / (1 - MARGIN)
    assert auto_micro_batch(cfg, 60, budget) == 10
    assert auto_micro_batch(cfg, 64, budget) == 10  # 7 passes: 10 rows each, the last 4
    assert auto_micro_batch(cfg, 16, budget) == 8  # 2 passes of 8 rather than 10 + 6
    assert auto_micro_batch(cfg, 8, budget) == 8  # never more than the batch
    assert auto_micro_batch(cfg, 64, step_memory(cfg, 1).states) is None  # not even one sequence
    assert step_memory(cfg, 11).peak > (1 - MARGIN) * budget


H200_CHECK = ROOT / "docs" / "bench" / "h200-2026-11-26" / "gpu_check.json"


def test_the_compiled_plan_is_over_and_within_10_percent_of_the_committed_h200_peaks():
    """Every stage of gpt124m-exp as `make gpu-check` ran it on an H200 (compiled, bf16 autocast, micro-batch
    256 x 1024 tokens; docs/bench/h200-2026-11-26/gpu_check.json): the compiled estimate over the measured
    ``max_memory_allocated`` in [1.00, 1.10] (it was 1.03-1.06), where the eager count (each block norm's
    normalized output kept) is over 1.10 at every stage (1.19-1.27)."""
    import json

    from grow.memory import GiB

    stages = json.loads(H200_CHECK.read_text())["training"]["stages"]
    assert len(stages) == 4
    for s in stages:
        cfg, measured = TransformerConfig(**s["config"]), s["peak_gb_measured"] * GiB
        compiled = step_memory(cfg, s["micro_batch"], amp=torch.bfloat16, compiled=True).peak / measured
        eager = step_memory(cfg, s["micro_batch"], amp=torch.bfloat16).peak / measured
        assert 1.00 <= compiled <= 1.10, (s["stage"], compiled)
        assert eager > 1.10, (s["stage"], eager)


def compiled_saved_bytes_per_token(model: Transformer, seq_len: int) -> float:
    """What torch.compile's graph keeps for the backward per token under bf16 autocast: the forward graph's outputs
    (the saved activations and the loss's input) after AOTAutograd's min-cut partitioner, the one torch.compile's
    inductor uses on every device; 2 sequences less 1 (what does not grow with the batch cancels)."""
    from torch._dynamo.backends.common import aot_autograd
    from torch._functorch.partitioners import min_cut_rematerialization_partition

    def saved(rows: int) -> int:
        kept = []

        def forward(gm, _inputs):
            (out,) = [n for n in gm.graph.nodes if n.op == "output"]
            kept.extend(a.meta["val"] for a in out.args[0] if isinstance(getattr(a, "meta", {}).get("val"), torch.Tensor))
            return gm.forward

        backend = aot_autograd(fw_compiler=forward, bw_compiler=lambda gm, _inputs: gm.forward,
                               partition_fn=min_cut_rematerialization_partition)
        torch._dynamo.reset()
        idx = torch.randint(0, model.config.vocab_size, (rows, seq_len), generator=torch.Generator().manual_seed(0))
        with torch.autocast("cpu", dtype=torch.bfloat16):
            torch.compile(model, backend=backend)(idx, idx)
        torch._dynamo.reset()
        return sum(t.numel() * t.element_size() for t in kept)

    return (saved(2) - saved(1)) / seq_len


def test_the_compiled_activation_term_of_a_small_llama_is_over_and_within_10_percent_of_what_torch_compile_keeps():
    """As below on the small Llama-family configuration (rotary, SwiGLU, grouped-query; ~10 s of tracing), where
    the eager count is 1.30x (the small configurations with d_qk != d_v take SDPA's math kernel on a CPU, which keeps
    the T x T scores: not the GPU's kernels)."""
    cfg = CONFIGS[3]
    kept = compiled_saved_bytes_per_token(empty_model(cfg), 64)
    assert 1.00 <= activation_bytes_per_token(cfg, torch.float32, torch.bfloat16, compiled=True) / kept <= 1.10
    assert activation_bytes_per_token(cfg, torch.float32, torch.bfloat16) / kept > 1.25


@pytest.mark.slow  # ~2 min on 2 cores: dynamo traces each stage's model twice
@pytest.mark.parametrize("model", ["gpt-124m", "llama-124m"])
def test_the_compiled_activation_term_is_what_torch_compile_keeps_at_every_stage_of_both_124m_plans(model):
    """The compiled count over what the partitioner keeps (on the CPU, 64-token sequences: flash attention keeps
    O(T) per token), every stage of gpt124m-exp and of its llama-124m twin: in [0.99, 1.10] (gpt: exact but for
    the int64 targets' 8 bytes; llama: 1.3-8.5% over, its first block keeping less still); the eager count is over
    1.10 on llama (silu(gate) recomputed), as the compiled count was before it left that out."""
    with initialize_config_dir(str(CONFIG_DIR), version_base="1.3"):
        run = load_run(compose("train", overrides=["+experiment=gpt124m-exp", f"model={model}"]))
    for stage in run.plan:
        kept = compiled_saved_bytes_per_token(empty_model(stage.cfg), 64)
        ratio = activation_bytes_per_token(stage.cfg, torch.float32, torch.bfloat16, compiled=True) / kept
        assert 0.99 <= ratio <= 1.10, (stage.number, ratio)
        if stage.cfg.gated:
            assert activation_bytes_per_token(stage.cfg, torch.float32, torch.bfloat16) / kept > 1.10


@pytest.mark.parametrize("amp", [None, torch.bfloat16], ids=["float32", "bf16-autocast"])
def test_compiled_leaves_out_the_block_norms_normalized_outputs(amp):
    """Under torch.compile two float32 copies of h per layer and token are not kept (the final norm's is), nor a gated
    MLP's silu(gate)."""
    for cfg in CONFIGS:
        eager = activation_bytes_per_token(cfg, torch.float32, amp)
        mlp = ((2 if amp else 4) * cfg.d_ff if cfg.gated else 0) * (cfg.top_k if cfg.moe else 1)  # gated: silu(gate)
        assert eager - activation_bytes_per_token(cfg, torch.float32, amp, compiled=True) == cfg.n_layers * (2 * 4 * cfg.d_model + mlp)


def test_gpt124m_exp_fits_80_gb_at_every_stage():
    from grow.memory import plan_memory

    with initialize_config_dir(str(CONFIG_DIR), version_base="1.3"):
        run = load_run(compose("train", overrides=["+experiment=gpt124m-exp",
                                                               "trainer.device_memory_gb=80"]))
    rows = plan_memory(run, run.plan, amp=torch.bfloat16)
    assert len(rows) == 4 and all(r["fits"] for r in rows)
    assert all(r["micro_batch"] >= 1 and r["peak_gb"] <= 80 * (1 - MARGIN) for r in rows)
    assert rows[-1]["micro_batch"] < 256  # the final stage needs accumulation on one GPU


def test_grow_schedule_shows_the_memory_plan(tmp_path):
    from tests.conftest import grow_cli

    out = grow_cli("schedule", "+experiment=gpt124m-exp", "trainer.device_memory_gb=80", cwd=tmp_path)
    assert out.returncode == 0, out.stderr
    assert "memory per step" in out.stdout and "80.0 GiB" in out.stdout and "NO" not in out.stdout
    out = grow_cli("schedule", "+experiment=gpt124m-exp", "trainer.device_memory_gb=2", cwd=tmp_path)
    assert out.returncode == 0 and "NO" in out.stdout  # the last stage's weights and moments alone exceed 2 GB


@pytest.mark.parametrize("decoupled,wd,momentum", [(False, 5e-4, 0.9), (True, 5e-4, 0.9), (False, 0.0, 0.9),
                                                   (False, 5e-4, 0.0)])
def test_sgd_states_counted_as_the_optimizer_holds_them(decoupled, wd, momentum):
    """SGD keeps a second buffer (the coupled-L2 history) exactly when `optimizer_kind` says
    "sgd+l2", and `step_memory` counts one more parameter-sized buffer for it."""
    from types import SimpleNamespace

    from grow.memory import optimizer_kind, step_memory
    from grow.model import Transformer, TransformerConfig
    from grow.optim import GrowthAwareSGD

    cfg = TransformerConfig(vocab_size=61, seq_len=16, n_layers=1, d_model=16, n_heads=2, d_qk=4, d_v=4, d_ff=24)
    opt = GrowthAwareSGD(Transformer(cfg).named_parameters(), lr=0.1, momentum=momentum, weight_decay=wd,
                         decoupled_weight_decay=decoupled)
    kind = optimizer_kind(SimpleNamespace(name="sgd", decoupled_weight_decay=decoupled, weight_decay=wd,
                                          momentum=momentum))
    buffers = len(next(iter(opt.state.values())))
    assert buffers == (2 if kind == "sgd+l2" else 1)
    assert (kind == "sgd+l2") == (not decoupled and wd > 0 and momentum > 0)
    extra = step_memory(cfg, 2, optimizer=kind).states - step_memory(cfg, 2, optimizer="sgd").states
    assert extra == (buffers - 1) * 4 * cfg.num_params()


def test_fsdp_shards_the_states_and_keeps_one_block_and_the_root_whole():
    """Per rank of W under FSDP: 1/W of the per-element states, plus the gathered root, two gathered
    blocks and one block's float32 gradient (module docstring), exactly."""
    from grow.memory import units

    cfg = CONFIGS[0]
    one, eight = step_memory(cfg, 4, amp=torch.bfloat16), step_memory(cfg, 4, amp=torch.bfloat16, shards=8)
    P, (R, B) = cfg.num_params(), units(cfg)
    assert R + cfg.n_layers * B == P
    assert eight.states == -(-P * 17 // 8) + 2 * R + 4 * B + 4 * B + 4 * cfg.vocab_size * cfg.d_model
    assert eight.activations == one.activations and eight.states < one.states


def test_the_7b_plan_fits_eight_80_gb_gpus_under_fsdp_and_not_under_ddp():
    from grow.memory import plan_memory

    with initialize_config_dir(str(CONFIG_DIR), version_base="1.3"):
        run = load_run(compose("train", overrides=["+experiment=llama-7b-fsdp"]))
        ddp = load_run(compose("train", overrides=["+experiment=llama-7b-fsdp", "trainer.parallel=ddp"]))
    assert 6.7e9 < run.model.num_params() < 6.8e9 and run.trainer.world_size == 8
    rows = plan_memory(run, run.plan, amp=torch.bfloat16, world=8)
    assert all(r["fits"] and r["rows"] == 64 for r in rows)
    assert not plan_memory(ddp, ddp.plan, amp=torch.bfloat16, world=8)[-1]["fits"]  # 6.7B x 17 bytes > 80 GB


def test_grow_schedule_plans_per_rank_for_trainer_world_size(tmp_path):
    from tests.conftest import grow_cli

    out = grow_cli("schedule", "+experiment=llama-7b-fsdp", cwd=tmp_path)
    assert out.returncode == 0, out.stderr
    assert "per rank of 8, fsdp" in out.stdout and "NO" not in out.stdout
