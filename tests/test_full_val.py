"""trainer.full_val (issue 43): at the end of a run, the final model's loss over every window of the whole held-out
split, beside the sampled final_val_loss, its forward FLOPs counted apart from the training FLOPs."""

from __future__ import annotations

import numpy as np
import pytest
import torch
import torch.nn.functional as F

from grow import data as data_lib
from grow import train as train_mod
from grow.plan import training_flops
from grow.report import build_report
from grow.runs import find_checkpoint, load_model
from tests.conftest import TINY_RUN, run_config
from tests.helpers import expect_refusal

RUN = [*TINY_RUN, "trainer.max_tokens=2048", "precision=float64"]


def test_the_full_split_loss_is_every_window_of_the_held_out_split(tmp_path):
    """full_val_loss: the final checkpoint's mean cross-entropy over the held-out split cut into consecutive
    seq_len windows (the shards joined, the last partial window dropped), recomputed here from the whole
    logits in float64 (to 1e-12); full_val_flops: those tokens times 2 N_matmul + 2 N s E (k + v); the training
    FLOPs are the plan's, without them; the report gives it beside the sampled loss, per run and per arm.
    trainer.full_val=false: nulls."""
    cfg = run_config(*RUN)
    summary = train_mod.train(cfg, tmp_path / "on")
    model, _ = load_model(find_checkpoint(tmp_path / "on"))
    c = model.config
    val = data_lib.load(cfg.data, c.seq_len, log=lambda *a, **k: None).val
    ids = torch.from_numpy(np.concatenate([np.asarray(a, dtype=np.int64) for a in val]))
    n = (len(ids) - 1) // c.seq_len
    x, y = ids[: n * c.seq_len].view(n, c.seq_len), ids[1 : n * c.seq_len + 1].view(n, c.seq_len)
    with torch.no_grad():
        model.double()
        logits = torch.cat([model(xb) for xb in x.split(7)])  # the whole logits, not the chunked loss
    want = F.cross_entropy(logits.reshape(-1, c.vocab_size).double(), y.reshape(-1), reduction="mean").item()
    assert summary["full_val_tokens"] == n * c.seq_len > cfg.trainer.eval_batches * cfg.trainer.eval_batch_size * c.seq_len
    assert summary["full_val_loss"] == pytest.approx(want, rel=1e-12, abs=0)
    attention = c.n_layers * c.seq_len * c.n_heads * (c.d_qk + c.d_v)
    assert summary["full_val_flops"] == n * c.seq_len * (2 * c.matmul_params() + 2 * attention)
    assert summary["flops"] == summary["train_flops"] == training_flops(c, summary["tokens"])
    build_report([tmp_path / "on"], tmp_path / "report", show=False)
    md = (tmp_path / "report" / "report.md").read_text()
    row = next(line for line in md.splitlines() if line.startswith("| baseline | 0 | `on` |"))  # the runs' table
    assert f"| {summary['final_val_loss']:.4f} | {summary['full_val_loss']:.4f} |" in row
    assert "| arm | FLOPs | final val loss | full-split val loss |" in md  # beside the sampled one
    off = train_mod.train(run_config(*RUN, "trainer.full_val=false"), tmp_path / "off")
    assert off["full_val_loss"] is off["full_val_tokens"] is off["full_val_flops"] is None
    assert off["final_val_loss"] == summary["final_val_loss"]  # the sampled loss as before


def test_a_bad_full_val_is_refused(capsys, tmp_path):
    expect_refusal(["train", *TINY_RUN, "trainer.full_val=sometimes"], "trainer.full_val='sometimes': must be true or false",
                   capsys, tmp_path)


def test_the_decay_phase_training_loss_is_the_mean_of_the_logged_losses_there(tmp_path):
    """decay_train_loss (issue 60's second endpoint): under optim.schedule=wsd, the mean of the train/loss records
    logged after 1 − decay_fraction of trainer.max_tokens (each a batch not trained on yet), and their count; None
    under another schedule."""
    import json

    summary = train_mod.train(run_config(*RUN, "trainer.max_tokens=8192", "trainer.log_every=1", "optim.schedule=wsd",
                                         "optim.decay_fraction=0.25", "trainer.full_val=false"), tmp_path / "wsd")
    recs = [json.loads(line) for line in (tmp_path / "wsd" / "metrics.jsonl").read_text().splitlines()]
    losses = [r["train/loss"] for r in recs if "train/loss" in r and r["train/tokens"] > 0.75 * 8192]
    assert 1 < len(losses) < len([r for r in recs if "train/loss" in r])
    assert summary["decay_train_losses"] == len(losses)
    assert summary["decay_train_loss"] == pytest.approx(sum(losses) / len(losses), rel=1e-12)
    other = train_mod.train(run_config(*RUN, "optim.schedule=cosine", "trainer.full_val=false"), tmp_path / "cos")
    assert other["decay_train_loss"] is None and other["decay_train_losses"] == 0
