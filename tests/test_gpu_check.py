"""`make gpu-check` (scripts/gpu_check.py): one line and exit 0 without a GPU; the same code on the CPU
with --allow-cpu, through make, writes every field; on a GPU (marker gpu) the real check and its targets."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest
import torch

from tests.conftest import ROOT
from tests.helpers import run_make

SCRIPT = str(ROOT / "scripts" / "gpu_check.py")


@pytest.mark.skipif(torch.cuda.is_available(), reason="checks the message of a machine without CUDA")
def test_without_cuda_it_says_so_in_one_line_and_exits_0(tmp_path, monkeypatch, capsys):
    """The script's main in-process (its return value is the exit status: ``sys.exit(main())``)."""
    monkeypatch.chdir(tmp_path)
    assert _gpu_check_module().main([]) == 0
    out = capsys.readouterr()
    assert out.out.strip().splitlines() == ["gpu-check: no CUDA device on this machine; nothing was checked"]
    assert not out.err and not (tmp_path / "gpu_check.json").exists()


def test_make_gpu_check_runs_end_to_end_on_the_cpu_with_the_tiny_model(tmp_path):
    """`make gpu-check` with --allow-cpu (tests/test_make.py leaves this target to this file): exit 0 (asserted by
    run_make), the default checks in their order and then the three named only on demand, every field of
    gpu_check.json."""
    g = _gpu_check_module()
    checks = [*g.DEFAULT_CHECKS, "svd_growth", "ddp", "fsdp_growth"]
    run_make("gpu-check", args=["--allow-cpu", "--model", "tiny", "--llama-model", "llama-tiny", "--steps", "3",
                                "--opt-steps", "3", "--out", str(tmp_path / "g.json"), "--checks", ",".join(checks), "device=cpu"])
    r = json.loads((tmp_path / "g.json").read_text())
    assert list(r["check_seconds"]) == checks
    tests = r["gpu_tests"]  # the suite's GPU tests, all skipped without CUDA: nothing says the kernel passed
    assert tests["returncode"] == 0 and tests["failed"] == 0 and tests["skipped"] >= 10 and tests["passed"] == 0
    assert any("test_triton_adamw" in t and "on_a_gpu" in t for t in tests["tests"]) and tests["kernel_passed"] is None
    kernels = r["kernels"]  # on the CPU only the default pair runs; the training checks then ran with it
    assert [(v["loss_kernel"], v["attention"]) for v in kernels["variants"]] == [("chunked", "auto")]
    assert kernels["variants"][0]["speed_over_default"] == 1.0 and kernels["variants"][0]["tokens_per_s"] > 0
    assert set(kernels["skipped"]) == {"liger", "cudnn"} and kernels["applied"] == ["trainer.loss_kernel=chunked",
                                                                                   "trainer.attention=auto"]
    for plan, activation in (("training", "gelu"), ("training_llama", "swiglu")):
        stages = r[plan]["stages"]
        assert r[plan]["model"]["activation"] == activation
        assert [s["stage"] for s in stages] == [1, 2, 3, 4]
        assert all(s["tokens_per_s"] > 0 and s["peak_gb_estimate"] > 0 for s in stages)
        assert len(r[plan]["zero_growth_deltas"]) == 3 and max(r[plan]["zero_growth_deltas"]) < 1e-5
        shares = r[plan]["growth_share"]
        assert len(shares["shares"]) == 3 and all(0 < x < 1 for x in shares["shares"])
        assert shares["plan_wall_seconds"] == pytest.approx(shares["plan_train_seconds"] + sum(shares["growth_seconds"]))
        assert r[plan]["memory_ratios"] == [None] * 4  # nothing measured without CUDA
    assert r["svd_growth"]["d_qk"][1] > r["svd_growth"]["d_qk"][0] and r["svd_growth"]["flops"] > 0
    svd = r["svd_llama"]
    assert svd["d_qk"][1] > svd["d_qk"][0] and svd["model"]["positions"] == "rope"
    assert svd["phases"]["stats"] > 0 and svd["phases"]["linesearch"] > 0 and svd["phases"]["top"]
    assert svd["phases"]["other"] == pytest.approx(svd["seconds"] - svd["phases"]["stats"] - svd["phases"]["linesearch"])
    several = r["optimizer"]["several_stages"]
    assert several["ratio"] > 0 and several["mixed_fraction"] > 0 and several["stages"] == 4
    assert r["optimizer"]["one_pass_route"] == "cpu: native" and r["optimizer"]["steps"] == 3 and set(several["routes"]) == {"native"}
    profile = r["profile"]
    assert profile["steps"] == 3 and profile["top"] and (tmp_path / profile["table"]).read_text().strip()
    assert profile["trace"] is None or 0 < (tmp_path / profile["trace"]).stat().st_size <= 16 << 20
    assert "no CUDA device" in r["liger"]["skipped"] and r["ddp"] == {"skipped": "no CUDA device"}
    assert set(r["targets"]) == {"mfu_final_stage", "zero_delta_bf16", "zero_delta_bf16_llama", "optimizer_several_stages",
                                 "memory_plan", "memory_plan_llama", "svd_llama_seconds", "growth_share",
                                 "fsdp_sharded_vs_host", "gpu_tests", "optimizer_route"}
    fsdp_run = r["fsdp_growth"]  # one gloo rank, float32: the two ways of growing give the same losses
    assert [len(fsdp_run[p]["growths"]) for p in ("sharded", "host")] == [3, 3]
    assert all(g["growth/seconds_gather"] >= 0 and g["growth/seconds_grow"] > 0 for g in fsdp_run["sharded"]["growths"])
    assert fsdp_run["final_loss_difference"] < 1e-5 and r["targets"]["fsdp_sharded_vs_host"]["pass"]
    assert r["targets"]["mfu_final_stage"]["pass"] is None and r["targets"]["memory_plan"]["pass"] is None
    assert r["targets"]["gpu_tests"]["pass"] is None and r["targets"]["optimizer_route"]["pass"] is None
    assert r["targets"]["svd_llama_seconds"]["value"] == svd["seconds"]
    assert r["targets"]["growth_share"]["value"] == max(r["training"]["growth_share"]["shares"])


def test_the_memory_plan_target_is_over_and_within_ten_percent():
    g = _gpu_check_module()
    assert g.in_range([1.0, 1.1, 1.05]) is True
    assert g.in_range([1.0, 1.11]) is False and g.in_range([0.99, 1.05]) is False  # under: not safe
    assert g.in_range([1.05, None]) is None and g.in_range([]) is None


def test_each_growth_s_share_is_of_the_whole_plan_at_the_measured_speeds():
    """The plan's own steps at the tokens/s the short run measured, plus the growths."""
    from types import SimpleNamespace

    g = _gpu_check_module()
    cfg = SimpleNamespace(seq_len=10)
    plan = [SimpleNamespace(steps=100, batch_size=2, cfg=cfg), SimpleNamespace(steps=300, batch_size=4, cfg=cfg)]
    out = g.growth_shares(plan, [{"stage": 1, "tokens_per_s": 1000.0}, {"stage": 2, "tokens_per_s": 400.0}], [1.0])
    assert out["plan_train_seconds"] == pytest.approx(100 * 20 / 1000 + 300 * 40 / 400)  # 2 + 30 s
    assert out["shares"] == [pytest.approx(1.0 / 33.0)]
    assert g.growth_shares(plan, [{"stage": 1, "tokens_per_s": None}, {"stage": 2}], [1.0])["shares"] is None


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")
def test_on_a_gpu_the_targets_pass(tmp_path):
    out = subprocess.run([sys.executable, SCRIPT, "--out", str(tmp_path / "g.json")], cwd=tmp_path,
                         capture_output=True, text=True, timeout=900)
    assert out.returncode == 0, out.stderr[-3000:]
    r = json.loads((tmp_path / "g.json").read_text())
    failed = {name: t for name, t in r["targets"].items() if t["pass"] is not True}
    assert not failed, failed


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
    """The default checks in `DEFAULT_CHECKS`' order; one that raises is recorded, the exit status is 1; the
    kernel pair the kernels check found fastest reaches the training checks' overrides; a failed GPU test and a
    grown tensor updated off the Triton route fail their targets."""
    g = _gpu_check_module()
    monkeypatch.setattr(g.torch.cuda, "is_available", lambda: True)
    trained = []
    monkeypatch.setattr(g, "check_training", lambda args, gpu, *extra: trained.append(list(args.overrides)) or {
        "stages": [{"mfu": None}], "zero_growth_deltas": [0.0], "device": "cpu", "memory_ratios": [None],
        "growth_share": {"shares": [0.001]}})
    monkeypatch.setattr(g, "check_svd", lambda args, gpu, *extra, phases=False: (_ for _ in ()).throw(RuntimeError("devices differ")))
    monkeypatch.setattr(g, "check_optimizer", lambda model, gpu, steps: {"several_stages": {
        "ratio": 1.2, "routes": {"triton": 40, "torch.compile": 2}}})
    monkeypatch.setattr(g, "check_profile", lambda run, out: {"steps": 3})
    monkeypatch.setattr(g, "check_gpu_tests", lambda: {"passed": 30, "failed": 1, "skipped": 0, "kernel_passed": True})
    monkeypatch.setattr(g, "check_kernels", lambda run: {"best": {"loss_kernel": "liger", "attention": "cudnn"}})
    monkeypatch.setattr(g, "check_liger", lambda gpu: {"skipped": "test"})
    monkeypatch.setattr(g, "check_fsdp_growth", lambda args, gpu: {"final_loss_difference": 1e-4})
    monkeypatch.setattr(g, "print_table", lambda result: None)
    out = tmp_path / "g.json"
    assert g.main(["--out", str(out)]) == 1
    r = json.loads(out.read_text())
    assert list(r["check_seconds"]) == list(g.DEFAULT_CHECKS) == [
        "gpu_tests", "optimizer", "kernels", "training", "training_llama", "profile", "liger", "svd_llama"]
    assert trained == [["trainer.loss_kernel=liger", "trainer.attention=cudnn"]] * 2
    assert r["svd_llama"] == {"error": "RuntimeError: devices differ"} and r["targets"]["zero_delta_bf16"]["pass"]
    assert r["targets"]["svd_llama_seconds"] == {"value": None, "limit": 5.0, "op": "<=", "pass": None}
    assert r["targets"]["optimizer_several_stages"]["pass"] and r["targets"]["growth_share"]["pass"]
    assert r["targets"]["gpu_tests"]["pass"] is False and r["targets"]["optimizer_route"]["pass"] is False
    monkeypatch.setattr(g.torch.cuda, "is_available", lambda: False)
    assert g.main(["--allow-cpu", "--out", str(out), "--checks", "ddp,fsdp_growth"]) == 0
    r = json.loads(out.read_text())
    assert r["ddp"] == {"skipped": "no CUDA device"}
    assert r["targets"]["fsdp_sharded_vs_host"] == {"value": 1e-4, "limit": 2e-3, "op": "<=", "pass": True}


def test_checks_picks_what_a_window_runs(tmp_path, monkeypatch, capsys):
    """``--checks`` runs only the checks named (the rest of a window's gpu-check: their targets null), in the order
    given; a name that is not a check ends in one line naming the nearest, exit 2, nothing run."""
    g = _gpu_check_module()
    monkeypatch.setattr(g.torch.cuda, "is_available", lambda: False)
    ran = []
    monkeypatch.setattr(g, "check_fsdp_growth", lambda args, gpu: ran.append("fsdp") or {"final_loss_difference": 1e-4})
    monkeypatch.setattr(g, "check_optimizer", lambda model, gpu, steps: ran.append("optimizer") or {"several_stages": {"ratio": 1.1}})
    monkeypatch.setattr(g, "check_training", lambda *a, **k: ran.append("training"))
    out = tmp_path / "g.json"
    assert g.main(["--allow-cpu", "--out", str(out), "--checks", "fsdp_growth,optimizer"]) == 0
    r = json.loads(out.read_text())
    assert ran == ["fsdp", "optimizer"] and list(r["check_seconds"]) == ["fsdp_growth", "optimizer"]
    assert r["targets"]["fsdp_sharded_vs_host"]["pass"] and r["targets"]["mfu_final_stage"]["pass"] is None
    ran.clear()
    assert g.main(["--allow-cpu", "--out", str(out), "--checks", "optimizer,fsdp_growth", "--deadline", "0"]) == 0
    r = json.loads(out.read_text())  # past the deadline: nothing starts, each says so, the targets are still written
    assert ran == [] and r["optimizer"] == {"skipped": "--deadline 0 s had passed"} == r["fsdp_growth"]
    assert r["targets"]["optimizer_several_stages"]["pass"] is None
    ran.extend(["fsdp", "optimizer"])
    capsys.readouterr()
    assert g.main(["--allow-cpu", "--out", str(tmp_path / "h.json"), "--checks", "fsdp_grwth"]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "--checks fsdp_grwth" in err and "nearest: fsdp_growth" in err
    assert ran == ["fsdp", "optimizer"] and not (tmp_path / "h.json").exists()
