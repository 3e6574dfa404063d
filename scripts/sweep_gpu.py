"""One prepared command for a GPU window (`make sweep-gpu`): the arms of a sweep spec as parallel processes.

Usage::

    python scripts/sweep_gpu.py configs/sweep/gpu-depth.yaml OUT [--jobs N] [--seeds 0,1] [--arms a,b] [--set k=v ...]
        [--deadline S] [--no-report] [--dry-run]

1. Reads the spec (name, seeds, common overrides, arms: label -> kind (grown | fixed | baseline), overrides, and
   optionally seeds (the arm's own), group (for the cut order; none: never cut) and equal_flops_of (a grown arm
   whose plan FLOPs are this fixed arm's budget: the report's best fixed size at equal FLOPs); cut_order (groups,
   the first cut first) and estimate (flops_per_second of one run with --jobs at once, start_seconds).
2. Skips every arm and seed whose summary.json is committed under docs/runs/<name>/<arm>-seed<s>/ or
   already finished under OUT/<name>/, so successive windows finish the sweep.
3. Estimates the FLOPs of what is left with the stage plans (`grow schedule`'s numbers) and prints them.
4. Builds the corpus once (`data=pysrc` reads that machine's own installed source), then runs `grow train`
   for each arm and seed, N processes at once (SWEEP_JOBS), a seed's arms before the next seed's and the
   costliest first (a window cut short leaves whole seeds), each into OUT/<name>/<arm>-seed<s>/ with an
   arm.json (fixed-size arms are the report's frontier); checkpoints are deleted after each run so the folder
   returned holds only the small files (summary.json, metrics.jsonl, config.yaml, arm.json).
   With --deadline S: after the corpus is built, before the first run, the window is planned (`plan_window`): the runs in that order are
   scheduled on --jobs slots by their estimated seconds (plan FLOPs / estimate.flops_per_second +
   estimate.start_seconds), and while the last would end after the deadline, the pending run first in cut_order
   (its highest seed first) is cut; then no run starts unless its estimate ends before the deadline, and what
   still runs at the deadline is stopped (lost).
5. Writes the report over every finished run (`grow report`), into OUT/<name>/report/ (not with --no-report).
``--set k=v`` adds overrides to every arm (a toy size for the test: model.d_model=16 ...).
"""

from __future__ import annotations

import argparse
import difflib
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


def load_spec(path: Path) -> dict:
    from omegaconf import OmegaConf

    spec = OmegaConf.to_container(OmegaConf.load(path), resolve=True)
    for key in ("name", "seeds", "common", "arms"):
        if key not in spec:
            raise SystemExit(f"error: {path}: no {key!r} (a sweep spec: name, seeds, common, arms)")
    groups = spec.setdefault("cut_order", [])
    for label, arm in spec["arms"].items():
        if arm.get("kind") not in ("grown", "fixed", "baseline"):
            raise SystemExit(f"error: {path}: arms.{label}.kind={arm.get('kind')!r}: allowed grown, fixed or baseline")
        if arm.get("group") is not None and arm["group"] not in groups:
            near = difflib.get_close_matches(str(arm["group"]), groups, n=1)
            raise SystemExit(f"error: {path}: arms.{label}.group={arm['group']!r}: not in cut_order ({', '.join(groups)})"
                             + (f" (nearest: {near[0]})" if near else ""))
        ref = arm.get("equal_flops_of")
        if ref is not None and spec["arms"].get(ref, {}).get("kind") != "grown":
            near = difflib.get_close_matches(str(ref), list(spec["arms"]), n=1)
            raise SystemExit(f"error: {path}: arms.{label}.equal_flops_of={ref!r}: not a grown arm of the spec"
                             + (f" (nearest: {near[0]})" if near else ""))
    if sum(arm["kind"] == "baseline" for arm in spec["arms"].values()) > 1:
        raise SystemExit(f"error: {path}: more than one arm of kind baseline (the final model on all the tokens)")
    return spec


def jobs_of(spec: dict, seeds: list[int] | None, extra: list[str]) -> list[dict]:
    """Every (arm, seed) with its full override list, and the label of the sweep's baseline arm (if any), over
    `_seeds` (``seeds``: --seeds, None when not given)."""
    base = next((label for label, arm in spec["arms"].items() if arm["kind"] == "baseline"), None)
    return [{"arm": label, "kind": arm["kind"], "seed": s, "dir": f"{label}-seed{s}", "baseline": base,
             "group": arm.get("group"), "equal_flops_of": arm.get("equal_flops_of"),
             "overrides": overrides(spec, label, s, extra)}
            for label, arm in spec["arms"].items() for s in _seeds(spec, arm, seeds)]


def _seeds(spec: dict, arm: dict, seeds: list[int] | None) -> list[int]:
    """An arm's seeds: its own (only those in ``seeds`` when given), else ``seeds`` or the spec's."""
    if "seeds" in arm:
        return [s for s in arm["seeds"] if seeds is None or s in seeds]
    return list(seeds if seeds is not None else spec["seeds"])


def overrides(spec: dict, label: str, seed: int, extra: list[str]) -> list[str]:
    return [*spec["common"], *spec["arms"][label].get("overrides", []), *extra, f"seed={seed}"]


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

    from grow.config import CONFIG_DIR
    from grow.run import load as load_run

    with initialize_config_dir(str(CONFIG_DIR), version_base="1.3"):
        cfg = load_run(compose("train", overrides=[o for o in overrides if not o.startswith("hydra.")]))
    return float(cfg.plan.total_flops), cfg


# The corpus once, before the processes that share its cache, in a process whose import path is theirs (this
# script's folder on sys.path would make data=pysrc another corpus, and every run would build its own).
BUILD = """import sys
from hydra import compose, initialize_config_dir
from grow.config import CONFIG_DIR
from grow.data import load
from grow.errors import ConfigError
from grow.run import load as load_run
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
            print(f"sweep-gpu: deadline: {len(pending)} not started, {len(running)} stopped", flush=True)
            pending = []
            for proc, _, _ in running:
                proc.terminate()
            rc = rc or 124
        while pending and len(running) < n:
            job = pending.pop(0)
            left = stop_at - time.monotonic()
            if job.get("seconds", 0) > left:  # it could not finish: not started (the next window runs it)
                print(f"sweep-gpu: {job['dir']} not started: needs ~{job['seconds']:.0f} s, {left:.0f} s left", flush=True)
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
            print(f"sweep-gpu: {d.name} {status}", flush=True)
            rc = rc or (proc.returncode if not late else 124)
    return rc


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("spec", type=Path)
    ap.add_argument("out", type=Path, help="the folder returned from the GPU machine ($OUT)")
    ap.add_argument("--jobs", type=int, default=1, help="grow train processes at once (SWEEP_JOBS)")
    ap.add_argument("--seeds", default=None, help="comma-separated seeds: of the arms without their own, instead of the spec's; of the others, "
                         "those of theirs also here (default: the spec's)")
    ap.add_argument("--arms", default=None, help="comma-separated arm labels (default: every arm of the spec)")
    ap.add_argument("--set", action="append", default=[], help="an override for every arm (repeatable)")
    ap.add_argument("--deadline", type=float, default=float("inf"),
                    help="seconds from the start after which nothing starts and runs stop")
    ap.add_argument("--no-report", action="store_true", help="write no report (make it where the runs are read)")
    ap.add_argument("--dry-run", action="store_true", help="print the jobs left and their FLOPs, run nothing")
    ap.add_argument("--rate", type=float, default=None,
                    help="one run's FLOP/s with --jobs at once (default: the spec's estimate.flops_per_second)")
    ap.add_argument("--committed", type=Path, default=ROOT / "docs" / "runs",
                    help="where committed runs are skipped from: <committed>/<name>/<arm>-seed<s>/summary.json")
    args = ap.parse_args(argv)
    stop_at = time.monotonic() + args.deadline
    if args.jobs < 1:
        print(f"error: SWEEP_JOBS={args.jobs}: allowed a whole number of at least 1", file=sys.stderr)
        return 2
    spec = load_spec(args.spec)
    if args.arms:
        wanted = args.arms.split(",")
        unknown = [a for a in wanted if a not in spec["arms"]]
        if unknown:
            near = difflib.get_close_matches(unknown[0], spec["arms"], n=1)
            print(f"error: --arms {unknown[0]}: not an arm of {args.spec}" + (f" (nearest: {near[0]})" if near else ""),
                  file=sys.stderr)
            return 2
        spec["arms"] = {k: v for k, v in spec["arms"].items() if k in wanted}
    seeds = [int(s) for s in args.seeds.split(",")] if args.seeds else None
    out = args.out / spec["name"]
    committed = args.committed / spec["name"]
    left = [j for j in jobs_of(spec, seeds, args.set) if not done(committed / j["dir"]) and not done(out / j["dir"])]
    total, of = 0.0, len(jobs_of(spec, seeds, args.set))
    for j in left:
        flops, cfg = plan_flops(j["overrides"])
        ref = j["equal_flops_of"]
        budget = plan_flops(overrides(spec, ref, j["seed"], args.set))[0] if ref else None
        j["arm_json"] = arm_json(j, flops, budget)
        if math.isfinite(args.deadline):
            j["seconds"] = estimate(spec, flops, args.rate)
        total += flops
    left.sort(key=lambda j: (j["seed"], -j["arm_json"]["plan_flops"]))  # whole seeds first, costliest first
    print(f"sweep-gpu: {spec['name']}: {len(left)} run(s) left of {of}, "
          f"{total:.3g} training FLOPs by their stage plans", flush=True)
    if not args.dry_run and left:  # the corpus first: its build (a minute at 300 MB) is time the plan has not
        built = build_corpus(left[0]["overrides"])
        if built:
            print(f"sweep-gpu: the corpus was not built (exit {built}): no run started", file=sys.stderr)
            return built
    if math.isfinite(args.deadline) and left:
        left, cut = plan_window(left, args.jobs, stop_at - time.monotonic(), spec["cut_order"])
        for j in cut:
            print(f"sweep-gpu: cut ({j['group'] or 'never cut, but longer than the window'}): {j['dir']} "
                  f"(~{j['seconds']:.0f} s; the window's estimate ends after the deadline)", flush=True)
    if args.dry_run or not left:
        return 0
    rc = run_all(left, out, args.jobs, stop_at)
    if not args.no_report and any(done(d) for d in out.iterdir() if d.is_dir()):
        subprocess.run([*command(), "report", f"runs=[{out}]", f"out={out / 'report'}"], cwd=ROOT)
    return rc


if __name__ == "__main__":
    sys.exit(main())
