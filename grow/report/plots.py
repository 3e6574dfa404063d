"""The report's two plots: validation loss against cumulative FLOPs and against training time, one line per run.
"""

from __future__ import annotations

import textwrap
from pathlib import Path

from grow.report.stats import curve
from grow.runs import Run


def plot(runs: list[Run], path: Path, axis: str, summary: dict) -> None:
    """Validation (and faint training) loss of every run against FLOPs or seconds; growths marked."""
    import matplotlib
    from matplotlib.figure import Figure

    fig = Figure(figsize=(11, 5.5), layout="constrained")
    ax = fig.subplots()
    labels = list(dict.fromkeys(r.label for r in runs if r.complete))
    palette = matplotlib.colormaps["tab10" if len(labels) <= 10 else "tab20"].colors
    colors = {lab: palette[i % len(palette)] for i, lab in enumerate(labels)}
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


def _load_caption(summary: dict) -> str:
    values = [float(v) for e in summary["arms"] for m in e["runs"] for v in (m.get("load_average") or [])]
    if not values:
        return " (machine load not recorded)"
    return f" (machine load average {min(values):.1f}–{max(values):.1f})"
