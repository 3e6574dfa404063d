"""How much to grow: the heat map of configs/sweep/warmstart.yaml's cells (`make sweep EXP=warmstart` runs them).

Each cell ``<sweep>/f<f>-r<r>/`` is a ``grow compare`` of one growth by a factor f of the parameters (final /
start) on r training tokens per final parameter, against the final model from scratch at equal FLOPs. Per cell
the loss gap (grown - scratch final validation loss, mean over seeds; negative: growing won) with Welch's
unpaired t: ``<sweep>/warmstart.md``, ``warmstart.png`` and ``warmstart.json``. `start_widths` is the rule the
spec's start models follow (tests/test_warmstart.py checks them with it).

Usage: python scripts/warmstart.py map <sweep> | render <folder holding warmstart.json>
The question is Mallik et al.'s ("When is Warmstarting Effective for Scaling Language Models?", arXiv 2605.13405).
"""

from __future__ import annotations

import argparse
import json
import math
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
WIDTHS = ("d_model", "d_ff", "d_qk", "d_v")


def final_model(overrides: list[str]):
    """The final `TransformerConfig` and the batch size of a ``grow train`` with ``overrides``."""
    sys.path.insert(0, str(ROOT))
    from hydra import compose, initialize_config_dir

    from grow import plugins
    from grow.config import CONFIG_DIR
    from grow.run import load as load_run

    plugins.load()  # model/_base and GROW_PLUGINS' strategies, stored as the CLI stores them
    with initialize_config_dir(str(CONFIG_DIR), version_base="1.3"):
        run = load_run(compose("train", overrides=overrides))
    return run.model, run.trainer.batch_size


def start_widths(model, factor: float) -> dict[str, int]:
    """The start widths (even, at least 2, at most the final) whose model is nearest P_final / factor."""
    from dataclasses import replace

    target = model.num_params() / factor
    best = None
    for h in range(2, model.d_model + 1, 2):
        scale = h / model.d_model
        dims = {"d_model": h, **{d: min(getattr(model, d), max(2, 2 * round(getattr(model, d) * scale / 2)))
                                 for d in WIDTHS[1:]}}
        p = replace(model, **dims).num_params()
        if best is None or abs(math.log(p / target)) < abs(math.log(best[1] / target)):
            best = (dims, p)
    return best[0]


def _cell(path: Path) -> dict | None:
    """Per-seed final losses of the grown and the equal-FLOPs arm of one cell (None: not finished)."""
    try:
        summary = json.loads((path / "summary.json").read_text())
    except (OSError, ValueError):
        return None
    losses = {"grown": {}, "equal_flops": {}}
    params = {}
    for arm in summary["arms"]:
        if arm["kind"] in losses:
            for m in arm["runs"]:
                losses[arm["kind"]][m["seed"]] = m["final_val_loss"]
    for run_dir in path.glob("*/summary.json"):
        s = json.loads(run_dir.read_text())
        if s.get("stage_plan") and len(s["stage_plan"]) == 2:
            params = {"start": s["stage_plan"][0]["params"], "final": s["stage_plan"][1]["params"]}
    seeds = sorted(set(losses["grown"]) & set(losses["equal_flops"]))
    if not seeds:
        return None
    return {**cell_stats([losses["grown"][s] for s in seeds], [losses["equal_flops"][s] for s in seeds]),
            "seeds": seeds, **params}


def cell_stats(grown: list[float], scratch: list[float]) -> dict:
    """One cell's gap, mean(grown) − mean(scratch), by Welch's unpaired t (`grow.report.inference.welch_test`):
    a grown run's start model is drawn at its own shape, so it shares no initialization with the model from
    scratch of its seed, only the batch order; the project pairs only arms that share one (docs/statistics.md, "The report's statistics")."""
    sys.path.insert(0, str(ROOT))
    from grow.report.inference import welch_test

    w = welch_test(grown, scratch)
    return {"test": "welch", "gap": w["mean"], "se": w["se"], "dof": w["dof"], "t": w["t"], "p": w["p"],
            "ci95": w["ci95"], "n": len(grown), "n_ref": len(scratch), "grown": grown, "scratch": scratch}


def heat_map(sweep: Path) -> int:
    cells = {}
    for d in sorted(sweep.glob("f*-r*")):
        f, r = d.name[1:].split("-r")
        c = _cell(d)
        if c is not None:
            cells[(float(f), float(r))] = c
    if not cells:
        print(f"error: {sweep}: no finished cell (f<factor>-r<ratio>/summary.json)", file=sys.stderr)
        return 2
    return write_map(sweep, cells)


def render(folder: Path) -> int:
    """The heat map again from a warmstart.json's per-seed losses alone (a published one: no cell directories),
    its statistics recomputed."""
    path = Path(folder) / "warmstart.json"
    if not path.is_file():
        print(f"error: {path}: no such file (a folder holding warmstart.json)", file=sys.stderr)
        return 2
    cells = {k: {**c, **cell_stats(c["grown"], c["scratch"])} for k, c in cells_of(path).items()}
    for c in cells.values():
        for key in ("sd", "gaps", "factor", "tokens_per_param"):  # the paired figures of before; the cell's
            c.pop(key, None)                                       # key, which write_map writes again
    return write_map(Path(folder), cells)


def write_map(sweep: Path, cells: dict) -> int:
    """warmstart.json, warmstart.md and warmstart.png of ``cells`` in ``sweep``; the table printed."""
    factors, ratios = sorted({k[0] for k in cells}), sorted({k[1] for k in cells})
    (sweep / "warmstart.json").write_text(json.dumps(
        {"cells": [{"factor": f, "tokens_per_param": r, **c} for (f, r), c in sorted(cells.items())]}, indent=1))
    rows = table_rows(cells)
    text = ["# Warm-start sweep: growth factor x tokens per parameter", "",
            "Loss gap at equal FLOPs: final validation loss of one growth by the factor (the row), minus the "
            "final model trained from scratch on the same FLOPs: the difference of the seeds' means ± its standard "
            "error and the two-sided p of Welch's unpaired t-test (the two share no initialization, so the seeds are "
            "not paired), n seeds each; negative: growing won. Columns: training tokens per parameter of the final "
            "model.", "", *rows, "", "![heat map](warmstart.png)", ""]
    (sweep / "warmstart.md").write_text("\n".join(text))
    _plot(sweep / "warmstart.png", factors, ratios, cells)
    print("\n".join(rows))
    print(f"heat map: {sweep / 'warmstart.md'}, {sweep / 'warmstart.png'}")
    return 0


def table_rows(cells: dict) -> list[str]:
    """The heat map as a markdown table: one row per growth factor, one column per tokens-per-parameter
    budget, each cell the mean gap ± SD (n). ``cells``: (factor, ratio) -> a cell of ``_cell`` (or of
    warmstart.json, which docs/results.md's table is checked against)."""
    factors, ratios = sorted({k[0] for k in cells}), sorted({k[1] for k in cells})
    head = ("| growth factor \\ tokens per final parameter (Welch's t: gap ± SE, n, p) | "
            + " | ".join(f"{r:g}" for r in ratios) + " |")
    rows = [head, "|---" * (len(ratios) + 1) + "|"]
    for f in factors:
        out = []
        for r in ratios:
            c = cells.get((f, r))
            out.append("—" if c is None else f"{c['gap']:+.4f}" + (f" ± {c['se']:.4f}" if c["se"] is not None else "")
                       + f" (n={c['n']}" + (f", p={c['p']:.2g})" if c["p"] is not None else ")"))
        rows.append(f"| {f:g}x | " + " | ".join(out) + " |")
    return rows


def cells_of(path: Path) -> dict:
    """The cells of a warmstart.json, keyed (factor, tokens per parameter) as ``table_rows`` takes them."""
    return {(c["factor"], c["tokens_per_param"]): c for c in json.loads(Path(path).read_text())["cells"]}


def _plot(path: Path, factors, ratios, cells) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    import numpy as np

    grid = np.full((len(factors), len(ratios)), np.nan)
    for i, f in enumerate(factors):
        for j, r in enumerate(ratios):
            if (f, r) in cells:
                grid[i, j] = cells[(f, r)]["gap"]
    lim = max(float(np.nanmax(np.abs(grid))), 1e-6)
    fig, ax = plt.subplots(figsize=(1.4 * len(ratios) + 2, 0.9 * len(factors) + 1.6))
    im = ax.imshow(grid, cmap="RdBu_r", vmin=-lim, vmax=lim, aspect="auto")
    for i in range(len(factors)):
        for j in range(len(ratios)):
            if not np.isnan(grid[i, j]):
                ax.text(j, i, f"{grid[i, j]:+.3f}", ha="center", va="center", fontsize=9)
    ax.set_xticks(range(len(ratios)), [f"{r:g}" for r in ratios])
    ax.set_yticks(range(len(factors)), [f"{f:g}x" for f in factors])
    ax.set_xlabel("training tokens per final parameter")
    ax.set_ylabel("growth factor (parameters)")
    ax.set_title("loss gap at equal FLOPs\ngrown - from scratch (blue: growing won)", fontsize=10)
    fig.colorbar(im, ax=ax, label="nats")
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    sub = p.add_subparsers(dest="cmd", required=True)
    sub.add_parser("map").add_argument("sweep", help="a folder of f<f>-r<r>/ cells")
    sub.add_parser("render").add_argument("sweep", help="a folder holding warmstart.json")
    args = p.parse_args(argv)
    if args.cmd == "render":
        return render(Path(args.sweep))
    return heat_map(Path(args.sweep))


if __name__ == "__main__":
    sys.exit(main())
