"""The report of any set of runs: ``grow report runs=[...]`` and ``grow compare report=<sweep dir>``.

`build_report` reads runs (`grow.runs.find_runs`: run directories, ``grow compare`` sweeps and
``grow train -m`` multiruns, mixed) and writes ``summary.json``, ``report.md``, ``loss_vs_flops.png``
and ``loss_vs_time.png`` into an output directory, and prints the table. ``grow compare`` writes
into its sweep directory after the last job (`grow.compare.ReportCallback`) and on
``grow compare report=<sweep dir>``; ``grow report`` into ``out=`` (default
``outputs/report/<date_time>/``). Both go through the code below, so the columns are the same.

Arms. Runs with the same label (``arm.json``'s arm, or for a ``grow train`` run its strategy, or
``baseline`` without a schedule) are the seeds of one arm. When runs from different places would
make one arm hold two runs of the same seed, their labels get the config keys in which they differ
(``zero width_rate=0.5``), and, when their configs agree, the directory they came from
(``baseline [sweepA]``) (`distinguish`). Each run's ratios are taken against a baseline of the same
seed (`assign_baselines`): in its own sweep, the one ``arm.json`` names; across sweeps, a baseline
run with the same final model and token budget, its own sweep's first.

Per arm, over its seeds (mean and sample standard deviation, n - 1; null with one seed), `COLUMNS`.
Every ratio is taken per seed against that seed's baseline, then averaged; `stat` keeps the values
per seed so that other statistics (a difference in standard errors) can be added beside mean ± std.

FLOPs to reach the baseline's loss (`flops_to_reach`): the validation curve of a run is the
sequence of its validation measurements in the order they were taken, as (cumulative FLOPs, loss)
points: every ``val/loss`` record (``trainer.eval_every``, each stage's end, the end of the run)
and, at each growth, ``growth/loss_before`` (at the FLOPs before the growth's own passes) and
``growth/loss_after`` (after them). The curve is linear between consecutive points; the answer is
the FLOPs of its first point at or below the target, found by interpolating linearly between that
point and the one before it, or None when no point reaches the target. The first point is not
interpolated from an assumed start. The resolution is that of the evaluations.

Recovery: a run logs, after each growth, the change of the validation loss since the growth,
``growth/recovery``, measured ``growth/recovery_steps`` steps later (``min(trainer.recovery_steps,
steps left in the stage)``); the report shows the mean over growths with that step count.

Stages are numbered from 1 (the first stage is stage 1; the first growth enters stage 2).
"""

from __future__ import annotations

import json
import math
import statistics
import time
from pathlib import Path

from grow.errors import ConfigError
from grow.runs import Run, find_runs, is_run_dir

REPORT_FILES = ("summary.json", "report.md", "loss_vs_flops.png", "loss_vs_time.png")

# The columns of the report: summary.json key -> (header, how it is shown, description).
COLUMNS: dict[str, tuple[str, str, str]] = {
    "final_val_loss": ("final val loss", "loss", "validation loss at the end of the run"),
    "flops": ("FLOPs", "si", "training FLOPs (every stage) + the growth strategies' own passes"),
    "flops_pct_baseline": ("FLOPs % base", "pct", "flops as % of the baseline's (same seed)"),
    "train_seconds": ("train s", "sec", "wall-clock of training steps and growths, compile time apart"),
    "time_pct_baseline": ("time % base", "pct", "train_seconds as % of the baseline's (same seed); depends on "
                                                "the machine's load while each run ran (see Wall-clock)"),
    "compile_seconds": ("compile s", "sec", "torch.compile time (first step after each (re)compile)"),
    "flops_to_baseline_loss": ("FLOPs to base loss", "frac",
                               "FLOPs until the validation curve first reaches the baseline's final loss, as a "
                               "fraction of the baseline's FLOPs (null: never reached)"),
    "max_abs_growth_delta": ("max |Δ| growth", "loss", "largest |loss after - loss before| over the growths"),
    "mean_recovery": ("mean recovery", "loss",
                      "mean over growths of the validation-loss change since the growth, measured "
                      "growth/recovery_steps steps after it (min(trainer.recovery_steps, steps left in the "
                      "stage); the cell says how many)"),
}
EXTRA = ("tokens", "train_flops", "growth_flops", "plan_flops", "wall_seconds", "growths", "recovery_steps")

ACCOUNTING = (
    "FLOPs: per stage, the stage model's training FLOPs per token (6 x matmul weights + 6 N s E (k + v), "
    "docs/design.md) times the tokens it trains, summed over stages (grow.schedule.training_flops, the code of "
    "`grow schedule`), plus the FLOPs every growth strategy spends on its own passes (statistics, line "
    "search); validation passes are not counted. Wall-clock: training steps and growths; torch.compile time "
    "apart; evaluations and start-up not included. FLOPs to reach the baseline's final loss: the first point of "
    "the validation curve (val/loss records and the losses before and after each growth, in order, against "
    "cumulative FLOPs) at or below it, interpolated linearly from the point before; — when never reached. "
    "equal_flops: the final model from scratch on floor(plan FLOPs / (FLOPs per step of the final model)) "
    "steps, the growth passes left out of the budget."
)
# Config keys that do not make two runs different experiments (they never name an arm).
NOT_AN_ARM = ("seed", "resume", "device", "logger", "trainer.progress", "trainer.keep_checkpoints",
              "trainer.ckpt_every", "data.cache_dir", "compare", "report")


# ---- which runs: arms and baselines ---------------------------------------------------------------


def collect(paths: list[Path], key: str = "runs") -> list[Run]:
    """Every run of ``paths`` (runs and sweeps, mixed; a run named twice counts once), labelled and
    matched with its baseline."""
    runs, seen = [], set()
    for path in paths:
        for r in find_runs(Path(path), key):
            if r.dir.resolve() not in seen:
                seen.add(r.dir.resolve())
                runs.append(r)
    assign_baselines(runs)
    distinguish(runs)
    return runs


def _flat(d, prefix: str = "") -> dict:
    out = {}
    for k, v in (d or {}).items():
        name = f"{prefix}{k}"
        if isinstance(v, dict):
            out.update(_flat(v, f"{name}."))
        else:
            out[name] = v
    return out


def short_key(key: str) -> str:
    for prefix in ("schedule.", "strategy."):
        if key.startswith(prefix):
            return key[len(prefix):]
    return key


def _differences(runs: list[Run]) -> list[str]:
    flats = [_flat(r.config) for r in runs]
    keys = sorted({k for f in flats for k in f})
    return [k for k in keys if not any(k == n or k.startswith(n + ".") for n in NOT_AN_ARM)
            and len({json.dumps(f.get(k), sort_keys=True) for f in flats}) > 1]


def _collides(runs: list[Run]) -> bool:
    seeds = [r.seed for r in runs]
    return len(seeds) != len(set(seeds))


def distinguish(runs: list[Run]) -> None:
    """Relabel the runs of a label that holds one seed twice: by the config keys their configs differ
    in, then (identical configs) by the directory they were found through."""
    by_label: dict[str, list[Run]] = {}
    for r in runs:
        by_label.setdefault(r.label, []).append(r)
    for label, rs in by_label.items():
        if not _collides(rs):
            continue
        keys = _differences(rs)
        for r in rs:
            flat = _flat(r.config)
            r.arm["arm"] = " ".join([label, *(f"{short_key(k)}={flat.get(k)}" for k in keys)])
        groups: dict[str, list[Run]] = {}
        for r in rs:
            groups.setdefault(r.label, []).append(r)
        for same in groups.values():
            if _collides(same):
                for r in same:
                    r.arm["arm"] += f" [{r.source.name}]"


def _budget(r: Run):
    return (r.config or {}).get("trainer", {}).get("max_tokens")


def _final(r: Run):
    return (r.summary or {}).get("final_config") or r.arm.get("final_config")


def assign_baselines(runs: list[Run]) -> None:
    """``run.base``: the complete baseline run of the same seed named by the run's ``baseline_arm``, from its
    own sweep first; from elsewhere only with the same final model and token budget."""
    bases = [r for r in runs if r.arm.get("kind") == "baseline" and r.complete]
    for r in runs:
        same = [b for b in bases if b.label == r.arm.get("baseline_arm") and b.seed == r.seed]
        own = [b for b in same if b.source == r.source]
        other = [b for b in same if b.source != r.source and _final(b) == _final(r) and _budget(b) == _budget(r)]
        r.base = (own or other or [None])[0]


# ---- figures ---------------------------------------------------------------------------------------------


def curve(records: list[dict]) -> list[tuple[float, float, float, str]]:
    """The validation curve of a run: (cumulative FLOPs, val loss, train seconds, kind) in measurement order.

    ``val/loss`` records (kind "val"), and at each growth its loss before (kind "before", at the FLOPs
    before the growth's own passes) and after ("after"); a growth's time is that of the last record
    before it plus ``growth/seconds``."""
    points, t = [], 0.0
    for r in records:
        if "time/seconds" in r:
            t = float(r["time/seconds"])
        if "growth/loss_before" in r:
            f = float(r["train/flops"])
            points.append((f - float(r.get("growth/flops", 0.0)), float(r["growth/loss_before"]), t, "before"))
            t += float(r.get("growth/seconds", 0.0))
            points.append((f, float(r["growth/loss_after"]), t, "after"))
        elif "val/loss" in r:
            points.append((float(r["train/flops"]), float(r["val/loss"]), t, "val"))
    return points


def flops_to_reach(points, target: float) -> float | None:
    """FLOPs at which a curve [(flops, loss, ...), ...] first reaches ``target`` (loss <= target).

    Linear interpolation between the first point at or below the target and the point before it;
    the first point itself when it is already there; None when no point reaches the target."""
    for i, p in enumerate(points):
        f, loss = float(p[0]), float(p[1])
        if not math.isfinite(loss) or loss > target:
            continue
        if i == 0:
            return f
        f0, l0 = float(points[i - 1][0]), float(points[i - 1][1])
        if not math.isfinite(l0) or l0 <= loss:
            return f
        return f0 + (f - f0) * (l0 - target) / (l0 - loss)
    return None


def _mean(xs):
    return sum(xs) / len(xs) if xs else None


def run_metrics(run: Run, base: Run | None) -> dict:
    """The per-run figures of the report (ratios against ``base``, the baseline of the same seed)."""
    s = run.summary
    events = s.get("growth_events") or []
    deltas = [abs(float(e["growth/delta"])) for e in events if e.get("growth/delta") is not None]
    recovered = [e for e in events if e.get("growth/recovery") is not None]
    steps = [float(e["growth/recovery_steps"]) for e in recovered if e.get("growth/recovery_steps") is not None]
    m = {
        "seed": run.seed, "run_dir": run.dir.name, "final_val_loss": float(s["final_val_loss"]),
        "tokens": int(s["tokens"]), "flops": float(s["flops"]), "train_flops": float(s["train_flops"]),
        "growth_flops": float(s["growth_flops"]), "plan_flops": float(run.arm.get("plan_flops", float("nan"))),
        "train_seconds": float(s["train_seconds"]), "compile_seconds": float(s["compile_seconds"]),
        "wall_seconds": float(s["wall_seconds"]), "growths": len(events),
        "max_abs_growth_delta": max(deltas) if deltas else None,
        "mean_recovery": _mean([float(e["growth/recovery"]) for e in recovered]),
        "recovery_steps": _mean(steps), "recovery_steps_each": [e.get("growth/recovery_steps") for e in recovered],
        "load_average": s.get("load_average"),
        "flops_pct_baseline": None, "time_pct_baseline": None, "flops_to_baseline_loss": None,
        "reached_baseline_loss": None,
    }
    if base is not None:
        b = base.summary
        m["flops_pct_baseline"] = 100.0 * m["flops"] / float(b["flops"])
        m["time_pct_baseline"] = 100.0 * m["train_seconds"] / max(float(b["train_seconds"]), 1e-12)
        reach = flops_to_reach(curve(run.records), float(b["final_val_loss"]))
        m["reached_baseline_loss"] = reach is not None
        m["flops_to_baseline_loss"] = None if reach is None else reach / float(b["flops"])
    return m


def stat(values: list) -> dict:
    """Mean and sample standard deviation (n - 1) of the non-null values; the values themselves."""
    xs = [float(v) for v in values if v is not None]
    return {"mean": _mean(xs), "std": statistics.stdev(xs) if len(xs) > 1 else None, "n": len(xs),
            "values": list(values)}


def _arm_entry(label: str, rs: list[Run], several_sources: bool) -> dict:
    a = rs[0].arm
    done = [r for r in rs if r.complete]
    per_run = []
    for r in done:
        m = run_metrics(r, r.base)
        if several_sources and r.source != r.dir:
            m["run_dir"] = f"{r.source.name}/{r.dir.name}"
        per_run.append(m)
    bases = [r.base.label for r in done if r.base is not None]
    entry = {"arm": label, "kind": a["kind"], "strategy": a.get("strategy"), "setting": a.get("setting", {}),
             "baseline_arm": (bases[0] if bases else a.get("baseline_arm")) if a["kind"] != "baseline" else None,
             "seeds": [m["seed"] for m in per_run],
             "failed": {str(r.seed): r.failed for r in rs if r.failed},
             "incomplete": [r.seed for r in rs if not r.complete and not r.failed],
             "has_baseline": bool(per_run) and all(m["flops_pct_baseline"] is not None for m in per_run)}
    for key in (*COLUMNS, *EXTRA):
        entry[key] = stat([m[key] for m in per_run])
    entry["flops_to_baseline_loss"]["reached"] = sum(bool(m["reached_baseline_loss"]) for m in per_run)
    entry["accounting_check"] = all(abs(m["train_flops"] - m["plan_flops"]) <= 1e-9 * max(m["plan_flops"], 1)
                                    for m in per_run)
    entry["runs"] = per_run
    return entry


def summarize(runs: list[Run], out_dir: Path, title: str | None = None) -> dict:
    """The report's figures: one entry per arm (mean ± std over seeds of every column), the sources,
    the command lines and stage plans that made the runs."""
    out_dir = Path(out_dir)
    sources = list(dict.fromkeys(r.source for r in runs))
    arms: dict[str, list[Run]] = {}
    for r in runs:
        arms.setdefault(r.label, []).append(r)
    return {
        "title": title or experiment_title(runs),
        "sweep_dir": str((sources[0] if len(sources) == 1 else out_dir).absolute()),
        "sources": [str(s.absolute()) for s in sources],
        "group": (sources[0] if len(sources) == 1 else out_dir).name,
        "commands": list(dict.fromkeys(r.command for r in runs if r.command)),
        "columns": {k: v[2] for k, v in COLUMNS.items()},
        "statistics": "mean and sample standard deviation (n - 1) over seeds; std null with one seed; "
                      "ratios per seed against the baseline of the same seed",
        "accounting": ACCOUNTING,
        "arms": [_arm_entry(label, rs, len(sources) > 1) for label, rs in arms.items()],
        "schedules": schedules(runs),
    }


def experiment_title(runs: list[Run]) -> str:
    """What the runs are, from their configs: 'zero, random vs the baseline: growing to 50.5k parameters
    on 29.7k tokens of stdlib'."""
    from grow.console import fmt_num

    done = [r for r in runs if r.complete]
    grown = list(dict.fromkeys(r.arm.get("strategy") or r.arm.get("kind") or r.label for r in runs
                               if r.arm.get("kind") != "baseline"))
    what = ", ".join(grown[:4]) + (f" and {len(grown) - 4} more" if len(grown) > 4 else "")
    if any(r.arm.get("kind") == "baseline" for r in runs):
        what = f"{what} vs the baseline" if what else "the fixed-size baseline"
    params = sorted({int(r.summary["params"]) for r in done if "params" in r.summary})
    tokens = sorted({int(r.summary["tokens"]) for r in done if r.arm.get("kind") != "equal_flops"})
    data = sorted({str((r.config or {}).get("data", {}).get("name")) for r in runs if r.config})
    size = (f"{fmt_num(params[0])} parameters" if len(params) == 1 else
            f"{fmt_num(params[0])}–{fmt_num(params[-1])} parameters" if params else "")
    budget = (f"{fmt_num(tokens[0])} tokens" if len(tokens) == 1 else
              f"{fmt_num(tokens[0])}–{fmt_num(tokens[-1])} tokens" if tokens else "")
    on = " on ".join(p for p in (size, budget) if p)
    corpus = f" of {', '.join(data)}" if data and budget else ""
    return f"{what}: {'growing to ' if grown else ''}{on}{corpus}" if on else what


def schedules(runs: list[Run]) -> list[dict]:
    """The distinct stage plans of the grown runs, each with the arms that used it; stages numbered from 1."""
    plans: dict[str, dict] = {}
    for r in runs:
        if r.arm.get("kind") != "grown":
            continue
        stages = (r.summary or {}).get("stage_plan") or r.arm.get("plan") or []
        rows = [{"stage": i, "config": s["config"], "batch_size": s["batch_size"], "steps": s["steps"],
                 "tokens": s["tokens"], "flops": s["flops"], "params": s.get("params")}
                for i, s in enumerate(stages, start=1)]
        if not rows:
            continue
        key = json.dumps(rows, sort_keys=True)
        plans.setdefault(key, {"arms": [], "stages": rows})
        if r.label not in plans[key]["arms"]:
            plans[key]["arms"].append(r.label)
    return list(plans.values())


# ---- output --------------------------------------------------------------------------------------


def _si(x: float) -> str:
    from grow.console import fmt_num

    return fmt_num(x)


def fmt_stat(s: dict, how: str, *, baseline_missing: bool = False) -> str:
    """'3.412 ± 0.012', '41.3% ± 0.2', '0.62 (2/3 reached)', '—'."""
    if s["mean"] is None:
        if how in ("pct", "frac") and baseline_missing:
            return "n/a"
        return "—"
    mean, std = s["mean"], s["std"]
    if how == "loss":
        text, err = f"{mean:.4f}", (f"{std:.4f}" if std is not None else None)
    elif how == "pct":
        text, err = f"{mean:.1f}%", (f"{std:.1f}" if std is not None else None)
    elif how == "frac":
        text, err = f"{mean:.3f}", (f"{std:.3f}" if std is not None else None)
    elif how == "sec":
        text, err = f"{mean:.2f}", (f"{std:.2f}" if std is not None else None)
    else:
        text, err = _si(mean), (_si(std) if std is not None else None)
    out = text if err is None else f"{text} ± {err}"
    if "reached" in s and s["reached"] < len(s["values"]):
        out += f" ({s['reached']}/{len(s['values'])} reached)"
    return out


def _steps_note(entry: dict) -> str:
    """' (@5 steps)' or ' (@3–5 steps)': when a recovery was measured."""
    steps = [v for m in entry["runs"] for v in m["recovery_steps_each"] if v is not None]
    if entry["mean_recovery"]["mean"] is None or not steps:
        return ""
    lo, hi = int(min(steps)), int(max(steps))
    return f" (@{lo} steps)" if lo == hi else f" (@{lo}–{hi} steps)"


def table_rows(summary: dict) -> tuple[list[str], list[list[str]]]:
    headers = ["arm", "seeds", *(v[0] for v in COLUMNS.values())]
    rows = []
    for e in summary["arms"]:
        seeds = ",".join(map(str, e["seeds"])) or "-"
        if e["failed"]:
            seeds += f" (failed: {','.join(e['failed'])})"
        if e["incomplete"]:
            seeds += f" (unfinished: {','.join(map(str, e['incomplete']))})"
        missing = not e["has_baseline"]
        cells = {k: fmt_stat(e[k], how, baseline_missing=missing) for k, (_, how, _) in COLUMNS.items()}
        cells["mean_recovery"] += _steps_note(e)
        rows.append([e["arm"], seeds, *cells.values()])
    return headers, rows


def print_table(summary: dict, out_dir: Path) -> None:
    from rich.markup import escape
    from rich.table import Table

    from grow.console import console

    headers, rows = table_rows(summary)
    table = Table(title=escape(summary["title"]),
                  caption="mean ± std over seeds; % and fractions against the baseline of the same seed; "
                          "— never reached; n/a no baseline")
    for i, h in enumerate(headers):
        table.add_column(h, justify="left" if i < 2 else "right")
    for row in rows:
        table.add_row(*(escape(str(c)) for c in row))
    console.print(table)
    console.print(escape(f"report: {Path(out_dir) / 'report.md'}"))


def _md_table(headers: list[str], rows: list[list[str]]) -> str:
    esc = lambda s: str(s).replace("|", "\\|")
    lines = ["| " + " | ".join(map(esc, headers)) + " |", "|" + "---|" * len(headers)]
    lines += ["| " + " | ".join(map(esc, r)) + " |" for r in rows]
    return "\n".join(lines)


def _dims(c: dict, prev: dict | None = None) -> list[str]:
    from grow.console import DIM_LETTERS

    return [f"**{c[f]}**" if prev is not None and prev[f] != c[f] else str(c[f]) for f in DIM_LETTERS]


def _schedule_md(summary: dict) -> list[str]:
    from grow.console import DIM_LETTERS, LEGEND

    lines = []
    for plan in summary["schedules"]:
        total = sum(s["flops"] for s in plan["stages"]) or 1
        rows, prev = [], None
        for s in plan["stages"]:
            rows.append([s["stage"], *_dims(s["config"], prev), _si(s["params"]) if s["params"] else "—",
                         s["batch_size"], s["steps"], _si(s["tokens"]), _si(s["flops"]),
                         f"{100.0 * s['flops'] / total:.1f}%"])
            prev = s["config"]
        lines += [f"Stage plan of {', '.join(plan['arms'])} (bold: grown at the start of the stage):", "",
                  _md_table(["stage", *DIM_LETTERS.values(), "params", "batch", "steps", "tokens", "FLOPs",
                             "% FLOPs"], rows), ""]
    if lines:
        lines += [f"{LEGEND}.", ""]
    return lines


def _load_note(summary: dict) -> list[str]:
    loads = [(e["arm"], m["seed"], m["load_average"]) for e in summary["arms"] for m in e["runs"]
             if m.get("load_average")]
    if not loads:
        return ["The machine's load was not recorded for these runs. Wall-clock figures (train s, time % base) "
                "depend on what else the machine was doing; FLOPs are counted and do not.", ""]
    values = [float(v) for _, _, la in loads for v in la]
    return [f"Wall-clock figures (train s, time % base) were measured while the machine's 1-minute load average "
            f"was between {min(values):.1f} and {max(values):.1f} (per run at its start → end in the Runs table). "
            "On a loaded machine other processes take CPU time from a run, so two arms of equal FLOPs can differ in "
            "time % base; FLOPs are counted and do not depend on the load.", ""]


def _growth_rows(runs: list[Run]) -> list[list]:
    """One row per growth of every complete run: the stages it joins (numbered from 1), the validation
    loss before and after, Δ, the recovery and its steps, and a note when a figure hit its grid's edge."""
    from grow.console import edge_message, fmt_delta, grid_edge_hits

    labels = list(dict.fromkeys(r.label for r in runs))
    rows = []
    for r in sorted((r for r in runs if r.complete), key=lambda r: (labels.index(r.label), r.seed)):
        for i, ev in enumerate(r.summary.get("growth_events") or [], start=1):
            rec, steps = ev.get("growth/recovery"), ev.get("growth/recovery_steps")
            rows.append([r.label, r.seed, f"{i} → {i + 1}", f"{ev['growth/loss_before']:.4f}",
                         f"{ev['growth/loss_after']:.4f}", fmt_delta(float(ev["growth/delta"])),
                         "—" if rec is None else fmt_delta(float(rec)) + (f" @{int(steps)}" if steps else ""),
                         "; ".join(edge_message(h) for h in grid_edge_hits(ev))])
    return rows


def report_markdown(summary: dict, runs: list[Run]) -> str:
    headers, rows = table_rows(summary)
    lines = [f"# {summary['title']}", ""]
    first = next((r for r in runs if r.complete), None)
    if first is not None:
        fc = first.summary["final_config"]
        lines += [f"Final model: N={fc['n_layers']} h={fc['d_model']} E={fc['n_heads']} k={fc['d_qk']} "
                  f"v={fc['d_v']} p={fc['d_ff']} s={fc['seq_len']} V={fc['vocab_size']}. "
                  f"Runs from: {', '.join(f'`{s}`' for s in summary['sources'])}.", ""]
    if summary["commands"]:
        lines += ["Made by:", "", "```bash", *summary["commands"], "```", ""]
    lines += _schedule_md(summary)
    lines += [_md_table(headers, rows), "",
              "Mean ± sample standard deviation (n − 1) over seeds. \"% base\" and \"FLOPs to base loss\" are "
              "taken per seed against the baseline of the same seed, then averaged; — never reached; n/a no "
              "baseline among the runs.", "", "## Columns", ""]
    lines += [f"- **{h}** (`{k}`): {d}." for k, (h, _, d) in COLUMNS.items()]
    lines += ["", "## How costs are counted", "", ACCOUNTING, ""]
    bad = [e["arm"] for e in summary["arms"] if e["runs"] and not e["accounting_check"]]
    lines += [("Check: every run's counted training FLOPs equal its stage plan's (`grow schedule`)." if not bad else
               f"Check FAILED: counted training FLOPs differ from the stage plan for {', '.join(bad)}."), ""]
    lines += ["## Wall-clock", "", *_load_note(summary)]
    lines += ["## Runs", ""]
    run_headers = ["arm", "seed", "dir", "final val loss", "tokens", "FLOPs", "growth FLOPs", "train s", "compile s",
                   "wall s", "load avg", "growths", "FLOPs to base loss"]
    run_rows = []
    for e in summary["arms"]:
        for m in e["runs"]:
            reach, load = m["flops_to_baseline_loss"], m.get("load_average")
            run_rows.append([e["arm"], m["seed"], f"`{m['run_dir']}`", f"{m['final_val_loss']:.4f}", _si(m["tokens"]),
                             _si(m["flops"]), _si(m["growth_flops"]), f"{m['train_seconds']:.2f}",
                             f"{m['compile_seconds']:.2f}", f"{m['wall_seconds']:.1f}",
                             " → ".join(f"{float(v):.1f}" for v in load) if load else "—", m["growths"],
                             "—" if reach is None else f"{reach:.3f}"])
    lines += [_md_table(run_headers, run_rows), ""]
    growth_rows = _growth_rows(runs)
    if growth_rows:
        lines += ["## Growths", "",
                  "Each growth ends a stage and enters the next (stages numbered from 1); recovery is the "
                  "validation-loss change since the growth, @ the steps after it at which it was measured.", "",
                  _md_table(["arm", "seed", "stages", "val loss before", "after", "Δ", "recovery", "note"],
                            growth_rows), ""]
    lines += ["## Curves", "",
              "Validation loss (lines with markers; training loss faint) against cumulative FLOPs and against "
              "training wall-clock; a vertical dotted segment and a triangle mark each growth (loss before → after).",
              "", "![loss vs FLOPs](loss_vs_flops.png)", "", "![loss vs time](loss_vs_time.png)", ""]
    return "\n".join(lines)


def plot(runs: list[Run], path: Path, axis: str, summary: dict) -> None:
    """Validation (and faint training) loss of every run against FLOPs or seconds; growths marked."""
    from matplotlib.figure import Figure

    fig = Figure(figsize=(9, 5.5), layout="constrained")
    ax = fig.subplots()
    labels = list(dict.fromkeys(r.label for r in runs if r.complete))
    colors = {lab: f"C{i % 10}" for i, lab in enumerate(labels)}
    xi = 0 if axis == "flops" else 2
    for r in runs:
        if not r.complete:
            continue
        c = colors[r.label]
        first = r is next(x for x in runs if x.label == r.label and x.complete)
        train = [(float(x["train/flops"] if axis == "flops" else x.get("time/seconds", 0.0)), float(x["train/loss"]))
                 for x in r.records if "train/loss" in x]
        if train:
            ax.plot(*zip(*train), color=c, lw=0.7, alpha=0.25)
        pts = curve(r.records)
        if pts:
            ax.plot([p[xi] for p in pts], [p[1] for p in pts], color=c, marker="o", ms=3, lw=1.4,
                    label=r.label if first else None)
        growth = [(pts[i], pts[i + 1]) for i in range(len(pts) - 1) if pts[i][3] == "before"]
        for before, after in growth:
            ax.plot([before[xi], after[xi]], [before[1], after[1]], color=c, ls=":", lw=1.2)
            ax.plot([after[xi]], [after[1]], color=c, marker="^", ms=7, mec="black", mew=0.5)
    for e in summary["arms"]:
        if e["kind"] == "baseline" and e["final_val_loss"]["mean"] is not None:
            ax.axhline(e["final_val_loss"]["mean"], color="gray", ls="--", lw=0.8)
    ax.plot([], [], color="gray", ls="--", lw=0.8, label="baseline final loss")
    ax.plot([], [], color="gray", ls="", marker="^", ms=7, mec="black", mew=0.5, label="growth (loss after)")
    ax.set_xlabel("cumulative training FLOPs (with growth passes)" if axis == "flops"
                  else "training wall-clock, s (compile time apart)")
    ax.set_ylabel("validation loss")
    ax.set_title(summary["title"] + ("\nvalidation loss vs FLOPs" if axis == "flops" else
                                     "\nvalidation loss vs wall-clock" + _load_caption(summary)), fontsize=10)
    ax.grid(alpha=0.3)
    ax.legend(fontsize=8)
    fig.savefig(path, dpi=120)


def _load_caption(summary: dict) -> str:
    values = [float(v) for e in summary["arms"] for m in e["runs"] for v in (m.get("load_average") or [])]
    if not values:
        return " (machine load not recorded)"
    return f" (machine load average {min(values):.1f}–{max(values):.1f})"


def log_wandb(summary: dict, out_dir: Path, logger_cfg: dict) -> None:
    """One W&B run in the sweep's group with the summary table and the two plots (`grow.logging.wandb_mode`:
    WANDB_MODE, or offline without credentials; never W&B's login prompt)."""
    from grow.logging import wandb_mode

    mode, _ = wandb_mode()
    if mode == "disabled":
        return
    from grow.console import console

    try:
        import wandb

        headers, rows = table_rows(summary)
        run = wandb.init(project=logger_cfg.get("project", "grow"), entity=logger_cfg.get("entity"),
                         group=logger_cfg.get("group") or summary["group"], name="compare-report",
                         job_type="compare-report", dir=str(out_dir), config={"sweep_dir": summary["sweep_dir"]},
                         mode=mode)
        try:
            data = {"compare/summary": wandb.Table(columns=headers, data=rows)}
            for name in ("loss_vs_flops", "loss_vs_time"):
                if (out_dir / f"{name}.png").exists():
                    data[f"compare/{name}"] = wandb.Image(str(out_dir / f"{name}.png"))
            run.log(data)
        finally:
            run.finish()
    except Exception as exc:  # noqa: BLE001 - W&B is a copy; the files are the record
        console.print(f"compare: W&B report table not logged: {str(exc).splitlines()[0] if str(exc) else exc}",
                      markup=False)


def default_out_dir(root: Path | str = "outputs/report") -> Path:
    return Path(root) / time.strftime("%Y-%m-%d_%H-%M-%S")


def build_report(paths: list[Path], out_dir: Path, *, title: str | None = None, key: str = "runs",
                 logger_cfg: dict | None = None, show: bool = True) -> dict:
    """Write summary.json, report.md and the two plots of the runs in ``paths`` into ``out_dir``; print
    the table; returns the summary. ``out_dir`` may be a sweep directory, never a run directory (whose
    own summary.json it would overwrite)."""
    out_dir = Path(out_dir)
    if is_run_dir(out_dir):
        raise ConfigError("out" if key == "runs" else key, str(out_dir),
                          "is a run directory: the report would overwrite its summary.json (write the report "
                          "elsewhere: grow report runs=[<dir>] out=<new dir>)")
    runs = collect(list(paths), key)
    summary = summarize(runs, out_dir, title)
    out_dir.mkdir(parents=True, exist_ok=True)
    (out_dir / "summary.json").write_text(json.dumps(summary, indent=2))
    (out_dir / "report.md").write_text(report_markdown(summary, runs))
    plot(runs, out_dir / "loss_vs_flops.png", "flops", summary)
    plot(runs, out_dir / "loss_vs_time.png", "time", summary)
    if show:
        print_table(summary, out_dir)
    if logger_cfg is not None:
        log_wandb(summary, out_dir, logger_cfg)
    return summary
