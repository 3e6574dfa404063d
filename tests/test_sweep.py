"""make sweep's driver (scripts/sweep.py) on grow train arms, end to end on the CPU at a toy size: the corpus built from a
tree of .py files (data=pysrc), the arms run as parallel processes, each run's summary.json in the returned
folder without checkpoints, the report with the effective-compute multiplier from a three-budget frontier, and
a second call that skips what finished (and what is committed)."""

from __future__ import annotations

import copy
import importlib.util
import json
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

from tests.conftest import ROOT
from tests.helpers import outside_make, run_make
from tests.helpers import pysrc_tree as _tree

spec = importlib.util.spec_from_file_location("sweep", ROOT / "scripts" / "sweep.py")
sweep = importlib.util.module_from_spec(spec)
spec.loader.exec_module(sweep)

TOY = ["model=tiny", "model.n_layers=2", "data=pysrc", "data.vocab_size=300", "data.val_every=3", "data.num_proc=1",
       "trainer.batch_size=8", "trainer.eval_batches=2", "trainer.eval_batch_size=8", "trainer.log_every=5",
       "trainer.eval_every=0", "trainer.progress=false", "device=cpu"]


def test_make_sweep_runs_train_arms_at_a_toy_size_and_skips_what_finished(tmp_path, monkeypatch, capsys):
    """Through `make sweep` with EXP a spec's path: EXP, SWEEPS, JOBS and ARGS reach the driver, with a deadline: the spec's estimate makes `fixed-b0` 50 s (the rest in
    proportion to their plan FLOPs), so on 2 slots with 420 s the window's plan ends after it until the rate-check
    group's `cut-me` (300 s) is cut, first in the cut order, while `keep-me` (group msg, later in it) stays and
    `too-long` (no group, 800 s: longer than the window) is never started; an arm with its own seeds runs those,
    and a fixed arm `equal_flops_of` a grown one is that arm's best fixed size in the report. Then a dry run of the
    driver sees only the two that did not run left."""
    monkeypatch.setenv("OMP_NUM_THREADS", "1")
    src = _tree(tmp_path / "src")
    fixed = lambda tokens, **kw: {"kind": "fixed", "overrides": [f"trainer.max_tokens={tokens}"], **kw}
    arms = {"stack-1to2": {"kind": "grown", "overrides": ["+schedule=depth", "strategy=stack",
                                                           "schedule.start.n_layers=1", "trainer.max_tokens=4096"]},
            **{f"fixed-b{i}": fixed(1024 * 2 ** i) for i in range(3)},
            "keep-me": fixed(1024, group="msg", seeds=[1], equal_flops_of="stack-1to2"),
            "cut-me": fixed(6144, group="lr"), "too-long": fixed(16384)}
    common = [*TOY, f"data.roots=[{src}]", f"data.cache_dir={tmp_path / 'cache'}"]
    b0 = sweep.plan_flops([*common, *arms["fixed-b0"]["overrides"]])[0]
    path = tmp_path / "toy.yaml"
    path.write_text(yaml.safe_dump({"name": "toy", "seeds": [0], "arms": arms, "common": common,
                                    "cut_order": ["lr", "msg"], "estimate": {"flops_per_second": b0 / 50}}))
    out, committed = tmp_path / "OUT", tmp_path / "committed"
    r = run_make("sweep", f"EXP={path}", f"SWEEPS={out}", "JOBS=2",
                 args=["--committed", str(committed), "--deadline", "420"])
    assert "sweep: cut (lr): cut-me-seed0 (~300 s" in r.stdout
    assert "cut (never cut, but longer than the window): too-long-seed0 (~800 s" in r.stdout
    assert "cut (msg)" not in r.stdout
    runs = sorted(d.name for d in (out / "toy").iterdir() if (d / "arm.json").is_file())
    assert runs == ["fixed-b0-seed0", "fixed-b1-seed0", "fixed-b2-seed0", "keep-me-seed1", "stack-1to2-seed0"]
    assert sorted(d.name for d in (out / "toy").iterdir() if (d / "summary.json").is_file()) == sorted([*runs, "report"])
    for name in runs:
        d = out / "toy" / name
        assert json.loads((d / "summary.json").read_text())["complete"] and not (d / "checkpoints").exists()
    arm = {n: json.loads((out / "toy" / n / "arm.json").read_text()) for n in runs}
    assert arm["stack-1to2-seed0"]["kind"] == "grown" and arm["fixed-b1-seed0"]["kind"] == "equal_flops"
    assert arm["keep-me-seed1"]["budget_flops"] == arm["stack-1to2-seed0"]["plan_flops"] != arm["keep-me-seed1"]["plan_flops"]
    summary = json.loads((out / "toy" / "report" / "summary.json").read_text())
    assert "manifest" in summary["scale"]["data"]  # the corpus the runs read, named
    ec = summary["effective_compute"]
    md = (out / "toy" / "report" / "report.md").read_text()
    assert "**Effective compute**" in md and f"this one has {len(ec['points'])}" in md
    # a second window: only what did not run is left; a committed run is skipped too
    shutil.rmtree(out / "toy" / "fixed-b0-seed0")
    (committed / "toy").mkdir(parents=True)
    shutil.copytree(out / "toy" / "fixed-b1-seed0", committed / "toy" / "fixed-b0-seed0")
    capsys.readouterr()
    assert sweep.main([str(path), str(out), "--dry-run", "--committed", str(committed)]) == 0
    assert "2 run(s) left of 7" in capsys.readouterr().out


def test_a_window_is_planned_by_the_cut_order():
    """`plan_window` on made-up estimates (100 s): a run longer than the window is cut always; then, on 4 slots, only
    the rate check of the highest seed (lr-1) is needed; on 2, every group in the cut order's turn, runs of no
    group never."""
    job = lambda d, sec, group=None, seed=0: {"dir": d, "seconds": sec, "group": group, "seed": seed}
    jobs = [job("core-a", 90), job("core-b", 90), job("l2-1x", 60, "l2"), job("lr-0", 50, "lr"),
            job("msg", 40, "msg"), job("lr-1", 50, "lr", 1), job("core-long", 150)]
    keep, cut = sweep.plan_window(jobs, 4, 100, ["lr", "msg", "l2"])
    assert [j["dir"] for j in cut] == ["core-long", "lr-1"]
    assert [j["dir"] for j in keep] == ["core-a", "core-b", "l2-1x", "lr-0", "msg"]
    keep, cut = sweep.plan_window(jobs, 2, 100, ["lr", "msg", "l2"])
    assert [j["dir"] for j in cut] == ["core-long", "lr-1", "lr-0", "msg", "l2-1x"]
    assert sweep.finish_times([90, 90, 60, 40], 2) == [90, 90, 150, 130]


def test_the_gpu_depth_sweep_is_the_regime_the_issue_names():
    """configs/sweep/gpu-depth.yaml: 4 layers of width 256, context 256, vocabulary 4,096, muP, WSD, pysrc;
    depth growth 2 -> 4 at 10/25/50% (stack, msg), 1 -> 4 at 25/80%, zero 2x at 25%, issue 48's shrink_perturb and
    llama_pro 2 -> 4 at 25% and MIDAS 1 -> 4 by one layer per stage (PROP-1); four sizes at three
    budgets and two points above the baseline's FLOPs; 20 tokens per non-embedding parameter; the rate check (baseline and stack at 3e-3 and 3e-2)."""
    spec = yaml.safe_load((ROOT / "configs" / "sweep" / "gpu-depth.yaml").read_text())
    flops, cfg = sweep.plan_flops([*spec["common"], *spec["arms"]["stack-2to4-25"]["overrides"]])
    from grow.report.regime import non_embedding_params

    m = cfg.model
    assert (m.n_layers, m.d_model, m.seq_len, m.vocab_size, m.parametrization) == (4, 256, 256, 4096, "mup")
    final = cfg.plan[-1].cfg
    assert non_embedding_params(final) / final.num_params() > 0.5
    assert abs(cfg.trainer.max_tokens / non_embedding_params(final) - 20) < 0.01
    assert cfg.optim.schedule == "wsd" and cfg.data.name == "pysrc" and len(cfg.plan) == 2
    grown = {k: v for k, v in spec["arms"].items() if v["kind"] == "grown" and "-lr" not in k}
    assert len(grown) == 12
    # issue 48's operators: shrink_perturb and llama_pro on the 2 -> 4 growth at 25%, MIDAS 1 -> 2 -> 3 -> 4 (PROP-1)
    for arm, strategy, depths in (("shrink_perturb-2to4-25", "shrink_perturb", [2, 4]),
                                  ("llama_pro-2to4-25", "llama_pro", [2, 4]), ("midas-1to4-prop1", "stack", [1, 2, 3, 4])):
        _, run = sweep.plan_flops([*spec["common"], *grown[arm]["overrides"]])
        plan = run.plan
        assert run.strategy.name == strategy and [s.cfg.n_layers for s in plan] == depths, arm
    assert [s.tokens * 10 // cfg.trainer.max_tokens for s in plan] == [1, 2, 3, 3]  # PROP-1: 10, 20, 30, ~40%
    assert run.strategy.options["order"] == "middle"
    fixed = [v["overrides"] for k, v in spec["arms"].items() if v["kind"] in ("fixed", "baseline") and "-lr" not in k]
    rates = {k: next(o for o in v["overrides"] if o.startswith("optim.lr=")) for k, v in spec["arms"].items() if "-lr" in k}
    assert sorted(rates) == ["fixed-L4-w256-b3-lr3e-2", "fixed-L4-w256-b3-lr3e-3", "stack-2to4-25-lr3e-2",
                             "stack-2to4-25-lr3e-3"] and set(rates.values()) == {"optim.lr=3e-3", "optim.lr=3e-2"}
    assert [k for k, v in spec["arms"].items() if v["kind"] == "baseline"] == ["fixed-L4-w256-b3"]
    sizes = {tuple(o for o in ov if not o.startswith("trainer.max_tokens")) for ov in fixed}
    budgets = {next(o for o in ov if o.startswith("trainer.max_tokens")) for ov in fixed}
    assert len(sizes) == 5 and len(budgets) == 4 and len(fixed) == 14
    # the frontier reaches above the baseline's FLOPs, so an arm ending below the baseline gets a multiplier, not a bound
    base = sweep.plan_flops([*spec["common"], *spec["arms"]["fixed-L4-w256-b3"]["overrides"]])[0]
    above = [sweep.plan_flops([*spec["common"], *spec["arms"][a]["overrides"]])[0] for a in ("fixed-L4-w256-b4", "fixed-L6-w256-b3")]
    assert min(above) > 1.2 * base


def test_arms_and_deadline_pick_what_a_window_runs(tmp_path, capsys):
    """--arms runs only the arms named (a label not in the spec: one line, exit 2); a deadline already passed
    starts nothing (exit 124); the baseline arm is every arm's reference in arm.json, the frontier's fixed arms
    are equal_flops at their own budget."""
    path = ROOT / "configs" / "sweep" / "gpu-depth.yaml"
    assert sweep.main([str(path), str(tmp_path), "--arms", "stack-2to4-25,fixd-L2-w256-b1", "--dry-run"]) == 2
    err = capsys.readouterr().err.strip()
    assert err.count("\n") == 0 and "--arms fixd-L2-w256-b1" in err and "did you mean fixed-L2-w256-b1?" in err
    one = [str(path), str(tmp_path), "--arms", "stack-2to4-25", "--seeds", "0,1", "--dry-run"]
    assert sweep.main([*one, "--committed", str(tmp_path / "none")]) == 0
    assert "2 run(s) left of 2" in capsys.readouterr().out
    assert sweep.main(one) == 0  # both seeds are committed under docs/runs/gpu-depth/
    assert "0 run(s) left of 2" in capsys.readouterr().out
    spec = sweep.load_spec(path)
    jobs = sweep.jobs_of(spec, [0], [])
    kinds = {j["arm"]: sweep.arm_json(j, 1.0) for j in jobs}
    assert kinds["fixed-L4-w256-b3"]["kind"] == "baseline" and kinds["fixed-L4-w256-b3"]["budget_flops"] is None
    assert kinds["fixed-L2-w256-b1"]["kind"] == "equal_flops" and kinds["fixed-L2-w256-b1"]["budget_flops"] == 1.0
    assert {a["baseline_arm"] for a in kinds.values()} == {"fixed-L4-w256-b3"}
    assert kinds["msg-2to4-25"]["strategy"] == "msg" and kinds["fixed-L4-w256-b3"]["strategy"] is None
    import time

    assert sweep.run_all(jobs[:2], tmp_path / "out", 2, stop_at=time.monotonic() - 1) == 124
    assert not (tmp_path / "out").exists()  # nothing started


def test_the_gpu_settle_sweep_is_what_issue_60_asks():
    """configs/sweep/gpu-settle.yaml: gpu-depth's corpus, shapes, muP, WSD and rate with the endpoint fixed in it (the
    validation rules, the decay-phase loss logged every 10 steps); the core arms (baseline, G_stack 2 -> 4 at 25%,
    MIDAS 1 -> 2 -> 3 -> 4) and the 2-layer model at each growth's plan FLOPs (within 0.1%, ~93.2M and 83.1M tokens)
    on seeds 0-5, never cut; the frontier above the baseline (4 layers on 1.5x the tokens, 2 layers on 1.0x its
    FLOPs); the cut order the issue gives; each equal-FLOPs arm's plan within 0.1% of the arm it is equal to."""
    spec = sweep.load_spec(ROOT / "configs" / "sweep" / "gpu-settle.yaml")
    depth = yaml.safe_load((ROOT / "configs" / "sweep" / "gpu-depth.yaml").read_text())
    assert spec["common"][0] == depth["common"][0] == "+experiment=gpu-depth"
    assert {"data.val_near_dup=0.5", "data.val_max_share=0.15", "trainer.log_every=10"} <= set(spec["common"])
    assert spec["cut_order"] == ["lr", "three_layer", "msg", "bu", "same_shape", "l2_1x", "l4_1p5x"]
    arms = spec["arms"]
    core = [k for k, v in arms.items() if v.get("group") is None]
    assert sorted(core) == sorted(["fixed-L4-b3", "stack-2to4-25", "midas-1to4-prop1", "fixed-L2-at-stack",
                                   "fixed-L2-at-midas"])
    assert all(arms[k]["seeds"] == [0, 1, 2, 3, 4, 5] for k in core)
    assert arms["midas-1to4-prop1"]["overrides"] == depth["arms"]["midas-1to4-prop1"]["overrides"]
    assert arms["stack-2to4-25"]["overrides"] == depth["arms"]["stack-2to4-25"]["overrides"]
    planned = {k: sweep.plan_flops(sweep.overrides(spec, k, 0, [])) for k in arms}  # (FLOPs, run) each, composed once
    flops = {k: f for k, (f, _) in planned.items()}
    run = planned["fixed-L2-at-stack"][1]
    assert run.model.n_layers == 2 and run.data.val_max_share == 0.15 and run.optim.lr == 1e-2
    for k, v in arms.items():
        if v.get("equal_flops_of"):
            assert abs(flops[k] / flops[v["equal_flops_of"]] - 1) < 1e-3, k
    assert round(run.trainer.max_tokens / 1e6, 1) == 93.2
    base = flops["fixed-L4-b3"]
    assert abs(flops["fixed-L2-at-base"] / base - 1) < 1e-3 and abs(flops["fixed-L4-b4"] / base - 1.5) < 1e-3
    assert {arms[k].get("group") for k in ("fixed-L2-at-base", "fixed-L4-b4")} == {"l2_1x", "l4_1p5x"}
    jobs = sweep.jobs_of(spec, None, [])
    assert len(jobs) == 7 * 6 + (len(arms) - 7) * 2
    assert [j["dir"] for j in jobs if j["seed"] == 5] == [f"{k}-seed5" for k in arms if k in core or k in
                                                          ("fixed-L4-b4", "fixed-L2-at-base")]
    assert len(sweep.jobs_of(spec, [5], [])) == len(arms)  # --seeds: the arms without their own take it


def test_the_share_cap_on_gpu_depth_s_manifest_is_what_the_page_says():
    """data.val_max_share=0.15 on gpu-depth's committed manifest (the bytes of its 283 validation files): the packages,
    bytes and largest share that docs/results.md's gpu-settle paragraph gives, and the package that leaves."""
    import gzip

    from grow.data import valset

    m = json.loads(gzip.open(ROOT / "docs" / "runs" / "gpu-depth" / "corpus" / "manifest.json.gz").read())
    files = [(e["package"], e["bytes"]) for e in m["files"] if e["split"] == "val"]
    kept = valset.cap_shares(files, 0.15)
    by: dict[str, int] = {}
    for i in kept:
        by[files[i][0]] = by.get(files[i][0], 0) + files[i][1]
    total, largest = sum(by.values()), max(by, key=by.get)
    page = " ".join((ROOT / "docs" / "results.md").read_text().split())
    assert (f"the share cap alone keeps {len(by)} of the {len({p for p, _ in files})} held-out packages, "
            f"{total / 1e6:.2f} MB of {sum(n for _, n in files) / 1e6:.2f} MB, the largest `{largest}` at "
            f"{100 * by[largest] / total:.1f}%; `pydoc_data`") in page
    assert sorted({p for p, _ in files} - set(by)) == ["pydoc_data"]


# ---- one mechanism: every sweep a spec, grow compare arms, the name ----------------------------------------------

PUBLISHED = ["small-1m", "small-4m", "llama-small-1m", "late-expansion", "one-growth-45", "one-growth-60"]
ENVIRONMENT = ("seed", "hydra.sweep.dir", "trainer.progress", "data")  # not the sweep's: where and how it ran


def _first(override: str) -> str:
    """A multirun override's first choice (``strategy=a,b`` -> ``strategy=a``): one config to compose."""
    key, _, value = override.partition("=")
    if value.startswith("["):  # a sweep of lists: [a,b],[c]
        return f"{key}={value.split('],[')[0]}]" if "],[" in value else override
    return f"{key}={value.split(',')[0]}" if "," in value else override


_COMPOSED: dict[tuple[str, ...], dict] = {}  # kept overrides -> config: the published specs' are composed twice


def _composed(overrides: list[str]) -> dict:
    """The config of ``overrides`` but for ENVIRONMENT's keys and the strategy (its values compared as a set); a
    list composed before (the same kept overrides: the same config) is copied, not composed again."""
    from hydra import compose, initialize_config_dir
    from omegaconf import OmegaConf

    from grow.config import CONFIG_DIR

    kept = tuple(_first(o) for o in overrides if o.split("=", 1)[0].lstrip("+").split(".")[0] not in (*ENVIRONMENT, "strategy")
                 and not o.startswith(("hydra.", "trainer.progress", "data.")))
    if kept not in _COMPOSED:
        with initialize_config_dir(str(CONFIG_DIR), version_base="1.3"):
            cfg = OmegaConf.to_container(compose("compare", overrides=list(kept)))
        cfg.pop("data")
        cfg["trainer"].pop("progress")
        _COMPOSED[kept] = cfg
    return copy.deepcopy(_COMPOSED[kept])


def _values(overrides: list[str], key: str) -> set[str]:
    return {v for o in overrides if o.startswith(f"{key}=") for v in o.split("=", 1)[1].split(",")}


@pytest.mark.parametrize("name", PUBLISHED)
def test_a_published_sweeps_spec_runs_what_its_page_says_made_it(name):
    """The spec's `grow compare` (what `make sweep EXP=<name>` runs) composes to the config of each command line
    docs/results/<name>/summary.json says made the sweep (its strategies, seeds and everything but where the
    data and the folder were), so the page's reproduce line reproduces it."""
    import shlex

    spec = sweep.load_spec(sweep.spec_path(name))
    [(_, ours, _)] = sweep.compare_runs(spec, None, [], ROOT / "outputs")
    commands = [shlex.split(c) for c in json.loads((ROOT / "docs" / "results" / name / "summary.json").read_text())["commands"]]
    assert all(c[:2] == ["grow", "compare"] for c in commands)
    made = [c[2:] for c in commands]
    assert _values(ours, "strategy") == set().union(*(_values(c, "strategy") for c in made))
    assert _values(ours, "seed") == set().union(*(_values(c, "seed") for c in made))
    last = made[-1]  # the command that finished the sweep (an earlier one may have lacked a key it resumed with)
    assert _composed(ours) == _composed(last), name


def test_an_unknown_sweep_is_one_line_naming_the_nearest(tmp_path, capsys):
    assert sweep.main(["smal-1m", str(tmp_path)]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "EXP='smal-1m'" in err and "(did you mean small-1m?)" in err
    assert "one-growth-45" in err  # what is allowed
    bad = subprocess.run(["make", "-o", f"{Path(sys.executable).parent.parent}/.grow-installed", "sweep",
                          "EXP=smal-1m", f"VENV={Path(sys.executable).parent.parent}", f"SWEEPS={tmp_path}"],
                         cwd=ROOT, capture_output=True, text=True, env=outside_make())
    errors = [ln for ln in bad.stderr.splitlines() if not ln.startswith("make")]
    assert bad.returncode == 2 and len(errors) == 1 and "did you mean small-1m?" in errors[0], bad.stderr
    assert not (tmp_path / "smal-1m").exists()
    assert sweep.main(["", str(tmp_path)]) == 2  # make sweep without EXP
    assert capsys.readouterr().err.startswith("error: EXP: needed, the name of a sweep of configs/sweep/: allowed dims, ")


@pytest.mark.parametrize("arms, says", [
    ({"a": {"kind": "grwon"}}, "arms.a.kind='grwon': allowed grown, fixed, baseline or compare"),
    ({"a": {"kind": "compare"}, "b": {"kind": "fixed"}}, "arms of kind compare beside grow train arms"),
    ({"a": {"kind": "fixed", "equal_flops_of": "b"}, "b": {"kind": "fixed"}}, "arms.a.equal_flops_of='b': not a grown"),
    ({"a": {"kind": "fixed", "equal_flop_of": "b"}}, "arms.a.equal_flop_of: not a key of a sweep spec: allowed kind, "
                                                     "overrides, seeds, group, equal_flops_of, dir (did you mean equal_flops_of?)"),
])
def test_a_bad_spec_is_one_line_and_exit_status_2(tmp_path, capsys, arms, says):
    path = tmp_path / "bad.yaml"
    path.write_text(yaml.safe_dump({"seeds": [0], "common": [], "arms": arms}))
    assert sweep.main([str(path), str(tmp_path), "--dry-run"]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and says in err, err
    path.write_text(yaml.safe_dump({"seeds": [0], "common": [], "arms": {"a": {"kind": "fixed"}}, "thne": []}))
    assert sweep.main([str(path), str(tmp_path), "--dry-run"]) == 2
    assert "thne: not a key of a sweep spec" in capsys.readouterr().err


def test_every_spec_loads_and_the_command_lines_overrides_win():
    """Each configs/sweep/*.yaml is a valid spec named by its file; an override given on the command line (ARGS)
    replaces the spec's of the same key in place (model=tiny for model=small), and --seeds the spec's seeds."""
    names = sorted(p.stem for p in (ROOT / "configs" / "sweep").glob("*.yaml"))
    assert {*PUBLISHED, "one-growth-lr", "warmstart", "gpu-depth", "gpu-settle", "strategies"} <= set(names)
    for name in names:
        loaded = sweep.load_spec(sweep.spec_path(name))
        assert loaded["name"] == name
        if all(arm["kind"] == "compare" for arm in loaded["arms"].values()):
            for _, ovr, _ in sweep.compare_runs(loaded, None, [], ROOT / "outputs"):
                assert _composed(ovr)["model"], name  # each grow compare composes (its first choice of every sweep)
    spec = sweep.load_spec(sweep.spec_path("small-1m"))
    [(_, ovr, folder)] = sweep.compare_runs(spec, [4, 5], ["model=tiny", "strategy=zero"], Path("/o/small-1m"))
    assert ovr[0] == "model=tiny" and "model=small" not in ovr and _values(ovr, "strategy") == {"zero"}
    assert ovr[-2:] == ["seed=4,5", "hydra.sweep.dir=/o/small-1m"] and folder == Path("/o/small-1m")
    assert sweep.merged(["+a.b=1", "c=2", "a.b=3", "~d"]) == ["a.b=3", "c=2", "~d"]


def test_copies_of_a_grow_compare_share_its_folder(tmp_path, monkeypatch):
    """Two copies of one `grow compare` at once (JOBS=2), started together so that their first claims contend:
    every arm is trained exactly once (one arm banner per arm in the two logs together), and the report rebuilt
    after both has every arm."""
    from tests import growd
    from tests.conftest import TINY_RUN

    monkeypatch.setattr(sweep, "STAGGER", 0)
    monkeypatch.setenv("GROWD_SOCKET", growd.socket_path())  # each copy forked warm
    monkeypatch.setenv("GROW", f"{sys.executable} {growd.__file__}")  # the report too
    monkeypatch.setenv("PYTHONUNBUFFERED", "1")
    d = tmp_path / "sweep"
    cmd = [sys.executable, growd.__file__, "compare", "seed=0,1", "strategy=zero", *TINY_RUN, "trainer.max_tokens=4096",
           f"hydra.sweep.dir={d}"]
    assert sweep.copies(cmd, d, 2) == 0
    text = "".join((d / "jobs" / f"{i}.log").read_text() for i in (1, 2))
    for arm in ("arm baseline, seed 0", "arm baseline, seed 1", "arm zero, seed 0", "arm zero, seed 1"):
        assert text.count(arm) == 1, (arm, text.count(arm))
    arms = {a["arm"]: a for a in json.loads((d / "summary.json").read_text())["arms"]}
    assert set(arms) == {"baseline", "zero"} and all(a["seeds"] == [0, 1] for a in arms.values())


def test_copies_return_a_failing_copys_status_and_bad_jobs_are_one_line(tmp_path, monkeypatch, capsys):
    from tests import growd

    monkeypatch.setattr(sweep, "STAGGER", 0)
    monkeypatch.setenv("GROWD_SOCKET", growd.socket_path())  # the report after the copies forked warm
    monkeypatch.setenv("GROW", f"{sys.executable} {growd.__file__}")
    assert sweep.copies(["sh", "-c", "echo copy"], tmp_path, 2) != 0  # the report of no sweep fails: said
    assert [(tmp_path / "jobs" / f"{i}.log").read_text() for i in (1, 2)] == ["copy\n", "copy\n"]
    assert sweep.copies(["sh", "-c", "exit 3"], tmp_path, 2) == 3
    for jobs in ("0", "x", "-1"):
        assert sweep.main(["small-1m", str(tmp_path), "--jobs", jobs, "--dry-run"]) == 2
        err = capsys.readouterr().err
        assert err.count("\n") == 1 and f"JOBS={jobs}: allowed a whole number of at least 1, or auto" in err
    assert sweep.main(["small-1m", str(tmp_path), "--jobs", "auto", "--dry-run"]) == 0
    assert sweep.main(["small-1m", str(tmp_path), "--deadline", "60", "--dry-run"]) == 2  # compare arms: no window
    assert "--deadline 60: allowed only for a spec of grow train arms" in capsys.readouterr().err
