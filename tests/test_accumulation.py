"""Gradient accumulation (trainer.micro_batch_size): a step over micro-batches is the whole batch's step.

float64 on CPU, the tiny model through the exponential schedule (growths included): the per-step
training losses, the validation losses and the final parameters of a run whose steps are split into
micro-batches equal the whole-batch run's to 1e-9 relative. The two-rank version is in
tests/test_distributed.py."""

from __future__ import annotations

import pytest
import torch
from hydra import compose, initialize_config_dir

from grow import device as device_mod
from grow import events
from grow import train as train_mod
from grow.config import CONFIG_DIR
from grow.metrics import read_metrics
from grow.run import load as load_run
from tests.conftest import TINY_RUN

RUN = [*TINY_RUN, "+schedule=exp", "precision=float64", "trainer.max_tokens=20000", "trainer.log_every=1",
       "trainer.recovery_steps=3"]


def run(tmp_path, name: str, *extra: str):
    with initialize_config_dir(str(CONFIG_DIR), version_base="1.3"):
        cfg = load_run(compose("train", overrides=[*RUN, *extra]))
    trainer = train_mod.Trainer(cfg, tmp_path / name)
    summary = trainer.run()
    return summary, read_metrics(tmp_path / name), trainer.model


def losses(records):
    return [(r["train/step"], k, r[k]) for r in records for k in sorted(r) if k.endswith("loss")]


@pytest.fixture(scope="module")
def whole_batch(tmp_path_factory):
    """(summary, records, model) of the run without micro-batches, the reference of every test here."""
    return run(tmp_path_factory.mktemp("accumulation"), "whole")


@pytest.mark.parametrize("micro", [4, 5], ids=["4-of-16", "uneven-5-of-16"])
def test_micro_batches_give_the_whole_batch_step(tmp_path, micro, whole_batch):
    whole, whole_records, whole_model = whole_batch
    split, split_records, split_model = run(tmp_path, "split", f"trainer.micro_batch_size={micro}")
    a, b = losses(whole_records), losses(split_records)
    assert len(a) == len(b) and len(a) > 40
    for (step, key, x), (step2, key2, y) in zip(a, b):
        assert (step, key) == (step2, key2)
        assert abs(x - y) <= 1e-9 * abs(x), (step, key, x, y)
    for (n, p), (_, q) in zip(whole_model.named_parameters(), split_model.named_parameters()):
        assert (p - q).abs().max() <= 1e-9 * p.abs().max(), n
    assert whole["tokens"] == split["tokens"] and whole["flops"] == split["flops"]


def test_a_micro_batch_larger_than_the_batch_is_the_whole_batch(tmp_path, whole_batch):
    _, a, _ = whole_batch
    _, b, _ = run(tmp_path, "b", "trainer.micro_batch_size=64")
    assert losses(a) == losses(b)  # bitwise: one pass, as without the key


def test_micro_batch_size_is_checked(tmp_path):
    with initialize_config_dir(str(CONFIG_DIR), version_base="1.3"):
        cfg = compose("train", overrides=[*RUN, "trainer.micro_batch_size=0"])
    with pytest.raises(ValueError, match=r"trainer.micro_batch_size=0: must be auto or a positive integer"):
        load_run(cfg)
    assert torch.get_num_threads() >= 1


def test_throughput_counts_training_steps_only(tmp_path, monkeypatch):
    """A fake clock: every trainer step takes 1 s, every evaluation 1000 s (observers of `grow.events` inside each
    span advance it). tokens/s at each log point is exactly one step's tokens per second: evaluations (every 3
    steps, recoveries, stage ends) and checkpoints stay out of the window."""
    clock = {"t": 0.0}
    monkeypatch.setattr(train_mod.time, "perf_counter", lambda: clock["t"])

    def tick(seconds):
        return lambda *_: clock.__setitem__("t", clock["t"] + seconds)

    with events.observing("stepped", tick(1.0)), events.observing("evaluated", tick(1000.0)):
        _, records, _ = run(tmp_path, "run", "trainer.eval_every=3", "trainer.log_every=2", "trainer.ckpt_every=4")
    rates = [r["train/tokens_per_s"] for r in records if "train/tokens_per_s" in r]
    assert len(rates) > 10
    tokens_per_step = 16 * 32  # trainer.batch_size x the tiny model's seq_len
    assert all(tps == tokens_per_step for tps in rates), rates


def test_uint16_token_ids_survive_the_int16_transfer_buffers():
    """The CUDA batch path carries uint16 ids as int16 bits: ids above 32767 come back unchanged."""
    import numpy as np

    ids = np.array([[0, 1, 32767, 32768, 50256, 65535]], dtype=np.uint16)
    bits = torch.from_numpy(ids.view(np.int16))
    assert device_mod.widen_uint16(bits).tolist() == ids.astype(np.int64).tolist()
