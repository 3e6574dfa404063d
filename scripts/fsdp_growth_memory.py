"""Per-rank peak resident memory and seconds by phase of one growth under FSDP on 2 gloo ranks (CPU),
on each path of ``trainer.fsdp_growth`` (docs/fsdp.md "A growth").

    python scripts/fsdp_growth_memory.py                       # llama-124m, 6 -> 12 layers, zero
    python scripts/fsdp_growth_memory.py --model llama-small --layers 2 4

Each path runs in its own pair of processes (freed memory stays in a process's heap): the model is
built and sharded, the optimizer built (AdamW state allocated), then every rank resets its peak
(``/proc/self/clear_refs`` "5") and grows; the peak is ``VmHWM`` of ``/proc/self/status`` after the growth.
Prints one JSON line per path: {"path", "rss_mb": [rank 0, rank 1], "phases": {...}, "params_after"}.
"""

from __future__ import annotations

import argparse
import json
import os
import socket
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))


def peak_mb() -> float:
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith("VmHWM:"):
            return int(line.split()[1]) / 1024
    raise RuntimeError("no VmHWM in /proc/self/status")


def worker(args) -> None:
    """One rank: build, shard, grow by ``args.path``, report (rank 0 prints)."""
    import time
    from types import SimpleNamespace

    import torch
    from hydra import compose, initialize_config_dir

    from grow import distributed, fsdp, fsdp_growth
    from grow.config import CONFIG_DIR, RunConfig
    from grow.device import Precision
    from grow.growth import get_strategy
    from grow.model import Transformer
    from grow.optim import build_optimizer
    from grow.train import Trainer

    torch.set_num_threads(1)
    distributed.init()
    small, big = args.layers
    with initialize_config_dir(str(CONFIG_DIR), version_base="1.3"):
        hcfg = compose("train", overrides=[f"model={args.model}", "data.vocab_size=512", "trainer.growth_batches=0",
                                           "trainer.parallel=fsdp", f"trainer.fsdp_growth={args.path}",
                                           f"strategy={args.strategy}", "precision=float32", "device=cpu"])
    cfg = RunConfig.from_hydra(hcfg)
    precision = Precision.of(cfg)
    source = cfg.model.replace(n_layers=small)
    plain = Transformer(source) if distributed.is_main() else None
    model = fsdp.shard(plain, precision.device, fsdp.ShardOptions.of(cfg, precision))
    del plain
    opt = build_optimizer(model, cfg.optim, compile=False)
    trainer = SimpleNamespace(cfg=cfg, model=model, opt=opt, precision=precision, data=None,
                              strategy=get_strategy(cfg.strategy.build()), state=SimpleNamespace(strategy_state=None))
    for name in ("_grow", "_grow_on_host", "shard"):
        setattr(trainer, name, getattr(Trainer, name).__get__(trainer))
    stage = SimpleNamespace(index=1, cfg=cfg.model.replace(n_layers=big))
    gen = torch.Generator().manual_seed(cfg.seed * 7919 + 1)
    Path("/proc/self/clear_refs").write_text("5")
    t0 = time.perf_counter()
    if args.path == "sharded":
        grown, _, _, phases = fsdp_growth.grow_sharded(trainer, stage, gen)
    else:
        grown, _, info = trainer._grow_on_host(stage, gen)
        phases = info.phases
    seconds = time.perf_counter() - t0
    rss = [None] * distributed.world_size()
    torch.distributed.all_gather_object(rss, peak_mb())
    params = sum(p.numel() for p in grown.parameters())  # global shapes of the DTensors
    if distributed.is_main():
        print(json.dumps({"path": args.path, "model": args.model, "layers": [small, big], "rss_mb": rss,
                          "phases": phases, "seconds": seconds, "params_after": params}), flush=True)
    torch.distributed.destroy_process_group()


def run(path: str, model: str, layers, strategy: str) -> dict:
    """Both ranks of one path; rank 0's JSON record."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    procs = []
    for r in range(2):
        env = {**os.environ, "RANK": str(r), "LOCAL_RANK": str(r), "WORLD_SIZE": "2", "LOCAL_WORLD_SIZE": "2",
               "MASTER_ADDR": "127.0.0.1", "MASTER_PORT": str(port), "OMP_NUM_THREADS": "1",
               "PYTHONPATH": str(ROOT)}
        procs.append(subprocess.Popen([sys.executable, __file__, "--worker", "--path", path, "--model", model,
                                       "--layers", *map(str, layers), "--strategy", strategy],
                                      env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True))
    outs = [p.communicate() for p in procs]
    for p, (_, err) in zip(procs, outs):
        if p.returncode:
            raise RuntimeError(f"a rank of the {path} path failed:\n{err[-3000:]}")
    return json.loads(outs[0][0].strip().splitlines()[-1])


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--model", default="llama-124m")
    ap.add_argument("--layers", type=int, nargs=2, default=[6, 12])
    ap.add_argument("--strategy", default="zero")
    ap.add_argument("--paths", nargs="+", default=["host", "sharded"])
    ap.add_argument("--worker", action="store_true", help=argparse.SUPPRESS)
    ap.add_argument("--path", help=argparse.SUPPRESS)
    args = ap.parse_args(argv)
    if args.worker:
        worker(args)
        return 0
    for path in args.paths:
        print(json.dumps(run(path, args.model, args.layers, args.strategy)), flush=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
