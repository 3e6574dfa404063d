"""`make bench` (scripts/bench.py) and the trainer's fast path: the JSON's fields (never its timings),
and the deferred finiteness check that keeps host syncs out of a CUDA step (exercised on CPU)."""

from __future__ import annotations

import copy
import importlib.util
import json
import math
import subprocess
from pathlib import Path

import pytest
import torch
from hydra import compose, initialize_config_dir

import grow.steps as steps_mod
import grow.train as train_mod
from grow import checkpoint
from grow.checkpoint import NonFiniteLoss
from grow.config import CONFIG_DIR, RunConfig
from grow.provenance import SIMD_LEVELS
from grow.run import load as load_run
from tests.conftest import ROOT, TINY_DATA, TINY_RUN, assert_make_lists
from tests.helpers import poison, run_make

spec = importlib.util.spec_from_file_location("bench", ROOT / "scripts" / "bench.py")
bench = importlib.util.module_from_spec(spec)
spec.loader.exec_module(bench)


# ---- the JSON ------------------------------------------------------------------------------------------------


def test_make_bench_writes_every_field_on_cpu(tmp_path):
    """`make bench` (tests/test_make.py leaves this target to this file) on the tiny config, a few steps: exit 0
    (asserted by run_make), every promised field, typed; GPU figures null with a reason; one row per stage of the
    default schedule; every requested strategy."""
    out = tmp_path / "bench.json"
    proc = run_make("bench", args=["--model", "tiny", "--device", "cpu", "--steps", "2", "--warmup", "1",
                                   "--stage-steps", "1", "--opt-steps", "2", "--strategies", "zero,vt,svd",
                                   "--out", str(out), *TINY_DATA])
    r = json.loads(out.read_text())
    assert bench.check_schema(r) == []
    assert r["device"]["type"] == "cpu" and r["config"]["model"] == "tiny" and not r["config"]["compile"]
    cpu = r["device"]["cpu"]  # what the CPU figures depend on: model, SIMD level, torch's kernels
    assert cpu["torch_capability"] == torch.backends.cpu.get_cpu_capability() and cpu["model"]
    if Path("/proc/cpuinfo").exists():
        flags = set(next(ln for ln in Path("/proc/cpuinfo").read_text().splitlines()
                         if ln.startswith(("flags", "Features"))).split(":", 1)[1].split())
        assert cpu["simd"] in flags and cpu["fma"] == ("fma" in flags)
        assert not any(s in flags for s in SIMD_LEVELS[:SIMD_LEVELS.index(cpu["simd"])])
    assert len(r["step"]["samples"]["grow"]) == len(r["step"]["samples"]["plain"]) == 2
    assert [s["stage"] for s in r["stages"]] == [0, 1, 2, 3]
    assert all(s["mfu"] is None for s in r["stages"])
    assert r["mfu"]["reason"] == "no CUDA device" and r["targets"]["mfu_final_stage"]["reason"] == "no CUDA device"
    assert set(r["growth"]["strategies"]) == {"zero", "vt", "svd"}
    svd = r["growth"]["strategies"]["svd"]
    assert [g["stage"] for g in svd["growths"]] == [1, 2, 3] and svd["stats_s"] > 0
    assert r["growth"]["strategies"]["zero"]["stats_s"] is None
    vt = r["growth"]["strategies"]["vt"]  # the default schedule as it is (heads 1 -> 2: vt's lone new head)
    assert [g["stage"] for g in vt["growths"]] == [1, 2, 3] and "schedule_overrides" not in vt
    assert set(r["targets"]) == set(bench.TARGETS) | {f"growth_share/{n}" for n in ("zero", "vt", "svd")}
    assert r["targets"]["optimizer_several_stages"]["value"] == r["optimizer"]["several_stages"]["ratio"]
    assert r["targets"]["growth_share/svd"]["value"] == svd["run_fraction"]
    for name, t in r["targets"].items():
        if t["value"] is not None:
            assert t["pass"] == (t["value"] <= t["limit"] if t["op"] == "<=" else t["value"] >= t["limit"]), name
    assert r["svd_stats_tiny"]["fraction"] == r["targets"]["svd_stats_tiny"]["value"]
    assert "wrote" in proc.stdout and "targets" in proc.stdout


def filled(kind: str):
    return {"num": 1.5, "int": 2, "str": "x", "bool": True, "list": [], "dict": {}}[kind.rstrip("?")]


def minimal_result() -> dict:
    """A result with every schema field set to a value of its kind (no stages, strategies yet)."""
    r: dict = {}
    for path, kind in bench.SCHEMA_FIELDS:
        node = r
        *parents, leaf = path.split(".")
        for key in parents:
            node = node.setdefault(key, {})
        if leaf not in node:  # a parent path ("stages") may already hold children
            node[leaf] = filled(kind)
    r["schema"] = bench.SCHEMA
    r["stages"] = [{k: filled(t) for k, t in bench.STAGE_FIELDS}]
    growth = {k: filled(t) for k, t in bench.GROWTH_FIELDS}
    r["growth"]["strategies"] = {"zero": {**{k: filled(t) for k, t in bench.STRATEGY_FIELDS}, "growths": [growth]},
                                 "vt": {"skipped": "strategy='vt': ..."}}
    r["svd_stats_tiny"] = {k: filled(t) for k, t in bench.TINY_FIELDS}
    r["targets"]["growth_share/zero"] = dict(r["targets"]["growth_fraction"])
    for t in r["targets"].values():
        t["reason"] = None
    return r


def test_check_schema_accepts_a_complete_result_and_names_what_is_wrong():
    r = minimal_result()
    assert bench.check_schema(r) == []
    cases = [
        (lambda x: x["step"].pop("overhead"), "step.overhead: missing"),
        (lambda x: x["optimizer"]["one_stage"].update(ratio=float("nan")), "optimizer.one_stage.ratio"),
        (lambda x: x["stages"][0].pop("tokens_per_s"), "stages[0].tokens_per_s: missing"),
        (lambda x: x["growth"]["strategies"]["zero"]["growths"][0].pop("seconds"),
         "growth.strategies.zero.growths[0].seconds: missing"),
        (lambda x: x["targets"]["mfu_final_stage"].update(value=None, **{"pass": None}),
         "targets.mfu_final_stage: null value without a reason"),
        (lambda x: x["targets"]["framework_overhead"].update(**{"pass": None}), "pass must be null exactly"),
        (lambda x: x["mfu"].update(final_stage=None, reason=None), "mfu: null final_stage without a reason"),
        (lambda x: x.update(stages=[]), "stages: empty"),
        (lambda x: x["config"].update(batch_size=True), "config.batch_size: True is not int"),
        (lambda x: x.update(schema="other/1"), "schema: 'other/1'"),
        (lambda x: x["targets"].pop("growth_share/zero"), "targets.growth_share/zero: missing"),
        (lambda x: x["targets"]["growth_share/zero"].pop("limit"), "targets.growth_share/zero.limit: missing"),
        (lambda x: x["targets"].update(bogus=x["targets"]["growth_fraction"]), "targets.bogus: not a target"),
    ]
    for mutate, expected in cases:
        bad = copy.deepcopy(r)
        mutate(bad)
        errors = bench.check_schema(bad)
        assert any(expected in e for e in errors), (expected, errors)


def test_targets_compare_each_figure_with_its_limit():
    assert bench.target("framework_overhead", 0.02)["pass"] is True
    assert bench.target("framework_overhead", 0.031)["pass"] is False
    assert bench.target("mfu_final_stage", 0.46)["pass"] is True
    assert bench.target("mfu_final_stage", 0.44)["pass"] is False
    assert bench.target("optimizer_several_stages", 1.31)["pass"] is False
    assert bench.target("growth_share/svd", 0.009)["pass"] is True and bench.target("growth_share/svd", 0.011)["pass"] is False
    t = bench.target("mfu_final_stage", None, reason="no CUDA device")
    assert t["pass"] is None and t["reason"] == "no CUDA device"


def test_the_verdict_says_the_exit_status_it_gives():
    """#65: `make bench` printed FAIL and exited 0; now the lines say what the status is, 1 only with --strict."""
    met, miss = bench.target("framework_overhead", 0.02), bench.target("framework_overhead", 0.05)
    assert bench.verdict({"framework_overhead": met}, strict=True) == (["every target met (1 checked)"], 0)
    lines, status = bench.verdict({"framework_overhead": miss, "x": met}, strict=False)
    assert status == 0 and lines[0].startswith("missed framework_overhead: 0.05 (target <= 0.03")
    assert lines[-1].startswith("1 target(s) missed: exit status 0 all the same") and "--strict" in lines[-1]
    assert not any("FAIL" in ln for ln in lines)
    lines, status = bench.verdict({"framework_overhead": miss}, strict=True)
    assert status == 1 and lines[-1] == "1 target(s) missed: exit status 1 (--strict)"


def test_the_plain_optimizer_matches_the_growth_aware_one_without_growth():
    """The plain loop's reference (torch AdamW, decay on matrices only) takes the same step as the
    growth-aware AdamW: the optimizer comparison times the same update (float64, 1e-12)."""
    from grow.model import Transformer, TransformerConfig
    from grow.optim import build_optimizer

    cfg = compose_cfg()
    model = Transformer(TransformerConfig(vocab_size=64, seq_len=8, n_layers=1, d_model=8, n_heads=2, d_qk=4, d_v=4,
                                          d_ff=16), generator=torch.Generator().manual_seed(0)).double()
    twin = copy.deepcopy(model)
    ours, theirs = build_optimizer(model, cfg.optim), bench.torch_adamw(list(twin.named_parameters()), cfg.optim,
                                                                       "foreach")
    for k in range(3):
        bench.random_grads(model.parameters(), k)
        bench.random_grads(twin.parameters(), k)
        ours.step()
        theirs.step()
    for (n, p), q in zip(model.named_parameters(), twin.parameters()):
        assert torch.allclose(p, q, rtol=0, atol=1e-12), n


# ---- the deferred finiteness check (the CUDA path, run on CPU) -------------------------------------------------


def compose_cfg(*overrides) -> RunConfig:
    with initialize_config_dir(str(CONFIG_DIR), version_base="1.3"):
        cfg = compose("train", overrides=list(overrides))
    return load_run(cfg)


BASE = [*TINY_RUN, "trainer.max_tokens=12000", "trainer.ckpt_every=5", "trainer.keep_checkpoints=2"]



@pytest.fixture
def deferred(monkeypatch):
    """The CUDA policy on CPU: a step's verdict is read one step later or at the next flush point."""
    seen = []

    def policy(device, cfg):
        seen.append(True)
        return int(cfg.trainer.skip_nonfinite) == 0

    monkeypatch.setattr(steps_mod, "defer_finite_checks", policy)
    return seen


def metrics(run_dir):
    return [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines()]


def test_deferred_check_runs_the_same_steps(tmp_path, deferred):
    """With nothing non-finite, deferring the check changes no loss, no step, no checkpoint."""
    timing = ("seconds", "tokens_per_s", "mfu")
    strip = lambda recs: [{k: v for k, v in r.items() if not any(t in k for t in timing)} for r in recs]
    a = train_mod.train(compose_cfg(*BASE), tmp_path / "deferred")
    assert deferred
    deferred.clear()
    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(steps_mod, "defer_finite_checks", lambda device, cfg: False)
        b = train_mod.train(compose_cfg(*BASE), tmp_path / "immediate")
    assert not deferred and a["final_val_loss"] == b["final_val_loss"]
    assert strip(metrics(tmp_path / "deferred")) == strip(metrics(tmp_path / "immediate"))


def test_deferred_check_stops_before_the_next_log_line_or_checkpoint(tmp_path, deferred):
    run_dir = tmp_path / "run"  # step 13's NaN is found one step later (step 14), before step 15's log line and checkpoint
    with poison({13}), pytest.raises(NonFiniteLoss) as info:
        train_mod.train(compose_cfg(*BASE), run_dir)
    assert "non-finite loss (nan) or gradient norm (nan) at step 13 (stage 1/1, step 13 of" in str(info.value)
    assert checkpoint.latest(run_dir)["step"] == 10
    assert all(r["train/step"] < 13 for r in metrics(run_dir) if "train/loss" in r)


def test_deferred_check_is_read_before_a_checkpoint(tmp_path, deferred):
    """No log point near: the checkpoint of step 10 reads step 10's verdict first and is not written."""
    run_dir = tmp_path / "run"
    with poison({10}), pytest.raises(NonFiniteLoss, match=r"at step 10 \(stage 1/1, step 10 of"):
        train_mod.train(compose_cfg(*BASE, "trainer.log_every=1000"), run_dir)
    meta = checkpoint.latest(run_dir)
    assert meta["step"] == 5
    payload = checkpoint.load(meta)
    assert all(torch.isfinite(t).all() for t in payload["model"].values() if isinstance(t, torch.Tensor))


def test_skipping_bad_steps_still_checks_each_step_at_once(tmp_path, deferred):
    with poison({7}):
        summary = train_mod.train(compose_cfg(*BASE, "trainer.skip_nonfinite=1"), tmp_path / "a")
    assert summary["state"]["skipped_nonfinite"] == 1 and math.isfinite(summary["final_val_loss"])
    assert [r["train/step"] for r in metrics(tmp_path / "a") if "train/skipped_nonfinite" in r] == [7]


def test_make_bench_runs_the_bench_script_with_its_args(tmp_path):
    """``make -n bench ARGS=...`` (what make would run, nothing run; an existing install stamp) calls
    scripts/bench.py with ARGS."""
    (tmp_path / "stamp").write_text("")
    out = subprocess.run(["make", "-n", "-C", str(ROOT), "bench", "ARGS=--model tiny --strict",
                          f"STAMP={tmp_path / 'stamp'}"], capture_output=True, text=True, check=True)
    (line,) = [ln for ln in out.stdout.splitlines() if "scripts/bench.py" in ln]
    assert line.split()[-4:] == ["scripts/bench.py", "--model", "tiny", "--strict"], line
    assert_make_lists("bench")


def test_a_strategy_declaring_its_sources_plan_is_judged_on_it_and_says_so():
    """ligo declares the training its source runs after a growth (`Strategy.reference_training_steps`: 400,000
    steps after a 100-step operator, VITA-Group/LiGO's README): its growth share is judged on the default run's
    stages scaled to that, with a note naming the plan and the default run's share; zero on the default run."""
    from grow.growth import get_strategy

    reference_share = bench.reference_share

    stages = [{"steps": 60, "step_s": 0.01}, {"steps": 100, "step_s": 0.04}]
    growths = [{"seconds": 5.0, "stats_seconds": None}]
    assert reference_share(get_strategy("zero"), stages, growths) is None
    ref = reference_share(get_strategy("ligo"), stages, growths)
    assert ref["scale"] == 4000.0 and ref["last_stage_steps"] == 400_000
    assert ref["run_fraction"] == pytest.approx(5.0 / (4000 * (60 * 0.01 + 100 * 0.04) + 5.0), rel=1e-12)
    default = 5.0 / (60 * 0.01 + 100 * 0.04 + 5.0)  # 52%: a 100-step operator against a 160-step run
    s = {"run_fraction": default, "reference_plan": ref}
    t = bench.share_target("ligo", s)
    assert t["value"] == ref["run_fraction"] and t["pass"] is True
    assert "400,000" in t["note"] and f"{100 * default:.1f}%" in t["note"]
    assert bench.share_target("zero", {"run_fraction": default, "reference_plan": None})["pass"] is False
