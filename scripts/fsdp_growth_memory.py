"""One growth under FSDP on gloo ranks of this CPU, once per way of growing a sharded model
(``trainer.fsdp_growth``'s values, read from the config schema; without that key, the one path there
is, named ``host``): each rank's peak resident memory during the growth, its seconds by phase and in
all (docs/fsdp.md, "A growth measured on a CPU").

The default run is llama-124m at Llama 2's 32,000-token vocabulary (125M parameters, float32) grown
6 -> 12 layers by zero, one training step of 2 x 64 tokens on each side of the growth; trailing
``key=value`` arguments replace or add to its overrides (the test runs ``model=tiny``). Writes
``<out>/fsdp_growth_memory.json`` and ``.md``.

    python scripts/fsdp_growth_memory.py [--out docs/bench/fsdp-growth-cpu] [--ranks 2] [key=value ...]
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
from dataclasses import fields
from pathlib import Path

import torch

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from grow.config import TrainerConfig  # noqa: E402
from grow.provenance import machine  # noqa: E402

RUN = {"model": "llama-124m", "model.vocab_size": "32000", "+schedule": "depth", "schedule.start.n_layers": "6",
       "schedule.first_stage": "0.5", "model.seq_len": "64", "trainer.batch_size": "2", "trainer.max_tokens": "256",
       "trainer.eval_batches": "1", "trainer.eval_batch_size": "1", "trainer.recovery_steps": "0",
       "trainer.progress": "false", "strategy": "zero", "precision": "float32", "device": "cpu",
       "trainer.parallel": "fsdp", "trainer.full_val": "false"}
PHASES = ("gather", "grow", "shard")


def growth_paths() -> list[str | None]:
    """``trainer.fsdp_growth``'s allowed values, from `TrainerConfig`'s field; [None] where there is no
    such key (the one path: gather on rank 0's host)."""
    for f in fields(TrainerConfig):
        if f.name == "fsdp_growth":
            return list(f.metadata["check"].choices)
    return [None]


def overrides(extra: list[str], path: str | None) -> list[str]:
    """The run's command-line overrides: `RUN`, then ``extra`` (``key=value``; a key given again
    replaces its value), then the path."""
    run = dict(RUN)
    for arg in extra:
        key, _, value = arg.partition("=")
        run[key] = value
    if path is not None:
        run["trainer.fsdp_growth"] = path
    return [f"{k}={v}" for k, v in run.items()]


def matmul_flops(n: int = 2048, reps: int = 5) -> float:
    """FLOP/s of a float32 n x n matmul on one thread of this CPU (the rate rank 0's host growth runs at
    under torchrun, which sets OMP_NUM_THREADS=1): `grow.fsdp_growth.cost.HOST_FLOPS`."""
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    a, b = torch.randn(n, n), torch.randn(n, n)
    a @ b
    t0 = time.perf_counter()
    for _ in range(reps):
        a @ b
    seconds = time.perf_counter() - t0
    torch.set_num_threads(threads)
    return 2 * n**3 * reps / seconds


def run_growth(args: list[str], ranks: int, run_dir: Path) -> dict:
    """``torchrun --nproc_per_node=<ranks> -m grow train <args>`` in ``run_dir``: its growth record."""
    cmd = [sys.executable, "-m", "torch.distributed.run", "--standalone", f"--nproc_per_node={ranks}", "-m", "grow",
           "train", *args, f"hydra.run.dir={run_dir}"]
    env = {**os.environ, "OMP_NUM_THREADS": "1", "WANDB_MODE": "disabled",
           "PYTHONPATH": os.pathsep.join(p for p in (str(ROOT), os.environ.get("PYTHONPATH", "")) if p)}
    out = subprocess.run(cmd, cwd=run_dir.parent, env=env, capture_output=True, text=True)
    if out.returncode != 0:
        raise SystemExit(f"fsdp_growth_memory: the run failed ({out.returncode}):\n{out.stderr[-4000:]}")
    records = [json.loads(line) for line in (run_dir / "metrics.jsonl").open()]
    return next(r for r in records if "growth/params_before" in r)


def row(path: str | None, rec: dict, ranks: int) -> dict:
    """One path's figures from its growth record (a missing rank's peak: not measured here)."""
    peaks = [rec.get(f"growth/peak_rss_mb/rank{r}") for r in range(ranks)]
    return {"fsdp_growth": path or "host", "params_before": rec["growth/params_before"],
            "params_after": rec["growth/params_after"], "seconds": rec["growth/seconds"],
            "phases": {k[len("growth/seconds_"):]: v for k, v in rec.items() if k.startswith("growth/seconds_")},
            "grow_seconds_per_param": rec.get("growth/seconds_grow", 0.0) / rec["growth/params_after"],
            "peak_rss_mb": peaks,
            "rank0_over_rank1": peaks[0] / peaks[1] if ranks > 1 and None not in peaks[:2] else None}


def markdown(result: dict) -> str:
    """The table of the JSON's rows, with the machine and the command under it."""
    ranks = result["ranks"]
    head = ["fsdp_growth", "params", *(f"rank {r} peak RSS" for r in range(ranks)), "rank 0 / rank 1",
            *(f"{p} s" for p in PHASES), "growth s"]
    lines = ["| " + " | ".join(head) + " |", "|" + " --- |" * len(head)]
    for r in result["rows"]:
        peaks = [f"{p:,.0f} MB" if p is not None else "—" for p in r["peak_rss_mb"]]
        ratio = f"{r['rank0_over_rank1']:.2f}" if r["rank0_over_rank1"] is not None else "—"
        phases = [f"{r['phases'][p]:.2f}" if p in r["phases"] else "—" for p in PHASES]
        lines.append("| " + " | ".join([r["fsdp_growth"], f"{r['params_before']:,} → {r['params_after']:,}", *peaks,
                                         ratio, *phases, f"{r['seconds']:.2f}"]) + " |")
    m = result["machine"]["cpu"] or {}
    lines += ["", f"{ranks} gloo ranks on {m.get('model')} ({result['cpu_count']} cores), torch {result['torch']}, "
              f"{result['date']}; a float32 matmul on one thread: {result['matmul_flops_one_thread'] / 1e9:.0f} GFLOP/s. Peak RSS: each rank's VmHWM during the growth (reset before it). Overrides: "
              f"`{' '.join(result['overrides'])}`.", ""]
    return "\n".join(lines)


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out", type=Path, default=Path("fsdp-growth-cpu"))
    ap.add_argument("--ranks", type=int, default=2)
    ap.add_argument("extra", nargs="*", help="key=value overrides of the run")
    a = ap.parse_args(argv)
    rows = []
    with tempfile.TemporaryDirectory() as tmp:
        for path in growth_paths():
            rec = run_growth(overrides(a.extra, path), a.ranks, Path(tmp) / (path or "host"))
            rows.append(row(path, rec, a.ranks))
    result = {"ranks": a.ranks, "overrides": overrides(a.extra, None), "torch": torch.__version__,
              "machine": machine(), "cpu_count": os.cpu_count(), "date": time.strftime("%Y-%m-%d"),
              "matmul_flops_one_thread": matmul_flops(), "rows": rows}
    a.out.mkdir(parents=True, exist_ok=True)
    (a.out / "fsdp_growth_memory.json").write_text(json.dumps(result, indent=1) + "\n")
    (a.out / "fsdp_growth_memory.md").write_text(markdown(result))
    print(markdown(result))
    return 0


if __name__ == "__main__":
    sys.exit(main())
