"""Checkpoints and resume (docs/distributed.md): same losses as a run never stopped, SIGTERM/SIGINT,
refusals, NaN.

Most runs are in-process (`grow.train.train` on a composed config: ~1 s each on tiny settings); the
SIGTERM test runs the real CLI in a subprocess and stops it with a real signal (its resume: in-process).
"""

from __future__ import annotations

import json
import math
import os
import shutil
import signal
import time
from pathlib import Path

import pytest
import torch

from grow import checkpoint, events
from grow import train as train_mod
from grow.checkpoint import CheckpointError, Interrupted, NonFiniteLoss
from grow.config import ConfigError
from grow.metrics import read_metrics
from tests.conftest import ROOT, TINY_RUN, grow_cli, run_config
from tests.helpers import StopAt, comparable, losses, make_cfg, plan_of, poison
from tests.ranks import forked_grow

# vt: strategy state, lr multipliers and per-stage optimizer ages in the checkpoint; dropout: the torch RNG
# matters; eval_every / recovery_steps / ckpt_every: every kind of record and checkpoint in the stream.
GROWTH = [*TINY_RUN, "+schedule=exp", "strategy=vt", "schedule.grow=[d_model,d_ff,d_qk,d_v,n_layers]",
          "model.dropout=0.1", "trainer.max_tokens=30000", "trainer.recovery_steps=4", "trainer.eval_every=9",
          "trainer.ckpt_every=5", "trainer.keep_checkpoints=2"]


@pytest.fixture(scope="module")
def reference(tmp_path_factory):
    """The uninterrupted growth run: (summary, metrics records, run dir)."""
    run_dir = tmp_path_factory.mktemp("reference") / "run"
    summary = train_mod.train(run_config(*GROWTH), run_dir)
    return summary, read_metrics(run_dir), run_dir


def stop_at(phase: str) -> StopAt:
    if phase == "step":
        plan = plan_of(*GROWTH)
        assert len(plan) == 4 and plan[1].steps >= 6
        mid = plan.start_step(1) + plan[1].steps // 2 + 1  # inside stage 2, not on a ckpt_every multiple
        return StopAt("step", step=mid + 1 if mid % 5 == 0 else mid)
    return StopAt("grown", stage=2) if phase == "grown" else StopAt("end", stage=1)


@pytest.mark.parametrize("phase", ["step", "grown", "end"],
                         ids=["inside-stage-2", "right-after-growth", "stage-end-before-growth"])
def test_resume_gives_the_same_losses_as_a_run_never_stopped(tmp_path, reference, phase):
    ref_summary, ref_records, _ = reference
    stop = stop_at(phase)
    run_dir = tmp_path / "run"
    with pytest.raises(Interrupted) as info:
        train_mod.train(run_config(*GROWTH), run_dir, stop=stop)
    assert info.value.exit_code == 0 and "resume with: grow train resume=" in info.value.message
    meta = checkpoint.latest(run_dir)
    assert meta["phase"] == phase and meta["step"] < ref_summary["state"]["step"]
    if phase == "step":
        assert meta["stage"] == 1 and 0 < meta["step_in_stage"] < plan_of(*GROWTH)[1].steps
    stopped_records = read_metrics(run_dir)
    assert len(stopped_records) < len(ref_records)
    # a record or two written after the checkpoint (as a kill would leave) are dropped on resume
    with open(run_dir / "metrics.jsonl", "a") as f:
        f.write(json.dumps({"train/loss": 123.0, "train/step": 10**6}) + "\n")

    summary = train_mod.train(run_config(*GROWTH, f"resume={run_dir}"), run_dir)
    assert summary["final_val_loss"] == ref_summary["final_val_loss"]  # bitwise
    records = read_metrics(run_dir)
    assert losses(records) == losses(ref_records)
    assert comparable(records) == comparable(ref_records)
    assert summary["state"] == ref_summary["state"] and summary["flops"] == ref_summary["flops"]
    assert comparable(summary["growth_events"]) == comparable(ref_summary["growth_events"])
    # the newest keep_checkpoints=2 checkpoints are kept, nothing else
    assert len(checkpoint.list_checkpoints(run_dir)) == 2
    assert sorted(p.suffix for p in (run_dir / "checkpoints").iterdir()) == [".json", ".json", ".pt", ".pt"]


def test_checkpoint_holds_everything_as_plain_data(reference):
    _, _, run_dir = reference
    meta = checkpoint.latest(run_dir)
    raw = torch.load(meta["path"], weights_only=True)  # plain data: loads with weights_only
    checkpoint.check_plain(raw)
    assert {"model_config", "final_config", "model", "optimizer", "state", "rng", "wandb_id", "metrics_offset",
            "config", "overrides"} <= set(raw)
    assert set(raw["rng"]) == {"torch", "cuda", "numpy", "python"}
    st = raw["state"]
    assert (st["stage"], st["step_in_stage"]) == (3, plan_of(*GROWTH)[3].steps) and st["samples"] > 0
    assert st["strategy_state"] is not None  # vt's births
    assert raw["optimizer"]["stage"] == 3 and len(raw["optimizer"]["stage_steps"]) == 4
    ages = raw["optimizer"]["stage_steps"]  # per-stage Adam step counts: stage 1's elements are the oldest
    assert ages == sorted(ages, reverse=True) and ages[-1] == plan_of(*GROWTH)[3].steps
    assert any(isinstance(e["birth"], torch.Tensor) for e in raw["optimizer"]["state"].values())
    assert all(k.endswith("_extra_state") for k in raw["model"] if "extra" in k)
    mults = [v["mult"] for k, v in raw["model"].items() if k.endswith("_extra_state")]
    assert mults and all(isinstance(m, float) for m in mults) and any(m != 1.0 for m in mults)  # vt's compensation
    assert meta["bytes"] == Path(meta["path"]).stat().st_size
    # no custom class may slip in: saving one is refused before anything is written
    with pytest.raises(TypeError, match="not plain data"):
        checkpoint.check_plain({"x": Path("/")})


def test_a_checkpoint_cut_in_half_is_refused(tmp_path, reference):
    _, _, ref_dir = reference
    run_dir = tmp_path / "run"
    shutil.copytree(ref_dir, run_dir)
    meta = checkpoint.latest(run_dir)
    pt = Path(meta["path"])
    data = pt.read_bytes()
    pt.write_bytes(data[: len(data) // 2])
    with pytest.raises(CheckpointError, match=r"truncated: \d+ bytes, its manifest says \d+") as info:
        checkpoint.load(meta)
    assert "previous checkpoint" in str(info.value)
    # without its manifest, torch's reader refuses it too (one line, no traceback text)
    with pytest.raises(CheckpointError, match="cannot read the checkpoint") as info:
        checkpoint.load_file(pt)
    assert "\n" not in str(info.value)
    # a corrupt byte with the right size: the hash
    pt.write_bytes(data[:100] + bytes([data[100] ^ 0xFF]) + data[101:])
    with pytest.raises(CheckpointError, match="SHA-256"):
        checkpoint.load(meta)
    # resume refuses before any work
    with pytest.raises(ConfigError, match="resume="):
        make_cfg(*GROWTH, f"resume={run_dir}")


class Evil:
    """Pickles to a call of exec: what a hostile "checkpoint" would carry."""

    def __init__(self, marker: Path):
        self.marker = marker

    def __reduce__(self):
        return (exec, (f"open({str(self.marker)!r}, 'w').write('code ran')",))


def test_a_pickle_carrying_code_is_refused_and_the_code_does_not_run(tmp_path, reference):
    _, _, ref_dir = reference
    run_dir = tmp_path / "run"
    shutil.copytree(ref_dir, run_dir)
    (run_dir / "summary.json").unlink()  # an unfinished run (a finished one is not resumed at all)
    meta = checkpoint.latest(run_dir)
    marker = tmp_path / "marker"
    payload = torch.load(meta["path"], weights_only=True)
    payload["state"]["strategy_state"] = Evil(marker)
    # a well-formed manifest (size and hash match): only the loader stands in the way
    size, sha = checkpoint.atomic_write(Path(meta["path"]), lambda f: torch.save(payload, f))
    manifest = Path(meta["path"]).with_suffix(".json")
    m = json.loads(manifest.read_text())
    m.update(bytes=size, sha256=sha)
    manifest.write_text(json.dumps(m))
    with pytest.raises(CheckpointError, match="refused: not a plain-data checkpoint.*exec") as info:
        checkpoint.load(checkpoint.latest(run_dir))
    assert "\n" not in str(info.value)
    assert not marker.exists()
    with pytest.raises(CheckpointError, match="refused"):
        train_mod.train(run_config(*GROWTH, f"resume={run_dir}"), run_dir)
    assert not marker.exists()
    # the file really carries code: an unsafe load would have run it
    torch.load(meta["path"], weights_only=False)
    assert marker.read_text() == "code ran"


def test_resume_refuses_a_different_model_naming_the_dimension(reference):
    _, _, run_dir = reference
    with pytest.raises(ConfigError, match=r"model\.d_ff=128: the checkpoint .* d_ff=64"):
        make_cfg(*GROWTH, f"resume={run_dir}", "model.d_ff=128")
    with pytest.raises(ConfigError, match=r"^schedule\.stages=3: the checkpoint .* is in stage 4"):
        make_cfg(*GROWTH, f"resume={run_dir}", "schedule.stages=3", "schedule.first_stage=0.2")


BASE = [*TINY_RUN, "trainer.max_tokens=12000", "trainer.ckpt_every=5", "trainer.keep_checkpoints=2"]


def test_a_nan_stops_the_run_and_keeps_the_last_good_checkpoint(tmp_path):
    run_dir = tmp_path / "run"
    with poison({13}), pytest.raises(NonFiniteLoss) as info:
        train_mod.train(run_config(*BASE), run_dir)
    msg = str(info.value)
    assert "non-finite loss (nan) or gradient norm (nan) at step 13 (stage 1/1, step 13 of" in msg
    assert "last good checkpoint" in msg and "ckpt-000000010" in msg and "\n" not in msg
    meta = checkpoint.latest(run_dir)
    assert meta["step"] == 10 and [p.stem for p in checkpoint.list_checkpoints(run_dir)] == [
        "ckpt-000000005-000-0step", "ckpt-000000010-000-0step"]
    payload = checkpoint.load(meta)
    assert all(torch.isfinite(t).all() for t in payload["model"].values() if isinstance(t, torch.Tensor))
    assert all(r["train/step"] < 13 for r in read_metrics(run_dir) if "train/loss" in r)


def test_skip_nonfinite_skips_up_to_n_bad_steps(tmp_path):
    with poison({7}):
        summary = train_mod.train(run_config(*BASE, "trainer.skip_nonfinite=1"), tmp_path / "a")
    assert summary["state"]["skipped_nonfinite"] == 1 and math.isfinite(summary["final_val_loss"])
    assert [r["train/step"] for r in read_metrics(tmp_path / "a") if "train/skipped_nonfinite" in r] == [7]
    with poison({3, 4}), pytest.raises(NonFiniteLoss, match=r"at step 4 \(stage 1/1.*after skipping 1 such step"):
        train_mod.train(run_config(*BASE, "trainer.skip_nonfinite=1"), tmp_path / "b")


def test_a_huge_learning_rate_stops_with_the_message(tmp_path):
    with pytest.raises(NonFiniteLoss, match=r"non-finite .* at step \d+ \(stage 1/1"):
        train_mod.train(run_config(*BASE, "optim.lr=1e30", "optim.warmup=0"), tmp_path / "run")


def test_sigint_in_process_checkpoints_and_exits_130(tmp_path):
    count = {"n": 0}

    def interrupt(trainer, loss, gnorm):
        count["n"] += 1
        if count["n"] == 4:
            os.kill(os.getpid(), signal.SIGINT)  # arrives mid-step (after its backward): the step finishes first

    before = signal.getsignal(signal.SIGINT)
    run_dir = tmp_path / "run"
    with events.observing("backward", interrupt), pytest.raises(Interrupted) as info:
        train_mod.train(run_config(*BASE, "trainer.ckpt_every=0"), run_dir)
    assert info.value.exit_code == 130 and "stopped by SIGINT at step 4 (stage 1/1, step 4 of" in info.value.message
    assert signal.getsignal(signal.SIGINT) is before  # handlers restored
    meta = checkpoint.latest(run_dir)
    assert (meta["phase"], meta["step"]) == ("step", 4)
    with pytest.raises(SystemExit) as exit_info:
        with checkpoint.run_outcomes():
            raise info.value
    assert exit_info.value.code == 130


def test_a_second_sigint_stops_at_once_in_one_line_and_loses_nothing(tmp_path, reference):
    """Ctrl-C twice inside the 7th step: no traceback but `Interrupted`, one line naming the checkpoint
    written before it, exit 130 (`run_outcomes`); the resume ends as the run never stopped."""
    run_dir, kept, count = tmp_path / "run", [], {"n": 0}

    def interrupt(trainer, loss, gnorm):
        count["n"] += 1
        if count["n"] == 7:
            kept.append(checkpoint.latest(run_dir))
            os.kill(os.getpid(), signal.SIGINT)  # the first asks for a stop after the step ...
            os.kill(os.getpid(), signal.SIGINT)  # ... the second stops now, inside it

    before = signal.getsignal(signal.SIGINT)
    with events.observing("backward", interrupt), pytest.raises(Interrupted) as info:
        train_mod.train(run_config(*GROWTH), run_dir)
    assert signal.getsignal(signal.SIGINT) is before
    meta = checkpoint.latest(run_dir)
    assert meta == kept[0] and meta["step"] < 7
    message = info.value.message
    assert "\n" not in message and message.startswith("stopped at once by a second Ctrl-C at step 6 (stage ")
    assert (f"the last checkpoint {meta['path']} (step {meta['step']}) is intact: resume with: grow train "
            f"resume={run_dir}") in message
    with pytest.raises(SystemExit) as exit_info:
        with checkpoint.run_outcomes():
            raise info.value
    assert exit_info.value.code == 130
    resumed = train_mod.train(run_config(*GROWTH, f"resume={run_dir}"), run_dir)
    assert resumed["final_val_loss"] == reference[0]["final_val_loss"]


def test_ctrl_c_outside_a_run_is_one_line_and_130(tmp_path, monkeypatch, capsys):
    """A real SIGINT while `grow schedule` prints (no run's handler): one line, exit 130; a further
    Ctrl-C would end the process at once (`grow.cli.interrupts_end_in_one_line`)."""
    import grow.commands.schedule
    from grow import cli

    original = grow.commands.schedule.format_plan

    def format_plan(plan):
        os.kill(os.getpid(), signal.SIGINT)
        return original(plan)

    monkeypatch.setattr(grow.commands.schedule, "format_plan", format_plan)  # the name the command calls
    monkeypatch.chdir(tmp_path)
    before = signal.signal(signal.SIGINT, signal.default_int_handler)  # Python's own, whatever ran before here
    try:
        with pytest.raises(SystemExit) as info:
            cli.main(["schedule", *TINY_RUN])
        after = signal.getsignal(signal.SIGINT)
    finally:
        signal.signal(signal.SIGINT, before)
    err = capsys.readouterr().err
    lines = [ln for ln in err.splitlines() if ln.strip()]
    assert info.value.code == 130 and "Traceback" not in err
    assert len(lines) == 1 and lines[0].startswith("stopped by Ctrl-C; ") and "grow train resume=" in lines[0]
    assert after not in (signal.default_int_handler, signal.SIG_DFL)


def test_sigterm_mid_stage_leaves_a_checkpoint_that_resumes(tmp_path):
    """The real CLI in a process of its own (forked warm), stopped by a real SIGTERM in stage 2, then resumed by
    the CLI (in-process). The process sends the signal to itself at its first training record of stage 2 (a
    module GROW_PLUGINS imports first wraps `MetricsLogger.log`): the stop lands inside stage 2 whatever the
    machine's load."""
    hook = tmp_path / "hook"
    hook.mkdir()
    (hook / "sigterm_in_stage_2.py").write_text(
        "import os, signal\n"
        "from grow.metrics import MetricsLogger\n"
        "_log = MetricsLogger.log\n"
        "def log(self, record):\n"
        "    _log(self, record)\n"
        "    if record.get('stage') == 2 and 'train/loss' in record and not log.sent:\n"
        "        log.sent = True\n"
        "        os.kill(os.getpid(), signal.SIGTERM)\n"
        "log.sent = False\n"
        "MetricsLogger.log = log\n")
    overrides = [*TINY_RUN, "+schedule=exp", "trainer.max_tokens=20000", "trainer.ckpt_every=0"]
    run_dir = tmp_path / "run"
    proc = forked_grow("train", *overrides, f"hydra.run.dir={run_dir}", cwd=tmp_path,
                       env={"GROW_PLUGINS": "sigterm_in_stage_2", "PYTHONPATH": os.pathsep.join(
                           p for p in (str(hook), str(ROOT), os.environ.get("PYTHONPATH")) if p)})
    err = proc.stderr
    assert proc.returncode == 0, err[-3000:]
    assert "stopped by SIGTERM at step" in err and f"resume with: grow train resume={run_dir}" in err, err[-2000:]
    meta = checkpoint.latest(run_dir)
    assert meta["phase"] == "step" and meta["stage"] == 1 and meta["step_in_stage"] > 0
    checkpoint.load(meta)  # complete: size and hash match, loads
    assert not (run_dir / "summary.json").exists()

    out = grow_cli("train", f"resume={run_dir}", cwd=tmp_path)  # the signal needs a process, the resume none
    assert out.returncode == 0, out.stderr[-3000:]
    assert "resume: " in out.stdout
    resumed = read_metrics(run_dir)
    reference = train_mod.train(run_config(*overrides), tmp_path / "reference")
    assert json.loads((run_dir / "summary.json").read_text())["final_val_loss"] == reference["final_val_loss"]
    assert losses(resumed) == losses(read_metrics(tmp_path / "reference"))


def test_resume_latest_finds_the_newest_run(tmp_path, monkeypatch, reference):
    _, _, ref_dir = reference
    monkeypatch.chdir(tmp_path)
    with pytest.raises(ConfigError, match="resume=.latest.: no grow train run directory with a checkpoint"):
        checkpoint.resolve_resume("latest")
    older, newer = tmp_path / "outputs/2026-01-01/a", tmp_path / "outputs/2026-01-02/b"
    for i, d in enumerate((older, newer)):
        shutil.copytree(ref_dir, d)
        for m in checkpoint.list_checkpoints(d):  # newest = the most recently written checkpoint
            os.utime(m, (time.time() + i, time.time() + i))
    (tmp_path / "outputs/empty").mkdir()
    assert checkpoint.resolve_resume("latest") == Path("outputs/2026-01-02/b")
    assert checkpoint.resolve_resume(str(newer / "checkpoints")) == newer
    # the CLI's Hydra command line: the run's own overrides, then its directory as the run directory
    extra = checkpoint.Resume.from_argv(["resume=latest", "trainer.progress=true"]).hydra_overrides()
    assert extra[-1] == "hydra.run.dir='outputs/2026-01-02/b'"


def test_saved_overrides_yield_to_the_command_line():
    meta = {"overrides": ["+schedule=exp", "strategy=vt", "strategy.noise_ratio=0", "seed=3", "resume=/x",
                          "trainer.max_tokens=1000"]}
    assert checkpoint.saved_overrides(meta, ["resume=/x"]) == [
        "+schedule=exp", "strategy=vt", "strategy.noise_ratio=0", "seed=3", "trainer.max_tokens=1000"]
    assert checkpoint.saved_overrides(meta, ["resume=/x", "strategy=zero", "+schedule=exp", "seed=4"]) == [
        "trainer.max_tokens=1000"]


def test_checkpoint_writes_are_atomic(tmp_path, monkeypatch):
    """A failure while writing leaves the previous file intact and no temporary behind."""
    target = tmp_path / "f.bin"
    checkpoint.atomic_write(target, lambda f: f.write(b"old"))

    def failing(f):
        f.write(b"partial")
        raise OSError("disk full")

    with pytest.raises(OSError):
        checkpoint.atomic_write(target, failing)
    assert target.read_bytes() == b"old" and [p.name for p in tmp_path.iterdir()] == ["f.bin"]


def test_the_cli_maps_stops_and_nonfinite_losses_to_exit_codes():
    with pytest.raises(SystemExit) as info:
        with checkpoint.run_outcomes():
            raise Interrupted("SIGTERM", "stopped")
    assert info.value.code == 0
    with pytest.raises(SystemExit) as info:
        with checkpoint.run_outcomes():
            raise NonFiniteLoss("nan")
    assert info.value.code == checkpoint.NONFINITE_EXIT == 3

