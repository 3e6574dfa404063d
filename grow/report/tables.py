"""The report's tables: the terminal table, report.md, and the tables docs/results.md renders from summary.json
alone (`results_tables`, scripts/results.py). The numbers come from `grow.report.stats`.
"""

from __future__ import annotations

import math
from pathlib import Path

from grow.console import (
    DIM_LETTERS,
    LEGEND,
    MOE_LEGEND,
    console,
    dim_letters,
    edge_message,
    fmt_delta,
    fmt_num,
    grid_edge_hits,
)
from grow.report.frontier import MIN_POINTS, bound, effective_compute
from grow.report.inference import ALPHA, MARGIN, censored_median
from grow.report.plots import delta_against
from grow.report.regime import bits_per_byte, growth_settings_rows, regime_lines
from grow.report.stats import (
    ACCOUNTING,
    COLUMNS,
    compare_arms,
    min_detectable,
    one_machine,
    seed_blocked_comparisons,
    stat,
)
from grow.runs import FoundRun


def fmt_stat(s: dict, how: str, *, baseline_missing: bool = False) -> str:
    """'3.412 ± 0.012', '41.3% ± 0.2', '0.62 (2/3 reached)', '—'."""
    if "reached" in s and how == "frac":
        return _fmt_reached(s, baseline_missing)
    if s["mean"] is None:
        if how in ("pct", "frac") and baseline_missing:
            return "n/a"
        if s.get("reached") == 0 and s["values"]:
            return f"— (0/{len(s['values'])} reached)"
        return "—"
    mean, std = s["mean"], s["std"]
    if how == "loss":
        text, err = f"{mean:.4f}", (f"{std:.4f}" if std is not None else None)
    elif how == "pct":
        text, err = f"{mean:.1f}%", (f"{std:.1f}" if std is not None else None)
    elif how == "frac":
        text, err = f"{mean:.3f}", (f"{std:.3f}" if std is not None else None)
    elif how == "count":
        text, err = f"{mean:g}", (f"{std:.2g}" if std is not None else None)
    elif how == "sec":
        text, err = f"{mean:.2f}", (f"{std:.2f}" if std is not None else None)
    else:
        text, err = fmt_num(mean), (fmt_num(std) if std is not None else None)
    out = text if err is None else f"{text} ± {err}"
    if "reached" in s and s["reached"] < len(s["values"]):
        out += f" ({s['reached']}/{len(s['values'])} reached)"
    return out


def _fmt_reached(s: dict, baseline_missing: bool) -> str:
    """A censored figure (FLOPs to reach a loss): the median over seeds with the unreached counted as not
    reached, and how many reached it: '0.630 median (3/3 reached)', 'not reached (1/3 reached)'."""
    n = len(s["values"])
    if baseline_missing or not n:  # no baseline in the sweep: no loss to reach, not an unreached one
        return "n/a" if baseline_missing else "—"
    med = censored_median(s["values"])
    head = "not reached" if med is None else f"{med:.3f}" + (" median" if n > 1 else "")
    return f"{head} ({s['reached']}/{n} reached)"


def _steps_note(entry: dict) -> str:
    """' (@5 steps)' or ' (@3–5 steps)': when a recovery was measured."""
    steps = [v for m in entry["runs"] for v in m["recovery_steps_each"] if v is not None]
    if entry["mean_recovery"]["mean"] is None or not steps:
        return ""
    lo, hi = int(min(steps)), int(max(steps))
    return f" (@{lo} steps)" if lo == hi else f" (@{lo}–{hi} steps)"


def _seeds_cell(e: dict) -> str:
    """'0,1,2', or '0 (failed: 1) (unfinished: 2)'."""
    seeds = ",".join(map(str, e["seeds"])) or "-"
    if e["failed"]:
        seeds += f" (failed: {','.join(e['failed'])})"
    if e["incomplete"]:
        seeds += f" (unfinished: {','.join(map(str, e['incomplete']))})"
    return seeds


def table_rows(summary: dict) -> tuple[list[str], list[list[str]]]:
    headers = ["arm", "seeds", *(v[0] for v in COLUMNS.values())]
    rows = []
    for e in summary["arms"]:
        seeds = _seeds_cell(e)
        missing = not e["has_baseline"]
        cells = {k: fmt_stat(e[k], how, baseline_missing=missing) for k, (_, how, _) in COLUMNS.items()}
        cells["mean_recovery"] += _steps_note(e)
        rows.append([e["arm"], seeds, *cells.values()])
    return headers, rows


def _rich_table(title: str, caption: str, headers: list[str], rows: list[list[str]]):
    """A rich table whose first column (the arm) folds instead of ending in "…": on a narrow terminal every
    character of an arm's name stays visible, so arms that differ only in a swept value stay apart."""
    from rich.markup import escape
    from rich.table import Table

    table = Table(title=escape(title), caption=caption)
    for i, h in enumerate(headers):
        table.add_column(h, justify="left" if i < 2 else "right", overflow="fold" if i == 0 else "ellipsis")
    for row in rows:
        table.add_row(*(escape(str(c)) for c in row))
    return table


def print_arms(summary: dict) -> None:
    headers, rows = table_rows(summary)
    console.print(_rich_table(summary["title"], "mean ± std over seeds; % and fractions against the baseline of the "
                              "same seed; FLOPs to reach: median over seeds, unreached counted as not reached; n/a no "
                              "baseline", headers, rows))


def print_table(summary: dict, out_dir: Path) -> None:
    from rich.markup import escape

    print_arms(summary)
    comps = compare_arms(summary["arms"])
    if any(comps["arms"].values()):
        headers, rows = loss_rows(summary, comps)
        console.print(_rich_table("final validation loss: differences from the references",
                                  "Δ = mean difference (arm - reference) ± its standard error [95% CI]; the test "
                                  "(paired where the arms share an initialization, else Welch), t, p, and p adjusted "
                                  "by Holm within its family (*: significant at 5% after the correction); TOST: "
                                  f"equivalence within ±{summary.get('equivalence_margin', MARGIN):g} nats",
                                  headers, rows))
    for g in comps["best_equal_flops"]:
        console.print(escape(f"best fixed size at equal FLOPs: {g['arm']} (mean final loss {g['final_val_loss']:.4f})"))
    console.print(escape(f"report: {Path(out_dir) / 'report.md'}"))


def _md_table(headers: list[str], rows: list[list[str]]) -> str:
    esc = lambda s: str(s).replace("|", "\\|")
    lines = ["| " + " | ".join(map(esc, headers)) + " |", "|" + "---|" * len(headers)]
    lines += ["| " + " | ".join(map(esc, r)) + " |" for r in rows]
    return "\n".join(lines)


def fmt_diff(p: dict | None, digits: int = 4) -> str:
    """A paired difference: '-0.1530 ± 0.0120 [-0.2046, -0.1014]' (mean ± SE [95% CI]), '-0.1530 (n=1)',
    'censored: 1 of 3 seeds not reached', '—' (no pair)."""
    if p and p.get("censored"):
        return f"censored: {p['censored']} of {p['of']} seeds not reached"
    if not p or not p["n"]:
        return "—"
    text = f"{p['mean']:+.{digits}f}"
    if p["se"] is None:
        return f"{text} (n=1)"
    text += f" ± {p['se']:.{digits}f}"
    ci = p.get("ci95")
    return text + (f" [{ci[0]:+.{digits}f}, {ci[1]:+.{digits}f}]" if ci else "")


def _fmt_p(p: float) -> str:
    return "< 0.001" if p < 0.001 else f"{p:.3f}"


TEST_NAMES = {"paired": "paired", "welch": "Welch", "seed-blocked": "seed-blocked"}


def fmt_t(p: dict | None) -> str:
    """The test of a difference, its t with its two-sided p and the p adjusted by Holm within its family:
    'Welch -12.8 · p 0.006 · Holm(headline) 0.041*' (*: significant at 5% after the correction); 'n=1';
    '—' (no pair, SE = 0, or censored)."""
    if not p or not p["n"]:
        return "—"
    if p["n"] == 1 or p.get("n_ref") == 1:
        return "n=1"
    if p["t"] is None:
        return "—"
    name = TEST_NAMES.get(p.get("test"), "paired")
    text = f"{name} {p['t']:+.1f} · p {_fmt_p(p['p'])}" if p.get("p") is not None else f"{name} {p['t']:+.1f}"
    if p.get("p_holm") is not None:
        fam = f"({p['family']})" if p.get("family") else ""
        text += f" · Holm{fam} {_fmt_p(p['p_holm'])}" + ("*" if p["p_holm"] <= ALPHA else "")  # Holm rejects at p_holm <= alpha
    return text


def fmt_tost(p: dict | None) -> str:
    """The equivalence test of a difference: 'p 0.012 (equivalent within ±0.02)', 'p 0.31', '—'."""
    if not p or p.get("tost_p") is None:
        return "—"
    return f"p {_fmt_p(p['tost_p'])}" + (f" (equivalent within ±{p['margin']:g})" if p["tost_p"] < ALPHA else "")


def _runs_stat(e: dict, key: str, reached: str | None = None) -> dict:
    """`stat` of one per-run figure of an arm, recomputed from summary.json's per-run values."""
    st = stat([m.get(key) for m in e["runs"]])
    if reached:
        st["reached"] = sum(bool(m.get(reached)) for m in e["runs"])
    return st


def _scale_line(summary: dict) -> list[str]:
    sc = summary.get("scale") or {}
    if not sc.get("params"):
        return []
    fc = sc.get("final_config") or {}
    dims = f" ({_final_dims(fc)})" if fc else ""
    seeds = sc.get("seeds") or []
    what = ("Final model" if (sc.get("final_sizes") or 1) <= 1 else
            f"Final models of {sc['final_sizes']} sizes (the {sc.get('reference') or 'first'} run's)")
    return [f"{what}: {fmt_num(sc['params'])} parameters{dims}; {fmt_num(sc['tokens'])} training tokens "
            f"({sc['tokens_per_param']:.2f} tokens per parameter, embeddings included); corpus "
            f"{', '.join(sc.get('corpus') or ['?'])}; seeds {','.join(map(str, seeds))}; device "
            f"{', '.join(sc.get('devices') or ['?'])}, precision {', '.join(sc.get('precision') or ['?'])}.",
            *_plan_lines(summary), *_compute_optimal(summary), *_data_line(sc.get("data")), ""]


def _plan_lines(summary: dict) -> list[str]:
    """The steps between growths of each stage plan of the grown arms."""
    out = []
    for plan in summary.get("schedules") or []:
        steps = [st["steps"] for st in plan["stages"]]
        if len(steps) < 2:
            continue
        at = [sum(steps[:i]) for i in range(1, len(steps))]
        sizes = " → ".join(fmt_num(st["params"]) for st in plan["stages"] if st.get("params"))
        out += ["", f"Stage plan of {', '.join(plan['arms'])}: {len(steps)} stages of {', '.join(map(str, steps))} "
                    f"optimizer steps, growing after steps {', '.join(map(str, at))} of {sum(steps)}"
                    + (f" ({sizes} parameters)" if sizes else "")
                    + (f"; where {', '.join(plan['triggered'])} grew is in report.md (a growth trigger decided)"
                       if plan.get("triggered") else "") + "."]
    return out


def _data_line(data: dict | None) -> list[str]:
    """The training split's size and the bigram floor on the validation batches (runs from before they were
    recorded: nothing)."""
    if not data:
        return []
    return ["", f"Data: a training split of {fmt_num(data['train_tokens'])} tokens (each arm's epochs over it are in the "
                f"Cost table), validation {fmt_num(data['val_tokens'])}; a count-based bigram model of the training "
                f"split scores {data['bigram_val_loss']:.4f} nats on the validation batches (interpolated with the "
                f"unigram, λ = {data['bigram_lambda']:g} picked on those batches: grow.data.floor), the floor a model "
                "that learned anything beyond adjacent-token counts ends below.", *_val_set_line(data.get("corpus"))]


def _val_set_line(corpus: dict | None) -> list[str]:
    """data=pysrc: the validation set's composition from the manifest's summary (caches from before it recorded
    the largest share: nothing)."""
    if not corpus or not corpus.get("val_largest_package"):
        return []
    (pkg, share), dropped, val = corpus["val_largest_package"], corpus.get("dropped") or {}, corpus["val"]
    left_out = dropped.get("packages_left_out") or []
    return ["", f"Validation set: {len(val['packages'])} held-out packages, {val['files']} files, {fmt_num(val['bytes'])} "
                f"bytes; the largest, `{pkg}`, is {100 * share:.1f}% of its bytes; {dropped.get('files', 0)} files "
                f"({fmt_num(dropped.get('bytes', 0))} bytes) dropped, {dropped.get('near_duplicates', 0)} of them "
                "near-duplicates (data.val_near_dup, data.val_max_share: docs/data.md)"
                + (f", leaving out {', '.join(f'`{p}`' for p in left_out)}" if left_out else "") + "."]


def compute_optimal_params(flops: float) -> float:
    """The compute-optimal parameter count for a training budget of ``flops``: Hoffmann et al.'s rule of
    thumb D ≈ 20 N with C ≈ 6 N D ("Training Compute-Optimal Large Language Models", NeurIPS 2022), so
    N_opt ≈ √(C / 120)."""
    return (flops / 120.0) ** 0.5


def _compute_optimal(summary: dict) -> list[str]:
    """What size the budgets call for: the compute-optimal N of the baseline's FLOPs and of the grown arms'."""
    budgets = []
    for kind, what in (("baseline", "the baseline's"), ("grown", "the grown arms'")):
        flops = [m["flops"] for e in summary["arms"] if e["kind"] == kind for m in e["runs"]]
        if flops:
            c = sum(flops) / len(flops)
            budgets.append(f"{fmt_num(compute_optimal_params(c))} parameters for {what} {fmt_num(c)} FLOPs")
    if not budgets:
        return []
    return ["", "Compute-optimal size (Hoffmann et al., \"Training Compute-Optimal Large Language Models\", NeurIPS "
                "2022: D ≈ 20 N, C ≈ 6 N D, so N ≈ √(C/120)): " + "; ".join(budgets) + "."]


def loss_rows(summary: dict, comps: dict | None = None) -> tuple[list[str], list[list[str]]]:
    """The final-loss table: per arm, mean ± std and the paired differences from the baseline, the
    baseline in its own parameterization and the best fixed size at equal FLOPs, each with its t."""
    comps = comps or compare_arms(summary["arms"])
    best = {g["arm"] for g in comps["best_equal_flops"]}
    rows = []
    for e in summary["arms"]:
        c = comps["arms"][e["arm"]]
        cells = [e["arm"], _seeds_cell(e), fmt_stat(_runs_stat(e, "final_val_loss"), "loss")]
        for ref, is_ref in (("baseline", e["kind"] == "baseline"), ("matched", e["kind"] == "matched"),
                            ("best_equal_flops", e["arm"] in best)):
            p = (c.get(ref) or {}).get("final_val_loss")
            cells += ["reference", ""] if is_ref and e["runs"] else [fmt_diff(p), fmt_t(p)]
        cells.append(fmt_tost((c.get("best_equal_flops") or {}).get("final_val_loss")))
        rows.append(cells)
    return ["arm", "seeds", "final val loss", "Δ vs baseline", "test, t", "Δ vs baseline in own parameterization",
            "test, t", "Δ vs best fixed size at equal FLOPs", "test, t", "equivalence (TOST) vs best fixed size"], rows


def _statistics_lines(summary: dict, comps: dict, margin: float) -> list[str]:
    """What the seeds can tell, before the tables: the minimum detectable effect, the test families, the margin."""
    mde = min_detectable(summary["arms"])
    tests = comps.get("tests") or {}
    fam = (f"{tests.get('headline', 0)} test(s) in the headline family (each operator at its tuned setting, the "
           f"lowest-loss arm of its strategy, against the best fixed size at equal FLOPs) and {tests.get('other', 0)} "
           "in the other (every other difference on this page), Holm's correction within each")
    what = (f"Minimum detectable effect: with n = {mde['n']} seeds per arm and a pooled seed-to-seed SD of "
            f"{mde['sd']:.4f} nats, two arms differing by {mde['nats']:.3f} nats are told apart with probability "
            f"0.8 at the two-sided 5% level (a two-sample t-test); smaller true differences are likely to go "
            "unseen, and a difference not significant is not a difference shown to be small. "
            if mde and mde["nats"] is not None else "Minimum detectable effect: one seed per arm, none. ")
    return [f"**What the seeds can tell.** {what}Test families: {fam}. Equivalence margin: ±{margin:g} nats.", ""]


def _fmt_mult(x: dict | None, beyond: tuple[str, float] | None = None) -> str:
    """The multiplier with its interval; beyond the frontier, the bound `frontier.bound` gives (or none)."""
    if not x or x.get("multiplier") is None:  # the bootstrap's interval is open there: the bound says more
        return f"{beyond[0]} {beyond[1]:.2f}" if beyond else "off the frontier"
    ci, off = x.get("ci95"), x.get("off") or []
    if off:  # a seed off its own frontier: a bound there, so no interval over the seeds
        return f"{x['multiplier']:.2f} (no interval: seed{'s' if len(off) > 1 else ''} {', '.join(map(str, off))} off its frontier)"
    return f"{x['multiplier']:.2f}" + (f" [{_fmt_end(ci[0])}, {_fmt_end(ci[1])}]" if ci else "")


def _fmt_end(x: float) -> str:
    return "∞" if math.isinf(x) else f"{x:.2f}"


def _device(machine: str) -> str:
    """The device of a `grow.provenance.describe_machine` line: the GPU where there is one, else the CPU's model."""
    if machine == "not recorded":
        return "a machine not recorded"
    return machine.split(" on ")[0] if " on " in machine else "CPU " + machine.split(" (")[0]


def _devices(machines: list[str]) -> str:
    return " and ".join(dict.fromkeys(_device(m) for m in machines))


def _mixed_devices(point_arms: list[dict]) -> str:
    devices = {_device(m) for a in point_arms for m in a["machines"]}
    return ("" if len(devices) <= 1 else
            f" The frontier's points come from {len(devices)} devices: a multiplier read off it holds only as far "
            "as the devices give the same losses (float results differ in their last bits between them).")


def _headline_lines(summary: dict, comps: dict) -> list[str]:
    """The effective-compute multiplier of every arm (the headline column), and the headline arms pooled."""
    heads = comps.get("headline")
    ec = effective_compute(summary["arms"], heads["arms"] if heads else None, one_machine(summary))
    n = len(ec["points"])
    data = (summary.get("scale") or {}).get("data") or {}

    rows = []
    for e in summary["arms"]:
        if not e["runs"]:
            continue
        loss = _runs_stat(e, "final_val_loss")
        bpb = bits_per_byte(loss["mean"], data.get("val_bytes_per_token"))
        full, flops = _runs_stat(e, "full_val_loss"), _runs_stat(e, "flops")["mean"]
        rows.append([e["arm"], fmt_num(flops), fmt_stat(loss, "loss"),
                     fmt_stat(full, "loss") if full["n"] else "—", "—" if bpb is None else f"{bpb:.4f}",
                     _fmt_mult(ec["arms"].get(e["arm"]), bound(ec["points"], loss["mean"], flops))
                     if n >= MIN_POINTS else f"frontier has {n} point{'' if n == 1 else 's'}"])
    lines = ["**Effective compute** (the headline column): the FLOPs a fixed-size model from scratch needs to reach "
             "the arm's mean final loss, read off the sweep's fixed-size frontier (the lowest mean final loss of the "
             "baseline and equal-FLOPs arms against their FLOPs, linear in log FLOPs between its points), over the "
             "arm's FLOPs, with its 95% interval (docs/statistics.md): below 8 seeds a t-interval over seeds of the "
             "log-multiplier of each seed's run against that seed's own frontier (then the multiplier is their geometric "
             "mean), from 8 seeds a percentile bootstrap over seeds. Below 1: the "
             "arm's compute buys less than a fixed size's. \"> x\": the arm ends below every fixed size, the largest "
             "budget's included, so its multiplier is at least x (that budget over the arm's FLOPs); \"< x\" likewise "
             "above the smallest. Shown only for a frontier of at least "
             f"{MIN_POINTS} points; this one has {n}, {ec['shape']}"
             + (" (" + ", ".join(f"{fmt_num(c)} FLOPs → {l:.4f}: `{a['arm']}` on {_devices(a['machines'])}"
                                 for (c, l), a in zip(ec["points"], ec["point_arms"])) + ")" if n else "")
             + "." + _mixed_devices(ec["point_arms"]), "",
             "Final val loss: the mean over trainer.eval_batches fixed sampled windows of the held-out split (every "
             "comparison on this page uses it); full split: over every window of it, at the end of each run "
             "(trainer.full_val; — for runs from before it), its forward FLOPs counted apart as evaluation FLOPs.", "",
             _md_table(["arm", "FLOPs", "final val loss", "full-split val loss", "bits per byte",
                        "effective-compute multiplier"], rows), ""]
    if heads:
        p = heads["final_val_loss"]
        pooled = ec.get("pooled") if n >= MIN_POINTS else None
        lines += [f"**Headline, pooled**: the runs of {', '.join(f'`{a}`' for a in heads['arms'])} together against "
                  f"`{heads['reference']}` (Welch): Δ {fmt_diff(p)}, {fmt_t(p)}; equivalence within "
                  f"±{p['margin']:g}: {fmt_tost(p)}"
                  + (f"; effective-compute multiplier {_fmt_mult(pooled)}" if pooled else "") + ".", ""]
    return lines


def _blocked_lines(arms: list[dict], comps: dict, margin: float) -> list[str]:
    """The seed-blocked differences (`grow.report.stats.seed_blocked_comparisons`) of the grown arms from their
    best fixed size at equal FLOPs and their baseline; nothing when the sweep has fewer than 2 shared seeds."""
    b = seed_blocked_comparisons(arms, comps["best_equal_flops"], margin)
    if not b or not b["comparisons"]:
        return []
    names = {"best_equal_flops": "best fixed size at equal FLOPs", "baseline": "baseline"}
    rows = [[f"`{a}`", f"{names[kind]}: `{c['arm']}`", fmt_diff(c["final_val_loss"]), fmt_t(c["final_val_loss"]),
             fmt_tost(c["final_val_loss"])] for a, cs in b["comparisons"].items() for kind, c in cs.items()]
    return [f"**Seed-blocked differences** (the seeds share the batch order, so each seed is a block): final loss = "
            f"arm + seed + error over seeds {', '.join(map(str, b['seeds']))}, fitted on the {len(b['arms'])} compared "
            f"arms (the grown arms and their references); residual SD {b['sd']:.4f} nats ({b['dof']} dof); each grown arm against its best fixed "
            f"size at equal FLOPs (where the sweep has one) and its baseline, SE = SD·√(2/{len(b['seeds'])}), TOST at "
            f"±{margin:g} (docs/statistics.md). Not Holm-corrected: read it beside the tables below, not instead.", "",
            _md_table(["arm", "reference", "Δ final loss ± SE [95% CI]", "test", f"equivalence (±{margin:g}, TOST)"],
                      rows), ""]


def results_tables(summary: dict, images: str | None = None) -> list[str]:
    """The tables of results as markdown lines, from ``summary.json`` alone (the per-run figures of its
    arms; the statistics recomputed with `stat` and `compare_arms`): final validation loss with the
    paired differences from the baseline, the baseline in the arm's own parameterization and the best
    fixed size at equal FLOPs; FLOPs and wall-clock as % of the baseline; FLOPs to reach the baseline's
    final loss; the largest |Δloss| at a growth. ``images``: a directory to link the two plots from."""
    arms = [e for e in summary["arms"] if e["runs"]]
    comps = compare_arms(summary["arms"], summary.get("equivalence_margin", MARGIN))
    cmp = lambda e, ref: comps["arms"][e["arm"]].get(ref) or {}
    margin = summary.get("equivalence_margin", MARGIN)
    lines = [*_scale_line(summary), *regime_lines(summary), *_statistics_lines(summary, comps, margin),
             *_headline_lines(summary, comps), *_blocked_lines(summary["arms"], comps, margin)]
    settings = growth_settings_rows(summary)
    if settings:
        lines += ["**Growth settings** of every grown arm: its strategy, the parameterization its new weights are "
                  "drawn in, the settings swept, its sizes and the optimizer step (and % of the tokens) of each "
                  "growth.", "",
                  _md_table(["arm", "strategy", "parameterization", "settings", "parameters", "grows after step"],
                            settings), ""]

    headers, rows = loss_rows(summary, comps)
    lines += ["**Final validation loss** (nats per token). Mean ± sample std (n − 1) over seeds. Each Δ is the "
              "difference from a reference, mean ± SE [95% confidence interval], with the test that gave it: "
              "*paired* (d_s = arm_s − reference_s, Student's t with n − 1 degrees of freedom) only where the two "
              "arms start from the same model at each seed (fixed-size arms of one shape and initializer), "
              "*Welch* (unpaired, Welch–Satterthwaite degrees of freedom) everywhere else: a grown arm's start "
              "model is drawn at its own shape, so it shares only the batch order with any reference. Each p is "
              "adjusted by Holm's step-down correction within its family (headline or other); * marks a "
              "difference significant at 5% after it. Equivalence: two one-sided tests (TOST) that |Δ| < "
              f"{margin:g} nats; p < 0.05 says equivalent within the margin. n=1: one seed, no SE. Negative: lower "
              "loss than the reference.", "",
              _md_table(headers, rows), ""]
    own = {}
    for e in arms:
        ref = cmp(e, "matched").get("arm")
        if ref and e["kind"] == "grown":
            own.setdefault(ref, []).append(e["arm"])
    for ref, names in own.items():
        lines += [f"Baseline in own parameterization: {', '.join(names)} against `{ref}` (the final model from "
                  "scratch on the same tokens, initialized by the strategy's parameterization).", ""]
    if any(e["kind"] == "grown" for e in arms) and not own:
        lines += ["Baseline in own parameterization: none of these strategies has one (they keep the model's own "
                  "initializer, so `baseline` is theirs).", ""]
    for g in comps["best_equal_flops"]:
        cands = ", ".join(f"`{c['arm']}` {c['final_val_loss']:.4f}" for c in g["candidates"])
        lines += [f"Best fixed size at equal FLOPs: **`{g['arm']}`**, mean final loss {g['final_val_loss']:.4f} over "
                  f"{g['n']} seed(s), the lowest of the fixed sizes trained on the grown arms' plan FLOPs ({cands}); "
                  "it is picked on the same seeds it is compared on, which favours it slightly.", ""]

    rows = []
    for e in arms:
        loads = [float(v) for m in e["runs"] for v in (m.get("load_average") or [])]
        rows.append([e["arm"], fmt_stat(_runs_stat(e, "flops"), "si"),
                     fmt_stat(_runs_stat(e, "flops_pct_baseline"), "pct", baseline_missing=not e["has_baseline"]),
                     fmt_stat(_runs_stat(e, "train_seconds"), "sec"),
                     fmt_stat(_runs_stat(e, "time_pct_baseline"), "pct", baseline_missing=not e["has_baseline"]),
                     f"{min(loads):.1f}–{max(loads):.1f}" if loads else "—",
                     fmt_stat(_runs_stat(e, "epochs"), "frac")])
    loads = [float(v) for e in arms for m in e["runs"] for v in (m.get("load_average") or [])]
    lines += ["**Cost.** Training FLOPs (every stage, plus the growth strategies' own passes) and training wall-clock "
              "(steps and growths, compile time apart) as % of the baseline of the same seed, mean ± std. FLOPs are "
              "counted and do not depend on the machine; wall-clock does: "
              + (f"the 1-minute load average was {min(loads):.1f}–{max(loads):.1f} while these runs ran (per arm, at "
                 "each run's start and end, in its column), and other processes on a loaded machine take time "
                 "from a run." if loads else "the machine's load was not recorded for these runs.")
              + " Epochs: the run's training tokens over the training split's size (— where the runs did not record "
                "it).", "",
              _md_table(["arm", "FLOPs", "FLOPs % baseline", "train s", "wall-clock % baseline", "load average",
                         "epochs"], rows),
              ""]

    rows = []
    for e in arms:
        b, m = cmp(e, "baseline"), cmp(e, "matched")
        own_reach = (fmt_stat(_runs_stat(e, "flops_to_matched_loss", "reached_matched_loss"), "frac")
                     if e["kind"] == "grown" and m else "—")
        rows.append([e["arm"], fmt_stat(_runs_stat(e, "flops_to_baseline_loss", "reached_baseline_loss"), "frac",
                                        baseline_missing=not e["has_baseline"]),
                     fmt_diff(b.get("flops_to_reach"), 3), fmt_t(b.get("flops_to_reach")),
                     own_reach,
                     fmt_diff(m.get("flops_to_reach"), 3), fmt_t(m.get("flops_to_reach"))])
    lines += ["**FLOPs to reach the baseline's final loss**, as a fraction of the baseline's FLOPs (same seed): the "
              "first point of the arm's validation curve (evaluations, and the loss before and after each growth, "
              "against cumulative FLOPs) at or below the baseline's final validation loss, interpolated linearly "
              "from the point before; its resolution is that of the evaluations. A seed that never reached it is "
              "censored, not missing: the figure is the median over seeds with the unreached counted as not "
              "reached (\"not reached\" when they are half or more), with how many reached it. Δ: against the "
              "reference's own value by the test named (paired where the arms share an initialization, else Welch) (the reference reaching its own final loss, 1.000 unless its curve "
              "dipped below it earlier), given only when every seed reached it on both sides (otherwise "
              "\"censored\", with the count). The last three columns do the same against the baseline in the arm's "
              "own parameterization.", "",
              _md_table(["arm", "FLOPs to baseline's loss", "Δ vs baseline", "test, t", "FLOPs to own-parameterization "
                         "baseline's loss", "Δ", "test, t"], rows), ""]

    rows = []
    for e in arms:
        if e["kind"] != "grown":
            continue
        rows.append([e["arm"], fmt_stat(_runs_stat(e, "growths"), "count"),
                     fmt_stat(_runs_stat(e, "max_abs_growth_delta"), "loss"),
                     fmt_stat(_runs_stat(e, "mean_recovery"), "loss") + _steps_note(e),
                     fmt_stat(_runs_stat(e, "recovery_vs_baseline"), "loss")])
    if rows:
        lines += ["**Growths.** The largest |validation loss after − before| over a run's growths (0: the growth "
                  "kept the function), and the mean change of the validation loss since each growth, measured the "
                  "given number of steps after it (negative: recovering), mean ± std over seeds. Against a run that "
                  "did not grow: the change of the training loss over the same steps minus the baseline's (same "
                  "seed, so the same batches at the same steps), mean over growths (negative: the grown run fell "
                  "faster than ordinary training does there; — no baseline, or not recorded in this sweep).", "",
                  _md_table(["arm", "growths", "largest |Δloss| at a growth", "mean recovery",
                             "recovery − baseline's over the same steps"], rows), ""]
    if images is not None:
        lines += [f"![validation loss vs FLOPs]({images}/loss_vs_flops.png)", "",
                  f"![validation loss vs wall-clock]({images}/loss_vs_time.png)", ""]
    return lines


def _dims(c: dict, prev: dict | None, letters: dict[str, str]) -> list[str]:

    return [f"**{c.get(f, 1)}**" if prev is not None and prev.get(f, 1) != c.get(f, 1) else str(c.get(f, 1))
            for f in letters]


def _schedule_md(summary: dict) -> list[str]:

    lines, moe = [], False
    for plan in summary["schedules"]:
        total = sum(s["flops"] for s in plan["stages"]) or 1
        letters = dim_letters([s["config"] for s in plan["stages"]])
        moe = moe or letters is not DIM_LETTERS
        rows, prev = [], None
        for s in plan["stages"]:
            active = [fmt_num(s.get("active_params") or s["params"]) if s["params"] else "—"] if letters is not DIM_LETTERS else []
            rows.append([s["stage"], *_dims(s["config"], prev, letters), fmt_num(s["params"]) if s["params"] else "—",
                         *active,
                         s["batch_size"], s["steps"], fmt_num(s["tokens"]), fmt_num(s["flops"]),
                         f"{100.0 * s['flops'] / total:.1f}%"])
            prev = s["config"]
        triggered = plan.get("triggered") or []
        note = (f"; under a growth trigger ({', '.join(triggered)}) the stage sizes are these, their steps end where "
                "the trigger fired: the Growths table says where") if triggered else ""
        lines += [f"Stage plan of {', '.join(plan['arms'])} (bold: grown at the start of the stage{note}):", "",
                  _md_table(["stage", *letters.values(), "params", *(["active"] if letters is not DIM_LETTERS else []), "batch", "steps", "tokens", "FLOPs",
                             "% FLOPs"], rows), ""]
    if lines:
        lines += [f"{LEGEND}{MOE_LEGEND if moe else ''}.", ""]
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


def _growth_rows(runs: list[FoundRun]) -> list[list]:
    """One row per growth of every complete run: the stages it joins (numbered from 1), the validation
    loss before and after, Δ, the recovery and its steps, and a note when a figure hit its grid's edge."""
    labels = list(dict.fromkeys(r.label for r in runs))
    rows = []
    for r in sorted((r for r in runs if r.complete), key=lambda r: (labels.index(r.label), r.seed)):
        for i, ev in enumerate(r.summary.get("growth_events") or [], start=1):
            rec, steps = ev.get("growth/recovery"), ev.get("growth/recovery_steps")
            rows.append([r.label, r.seed, f"{i} → {i + 1}", ev.get("train/step", "—"),
                         fmt_num(ev["train/tokens"]) if "train/tokens" in ev else "—", f"{ev['growth/loss_before']:.4f}",
                         f"{ev['growth/loss_after']:.4f}", fmt_delta(float(ev["growth/delta"])),
                         "—" if rec is None else fmt_delta(float(rec)) + (f" @{int(steps)}" if steps else ""),
                         "; ".join(edge_message(h) for h in grid_edge_hits(ev))])
    return rows


def _final_dims(fc: dict) -> str:
    letters = " ".join(f"{letter}={fc[field]}" for field, letter in dim_letters([fc]).items())
    return f"{letters} s={fc['seq_len']} V={fc['vocab_size']}"


def summary_sections(summary: dict) -> list[str]:
    """The part of report.md that summary.json alone determines: the arms' table, the comparisons with the
    references and the columns' meanings (from the per-arm table up to "How costs are counted";
    scripts/results.py refresh rewrites it in a published report after a change of the statistics)."""
    headers, rows = table_rows(summary)
    lines = [_md_table(headers, rows), "",
             "Mean ± sample standard deviation (n − 1) over seeds. \"% base\" is taken per seed against the "
             "baseline of the same seed, then averaged; \"FLOPs to base loss\" per seed against the baseline of "
             "the same seed, then the median over seeds with a seed that never reached it counted as not reached; "
             "n/a no baseline among the runs.", "", "## Compared with the references", "", *results_tables(summary),
             "## Columns", ""]
    lines += [f"- **{h}** (`{k}`): {d}." for k, (h, _, d) in COLUMNS.items()]
    return lines + [""]


def code_lines(code: list[str], machines: list[str] | None = None) -> list[str]:
    """Which code and machines trained the runs (summary.json's ``code`` and ``machine``); more than one
    of either is said plainly."""
    return (_provenance_lines(code, "Code", "Code", " versions", "runs of one seed by two versions may differ in "
                              "their last bits and so in their trajectories.")
            + _provenance_lines(machines or [], "Machine", "Machines", "", "float results differ in their last bits "
                                "between CPUs, and wall-clock between machines."))


def _provenance_lines(items: list[str], one: str, many: str, unit: str, why: str) -> list[str]:
    """``<one>: <item>.`` for one item; ``<many>: the runs come from <n><unit> (<items>): <why>`` for several."""
    if len(items) == 1:
        return [f"{one}: {items[0]}.", ""]
    if items:
        return [f"{many}: the runs come from {len(items)}{unit} ({'; '.join(items)}): {why}", ""]
    return []


def report_markdown(summary: dict, runs: list[FoundRun], extra_plots: tuple[str, ...] = ()) -> str:
    """The report; ``extra_plots``: which of the plots the runs allow were written (only those are linked)."""
    lines = [f"# {summary['title']}", ""]
    finals = list(dict.fromkeys(_final_dims(r.summary["final_config"]) for r in runs if r.complete))
    if finals:  # one final model, or each of the runs' different ones
        label = "Final model" if len(finals) == 1 else f"Final models ({len(finals)} sizes)"
        lines += [f"{label}: {'; '.join(finals)}. Runs from: {', '.join(f'`{s}`' for s in summary['sources'])}.", ""]
    if summary.get("published"):
        lines += ["Arms from published reports (their per-run values; their runs are not here, so they have no "
                  "curves or growth rows): " + "; ".join(f"`{p['path']}` ({p['title']}, {p['runs']} runs)"
                                                          for p in summary["published"]) + ".", ""]
    if summary["commands"]:
        lines += ["Made by:", "", "```bash", *summary["commands"], "```", ""]
    lines += code_lines(summary.get("code") or [], summary.get("machines"))
    lines += _schedule_md(summary)
    lines += summary_sections(summary)
    lines += ["## How costs are counted", "", ACCOUNTING, ""]
    bad = [e["arm"] for e in summary["arms"] if e["runs"] and not e["accounting_check"]]
    lines += [("Check: every run's counted training FLOPs equal its stage plan's (`grow schedule`; under a growth "
               "trigger, each stage model's FLOPs per token times the tokens the stage trained)." if not bad else
               f"Check FAILED: counted training FLOPs differ from the stage plan for {', '.join(bad)}."), ""]
    lines += ["## Wall-clock", "", *_load_note(summary)]
    lines += ["## Runs", ""]
    run_headers = ["arm", "seed", "dir", "final val loss", "full-split val loss", "tokens", "FLOPs", "growth FLOPs",
                   "train s", "compile s", "wall s", "load avg", "growths", "FLOPs to base loss"]
    run_rows = []
    for e in summary["arms"]:
        for m in e["runs"]:
            reach, load = m["flops_to_baseline_loss"], m.get("load_average")
            full = m.get("full_val_loss")
            run_rows.append([e["arm"], m["seed"], f"`{m['run_dir']}`", f"{m['final_val_loss']:.4f}",
                             "—" if full is None else f"{full:.4f}", fmt_num(m["tokens"]),
                             fmt_num(m["flops"]), fmt_num(m["growth_flops"]), f"{m['train_seconds']:.2f}",
                             f"{m['compile_seconds']:.2f}", f"{m['wall_seconds']:.1f}",
                             " → ".join(f"{float(v):.1f}" for v in load) if load else "—", m["growths"],
                             "—" if reach is None else f"{reach:.3f}"])
    lines += [_md_table(run_headers, run_rows), ""]
    growth_rows = _growth_rows(runs)
    if growth_rows:
        lines += ["## Growths", "",
                  "Each growth ends a stage and enters the next (stages numbered from 1), after the step and the "
                  "training tokens given: where it happened (the plan's boundary, or where the run's growth trigger "
                  "fired); recovery is the validation-loss change since the growth, @ the steps after it at which "
                  "it was measured.", "",
                  _md_table(["arm", "seed", "stages", "at step", "at tokens", "val loss before", "after", "Δ",
                             "recovery", "note"],
                            growth_rows), ""]
    lines += ["## Curves", "",
              "Validation loss (lines with markers; training loss faint) against cumulative FLOPs and against "
              "training wall-clock; a vertical dotted segment and a triangle mark each growth (loss before → after).",
              "", "![loss vs FLOPs](loss_vs_flops.png)", "", "![loss vs time](loss_vs_time.png)", ""]
    if "delta_vs_flops.png" in extra_plots:
        lines += [f"Δ against {delta_against(summary)} over log FLOPs, mean over seeds (band: their range; right: the "
                  "last 30% of the FLOPs). Below 0, an arm is below what a fixed size reaches on those FLOPs.", "",
                  "![Δ vs the fixed sizes](delta_vs_flops.png)", ""]
    if "flops_to_target.png" in extra_plots:
        lines += ["The FLOPs each arm needs to reach a target loss (median over seeds).", "",
                  "![FLOPs to a target loss](flops_to_target.png)", ""]
    return "\n".join(lines)
