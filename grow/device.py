"""Where a run computes and how its batches get there: the device, the dtypes (parameters, autocast),
the GPU's dense bf16 peak for MFU, and the training stream's batches on the device (pinned, non-blocking
copies on CUDA)."""

from __future__ import annotations

import contextlib
from dataclasses import dataclass

import numpy as np
import torch

from grow import data as data_lib
from grow.config import RunConfig
from grow.parallel import distributed

# dense bf16 peak by device name, first match wins (so the PCIe / NVL H100 parts come before "H100": SXM)
PEAK_BF16_FLOPS = {"H200": 989e12, "H100 PCIe": 756e12, "H100 NVL": 835e12, "H100": 989e12, "A100": 312e12,
                   "L40S": 362e12, "A10": 125e12, "4090": 165e12}


def resolve_device(name: str) -> torch.device:
    if name == "auto":
        return torch.device("cuda" if torch.cuda.is_available() else "cpu")
    return torch.device(name)


def resolve_precision(name: str, device: torch.device) -> tuple[torch.dtype, torch.dtype | None]:
    """(parameter dtype, autocast dtype or None)."""
    if name == "auto":
        return (torch.float32, torch.bfloat16) if device.type == "cuda" else (torch.float32, None)
    if name == "bfloat16":
        return torch.float32, torch.bfloat16
    return (torch.float64 if name == "float64" else torch.float32), None


def autocast(device: torch.device, dtype: torch.dtype | None):
    if dtype is None:
        return contextlib.nullcontext()
    return torch.autocast(device_type=device.type, dtype=dtype)


@dataclass(frozen=True)
class Precision:
    """Where and in which dtypes the run computes: the device, the parameters' dtype, the autocast dtype."""

    device: torch.device
    param_dtype: torch.dtype
    amp: torch.dtype | None

    @classmethod
    def of(cls, cfg: RunConfig) -> "Precision":
        device = distributed.device(resolve_device(cfg.device))
        return cls(device, *resolve_precision(cfg.precision, device))

    def autocast(self):
        return autocast(self.device, self.amp)


def peak_flops(device: torch.device) -> float | None:
    """Dense bf16 peak of the GPU, from its name (None on CPU or an unknown GPU)."""
    if device.type != "cuda":
        return None
    name = torch.cuda.get_device_name(device)
    return next((v for k, v in PEAK_BF16_FLOPS.items() if k in name), None)


class DeviceBatches:
    """The training stream's batches on the device.

    On CUDA the uint16 rows (the token cache's dtype: a quarter of int64's bytes) go through two
    pinned host buffers, reused in turn (an event per buffer says when its last copy has left), are
    copied without blocking, and are widened to int64 on the device. Elsewhere: `TokenData.batch`."""

    def __init__(self, data, device: torch.device):
        self.data, self.device = data, device
        self.buffers: dict[tuple, list] = {}  # shape -> [pinned tensor, event or None] x 2
        self.turn = 0

    def get(self, seed: int, start: int, count: int, seq_len: int):
        if self.device.type != "cuda":
            return to_device(self.data.batch(seed, start, count, seq_len), self.device)
        rows = self.data.rows(seed, start, count, seq_len).view(np.int16)  # the same bits, a dtype torch copies
        slots = self.buffers.setdefault(rows.shape, [[torch.empty(rows.shape, dtype=torch.int16).pin_memory(), None]
                                                     for _ in range(2)])
        slot = slots[self.turn]
        self.turn ^= 1
        if slot[1] is not None:
            slot[1].synchronize()  # its previous copy to the device has finished
        slot[0].numpy()[...] = rows
        on_device = slot[0].to(self.device, non_blocking=True)
        slot[1] = torch.cuda.Event()
        slot[1].record()
        return data_lib.split_rows(widen_uint16(on_device))


def widen_uint16(bits: torch.Tensor) -> torch.Tensor:
    """uint16 values carried as int16 bits (what the pinned buffers hold) as int32 values 0..65535."""
    return bits.to(torch.int32).bitwise_and_(0xFFFF)


def to_device(batch, device: torch.device):
    x, y = batch
    if device.type == "cuda":
        return x.pin_memory().to(device, non_blocking=True), y.pin_memory().to(device, non_blocking=True)
    return x.to(device), y.to(device)
