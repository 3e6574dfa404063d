"""`make gpu-check`: the GPU path end to end, in one call of at most 6 minutes on one H100/H200 (docs/bench.md,
"The prepared device command"), on the gpt124m experiment's shapes and llama-124m's beside them.

On a CUDA device it runs, in this order (``--checks`` names others, or these in another order), and writes
``gpu_check.json`` (``--out``) after every check, each figure beside its target (``targets``: pass/fail per
target, null where it was not measured):

1. ``gpu_tests``: the suite's GPU tests (`gpucheck.gpu_tests`): the Triton AdamW kernel against torch's fused
   AdamW and a float64 reference with no fallback, the chunked loss without a host sync, the kernels' losses;
2. ``optimizer``: the growth-aware AdamW right after the default schedule's growths against torch's fused AdamW
   (`make bench`'s measurement on gpt-124m, no corpus; target <= 1.3x) and the route its grown tensors took;
3. ``kernels``: each pair of trainer.loss_kernel (chunked, liger) and trainer.attention (auto, cudnn) on gpt's
   final stage, as ratios to the default (`gpucheck.kernels`); the training checks run with the fastest;
4. ``training`` and ``training_llama``: the trainer (bf16 autocast, torch.compile, the memory plan's
   micro-batch) through the four stages of ``+experiment=gpt124m-exp`` growing with ``zero``, and the same plan
   on llama-124m: per stage tokens/s and MFU (target >= 0.45 at gpt's final stage), the peak memory against
   `grow.memory`'s estimate (target [1.00, 1.10] every stage of both), each growth's |delta loss| (<= 2e-3)
   and share of the whole plan's wall-clock at the measured speeds (<= 1%);
5. ``profile``: a torch.profiler trace of 3 steps of gpt's final stage (<= 16 MiB gzip'd, beside the JSON);
6. ``liger``: liger-kernel's fused linear cross-entropy, RMSNorm, SwiGLU and rotary against grow's (ratios);
7. ``svd_llama``: one svd growth of d_k on llama-124m, timed by phase (target <= 5 s).

Not run unless named: ``svd_growth`` (gpt), ``ddp`` (two GPUs), ``fsdp_growth`` (one FSDP2 rank through the
gpt plan's growths, sharded vs on the host; measured on an H200 in docs/bench/h200-2026-11-27/).
The tokens are random: throughput, memory and function preservation do not depend on the text. A check that
raises is recorded as ``{"error": ...}``, the others still run, and the exit status is 1. Without CUDA it says
so in one line and exits 0; ``--allow-cpu`` runs the same code on the CPU at toy size (the tests).

    python scripts/gpu_check.py [--out gpu_check.json] [--steps 8] [--checks gpu_tests,optimizer,...]
        [--allow-cpu --model tiny --llama-model llama-tiny]
"""

from __future__ import annotations

import argparse
import cProfile
import difflib
import json
import multiprocessing
import os
import pstats
import subprocess
import sys
import tempfile
import time
import traceback
from pathlib import Path

import numpy as np
import torch

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "scripts"))  # the gpucheck package

from gpucheck.gpu_tests import check_gpu_tests  # noqa: E402
from gpucheck.kernels import check_kernels  # noqa: E402
from gpucheck.liger import check_liger  # noqa: E402
from gpucheck.optimizer import check_optimizer  # noqa: E402
from gpucheck.plan import MEMORY_RANGE, growth_shares, in_range, memory_ratios  # noqa: E402
from gpucheck.profiling import check_profile  # noqa: E402

TARGETS = {"mfu_final_stage": 0.45, "zero_delta_bf16": 2e-3, "optimizer_several_stages": 1.3, "svd_llama_seconds": 5.0,
           "growth_share": 0.01, "fsdp_sharded_vs_host": 2e-3}


class RandomTokens:
    """Deterministic uniform random tokens with the `grow.data.TokenData` batch interface."""

    def __init__(self, vocab_size: int):
        self.vocab_size = vocab_size

    def rows(self, seed: int, start: int, batch_size: int, seq_len: int) -> np.ndarray:
        """uint16 rows [B, T + 1], what the trainer's pinned copy to a GPU reads (`grow.device.DeviceBatches`)."""
        g = torch.Generator().manual_seed(seed * 1_000_003 + start)
        return torch.randint(0, self.vocab_size, (batch_size, seq_len + 1), generator=g).numpy().astype(np.uint16)

    def batch(self, seed: int, start: int, batch_size: int, seq_len: int):
        rows = torch.from_numpy(self.rows(seed, start, batch_size, seq_len).astype(np.int64))
        return rows[:, :-1].contiguous(), rows[:, 1:].contiguous()

    def val_batches(self, n_batches: int, batch_size: int, seq_len: int):
        return [self.batch(1234, i * batch_size, batch_size, seq_len) for i in range(n_batches)]


def parse(argv=None):
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0], formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--out", default="gpu_check.json")
    p.add_argument("--steps", type=int, default=8, help="approximate training steps per stage")
    p.add_argument("--opt-steps", type=int, default=20, help="timed optimizer steps per side of the optimizer check "
                   "(make bench's default; tests: 3)")
    p.add_argument("--model", default=None, help="a model config other than the experiment's (tests: tiny)")
    p.add_argument("--llama-model", default="llama-124m", help="the Llama-family model of the second plan (tests: llama-tiny)")
    p.add_argument("--allow-cpu", action="store_true", help="run on the CPU when there is no GPU (tests)")
    p.add_argument("--deadline", type=float, default=None, help="start no check after this many seconds (a window's end)")
    p.add_argument("--checks", default=None, help="comma-separated checks to run, in that order (default: DEFAULT_CHECKS)")
    p.add_argument("overrides", nargs="*", help="extra Hydra overrides")
    return p.parse_args(argv)


def run_config(args, gpu: bool, *extra: str, full: bool = False):
    """The experiment's run config as the check runs it (``--steps`` steps per stage), or with
    ``full`` the whole plan's (its own token budget)."""
    from hydra import compose, initialize_config_dir

    from grow import plugins
    from grow.config import CONFIG_DIR
    from grow.run import load as load_run

    over = ["+experiment=gpt124m-exp", "trainer.progress=false", "trainer.eval_every=0", "trainer.evals_per_stage=1",
            "trainer.eval_batches=2",
            "trainer.eval_batch_size=8", "trainer.log_every=2", "trainer.ckpt_every=0", "trainer.recovery_steps=0"]
    if args.model:
        over += [f"model={args.model}", "data.vocab_size=512", "trainer.batch_size=16"]
    if not gpu:
        over += ["device=cpu", "trainer.compile=false"]
    plugins.load()  # model/_base and GROW_PLUGINS' strategies, stored as the CLI stores them
    with initialize_config_dir(str(CONFIG_DIR), version_base="1.3"):
        cfg = compose("train", overrides=[*over, *args.overrides, *extra])
    run = load_run(cfg)
    if full:
        return run
    steps = max(4 * args.steps, 4)  # the exp schedule's 4 stages share them (the first gets about a tenth)
    tokens = steps * run.trainer.batch_size * run.model.seq_len
    with initialize_config_dir(str(CONFIG_DIR), version_base="1.3"):
        cfg = compose("train", overrides=[*over, *args.overrides, *extra, f"trainer.max_tokens={tokens}"])
    return load_run(cfg)


def make_trainer_class():
    """The trainer on random tokens, recording each stage's peak memory."""
    from grow.train import Trainer

    class CheckedTrainer(Trainer):
        peaks: dict = {}

        @staticmethod
        def _load_data(cfg, run_dir):
            data = RandomTokens(cfg.model.vocab_size)
            return data, data.val_batches(cfg.trainer.eval_batches, cfg.trainer.eval_batch_size, cfg.model.seq_len)

        def train_stage(self, stage):
            if self.precision.device.type == "cuda":
                torch.cuda.synchronize()
                torch.cuda.reset_peak_memory_stats()
            super().train_stage(stage)
            if self.precision.device.type == "cuda":
                self.peaks[stage.index] = torch.cuda.max_memory_allocated()

    return CheckedTrainer


def stage_rows(run, trainer, records) -> list[dict]:
    from grow.loop import micro_batch
    from grow.memory import GiB, step_memory

    rows = []
    for stage in trainer.plan:
        logged = [r for r in records if r.get("stage") == stage.number and "train/tokens_per_s" in r]
        micro = micro_batch(trainer.parts, stage) or stage.batch_size
        estimate = step_memory(stage.cfg, micro, optimizer=run.optim.name, amp=trainer.precision.amp,
                               compiled=run.trainer.compile).peak
        measured = trainer.peaks.get(stage.index)
        tps = [r["train/tokens_per_s"] for r in logged]
        mfu = [r["train/mfu"] for r in logged if "train/mfu" in r]
        rows.append({
            "stage": stage.index + 1, "config": stage.cfg.to_dict(), "params": stage.cfg.num_params(),
            "batch": stage.batch_size, "micro_batch": micro, "steps": stage.steps,
            "tokens_per_s": sum(tps) / len(tps) if tps else None, "mfu": sum(mfu) / len(mfu) if mfu else None,
            "peak_gb_measured": None if measured is None else measured / GiB, "peak_gb_estimate": estimate / GiB,
            "estimate_over_measured": None if measured is None else estimate / measured})
    return rows


def check_training(args, gpu: bool, *extra: str) -> dict:
    from grow.metrics import read_metrics

    run = run_config(args, gpu, *extra)
    with tempfile.TemporaryDirectory(prefix="grow-gpu-check-") as d:
        trainer = make_trainer_class()(run, Path(d) / "run")
        t0 = time.perf_counter()
        summary = trainer.run()
        records = read_metrics(Path(d) / "run")
    events = summary["growth_events"]
    stages = stage_rows(run, trainer, records)
    growth_seconds = [ev["growth/seconds"] for ev in events]
    return {"device": torch.cuda.get_device_name() if gpu else "cpu", "model": run.model.to_dict(),
            "seconds": time.perf_counter() - t0, "compile_seconds": summary["compile_seconds"], "stages": stages,
            "zero_growth_deltas": [abs(ev["growth/delta"]) for ev in events],
            "growth_share": growth_shares(run_config(args, gpu, *extra, full=True).plan, stages, growth_seconds),
            "memory_ratios": memory_ratios(stages), "final_val_loss": summary["final_val_loss"]}


def check_svd(args, gpu: bool, *extra: str, phases: bool = False) -> dict:
    """One svd growth of d_k at the plan's last growth of d_k (gpt124m-exp: stage 3 to 4), under the
    run's autocast; with ``phases``, under cProfile: the statistics, the line search, the rest, and
    the functions of grow that took the most time (cumulative; cProfile's own cost included)."""
    from grow.device import Precision
    from grow.growth import grow
    from grow.model import Transformer

    run = run_config(args, gpu, "strategy=svd", *extra)
    plan, precision = run.plan, Precision.of(run)
    stage = max(s.index for s in plan[1:] if s.cfg.d_qk != plan[s.index - 1].cfg.d_qk)  # the last growth of d_k
    before, after = plan[stage - 1].cfg, plan[stage].cfg
    target = before.replace(d_qk=after.d_qk)
    model = Transformer(before, generator=torch.Generator().manual_seed(0)).to(precision.device)
    data = RandomTokens(before.vocab_size)
    n = run.trainer.growth_batches
    batches = [tuple(t.to(precision.device) for t in data.batch(7, i * 8, 8, before.seq_len)) for i in range(n)]
    profiler = cProfile.Profile() if phases else None
    t0 = time.perf_counter()
    with precision.autocast():
        if profiler:
            profiler.enable()
        res = grow(model, target, strategy="svd", batch=batches, generator=torch.Generator().manual_seed(0),
                   stage=stage, **run.strategy.options)
        if gpu:
            torch.cuda.synchronize()
        if profiler:
            profiler.disable()
    seconds = time.perf_counter() - t0
    metrics = {k: v for k, v in res.metrics.items() if isinstance(v, (int, float)) and k.count("/") == 1}
    out = {"model": before.to_dict(), "seconds": seconds, "d_qk": [before.d_qk, target.d_qk], "flops": res.flops,
           "metrics": metrics}
    if profiler:
        timed = {k: metrics.get(f"svd/{k}_seconds", 0.0) for k in ("stats", "linesearch")}
        out["phases"] = {**timed, "other": seconds - sum(timed.values()), "top": top_functions(profiler)}
    return out


def top_functions(profiler, n: int = 15) -> list[dict]:
    """grow's functions by cumulative seconds (what a phase spends its time in)."""
    stats = pstats.Stats(profiler)
    rows = [(f"{Path(file).name}:{line}:{name}", cum, calls) for (file, line, name), (_, calls, _, cum, _)
            in stats.stats.items() if f"{os.sep}grow{os.sep}" in file]
    rows.sort(key=lambda r: r[1], reverse=True)
    return [{"function": f, "seconds": c, "calls": k} for f, c, k in rows[:n]]


def check_ddp(args) -> dict:
    """Two NCCL ranks through the exp schedule's growths on the small model (torchrun)."""
    if torch.cuda.device_count() < 2:
        return {"skipped": f"{torch.cuda.device_count()} GPU(s): two are needed"}
    with tempfile.TemporaryDirectory(prefix="grow-gpu-check-ddp-") as d:
        cmd = [sys.executable, "-m", "torch.distributed.run", "--nproc_per_node=2", "-m", "grow", "train",
               "+schedule=exp", "model=small", "trainer.max_tokens=300000", "trainer.progress=false",
               f"hydra.run.dir={d}/run"]
        t0 = time.perf_counter()
        out = subprocess.run(cmd, cwd=d, capture_output=True, text=True, timeout=420,
                             env={**os.environ, "WANDB_MODE": "disabled"})
        summary = json.loads((Path(d) / "run" / "summary.json").read_text()) if out.returncode == 0 else {}
    return {"returncode": out.returncode, "seconds": time.perf_counter() - t0,
            "growths": len(summary.get("growth_events", [])), "world_size": summary.get("world_size"),
            "stderr_tail": out.stderr[-2000:] if out.returncode else ""}


FSDP_PATHS = ("sharded", "host")


def check_fsdp_growth(args, gpu: bool) -> dict:
    """Check 7: the gpt plan on one FSDP2 rank under each `FSDP_PATHS`, each in a process of its own, forked
    from one fresh server that imported torch and grow once (multiprocessing's forkserver: it never touched
    CUDA, so each rank starts its own context, and the ranks cost one interpreter's start-up, not two). The
    rank joins a store this process hosts on a port the OS picked (as torchrun's agent hosts one), so that
    no launcher process starts beside it."""
    forks = multiprocessing.get_context("forkserver")
    forks.set_forkserver_preload(["__main__", "grow.train", "grow.fsdp_growth.sharded", "torch._dynamo", "torch.distributed.fsdp",
                                  "torch.distributed.checkpoint"])  # what a rank imports
    out = {}
    for path in FSDP_PATHS:
        with tempfile.TemporaryDirectory(prefix="grow-gpu-check-fsdp-") as d:
            res = Path(d) / "rank0.json"
            store = torch.distributed.TCPStore("127.0.0.1", 0, None, True, wait_for_workers=False)
            env = {"RANK": "0", "LOCAL_RANK": "0", "WORLD_SIZE": "1", "LOCAL_WORLD_SIZE": "1", "WANDB_MODE": "disabled",
                   "MASTER_ADDR": "127.0.0.1", "MASTER_PORT": str(store.port), "TORCHELASTIC_USE_AGENT_STORE": "True"}
            rank_args = argparse.Namespace(**{**vars(args), "overrides": [
                *args.overrides, "trainer.parallel=fsdp", f"trainer.fsdp_growth={path}"]})
            t0 = time.perf_counter()
            rank = forks.Process(target=_rank, args=(rank_args, str(res), env, d))
            rank.start()
            rank.join(300)
            del store
            if rank.exitcode != 0:
                rank.kill()
                log = Path(d) / "rank0.log"
                raise RuntimeError(f"fsdp_growth={path}: exit {rank.exitcode}: "
                                   f"{log.read_text()[-1500:] if log.exists() else ''}")
            out[path] = {**json.loads(res.read_text()), "seconds": time.perf_counter() - t0}
    s, h = out["sharded"]["final_val_loss"], out["host"]["final_val_loss"]
    out["final_loss_difference"] = abs(s - h)
    return out


def _rank(args, result: str, env: dict, cwd: str) -> None:
    """Check 7's rank, in its forked process (torchrun's environment, its own directory, its output to a log):
    the gpt plan on random tokens under FSDP2, each growth's seconds by phase, into ``result``."""
    os.environ.update(env)
    os.chdir(cwd)
    log = os.open("rank0.log", os.O_WRONLY | os.O_CREAT | os.O_TRUNC)
    os.dup2(log, 1)
    os.dup2(log, 2)
    gpu = torch.cuda.is_available()
    with tempfile.TemporaryDirectory(prefix="grow-gpu-check-fsdp-run-") as d:
        summary = make_trainer_class()(run_config(args, gpu), Path(d) / "run").run()
    keep = ("growth/seconds", "growth/seconds_gather", "growth/seconds_grow", "growth/seconds_shard", "growth/delta")
    growths = [{k: ev.get(k) for k in keep} for ev in summary["growth_events"]]
    Path(result).write_text(json.dumps({"final_val_loss": summary["final_val_loss"], "growths": growths}))


def _target(value, op: str, limit: float) -> dict:
    ok = None if value is None else value >= limit if op == ">=" else value <= limit
    return {"value": value, "limit": limit, "op": op, "pass": ok}


def verdicts(result: dict) -> dict:
    """Pass/fail per target; a value of a check that failed, was skipped or measures nothing on this
    device is null, and so is its pass."""
    part = lambda name: None if "error" in result.get(name, {"error": None}) or set(result[name]) == {"skipped"} \
        else result[name]
    gpt, llama, opt, svd = part("training"), part("training_llama"), part("optimizer"), part("svd_llama")
    out = {"mfu_final_stage": _target(gpt and gpt["stages"][-1]["mfu"], ">=", TARGETS["mfu_final_stage"])}
    for name, r in (("zero_delta_bf16", gpt), ("zero_delta_bf16_llama", llama)):
        out[name] = _target(max(r["zero_growth_deltas"] or [0.0]) if r else None, "<=", TARGETS["zero_delta_bf16"])
    out["optimizer_several_stages"] = _target(opt and opt["several_stages"]["ratio"], "<=",
                                              TARGETS["optimizer_several_stages"])
    for name, r in (("memory_plan", gpt), ("memory_plan_llama", llama)):
        ratios = r["memory_ratios"] if r else None
        out[name] = {"value": ratios, "limit": list(MEMORY_RANGE), "op": "in", "pass": in_range(ratios or [])}
    out["svd_llama_seconds"] = _target(svd and svd["seconds"], "<=", TARGETS["svd_llama_seconds"])
    shares = gpt and gpt["growth_share"].get("shares")
    out["growth_share"] = _target(max(shares) if shares else None, "<=", TARGETS["growth_share"])
    fsdp_run = part("fsdp_growth")
    out["fsdp_sharded_vs_host"] = _target(fsdp_run and fsdp_run["final_loss_difference"], "<=",
                                          TARGETS["fsdp_sharded_vs_host"])
    tests = part("gpu_tests")
    out["gpu_tests"] = {"value": tests and {k: tests[k] for k in ("passed", "failed", "skipped")},
                        "limit": "the Triton kernel's tests passed, none failed", "op": "all",
                        "pass": None if not tests or tests["kernel_passed"] is None
                        else tests["kernel_passed"] and tests["failed"] == 0}
    routes = opt and opt["several_stages"].get("routes")
    out["optimizer_route"] = {"value": routes, "limit": ["triton"], "op": "only",
                              "pass": None if not routes or not torch.cuda.is_available() else set(routes) == {"triton"}}
    return out


DEFAULT_CHECKS = ("gpu_tests", "optimizer", "kernels", "training", "training_llama", "profile", "liger", "svd_llama")


def checks_of(args, gpu: bool) -> dict:
    """Every check by name, each a function of nothing (`main` records what it returns); `DEFAULT_CHECKS` run
    in their order unless ``--checks`` names others."""
    no_gpu = lambda: {"skipped": "no CUDA device"}
    llama = f"model={args.llama_model}"
    return {"gpu_tests": check_gpu_tests, "optimizer": lambda: check_optimizer(args.model, gpu, args.opt_steps),
            "kernels": lambda: choose_kernels(args, gpu),
            "training": lambda: check_training(args, gpu), "training_llama": lambda: check_training(args, gpu, llama),
            "profile": lambda: check_profile(run_config(args, gpu), Path(args.out)),
            "liger": lambda: check_liger(gpu),
            "svd_growth": lambda: check_svd(args, gpu), "svd_llama": lambda: check_svd(args, gpu, llama, phases=True),
            "ddp": (lambda: check_ddp(args)) if gpu else no_gpu, "fsdp_growth": lambda: check_fsdp_growth(args, gpu)}


def choose_kernels(args, gpu: bool) -> dict:
    """Check 3, and the checks after it run with the fastest pair (unless the overrides name their own)."""
    out = check_kernels(run_config(args, gpu))
    chosen = [f"trainer.{k}={v}" for k, v in out["best"].items()
              if not any(o.startswith(f"trainer.{k}=") for o in args.overrides)]
    args.overrides = [*args.overrides, *chosen]
    return {**out, "applied": chosen}


def main(argv=None) -> int:
    args = parse(argv)
    gpu = torch.cuda.is_available()
    if not gpu and not args.allow_cpu:
        print("gpu-check: no CUDA device on this machine; nothing was checked")
        return 0
    os.environ.setdefault("WANDB_MODE", "disabled")
    checks = checks_of(args, gpu)
    wanted = args.checks.split(",") if args.checks else list(DEFAULT_CHECKS)
    unknown = [c for c in wanted if c not in checks]
    if unknown:
        near = difflib.get_close_matches(unknown[0], checks, n=1)
        print(f"error: --checks {unknown[0]}: not a check (allowed: {', '.join(checks)})"
              + (f"; nearest: {near[0]}" if near else ""), file=sys.stderr)
        return 2
    start, result = time.perf_counter(), {}
    for name, check in ((n, checks[n]) for n in wanted):  # one failing check neither hides the others nor loses their figures
        t0 = time.perf_counter()
        if args.deadline is not None and t0 - start > args.deadline:
            result[name] = {"skipped": f"--deadline {args.deadline:g} s had passed"}
            continue
        try:
            result[name] = check()
        except Exception as exc:  # noqa: BLE001 - recorded in the JSON, and the exit status says it
            traceback.print_exc()
            result[name] = {"error": f"{type(exc).__name__}: {exc}"}
        result.setdefault("check_seconds", {})[name] = time.perf_counter() - t0
        result["targets"] = verdicts(result)  # after every check: a call cut by its timeout keeps its pass flags
        Path(args.out).write_text(json.dumps(result, indent=2))
    failed = [name for name, r in result.items() if isinstance(r, dict) and "error" in r]
    llama = result.get("training_llama", {})
    result["report"] = {"mfu_final_stage_llama": llama["stages"][-1]["mfu"] if "stages" in llama else None}
    result["targets"] = verdicts(result)
    Path(args.out).write_text(json.dumps(result, indent=2))
    print_table(result)
    print(f"wrote {args.out}" + (f"; failed: {', '.join(failed)}" if failed else ""))
    return 1 if failed else 0


def print_table(result: dict) -> None:
    from rich.console import Console
    from rich.table import Table

    console = Console()
    fmt = lambda x, f: "—" if x is None else format(x, f)
    for name in (n for n in ("training", "training_llama") if n in result):
        run = result[name]
        if "stages" not in run:
            console.print(f"{name}: {run.get('error')}")
            continue
        t = Table(title=f"gpu-check {name} on {run['device']}")
        for col in ("stage", "params", "micro-batch", "tokens/s", "MFU", "peak GB (measured)", "peak GB (estimate)"):
            t.add_column(col, justify="right")
        for r in run["stages"]:
            t.add_row(str(r["stage"]), f"{r['params'] / 1e6:.1f}M", str(r["micro_batch"]), fmt(r["tokens_per_s"], ",.0f"),
                      fmt(r["mfu"], ".1%"), fmt(r["peak_gb_measured"], ".2f"), fmt(r["peak_gb_estimate"], ".2f"))
        console.print(t)
    for name, v in result["targets"].items():
        console.print(f"{name}: {v['value']} ({v['op']} {v['limit']}): {'pass' if v['pass'] else 'FAIL' if v['pass'] is False else 'n/a'}")
    for name in (n for n in ("svd_growth", "svd_llama", "liger", "ddp") if n in result):
        r = result[name]
        console.print(f"{name}: " + (format(r["seconds"], ".2f") + " s" if "seconds" in r else str(r.get("error") or r.get("skipped") or "done")))
    f = result.get("fsdp_growth", {})
    for path in (p for p in FSDP_PATHS if p in f):
        console.print(f"fsdp_growth={path}: growths " + ", ".join(f"{g['growth/seconds']:.2f} s" for g in f[path]["growths"]))


if __name__ == "__main__":
    sys.exit(main())
