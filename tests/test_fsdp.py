"""FSDP2 on two gloo ranks (``trainer.parallel=fsdp``, docs/distributed.md, "FSDP2"): every strategy through the
default exponential schedule against one process, sharded checkpoints that resume on 2 ranks and on
1 after a SIGKILL, and what is refused.

The ranks are started as ``torchrun`` starts them (RANK, WORLD_SIZE, MASTER_ADDR, ... in the
environment of ``python -m grow train``). Tolerance: per-step training losses equal to one
process's to 1e-10 relative in float64 (the sharded run reduces gradients over two ranks, so the
sums are ordered differently: measured ~2e-16 here); a growth by units (``trainer.fsdp_growth=auto``,
the default) or on rank 0's host computes what one process computes.
"""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest

from tests.conftest import TINY_RUN, assert_one_line_error, grow_cli, run_grow
from tests.ranks import finish, launch, rank_env

RUN = [*TINY_RUN, "+schedule=exp", "trainer.max_tokens=20000", "trainer.recovery_steps=5", "precision=float64",
       "trainer.log_every=1"]
TOL = 1e-10  # relative, float64 (see the module docstring)


def start(world: int, args: list[str], cwd: Path, env: dict | None = None) -> list:
    """``grow train <args>`` on ``world`` ranks (FSDP when world > 1), all in ``cwd``."""
    extra = ["trainer.parallel=fsdp"] if world > 1 else []
    return launch(world, [*args, *extra], cwd, env={"GROW_DIST_TIMEOUT": "30", **(env or {})}, separate=False)


def losses(run_dir: Path) -> dict[int, float]:
    return {r["train/step"]: r["train/loss"] for r in map(json.loads, (run_dir / "metrics.jsonl").open())
            if "train/loss" in r}


def assert_same_losses(got: dict, want: dict) -> None:
    assert sorted(got) == sorted(want), (sorted(got), sorted(want))
    worst = max(abs(got[k] - want[k]) / abs(want[k]) for k in want)
    assert worst <= TOL, f"per-step losses differ by {worst:.3g} relative (tolerance {TOL:g})"


def ok(results) -> None:
    for rc, _out, err in results:
        assert rc == 0, err[-4000:]


def tails(results) -> list[tuple[int, str]]:
    """Each rank's exit status and the end of its stderr: why a run meant to be killed ended before its kill point."""
    return [(rc, err[-2000:]) for rc, _out, err in results]


@pytest.fixture(scope="module")
def reference(tmp_path_factory):
    """The zero strategy's run in one process: what every stopped and resumed run must equal."""
    d = tmp_path_factory.mktemp("one")
    ok(finish(start(1, [*RUN, "strategy=zero", f"hydra.run.dir={d / 'run'}"], d)))
    return losses(d / "run")


# the default trainer.fsdp_growth=auto grows by units on every rank where the strategy allows it (every one
# here; ligo, not among them, grows on rank 0's host); "host" forces the host path; d_ff=63 splits its rows 32/31
CASES = {**{s: (s, []) for s in ["zero", "vt", "svd", "stack", "hyperclone", "msg", "shrink_perturb", "llama_pro", "dus"]},
         # Eq. 5's rates: set by units, refreshed on the shards (at SGD's default 0.1 this model's trajectory
         # multiplies the sums' rounding, 2e-16, to 4e-10 in 40 steps; at 0.03 it stays below 1e-14)
         "vt-sgd": ("vt", ["optim=sgd", "optim.lr=0.03", "strategy.lr_refresh_every=3"]),
         "svd-vt": ("svd", ["strategy.base=vt", "optim=sgd", "optim.lr=0.03", "strategy.gamma=0.4"]),  # of svd's rows
         "msg-mup": ("msg", ["model.parametrization=mup", "model.mup_base_width=16"]),  # eta / m' per hidden matrix
         "zero-host": ("zero", ["trainer.fsdp_growth=host"]), "zero-uneven": ("zero", ["model.d_ff=63"]),
         "stack-uneven": ("stack", ["model.d_ff=63", "model.n_heads=3"]),
         # svd by units, its statistics and line search on the sharded models: a gamma the held-out loss
         # cannot keep at 0, and uneven shards with batches of odd rows (every rank runs them all)
         "svd-sharded": ("svd", ["trainer.fsdp_growth=sharded", "strategy.gamma=0.4"]),
         "svd-uneven": ("svd", ["model.d_ff=63", "model.n_heads=3", "trainer.batch_size=5"])}


@pytest.mark.fsdp
@pytest.mark.parametrize("case", list(CASES))
def test_every_strategy_grows_a_sharded_model_as_one_process(tmp_path, case):
    strategy, extra = CASES[case]
    args = [*RUN, f"strategy={strategy}"]
    results = finish(start(2, [*args, *extra, f"hydra.run.dir={tmp_path / 'fsdp'}"], tmp_path / "r2")
                     + start(1, [*args, *extra, f"hydra.run.dir={tmp_path / 'one'}"], tmp_path / "r1"))
    ok(results)
    summary = json.loads((tmp_path / "fsdp" / "summary.json").read_text())
    assert summary["world_size"] == 2 and len(summary["growth_events"]) == 3
    assert_same_losses(losses(tmp_path / "fsdp"), losses(tmp_path / "one"))
    one = json.loads((tmp_path / "one" / "summary.json").read_text())
    assert summary["final_config"] == one["final_config"] and summary["params"] == one["params"]
    if strategy == "svd":  # its passes on the sharded models: one process's gamma, held-out loss and FLOPs
        for got, want in zip(summary["growth_events"], one["growth_events"]):
            assert got["svd/gamma"] > 0 or "strategy.gamma=0.4" not in extra
            for k in ("svd/gamma", "svd/heldout_loss", "growth/flops"):
                assert abs(got[k] - want[k]) <= TOL * abs(want[k]), (k, got[k], want[k])
    assert list((tmp_path / "fsdp" / "checkpoints").glob("ckpt-*.dcp/.metadata"))  # sharded checkpoints
    if strategy == "msg":  # grow eval reads the sharded checkpoint (with its masks) as the plain one
        evals = [run_grow("eval", f"run={tmp_path / d}", "max_tokens=2000", cwd=tmp_path)
                 for d in ("fsdp", "one")]
        got, want = (json.loads(out.stdout.strip().splitlines()[-1])["loss"] for out in evals)
        assert abs(got - want) <= TOL * abs(want), (got, want)


PLUGIN = '''"""Two plugin strategies: the zero rule with free entries halved, one declared to grow by units."""
from grow.growth.base import Strategy, register


@register("unitsplug")
class UnitsToy(Strategy):
    grows_by_units = True  # each grown tensor from its own old one and its own draws
    defaults = {"scale": 0.5}

    def free_values(self, ctx, site, slot):
        return super().free_values(ctx, site, slot) * float(self.options["scale"])


@register("hostplug")
class HostToy(UnitsToy):
    grows_by_units = False
'''


@pytest.fixture(scope="module")
def plugin_env(tmp_path_factory) -> dict:
    """GROW_PLUGINS naming a package with `PLUGIN`'s two strategies and their YAMLs."""
    import os

    from tests.conftest import ROOT

    root = tmp_path_factory.mktemp("plugin")
    (root / "unitsplug" / "configs" / "strategy").mkdir(parents=True)
    (root / "unitsplug" / "__init__.py").write_text(PLUGIN)
    for name in ("unitsplug", "hostplug"):
        (root / "unitsplug" / "configs" / "strategy" / f"{name}.yaml").write_text(
            f"name: {name}\nscale: 0.5               # free entries: the initializer's values times this\n")
    path = os.pathsep.join(p for p in (str(root), str(ROOT), os.environ.get("PYTHONPATH", "")) if p)
    return {"GROW_PLUGINS": "unitsplug", "PYTHONPATH": path}


@pytest.mark.fsdp
def test_a_plugin_strategy_declared_by_units_grows_by_units_on_two_ranks_as_one_process(tmp_path, plugin_env):
    """A plugin's strategy that declares `grows_by_units` (no list edited) takes the sharded path: with
    trainer.fsdp_growth=sharded it is accepted (an undeclared one is refused), and its three growths on 2
    gloo ranks give one process's losses (1e-10, float64) and final model."""
    args = [*RUN, "strategy=unitsplug", "trainer.fsdp_growth=sharded"]
    results = finish(start(2, [*args, f"hydra.run.dir={tmp_path / 'fsdp'}"], tmp_path / "r2", plugin_env)
                     + start(1, [*args, f"hydra.run.dir={tmp_path / 'one'}"], tmp_path / "r1", plugin_env))
    ok(results)
    summary = json.loads((tmp_path / "fsdp" / "summary.json").read_text())
    one = json.loads((tmp_path / "one" / "summary.json").read_text())
    assert summary["world_size"] == 2 and len(summary["growth_events"]) == 3
    assert_same_losses(losses(tmp_path / "fsdp"), losses(tmp_path / "one"))
    assert summary["final_config"] == one["final_config"] and summary["params"] == one["params"]


def test_a_plugin_strategy_not_declared_by_units_is_refused_sharded_in_one_line(tmp_path, plugin_env):
    from tests.ranks import forked_grow

    out = forked_grow("train", *RUN, "strategy=hostplug", "trainer.fsdp_growth=sharded", cwd=tmp_path, env=plugin_env)
    assert_one_line_error(out, "trainer.fsdp_growth")
    assert "unitsplug" in out.stderr and "hostplug" not in out.stderr.split("grown by units:")[1]


UPCYCLE = [*RUN, "strategy=upcycle", "model.n_experts=8", "model.top_k=2", "schedule.grow=[n_experts]",
           "+schedule.start.n_experts=1", "schedule.stages=2", "model.router_z_coef=0.01"]


@pytest.mark.fsdp
def test_an_upcycling_growth_on_two_ranks_is_one_process(tmp_path):
    """A dense model upcycled into 8 experts (top 2) on rank 0's host, the experts then sharded as parameters:
    the per-step losses of one process, to 1e-10, with the load-balancing loss (the ranks' routing counts summed
    in each step: docs/model.md, "Mixture of experts") and the z-loss. One
    growth: a duplication 8 -> 16 with top_k fixed would tie the copies, and which one a token takes then turns on
    the last bit of its router logits, which the shards' matmuls round otherwise (docs/model.md, "Experts")."""
    args = UPCYCLE
    results = finish(start(2, [*args, f"hydra.run.dir={tmp_path / 'fsdp'}"], tmp_path / "r2")
                     + start(1, [*args, f"hydra.run.dir={tmp_path / 'one'}"], tmp_path / "r1"))
    ok(results)
    summary = json.loads((tmp_path / "fsdp" / "summary.json").read_text())
    assert summary["world_size"] == 2 and len(summary["growth_events"]) == 1
    assert summary["final_config"]["n_experts"] == 8 and summary["active_params"] < summary["params"]
    assert_same_losses(losses(tmp_path / "fsdp"), losses(tmp_path / "one"))
    assert list((tmp_path / "fsdp" / "checkpoints").glob("ckpt-*.dcp/.metadata"))  # sharded checkpoints


@pytest.mark.crash
@pytest.mark.parametrize("kill", ["step:8", "expand:9", "step:11"], ids=["mid-stage", "mid-growth", "after-growth"])
def test_a_killed_sharded_run_resumes_on_two_ranks_and_on_one(tmp_path, reference, kill):
    """SIGKILL on both ranks mid-stage (a periodic checkpoint at step 6), mid-growth (the first
    growth by units, in block 0's unit: the root's took six expansions) or right after a growth (its
    ``grown`` checkpoint at step 10); resumed on 2 ranks and, from a copy, on 1 process."""
    run = tmp_path / "run"
    killed = finish(start(2, [*RUN, "strategy=zero", "trainer.ckpt_every=3", f"hydra.run.dir={run}"], tmp_path,
                          {"GROW_KILL_AT": kill}))
    assert any(rc == -9 for rc, _, _ in killed), tails(killed)
    assert not (run / "summary.json").exists()
    shutil.copytree(run, tmp_path / "copy")
    ok(finish(start(2, [f"resume={run}"], tmp_path / "again")))
    ok(finish(start(1, [f"resume={tmp_path / 'copy'}"], tmp_path / "alone")))
    assert_same_losses(losses(run), reference)
    assert_same_losses(losses(tmp_path / "copy"), reference)


@pytest.mark.crash
def test_a_one_process_run_resumes_sharded_on_two_ranks(tmp_path, reference):
    run = tmp_path / "run"
    killed = finish(start(1, [*RUN, "strategy=zero", "trainer.ckpt_every=3", f"hydra.run.dir={run}"], tmp_path,
                          {"GROW_KILL_AT": "step:14"}))
    assert killed[0][0] == -9, tails(killed)
    ok(finish(start(2, [f"resume={run}"], tmp_path / "again")))
    assert_same_losses(losses(run), reference)


@pytest.mark.crash
def test_a_kill_while_the_shards_are_written_leaves_the_previous_checkpoint(tmp_path, reference):
    """Rank 0 killed after every rank wrote its shards of the second checkpoint, before the rename: the
    directory is a temporary nobody lists; the resume starts from the first, and removes it."""
    run = tmp_path / "run"
    killed = finish(start(2, [*RUN, "strategy=zero", "trainer.ckpt_every=3", f"hydra.run.dir={run}"], tmp_path,
                          {"GROW_KILL_AT": "ckpt.shards:2"}))
    assert killed[0][0] == -9 and killed[1][0] != 0, tails(killed)  # rank 1 lost its peer: one line, exit 1
    ckpts = run / "checkpoints"
    assert list(ckpts.glob(".ckpt-*.dcp.tmp")) and len(list(ckpts.glob("ckpt-*.json"))) == 1
    ok(finish(start(2, [f"resume={run}"], tmp_path / "again")))
    assert not list(ckpts.glob(".ckpt-*.dcp.tmp"))
    assert_same_losses(losses(run), reference)


def refused_before_joining(args: list[str], tmp_path: Path, monkeypatch):
    """``grow train <args> trainer.parallel=fsdp`` as rank 0 of 2 runs it, in this process, with no rank 1 and
    joining the process group made an error: the refusal must come before the rank joins (every rank runs the
    same checks)."""
    from grow.parallel import distributed

    def join():
        raise AssertionError("the rank joined the process group before the refusal")

    monkeypatch.setattr(distributed, "init", join)
    env = rank_env(0, 2, {"MASTER_ADDR": "127.0.0.1", "MASTER_PORT": "1"})  # nothing connects to it
    out = grow_cli("train", *args, "trainer.parallel=fsdp", f"hydra.run.dir={tmp_path / 'run'}", cwd=tmp_path,
                   env=env)
    assert not (tmp_path / "run").exists()  # refused before Hydra wrote the run directory
    return out


def test_training_only_new_layers_is_refused_under_fsdp(tmp_path, monkeypatch):
    """trainer.train_new_only freezes parameters the shards hold beside trained ones: refused before any work
    (before: after the ranks had joined, and after Hydra had written the run directory)."""
    out = refused_before_joining([*RUN, "schedule.grow=[n_layers]", "model.n_layers=4", "schedule.stages=3",
                                  "strategy=llama_pro", "trainer.train_new_only=true"], tmp_path, monkeypatch)
    assert_one_line_error(out, "error: trainer.train_new_only=True")
    assert "ddp runs it" in out.stderr


@pytest.mark.fsdp
def test_micro_batches_under_fsdp_give_the_whole_batch_step(tmp_path, reference):
    """Every rank runs as many micro-batches as the rank with the most rows (a sharded forward is
    collective); the gradient is still the whole batch's."""
    run = tmp_path / "run"
    ok(finish(start(2, [*RUN, "strategy=zero", "trainer.micro_batch_size=3", f"hydra.run.dir={run}"], tmp_path)))
    assert_same_losses(losses(run), reference)


def test_a_run_refuses_another_number_of_ranks_than_trainer_world_size(tmp_path):
    out = grow_cli("train", *RUN, "trainer.world_size=8", f"hydra.run.dir={tmp_path / 'run'}", cwd=tmp_path)
    assert out.returncode == 2 and "error: trainer.world_size=8" in out.stderr and "null or 1" in out.stderr


def test_fsdp_in_one_process_says_it_trains_the_model_whole(tmp_path):
    out = grow_cli("train", *RUN, "trainer.parallel=fsdp", "trainer.max_tokens=4000",
                   f"hydra.run.dir={tmp_path / 'run'}", cwd=tmp_path)
    assert out.returncode == 0, out.stderr[-2000:]
    assert "trainer.parallel=fsdp in one process (no torchrun): nothing to shard" in out.stdout


@pytest.mark.fsdp
def test_a_growth_by_units_holds_no_whole_model_on_rank_0(tmp_path):
    """Peak resident memory of each rank during one growth of llama-124m's shape from 2 to 4 layers
    (31M parameters after at a 4,096-token vocabulary, AdamW; scripts/fsdp_growth_memory.py, /proc/self/clear_refs + VmHWM): on the
    host path rank 0 holds the whole old and grown model and optimizer state (measured 1,345 MB against
    rank 1's 762 MB: 1.76x); by units rank 0 holds what rank 1 does (976 MB against 962 MB)."""
    import importlib.util

    spec = importlib.util.spec_from_file_location("fsdp_growth_memory", Path(__file__).resolve().parent.parent
                                                  / "scripts" / "fsdp_growth_memory.py")
    script = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(script)
    shape = ["model.vocab_size=4096", "model.n_layers=4", "schedule.start.n_layers=2"]  # the stdlib BPE's vocabulary
    host, units = (script.row(path, script.run_growth(script.overrides(shape, path), 2, tmp_path / path), 2)
                   for path in ("host", "sharded"))
    assert host["params_after"] == units["params_after"] == 31464192
    (h0, h1), (u0, u1) = host["peak_rss_mb"], units["peak_rss_mb"]
    assert h0 >= 1.5 * h1, host
    assert u0 <= 1.25 * u1, units
    assert u0 < h0
    assert set(host["phases"]) == set(units["phases"]) == {"gather", "grow", "shard"}


@pytest.mark.crash
def test_a_sharded_run_killed_inside_its_upcycling_growth_resumes_to_one_processs_losses(tmp_path):
    """SIGKILL on rank 0 inside the upcycling growth (on its host, after the expansion, before the optimizer moves;
    rank 1, waiting for it, ends on the collective's timeout); resumed on 2 ranks from the checkpoint before it:
    the per-step losses of one process never stopped, to 1e-10 (float64)."""
    run = tmp_path / "run"
    ok(finish(start(1, [*UPCYCLE, f"hydra.run.dir={tmp_path / 'one'}"], tmp_path / "r1")))
    killed = finish(start(2, [*UPCYCLE, "trainer.ckpt_every=3", f"hydra.run.dir={run}"], tmp_path,
                          {"GROW_KILL_AT": "growth:1"}))
    assert any(rc == -9 for rc, _, _ in killed), tails(killed)
    assert not (run / "summary.json").exists()
    ok(finish(start(2, [f"resume={run}"], tmp_path / "again")))
    summary = json.loads((run / "summary.json").read_text())
    assert summary["final_config"]["n_experts"] == 8 and len(summary["growth_events"]) == 1
    assert_same_losses(losses(run), losses(tmp_path / "one"))
