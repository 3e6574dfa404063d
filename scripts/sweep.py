"""One sweep mechanism (`make sweep EXP=<name>`): the runs of a spec, configs/sweep/<name>.yaml, as processes.

A spec names its seeds, the overrides common to every run and its arms: `grow train` runs (kind grown, fixed or
baseline: each into OUT/<name>/<arm>-seed<s>/, FLOPs estimated first, finished runs skipped, a window planned to
--deadline by the spec's estimate and cut_order) or `grow compare` sweeps (kind compare: one multirun over the
seeds into OUT/<name>/[<dir>/], which resumes itself; --jobs copies of it share the folder). Then the report, and
the spec's ``then`` command. The keys: docs/usage.md, "Sweeps".

Usage: python scripts/sweep.py <name | spec.yaml> OUT [override ...] [--jobs N] [--seeds 0,1] [--arms a,b]
[--deadline S] [--no-report] [--dry-run]   (an override, or --set k=v, is added to every run)
"""

from __future__ import annotations

import argparse
import functools
import json
import math
import shlex
import shutil
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from grow.cli import command  # noqa: E402 - after the checkout is on the path
from grow.errors import nearest_key  # noqa: E402 - not grow.config: it imports torch (start-up speed)

SPECS = ROOT / "configs" / "sweep"
TRAIN_KINDS = ("grown", "fixed", "baseline")  # `grow train` arms; kind compare: a `grow compare` multirun
SPEC_KEYS = ("name", "seeds", "common", "arms", "cut_order", "estimate", "then")  # docs/usage.md, "Sweeps"
ARM_KEYS = ("kind", "overrides", "seeds", "group", "equal_flops_of", "dir")
STAGGER = 1.0  # seconds between the starts of a grow compare's copies, so that their first claims rarely contend


class SpecError(ValueError):
    """A bad sweep name or spec: its one line, exit status 2."""


def spec_path(exp: str) -> Path:
    """configs/sweep/<exp>.yaml, or ``exp`` itself when it is a path to a YAML file."""
    if exp.endswith((".yaml", ".yml")):
        if not Path(exp).is_file():
            raise SpecError(f"EXP={exp}: no such spec file")
        return Path(exp)
    names = sorted(p.stem for p in SPECS.glob("*.yaml"))
    if not exp:
        raise SpecError(f"EXP: needed, the name of a sweep of configs/sweep/: allowed {', '.join(names)}")
    if exp not in names:
        raise SpecError(f"EXP={exp!r}: not a sweep of configs/sweep/: allowed {', '.join(names)}{nearest_key(exp, names)}")
    return SPECS / f"{exp}.yaml"


def load_spec(path: Path) -> dict:
    from omegaconf import OmegaConf

    spec = OmegaConf.to_container(OmegaConf.load(path), resolve=True)
    spec.setdefault("name", path.stem)
    _known(path, "", spec, SPEC_KEYS)
    for key in ("seeds", "common", "arms"):
        if key not in spec:
            raise SpecError(f"{path}: no {key!r} (a sweep spec: seeds, common, arms)")
    groups = spec.setdefault("cut_order", [])
    for label, arm in spec["arms"].items():
        _check_arm(path, spec, label, arm, groups)
    kinds = {arm["kind"] == "compare" for arm in spec["arms"].values()}
    if len(kinds) > 1:  # grow compare's report would read the train arms' folders as its own
        raise SpecError(f"{path}: arms of kind compare beside grow train arms: allowed one or the other per spec")
    if sum(arm["kind"] == "baseline" for arm in spec["arms"].values()) > 1:
        raise SpecError(f"{path}: more than one arm of kind baseline (the final model on all the tokens)")
    return spec


def _known(path: Path, prefix: str, node: dict, keys: tuple[str, ...]) -> None:
    """Every key of ``node`` is one of ``keys`` (a misspelt one would be ignored silently)."""
    for key in node:
        if key not in keys:
            raise SpecError(f"{path}: {prefix}{key}: not a key of a sweep spec: allowed {', '.join(keys)}"
                            + nearest_key(key, keys))


def _check_arm(path: Path, spec: dict, label: str, arm: dict, groups: list[str]) -> None:
    _known(path, f"arms.{label}.", arm, ARM_KEYS)
    if arm.get("kind") not in (*TRAIN_KINDS, "compare"):
        raise SpecError(f"{path}: arms.{label}.kind={arm.get('kind')!r}: allowed grown, fixed, baseline or compare")
    if arm.get("group") is not None and arm["group"] not in groups:
        raise SpecError(f"{path}: arms.{label}.group={arm['group']!r}: not in cut_order ({', '.join(groups)})"
                        + nearest_key(str(arm["group"]), groups))
    ref = arm.get("equal_flops_of")
    if ref is not None and spec["arms"].get(ref, {}).get("kind") != "grown":
        raise SpecError(f"{path}: arms.{label}.equal_flops_of={ref!r}: not a grown arm of the spec"
                        + nearest_key(str(ref), list(spec["arms"])))


def jobs_of(spec: dict, seeds: list[int] | None, extra: list[str]) -> list[dict]:
    """Every (arm, seed) with its full override list, and the label of the sweep's baseline arm (if any), over
    `_seeds` (``seeds``: --seeds, None when not given)."""
    base = next((label for label, arm in spec["arms"].items() if arm["kind"] == "baseline"), None)
    return [{"arm": label, "kind": arm["kind"], "seed": s, "dir": f"{label}-seed{s}", "baseline": base,
             "group": arm.get("group"), "equal_flops_of": arm.get("equal_flops_of"),
             "overrides": overrides(spec, label, s, extra)}
            for label, arm in spec["arms"].items() if arm["kind"] in TRAIN_KINDS for s in _seeds(spec, arm, seeds)]


def _seeds(spec: dict, arm: dict, seeds: list[int] | None) -> list[int]:
    """An arm's seeds: its own (only those in ``seeds`` when given), else ``seeds`` or the spec's."""
    if "seeds" in arm:
        return [s for s in arm["seeds"] if seeds is None or s in seeds]
    return list(seeds if seeds is not None else spec["seeds"])


def overrides(spec: dict, label: str, seed, extra: list[str]) -> list[str]:
    """A run's overrides: the spec's common ones, the arm's, ``extra`` (the command line's), its seed (a compare
    arm's: all of them, comma-separated); a key given twice keeps its last value."""
    return merged([*spec["common"], *spec["arms"][label].get("overrides", []), *extra, f"seed={seed}"])


def merged(items: list[str]) -> list[str]:
    """``items`` with each key once, at its first place with its last value (``+k=v`` and ``k=v`` are one key, ``~k`` another)."""
    out: dict[str, str] = {}
    for item in items:
        out[item.split("=", 1)[0].lstrip("+")] = item
    return list(out.values())


def estimate(spec: dict, flops: float, rate: float | None = None) -> float:
    """A run's estimated seconds: its plan FLOPs over one run's throughput with the window's runs at once
    (estimate.flops_per_second, or ``rate``) plus estimate.start_seconds (its process, imports, data)."""
    est = spec.get("estimate") or {}
    return flops / float(rate or est.get("flops_per_second") or math.inf) + float(est.get("start_seconds", 0))


def finish_times(seconds: list[float], n: int) -> list[float]:
    """When each run ends when started in this order on ``n`` slots, each on the first slot free."""
    slots, out = [0.0] * n, []
    for s in seconds:
        i = min(range(n), key=slots.__getitem__)
        slots[i] += s
        out.append(slots[i])
    return out


def plan_window(jobs: list[dict], n: int, seconds_left: float, cut_order: list[str]) -> tuple[list[dict], list[dict]]:
    """The runs of a window that fit before its deadline, and those cut: a job whose own estimate ("seconds") is
    longer than ``seconds_left`` cannot finish in this window and is cut first; then while the last of ``jobs`` (in
    order) would end after ``seconds_left``, the pending job of the group first in ``cut_order`` is cut (its
    highest seed first, then the latest in the order); a job of no group in it is never cut (when only those are
    left, they all stay: the start rule then runs what fits)."""
    keep = [j for j in jobs if j["seconds"] <= seconds_left]
    cut = [j for j in jobs if j["seconds"] > seconds_left]
    rank = {g: i for i, g in enumerate(cut_order)}
    while keep and max(finish_times([j["seconds"] for j in keep], n)) > seconds_left:
        cuttable = [(rank[j["group"]], -j["seed"], -i) for i, j in enumerate(keep) if j.get("group") in rank]
        if not cuttable:
            break
        _, _, i = min(cuttable)
        cut.append(keep.pop(-i))
    return keep, cut


def done(run: Path) -> bool:
    try:
        return bool(json.loads((run / "summary.json").read_text()).get("complete"))
    except (OSError, ValueError):
        return False


def plan_flops(overrides: list[str]) -> tuple[float, object]:
    """The training FLOPs of a run's stage plan (what `grow schedule` prints), and the run (`grow.run.Run`)."""
    from hydra import compose, initialize_config_dir

    from grow import plugins
    from grow.config import CONFIG_DIR
    from grow.run import load as load_run

    plugins.load()  # model/_base and GROW_PLUGINS' strategies, stored as the CLI stores them
    with initialize_config_dir(str(CONFIG_DIR), version_base="1.3"):
        cfg = load_run(compose("train", overrides=[o for o in overrides if not o.startswith("hydra.")]))
    return float(cfg.plan.total_flops), cfg


# The corpus once, before the processes that share its cache, in a process whose import path is theirs (this
# script's folder on sys.path would make data=pysrc another corpus, and every run would build its own).
BUILD = """import sys
from hydra import compose, initialize_config_dir
from grow import plugins
from grow.config import CONFIG_DIR
from grow.data import load
from grow.errors import ConfigError
from grow.run import load as load_run
plugins.load()
with initialize_config_dir(str(CONFIG_DIR), version_base="1.3"):
    cfg = load_run(compose("train", overrides=sys.argv[1:]))
try:
    load(cfg.data, cfg.model.seq_len)
except ConfigError as exc:  # a refused data key: its one line, exit 2
    print(f"error: {exc}", file=sys.stderr)
    sys.exit(2)
"""


def build_corpus(overrides: list[str]) -> int:
    """The corpus built once; its exit status (a refused data config has said why in one line)."""
    return subprocess.run([sys.executable, "-c", BUILD, *overrides], cwd=ROOT).returncode


def arm_json(job: dict, flops: float, budget: float | None = None) -> dict:
    """The arm.json the report reads: fixed-size arms are `equal_flops` at their own budget (the frontier), or at
    ``budget`` (equal_flops_of: the grown arm's plan FLOPs, which pairs them in the report), the baseline (the final
    model on all the tokens, also on the frontier) is every other arm's reference."""
    kind = {"fixed": "equal_flops", "baseline": "baseline", "grown": "grown"}[job["kind"]]
    strategy = next((o.split("=", 1)[1] for o in job["overrides"] if o.startswith("strategy=")), None)
    return {"arm": job["arm"], "kind": kind, "strategy": strategy if kind == "grown" else None,
            "parameterization": None, "seed": job["seed"], "setting": {}, "job": 0,
            "baseline_arm": job["baseline"],  # the baseline's own too, as grow compare writes it
            "plan_flops": flops, "budget_flops": (budget or flops) if kind == "equal_flops" else None, "plan": [],
            "command": shlex.join(["grow", "train", *job["overrides"]])}


def run_all(jobs: list[dict], out: Path, n: int, stop_at: float = float("inf")) -> int:
    """`grow train` per job, ``n`` at once, none started after ``stop_at`` (time.monotonic()) and those still
    running then stopped; the first non-zero exit status (0 when all finished, 124 when stopped)."""
    pending, running, rc, late = list(jobs), [], 0, False
    while pending or running:
        if not late and time.monotonic() > stop_at:
            late = True
            print(f"sweep: deadline: {len(pending)} not started, {len(running)} stopped", flush=True)
            pending = []
            for proc, _, _ in running:
                proc.terminate()
            rc = rc or 124
        while pending and len(running) < n:
            job = pending.pop(0)
            left = stop_at - time.monotonic()
            if job.get("seconds", 0) > left:  # it could not finish: not started (the next window runs it)
                print(f"sweep: {job['dir']} not started: needs ~{job['seconds']:.0f} s, {left:.0f} s left", flush=True)
                continue
            d = out / job["dir"]
            shutil.rmtree(d, ignore_errors=True)  # an unfinished run of an earlier window starts afresh
            d.mkdir(parents=True)
            (d / "arm.json").write_text(json.dumps(job["arm_json"], indent=1))
            log = open(d / "train.log", "w")
            cmd = [*command(), "train", *job["overrides"], f"hydra.run.dir={d}"]
            running.append((subprocess.Popen(cmd, stdout=log, stderr=subprocess.STDOUT, cwd=ROOT), d, log))
        time.sleep(0.5)
        for item in list(running):
            proc, d, log = item
            if proc.poll() is None:
                continue
            running.remove(item)
            log.close()
            shutil.rmtree(d / "checkpoints", ignore_errors=True)  # the returned folder: small files only
            status = ("finished" if done(d) else "stopped at the deadline (lost)" if late
                      else f"FAILED (exit {proc.returncode}, {d / 'train.log'})")
            print(f"sweep: {d.name} {status}", flush=True)
            rc = rc or (proc.returncode if not late else 124)
    return rc


def compare_runs(spec: dict, seeds: list[int] | None, extra: list[str], out: Path) -> list[tuple[str, list[str], Path]]:
    """Each compare arm's label, `grow compare` overrides (every seed in one multirun) and sweep folder: the
    sweep's, or its ``dir`` inside it."""
    runs = []
    for label, arm in spec["arms"].items():
        folder = out / arm["dir"] if arm.get("dir") else out
        seed = ",".join(str(s) for s in _seeds(spec, arm, seeds))
        runs.append((label, [*overrides(spec, label, seed, extra), f"hydra.sweep.dir={folder}"], folder))
    return runs


def copies(cmd: list[str], folder: Path, n: int) -> int:
    """``n`` copies of one `grow compare` at once sharing its sweep folder (each arm trained by the copy that claims
    it: grow.compare.claim, a flock), copy i's console in <folder>/jobs/<i>.log; the first non-zero exit status.
    Above one copy the report is rebuilt after all finish (the last to finish may not be the last to write it)."""
    if n == 1:
        return subprocess.run(cmd, cwd=ROOT).returncode
    (folder / "jobs").mkdir(parents=True, exist_ok=True)
    procs = []
    for i in range(1, n + 1):
        with open(folder / "jobs" / f"{i}.log", "w") as log:
            procs.append(subprocess.Popen(cmd, stdout=log, stderr=subprocess.STDOUT, cwd=ROOT))
        time.sleep(STAGGER)
    print(f"sweep: {n} copies of grow compare (logs: {folder / 'jobs'}/1..{n}.log)", flush=True)
    rc = next((r for r in [p.wait() for p in procs] if r), 0)
    return rc or subprocess.run([*command(), "compare", f"report={folder}"], cwd=ROOT).returncode


def run_compares(spec: dict, args, out: Path) -> int:
    """The spec's `grow compare` sweeps in order (each resumes what its folder holds); the first failure stops."""
    for label, ovr, folder in compare_runs(spec, args.seeds, args.set, out):
        print(f"sweep: {spec['name']}: {label}: {shlex.join(['grow', 'compare', *ovr])}", flush=True)
        if args.dry_run:
            continue
        rc = copies([*command(), "compare", *ovr], folder, args.jobs)
        if rc:
            return rc
    return 0


def then(spec: dict, sweeps: Path, out: Path) -> int:
    """The spec's ``then`` command after its runs ({sweeps}: OUT, {out}: OUT/<name>; ``grow`` and ``python`` are
    this checkout's), e.g. a report over this sweep and another."""
    if not spec.get("then"):
        return 0
    cmd = [a.format(sweeps=sweeps, out=out) for a in spec["then"]]
    head = {"grow": command(), "python": [sys.executable]}.get(cmd[0], cmd[:1])
    print(f"sweep: {spec['name']}: then {shlex.join(cmd)}", flush=True)
    return subprocess.run([*head, *cmd[1:]], cwd=ROOT).returncode


def run_arms(spec: dict, args, out: Path, stop_at: float) -> int:
    """The spec's `grow train` arms: what is not finished (here or committed), FLOPs first, then the window."""
    committed = args.committed / spec["name"]
    every = jobs_of(spec, args.seeds, args.set)
    left = [j for j in every if not done(committed / j["dir"]) and not done(out / j["dir"])]
    total = 0.0
    flops_of = functools.cache(lambda ovr: plan_flops(list(ovr))[0])  # a stage plan is the same for every seed:
    seedless = lambda ovr: tuple(o for o in ovr if not o.startswith("seed="))  # one compose per arm, not per run
    for j in left:
        flops = flops_of(seedless(j["overrides"]))
        ref = j["equal_flops_of"]
        budget = flops_of(seedless(overrides(spec, ref, j["seed"], args.set))) if ref else None
        j["arm_json"] = arm_json(j, flops, budget)
        if math.isfinite(args.deadline):
            j["seconds"] = estimate(spec, flops, args.rate)
        total += flops
    left.sort(key=lambda j: (j["seed"], -j["arm_json"]["plan_flops"]))  # whole seeds first, costliest first
    print(f"sweep: {spec['name']}: {len(left)} run(s) left of {len(every)}, "
          f"{total:.3g} training FLOPs by their stage plans", flush=True)
    if not args.dry_run and left:  # the corpus first: its build (a minute at 300 MB) is time the plan has not
        built = build_corpus(left[0]["overrides"])
        if built:
            print(f"sweep: the corpus was not built (exit {built}): no run started", file=sys.stderr)
            return built
    if math.isfinite(args.deadline) and left:
        left, cut = plan_window(left, args.jobs, stop_at - time.monotonic(), spec["cut_order"])
        for j in cut:
            print(f"sweep: cut ({j['group'] or 'never cut, but longer than the window'}): {j['dir']} "
                  f"(~{j['seconds']:.0f} s; the window's estimate ends after the deadline)", flush=True)
    if args.dry_run or not left:
        return 0
    rc = run_all(left, out, args.jobs, stop_at)
    if not args.no_report and any(done(d) for d in out.iterdir() if d.is_dir()):
        subprocess.run([*command(), "report", f"runs=[{out}]", f"out={out / 'report'}"], cwd=ROOT)
    return rc


def parse(argv: list[str] | None):
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("exp", help="a sweep of configs/sweep/ (its file name without .yaml), or a spec's path")
    ap.add_argument("out", type=Path, help="where the sweep's folder goes (a GPU machine's $OUT)")
    ap.add_argument("overrides", nargs="*", help="overrides added to every run (after the spec's)")
    ap.add_argument("--jobs", default="1", help="processes at once: grow train runs, or copies of each grow compare "
                    "(auto: 1)")
    ap.add_argument("--seeds", default=None, help="comma-separated seeds: of the arms without their own, instead of the spec's; of the others, "
                         "those of theirs also here (default: the spec's)")
    ap.add_argument("--arms", default=None, help="comma-separated arm labels (default: every arm of the spec)")
    ap.add_argument("--set", action="append", default=[], help="an override for every run (repeatable)")
    ap.add_argument("--deadline", type=float, default=float("inf"),
                    help="seconds from the start after which nothing starts and runs stop (grow train arms)")
    ap.add_argument("--no-report", action="store_true", help="neither the report nor the spec's then command")
    ap.add_argument("--dry-run", action="store_true", help="print what is left and its FLOPs, run nothing")
    ap.add_argument("--rate", type=float, default=None,
                    help="one run's FLOP/s with --jobs at once (default: the spec's estimate.flops_per_second)")
    ap.add_argument("--committed", type=Path, default=ROOT / "docs" / "runs",
                    help="where committed runs are skipped from: <committed>/<name>/<arm>-seed<s>/summary.json")
    args = ap.parse_intermixed_args(argv)
    args.set = [*args.overrides, *args.set]
    return args


def checked(args) -> dict:
    """The spec with only the arms asked for; ``args.jobs`` and ``args.seeds`` as numbers."""
    jobs = "1" if args.jobs.strip() == "auto" else args.jobs.strip()
    if not jobs.isdigit() or int(jobs) < 1:
        raise SpecError(f"JOBS={args.jobs}: allowed a whole number of at least 1, or auto (1)")
    args.jobs = int(jobs)
    spec = load_spec(spec_path(args.exp))
    if args.arms:
        wanted = args.arms.split(",")
        unknown = [a for a in wanted if a not in spec["arms"]]
        if unknown:
            raise SpecError(f"--arms {unknown[0]}: not an arm of {args.exp}" + nearest_key(unknown[0], spec["arms"]))
        spec["arms"] = {k: v for k, v in spec["arms"].items() if k in wanted}
    args.seeds = [int(s) for s in args.seeds.split(",")] if args.seeds else None
    return spec


def main(argv: list[str] | None = None) -> int:
    args = parse(argv)
    stop_at = time.monotonic() + args.deadline
    try:
        spec = checked(args)
    except SpecError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    out = args.out / spec["name"]
    compares = any(arm["kind"] == "compare" for arm in spec["arms"].values())
    if compares and math.isfinite(args.deadline):
        print(f"error: --deadline {args.deadline:g}: allowed only for a spec of grow train arms ({args.exp}'s are "
              "grow compare sweeps, which a rerun resumes)", file=sys.stderr)
        return 2
    rc = run_compares(spec, args, out) if compares else run_arms(spec, args, out, stop_at)
    if rc or args.dry_run or args.no_report:
        return rc
    return then(spec, args.out, out)


if __name__ == "__main__":
    sys.exit(main())
