"""The kernels a run's training steps use, where there is a choice (docs/model.md, "The model" "The model", "The
loss"): the loss (`trainer.loss_kernel`: grow's chunked linear cross-entropy, or liger-kernel's fused one,
the optional ``gpu`` extra) and the attention backend of torch's SDPA (`trainer.attention`: torch's own
order, or one backend first). What they compute is the same to bf16 rounding; `make gpu-check` measures
which is faster. `training` is the context `grow.steps.Stepper` runs each forward and backward in.
"""

from __future__ import annotations

import contextlib

import torch

from grow import model
from grow.errors import ConfigError

LOSS_KERNELS = ("chunked", "liger")
ATTENTION_BACKENDS = ("auto", "cudnn", "flash", "efficient")  # auto: torch's own priority order


def check(run) -> None:
    """``trainer.loss_kernel=liger`` needs liger-kernel (and so Triton): one line naming the key, before work starts."""
    if run.trainer.loss_kernel == "liger":
        why = liger_missing()
        if why:
            raise ConfigError("trainer.loss_kernel", "liger", f"allowed here: chunked (liger_kernel does not import: "
                                                              f"{why}; pip install -e '.[gpu]' on a CUDA machine)")


def liger_missing() -> str | None:
    """Why liger-kernel's fused linear cross-entropy does not import here, or None."""
    try:
        from liger_kernel.transformers import LigerFusedLinearCrossEntropyLoss  # noqa: F401
    except Exception as exc:  # noqa: BLE001 - an ImportError, or Triton failing inside its import
        return f"{type(exc).__name__}: {str(exc)[:120]}"
    return None


def liger_cross_entropy(x: torch.Tensor, weight: torch.Tensor, targets: torch.Tensor, mult: float = 1.0):
    """`grow.model.linear_cross_entropy`'s value by liger-kernel's fused kernel: mean CE of ``mult * x W^T``
    (the multiplier on x: the same logits), in the dtype a matmul runs in here (autocast's)."""
    from liger_kernel.transformers import LigerFusedLinearCrossEntropyLoss

    dtype = model._compute_dtype(x, weight)
    x = x if mult == 1.0 else x * mult
    loss = LigerFusedLinearCrossEntropyLoss(ignore_index=model.IGNORE_INDEX, accum_dtype=torch.float32)  # dW in float32, as grow's
    return loss(weight.to(dtype), x.to(dtype), targets)


def _attention(name: str):
    """SDPA's backends with ``name``'s first, all kept (a shape it cannot take falls to the next)."""
    if name == "auto":
        return contextlib.nullcontext()
    from torch.nn.attention import SDPBackend, sdpa_kernel

    first = {"cudnn": SDPBackend.CUDNN_ATTENTION, "flash": SDPBackend.FLASH_ATTENTION,
             "efficient": SDPBackend.EFFICIENT_ATTENTION}[name]
    rest = [b for b in (SDPBackend.FLASH_ATTENTION, SDPBackend.EFFICIENT_ATTENTION, SDPBackend.CUDNN_ATTENTION,
                        SDPBackend.MATH) if b != first]
    return sdpa_kernel([first, *rest], set_priority=True)


@contextlib.contextmanager
def training(trainer):
    """A training step's forward and backward under ``trainer``'s (the ``trainer:`` config's) kernels."""
    with _attention(trainer.attention):
        if trainer.loss_kernel == "chunked":
            yield
            return
        model.LOSS_OVERRIDE.append(liger_cross_entropy)
        try:
            yield
        finally:
            model.LOSS_OVERRIDE.pop()
