"""The report's plots: validation loss against cumulative FLOPs and against training time, one line per run;
Δ against the best fixed size (or the fixed-size frontier) over log FLOPs with seed bands and a zoomed end; FLOPs to reach a target loss.
"""

from __future__ import annotations

import textwrap
from pathlib import Path

import numpy as np

from grow.report.frontier import MIN_POINTS
from grow.report.inference import censored_median
from grow.report.stats import curve, flops_to_reach
from grow.runs import FoundRun


def plot(runs: list[FoundRun], path: Path, axis: str, summary: dict) -> None:
    """Validation (and faint training) loss of every run against FLOPs or seconds; growths marked."""
    from matplotlib.figure import Figure

    fig = Figure(figsize=(11, 5.5), layout="constrained")
    ax = fig.subplots()
    colors = _colors(list(dict.fromkeys(r.label for r in runs if r.complete)))
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
        growth = [(pts[i], pts[i + 1]) for i in range(len(pts) - 1) if pts[i][3] == "before"]
        if pts:  # fixed-size runs (baselines, equal-FLOPs sizes) dashed, grown runs solid
            ax.plot([p[xi] for p in pts], [p[1] for p in pts], color=c, marker="o", ms=3, lw=1.4,
                    ls="-" if growth else "--", label=r.label if first else None)
        for before, after in growth:
            ax.plot([before[xi], after[xi]], [before[1], after[1]], color=c, ls=":", lw=1.2)
            ax.plot([after[xi]], [after[1]], color=c, marker="^", ms=7, mec="black", mew=0.5)
    baselines = [e["final_val_loss"]["mean"] for e in summary["arms"]
                 if e["kind"] == "baseline" and e["final_val_loss"]["mean"] is not None]
    for loss in baselines:
        ax.axhline(loss, color="gray", ls="--", lw=0.8)
    if baselines:  # no legend entry for a line that is not drawn
        ax.plot([], [], color="gray", ls="--", lw=0.8, label="baseline final loss")
    ax.plot([], [], color="gray", ls="", marker="^", ms=7, mec="black", mew=0.5, label="growth (loss after)")
    ax.set_xlabel("cumulative training FLOPs (with growth passes)" if axis == "flops"
                  else "training wall-clock, s (compile time apart)")
    ax.set_ylabel("validation loss")
    ax.set_title(textwrap.fill(summary["title"], 110) + ("\nvalidation loss vs FLOPs" if axis == "flops" else
                 "\nvalidation loss vs wall-clock" + _load_caption(summary)), fontsize=9)
    ax.grid(alpha=0.3)
    ax.legend(fontsize=8, loc="upper left", bbox_to_anchor=(1.01, 1.0))
    fig.savefig(path, dpi=120)


def _colors(labels: list[str]) -> dict[str, tuple]:
    """One colour per label: tab10's, or tab20's for more than ten."""
    import matplotlib

    palette = matplotlib.colormaps["tab10" if len(labels) <= 10 else "tab20"].colors
    return {lab: palette[i % len(palette)] for i, lab in enumerate(labels)}


def _load_caption(summary: dict) -> str:
    values = [float(v) for e in summary["arms"] for m in e["runs"] for v in (m.get("load_average") or [])]
    if not values:
        return " (machine load not recorded)"
    return f" (machine load average {min(values):.1f}–{max(values):.1f})"


def _mean_curve(runs: list[FoundRun]) -> tuple[np.ndarray, np.ndarray] | None:
    """The seeds' mean validation loss on the log-FLOPs points of the first seed (each seed interpolated)."""
    curves = [[(p[0], p[1]) for p in curve(r.records) if p[0] > 0] for r in runs]
    curves = [c for c in curves if len(c) > 1]
    if not curves:
        return None
    x = np.log([f for f, _ in curves[0]])
    ys = [np.interp(x, np.log([f for f, _ in c]), [l for _, l in c]) for c in curves]
    return x, np.mean(ys, axis=0)


def delta_reference(summary: dict) -> str | None:
    """What the Δ plot subtracts: the best fixed size at equal FLOPs ("best"), else the fixed-size frontier of
    the effective-compute multiplier ("frontier", a sweep of fixed sizes at their own budgets), else nothing."""
    if summary.get("best_equal_flops"):
        return "best"
    return "frontier" if len((summary.get("effective_compute") or {}).get("points") or ()) >= MIN_POINTS else None


def delta_against(summary: dict) -> str:
    """What the Δ plot subtracts, in words (its title's and the report's)."""
    return ("the best fixed size at equal FLOPs" if delta_reference(summary) == "best" else
            "the fixed-size frontier (each fixed size's final loss at its FLOPs, linear in log FLOPs between them)")


def _reference_curve(runs: list[FoundRun], summary: dict) -> tuple[str, np.ndarray, np.ndarray] | None:
    """(its name, log FLOPs, loss): the best fixed size's mean curve, or the frontier's points (each fixed
    size's final loss at its FLOPs; linear in log FLOPs between them, as the multiplier reads them)."""
    kind = delta_reference(summary)
    if kind == "best":
        best = summary["best_equal_flops"][0]["arm"]
        ref = _mean_curve([r for r in runs if r.complete and r.label == best])
        return (f"{best}'s", *ref) if ref else None
    if kind == "frontier":
        front = summary["effective_compute"]["points"]
        return "the fixed-size frontier's", np.log([c for c, _ in front]), np.array([l for _, l in front])
    return None


def plot_delta(runs: list[FoundRun], path: Path, summary: dict) -> bool:
    """Δ validation loss against `delta_reference` over log FLOPs, one line per grown arm (mean over seeds,
    band: the seeds' min to max), and the last 30% of the FLOPs zoomed; False (no file) without one."""
    from matplotlib.figure import Figure

    ref = _reference_curve(runs, summary)
    grown = list(dict.fromkeys(r.label for r in runs if r.complete and r.arm.get("kind") == "grown"))
    if ref is None or not grown:
        return False
    fig = Figure(figsize=(12, 5), layout="constrained")
    axes = fig.subplots(1, 2)
    name, rx, ry = ref
    end, zoom = float(np.exp(rx[-1])), []  # the zoomed panel's y range: what its x range shows
    colors = _colors(grown)
    for label in grown:
        deltas, grid = [], None
        for r in (r for r in runs if r.complete and r.label == label):
            pts = [(p[0], p[1]) for p in curve(r.records) if p[0] > 0]
            if len(pts) < 2 or np.log(pts[0][0]) >= rx[-1] or np.log(pts[-1][0]) <= rx[0]:
                continue
            grid = np.linspace(max(np.log(pts[0][0]), rx[0]), min(np.log(pts[-1][0]), rx[-1]), 200)
            deltas.append(np.interp(grid, np.log([f for f, _ in pts]), [l for _, l in pts]) - np.interp(grid, rx, ry))
        if not deltas:
            continue
        d = np.array(deltas)
        seen = np.exp(grid) >= 0.7 * end
        if seen.any():
            zoom += [d.min(axis=0)[seen].min(), d.max(axis=0)[seen].max()]
        for ax in axes:
            ax.plot(np.exp(grid), d.mean(axis=0), lw=1.3, color=colors[label], label=label)
            ax.fill_between(np.exp(grid), d.min(axis=0), d.max(axis=0), color=colors[label], alpha=0.2)
    axes[1].set_xlim(0.7 * end, end * 1.01)
    if zoom:
        pad = 0.1 * (max(zoom) - min(zoom)) + 1e-3
        axes[1].set_ylim(min(min(zoom), 0.0) - pad, max(max(zoom), 0.0) + pad)
    for ax, what in zip(axes, ("whole run", "last 30% of the FLOPs")):
        ax.axhline(0.0, color="black", lw=0.8)
        ax.set_xscale("log")
        ax.set_xlabel("cumulative training FLOPs")
        ax.set_ylabel(f"validation loss − {name} (nats)")
        ax.set_title(what, fontsize=9)
        ax.grid(alpha=0.3)
    axes[1].legend(fontsize=7, loc="upper left", bbox_to_anchor=(1.01, 1.0))
    fig.suptitle(textwrap.fill(summary["title"], 120) + f"\nΔ against {delta_against(summary)} (mean over seeds; "
                 "band: their range)",
                 fontsize=9)
    fig.savefig(path, dpi=110)
    return True


def plot_flops_to_target(runs: list[FoundRun], path: Path, summary: dict) -> bool:
    """The FLOPs each arm needs to reach a target validation loss (median over seeds, unreached seeds counted
    as not reached), over targets from the worst to the best final loss of the arms; False without runs."""
    from matplotlib.figure import Figure

    done = [r for r in runs if r.complete and r.summary.get("final_val_loss") is not None]
    if not done:
        return False
    finals = [float(r.summary["final_val_loss"]) for r in done]
    targets = np.linspace(max(finals), min(finals), 40)
    fig = Figure(figsize=(11, 5.5), layout="constrained")
    ax = fig.subplots()
    for label in dict.fromkeys(r.label for r in done):
        curves = [curve(r.records) for r in done if r.label == label]
        ys = [censored_median([flops_to_reach(c, float(t)) for c in curves]) for t in targets]
        ok = [(t, y) for t, y in zip(targets, ys) if y is not None]
        if ok:
            kind = next(r.arm.get("kind") for r in done if r.label == label)
            ax.plot(*zip(*ok), lw=1.3, ls="-" if kind == "grown" else "--", label=label)
    ax.set_yscale("log")
    ax.invert_xaxis()
    ax.set_xlabel("target validation loss (nats)")
    ax.set_ylabel("FLOPs to reach it (median over seeds)")
    ax.set_title(textwrap.fill(summary["title"], 110) + "\nFLOPs to reach a target loss (dashed: fixed sizes)",
                 fontsize=9)
    ax.grid(alpha=0.3, which="both")
    ax.legend(fontsize=7, loc="upper left", bbox_to_anchor=(1.01, 1.0))
    fig.savefig(path, dpi=110)
    return True
