"""Shared test settings: CPU, one thread, W&B disabled, a session-wide token cache, tiny data.

W&B: the suite sets its own mode, whatever the caller's (`make test` exports WANDB_MODE=offline,
CI leaves it unset): disabled for every test and every subprocess a test starts, except the tests of
W&B's behaviour, which set WANDB_MODE (and drop credentials) for their own subprocesses. A W&B
service token inherited from the caller (WANDB_SERVICE) is dropped so no test talks to it.
"""

from __future__ import annotations

import gc
import os
import signal
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from tests.growd import GC_THRESHOLD

ROOT = Path(__file__).resolve().parent.parent
# A small corpus and vocabulary so the tokenizer trains in about a second.
TINY_DATA = ["data.vocab_size=512", "data.max_bytes=400000"]
TINY_RUN = ["model=tiny", *TINY_DATA, "trainer.eval_batches=2", "trainer.eval_batch_size=16",
            "trainer.batch_size=16", "trainer.log_every=5", "trainer.eval_every=0", "trainer.progress=false"]

torch.set_num_threads(1)
gc.set_threshold(*GC_THRESHOLD)
os.environ["WANDB_MODE"] = "disabled"
os.environ.pop("WANDB_SERVICE", None)
os.environ.pop("GROW_KILL_AT", None)
os.environ.setdefault("OMP_NUM_THREADS", "1")

from grow import plugins  # noqa: E402 - after the thread and W&B settings

plugins.store_model_base()  # model/_base (the model YAMLs' defaults), before any test composes as grow's CLI does


# make test hands each file whole to the next free worker (--dist loadfile, --no-loadscope-reorder) in collection
# order: the longest files (by --durations on 2 cores) go first, so that none starts last while the other worker
# idles. A stale list costs balance, never a test.
LONGEST_FIRST = ("test_make.py", "test_distributed.py", "test_results.py", "test_reliability.py", "test_operators.py",
                 "test_compare.py", "test_gpu_check.py", "test_fsdp_growth.py", "test_sweep.py")


def pytest_collection_modifyitems(config, items):
    rank = {name: i for i, name in enumerate(LONGEST_FIRST)}
    items.sort(key=lambda item: rank.get(item.path.name, len(LONGEST_FIRST)))  # stable: the others keep their order


@pytest.fixture(scope="session", autouse=True)
def token_cache(tmp_path_factory):
    """One token cache for the whole session (the first run tokenizes, the others reuse it)."""
    d = tmp_path_factory.mktemp("grow-cache")
    os.environ["GROW_CACHE_DIR"] = str(d)
    os.environ["HF_HOME"] = str(d / "hf")
    return d


def run_config(*overrides: str):
    """The `RunConfig` of ``grow train <overrides>`` (composed by Hydra, checked once), what `grow.train.train` takes."""
    from hydra import compose, initialize_config_dir

    from grow.config import CONFIG_DIR
    from grow.run import load as load_run

    with initialize_config_dir(str(CONFIG_DIR), version_base="1.3"):
        return load_run(compose("train", overrides=list(overrides)))


def run_grow(*args: str, cwd: Path, env: dict | None = None, timeout: float = 300) -> subprocess.CompletedProcess:
    """Run the real CLI (`python -m grow ...`) in a subprocess and return the completed process."""
    full_env = {**os.environ, "PYTHONUNBUFFERED": "1", **(env or {})}
    return subprocess.run([sys.executable, "-m", "grow", *args], cwd=cwd, env=full_env, capture_output=True,
                          text=True, timeout=timeout)


def grow_cli(*args: str, cwd: Path, env: dict | None = None, timeout: float | None = None
             ) -> subprocess.CompletedProcess:
    """``grow <args>`` in this process (`grow.cli.main`), in ``cwd`` with ``env`` added, returned as `run_grow`
    returns the real CLI's: exit status, stdout, stderr (an uncaught exception: its traceback, status 1).
    Working directory, environment and sys.argv are restored after. For tests that need a real process
    (signals, torchrun, fault injection that kills, the entry point's own exit status) use `run_grow`."""
    import contextlib
    import io

    from grow import cli, runs
    from grow.checkpoint import files
    from tests.ranks import exit_status

    # what a fresh process has not seen: the checkpoints it hashed, the warnings it said once
    files._VERIFIED.clear()
    runs._UNVERIFIED_SAID.clear()
    out, err = io.StringIO(), io.StringIO()
    saved_env, saved_argv, saved_cwd = dict(os.environ), list(sys.argv), os.getcwd()
    saved_sigint = signal.getsignal(signal.SIGINT)  # a command ended by Ctrl-C arms a second Ctrl-C's os._exit
    try:
        os.environ.update(env or {})
        os.chdir(cwd)
        with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
            code = exit_status(lambda: cli.main(list(args)))
    finally:
        signal.signal(signal.SIGINT, saved_sigint)
        os.chdir(saved_cwd)
        sys.argv[:] = saved_argv
        os.environ.clear()
        os.environ.update(saved_env)
    return subprocess.CompletedProcess(["grow", *args], code, out.getvalue(), err.getvalue())


def assert_make_lists(*targets: str) -> None:
    """``make -s help`` names every target (each with its trailing space where a prefix must not match).
    make is what the README's two commands run: a machine without it fails here."""
    out = subprocess.run(["make", "-s", "help"], cwd=ROOT, capture_output=True, text=True)
    assert out.returncode == 0, out.stderr
    for target in targets:
        assert target in out.stdout, target


def assert_one_line_error(out: subprocess.CompletedProcess, key: str) -> None:
    """Bad input: exit status 2 and exactly one ``error: ...`` line on stderr naming ``key``, no traceback."""
    assert out.returncode == 2, (out.returncode, out.stderr[-2000:])
    lines = [ln for ln in out.stderr.splitlines() if ln.strip()]
    assert len(lines) == 1 and "Traceback" not in out.stderr, out.stderr
    assert lines[0].startswith("error: ") and key in lines[0], lines[0]
