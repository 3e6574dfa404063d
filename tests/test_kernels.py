"""The training step's kernel choices (grow/kernels.py): ``trainer.loss_kernel`` (grow's chunked loss, or
liger-kernel's fused linear cross-entropy) and ``trainer.attention`` (SDPA's backend tried first). On the CPU:
the choice reaches a training step's loss and SDPA's priority order and nothing else, and liger is refused
in one line where it does not import; on a GPU (marker gpu): the same losses, gradients and attention
outputs to bf16 rounding."""

from __future__ import annotations

from types import SimpleNamespace

import pytest
import torch

from grow import kernels
from grow.model import Transformer, TransformerConfig

CFG = TransformerConfig(vocab_size=96, seq_len=16, n_layers=2, d_model=32, n_heads=2, d_qk=16, d_v=16, d_ff=64)
needs_cuda = pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")


def trainer(loss_kernel="chunked", attention="auto"):
    return SimpleNamespace(loss_kernel=loss_kernel, attention=attention)


def test_loss_kernel_liger_takes_a_training_step_s_loss_and_nothing_else(monkeypatch):
    """Inside `kernels.training` the model's loss is the chosen kernel's; outside (evaluations) grow's chunked one."""
    from grow.model import chunked_cross_entropy

    calls = []
    monkeypatch.setattr(kernels, "liger_cross_entropy", lambda *a: calls.append(a[0].shape) or chunked_cross_entropy(*a))
    model = Transformer(CFG, generator=torch.Generator().manual_seed(0))
    idx = torch.randint(0, CFG.vocab_size, (2, CFG.seq_len), generator=torch.Generator().manual_seed(1))
    with kernels.training(trainer("liger")):
        _, loss = model(idx, idx)
        loss.backward()
    assert calls == [(2 * CFG.seq_len, CFG.d_model)]
    _, again = model(idx, idx)
    with kernels.training(trainer()):
        model(idx, idx)
    assert len(calls) == 1 and torch.equal(loss, again)


@pytest.mark.parametrize("name,first", [("cudnn", 3), ("flash", 1), ("efficient", 2)])
def test_attention_puts_its_backend_first_keeps_the_others_and_restores_torch_s_order(name, first):
    """SDPBackend's values: math 0, flash 1, efficient 2, cudnn 3 (the others stay, for shapes it cannot take)."""
    before = torch._C._get_sdp_priority_order()
    with kernels.training(trainer(attention=name)):
        order = torch._C._get_sdp_priority_order()
        assert order[0] == first and sorted(order[:4]) == [0, 1, 2, 3]
    assert torch._C._get_sdp_priority_order() == before
    with kernels.training(trainer()):
        assert torch._C._get_sdp_priority_order() == before


def test_liger_where_it_does_not_import_is_one_line_exit_2(tmp_path, monkeypatch):
    from tests.conftest import grow_cli

    monkeypatch.setattr(kernels, "liger_missing", lambda: "ModuleNotFoundError: No module named 'liger_kernel'")
    out = grow_cli("schedule", "trainer.loss_kernel=liger", cwd=tmp_path)
    assert out.returncode == 2 and out.stderr.count("\n") == 1, out.stderr
    assert "trainer.loss_kernel='liger'" in out.stderr and "allowed here: chunked" in out.stderr
    out = grow_cli("schedule", "trainer.attention=cudn", cwd=tmp_path)
    assert out.returncode == 2 and "trainer.attention='cudn'" in out.stderr and "cudnn" in out.stderr


# ---- on a GPU -------------------------------------------------------------------------------------------


def _loss_and_grads(loss_kernel: str, attention: str, seed: int = 0):
    cfg = CFG.replace(vocab_size=4096, seq_len=256, d_model=256, n_heads=4, d_qk=64, d_v=64, d_ff=1024, n_layers=2)
    model = Transformer(cfg, generator=torch.Generator().manual_seed(seed)).cuda()
    idx = torch.randint(0, cfg.vocab_size, (8, cfg.seq_len), generator=torch.Generator().manual_seed(1)).cuda()
    targets = idx.roll(-1, 1)
    targets[:, -3:] = -100
    with kernels.training(trainer(loss_kernel, attention)):
        with torch.autocast("cuda", dtype=torch.bfloat16):
            _, loss = model(idx, targets)
        loss.backward()
    return loss.detach().float(), {n: p.grad.float() for n, p in model.named_parameters()}


@pytest.mark.gpu
@needs_cuda
@pytest.mark.parametrize("loss_kernel,attention", [("liger", "auto"), ("chunked", "cudnn"), ("liger", "cudnn")])
def test_on_a_gpu_the_kernels_give_the_same_loss_and_gradients_to_bf16_rounding(loss_kernel, attention):
    """Against grow's chunked loss and torch's own attention order, bf16 autocast: the loss within 2e-3 relative
    (a few bf16 roundings of logits summed in float32), each gradient within 2e-2 of its largest entry."""
    if loss_kernel == "liger" and kernels.liger_missing():
        pytest.skip(kernels.liger_missing())
    want_loss, want = _loss_and_grads("chunked", "auto")
    loss, got = _loss_and_grads(loss_kernel, attention)
    assert abs(float(loss - want_loss)) <= 2e-3 * abs(float(want_loss))
    for n, g in want.items():
        assert float((got[n] - g).abs().max()) <= 2e-2 * float(g.abs().max().clamp_min(1e-30)), n
