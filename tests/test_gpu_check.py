"""`make gpu-check` (scripts/gpu_check.py): one line and exit 0 without a GPU; the same code on the CPU
with --allow-cpu writes every field; on a GPU (marker gpu) the real check and its targets."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest
import torch

from tests.conftest import ROOT

SCRIPT = str(ROOT / "scripts" / "gpu_check.py")


@pytest.mark.skipif(torch.cuda.is_available(), reason="checks the message of a machine without CUDA")
def test_without_cuda_it_says_so_in_one_line_and_exits_0(tmp_path):
    out = subprocess.run([sys.executable, SCRIPT], cwd=tmp_path, capture_output=True, text=True, timeout=120)
    assert out.returncode == 0 and out.stdout.strip().splitlines() == [
        "gpu-check: no CUDA device on this machine; nothing was checked"]
    assert not (tmp_path / "gpu_check.json").exists()


def test_the_check_runs_end_to_end_on_the_cpu_with_the_tiny_model(tmp_path):
    out = subprocess.run([sys.executable, SCRIPT, "--allow-cpu", "--model", "tiny", "--steps", "3", "--out",
                          str(tmp_path / "g.json"), "device=cpu"], cwd=tmp_path, capture_output=True, text=True,
                         timeout=300)
    assert out.returncode == 0, out.stderr[-3000:]
    r = json.loads((tmp_path / "g.json").read_text())
    stages = r["training"]["stages"]
    assert [s["stage"] for s in stages] == [1, 2, 3, 4]
    assert all(s["tokens_per_s"] > 0 and s["peak_gb_estimate"] > 0 for s in stages)
    assert len(r["training"]["zero_growth_deltas"]) == 3 and max(r["training"]["zero_growth_deltas"]) < 1e-5
    assert r["svd_growth"]["d_qk"][1] > r["svd_growth"]["d_qk"][0] and r["svd_growth"]["flops"] > 0
    assert set(r["targets"]) == {"mfu_final_stage", "zero_delta_bf16"}


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")
def test_on_a_gpu_the_targets_pass(tmp_path):
    out = subprocess.run([sys.executable, SCRIPT, "--out", str(tmp_path / "g.json")], cwd=tmp_path,
                         capture_output=True, text=True, timeout=900)
    assert out.returncode == 0, out.stderr[-3000:]
    r = json.loads((tmp_path / "g.json").read_text())
    assert r["targets"]["zero_delta_bf16"]["pass"]
    assert r["targets"]["mfu_final_stage"]["pass"], r["training"]["stages"][-1]


def _gpu_check_module():
    import importlib.util

    spec = importlib.util.spec_from_file_location("gpu_check", SCRIPT)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_random_tokens_give_the_uint16_rows_a_gpu_copy_reads_and_the_same_batches():
    """On CUDA the trainer reads `rows` (grow.device.DeviceBatches); the first H200 run failed there."""
    data = _gpu_check_module().RandomTokens(16384)
    rows = data.rows(3, 64, 4, 9)
    assert rows.dtype.name == "uint16" and rows.shape == (4, 10) and rows.max() < 16384
    x, y = data.batch(3, 64, 4, 9)
    assert torch.equal(x, torch.from_numpy(rows[:, :-1].astype("int64")))
    assert torch.equal(y, torch.from_numpy(rows[:, 1:].astype("int64")))


def test_a_failing_check_is_recorded_and_the_others_still_run(tmp_path, monkeypatch):
    g = _gpu_check_module()
    monkeypatch.setattr(g.torch.cuda, "is_available", lambda: False)
    monkeypatch.setattr(g, "check_training", lambda args, gpu: {"stages": [{"mfu": None}], "zero_growth_deltas": [0.0],
                                                               "device": "cpu"})
    monkeypatch.setattr(g, "check_svd", lambda args, gpu: (_ for _ in ()).throw(RuntimeError("devices differ")))
    monkeypatch.setattr(g, "print_table", lambda result: None)
    out = tmp_path / "g.json"
    assert g.main(["--allow-cpu", "--out", str(out)]) == 1
    r = json.loads(out.read_text())
    assert r["svd_growth"] == {"error": "RuntimeError: devices differ"}
    assert r["ddp"] == {"skipped": "no CUDA device"} and r["targets"]["zero_delta_bf16"]["pass"]
