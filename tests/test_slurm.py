"""A real SLURM (`make test-slurm`, docs/scaling.md): one node on this machine, brought up by
``scripts/slurm.sh up`` (Debian's slurm-wlm and munge, installed when missing), jobs submitted with
``sbatch`` by hydra-submitit-launcher through ``hydra/launcher=slurm`` with the shipped defaults.

- ``grow compare`` with two strategies and the baseline: every arm a SLURM job, the report written
  by the submitting process;
- ``grow train -m ... hydra.launcher.tasks_per_node=2``: one job of two SLURM tasks, two DDP ranks
  (submitit's environment translated to torchrun's), whose losses equal one process's in float64
  (1e-10 relative: the two ranks sum the same rows in another order).

Marked ``slurm``: left out of `make test`, run by `make test-slurm` (and `.ci/run`). If SLURM cannot
be brought up here the tests fail with the script's reason: they never pass without a SLURM.

The cluster is the tests' own: a fresh directory and a free pair of loopback ports, brought up clean and
taken down after the module, so no daemon, state or job of another run (a killed test session's job
holding the node's CPUs) is ever reused. A job that does not finish in time fails its test with the
queue, the jobs' reasons and the daemons' last log lines (``scripts/slurm.sh diagnose``).
"""

from __future__ import annotations

import json
import os
import shutil
import socket
import subprocess
import tempfile
from pathlib import Path

import pytest

from tests.conftest import ROOT, TINY_RUN, run_grow

pytestmark = pytest.mark.slurm

RUN = [*TINY_RUN, "trainer.max_tokens=20000", "data.num_proc=1"]


SCRIPT = ROOT / "scripts" / "slurm.sh"
JOB_TIMEOUT = 420  # seconds for a sweep of tiny jobs that takes ~20 s on an idle 2-core machine


def free_port_pair() -> int:
    """A loopback port p with p and p + 1 both free (slurmctld's and slurmd's)."""
    for _ in range(50):
        with socket.socket() as a:
            a.bind(("127.0.0.1", 0))
            port = a.getsockname()[1]
            with socket.socket() as b:
                try:
                    b.bind(("127.0.0.1", port + 1))
                except OSError:
                    continue
        return port
    raise RuntimeError("no free pair of loopback ports")


@pytest.fixture(scope="module")
def slurm_script_env():
    """The environment that points scripts/slurm.sh at this module's own cluster (directory, ports)."""
    directory = tempfile.mkdtemp(prefix="grow-slurm-")  # short: munge's socket path must fit 108 bytes
    env = {**os.environ, "GROW_SLURM_DIR": directory, "GROW_SLURM_PORT": str(free_port_pair())}
    yield env
    subprocess.run(["bash", str(SCRIPT), "down"], env=env, capture_output=True, timeout=120)
    shutil.rmtree(directory, ignore_errors=True)


@pytest.fixture(scope="module")
def slurm_env(slurm_script_env) -> dict:
    """The environment of a client of the one-node SLURM (``SLURM_CONF``), the daemons up."""
    pytest.importorskip("hydra_plugins.hydra_submitit_launcher")
    up = subprocess.run(["bash", str(SCRIPT), "up"], env=slurm_script_env, capture_output=True, text=True,
                        timeout=600)
    if up.returncode != 0:
        pytest.fail(f"no SLURM here: {up.stderr.strip()[-500:]}")
    env_line = subprocess.run(["bash", str(SCRIPT), "env"], env=slurm_script_env, capture_output=True, text=True,
                              check=True).stdout
    key, _, value = env_line.strip().removeprefix("export ").partition("=")
    return {key: value}


def run_on_slurm(*args: str, cwd: Path, slurm_env: dict, script_env: dict) -> subprocess.CompletedProcess:
    """``run_grow`` through the cluster; past JOB_TIMEOUT the test fails with what SLURM says."""
    try:
        return run_grow(*args, cwd=cwd, env=slurm_env, timeout=JOB_TIMEOUT)
    except subprocess.TimeoutExpired as e:
        why = subprocess.run(["bash", str(SCRIPT), "diagnose"], env=script_env, capture_output=True, text=True,
                             timeout=60)
        err = (e.stderr or b"").decode(errors="replace") if isinstance(e.stderr, bytes) else (e.stderr or "")
        pytest.fail(f"grow {args[0]} did not finish in {JOB_TIMEOUT} s through SLURM.\n{why.stdout}\n"
                    f"--- grow's stderr\n{err[-2000:]}")


def losses(run_dir: Path) -> list[float]:
    recs = [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines()]
    return [r["train/loss"] for r in recs if "train/loss" in r]


def test_compare_runs_every_arm_as_a_slurm_job(slurm_env, slurm_script_env, tmp_path):
    sweep = tmp_path / "sweep"
    out = run_on_slurm("compare", "strategy=zero,svd", "hydra/launcher=slurm", *RUN, f"hydra.sweep.dir={sweep}",
                       cwd=tmp_path, slurm_env=slurm_env, script_env=slurm_script_env)
    assert out.returncode == 0, out.stderr[-3000:]
    tasks = [d.name for d in (sweep / ".submitit").glob("*_*") if d.is_dir()]
    assert len(tasks) == 3, tasks  # one array task of the SLURM job per arm job (baseline, zero, svd)
    summary = json.loads((sweep / "summary.json").read_text())
    arms = {a["arm"] for a in summary["arms"]}
    assert {"baseline", "zero", "svd"} <= arms, arms
    assert (sweep / "report.md").is_file()
    for arm in ("baseline-seed0", "zero-seed0", "svd-seed0"):
        assert json.loads((sweep / arm / "summary.json").read_text())["final_val_loss"] > 0


def test_two_slurm_tasks_are_two_ddp_ranks_equal_to_one_process(slurm_env, slurm_script_env, tmp_path):
    args = [*RUN, "+schedule=exp", "precision=float64"]
    sweep = tmp_path / "sweep"
    out = run_on_slurm("train", "-m", *args, "hydra/launcher=slurm", "hydra.launcher.tasks_per_node=2",
                       f"hydra.sweep.dir={sweep}", cwd=tmp_path, slurm_env=slurm_env, script_env=slurm_script_env)
    assert out.returncode == 0, out.stderr[-3000:]
    (run,) = [p.parent for p in sweep.glob("*/summary.json")]
    assert json.loads((run / "summary.json").read_text())["world_size"] == 2
    one = run_grow("train", *args, f"hydra.run.dir={tmp_path / 'one'}", cwd=tmp_path, timeout=600)
    assert one.returncode == 0, one.stderr[-3000:]
    got, want = losses(run), losses(tmp_path / "one")
    assert len(got) == len(want) > 0
    assert max(abs(a - b) / abs(b) for a, b in zip(got, want)) <= 1e-10


def test_the_launcher_asks_for_gpus_only_where_the_run_needs_them(slurm_env, monkeypatch):
    """device=cpu: none; cuda: one per task; auto: as the partition's nodes have (this node: none)."""
    from grow import slurm

    for key, value in slurm_env.items():
        monkeypatch.setenv(key, value)
    assert slurm.gpus_per_node("cpu", None, 2) == 0
    assert slurm.gpus_per_node("cuda", None, 2) == 2
    assert slurm.gpus_per_node("cuda:1", "debug", 1) == 1
    assert not slurm.partition_has_gpus("debug")
    assert slurm.gpus_per_node("auto", "debug", 4) == 0


def test_a_partition_with_gpus_gets_one_per_task(tmp_path, monkeypatch):
    """``sinfo``'s GRES column naming GPUs (a stand-in sinfo on PATH) makes device=auto ask for them."""
    from grow import slurm

    fake = tmp_path / "sinfo"
    fake.write_text('#!/bin/sh\necho "gpu:h100:8(S:0-1)"\necho "(null)"\n')
    fake.chmod(0o755)
    monkeypatch.setenv("PATH", f"{tmp_path}{os.pathsep}{os.environ['PATH']}")
    assert slurm.partition_has_gpus("gpu")
    assert slurm.gpus_per_node("auto", "gpu", 4) == 4
    assert slurm.gpus_per_node("cpu", "gpu", 4) == 0
