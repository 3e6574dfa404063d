"""Reliability (#16): W&B never stops a run, typos never change the experiment silently, run
directories never mix, a full disk is one line, and a run killed anywhere reruns to the same losses.

Kills are deterministic: ``GROW_KILL_AT=<point>:<n>`` makes the process SIGKILL itself the n-th
time it reaches a named point (`grow.faults`), never at a moment chosen by a timer.
"""

from __future__ import annotations

import errno
import json
import os
import pty
import select
import signal
import subprocess
import sys
import time
import types
from pathlib import Path

import pytest
import torch

from grow import checkpoint, cli
from grow import metrics as glog
from grow import train as train_mod
from grow.errors import DISK_FULL_EXIT, DiskFull, disk_full
from grow.metrics import MetricsLogger, read_metrics, wandb_mode
from grow.run import load as load_run
from tests.conftest import TINY_RUN, assert_one_line_error, grow_cli, run_config
from tests.helpers import comparable, make_cfg
from tests.ranks import Rank, forked_grow, process_env


def no_credentials_env(tmp_path: Path, **extra) -> dict:
    """The environment of a user who never ran `wandb login`: no mode, no key, an empty home."""
    home = tmp_path / "home"
    home.mkdir(exist_ok=True)
    env = {k: v for k, v in os.environ.items() if not k.startswith("WANDB_") and k != "NETRC"}
    env.update(HOME=str(home), WANDB_CONFIG_DIR=str(home / ".config" / "wandb"), PYTHONUNBUFFERED="1")
    env.update(extra)
    return env


# ---- W&B: which mode ------------------------------------------------------------------------------


def test_the_wandb_mode_never_needs_a_prompt(tmp_path):
    netrc = tmp_path / "netrc"
    base = {"NETRC": str(netrc), "WANDB_CONFIG_DIR": str(tmp_path / "cfg")}
    mode, why = wandb_mode(base)
    assert mode == "offline" and "no WANDB_MODE and no W&B credentials" in why
    assert wandb_mode({**base, "WANDB_MODE": "online"})[0] == "offline"  # online without credentials: offline
    assert wandb_mode({**base, "WANDB_MODE": "disabled"}) == ("disabled", None)
    assert wandb_mode({**base, "WANDB_MODE": "offline"}) == ("offline", None)
    assert wandb_mode({**base, "WANDB_MODE": "dryrun"}) == ("offline", None)
    assert wandb_mode({**base, "WANDB_API_KEY": "x" * 40}) == ("online", None)
    netrc.write_text("machine api.wandb.ai\n  login user\n  password " + "k" * 40 + "\n")
    netrc.chmod(0o600)
    assert wandb_mode(base) == ("online", None)  # what `wandb login` writes
    assert wandb_mode({**base, "WANDB_BASE_URL": "https://wandb.example.org"})[0] == "offline"  # another host
    netrc.write_text("machine wandb.example.org\n  login user\n  password " + "k" * 40 + "\n")
    assert wandb_mode({**base, "WANDB_BASE_URL": "https://wandb.example.org"}) == ("online", None)
    assert wandb_mode(base)[0] == "offline"
    mode, why = wandb_mode({**base, "WANDB_MODE": "offlin"})
    assert mode == "offline" and "offlin" in why


class FakeRun:
    def __init__(self, run_id, fail_log=False):
        self.id, self.fail_log, self.logged, self.summary, self.finished = run_id, fail_log, [], {}, False

    def define_metric(self, *a, **k):
        pass

    def log(self, data):
        if self.fail_log:
            raise ConnectionError("the W&B service went away\nsecond line")
        self.logged.append(data)

    def finish(self, exit_code=0):
        self.finished = True


def fake_wandb(monkeypatch, init):
    module = types.SimpleNamespace(init=init, Table=lambda **k: k)
    monkeypatch.setitem(sys.modules, "wandb", module)
    monkeypatch.setenv("WANDB_MODE", "offline")
    return module


def test_the_wandb_growth_table_is_the_runs_growth_events_recoveries_filled(tmp_path, monkeypatch):
    """One growth record: W&B's ``growth/events`` table is built from the run state's growth events (as
    summary.json holds them, each recovery filled in), not from a second copy the logger keeps."""
    run = FakeRun("g1")
    fake_wandb(monkeypatch, lambda **kw: run)
    cfg = run_config(*TINY_RUN, "+schedule=exp", "strategy=zero", "trainer.max_tokens=20000",
                     "trainer.recovery_steps=2")
    summary = train_mod.train(cfg, tmp_path / "run")
    events = summary["growth_events"]
    assert len(events) >= 2 and all(ev.get("growth/recovery") is not None for ev in events)
    tables = [d["growth/events"] for d in run.logged if "growth/events" in d]
    assert len(tables) == 1 and tables[0]["columns"] == glog.GROWTH_COLUMNS
    assert tables[0]["data"] == [[ev.get(c) for c in glog.GROWTH_COLUMNS] for ev in events]
    # the logger keeps no copy of its own: the table is the summary's events, whatever it logged before
    run = FakeRun("g2")
    fake_wandb(monkeypatch, lambda **kw: run)
    logger = MetricsLogger(tmp_path / "b", wandb_cfg={"project": "p"})
    logger.summary({"growth_events": events[:1]})
    logger.close()
    assert [d["growth/events"]["data"] for d in run.logged] == [[[events[0].get(c) for c in glog.GROWTH_COLUMNS]]]


def test_a_wandb_error_at_init_log_or_finish_is_one_warning_and_the_run_goes_on(tmp_path, monkeypatch, capsys):
    def init(**kw):
        raise RuntimeError("UsageError: No API key configured\nmore\nlines")

    fake_wandb(monkeypatch, init)
    logger = MetricsLogger(tmp_path / "a", wandb_cfg={"project": "p"})
    logger.log({"train/loss": 1.0})
    logger.summary({"final_val_loss": 1.0})
    logger.close()
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and err[0].startswith("warning: W&B init failed (RuntimeError: UsageError: No API key")
    assert read_metrics(tmp_path / "a") == [{"train/loss": 1.0}]
    assert json.loads((tmp_path / "a" / "summary.json").read_text())["wandb"]["error"].startswith("init")

    run = FakeRun("r1", fail_log=True)
    fake_wandb(monkeypatch, lambda **kw: run)
    logger = MetricsLogger(tmp_path / "b", wandb_cfg={"project": "p"})
    for i in range(3):
        logger.log({"train/loss": float(i)})
    logger.summary({"final_val_loss": 2.0})
    logger.close()
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and err[0].startswith("warning: W&B log failed (ConnectionError: the W&B service went away)")
    assert [r["train/loss"] for r in read_metrics(tmp_path / "b")] == [0.0, 1.0, 2.0]
    assert run.finished  # the W&B run is closed once, then left alone

    run = FakeRun("r2")
    run.finish = lambda exit_code=0: (_ for _ in ()).throw(OSError("finish timed out"))
    fake_wandb(monkeypatch, lambda **kw: run)
    logger = MetricsLogger(tmp_path / "c", wandb_cfg={"project": "p"})
    logger.log({"train/loss": 1.0})
    logger.close()
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "W&B finish failed (OSError: finish timed out)" in err[0]


def test_a_wandb_id_that_cannot_be_resumed_gets_a_new_run_named_in_the_summary(tmp_path, monkeypatch, capsys):
    calls = []

    def init(**kw):
        calls.append(kw)
        if kw.get("id") == "old123":
            raise RuntimeError("ServerResponseError: run ID old123 is in use")
        return FakeRun("new456")

    fake_wandb(monkeypatch, init)
    logger = MetricsLogger(tmp_path, wandb_cfg={"project": "p"}, resume_id="old123")
    assert logger.wandb_id == "new456" and calls[0]["resume"] == "allow" and calls[1].get("id") is None
    assert calls[0]["mode"] == "offline"
    logger.summary({"final_val_loss": 1.0})
    logger.close()
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "cannot resume W&B run old123" in err[0] and "new W&B run new456" in err[0]
    info = json.loads((tmp_path / "summary.json").read_text())["wandb"]
    assert info == {"mode": "offline", "id": "new456", "replaced_id": "old123", "error": None}


def closed_port() -> int:
    """A loopback port nobody listens on (bound, then released)."""
    import socket

    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def test_an_unreachable_wandb_server_costs_the_configured_wait_then_logs_offline(tmp_path):
    """Online with a key and no route to the server: before, ~100 s of W&B's retries in silence. Now one
    line while it waits at most ``logger.init_timeout`` (the probe refused at once here: a closed
    loopback port), one warning saying how to go offline, and the run logs offline."""
    run_dir, url = tmp_path / "run", f"http://127.0.0.1:{closed_port()}"
    env = no_credentials_env(tmp_path, WANDB_MODE="online", WANDB_API_KEY="x" * 40, WANDB_BASE_URL=url)
    from grow.net import PROXY_VARIABLES

    for proxy in PROXY_VARIABLES:  # the probe is for a direct route (behind a proxy it is left to W&B)
        env.pop(proxy, None)
    out = forked_grow("train", *TINY_RUN, "trainer.max_tokens=4000", "logger.init_timeout=3",
                      f"hydra.run.dir={run_dir}", cwd=tmp_path, environ=env)
    assert out.returncode == 0, out.stderr[-3000:]
    assert f"W&B: connecting to {url} (up to 3 s; WANDB_MODE=offline skips this)" in out.stderr
    (warning,) = [ln for ln in out.stderr.splitlines() if ln.startswith("warning: W&B: cannot reach")]
    assert url in warning and "WANDB_MODE=offline" in warning
    assert json.loads((run_dir / "summary.json").read_text())["wandb"]["mode"] == "offline"
    assert list((run_dir / "wandb").glob("offline-run-*"))


def test_the_reachability_probe_is_bounded_by_its_timeout(monkeypatch):
    """A server that answers is reachable; a closed port is refused; a name that never resolves or a
    connection that hangs ends after the timeout (here: a listening socket that never accepts still
    connects, so the hang is simulated by a lookup of a name in the reserved .invalid domain)."""
    import socket

    from grow.net import PROXY_VARIABLES, unreachable

    for proxy in PROXY_VARIABLES:
        monkeypatch.delenv(proxy, raising=False)
    with socket.socket() as server:
        server.bind(("127.0.0.1", 0))
        server.listen(1)
        assert unreachable(f"http://127.0.0.1:{server.getsockname()[1]}", 5.0) is None
    assert unreachable(f"http://127.0.0.1:{closed_port()}", 5.0)
    assert unreachable("http://grow-test.invalid:80", 2.0)


def test_behind_a_proxy_the_probe_leaves_the_wait_to_wandb(monkeypatch):
    """A direct TCP connection says nothing about a server reached through a proxy: not probed."""
    from grow.net import unreachable

    monkeypatch.setenv("HTTPS_PROXY", "http://127.0.0.1:3128")
    assert unreachable(f"http://127.0.0.1:{closed_port()}", 5.0) is None


def test_init_timeout_is_validated(tmp_path):
    out = grow_cli("train", "logger.init_timeout=0", cwd=tmp_path)
    assert_one_line_error(out, "logger.init_timeout")


def test_a_wandb_mode_that_is_not_one_is_one_line_and_logs_offline(tmp_path):
    """Before: the offline line, then `W&B init failed (ValidationError ...)`: wandb read the bad value too."""
    run_dir = tmp_path / "run"
    out = forked_grow("train", *TINY_RUN, "trainer.max_tokens=4000", f"hydra.run.dir={run_dir}", cwd=tmp_path,
                      environ=no_credentials_env(tmp_path, WANDB_MODE="bogus"))
    assert out.returncode == 0, out.stderr[-3000:]
    said = [ln for ln in out.stderr.splitlines() if ln.startswith(("W&B", "warning: W&B"))]  # grow's, not wandb's
    assert len(said) == 1 and said[0].startswith("W&B: WANDB_MODE='bogus' is not a W&B mode"), said
    info = json.loads((run_dir / "summary.json").read_text())["wandb"]
    assert info["mode"] == "offline" and info["id"] and info["error"] is None


def test_grow_train_without_mode_or_credentials_in_a_terminal_runs_offline_without_a_prompt(tmp_path):
    """No WANDB_MODE, no credentials, stdin, stdout and stderr on a pseudo-terminal: before, W&B prompted for
    an account (and without a terminal, the issue's case 2: `UsageError: No API key configured`, exit 1, an
    empty metrics.jsonl). grow picks the mode from the environment alone, terminal or not: one line,
    offline."""
    run_dir = tmp_path / "run"
    master, slave = pty.openpty()
    proc = subprocess.Popen([sys.executable, "-m", "grow", "train", *TINY_RUN, "trainer.max_tokens=4000",
                             f"hydra.run.dir={run_dir}"], cwd=tmp_path, env=no_credentials_env(tmp_path),
                            stdin=slave, stdout=slave, stderr=slave, start_new_session=True)
    os.close(slave)
    out, deadline = b"", time.monotonic() + 300
    try:
        while time.monotonic() < deadline:
            ready, _, _ = select.select([master], [], [], 1.0)
            if ready:
                try:
                    chunk = os.read(master, 65536)
                except OSError:  # EIO: the child closed the terminal
                    break
                if not chunk:
                    break
                out += chunk
            elif proc.poll() is not None:
                break
        rc = proc.wait(timeout=60)
    finally:
        if proc.poll() is None:
            proc.kill()
        os.close(master)
    text = out.decode(errors="replace")
    assert rc == 0, text[-3000:]
    assert "API key" not in text and "(1) Create" not in text
    lines = [ln for ln in text.splitlines() if ln.startswith("W&B: ")]
    assert len(lines) == 1 and lines[0].startswith("W&B: no WANDB_MODE and no W&B credentials"), text[-3000:]
    assert f"logging offline to {run_dir / 'wandb'}" in lines[0]
    assert f"`wandb sync {run_dir / 'wandb'}/offline-run-*`" in lines[0]
    runs = list((run_dir / "wandb").glob("offline-run-*"))
    assert len(runs) == 1 and any(runs[0].glob("*.wandb"))
    assert json.loads((run_dir / "summary.json").read_text())["wandb"]["mode"] == "offline"
    assert any("train/loss" in r for r in read_metrics(run_dir))


def test_a_resume_whose_wandb_id_is_held_by_an_orphaned_service_still_resumes(tmp_path):
    """SIGKILL leaves the W&B run id held by a W&B service that outlives the process; the rerun
    inherits that service (WANDB_SERVICE), as the tests' own subprocesses did before (#16 item 1)."""
    run_dir = tmp_path / "run"
    args = [*TINY_RUN, "+schedule=exp", "trainer.max_tokens=12000", f"hydra.run.dir={run_dir}"]
    env = {**os.environ, "WANDB_MODE": "offline", "WANDB_SILENT": "true", "PYTHONUNBUFFERED": "1"}
    killed = forked_grow("train", *args, cwd=tmp_path, environ={**env, "GROW_KILL_AT": "growth:2"})
    assert killed.returncode == -signal.SIGKILL, killed.stderr[-3000:]
    wandb_id = checkpoint.latest(run_dir)["wandb_id"]
    assert wandb_id
    holder = subprocess.Popen([sys.executable, "-c", (
        "import os, sys, time, wandb\n"
        f"wandb.init(mode='offline', id={wandb_id!r}, dir={str(tmp_path)!r}, project='grow')\n"
        "print(os.environ['WANDB_SERVICE'], flush=True)\n"
        "time.sleep(300)\n")], env=env, stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True)
    try:
        token = holder.stdout.readline().strip()
        assert token, "the W&B holder did not start"
        # the scenario is real: a client of that service cannot take the id
        probe = subprocess.run([sys.executable, "-c", (
            "import wandb\n"
            f"wandb.init(mode='offline', id={wandb_id!r}, dir={str(tmp_path)!r}, project='grow', resume='allow')\n")],
            env={**env, "WANDB_SERVICE": token}, capture_output=True, text=True, timeout=120)
        assert probe.returncode != 0 and "is in use" in probe.stderr, probe.stderr[-2000:]
        out = forked_grow("train", f"resume={run_dir}", cwd=tmp_path, environ={**env, "WANDB_SERVICE": token})
    finally:
        holder.kill()
        holder.wait()
    assert out.returncode == 0, out.stderr[-3000:]
    info = json.loads((run_dir / "summary.json").read_text())["wandb"]
    assert info["id"] == wandb_id and info["replaced_id"] is None and info["error"] is None
    assert len(list((run_dir / "wandb").glob(f"offline-run-*-{wandb_id}"))) == 2  # the first try and the resume


# ---- typos ------------------------------------------------------------------------------------------


TYPOS = [
    (["+schedul=exp"], "did you mean +schedule=exp?"),
    (["modle=tiny"], "did you mean model=tiny?"),
    (["trainer.lr=1e-3"], "did you mean optim.lr?"),
    (["+trainer.lr=1e-3"], "did you mean optim.lr?"),
    (["trainer.max_token=5"], "did you mean trainer.max_tokens?"),
    (["+model.d_modle=3"], "did you mean model.d_model?"),
    (["schedule.grow=[n_layers]"], "add +schedule=<depth|exp|linear> first"),
    (["+schedule=exp", "strategy.noise=3"], "an option of strategy=hyperclone, net2net"),
    (["strategy=svd"], "a growth strategy needs a growth schedule: add +schedule=exp"),
    (["strategy.layer_position=start"], "a growth strategy needs a growth schedule"),
    # a stage-0 size without the + (the schedule file leaves these keys out): was "did you mean model.d_model?"
    (["+schedule=exp", "schedule.start.d_model=16"], "schedule.start sets it with a +: +schedule.start.d_model=16"),
    (["+schedule=exp", "schedule.start.n_layers=1"], "schedule.start sets it with a +: +schedule.start.n_layers=1"),
    # #65: Hydra's own message and exit 1; configs/sweep/ listed as a group, and +sweep= a 2 KB line
    (["+schedule=exp", "+schedule=linear"], "schedule: added twice (+schedule=exp, then +schedule=linear)"),
    (["+sweep=gpu-depth"], "sweep='gpu-depth': configs/sweep/ holds the sweeps of make sweep EXP=<name>"),
    (["sweep=gpu-depth"], "configs/sweep/ holds the sweeps of make sweep EXP=<name>"),
    (["trainer.train_new_only=true"], "trainer.train_new_only=True: needs a growth schedule (+schedule=exp"),
]


def test_a_value_as_long_as_a_config_section_is_cut_in_the_line():
    from grow.errors import ConfigError

    msg = str(ConfigError("x", {f"key{i}": list(range(20)) for i in range(40)}, "not a key"))
    assert len(msg) < 250 and msg.endswith("characters): not a key") and "..." in msg
    assert str(ConfigError("x", "short", "why")) == "x='short': why"


@pytest.mark.parametrize("overrides,text", TYPOS, ids=[" ".join(o) for o, _ in TYPOS])
def test_a_typo_is_refused_before_any_work_with_the_nearest_key(tmp_path, monkeypatch, capsys, overrides, text):
    monkeypatch.chdir(tmp_path)
    with pytest.raises(SystemExit) as info:
        cli.main(["train", "model=tiny", *overrides, f"hydra.run.dir={tmp_path / 'run'}"])
    err = capsys.readouterr().err.strip().splitlines()
    assert info.value.code == 2 and len(err) == 1 and err[0].startswith("error: ") and text in err[0], err
    assert not (tmp_path / "run").exists()


def test_a_strategy_with_nothing_of_its_own_to_do_is_warned_in_one_line():
    # 2 stages: the tiny model's 2 layers grow once (1 -> 2); exp's 4 would leave growths that grow nothing
    cfg = load_run(make_cfg(*TINY_RUN, "+schedule=exp", "strategy=svd", "schedule.grow=[n_layers]", "schedule.stages=2"))
    (line,) = cfg.strategy_warnings()
    assert line.startswith("strategy=svd grows only d_qk by its own rule, and in every growth of this plan only "
                           "n_layers grow") and "strategy=zero's" in line
    cfg = load_run(make_cfg(*TINY_RUN, "+schedule=exp", "strategy=stack", "schedule.grow=[d_model,d_ff]"))
    assert "strategy=stack grows only n_layers" in cfg.strategy_warnings()[0]
    for strategy, grow in [("svd", "[d_qk,n_layers]"), ("zero", "[n_layers]"), ("net2net", "[d_ff]"),
                           ("hyperclone", "[d_model,d_ff]")]:
        cfg = load_run(make_cfg(*TINY_RUN, "+schedule=exp", f"strategy={strategy}",
                                            f"schedule.grow={grow}", "schedule.stages=2"))
        assert cfg.strategy_warnings() == [], strategy
    from grow.growth.base import ORDER, REGISTRY, strategy_class

    for name in ("zero", "random", "net2net", "vt", "svd", "stack", "hyperclone", "msg"):
        strategy_class(name)
    for name, cls in REGISTRY.items():  # every strategy declares what it grows itself
        assert cls.own_dims and set(cls.own_dims) <= set(ORDER), name


# ---- run directories ----------------------------------------------------------------------------------


def files_of(run_dir: Path) -> dict:
    return {p: p.read_bytes() for p in run_dir.rglob("*") if p.is_file()}


@pytest.fixture(scope="module")
def small_run(tmp_path_factory) -> Path:
    """One finished 4,000-token run, shared: the tests that use it refuse to touch it, or damage a file of it
    and put it back."""
    cwd = tmp_path_factory.mktemp("small")
    run_dir = cwd / "run"
    first = grow_cli("train", *TINY_RUN, "trainer.max_tokens=4000", f"hydra.run.dir={run_dir}", cwd=cwd)
    assert first.returncode == 0, first.stderr[-3000:]
    return run_dir


@pytest.fixture(scope="module")
def finished_growth_run(tmp_path_factory) -> Path:
    """One finished 8,000-token growth run, shared by the resumes that are refused or have nothing to do."""
    cwd = tmp_path_factory.mktemp("finished")
    run_dir = cwd / "run"
    first = grow_cli("train", *TINY_RUN, "+schedule=exp", "trainer.max_tokens=8000", f"hydra.run.dir={run_dir}",
                     cwd=cwd)
    assert first.returncode == 0, first.stderr[-3000:]
    return run_dir


def test_a_new_run_into_another_runs_directory_is_refused_and_changes_nothing(small_run, tmp_path):
    run_dir = small_run
    before = files_of(run_dir)
    out = grow_cli("train", *TINY_RUN, "trainer.max_tokens=8000", "seed=1", f"hydra.run.dir={run_dir}", cwd=tmp_path)
    assert_one_line_error(out, "hydra.run.dir")
    assert "holds another run's files (metrics.jsonl, summary.json, checkpoints/)" in out.stderr
    assert files_of(run_dir) == before  # .hydra/ included
    # in-process (a directory Hydra did not pick): the trainer refuses it too
    from grow.config import ConfigError

    with pytest.raises(ConfigError, match="hydra.run.dir=.*holds another run's files"):
        train_mod.train(run_config(*TINY_RUN, "trainer.max_tokens=4000"), run_dir)
    assert files_of(run_dir) == before


def test_a_live_run_refuses_a_second_writer_and_its_files_are_untouched(tmp_path):
    """Before: `grow train resume=D` while D trained ran a second trainer in D (42 records for 22 steps,
    two W&B runs with one id). Now the live run holds D's lock; a resume of it and a new run into it
    end in one line, exit 2, before Hydra writes anything there."""
    run_dir = tmp_path / "run"
    live = Rank(["train", *TINY_RUN, "+schedule=exp", "trainer.log_every=1", "trainer.max_tokens=20000000",
                 "trainer.ckpt_every=2", f"hydra.run.dir={run_dir}"], tmp_path, process_env(), None)
    try:
        deadline = time.monotonic() + 240
        while not (checkpoint.list_checkpoints(run_dir) and any("train/loss" in r for r in read_metrics(run_dir))):
            assert live.poll() is None and time.monotonic() < deadline, "the run did not start training"
            time.sleep(0.2)
        overrides = (run_dir / ".hydra" / "overrides.yaml").read_text()
        for args, key in (([f"resume={run_dir}"], "resume"), ([*TINY_RUN, f"hydra.run.dir={run_dir}"], "hydra.run.dir")):
            out = grow_cli("train", *args, cwd=tmp_path)
            assert_one_line_error(out, key)
            assert f"a live process (pid {live.pid})" in out.stderr
        assert (run_dir / ".hydra" / "overrides.yaml").read_text() == overrides
    finally:
        live.send_signal(signal.SIGTERM)  # a checkpoint, then exit 0
        _, err = live.communicate(timeout=300)
    assert live.returncode == 0, err[-3000:]
    steps = [r["train/step"] for r in read_metrics(run_dir) if "train/loss" in r]
    assert steps == list(range(1, len(steps) + 1)), steps  # one writer: every step once, in order


@pytest.mark.parametrize("change,key", [("strategy=svd", "strategy='svd'"), ("trainer.max_tokens=16000", "trainer.max_tokens"),
                                        ("seed=1", "seed=1"), ("optim.lr=0.01", "optim.lr")])
def test_a_resume_that_changes_the_experiment_is_refused(finished_growth_run, tmp_path, change, key):
    """Before: `grow train resume=<a zero run> strategy=svd` went on in the same directory with svd's
    growths, and a finished run's new trainer.max_tokens was dropped without a word."""
    run_dir = finished_growth_run
    before = files_of(run_dir)
    out = grow_cli("train", f"resume={run_dir}", change, cwd=tmp_path)
    assert_one_line_error(out, key)
    assert f"a resume continues {run_dir} as it was" in out.stderr and "start a new run" in out.stderr
    assert files_of(run_dir) == before


@pytest.mark.parametrize("command,where", [("train", "file"), ("train", "under-a-file"), ("train", "unwritable"),
                                           ("compare", "unwritable")])
def test_an_output_directory_that_cannot_be_written_is_one_line(tmp_path, command, where):
    """Before: a traceback from Hydra creating .hydra/ (`OSError: [Errno 30] Read-only file system`,
    `FileExistsError` for a file). /proc stands for a directory nobody may write in (root included)."""
    (tmp_path / "afile").write_text("x")
    target = {"file": tmp_path / "afile", "under-a-file": tmp_path / "afile" / "run",
              "unwritable": Path("/proc/grow-run")}[where]
    key = "hydra.sweep.dir" if command == "compare" else "hydra.run.dir"
    extra = ["strategy=zero"] if command == "compare" else []
    out = grow_cli(command, *extra, *TINY_RUN, f"{key}={target}", cwd=tmp_path)
    assert_one_line_error(out, key)
    assert ("is a file, not a directory" if where != "unwritable" else "cannot write in /proc") in out.stderr
    assert (tmp_path / "afile").read_text() == "x"


@pytest.mark.parametrize("damage", ["unreadable", "too-many-ids"])
def test_a_runs_tokenizer_that_does_not_fit_is_one_line(small_run, tmp_path, damage):
    """Before: `Exception: expected value at line 1 column 1` (a damaged tokenizer.json), or garbage text
    and exit 0 (a tokenizer with more ids than the model's vocabulary)."""
    from tokenizers import Tokenizer
    from tokenizers.models import WordLevel

    run_dir, tokenizer = small_run, small_run / "tokenizer.json"
    good = tokenizer.read_bytes()
    try:
        if damage == "unreadable":
            tokenizer.write_text("{ not json")
        else:
            Tokenizer(WordLevel({f"t{i}": i for i in range(600)}, unk_token="t0")).save(str(tokenizer))
        for command in (["sample", "max_new_tokens=4"], ["eval"]):
            out = grow_cli(command[0], f"run={run_dir}", *command[1:], cwd=tmp_path)
            assert_one_line_error(out, "run=")
            assert ("cannot be read" if damage == "unreadable" else "has 600 ids, the checkpoint's model 512") in out.stderr
    finally:
        tokenizer.write_bytes(good)  # the shared run as it was


def test_a_checkpoint_without_its_manifest_loads_when_named_and_resume_of_a_file_says_what_to_do(small_run, tmp_path):
    """Before: with the .json manifests gone even an explicit ckpt= said `no checkpoint in its
    checkpoints/`, and resume=<a .pt file> said `no such run directory`."""
    from grow import checkpoint as ck

    run_dir = small_run
    newest = ck.latest(run_dir)
    want = grow_cli("eval", f"run={run_dir}", cwd=tmp_path)
    assert want.returncode == 0, want.stderr[-3000:]
    manifests = {m: m.read_bytes() for m in ck.list_checkpoints(run_dir)}
    try:
        for manifest in manifests:
            manifest.unlink()
        check_a_checkpoint_without_its_manifest(run_dir, newest, want, tmp_path)
    finally:
        for manifest, text in manifests.items():  # the shared run as it was
            manifest.write_bytes(text)


def check_a_checkpoint_without_its_manifest(run_dir: Path, newest: dict, want, tmp_path: Path) -> None:
    out = grow_cli("eval", f"run={run_dir}", f"ckpt={newest['path']}", cwd=tmp_path)
    assert out.returncode == 0, out.stderr[-3000:]
    assert [ln for ln in out.stderr.splitlines() if "manifest" in ln] == [
        f"warning: ckpt={newest['path']}: its manifest {Path(newest['path']).with_suffix('.json').name} is missing; "
        f"loading {newest['path']} without checking its size and SHA-256"]
    loss = lambda text: [ln for ln in text.splitlines() if "loss" in ln][:1]
    assert loss(out.stdout) == loss(want.stdout) and loss(out.stdout)
    out = grow_cli("train", f"resume={newest['path']}", cwd=tmp_path)
    assert_one_line_error(out, "resume=")
    assert f"resume takes a run directory and continues from its newest checkpoint: resume={run_dir}" in out.stderr


def test_a_newest_checkpoint_without_its_manifest_is_skipped_in_one_line(tmp_path, monkeypatch, capsys):
    """Before (#45): sample, eval and resume silently used the older checkpoint. Now one warning line names the
    file skipped and the checkpoint used, once per command; the resume goes on from that one."""
    from grow.checkpoint import files

    monkeypatch.chdir(tmp_path)
    run_dir = tmp_path / "run"
    train_mod.train(run_config(*TINY_RUN, "trainer.max_tokens=4000", "trainer.ckpt_every=3"), run_dir)
    older, newest = [checkpoint.read_manifest(p) for p in checkpoint.list_checkpoints(run_dir)[-2:]]
    Path(newest["path"]).with_suffix(".json").unlink()
    monkeypatch.setattr(files, "_SKIPPED_SAID", set(), raising=False)
    warning = (f"warning: {newest['path']} has no manifest (its write was cut short, or the manifest was deleted): "
               f"using the newest checkpoint that has one, {older['path']} (step {older['step']})")
    capsys.readouterr()
    cli.main(["sample", f"run={run_dir}", "max_new_tokens=4"])
    out = capsys.readouterr()
    assert [ln for ln in out.err.splitlines() if "manifest" in ln] == [warning]
    assert f"checkpoint {Path(older['path']).name} (step {older['step']}" in out.err + out.out
    monkeypatch.setattr(files, "_SKIPPED_SAID", set(), raising=False)
    resume = checkpoint.Resume.of(str(run_dir))
    assert resume.manifest()["path"] == older["path"] and resume.manifest()["path"] == older["path"]
    assert [ln for ln in capsys.readouterr().err.splitlines() if "manifest" in ln] == [warning]


def test_a_resumed_runs_wall_clock_counts_every_process(tmp_path):
    """Before: summary.json's wall_seconds was the last process's alone, below train_seconds (all of them).
    Both sessions run in this process (a stop after step 12 as SIGTERM's, then the resume): each one's
    clock starts at its own start, as a new process's does."""
    from tests.helpers import grow_train_stopped_at

    run_dir = tmp_path / "run"
    grow_train_stopped_at(12, *TINY_RUN, "+schedule=exp", "trainer.max_tokens=16000", "trainer.ckpt_every=3",
                          f"hydra.run.dir={run_dir}", cwd=tmp_path)
    before = torch.load(checkpoint.latest(run_dir)["path"], weights_only=True)["state"]
    assert before["wall_seconds"] >= before["train_seconds"] > 0
    out = grow_cli("train", f"resume={run_dir}", cwd=tmp_path)
    assert out.returncode == 0, out.stderr[-3000:]
    summary = json.loads((run_dir / "summary.json").read_text())
    assert summary["wall_seconds"] >= summary["train_seconds"] and summary["wall_seconds"] > before["wall_seconds"]


def test_resuming_a_finished_run_says_so_and_changes_nothing(finished_growth_run, tmp_path):
    run_dir = finished_growth_run
    before = {p: (p.read_bytes(), p.stat().st_mtime_ns) for p in run_dir.rglob("*") if p.is_file()}
    out = grow_cli("train", f"resume={run_dir}", "trainer.log_every=3", "logger.project=other", cwd=tmp_path)
    assert out.returncode == 0, out.stderr[-3000:]  # harmless keys are accepted (a change of the experiment: refused)
    assert out.stdout.strip().startswith(f"resume: {run_dir} is complete (strategy zero,"), out.stdout
    assert "nothing changed" in out.stdout
    assert {p: (p.read_bytes(), p.stat().st_mtime_ns) for p in run_dir.rglob("*") if p.is_file()} == before
    summary = train_mod.train(run_config(*TINY_RUN, "+schedule=exp", "trainer.max_tokens=8000", f"resume={run_dir}"),
                              run_dir)  # in-process: the summary on disk, untouched
    assert summary == json.loads((run_dir / "summary.json").read_text())
    assert {p: (p.read_bytes(), p.stat().st_mtime_ns) for p in run_dir.rglob("*") if p.is_file()} == before


def test_a_resume_is_resolved_once_per_command(finished_growth_run, tmp_path, monkeypatch):
    """``resume=`` names its run once for the command line (grow.cli.resume_of: the live-writer check, the
    composition, the experiment check and the finished-run check read it) and once for the run (`Run.resumed`, what
    the trainer reads); each check resolved it again before (4 in all for a finished run, 5 for one that goes on)."""
    from grow.checkpoint import resume as resume_mod

    calls = []
    resolve = resume_mod.resolve_resume
    monkeypatch.setattr(resume_mod, "resolve_resume", lambda value: calls.append(value) or resolve(value))
    out = grow_cli("train", f"resume={finished_growth_run}", cwd=tmp_path)
    assert out.returncode == 0 and "nothing changed" in out.stdout, out.stderr[-3000:]
    assert calls == [str(finished_growth_run)] * 2


# ---- a full disk --------------------------------------------------------------------------------------


def test_disk_full_is_only_enospc_and_edquot():
    with pytest.raises(DiskFull, match=r"no space left on the device while writing x \(/p\): free some space; hint"):
        with disk_full("x", "/p", "hint"):
            raise OSError(errno.ENOSPC, "No space left on device")
    with pytest.raises(DiskFull):
        with disk_full("x", "/p"):
            raise OSError(errno.EDQUOT, "Disk quota exceeded")
    with pytest.raises(PermissionError):
        with disk_full("x", "/p"):
            raise PermissionError(errno.EACCES, "denied")


BASE = [*TINY_RUN, "+schedule=exp", "trainer.max_tokens=12000", "trainer.ckpt_every=3", "trainer.keep_checkpoints=2"]


def enospc_on_call(monkeypatch, target, name, n):
    """``target.name`` raises OSError(ENOSPC) from its n-th call on."""
    original, calls = getattr(target, name), {"n": 0}

    def full(*args, **kwargs):
        calls["n"] += 1
        if calls["n"] >= n:
            raise OSError(errno.ENOSPC, "No space left on device")
        return original(*args, **kwargs)

    monkeypatch.setattr(target, name, full)


@pytest.mark.parametrize("where", ["checkpoint", "metrics"])
def test_disk_full_ends_the_run_in_one_line_with_the_earlier_checkpoints_intact(tmp_path, monkeypatch, where):
    run_dir = tmp_path / "run"
    if where == "checkpoint":
        enospc_on_call(monkeypatch, torch, "save", 3)  # the third checkpoint's file
    else:
        real_open = open

        class FullFile:
            def __init__(self, f):
                self.f, self.n = f, 0

            def write(self, text):
                self.n += 1
                if self.n > 12:
                    raise OSError(errno.ENOSPC, "No space left on device")
                return self.f.write(text)

            def __getattr__(self, name):
                return getattr(self.f, name)

        monkeypatch.setattr(glog, "open", lambda *a, **k: FullFile(real_open(*a, **k)), raising=False)
    with pytest.raises(DiskFull) as info:
        train_mod.train(run_config(*BASE), run_dir)
    msg = str(info.value)
    assert "\n" not in msg and msg.startswith("no space left on the device while writing")
    assert f"the earlier checkpoints are intact: resume with `grow train resume={run_dir}`" in msg
    for meta in map(checkpoint.read_manifest, checkpoint.list_checkpoints(run_dir)):
        checkpoint.verify(meta)  # complete, hashes match
    assert checkpoint.list_checkpoints(run_dir) and not list((run_dir / "checkpoints").glob(".*tmp"))
    with pytest.raises(SystemExit) as exit_info:
        with checkpoint.run_outcomes():
            raise info.value
    assert exit_info.value.code == DISK_FULL_EXIT == 4
    monkeypatch.undo()  # space again: the run resumes to the end
    summary = train_mod.train(run_config(*BASE, f"resume={run_dir}"), run_dir)
    assert summary["complete"] is True


def test_disk_full_while_building_the_token_cache(tmp_path, monkeypatch):
    from grow.data import cache

    enospc_on_call(monkeypatch, cache, "_write_atomic", 2)
    cfg = load_run(make_cfg(*BASE, f"data.cache_dir={tmp_path / 'cache'}", "data.max_bytes=200000"))
    with pytest.raises(DiskFull, match=r"while writing the token cache .*nothing was trained yet"):
        train_mod.train(cfg, tmp_path / "run")
    assert not list((tmp_path / "cache").glob("*/meta.json"))  # incomplete: rebuilt by the next run


def test_the_cli_ends_a_full_disk_with_exit_4(tmp_path, monkeypatch):
    """The CLI (in-process: the exit status and stderr the process gives) with torch.save failing with ENOSPC
    (no disk is filled)."""
    def full(*a, **k):
        raise OSError(errno.ENOSPC, "No space left on device")

    monkeypatch.setattr(torch, "save", full)
    run_dir = tmp_path / "run"
    out = grow_cli("train", *TINY_RUN, "+schedule=exp", "trainer.max_tokens=8000", f"hydra.run.dir={run_dir}",
                   cwd=tmp_path)
    assert out.returncode == 4, out.stderr[-3000:]
    last = out.stderr.strip().splitlines()[-1]
    assert last.startswith("error: no space left on the device while writing a checkpoint") and "Traceback" not in out.stderr


# ---- SIGKILL anywhere, then a rerun: the losses of a run never stopped --------------------------------

KILL_RUN = [*TINY_RUN, "+schedule=exp", "trainer.max_tokens=16000", "trainer.log_every=1", "trainer.ckpt_every=3",
            "trainer.keep_checkpoints=2", "trainer.eval_every=7", "trainer.recovery_steps=2"]
# One chain of processes, each killed at the next point (counted from its own start); each rerun
# resumes the newest complete checkpoint (or, before there is one, runs the same command again).
KILL_CHAIN = ["cache:1", "cache:3", "ckpt.tmp:2", "ckpt.pt:1", "ckpt.manifest:1", "step:4", "growth:1", "expand:2",
              "metrics:5", "eval:2", "ckpt.prune:2", "summary:1"]


def run_kill_chain(tmp_path: Path, chain: list[str]) -> tuple[Path, Path]:
    cache, run_dir = tmp_path / "cache", tmp_path / "run"
    env = {**os.environ, "GROW_CACHE_DIR": str(cache), "PYTHONUNBUFFERED": "1"}
    fresh = ["train", *KILL_RUN, f"hydra.run.dir={run_dir}"]
    for point in [*chain, None]:
        resume = bool(checkpoint.list_checkpoints(run_dir))
        argv = ["train", f"resume={run_dir}"] if resume else fresh
        out = forked_grow(*argv, cwd=tmp_path, environ={**env, **({"GROW_KILL_AT": point} if point else {})})
        if point is None:
            assert out.returncode == 0, out.stderr[-3000:]
            assert "is complete" in out.stdout, out.stdout[-2000:]  # the last kill came after summary.json
        else:
            assert out.returncode == -signal.SIGKILL, (point, out.returncode, out.stderr[-3000:])
    return run_dir, cache


def check_equal_to_a_run_never_stopped(tmp_path: Path, run_dir: Path, cache: Path) -> None:
    ref_dir = tmp_path / "reference"
    ref = train_mod.train(run_config(*KILL_RUN, f"data.cache_dir={cache}"), ref_dir)
    summary = json.loads((run_dir / "summary.json").read_text())
    assert summary["final_val_loss"] == ref["final_val_loss"]  # bitwise
    got, want = read_metrics(run_dir), read_metrics(ref_dir)
    losses = lambda rs: [(r.get("train/step"), k, v) for r in rs for k, v in r.items() if "loss" in k]
    assert losses(got) == losses(want) and len([r for r in got if "train/loss" in r]) == ref["state"]["step"]
    assert comparable(got) == comparable(want)
    assert summary["state"] == ref["state"] and summary["flops"] == ref["flops"]
    assert len(list(cache.iterdir())) == 1 and not list(cache.glob("*/*.tmp"))


# one point of each kind (~6 processes); the twelve-point chain below covers every point
QUICK_CHAIN = ["cache:3", "ckpt.tmp:2", "ckpt.pt:1", "growth:1", "expand:2", "summary:1"]


@pytest.mark.crash
def test_sigkill_inside_a_growth_a_checkpoint_write_and_the_cache_build_then_reruns_match(tmp_path):
    run_dir, cache = run_kill_chain(tmp_path, QUICK_CHAIN)
    check_equal_to_a_run_never_stopped(tmp_path, run_dir, cache)


@pytest.mark.crash
def test_sigkill_at_twelve_points_then_reruns_give_the_losses_of_a_run_never_stopped(tmp_path):
    """Inside a growth (between two dimensions' expansions, before the optimizer moves), while a
    checkpoint is written (before its rename, between its two files, before pruning), while the
    token cache is built (twice), inside a step, an evaluation, after a metrics record, after
    summary.json: 13 processes, 12 killed."""
    run_dir, cache = run_kill_chain(tmp_path, KILL_CHAIN)
    check_equal_to_a_run_never_stopped(tmp_path, run_dir, cache)


def test_a_kill_before_the_first_checkpoint_leaves_a_directory_that_says_what_to_do(tmp_path):
    run_dir = tmp_path / "run"
    env = {"GROW_KILL_AT": "metrics:2"}
    out = forked_grow("train", *KILL_RUN, f"hydra.run.dir={run_dir}", cwd=tmp_path, env=env)
    assert out.returncode == -signal.SIGKILL
    out = grow_cli("train", *KILL_RUN, f"hydra.run.dir={run_dir}", cwd=tmp_path)  # the kill needs a process
    assert_one_line_error(out, "hydra.run.dir")
    assert "that run left no checkpoint to resume: delete the directory or train into another one" in out.stderr


# ---- a run without growths checkpoints by time (#65) ----------------------------------------------------


def test_a_checkpoint_is_due_once_ckpt_minutes_have_passed_growth_or_not():
    """`RunControl.due`: by wall-clock (a fake clock here) as well as every ckpt_every steps; never at a
    stage's last step (its end writes one); the clock restarts at every checkpoint."""
    now = [0.0]
    saved = []
    ckpt = types.SimpleNamespace(save=lambda *a: saved.append(a) or Path("x"))
    control = checkpoint.RunControl(ckpt, checkpoint.StopRequest(), [], every=0, logger=None, minutes=10,
                                    clock=lambda: now[0])
    at = types.SimpleNamespace(step=7)
    assert not control.due(at, last=False)
    now[0] = 599.0
    assert not control.due(at, last=False)
    now[0] = 600.0
    assert control.due(at, last=False) and not control.due(at, last=True)
    control.save("step", None, None, at)
    assert not control.due(at, last=False)  # the clock starts again at the checkpoint
    now[0] = 1200.0
    assert control.due(at, last=False)
    off = checkpoint.RunControl(ckpt, checkpoint.StopRequest(), [], every=0, logger=None, minutes=0,
                                clock=lambda: now[0])
    now[0] = 1e9
    assert not off.due(at, last=False)
    assert load_run(make_cfg(*TINY_RUN)).trainer.ckpt_minutes == 10  # on by default


FIXED_RUN = [*TINY_RUN, "trainer.max_tokens=8000", "trainer.log_every=1", "trainer.ckpt_minutes=1e-9"]


def test_a_fixed_size_run_killed_midway_resumes_to_the_losses_of_a_run_never_stopped(tmp_path):
    """No schedule and no ckpt_every (the baseline of every grow compare): the checkpoints by time alone
    (ckpt_minutes this small: one at every step) let a SIGKILLed run resume, to the same losses."""
    cache, run_dir = tmp_path / "cache", tmp_path / "run"
    env = {**os.environ, "GROW_CACHE_DIR": str(cache), "PYTHONUNBUFFERED": "1"}
    out = forked_grow("train", *FIXED_RUN, f"hydra.run.dir={run_dir}", cwd=tmp_path,
                      environ={**env, "GROW_KILL_AT": "step:9"})
    assert out.returncode == -signal.SIGKILL, out.stderr[-3000:]
    steps = [checkpoint.read_manifest(p)["step"] for p in checkpoint.list_checkpoints(run_dir)]
    assert steps and max(steps) < 9 and not (run_dir / "summary.json").exists()
    out = forked_grow("train", f"resume={run_dir}", cwd=tmp_path, environ=env)
    assert out.returncode == 0, out.stderr[-3000:]
    ref = train_mod.train(run_config(*FIXED_RUN, f"data.cache_dir={cache}"), tmp_path / "reference")
    summary = json.loads((run_dir / "summary.json").read_text())
    assert summary["final_val_loss"] == ref["final_val_loss"] and summary["state"]["step"] == ref["state"]["step"] > 9
    losses = lambda rs: [(r.get("train/step"), r["train/loss"]) for r in rs if "train/loss" in r]
    assert losses(read_metrics(run_dir)) == losses(read_metrics(tmp_path / "reference"))


def test_a_disk_that_fills_under_torch_save_is_one_line_exit_4_with_the_earlier_checkpoints_intact(tmp_path, monkeypatch):
    """The file itself raises ENOSPC after some bytes of the third checkpoint, under the real torch.save: its
    zip writer turns that into a RuntimeError ("unexpected pos"), which was a 50-line traceback, exit 1."""
    from grow.checkpoint import files

    real_open, opened = open, []

    class FillingFile:
        def __init__(self, f):
            self.f, self.n = f, 0

        def write(self, b):
            self.n += len(b)
            if self.n > 4096:
                raise OSError(errno.ENOSPC, "No space left on device")
            return self.f.write(b)

        def __getattr__(self, name):
            return getattr(self.f, name)

        def __enter__(self):
            return self

        def __exit__(self, *exc):
            self.f.close()

    def filling_open(path, mode="r", *a, **k):
        f = real_open(path, mode, *a, **k)
        if Path(path).name.endswith(f".pt.{os.getpid()}.tmp"):  # a checkpoint's temporary file
            opened.append(path)
            if len(opened) >= 3:
                return FillingFile(f)
        return f

    monkeypatch.setattr(files, "open", filling_open, raising=False)
    run_dir = tmp_path / "run"
    out = grow_cli("train", *BASE, f"hydra.run.dir={run_dir}", cwd=tmp_path)
    assert out.returncode == DISK_FULL_EXIT == 4, out.stderr[-3000:]
    assert "Traceback" not in out.stderr and "unexpected pos" not in out.stderr, out.stderr[-3000:]
    last = out.stderr.strip().splitlines()[-1]
    assert last.startswith("error: no space left on the device while writing a checkpoint")
    assert f"the earlier checkpoints are intact: resume with `grow train resume={run_dir}`" in last
    kept = checkpoint.list_checkpoints(run_dir)
    assert len(kept) == 2 and not list((run_dir / "checkpoints").glob(".*tmp"))
    for meta in map(checkpoint.read_manifest, kept):
        checkpoint.verify(meta)  # complete: sizes and hashes match
    monkeypatch.undo()  # space again: the run resumes to the end
    assert train_mod.train(run_config(*BASE, f"resume={run_dir}"), run_dir)["complete"] is True
