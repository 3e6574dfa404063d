"""The targets, the JSON's schema and the table of `make bench`."""

from __future__ import annotations

import math
import os
import platform
import sys

import torch

from benchmarks.common import SCHEMA, Bench
from grow.provenance import cpu_info  # the bench's device.cpu

TARGETS = {  # name: (comparison, limit, what)
    "framework_overhead": ("<=", 0.03, "trainer step / plain PyTorch step - 1"),
    "optimizer_one_stage": ("<=", 1.3, "growth-aware AdamW step / torch AdamW step, one stage"),
    "optimizer_several_stages": ("<=", 1.3, "growth-aware AdamW step / torch AdamW step, right after the default "
                                            "schedule's growths"),
    "growth_fraction": ("<=", 0.01, "all growths of the default run / its wall-clock (worst strategy)"),
    "svd_stats_tiny": ("<=", 0.05, "svd statistics passes / run wall-clock, tiny CPU config"),
    "mfu_final_stage": (">=", 0.45, "MFU of the final stage (bf16, compile)"),
}
SHARE = ("<=", 0.01, "the strategy's growths / the default run's wall-clock")  # per strategy: growth_share/<name>


def device_info(device: torch.device) -> dict:
    if device.type == "cuda":
        name = torch.cuda.get_device_name(device)
    else:
        name = platform.processor() or platform.machine()
        try:
            name = next(ln.split(":", 1)[1].strip() for ln in open("/proc/cpuinfo") if ln.startswith("model name"))
        except (OSError, StopIteration):
            pass
    return {"type": device.type, "name": name, "torch": torch.__version__, "threads": torch.get_num_threads(),
            "cpus": os.cpu_count(), "python": platform.python_version(), "cpu": cpu_info()}


def mfu_reason(b: Bench) -> str | None:
    if b.device.type != "cuda":
        return "no CUDA device"
    if b.peak is None:
        return f"unknown dense bf16 peak for {torch.cuda.get_device_name(b.device)} (grow.device.PEAK_BF16_FLOPS)"
    return None


def target(name: str, value, reason: str | None = None, note: str | None = None) -> dict:
    op, limit, what = SHARE if name.startswith("growth_share/") else TARGETS[name]
    ok = None if value is None else (value <= limit if op == "<=" else value >= limit)
    return {"value": value, "op": op, "limit": limit, "pass": ok, "what": what,
            "reason": reason if value is None else None, "note": note}


def judged_share(s: dict) -> tuple[float, str | None]:
    """(the growth share a strategy's target is judged on, the note saying which plan): the plan its source runs
    where it declares one (`Strategy.reference_training_steps`, e.g. ligo), else the default run."""
    ref = s.get("reference_plan")
    if ref is None:
        return s["run_fraction"], None
    return ref["run_fraction"], (
        f"on its source's plan: the default run's stages x {ref['scale']:,.0f}, the last {ref['last_stage_steps']:,} "
        f"steps (Strategy.reference_training_steps); on the default run {100 * s['run_fraction']:.1f}%")


def share_target(name: str, s: dict) -> dict:
    value, note = judged_share(s)
    return target(f"growth_share/{name}", value, note=note)


def targets(result: dict, b: Bench) -> dict:
    strategies = {n: s for n, s in result["growth"]["strategies"].items() if "skipped" not in s}
    worst = max(strategies, key=lambda n: judged_share(strategies[n])[0]) if strategies else None
    tiny = result.get("svd_stats_tiny")
    mfu = result["mfu"]
    note = None
    if (b.s["model"], b.s["compile"], b.amp) != ("gpt-124m", True, torch.bfloat16):
        note = (f"the target is for model=gpt-124m, bf16, compile; measured: model={b.s['model']}, "
                f"autocast={str(b.amp).replace('torch.', '')}, compile={b.s['compile']}")
    return {
        "framework_overhead": target("framework_overhead", result["step"]["overhead"]),
        "optimizer_one_stage": target("optimizer_one_stage", result["optimizer"]["one_stage"]["ratio"],
                                      note=f"reference: {result['optimizer']['one_stage']['reference']}"),
        "optimizer_several_stages": target(
            "optimizer_several_stages", result["optimizer"]["several_stages"]["ratio"],
            note=f"reference: {result['optimizer']['several_stages']['reference']}, "
                 f"{100 * result['optimizer']['several_stages']['mixed_fraction']:.0f}% of the elements in mixed tensors, "
                 f"{'one-pass' if result['optimizer']['several_stages']['compile'] else 'eager'} per-element update "
                 f"(the trainer's default here)"),
        "growth_fraction": target("growth_fraction", judged_share(strategies[worst])[0] if worst else None,
                                  reason="no strategy timed", note=f"worst strategy: {worst}" if worst else None),
        "svd_stats_tiny": target("svd_stats_tiny", tiny["fraction"] if tiny else None, reason="skipped (--no-tiny)"),
        "mfu_final_stage": target("mfu_final_stage", mfu["final_stage"], reason=mfu["reason"], note=note),
        **{f"growth_share/{n}": share_target(n, s) for n, s in strategies.items()},
    }


# (dotted path, kind): kind is num, int, str, bool, list, dict; a trailing ? allows null
TARGET_FIELDS = [("value", "num?"), ("limit", "num"), ("op", "str"), ("pass", "bool?"), ("reason", "str?")]
SCHEMA_FIELDS = [
    ("schema", "str"), ("seconds", "num"), ("section_seconds", "dict"), ("loadavg", "list"),
    ("device.type", "str"), ("device.name", "str"), ("device.torch", "str"), ("device.threads", "int"),
    ("device.cpu.model", "str"), ("device.cpu.simd", "str?"), ("device.cpu.fma", "bool"),
    ("device.cpu.torch_capability", "str?"), ("device.cpu.arch", "str"),
    ("config.model", "str"), ("config.model_config", "dict"), ("config.batch_size", "int"), ("config.seq_len", "int"),
    ("config.autocast", "str?"), ("config.compile", "bool"), ("config.schedule", "str"), ("config.max_tokens", "int"),
    ("config.steps", "int"), ("config.warmup", "int"), ("config.block", "int"), ("config.overrides", "list"),
    ("step.grow_s", "num"), ("step.plain_s", "num"), ("step.overhead", "num"), ("step.plain_optimizer", "str"),
    ("step.tokens_per_step", "int"), ("step.compile_s", "num?"), ("step.samples.grow", "list"),
    ("step.samples.plain", "list"),
    ("optimizer.params", "int"),
    *[(f"optimizer.{k}.{f}", t) for k in ("one_stage", "several_stages") for f, t in (
        ("grow_s", "num"), ("torch_fused_s", "num?"), ("torch_foreach_s", "num"), ("reference", "str"),
        ("ratio", "num"), ("ratio_foreach", "num"))],
    ("optimizer.several_stages.stages", "int"), ("optimizer.several_stages.mixed_fraction", "num"),
    ("optimizer.several_stages.compile", "bool"), ("optimizer.several_stages.other.compile", "bool"),
    ("optimizer.several_stages.other.grow_s", "num"), ("optimizer.several_stages.other.ratio", "num"),
    ("optimizer.several_stages.other.first_step_s", "num"),
    ("stages", "list"), ("growth.step_s", "num"), ("growth.run_train_s", "num"), ("growth.strategies", "dict"),
    ("svd_stats_tiny", "dict?"), ("mfu.final_stage", "num?"), ("mfu.peak_flops", "num?"), ("mfu.reason", "str?"),
    *[(f"targets.{name}.{f}", t) for name in TARGETS for f, t in TARGET_FIELDS],
]
STAGE_FIELDS = [("stage", "int"), ("dims", "str"), ("params", "int"), ("batch_size", "int"), ("steps", "int"),
                ("step_s", "num"), ("tokens_per_s", "num"), ("flops_per_token", "int"), ("mfu", "num?"),
                ("compile_s", "num?")]
STRATEGY_FIELDS = [("growths", "list"), ("last_s", "num"), ("last_vs_step", "num"), ("total_s", "num"),
                   ("stats_s", "num?"), ("run_s", "num"), ("run_fraction", "num"), ("stats_fraction", "num?"),
                   ("reference_plan", "dict?")]
GROWTH_FIELDS = [("stage", "int"), ("seconds", "num"), ("stats_seconds", "num?"), ("params_after", "int"),
                 ("vs_step", "num")]
TINY_FIELDS = [("stats_s", "num"), ("growth_s", "num"), ("run_s", "num"), ("fraction", "num")]


def _kind_ok(value, kind: str) -> bool:
    if kind.endswith("?"):
        return value is None or _kind_ok(value, kind[:-1])
    if kind == "num":
        return isinstance(value, (int, float)) and not isinstance(value, bool) and math.isfinite(value)
    if kind == "int":
        return isinstance(value, int) and not isinstance(value, bool)
    return isinstance(value, {"str": str, "bool": bool, "list": list, "dict": dict}[kind])


def _check(obj, fields, where: str) -> list[str]:
    errors = []
    for path, kind in fields:
        node, ok = obj, True
        for key in path.split("."):
            if not isinstance(node, dict) or key not in node:
                ok = False
                break
            node = node[key]
        if not ok:
            errors.append(f"{where}{path}: missing")
        elif not _kind_ok(node, kind):
            errors.append(f"{where}{path}: {node!r} is not {kind}")
    return errors


def check_schema(result: dict) -> list[str]:
    """Every field `make bench` promises, with its type; [] when the JSON is complete.

    A null figure must come with a reason: each target's ``reason`` when its value is null, the
    ``mfu.reason`` when the final stage's MFU is null."""
    errors = _check(result, SCHEMA_FIELDS, "")
    if errors:
        return errors
    if result["schema"] != SCHEMA:
        errors.append(f"schema: {result['schema']!r} is not {SCHEMA!r}")
    if not result["stages"]:
        errors.append("stages: empty")
    for i, row in enumerate(result["stages"]):
        errors += _check(row, STAGE_FIELDS, f"stages[{i}].")
    for name, s in result["growth"]["strategies"].items():
        if "skipped" in s:
            errors += _check(s, [("skipped", "str")], f"growth.strategies.{name}.")
            continue
        errors += _check(s, STRATEGY_FIELDS, f"growth.strategies.{name}.")
        for i, g in enumerate(s.get("growths") or []):
            errors += _check(g, GROWTH_FIELDS, f"growth.strategies.{name}.growths[{i}].")
    if result["svd_stats_tiny"] is not None:
        errors += _check(result["svd_stats_tiny"], TINY_FIELDS, "svd_stats_tiny.")
    for name in result["targets"]:
        if name not in TARGETS:
            if not name.startswith("growth_share/") or name.split("/", 1)[1] not in result["growth"]["strategies"]:
                errors.append(f"targets.{name}: not a target")
                continue
            errors += _check(result["targets"][name], TARGET_FIELDS, f"targets.{name}.")
    for name, s in result["growth"]["strategies"].items():
        if "skipped" not in s and f"growth_share/{name}" not in result["targets"]:
            errors.append(f"targets.growth_share/{name}: missing")
    if errors:
        return errors
    for name, t in result["targets"].items():
        if t["value"] is None and not t["reason"]:
            errors.append(f"targets.{name}: null value without a reason")
        if (t["value"] is None) != (t["pass"] is None):
            errors.append(f"targets.{name}: pass must be null exactly when the value is")
    if result["mfu"]["final_stage"] is None and not result["mfu"]["reason"]:
        errors.append("mfu: null final_stage without a reason")
    return errors


def fmt(x, unit: str = "") -> str:
    if x is None:
        return "—"
    if unit == "%":
        return f"{100 * x:.2f}%"
    if unit == "x":
        return f"{x:.3f}x"
    if unit == "s":
        return f"{x * 1e3:.2f} ms" if x < 1 else f"{x:.2f} s"
    if unit == "tok/s":
        return f"{x:,.0f}"
    return f"{x:.4g}"


def print_table(r: dict) -> None:
    from rich.console import Console
    from rich.table import Table

    con = Console() if sys.stdout.isatty() else Console(width=120)
    d, c = r["device"], r["config"]
    cpu = d["cpu"]
    con.print(f"[bold]grow bench[/] on {d['type']} ({d['name']}, torch threads={d['threads']}, torch {d['torch']}), "
              f"{'host ' + cpu['model'] + ' ' if d['type'] != 'cpu' else ''}{cpu['arch']}, SIMD {cpu['simd'] or 'unknown'}"
              f"{' + FMA' if cpu['fma'] else ''}, torch CPU capability {cpu['torch_capability'] or 'unknown'}, "
              f"model={c['model']} batch={c['batch_size']}x{c['seq_len']} autocast={c['autocast']} "
              f"compile={c['compile']}; load average {r['loadavg'][0]:.1f} -> {r['loadavg'][1]:.1f}")
    t = Table(title="1-2. step and optimizer (medians, interleaved)")
    for col in ("figure", "grow", "reference", "ratio"):
        t.add_column(col)
    st, op = r["step"], r["optimizer"]
    t.add_row("training step", fmt(st["grow_s"], "s"), f"{fmt(st['plain_s'], 's')} (plain, AdamW {st['plain_optimizer']})",
              fmt(1 + st["overhead"], "x"))
    for k in ("one_stage", "several_stages"):
        o = op[k]
        label = "optimizer, one stage" if k == "one_stage" else f"optimizer, {o['stages']} stages " \
                f"({100 * o['mixed_fraction']:.0f}% mixed, {'one pass' if o['compile'] else 'eager'})"
        t.add_row(label, fmt(o["grow_s"], "s"), f"{fmt(o['torch_fused_s'], 's')} fused / "
                  f"{fmt(o['torch_foreach_s'], 's')} foreach", f"{fmt(o['ratio'], 'x')} ({o['reference']})")
    x = op["several_stages"]["other"]
    t.add_row(f"  the same, {'one pass' if x['compile'] else 'eager'} (first step {fmt(x['first_step_s'], 's')})",
              fmt(x["grow_s"], "s"), "", f"{fmt(x['ratio'], 'x')} ({op['several_stages']['reference']})")
    con.print(t)
    t = Table(title="3. growth through the default schedule (growth/seconds, statistics included)")
    for col in ("strategy", "growths", "last", "last / step", "share of run", "statistics", "share, source's plan"):
        t.add_column(col)
    for n, s in r["growth"]["strategies"].items():
        if "skipped" in s:
            t.add_row(n, "skipped (below)", "", "", "", "", "")
            continue
        ref = s.get("reference_plan")
        t.add_row(n, " ".join(fmt(g["seconds"], "s") for g in s["growths"]), fmt(s["last_s"], "s"),
                  fmt(s["last_vs_step"], "x"), fmt(s["run_fraction"], "%"), fmt(s["stats_fraction"], "%"),
                  fmt(ref["run_fraction"], "%") if ref else "")
    con.print(t)
    for n, s in r["growth"]["strategies"].items():
        if "skipped" in s:
            con.print(f"{n} skipped: {s['skipped']}")
    t = Table(title="4. stages of the default schedule (trainer step; the last one from 1)")
    for col in ("stage", "dims", "batch", "steps", "step", "tokens/s", "MFU", "compile"):
        t.add_column(col)
    for s in r["stages"]:
        t.add_row(str(s["stage"]), s["dims"], str(s["batch_size"]), str(s["steps"]), fmt(s["step_s"], "s"),
                  fmt(s["tokens_per_s"], "tok/s"), fmt(s["mfu"], "%"), fmt(s["compile_s"], "s"))
    con.print(t)
    t = Table(title="targets")
    for col in ("target", "value", "limit", "", "note"):
        t.add_column(col)
    for name, x in r["targets"].items():
        unit = "x" if name.startswith("optimizer_") else "%"
        status = "n/a" if x["pass"] is None else ("[green]PASS[/]" if x["pass"] else "[red]FAIL[/]")
        t.add_row(name, fmt(x["value"], unit), f"{x['op']} {fmt(x['limit'], unit)}", status,
                  x["reason"] or x["note"] or "")
    con.print(t)
