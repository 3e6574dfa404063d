"""Two gloo ranks on CPU (docs/distributed.md): growth under DDP, rank-0-only output, dead and hung peers.

The ranks are started as ``torchrun`` starts them, each in its own working directory, so that a file a
rank other than 0 wrote would show up in its directory (`tests.ranks`: each records its parameters after
each growth and at the end, then runs the real CLI). One test goes through ``torchrun`` itself (its ranks forked
warm through tests/growd.py's client). The
one-process reference of a pair runs in this process (`run_in_process`) unless W&B is on.
"""

from __future__ import annotations

import json
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
import torch

from tests.conftest import TINY_RUN
from tests.ranks import (
    RUN,
    check_growth_run,
    files_under,
    finish,
    launch,
    process_env,
    records,
    run_dir_of,
    run_in_process,
    run_pair,
)

RANKS_SCRIPT = Path(__file__).resolve().parent / "ranks.py"


def check_only_rank0_writes(tmp: Path, wandb: bool = False) -> None:
    """Rank 1 wrote no file; rank 0 wrote exactly what a single process writes (W&B data included)."""
    assert files_under(tmp / "ddp" / "rank1") == [], files_under(tmp / "ddp" / "rank1")
    r0, single = run_dir_of(tmp / "ddp" / "rank0"), run_dir_of(tmp / "single" / "rank0")
    # the ranks agreed on the run directory (rank 1 created it, empty): rank 0's clock, not each rank's own
    assert (tmp / "ddp" / "rank1" / r0.relative_to(tmp / "ddp" / "rank0")).is_dir()
    norm = lambda d: sorted(f.split("/")[0] if f.startswith("wandb/") else f for f in files_under(d))
    assert norm(r0) == norm(single)
    assert files_under(tmp / "ddp" / "rank0") == [str(r0.relative_to(tmp / "ddp" / "rank0") / f) for f in files_under(r0)]
    if wandb:  # the runs were W&B offline: rank 0 wrote the W&B run one process writes, in the run directory
        for d in (r0, single):
            runs = list((d / "wandb").glob("offline-run-*"))
            assert len(runs) == 1 and any(runs[0].glob("*.wandb")), files_under(d)
        assert len([f for f in files_under(r0) if f.startswith("wandb/")]) == \
            len([f for f in files_under(single) if f.startswith("wandb/")])
    summary = json.loads((r0 / "summary.json").read_text())
    assert summary["world_size"] == 2


# ---- tests ------------------------------------------------------------------------------------------


def assert_losses_match(tmp_path, rel: float = 1e-9) -> None:
    """The 2-rank run (``ddp/``) logged the records of the one process (``single/``), every loss within ``rel``."""
    ddp, single = records(run_dir_of(tmp_path / "ddp" / "rank0")), records(run_dir_of(tmp_path / "single" / "rank0"))
    pairs = [(a[k], b[k]) for a, b in zip(ddp, single) for k in a if k.endswith("loss")]
    assert len(ddp) == len(single) and len(pairs) > 40
    assert all(abs(x - y) <= rel * abs(y) for x, y in pairs), max(abs(x - y) / abs(y) for x, y in pairs)

def test_zero_growth_of_every_dimension_on_two_ranks_in_micro_batches_matches_one_process(tmp_path):
    """float64, W&B offline: 2 ranks of 8 rows each, in micro-batches of 3 (3 + 3 + 2, no all-reduce before
    the last), against one process taking the 16 rows at once: the ranks bit-identical after every growth,
    the parameters within 1e-10 of one process's, the same per-step losses to 1e-9 relative; only rank 0
    writes."""
    dump = run_pair(tmp_path, [*TINY_RUN, *RUN, "strategy=zero", "trainer.log_every=1"],
                    ddp_extra=("trainer.micro_batch_size=3",), env={"WANDB_MODE": "offline"})
    worst = check_growth_run(tmp_path, dump, tol=1e-10)
    print(f"zero: max |param(2 ranks) - param(1 process)| = {worst:.3g}")
    assert_losses_match(tmp_path)
    check_only_rank0_writes(tmp_path, wandb=True)


def test_svd_growth_on_two_ranks_reduces_statistics_and_matches_one_process(tmp_path):
    """The real launcher: ``torchrun --standalone --nproc_per_node=2`` (the ranks in one working directory, no
    hydra.run.dir given): the ranks agree on the default run directory and only rank 0 prints the summary;
    svd's statistics summed over the ranks' shards give one process's. torchrun's script is tests/growd.py's
    client, as ``$(GROW)`` of the make targets: each rank is forked warm with torchrun's environment, its
    descriptors and exit status (tests/ranks.py as the script under ``GROWD=0``: a fresh interpreter a rank)."""
    from tests import growd

    args = [*TINY_RUN, *RUN, "strategy=svd"]
    dump, ddp_dir = tmp_path / "dump", tmp_path / "ddp" / "rank0"
    dump.mkdir()
    ddp_dir.mkdir(parents=True)
    if growd.enabled():
        script, env = [growd.__file__, "train", *args], {"GROWD_SOCKET": growd.socket_path(), "GROWD_DUMP": str(dump)}
    else:
        script, env = [str(RANKS_SCRIPT), str(dump), "train", *args], {}
    torchrun = subprocess.Popen([sys.executable, "-m", "torch.distributed.run", "--standalone",
                                 "--nproc_per_node=2", *script],
                                cwd=ddp_dir, env=process_env(env), stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        run_in_process(args, tmp_path / "single" / "rank0", dump)
    except BaseException:
        torchrun.terminate()  # torchrun ends its ranks
        torchrun.communicate(timeout=60)
        raise
    ((rc, out, err),) = finish([torchrun])
    assert rc == 0, err[-4000:]
    assert len(list((ddp_dir / "outputs").glob("*/*"))) == 1  # one run directory, not one per rank
    summary = json.loads((run_dir_of(ddp_dir) / "summary.json").read_text())
    assert summary["world_size"] == 2 and summary["tokens"] > 0
    assert out.count("final_val_loss") == 1  # only rank 0 prints the summary
    worst = check_growth_run(tmp_path, dump, tol=1e-8)
    print(f"svd: max |param(2 ranks) - param(1 process)| = {worst:.3g}")
    ddp = [r for r in records(run_dir_of(ddp_dir)) if "svd/gamma" in r]
    single = [r for r in records(run_dir_of(tmp_path / "single" / "rank0")) if "svd/gamma" in r]
    assert ddp and len(ddp) == len(single)
    for a, b in zip(ddp, single):  # Sigma and T summed over the ranks' shards: the same statistics
        assert a["svd/gamma_rel"] == b["svd/gamma_rel"]
        assert a["svd/stats_loss"] == pytest.approx(b["svd/stats_loss"], rel=1e-10)
        assert a["svd/pred_decrease"] == pytest.approx(b["svd/pred_decrease"], rel=1e-6, abs=1e-12)


def _wait_for_training(cwd: Path, procs, timeout: float = 120) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        for m in cwd.rglob("metrics.jsonl"):
            if "train/loss" in m.read_text():
                return
        if any(p.poll() is not None for p in procs):
            break
        time.sleep(0.2)
    for p in procs:
        p.kill()
    pytest.fail("training did not start: " + "\n".join(p.communicate()[1][-2000:] for p in procs))


@pytest.mark.parametrize("how", ["killed", "hung"])
def test_a_dead_or_hung_rank_ends_the_others_with_a_clear_error(tmp_path, how):
    """SIGKILL: gloo sees the closed connection at once. SIGSTOP: the collective timeout ends it."""
    args = [*TINY_RUN, "trainer.max_tokens=5000000", "trainer.log_every=1"]
    procs = launch(2, args, tmp_path, tmp_path, env={"GROW_DIST_TIMEOUT": "3"})
    try:
        _wait_for_training(tmp_path / "rank0", procs)
        t0 = time.monotonic()
        procs[1].send_signal(signal.SIGKILL if how == "killed" else signal.SIGSTOP)
        _, err = procs[0].communicate(timeout=120)
        seconds = time.monotonic() - t0
    finally:
        for p in procs:
            p.kill()
            p.communicate()
    assert procs[0].returncode == 1, err[-3000:]
    last = err.strip().splitlines()[-1]
    assert last.startswith("error: rank 0/2: lost contact with the other ranks"), err[-3000:]
    assert "Traceback" not in err
    print(f"{how}: rank 0 exited {seconds:.1f}s after its peer stopped: {last[:200]}")
    assert seconds < (30 if how == "killed" else 3 + 30)


def test_run_directory_patterns_use_one_clock():
    from datetime import datetime

    from grow.parallel.distributed import resolve_now

    when = datetime(2024, 5, 6, 7, 8, 9, 123456)
    assert resolve_now("outputs/${now:%Y-%m-%d}/${now:%H-%M-%S.%f}_train", when) == \
        "outputs/2024-05-06/07-08-09.123456_train"
    assert resolve_now("x/${hydra.job.num}/${now:%H}", when) == "x/${hydra.job.num}/07"


def test_shards_cover_the_global_batch_and_scale_the_loss(monkeypatch):
    import grow.parallel.distributed as d

    for world, n in [(2, 16), (3, 16), (4, 6), (8, 8)]:
        monkeypatch.setattr(d, "world_size", lambda w=world: w)
        rows, total = [], 0.0
        for r in range(world):
            monkeypatch.setattr(d, "rank", lambda r=r: r)
            lo, hi = d.shard_range(n)
            rows += list(range(lo, hi))
            total += d.loss_scale(n) / world * 1.0  # DDP averages: sum_r scale_r / W == 1 for equal losses
        assert rows == list(range(n))
        assert total == pytest.approx(1.0)


def test_a_bare_cuda_device_gets_its_index_in_one_process(monkeypatch):
    """`torch.cuda.set_device` refuses a bare ``cuda`` (the first H200 run stopped there): one process takes
    the current device, a rank of a multi-process run its local rank."""
    import grow.parallel.distributed as d

    chosen = []
    monkeypatch.setattr(torch.cuda, "set_device", lambda dev: chosen.append(dev))
    monkeypatch.setattr(torch.cuda, "current_device", lambda: 0)
    monkeypatch.setattr(torch.cuda, "device_count", lambda: 4)
    assert d.device(torch.device("cuda")) == torch.device("cuda", 0) and chosen[-1].index == 0
    monkeypatch.setattr(d, "is_initialized", lambda: True)
    monkeypatch.setattr(d, "_local_rank", 6)
    assert d.device(torch.device("cuda")) == torch.device("cuda", 2)
    assert d.device(torch.device("cuda", 1)) == torch.device("cuda", 1)
    assert d.device(torch.device("cpu")) == torch.device("cpu") and len(chosen) == 3


def test_slurm_launcher_config_composes():
    pytest.importorskip("hydra_plugins.hydra_submitit_launcher")
    from hydra import compose, initialize_config_dir

    from grow import slurm  # noqa: F401 - registers grow_slurm_gpus, which the launcher config reads (grow.cli imports it)
    from grow.config import CONFIG_DIR

    gpus = {}
    with initialize_config_dir(str(CONFIG_DIR), version_base="1.3"):
        for device in ("cpu", "cuda"):
            cfg = compose("train", overrides=["hydra/launcher=slurm", f"device={device}",
                                              "hydra.launcher.tasks_per_node=2"], return_hydra_config=True)
            assert cfg.hydra.launcher._target_.endswith("SlurmLauncher")
            gpus[device] = cfg.hydra.launcher.gpus_per_node
    assert gpus == {"cpu": 0, "cuda": 2}  # one GPU per task where the run needs them (grow.slurm)


def test_compare_runs_through_the_submitit_launcher(tmp_path):
    """`grow compare` through hydra-submitit-launcher (a dev dependency): its local executor (no SLURM
    here) runs every arm as a submitit job (a process of its own), in parallel, exactly as the slurm
    executor of ``hydra/launcher=slurm`` would, and the report equals the basic launcher's (wall-clock
    apart). Both ``grow compare`` commands run in this process."""
    pytest.importorskip("hydra_plugins.hydra_submitit_launcher")
    pytest.importorskip("submitit")
    from tests.conftest import grow_cli

    args = ["compare", "strategy=zero", *TINY_RUN, "trainer.max_tokens=8000"]
    reports = {}
    for launcher in ("basic", "submitit_local"):
        sweep = tmp_path / launcher
        launch = [] if launcher == "basic" else ["hydra/launcher=submitit_local",
                                                  "hydra.launcher.timeout_min=10"]
        out = grow_cli(*args, *launch, f"hydra.sweep.dir={sweep}", cwd=tmp_path, env=process_env())
        assert out.returncode == 0, out.stderr[-4000:]
        assert (sweep / ".submitit").is_dir() == (launcher != "basic") and (sweep / "report.md").is_file()
        assert len(list(sweep.glob("*/summary.json"))) == 2
        reports[launcher] = json.loads((sweep / "summary.json").read_text())
    timing = ("seconds", "time_pct")
    same = lambda arms: [{k: (v["values"] if isinstance(v, dict) and "values" in v else v) for k, v in a.items()
                          if not any(t in k for t in timing) and k != "runs"} for a in arms]
    assert same(reports["basic"]["arms"]) == same(reports["submitit_local"]["arms"])
    assert [a["arm"] for a in reports["basic"]["arms"]] == ["baseline", "zero"]



def test_an_upcycling_run_on_two_ranks_in_micro_batches_matches_one_process(tmp_path):
    """DDP with experts (docs/model.md, "Mixture of experts"): a dense model upcycled 1 -> 2 -> 4 -> 8 experts (top 2; new experts
    start unused, so duplicated ones never tie with their sources), float64, 2 ranks in micro-batches of 3 against
    one process: the ranks bit-identical after every growth, within 1e-10 of one process, the same per-step
    losses to 1e-9 relative. Every expert runs on every micro-batch (on no rows if none chose it), so DDP reduces
    the same gradients everywhere; the balance loss is off (a micro-batch's is of its own rows, and one process
    takes the 16 rows at once: docs/model.md, "Mixture of experts"), the z-loss on."""
    args = [*TINY_RUN, *RUN, "strategy=upcycle", "model.n_experts=8", "model.top_k=2", "schedule.grow=[n_experts]",
            "+schedule.start.n_experts=1", "strategy.new_experts=unused", "strategy.ramp_steps=1000",
            "model.router_aux_coef=0", "model.router_z_coef=0.01", "trainer.log_every=1"]
    dump = run_pair(tmp_path, args, ddp_extra=("trainer.micro_batch_size=3",))
    worst = check_growth_run(tmp_path, dump, tol=1e-10)
    print(f"upcycle: max |param(2 ranks) - param(1 process)| = {worst:.3g}")
    assert_losses_match(tmp_path)
