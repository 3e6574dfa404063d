"""One prepared command for a GPU window (`make sweep-gpu`): the arms of a sweep spec as parallel processes.

Usage::

    python scripts/sweep_gpu.py configs/sweep/gpu-depth.yaml OUT [--jobs N] [--seeds 0,1] [--set k=v ...] [--dry-run]

1. Reads the spec (name, seeds, common overrides, arms: label -> kind (grown | fixed) and overrides).
2. Skips every arm and seed whose summary.json is committed under docs/results/<name>/runs/<arm>-seed<s>/ or
   already finished under OUT/<name>/, so successive windows finish the sweep.
3. Estimates the FLOPs of what is left with the stage plans (`grow schedule`'s numbers) and prints them.
4. Builds the corpus once (`data=pysrc` reads that machine's own installed source), then runs `grow train`
   for each arm and seed, N processes at once (SWEEP_JOBS), each into OUT/<name>/<arm>-seed<s>/ with an
   arm.json (fixed-size arms are the report's frontier); checkpoints are deleted after each run so the folder
   returned holds only the small files (summary.json, metrics.jsonl, config.yaml, arm.json).
5. Writes the report over every finished run (`grow report`), into OUT/<name>/report/.
``--set k=v`` adds overrides to every arm (a toy size for the test: model.d_model=16 ...).
"""

from __future__ import annotations

import argparse
import json
import shlex
import shutil
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))


def load_spec(path: Path) -> dict:
    from omegaconf import OmegaConf

    spec = OmegaConf.to_container(OmegaConf.load(path), resolve=True)
    for key in ("name", "seeds", "common", "arms"):
        if key not in spec:
            raise SystemExit(f"error: {path}: no {key!r} (a sweep spec: name, seeds, common, arms)")
    for label, arm in spec["arms"].items():
        if arm.get("kind") not in ("grown", "fixed"):
            raise SystemExit(f"error: {path}: arms.{label}.kind={arm.get('kind')!r}: allowed grown or fixed")
    return spec


def jobs_of(spec: dict, seeds: list[int], extra: list[str]) -> list[dict]:
    """Every (arm, seed) with its full override list."""
    return [{"arm": label, "kind": arm["kind"], "seed": s, "dir": f"{label}-seed{s}",
             "overrides": [*spec["common"], *arm.get("overrides", []), *extra, f"seed={s}"]}
            for label, arm in spec["arms"].items() for s in seeds]


def done(run: Path) -> bool:
    try:
        return bool(json.loads((run / "summary.json").read_text()).get("complete"))
    except (OSError, ValueError):
        return False


def plan_flops(overrides: list[str]) -> float:
    """The training FLOPs of a run's stage plan (what `grow schedule` prints)."""
    from hydra import compose, initialize_config_dir

    from grow.config import CONFIG_DIR
    from grow.run import load as load_run

    with initialize_config_dir(str(CONFIG_DIR), version_base="1.3"):
        cfg = load_run(compose("train", overrides=[o for o in overrides if not o.startswith("hydra.")]))
    return float(cfg.plan.total_flops), cfg


def arm_json(job: dict, flops: float) -> dict:
    """The arm.json the report reads: fixed-size arms are `equal_flops` at their own budget (the frontier)."""
    fixed = job["kind"] == "fixed"
    strategy = next((o.split("=", 1)[1] for o in job["overrides"] if o.startswith("strategy=")), None)
    return {"arm": job["arm"], "kind": "equal_flops" if fixed else "grown", "strategy": None if fixed else strategy,
            "parameterization": None, "seed": job["seed"], "setting": {}, "baseline_arm": None, "job": 0,
            "plan_flops": flops, "budget_flops": flops if fixed else None, "plan": [],
            "command": shlex.join(["grow", "train", *job["overrides"]])}


def run_all(jobs: list[dict], out: Path, n: int) -> int:
    """`grow train` per job, ``n`` at once; the first non-zero exit status (0 when all finished)."""
    pending, running, rc = list(jobs), [], 0
    while pending or running:
        while pending and len(running) < n:
            job = pending.pop(0)
            d = out / job["dir"]
            d.mkdir(parents=True, exist_ok=True)
            (d / "arm.json").write_text(json.dumps(job["arm_json"], indent=1))
            log = open(d / "train.log", "w")
            cmd = [sys.executable, "-m", "grow", "train", *job["overrides"], f"hydra.run.dir={d}"]
            running.append((subprocess.Popen(cmd, stdout=log, stderr=subprocess.STDOUT, cwd=ROOT), d, log))
        time.sleep(0.5)
        for item in list(running):
            proc, d, log = item
            if proc.poll() is None:
                continue
            running.remove(item)
            log.close()
            shutil.rmtree(d / "checkpoints", ignore_errors=True)  # the returned folder: small files only
            status = "finished" if done(d) else f"FAILED (exit {proc.returncode}, {d / 'train.log'})"
            print(f"sweep-gpu: {d.name} {status}", flush=True)
            rc = rc or proc.returncode
    return rc


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("spec", type=Path)
    ap.add_argument("out", type=Path, help="the folder returned from the GPU machine ($OUT)")
    ap.add_argument("--jobs", type=int, default=1, help="grow train processes at once (SWEEP_JOBS)")
    ap.add_argument("--seeds", default=None, help="comma-separated seeds (default: the spec's)")
    ap.add_argument("--set", action="append", default=[], help="an override for every arm (repeatable)")
    ap.add_argument("--dry-run", action="store_true", help="print the jobs left and their FLOPs, run nothing")
    ap.add_argument("--committed", type=Path, default=ROOT / "docs" / "results",
                    help="where published runs are skipped from: <committed>/<name>/runs/<arm>-seed<s>/summary.json")
    args = ap.parse_args(argv)
    if args.jobs < 1:
        print(f"error: SWEEP_JOBS={args.jobs}: allowed a whole number of at least 1", file=sys.stderr)
        return 2
    spec = load_spec(args.spec)
    seeds = [int(s) for s in args.seeds.split(",")] if args.seeds else list(spec["seeds"])
    out = args.out / spec["name"]
    committed = args.committed / spec["name"] / "runs"
    left = [j for j in jobs_of(spec, seeds, args.set) if not done(committed / j["dir"]) and not done(out / j["dir"])]
    total = 0.0
    for j in left:
        flops, cfg = plan_flops(j["overrides"])
        j["arm_json"] = arm_json(j, flops)
        total += flops
    print(f"sweep-gpu: {spec['name']}: {len(left)} run(s) left of {len(spec['arms']) * len(seeds)}, "
          f"{total:.3g} training FLOPs by their stage plans", flush=True)
    if args.dry_run or not left:
        return 0
    from grow.data import load

    load(cfg.data, cfg.model.seq_len)  # the corpus once, before the processes that share its cache
    rc = run_all(left, out, args.jobs)
    if any(done(d) for d in out.iterdir() if d.is_dir()):
        subprocess.run([sys.executable, "-m", "grow", "report", f"runs=[{out}]", f"out={out / 'report'}"], cwd=ROOT)
    return rc


if __name__ == "__main__":
    sys.exit(main())
