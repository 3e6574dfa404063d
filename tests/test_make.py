"""Every Makefile target a user runs, run through `make` itself at a toy size (docs/design.md, "Commands"): each
exits 0 and writes what it promises, under the test's own directory (the Makefile's SWEEPS, RESULTS_ROOT,
and hydra.run.dir / --out in ARGS), never the checkout. `make sweep` runs several of configs/sweep/'s specs here
(tests/test_sweep.py: the train arms' window, every published spec against its page).

Make runs with ``VENV`` the running interpreter's environment and ``-o <its install stamp>``, so that no
target installs anything (the stamp rule would reinstall when pyproject.toml is newer than the stamp;
tests.helpers.run_make). Two targets whose script has its own test file are run through make there (ELSEWHERE).
"""

from __future__ import annotations

import json
import os
import re
import subprocess
from pathlib import Path

import pytest

from tests.conftest import ROOT, TINY_DATA, TINY_RUN
from tests.helpers import outside_make
from tests.helpers import run_make as make  # make <target> VENV=<this interpreter's> ARGS=...: exit 0

TRAINER = [*(o for o in TINY_RUN if not o.startswith("model=")), "trainer.max_tokens=4096"]  # 8 steps of 16 x 32
TOY = ["model=tiny", *TRAINER]  # the tiny model: about a second a run
NOT_RUN = {  # the targets left out here, and why
    "help": "run by every assert_make_lists (tests/conftest.py)",
    "install": "it installs (the tests run inside an install)",
    "lint": "a developer's check, run by CI",
    "clean": "it deletes the checkout's outputs/ and .venv",
}


def arms(sweep: Path) -> list[tuple[str, list[int]]]:
    """(arm, seeds) of a sweep's summary.json, in the report's order."""
    return [(a["arm"], a["seeds"]) for a in json.loads((sweep / "summary.json").read_text())["arms"]]


def user_targets() -> list[str]:
    """The targets of `make help` (a ``## `` comment) that a user runs: all but the test runners and NOT_RUN."""
    names = re.findall(r"^([a-zA-Z0-9_-]+):.*## ", (ROOT / "Makefile").read_text(), re.M)
    return [n for n in names if n not in NOT_RUN and not n.startswith("test")]


RUN_HERE = ["train", "sweep", "publish-results", "results"]
ELSEWHERE = {  # run through make by the end-to-end test of their script, with its every assertion: the test
    "bench": "tests/test_bench.py::test_make_bench_writes_every_field_on_cpu",
    "gpu-check": "tests/test_gpu_check.py::test_make_gpu_check_runs_end_to_end_on_the_cpu_with_the_tiny_model",
}


def test_every_target_a_user_runs_is_run_here():
    assert sorted(user_targets()) == sorted([*RUN_HERE, *ELSEWHERE])
    for target, test in ELSEWHERE.items():  # the test exists and runs the target through make
        path, name = test.split("::")
        body = (ROOT / path).read_text().split(f"def {name}(", 1)[1].split("\ndef ", 1)[0]
        assert f'run_make("{target}"' in body, test


def test_train(tmp_path):
    make("train", args=[*TOY, f"hydra.run.dir={tmp_path / 'run'}"])
    summary = json.loads((tmp_path / "run" / "summary.json").read_text())
    assert summary["final_val_loss"] > 0 and summary["stages"] > 1  # grown through the schedule


def test_sweep_strategies_runs_the_seeds_and_arms_asked(tmp_path):
    """`make sweep EXP=strategies` is ``grow compare strategy=all`` over the spec's seeds (configs/sweep/); SEEDS and
    an override in ARGS (strategy=zero) replace the spec's."""
    make("sweep", "EXP=strategies", "SEEDS=1", f"SWEEPS={tmp_path}", args=["strategy=zero", *TOY])
    assert arms(tmp_path / "strategies") == [("baseline", [1]), ("zero", [1])]  # SEEDS, not the spec's 0,1,2


@pytest.fixture(scope="module")
def results_sweep(tmp_path_factory):
    """`make sweep EXP=small-1m` at a toy size: zero, the baseline and every stage size at equal FLOPs."""
    sweeps = tmp_path_factory.mktemp("sweeps")
    make("sweep", "EXP=small-1m", "SEEDS=0", f"SWEEPS={sweeps}", args=["strategy=zero", "model=tiny", *TRAINER])
    return sweeps / "small-1m"


def test_sweep_small_1m(results_sweep):
    names = [a for a, _ in arms(results_sweep)]
    assert names[:2] == ["baseline", "zero"] and len([a for a in names if a.startswith("equal_flops")]) > 1
    config = (results_sweep / "zero-seed0" / "config.yaml").read_text()
    assert "n_heads: 2" in config  # the spec's +schedule.start.n_heads=2 reached the run


def test_sweep_one_growth_and_its_learning_rate_check_with_copies(tmp_path):
    """one-growth-45, then one-growth-lr with JOBS=2: two copies of its grow compare share the folder (a log each),
    and the spec's `then` writes the report over both sweeps (the rate 3e-3 read from one-growth-45)."""
    args = ["strategy=zero", *TRAINER, "model.seq_len=32"]  # the experiment's own model sizes, a shorter context
    make("sweep", "EXP=one-growth-45", "SEEDS=0", f"SWEEPS={tmp_path}", args=args)
    assert "zero" in [a for a, _ in arms(tmp_path / "one-growth-45")]
    make("sweep", "EXP=one-growth-lr", "SEEDS=0", "JOBS=2", f"SWEEPS={tmp_path}", args=[*args, "optim.lr=1e-2"])
    assert sorted(p.name for p in (tmp_path / "one-growth-lr" / "jobs").iterdir()) == ["1.log", "2.log"]
    report = arms(tmp_path / "one-growth-lr-report")
    assert any(a.startswith("zero") and "optim.lr=0.01" in a for a, _ in report)
    assert any(a == "zero" or (a.startswith("zero") and "optim.lr=0.003" in a) for a, _ in report), report


def test_sweep_warmstart_runs_a_cell_and_writes_its_heat_map(tmp_path):
    make("sweep", "EXP=warmstart", "SEEDS=0", f"SWEEPS={tmp_path}",
         args=["--arms", "f2-r2", *TINY_DATA, "trainer.max_tokens=8192"])
    cells = json.loads((tmp_path / "warmstart" / "warmstart.json").read_text())["cells"]
    assert [(c["factor"], c["tokens_per_param"], c["n"]) for c in cells] == [(2.0, 2.0, 1)]
    assert (tmp_path / "warmstart" / "f2-r2" / "summary.json").is_file() and (tmp_path / "warmstart" / "warmstart.md").is_file()


def test_publish_results_and_results(tmp_path, results_sweep):
    root = tmp_path / "repo"
    (root / "docs").mkdir(parents=True)
    (root / "docs" / "results.md").write_text("# Results\n")
    make("publish-results", f"SWEEP={results_sweep}", "NAME=toy", f"RESULTS_ROOT={root}")
    assert (root / "docs" / "results" / "toy" / "summary.json").is_file()
    published = (root / "docs" / "results.md").read_text()
    assert "<!-- tables:toy -->" in published
    (root / "docs" / "results.md").write_text(published.replace("| zero |", "| edited |"))
    make("results", f"RESULTS_ROOT={root}")
    assert (root / "docs" / "results.md").read_text() == published  # rendered again from summary.json


def test_the_recipes_grow_is_a_command_the_tests_fork_warm(tmp_path, monkeypatch):
    """The recipes and the scripts they run start grow as ``$(GROW)`` / $GROW (`grow.cli.command`: split as a shell
    would, else this interpreter's ``-m grow``); the tests' GROW, tests/growd.py, forks it from a warm server and
    hands on what a process would: the exit status, stderr, the working directory."""
    import sys

    from grow.cli import command
    from tests import growd

    monkeypatch.delenv("GROW", raising=False)
    assert command() == [sys.executable, "-m", "grow"]
    monkeypatch.setenv("GROW", "srun --ntasks=1 'my grow'")
    assert command() == ["srun", "--ntasks=1", "my grow"]
    env = {**os.environ, "GROWD_SOCKET": growd.socket_path()}
    client = [sys.executable, str(ROOT / "tests" / "growd.py")]
    bad = subprocess.run([*client, "train", "model=tyni"], cwd=tmp_path, env=env, capture_output=True, text=True)
    assert bad.returncode == 2 and bad.stderr.count("\n") == 1 and "model" in bad.stderr and "tiny" in bad.stderr
    ok = subprocess.run([*client, "train", *TOY, "hydra.run.dir=run"], cwd=tmp_path, env=env, capture_output=True,
                        text=True)
    assert ok.returncode == 0, ok.stderr[-2000:]
    assert json.loads((tmp_path / "run" / "summary.json").read_text())["complete"]  # in the client's directory


@pytest.mark.parametrize("gpu", [False, True])
def test_install_picks_the_cpu_torch_where_nvidia_smi_lists_no_gpu_and_says_what_it_installs(tmp_path, gpu):
    """#65: `make train` on a machine without a GPU pulled ~20 CUDA wheels unless TORCH= was given, behind pip -q
    for ~3 min. The install recipe as make would run it (make -n: nothing installed), under a stand-in nvidia-smi
    that lists a GPU or fails as on a machine without one."""
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    (bin_dir / "nvidia-smi").write_text("#!/bin/sh\necho 'GPU 0: NVIDIA H100 80GB HBM3 (UUID: GPU-0)'\n" if gpu else
                                        "#!/bin/sh\necho 'NVIDIA-SMI has failed: no NVIDIA driver' >&2\nexit 9\n")
    (bin_dir / "nvidia-smi").chmod(0o755)
    env = {**outside_make(), "PATH": f"{bin_dir}:{os.environ['PATH']}"}
    venv = tmp_path / "venv"

    def recipe(*variables: str) -> list[str]:
        out = subprocess.run(["make", "-n", "-B", f"{venv}/.grow-installed", f"VENV={venv}", *variables], cwd=ROOT,
                             env=env, capture_output=True, text=True, timeout=60)
        assert out.returncode == 0, out.stderr
        return out.stdout.splitlines()

    lines = recipe()
    pips = [ln for ln in lines if " -m pip install " in ln]
    assert len(pips) == 2 and not any(" -q" in ln for ln in pips), pips  # pip's own lines show, nothing quiet
    cpu = "--index-url https://download.pytorch.org/whl/cpu --extra-index-url https://pypi.org/simple torch"
    if gpu:
        assert pips[0].endswith("pip install --progress-bar on torch") and "install 1/2: torch with CUDA" in lines[1]
    else:
        assert pips[0].endswith(cpu) and "install 1/2: torch's CPU build (no GPU" in lines[1], lines
    assert "install 2/2: grow" in lines[3] and pips[1].endswith('-e ".[dev,hf,report]"')
    given = [ln for ln in recipe("TORCH=torch==2.13.0") if " -m pip install " in ln]
    assert given[0].endswith('pip install --progress-bar on "torch==2.13.0"')  # a requirement given: as given
