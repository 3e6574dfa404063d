"""The bad-input audit (docs/design.md §1, §11): every bad value ends with one line naming the key,
exit status 2.

The table runs the real command-line entry point (`grow.cli.main`) in-process: ``precheck``
composes and validates the whole configuration before Hydra starts, so a bad input never reaches
any data or model work and the run directory is never created. `tests/test_cli.py` runs two of
these through a subprocess to check the real exit status and the absence of a traceback.
"""

from __future__ import annotations

import json
import shutil

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
    # schedule
    (["+schedule=exp", "schedule.stages=0"], "schedule.stages=0"),
    (["+schedule=exp", "+schedule.start.d_model=64"], "schedule.start.d_model=64"),  # start above the final 32
    (["+schedule=exp", "schedule.grow=[d_model,width]"], "schedule.grow="),
    (["+schedule=exp", "schedule.first_stage=0.6"], "schedule.first_stage=0.6"),  # the last stage is empty
    (["+schedule=exp", "trainer.max_tokens=3000"], "schedule.first_stage"),  # stage 0 has no step
    (["+schedule=exp", "schedule.width_rate=-1"], "schedule.width_rate=-1"),
    (["+schedule=exp", "schedule.rounding=up"], "schedule.rounding='up'"),
    (["+schedule=exp", "+schedule.bogus=1"], "schedule.bogus"),
    (["+schedule=nonexistent"], "schedule='nonexistent'"),
    # strategy
    (["strategy=nonexistent"], "strategy='nonexistent'"),
    (["+schedule=exp", "strategy=vt", "strategy.noise_ratio=-1"], "strategy.noise_ratio=-1"),
    (["+schedule=exp", "strategy=svd", "strategy.mode=foo"], "strategy.mode='foo'"),
    (["+schedule=exp", "strategy=net2net", "strategy.choice=foo"], "strategy.choice='foo'"),
    (["+strategy.bogus=1"], "strategy.bogus=1"),
    (["+schedule=exp", "strategy.layer_position=middle"], "strategy.layer_position='middle'"),
    (["+schedule=exp", "strategy=svd", "trainer.growth_batches=2"], "trainer.growth_batches=2"),
    # data
    (["data=text", "data.files=[/nonexistent/corpus.txt]"], "data.files='/nonexistent/corpus.txt'"),
    (["data.vocab_size=70000"], "data.vocab_size=70000"),
    (["data.val_every=1"], "data.val_every=1"),
    (["data=hf"], "data.path"),
    (["data.name=foo"], "data.name='foo'"),
    (["data.max_bytes=0"], "data.max_bytes=0"),
    # trainer
    (["trainer.batch_size=0"], "trainer.batch_size=0"),
    (["trainer.eval_every=-1"], "trainer.eval_every=-1"),
    (["trainer.max_tokens=1000.5"], "trainer.max_tokens=1000.5"),
    (["trainer.max_tokens=abc"], "trainer.max_tokens='abc'"),
    (["trainer.max_tokens=100"], "trainer.max_tokens=100"),  # less than one step
    (["trainer.skip_nonfinite=-1"], "trainer.skip_nonfinite=-1"),
    (["trainer.grad_clip=abc"], "trainer.grad_clip='abc'"),
    (["trainer.keep_checkpoints=0"], "trainer.keep_checkpoints=0"),
    (["trainer.ckpt_every=1.5"], "trainer.ckpt_every=1.5"),
    (["trainer.progress=maybe"], "trainer.progress='maybe'"),
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
