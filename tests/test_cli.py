"""The CLI end to end: `grow train` on tiny settings and help in-process (`grow_cli`); bad input and what a
run's process imports through the real process (`run_grow`)."""

import json
import math
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

from tests.conftest import TINY_RUN, assert_one_line_error, grow_cli, run_grow


def read_jsonl(path):
    return [json.loads(line) for line in path.read_text().splitlines() if line.strip()]


def test_grow_help_lists_the_commands(tmp_path):
    out = grow_cli("--help", cwd=tmp_path)
    assert out.returncode == 0
    for command in ("train", "compare", "schedule", "sample", "eval", "report"):
        assert command in out.stdout


@pytest.mark.parametrize("flag", ["--version", "-V"])
def test_grow_version_names_the_version_the_commit_and_torch(tmp_path, flag):
    """#65: there was no grow --version; it says what a run's summary.json records as its code."""
    import torch

    import grow
    from grow.provenance import code_version

    out = grow_cli(flag, cwd=tmp_path)
    assert out.returncode == 0 and out.stderr == ""
    line = out.stdout.strip()
    assert line.startswith(f"grow {grow.__version__}") and line.endswith(f"(torch {torch.__version__})")
    commit = code_version()["commit"]
    assert commit is None or f" at {commit[:7]}" in line


@pytest.fixture(scope="module")
def train_help(tmp_path_factory):
    """``grow train --help`` once for the tests of its page (Hydra lists every group's options: ~0.6 s a call)."""
    return grow_cli("train", "--help", cwd=tmp_path_factory.mktemp("help"))


def test_grow_train_help_is_hydras(train_help):
    out = train_help
    assert out.returncode == 0
    assert "Configuration groups" in out.stdout or "== Config ==" in out.stdout


def test_train_baseline_learns_and_writes_its_files(tmp_path):
    run_dir = tmp_path / "run"
    out = grow_cli("train", *TINY_RUN, "trainer.max_tokens=60000", f"hydra.run.dir={run_dir}", cwd=tmp_path)
    assert out.returncode == 0, out.stderr[-3000:]
    summary = json.loads((run_dir / "summary.json").read_text())
    records = read_jsonl(run_dir / "metrics.jsonl")
    assert summary["strategy"] == "baseline" and summary["stages"] == 1
    assert summary["tokens"] >= 60000 - 16 * 32
    # the run keeps its tokenizer: the token cache's, byte for byte
    cached = list(Path(os.environ["GROW_CACHE_DIR"]).rglob("tokenizer.json"))
    assert (run_dir / "tokenizer.json").read_bytes() in {c.read_bytes() for c in cached}
    # learned something: clearly below the uniform prediction ln(V)
    assert summary["final_val_loss"] < math.log(512) - 1.0
    # what a reader needs beside the loss: the split sizes, the epochs seen, the bigram floor (grow.data.floor)
    data = summary["data"]
    assert data["train_tokens"] > 100_000 and data["val_tokens"] > 0
    assert data["epochs"] == pytest.approx(summary["tokens"] / data["train_tokens"], rel=1e-12)
    assert 1.0 < data["bigram_val_loss"] < math.log(512) and data["bigram_train_tokens"] == data["train_tokens"]
    losses = [r["train/loss"] for r in records if "train/loss" in r]
    assert len(losses) >= 5 and all(math.isfinite(v) for v in losses)
    assert {"train/lr", "train/tokens", "train/flops", "train/tokens_per_s", "stage"} <= set(records[0])
    # FLOPs are counted from the model: 6N + attention per token, times tokens
    from grow.model import TransformerConfig

    cfg = TransformerConfig.from_dict(summary["final_config"])
    assert summary["flops"] == pytest.approx(cfg.flops_per_token() * summary["tokens"], rel=1e-12)


# The offline W&B run of the real process landing in its run directory: tests/test_distributed.py's zero
# pair (one process and rank 0, WANDB_MODE=offline). Bad input through the real process (exit status 2,
# one line on stderr, no traceback, no run directory):
# test_grow_cli_in_process_answers_as_the_process_does_and_leaves_no_trace; the full table of bad inputs,
# resume=/nonexistent/run included, runs in-process in tests/test_bad_inputs.py.


# a real subprocess: what it imports, start-up included (this test process holds every module already)
def test_a_grown_eager_run_imports_neither_dynamo_nor_dtensor(tmp_path):
    """torch._dynamo (torch.compiler.disable imports it) and torch.distributed.tensor (with sympy) cost ~2 s of
    a process's start-up: a run that neither compiles nor shards never imports them (`grow.eager`,
    `grow.parallel.fsdp.is_sharded`), its growth and its optimizer's steps included."""
    args = ["-X", "importtime", "-m", "grow", "train", *TINY_RUN, "+schedule=exp", "strategy=zero",
            "trainer.max_tokens=4096", f"hydra.run.dir={tmp_path / 'run'}"]
    out = subprocess.run([sys.executable, *args], cwd=tmp_path, capture_output=True, text=True, timeout=300)
    assert out.returncode == 0, out.stderr[-3000:]
    imported = set(re.findall(r"^import time:.*\|\s*([\w.]+)$", out.stderr, re.M))
    assert {"torch", "grow.model", "grow.optim.bookkeeping", "grow.growth"} <= imported  # the scan sees them
    assert json.loads((tmp_path / "run" / "summary.json").read_text())["stages"] > 1  # it grew
    assert imported & {"torch._dynamo", "sympy", "torch.distributed.tensor", "torch.distributed.fsdp"} == set()


def test_train_help_lists_the_users_groups_and_says_where_the_keys_are_explained(train_help):
    """Before: `grow train --help` listed grow compare's internal arms/strategy group and no word on the keys."""
    out = train_help
    assert out.returncode == 0, out.stderr[-2000:]
    assert "arms/strategy" not in out.stdout and "baseline, equal_flops" not in out.stdout
    assert "strategy: " in out.stdout and "explained by the comment beside it" in out.stdout
    # Hydra lists every directory of configs/ (#65): the help says that sweep is none of a run's
    assert "sweep (listed above) is not a group of a run" in " ".join(out.stdout.split())


def test_train_help_lists_no_model_base(tmp_path):
    """#62: Hydra's help listed ``model: _base, ...`` (the ConfigStore node every model YAML starts from); grow's
    template lists each group with `grow.errors.options`, the rest of Hydra's page unchanged."""
    from grow.errors import options

    out = grow_cli("train", "--help", "model=tiny", cwd=tmp_path)
    assert out.returncode == 0, out.stderr[-2000:]
    groups = out.stdout.split("(group=option)\n\n", 1)[1].split("\n\n== Config ==", 1)[0].splitlines()
    assert f"model: {', '.join(options('model'))}" in groups and "_base" not in out.stdout.split("== Config ==")[0]
    assert [g.split(":")[0] for g in groups] == ["data", "experiment", "logger", "model", "optim", "schedule",
                                                 "schedule/trigger", "strategy", "sweep"]
    assert out.stdout.startswith("train is powered by Hydra.") and "  d_model: 32" in out.stdout  # its config


def test_grow_cli_in_process_answers_as_the_process_does_and_leaves_no_trace(tmp_path, monkeypatch):
    """`grow_cli` (the suite's in-process runner) against `run_grow` (the real process): the same exit
    status and output for help and a refusal; the caller's working directory, environment and sys.argv
    are untouched, an exception is a traceback with status 1."""
    import sys

    from tests.conftest import grow_cli

    before = (os.getcwd(), dict(os.environ), list(sys.argv))
    for args in (["--help"], ["fly"], ["train", *TINY_RUN, "trainer.batch_size=0"]):
        inside, real = grow_cli(*args, cwd=tmp_path, env={"GROW_TEST_MARK": "1"}), run_grow(*args, cwd=tmp_path)
        assert (inside.returncode, inside.stdout, inside.stderr) == (real.returncode, real.stdout, real.stderr), args
    assert_one_line_error(real, "trainer.batch_size")  # the real process's refusal: one line, exit 2
    assert not (tmp_path / "outputs").exists()  # nothing started
    after = (os.getcwd(), dict(os.environ), list(sys.argv))
    changed = {k for k in {*before[1], *after[1]} if before[1].get(k) != after[1].get(k)}
    assert {k for k in changed if not k.startswith("TORCHINDUCTOR_")} == set()  # torch's own cache dir, set lazily
    assert after[0::2] == before[0::2]
    from grow import cli

    def boom():
        raise RuntimeError("boom")

    monkeypatch.setattr(cli, "usage", boom)
    crash = grow_cli("--help", cwd=tmp_path)
    assert crash.returncode == 1 and "Traceback" in crash.stderr and "RuntimeError: boom" in crash.stderr


def test_grow_schedule_into_a_closed_pipe_ends_quietly_with_status_0(tmp_path):
    """#65: `grow schedule | head` ended with exit status 1 and no message (rich's console on a broken pipe). The
    reader here is gone before the first byte: every write meets EPIPE, as after head has read its lines."""
    read, write = os.pipe()
    os.close(read)
    try:
        out = subprocess.run([sys.executable, "-m", "grow", "schedule", "+schedule=exp", "model=tiny"], cwd=tmp_path,
                             stdout=write, stderr=subprocess.PIPE, text=True, timeout=120,
                             env={**os.environ, "PYTHONUNBUFFERED": "1"})
    finally:
        os.close(write)
    assert out.returncode == 0 and out.stderr == "", (out.returncode, out.stderr[-2000:])


def test_cfg_job_prints_each_job_of_a_compare_and_of_a_multirun(tmp_path):
    """``--cfg job`` on a sweep: Hydra's own ``--cfg`` refuses it ("Ambiguous value" for ``grow compare
    strategy=zero,random``; "Only one of --run, --multirun, --cfg" with ``-m``); grow prints one YAML document per
    job, as the command runs them (compare's arms: the baseline first, its pseudo-strategy composed)."""
    import yaml

    out = grow_cli("compare", "strategy=zero,random", "seed=0,1", "model.d_model=64", "--cfg", "job", cwd=tmp_path)
    assert out.returncode == 0, out.stderr
    docs = list(yaml.safe_load_all(out.stdout))
    assert [(d["strategy"]["name"], d["seed"]) for d in docs] == [
        (s, seed) for s in ("baseline", "zero", "random") for seed in (0, 1)]
    assert all(d["model"]["d_model"] == 64 and "hydra" not in d for d in docs)
    assert not list(tmp_path.iterdir())  # nothing written, nothing run

    out = grow_cli("train", "seed=3,4", "-m", "--cfg", "all", "-p", "hydra.sweep", cwd=tmp_path)
    assert out.returncode == 0, out.stderr
    assert out.stdout.count("subdir: ${hydra.job.num}") == 2 and "# job 2 of 2: seed=4" in out.stdout

    out = grow_cli("train", "--cfg", "job", "trainer.max_tokens=123", cwd=tmp_path)  # one job: Hydra's own output
    assert out.returncode == 0 and yaml.safe_load(out.stdout)["trainer"]["max_tokens"] == 123
    assert not out.stdout.startswith("---")


@pytest.mark.parametrize("args, line", [
    (("compare", "--cfg", "jobs"), "error: --cfg='jobs': must be one of job, hydra, all"),
    (("compare", "strategy=zero", "--cfg", "job", "-p", "nope"), "error: --package='nope': not a key"),
    (("compare", "strategy=zero", "--cfg", "job", "model.nope=1"), "error: model.nope: not a key of the config"),
])
def test_cfg_bad_input_is_one_line(tmp_path, args, line):
    out = grow_cli(*args, cwd=tmp_path)
    assert_one_line_error(out, line)


def test_compare_help_is_hydras(tmp_path):
    out = grow_cli("compare", "--help", cwd=tmp_path)
    assert out.returncode == 0, out.stderr
    assert "Configuration groups" in out.stdout and "compare:" in out.stdout
