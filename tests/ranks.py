"""Rank processes for the multi-rank tests (docs/distributed.md), started as ``torchrun`` starts them.

Each rank gets torchrun's environment (RANK, WORLD_SIZE, MASTER_ADDR, ...), its own working directory
and runs the real CLI, recording its parameters after each growth and at the end when given a dump
directory. A rank is forked from a server process that imported torch, Hydra and grow once
(tests/growd.py, a single thread that never ran an operator, as for the make targets): a rank costs a fork,
not an interpreter's 3-4 s start-up. Tests whose subject is the process itself (torchrun, the entry point's exit
status) start ``python -m grow`` or this file as a script instead.
"""

from __future__ import annotations

import atexit
import json
import os
import select
import shutil
import signal
import subprocess
import sys
import tempfile
import time
import traceback
from pathlib import Path

import pytest
import torch

ROOT = Path(__file__).resolve().parent.parent
TIMEOUT = 300  # seconds, per rank: a hang fails the test instead of blocking CI
RUN = ["+schedule=exp", "trainer.max_tokens=20000", "trainer.recovery_steps=5", "precision=float64"]
# what a rank imports, imported once by the server the ranks fork from
PRELOAD = ["tests.ranks", "grow.cli", "grow.commands.once", "grow.commands.train", "grow.commands.compare", "grow.run",
           "grow.train", "grow.fsdp_growth.sharded", "grow.fsdp_growth.passes", "hydra._internal.hydra", "torch._dynamo", "torch.nn.parallel",
           "torch.distributed.fsdp", "torch.distributed.checkpoint"]
# what many forked commands import on first use (grow report's figures and tests), imported by the server after it
# forked its bare copy: a fork that asks for `bare` sees PRELOAD's modules only. Not wandb: its import makes one
# media directory that every fork would share, and the first run to finish deletes it under the others' tables
EXTRAS = ["pandas", "tokenizers", "grow.report", "matplotlib.figure", "matplotlib.backends.backend_agg",
          "scipy.stats", "statsmodels.stats.power", "statsmodels.stats.weightstats"]


# ---- what a rank runs ----------------------------------------------------------------------------


def _recorders(out: Path) -> dict:
    """Observers (`grow.events`) that save this rank's parameters into ``out``: after each growth (``grown<n>``)
    and at the end (``final``)."""
    from grow.parallel import distributed

    tag = lambda: f"rank{distributed.rank()}of{distributed.world_size()}"
    growths = []

    def save(model, name):
        sd = {k: v.detach().cpu().clone() for k, v in model.named_parameters()}
        torch.save(sd, out / f"{tag()}-{name}.pt")

    def grown(trainer, stage):
        growths.append(stage)
        save(trainer.model, f"grown{len(growths)}")

    return {"grown": grown, "end": lambda trainer: save(trainer.model, "final")}


def worker(dump: str | None, argv: list[str]) -> None:
    """``grow <argv>``, recording parameters (after each growth, at the end) per rank into ``dump`` if given."""
    from grow import events
    from grow.cli import main

    if dump:
        for event, fn in _recorders(Path(dump)).items():
            events.subscribe(event, fn)
    main(argv)


def as_process(main, cwd: str, env: dict) -> int:
    """``main()`` in a forked child as a fresh interpreter would run it: stdout and stderr line-buffered on
    descriptors 1 and 2, in ``cwd``, with the environment ``env`` (its PYTHONPATH first on sys.path); its exit
    status (`exit_status`), the atexit handlers run (a forked child ends in os._exit, which skips them)."""
    sys.stdout, sys.stderr = (open(fd, "w", buffering=1, closefd=False) for fd in (1, 2))
    os.chdir(cwd)
    os.environ.clear()
    os.environ.update(env)
    for path in reversed(env.get("PYTHONPATH", "").split(os.pathsep)):  # as a fresh interpreter puts it first
        if path and path not in sys.path:
            sys.path.insert(0, path)
    try:
        return exit_status(main)
    finally:
        atexit._run_exitfuncs()
        sys.stdout.flush()
        sys.stderr.flush()


def exit_status(main) -> int:
    """``main()``'s exit status as the interpreter gives it: a SystemExit's code (a message: printed to stderr,
    status 1), an uncaught exception's traceback and status 1."""
    try:
        main()
    except SystemExit as exc:
        if not isinstance(exc.code, (int, type(None))):
            print(exc.code, file=sys.stderr)
            return 1
        return exc.code or 0
    except Exception:
        traceback.print_exc()
        return 1
    return 0


def _interpreter_argv(request: dict) -> list[str]:
    """The fresh interpreter's command line for a request the warm server would have forked (``GROWD=0``)."""
    if request["code"]:
        return [sys.executable, "-c", request["code"]]
    return [sys.executable, __file__, request["dump"] or "", *request["argv"]]


class Rank:
    """A rank forked by this test process's warm server (tests/growd.py), with the surface of `subprocess.Popen`
    the tests use; a fresh interpreter under ``GROWD=0``."""

    def __init__(self, argv: list[str], cwd: Path, env: dict, dump: Path | None, code: str | None = None,
                 bare: bool = False):
        """``grow <argv>`` (``dump``: `worker`'s), or the Python source ``code`` as ``python -c`` runs it; ``bare``:
        forked from the server's copy that imported `PRELOAD` only, not `EXTRAS`."""
        from tests import growd

        self._files = Path(tempfile.mkdtemp(prefix="rank-"))
        self._out, self._err = self._files / "stdout", self._files / "stderr"
        self.args, self.returncode, self._texts = argv, None, None
        fds = [os.open(os.devnull, os.O_RDONLY), *(os.open(p, os.O_WRONLY | os.O_CREAT | os.O_TRUNC)
                                                    for p in (self._out, self._err))]
        request = {"argv": argv, "cwd": str(cwd), "env": env, "dump": str(dump) if dump else None, "code": code}
        try:
            if growd.enabled():
                self._conn, self.pid = growd.fork(growd.socket_path() + (".bare" if bare else ""), request, fds)
            else:  # GROWD=0: a fresh interpreter, as the server's fork would have run it
                self._conn, self._popen = None, subprocess.Popen(_interpreter_argv(request), cwd=cwd, env=env,
                                                                 stdin=fds[0], stdout=fds[1], stderr=fds[2])
                self.pid = self._popen.pid
        finally:
            for fd in fds:
                os.close(fd)

    def poll(self, timeout: float = 0.0) -> int | None:
        """The exit status (-n for signal n) once the rank has ended, else None (after ``timeout`` seconds)."""
        if self.returncode is not None:
            return self.returncode
        if self._conn is None:
            try:
                self.returncode = self._popen.wait(timeout)
            except subprocess.TimeoutExpired:
                pass
        elif select.select([self._conn], [], [], timeout)[0]:
            line = self._conn.makefile("r").readline()
            self.returncode = int(line) if line else 1
            self._conn.close()
        return self.returncode

    def send_signal(self, sig: int) -> None:
        if self.poll() is None:
            os.kill(self.pid, sig)

    def kill(self) -> None:
        self.send_signal(signal.SIGKILL)

    def communicate(self, timeout: float | None = None) -> tuple[str, str]:
        if self.poll(timeout) is None:
            raise subprocess.TimeoutExpired(self.args, timeout)
        if self._texts is None:
            self._texts = self._out.read_text(errors="replace"), self._err.read_text(errors="replace")
            shutil.rmtree(self._files, ignore_errors=True)
        return self._texts


# ---- launching -----------------------------------------------------------------------------------


_STORES = []  # the rendezvous stores this process hosts, alive until the session ends


def rendezvous_env() -> dict:
    """MASTER_ADDR and MASTER_PORT of a rendezvous store that this process hosts, bound to a port the OS
    picked (port 0): no other process can take the port between its choice and the bind, as it could
    when rank 0 bound a port found free a moment before (a TCPStore timeout under load). Every rank
    joins it as a client (TORCHELASTIC_USE_AGENT_STORE, as under torchrun, whose agent hosts the store)."""
    store = torch.distributed.TCPStore("127.0.0.1", 0, None, True, wait_for_workers=False)
    _STORES.append(store)
    return {"MASTER_ADDR": "127.0.0.1", "MASTER_PORT": str(store.port),
            "TORCHELASTIC_USE_AGENT_STORE": "True"}


def rank_env(rank: int, world: int, rendezvous: dict) -> dict:
    """The torchrun variables of rank ``rank`` of ``world`` (``rendezvous``: `rendezvous_env`)."""
    return {"RANK": str(rank), "LOCAL_RANK": str(rank), "WORLD_SIZE": str(world),
            "LOCAL_WORLD_SIZE": str(world), **rendezvous}


def process_env(extra: dict | None = None) -> dict:
    """This process's environment as a rank or a script it starts sees it (``extra`` added)."""
    path = os.pathsep.join(p for p in (str(ROOT), os.environ.get("PYTHONPATH", "")) if p)
    return {**os.environ, "PYTHONUNBUFFERED": "1", "OMP_NUM_THREADS": "1", "PYTHONPATH": path, **(extra or {})}


def launch(world: int, args: list[str], tmp: Path, dump: Path | None = None, env: dict | None = None,
           separate: bool = True) -> list[Rank]:
    """``world`` ranks of ``grow train <args>``, rank r in ``tmp/rank<r>`` (``separate``) or all in ``tmp``."""
    rendezvous = rendezvous_env() if world > 1 else {}
    ranks = []
    for r in range(world):
        cwd = tmp / f"rank{r}" if separate else tmp
        cwd.mkdir(parents=True, exist_ok=True)
        dist_env = rank_env(r, world, rendezvous) if world > 1 else {}
        ranks.append(Rank(["train", *args], cwd, process_env({**dist_env, **(env or {})}), dump))
    return ranks


def finish(procs, timeout: float = TIMEOUT) -> list[tuple[int, str, str]]:
    """Wait for every process (killing all of them if one outlives ``timeout``)."""
    results = []
    deadline = time.monotonic() + timeout
    try:
        for p in procs:
            out, err = p.communicate(timeout=max(deadline - time.monotonic(), 1))
            results.append((p.returncode, out, err))
    except subprocess.TimeoutExpired:
        for p in procs:
            p.kill()
        raise
    return results


def forked_grow(*args: str, cwd: Path, env: dict | None = None, environ: dict | None = None,
                timeout: float = TIMEOUT) -> subprocess.CompletedProcess:
    """``grow <args>`` in a forked process, answered as `tests.conftest.run_grow` answers: for a test that needs
    a process of its own (one that fault injection kills, a plugin loaded from GROW_PLUGINS, W&B's service)
    but not a fresh interpreter's start-up. Its environment: this one's with ``env`` added, or ``environ``."""
    rank = Rank(list(args), cwd, environ if environ is not None else process_env(env), None)
    ((code, out, err),) = finish([rank], timeout)
    return subprocess.CompletedProcess(["grow", *args], code, out, err)


def forked_python(code: str, cwd: Path, env: dict | None = None, timeout: float = TIMEOUT,
                  bare: bool = False) -> subprocess.CompletedProcess:
    """``python -c <code>`` forked warm, answered as `subprocess.run` answers: for a process whose start-up must not
    see this one's registries (a plugin loaded from GROW_PLUGINS) but needs no fresh interpreter's start-up.
    ``bare``: from the server's copy without `EXTRAS` (what a test of the core's imports needs)."""
    rank = Rank(["-c"], cwd, process_env(env), None, code=code, bare=bare)
    ((status, out, err),) = finish([rank], timeout)
    return subprocess.CompletedProcess(["python", "-c", code], status, out, err)


def run_in_process(args: list[str], cwd: Path, dump: Path) -> None:
    """``grow train <args>`` in this process, in ``cwd``, recording its parameters as `worker` does."""
    import contextlib

    from grow import events
    from tests.conftest import grow_cli

    cwd.mkdir(parents=True, exist_ok=True)
    with contextlib.ExitStack() as observers:
        for event, fn in _recorders(dump).items():
            observers.enter_context(events.observing(event, fn))
        out = grow_cli("train", *args, cwd=cwd)
    assert out.returncode == 0, out.stderr[-4000:]


def run_pair(tmp: Path, args: list[str], ddp_extra: tuple = (), env: dict | None = None) -> Path:
    """``grow train <args>`` on 2 ranks (``ddp_extra`` added, in ``tmp/ddp/rank<r>``) and on 1 process (in
    ``tmp/single/rank0``), both recording their parameters into ``tmp/dump``, which it returns. The one process
    runs here while the ranks train (`run_in_process`), or as a rank of its own where ``env`` is given (the
    suite's W&B runs are processes of their own: tests/conftest.py)."""
    dump = tmp / "dump"
    dump.mkdir()
    procs = launch(2, [*args, *ddp_extra], tmp / "ddp", dump, env)
    if env is not None:
        procs += launch(1, args, tmp / "single", dump, env)
    else:
        try:
            run_in_process(list(args), tmp / "single" / "rank0", dump)
        except BaseException:
            finish(procs)
            raise
    for rc, _out, err in finish(procs):
        assert rc == 0, err[-4000:]
    return dump


# ---- what the ranks wrote ------------------------------------------------------------------------


def files_under(d: Path) -> list[str]:
    return sorted(str(p.relative_to(d)) for p in d.rglob("*") if p.is_file())


def load_params(dump: Path, tag: str, name: str) -> dict:
    return torch.load(dump / f"{tag}-{name}.pt", weights_only=True)


def max_diff(a: dict, b: dict) -> float:
    assert a.keys() == b.keys()
    return max(float((a[k] - b[k]).abs().max()) for k in a)


def run_dir_of(cwd: Path) -> Path:
    (summary,) = list(cwd.rglob("summary.json"))
    return summary.parent


def records(run_dir: Path) -> list[dict]:
    return [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines()]


def check_growth_run(tmp: Path, dump: Path, tol: float) -> float:
    """Ranks bit-identical after every growth and at the end; close to the single process."""
    stages = sorted(p.stem.split("-")[1] for p in dump.glob("rank0of2-grown*.pt"))
    assert len(stages) == 3, stages  # the exp schedule's 4 stages: 3 growths
    worst = 0.0
    for name in [*stages, "final"]:
        r0, r1 = load_params(dump, "rank0of2", name), load_params(dump, "rank1of2", name)
        single = load_params(dump, "rank0of1", name)
        for k in r0:
            assert torch.equal(r0[k], r1[k]), f"{name}: {k} differs between ranks"
        worst = max(worst, max_diff(r0, single))
    assert worst < tol, worst
    # the logged numbers agree too: global loss, tokens, FLOPs (counted for the global batch)
    ddp, single = records(run_dir_of(tmp / "ddp" / "rank0")), records(run_dir_of(tmp / "single" / "rank0"))
    assert len(ddp) == len(single)
    for a, b in zip(ddp, single):
        assert a["train/tokens"] == b["train/tokens"] and a["train/flops"] == pytest.approx(b["train/flops"])
        for key in ("train/loss", "val/loss", "growth/loss_before", "growth/loss_after"):
            if key in a:
                assert a[key] == pytest.approx(b[key], abs=1e-8), (key, a, b)
    return worst


if __name__ == "__main__":  # torchrun's script (and GROWD=0's rank): python tests/ranks.py <dump or ''> <grow arguments>
    sys.path.insert(0, str(ROOT))
    worker(sys.argv[1] or None, sys.argv[2:])
