"""The bad-input audit (docs/design.md, "Commands"; docs/distributed.md): every bad value ends with one line naming the key,
exit status 2.

The table runs the real command-line entry point (`grow.cli.main`) in-process: ``precheck``
composes and validates the whole configuration before Hydra starts, so a bad input never reaches
any data or model work and the run directory is never created. `tests/test_cli.py` runs two of
these through a subprocess to check the real exit status and the absence of a traceback.
"""

from __future__ import annotations

import json
import os
import shutil
import time
from pathlib import Path

import pytest

from tests.conftest import TINY_DATA
from tests.helpers import expect_refusal, run_cli

# (overrides after `grow train model=tiny data.vocab_size=512 data.max_bytes=400000`, text the one line must contain)
BAD_INPUTS = [
    # model
    (["model=nonexistent"], "model='nonexistent'"),
    (["model.d_model=-4"], "model.d_model=-4"),
    (["model.d_qk=null", "model.d_model=30", "model.n_heads=4"], "model.d_model=30"),
    (["model.d_qk=null", "model.n_heads=3"], "model.n_heads=3"),
    (["model.n_heads=0"], "model.n_heads=0"),
    (["model.activation=swish"], "model.activation='swish'"),
    (["model.dropout=1.5"], "model.dropout=1.5"),
    (["model.seq_len=abc"], "model.seq_len='abc'"),
    (["model.d_ff=2.5"], "model.d_ff=2.5"),
    (["model.mlp_bias=maybe"], "model.mlp_bias='maybe'"),
    (["model.vocab_size=300"], "model.vocab_size=300"),
    (["model.n_experts=2", "model.top_k=3"], "model.top_k=3: must be <= model.n_experts=2"),
    (["model.n_experts=0"], "model.n_experts=0"),
    (["model.n_experts=2", "model.router_z_coef=-1"], "model.router_z_coef=-1"),
    # schedule
    (["+schedule=exp", "schedule.stages=0"], "schedule.stages=0"),
    (["+schedule=exp", "+schedule.start.d_model=64"], "schedule.start.d_model=64"),  # start above the final 32
    (["+schedule=exp", "schedule.grow=[d_model,width]"], "schedule.grow="),
    (["+schedule=exp", "schedule.first_stage=0.6"], "schedule.first_stage=0.6"),  # the last stage is empty
    (["+schedule=exp", "trainer.max_tokens=3000"], "schedule.first_stage"),  # stage 0 has no step
    (["+schedule=exp", "schedule.width_rate=-1"], "schedule.width_rate=-1"),
    (["+schedule=exp", "schedule.rounding=up"], "schedule.rounding='up'"),
    (["+schedule=exp", "+schedule.bogus=1"], "schedule.bogus"),
    (["+experiment=midas"], "schedule.depth_step=1: from 1 layers 4 stages reach 4, not the model's n_layers=2; "
                            "allowed: schedule.stages=2"),
    (["+schedule=exp", "schedule.depth_step=0"], "schedule.depth_step=0"),
    # a growth that grows nothing: the start is the model's 2 layers; a stage repeats the one before
    (["+schedule=depth", "strategy=stack"], "schedule.start.n_layers=2: the schedule grows nothing (start -> final: "
                                            "n_layers 2 -> 2)"),
    (["+schedule=exp", "schedule.grow=[n_layers]", "+schedule.start.n_layers=1"],
     "schedule.stages=4: from the start to the final sizes (n_layers 1 -> 2) the schedule reaches the final model at "
     "stage 2, so the 2 stage(s) after it would grow nothing: schedule.stages=2"),
    (["+schedule=exp", "schedule.grow=[d_model]", "schedule.depth_step=1"], "schedule.depth_step=1: n_layers is not"),
    (["+schedule=exp", "schedule.prop_power=1.5"], "schedule.prop_power=1.5"),
    (["+schedule=nonexistent"], "schedule='nonexistent'"),
    # strategy
    (["strategy=nonexistent"], "strategy='nonexistent'"),
    (["+schedule=exp", "strategy=vt", "strategy.noise_ratio=-1"], "strategy.noise_ratio=-1"),
    (["+schedule=exp", "strategy=svd", "strategy.mode=foo"], "strategy.mode='foo'"),
    (["+schedule=exp", "strategy=net2net", "strategy.choice=foo"], "strategy.choice='foo'"),
    (["+strategy.bogus=1"], "strategy.bogus=1"),
    (["+schedule=exp", "strategy.layer_position=middle"], "strategy.layer_position='middle'"),
    (["+schedule=exp", "strategy=svd", "trainer.growth_batches=2"], "trainer.growth_batches=2"),
    (["+schedule=exp", "strategy=shrink_perturb", "strategy.shrink=-1"], "strategy.shrink=-1"),
    (["+schedule=exp", "strategy=upcycle", "strategy.new_experts=some"], "strategy.new_experts='some'"),
    (["+schedule=exp", "strategy=upcycle", "strategy.ramp_steps=0"], "strategy.ramp_steps=0"),
    (["+schedule=exp", "strategy=llama_pro", "model.n_layers=7", "+schedule.start.n_layers=4"],
     "strategy='llama_pro'"),  # 4 -> 7: a block after every 1st of 4 places 4, not 3 (the reference's assertion)
    (["+schedule=exp", "strategy=dus", "model.n_layers=5", "+schedule.start.n_layers=3"], "strategy='dus'"),
    (["+schedule=exp", "strategy=llama_pro", "model.n_layers=7", "+schedule.start.n_layers=4",
      "trainer.train_new_only=true"], "strategy='llama_pro': growth into stage 2: 4 -> 7 layers"),  # not `schedule`
    (["+schedule=exp", "strategy=dus", "model.n_layers=5", "+schedule.start.n_layers=3",
      "trainer.train_new_only=true"], "strategy='dus': growth into stage 2"),
    # mup with a strategy of its own parameterization (vt's Table 1 and Eq. 5): they do not compose
    (["+schedule=exp", "strategy=vt", "model.parametrization=mup", "model.mup_base_width=16"],
     "model.parametrization='mup': standard with strategy=vt"),
    (["+schedule=exp", "strategy=svd", "strategy.base=vt", "model.parametrization=mup", "model.mup_base_width=16"],
     "model.parametrization='mup': standard with strategy=svd (its vt parameterization"),
    (["init=strategy", "strategy=vt", "model.parametrization=mup", "model.mup_base_width=16"],
     "model.parametrization='mup': standard with strategy=vt"),  # vt's matched baseline
    (["+schedule=exp", "strategy=svd", "+strategy.base_options.layer_position=middle"],
     "strategy.base_options.layer_position='middle'"),  # svd's new layers are its base's
    (["+schedule=exp", "strategy=hyperclone", "strategy.noise=-1"], "strategy.noise=-1"),
    (["+schedule=exp", "strategy=net2net", "strategy.noise=abc"], "strategy.noise='abc': must be a number >= 0"),
    (["+schedule=exp", "strategy=stack", "strategy.order=top"], "strategy.order='top'"),
    (["+schedule=exp", "strategy=ligo", "strategy.lr=0"], "strategy.lr=0"),
    (["+schedule=exp", "strategy=svd", "strategy.gamma=auto", "strategy.heldout=0"], "strategy.heldout=0"),
    (["+schedule=exp", "strategy=msg", "strategy.ramp_steps=0"], "strategy.ramp_steps=0"),
    (["+schedule=exp", "strategy.layer_position=[9]"], "strategy.layer_position=[9]"),
    # the trigger (schedule.trigger): its options, and what it needs of the run
    (["+schedule=exp", "schedule/trigger=plateau", "schedule.trigger.window=1", "trainer.eval_every=5"],
     "schedule.trigger.window=1"),
    (["+schedule=exp", "schedule/trigger=plateau", "+schedule.trigger.windw=3", "trainer.eval_every=5"],
     "schedule.trigger.windw=3"),
    (["+schedule=exp", "schedule/trigger=plateau", "trainer.eval_every=0"], "trainer.eval_every=0"),
    (["+schedule=exp", "schedule/trigger=gap", "trainer.eval_every=5", "trainer.log_every=10"],
     "trainer.log_every=10"),
    (["+schedule=exp", "schedule.trigger.name=sometimes"], "schedule.trigger.name='sometimes'"),
    (["+schedule=exp", "schedule/trigger=tokens_per_param", "schedule.trigger.ratio=inf"],
     "schedule.trigger.ratio=inf: must be a number > 0"),
    (["+schedule=exp", "schedule/trigger=plateau", "schedule.trigger.window=abc", "trainer.eval_every=5"],
     "schedule.trigger.window='abc': must be an integer >= 2"),
    # the model's cross-key rules under mup
    (["model.parametrization=mup", "model.mup_base_width=null"], "model.mup_base_width=None"),
    (["model.parametrization=mup", "model.mup_base_width=16", "model.tie_embeddings=true"],
     "model.tie_embeddings=True"),
    (["model.mup_base_width=16"], "model.mup_base_width=16: must be null"),
    # data
    (["data=text", "data.files=[/nonexistent/corpus.txt]"], "data.files='/nonexistent/corpus.txt'"),
    (["data.vocab_size=70000"], "data.vocab_size=70000"),
    (["data.val_every=1"], "data.val_every=1"),
    (["data=hf"], "data.path"),
    (["data.name=foo"], "data.name='foo'"),
    (["data.max_bytes=0"], "data.max_bytes=0"),
    # trainer
    (["trainer.batch_size=0"], "trainer.batch_size=0"),
    (["+schedule=exp", "trainer.train_new_only=true"], "trainer.train_new_only=True"),  # a growth adds no layer
    (["trainer.train_new_only=yes"], "trainer.train_new_only='yes'"),
    (["trainer.eval_every=-1"], "trainer.eval_every=-1"),
    (["trainer.max_tokens=1000.5"], "trainer.max_tokens=1000.5"),
    (["trainer.max_tokens=abc"], "trainer.max_tokens='abc'"),
    (["trainer.max_tokens=100"], "trainer.max_tokens=100"),  # less than one step
    (["trainer.skip_nonfinite=-1"], "trainer.skip_nonfinite=-1"),
    (["trainer.grad_clip=abc"], "trainer.grad_clip='abc'"),
    (["trainer.keep_checkpoints=0"], "trainer.keep_checkpoints=0"),
    (["trainer.ckpt_every=1.5"], "trainer.ckpt_every=1.5"),
    (["trainer.ckpt_minutes=-1"], "trainer.ckpt_minutes=-1"),
    (["trainer.progress=maybe"], "trainer.progress='maybe'"),
    (["trainer.fsdp_growth=shard"], "trainer.fsdp_growth='shard'"),
    (["+schedule=exp", "strategy=ligo", "trainer.fsdp_growth=sharded"],
     "trainer.fsdp_growth='sharded': host or auto"),  # its operator maps every old layer into each grown one
    # optimizer and run
    (["optim.lr=-1"], "optim.lr=-1"),
    (["optim.lr=abc"], "optim.lr='abc'"),
    (["optim.betas=[0.9,1.5]"], "optim.betas=[0.9, 1.5]"),
    (["optim.schedule=linear"], "optim.schedule='linear'"),
    (["optim=sgd", "optim.momentum=1"], "optim.momentum=1"),
    (["optim.rewarm_steps=-3"], "optim.rewarm_steps=-3"),
    (["+schedule=exp", "strategy=msg", "strategy.mlp_mask=middle"], "mlp_mask='middle'"),
    (["device=tpu"], "device='tpu'"),
    (["precision=fp8"], "precision='fp8'"),
    (["seed=-1"], "seed=-1"),
    # the command line
    (["model.d_model=[1,2"], "model.d_model"),  # does not parse
    (["trainer.batch_size"], "trainer.batch_size"),  # no value
    (["trainer.bogus=1"], "trainer.bogus"),  # no such key
    (["resume=/nonexistent/run"], "resume='/nonexistent/run'"),
    (["resume=latest"], "resume='latest'"),  # no run with a checkpoint under ./outputs
    (["seed=0,1"], "seed='0,1': a sweep runs with -m, one job per value (grow train ... seed=0,1 -m); to compare "
                   "strategies against the baseline: grow compare"),  # Hydra's four lines otherwise
]


@pytest.mark.parametrize("overrides,text", BAD_INPUTS, ids=[" ".join(o) for o, _ in BAD_INPUTS])
def test_bad_input_is_one_line_naming_the_key_and_exit_2(tmp_path, monkeypatch, capsys, overrides, text):
    monkeypatch.chdir(tmp_path)
    expect_refusal(["train", "model=tiny", *TINY_DATA, *overrides], text, capsys, tmp_path)


def test_the_table_covers_every_part_of_the_config():
    keys = {t.split("=")[0].split(".")[0].strip("'") for _, t in BAD_INPUTS}
    assert {"model", "schedule", "strategy", "data", "trainer", "optim", "resume"} <= keys
    assert len(BAD_INPUTS) >= 29


def test_unknown_command(capsys):
    code, lines = run_cli(["fly"], capsys)
    assert code == 2 and len(lines) == 1 and "command='fly'" in lines[0] and "train" in lines[0]


def test_sweeps_are_checked_job_by_job(tmp_path, capsys):
    line = expect_refusal(["train", "model=tiny", *TINY_DATA, "trainer.batch_size=16,0", "-m"],
                          "trainer.batch_size=0", capsys, tmp_path)
    assert "error: " in line


def test_a_glob_sweep_is_checked_job_by_job(tmp_path, capsys):
    """``group=glob(...)`` lists the group's options (once: "ConfigLoader is not set")."""
    expect_refusal(["train", "-m", "model=glob(tin*)", *TINY_DATA, "trainer.max_tokens=100"],
                   "trainer.max_tokens=100", capsys, tmp_path)


def test_the_schedule_command_is_audited_too(tmp_path, capsys):
    expect_refusal(["schedule", "+schedule=exp", "model=tiny", *TINY_DATA, "schedule.stages=0"], "schedule.stages=0",
                   capsys, tmp_path)


def fake_run(tmp_path, name="run", **manifest):
    """A run directory with one checkpoint manifest and a file of the size it names (the precheck reads no more)."""
    run = tmp_path / name
    (run / "checkpoints").mkdir(parents=True)
    cfg = {"vocab_size": 512, "seq_len": 32, "n_layers": 2, "d_model": 32, "n_heads": 2, "d_qk": 16, "d_v": 16,
           "d_ff": 64, "activation": "gelu", "mlp_bias": True, "tie_embeddings": False, "norm_eps": 1e-05,
           "dropout": 0.0, "init_std": 0.02}
    data = b"x" * 1000
    (run / "checkpoints/ckpt-000000010-000-0step.pt").write_bytes(data[: manifest.pop("actual_bytes", 1000)])
    import hashlib

    meta = {"format": "grow.checkpoint/1", "file": "ckpt-000000010-000-0step.pt", "bytes": 1000,
            "sha256": hashlib.sha256(data).hexdigest(), "step": 10, "stage": 0, "step_in_stage": 10,
            "phase": "step", "model_config": cfg, "final_config": cfg, "optimizer_kind": "adamw",
            "overrides": ["model=tiny", *TINY_DATA], **manifest}
    (run / "checkpoints/ckpt-000000010-000-0step.json").write_text(json.dumps(meta))
    return run


RESUME_CASES = [
    ({}, [], None),  # a good manifest: the precheck passes (checked by the test below)
    ({"actual_bytes": 500}, [], "checkpoint is truncated: 500 bytes, its manifest says 1000"),
    ({"actual_bytes": 1000, "sha256": "0" * 64}, [], "SHA-256"),
    ({}, ["model.d_model=64"], "model.d_model=64: a resume continues"),  # the CLI's check (trainer: check_compatible)
    ({}, ["optim=sgd"], "optim='sgd': a resume continues"),
    ({"format": "other/1"}, [], "unreadable checkpoint manifest"),
]


@pytest.mark.parametrize("manifest,extra,text", RESUME_CASES[1:], ids=["truncated", "corrupt", "other-model",
                                                                        "other-optimizer", "bad-manifest"])
def test_resume_refusals(tmp_path, monkeypatch, capsys, manifest, extra, text):
    monkeypatch.chdir(tmp_path)
    run = fake_run(tmp_path, **manifest)
    code, lines = run_cli(["train", f"resume={run}", *extra], capsys)
    assert code == 2 and len(lines) == 1 and text in lines[0], lines
    assert "resume" in lines[0] or "model." in lines[0] or "optim." in lines[0]


def test_resume_dir_without_a_checkpoint(tmp_path, monkeypatch, capsys):
    monkeypatch.chdir(tmp_path)
    (tmp_path / "empty").mkdir()
    line = expect_refusal(["train", "resume=empty"], "resume='empty': no checkpoint", capsys, tmp_path)
    assert "checkpoints" in line


def test_resume_takes_the_runs_own_overrides(tmp_path, monkeypatch, capsys):
    """`grow train resume=<dir>` alone composes the run's own command line (model=tiny, vocab 512): no refusal
    on the model, and the precheck gets as far as the checkpoint itself."""
    from grow.commands.precheck import precheck

    monkeypatch.chdir(tmp_path)
    run = fake_run(tmp_path)
    precheck("train", [f"resume={run}"])  # model=tiny and data.vocab_size=512 come from the checkpoint
    shutil.rmtree(run / "checkpoints")
    with pytest.raises(Exception, match="no checkpoint"):
        precheck("train", [f"resume={run}"])


# a path naming a file where a directory must be, or a directory where files must be (#45): (command line, text)
WRONG_KINDS = [
    (["train", "model=tiny", *TINY_DATA, "data=text", "data.files=[corpus]"],
     "data.files='corpus': names only directories; name the files in them, e.g. data.files=['corpus/*.txt']"),
    (["train", "model=tiny", *TINY_DATA, "data.cache_dir=afile"],
     "data.cache_dir='afile': afile is a file, not a directory: set data.cache_dir or GROW_CACHE_DIR"),
    (["train", "model=tiny", *TINY_DATA, "data.cache_dir=afile/tokens"], "afile is a file, not a directory"),
    (["report", "runs=[arun]", "out=afile"], "out='afile': afile is a file, not a directory"),
    (["report", "runs=[arun]", "out=afile/report"], "out='afile/report': afile is a file, not a directory"),
]


@pytest.mark.parametrize("argv,text", WRONG_KINDS, ids=["files-a-directory", "cache-a-file", "cache-under-a-file",
                                                        "report-out-a-file", "report-out-under-a-file"])
def test_a_path_of_the_wrong_kind_is_one_line(tmp_path, monkeypatch, capsys, argv, text):
    monkeypatch.chdir(tmp_path)
    (tmp_path / "corpus").mkdir()
    (tmp_path / "corpus" / "a.txt").write_text("hello")
    (tmp_path / "afile").write_text("not a directory")
    fake_run(tmp_path, "arun")
    expect_refusal(argv, text, capsys, tmp_path)


def test_grow_cache_dir_a_file_is_one_line(tmp_path, monkeypatch, capsys):
    monkeypatch.chdir(tmp_path)
    (tmp_path / "afile").write_text("not a directory")
    monkeypatch.setenv("GROW_CACHE_DIR", str(tmp_path / "afile"))
    expect_refusal(["train", "model=tiny", *TINY_DATA], f"{tmp_path / 'afile'} is a file, not a directory: set "
                   "data.cache_dir or GROW_CACHE_DIR to a directory (here from GROW_CACHE_DIR)", capsys, tmp_path)


def test_a_glob_matching_files_and_directories_reads_the_files(tmp_path):
    from grow.data.sources import text_files

    (tmp_path / "sub").mkdir()
    (tmp_path / "a.txt").write_text("a")
    assert text_files([str(tmp_path / "*")]) == [tmp_path / "a.txt"]


SLURM_SWEEP = ["train", "model=tiny", *TINY_DATA, "hydra/launcher=slurm", "seed=0"]


def test_the_slurm_launcher_without_slurm_is_one_line(tmp_path, monkeypatch, capsys):
    """No sbatch on PATH (25 lines of submitit's traceback before): one line, and no sweep directory."""
    (tmp_path / "bin").mkdir()
    monkeypatch.setenv("PATH", str(tmp_path / "bin"))
    monkeypatch.chdir(tmp_path)
    expect_refusal([*SLURM_SWEEP, f"hydra.sweep.dir={tmp_path / 'sweep'}", "-m"],
                   "hydra/launcher='slurm': no SLURM on this machine (sbatch, srun, sinfo not on PATH): run it on a "
                   "SLURM cluster's login node, or leave hydra/launcher out", capsys, tmp_path)
    assert not (tmp_path / "sweep").exists()


def test_the_slurm_launcher_without_a_controller_is_one_line(tmp_path, monkeypatch, capsys):
    """SLURM's commands installed but its controller down: sinfo's own first line, in ours."""
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    for name, body in {"sbatch": "exit 0", "srun": "exit 0",
                       "sinfo": "echo 'sinfo: error: Unable to contact slurm controller (connect failure)' >&2; exit 1"}.items():
        (bin_dir / name).write_text(f"#!/bin/sh\n{body}\n")
        (bin_dir / name).chmod(0o755)
    monkeypatch.setenv("PATH", str(bin_dir))
    monkeypatch.chdir(tmp_path)
    expect_refusal([*SLURM_SWEEP, f"hydra.sweep.dir={tmp_path / 'sweep'}", "-m"],
                   "hydra/launcher='slurm': sinfo cannot reach the SLURM controller (sinfo: error: Unable to contact "
                   "slurm controller (connect failure))", capsys, tmp_path)
    assert not (tmp_path / "sweep").exists()


def test_resume_of_a_compare_arm_says_how_its_sweep_goes_on(tmp_path, monkeypatch, capsys):
    """Before (#45): `compare.vary: not a key of the config`, a key the user never typed."""
    monkeypatch.chdir(tmp_path)
    sweep = tmp_path / "outputs" / "compare" / "sweep"
    arm = fake_run(sweep, "zero-seed0")
    command = "grow compare strategy=zero model=tiny"
    (arm / "arm.json").write_text(json.dumps({"arm": "zero", "kind": "grown", "seed": 0, "command": command}))
    expect_refusal(["train", f"resume={arm}"], f"resume={str(arm)!r}: {arm} is an arm of the grow compare sweep "
                   f"{sweep}; the sweep goes on with its arms: {command} hydra.sweep.dir={sweep}", capsys, tmp_path)
    (arm / "summary.json").write_text(json.dumps({"complete": True}))  # a finished sweep: rerunning it does nothing
    expect_refusal(["train", f"resume={arm}"], f"resume={str(arm)!r}: {arm} is an arm of the grow compare sweep "
                   f"{sweep}, and complete (summary.json): nothing to resume", capsys, tmp_path)


def test_resume_latest_is_the_newest_grow_train_run_whatever_sweeps_came_after(tmp_path, monkeypatch, capsys):
    """#65: a compare sweep newer than the run (finished or not) blocked resume=latest, with a command that did
    nothing; its arms resume with their sweep, so `latest` is grow train's newest run."""
    monkeypatch.chdir(tmp_path)
    sweep = tmp_path / "outputs" / "compare" / "sweep"
    arm = fake_run(sweep, "zero-seed0")
    (arm / "arm.json").write_text(json.dumps({"arm": "zero", "kind": "grown", "seed": 0, "command": "grow compare"}))
    expect_refusal(["train", "resume=latest"], f"resume='latest': no grow train run directory with a checkpoint "
                   f"under {tmp_path / 'outputs'}/ (1 grow compare arms have checkpoints: a sweep goes on when its grow "
                   "compare command runs again with its hydra.sweep.dir); give the run directory: resume=<run dir>",
                   capsys, tmp_path)
    run = fake_run(tmp_path / "outputs" / "2026-01-01", "train-run")
    old = time.time() - 3600  # the run's checkpoint an hour older than the arm's
    for m in (run / "checkpoints").glob("*.json"):
        os.utime(m, (old, old))
    from grow import checkpoint

    assert checkpoint.resolve_resume("latest") == Path("outputs/2026-01-01/train-run")


def test_harness_takes_a_list_of_tasks_not_a_sweep(tmp_path, monkeypatch, capsys):
    """`harness=a,b` (the documented form) is two tasks; before, Hydra's four lines on an ambiguous sweep."""
    pytest.importorskip("lm_eval")
    monkeypatch.chdir(tmp_path)
    run = fake_run(tmp_path, "arun")
    (tmp_path / "tasks").mkdir()
    code, lines = run_cli(["eval", f"run={run}", "harness=no_such_a,no_such_b", f"harness_include={tmp_path / 'tasks'}"],
                          capsys)
    assert code == 2 and lines == [f"error: harness='no_such_a': no such task in {tmp_path / 'tasks'}"], lines
def test_a_report_equivalence_margin_that_is_not_a_positive_number_is_refused(tmp_path, capsys):
    """grow report equivalence_margin= (docs/statistics.md): one line naming the key and value, exit 2."""
    from tests.helpers import fake_sweep

    sweep = fake_sweep(tmp_path / "sweep")
    for bad in ("0", "-0.1", "abc"):
        code, lines = run_cli(["report", f"runs=[{sweep}]", f"out={tmp_path / 'out'}", f"equivalence_margin={bad}"],
                              capsys)
        assert code == 2 and len(lines) == 1 and f"equivalence_margin={bad}" in lines[0].replace("'", ""), lines
        assert "positive number of nats" in lines[0] and not (tmp_path / "out").exists()


@pytest.mark.parametrize("lo, hi, opens, out, allowed", [
    (0.0, 1.0, {"hi_open": True}, 1.0, "must be a number in [0, 1)"),
    (0.0, None, {"lo_open": True}, 0.0, "must be a number > 0"),
    (None, 1.0, {}, 2.5, "must be a number <= 1"),  # an upper bound alone is named too (it said "a finite number")
    (None, 1.0, {"hi_open": True}, 1.0, "must be a number < 1"),
    (None, None, {}, None, "must be a finite number"),
])
def test_a_number_out_of_range_names_the_range(lo, hi, opens, out, allowed):
    from grow.errors import ConfigError, check_number

    for bad in ([out] if out is not None else []) + [float("nan"), float("inf"), "abc", True]:
        with pytest.raises(ConfigError) as info:
            check_number("strategy.noise", bad, lo, hi, **opens)
        assert str(info.value).endswith(allowed) and "\n" not in str(info.value), str(info.value)
    assert check_number("strategy.noise", 0.5, lo, hi, **opens) == 0.5
