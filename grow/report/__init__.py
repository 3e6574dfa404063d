"""The report of any set of runs: ``grow report runs=[...]`` and ``grow compare report=<sweep dir>`` (docs/statistics.md).

Four steps, one module each: `grow.report.collect` (which runs, grouped into arms, and their
baselines), `grow.report.stats` (per-run figures, per-arm statistics, paired differences),
`grow.report.tables` (the terminal table, report.md, docs/results.md's tables) and `grow.report.plots`
(loss against FLOPs and time); `grow.report.publish` copies tables and plots to W&B (the files are
the record). Stages are numbered from 1.
"""

from __future__ import annotations

import json
import shlex
import sys
import time
from pathlib import Path

from grow.errors import ConfigError
from grow.report import extra
from grow.report.collect import NOT_AN_ARM, assign_baselines, collect, distinguish, short_key
from grow.report.inference import MARGIN
from grow.report.plots import plot, plot_delta, plot_flops_to_target
from grow.report.publish import log_wandb
from grow.report.published import is_published, merge, read_published
from grow.report.stats import (
    COLUMNS,
    compare_arms,
    curve,
    derived_statistics,
    flops_to_reach,
    paired,
    run_metrics,
    stat,
    summarize,
)
from grow.report.tables import print_arms, print_table, report_markdown, results_tables
from grow.runs import is_run_dir

# the names other modules and the tests use, each from the step that defines it
__all__ = ["COLUMNS", "EXTRA_PLOTS", "NOT_AN_ARM", "REPORT_FILES", "assign_baselines", "build_report", "collect", "compare_arms", "curve",
           "default_out_dir", "distinguish", "flops_to_reach", "log_wandb", "paired", "partial_report", "plot", "print_arms", "print_table",
           "report_markdown", "results_tables", "run_metrics", "short_key", "stat", "summarize"]

REPORT_FILES = ("summary.json", "report.md", "loss_vs_flops.png", "loss_vs_time.png")
EXTRA_PLOTS = ("delta_vs_flops.png", "flops_to_target.png")  # written when the runs allow; published when there


def default_out_dir(root: Path | str = "outputs/report") -> Path:
    return Path(root) / time.strftime("%Y-%m-%d_%H-%M-%S")


def build_report(paths: list[Path], out_dir: Path, *, title: str | None = None, key: str = "runs",
                 logger_cfg: dict | None = None, show: bool = True, margin: float | None = None,
                 partial: bool = False) -> dict:
    """Write summary.json, report.md and the two plots of the runs in ``paths`` into ``out_dir``; print
    the table; returns the summary. A path may also be a published report's summary.json (or its directory):
    its arms join the runs' (`grow.report.published`). ``out_dir`` may be a sweep directory, never a run directory (whose
    own summary.json it would overwrite). Without the report extra: `ConfigError`, or with ``partial`` `partial_report`."""
    out_dir = Path(out_dir)
    if is_run_dir(out_dir):
        raise ConfigError("out" if key == "runs" else key, str(out_dir),
                          "is a run directory: the report would overwrite its summary.json (write the report "
                          "elsewhere: grow report runs=[<dir>] out=<new dir>)")
    margin = MARGIN if margin is None else margin
    absent = extra.missing()
    if absent is not None and partial and not any(is_published(p) for p in paths):
        return partial_report(collect(list(paths), key), out_dir, absent, title=title, margin=margin, show=show)
    extra.require(key, ... if key == "runs" else str(out_dir))
    published = [(Path(p), read_published(p, key)) for p in paths if is_published(p)]
    runs = collect([p for p in paths if not is_published(p)], key)
    summary = summarize(runs, out_dir, title, margin) if runs else None
    if published:
        summary = merge(published, summary, out_dir, title, lambda arms: derived_statistics(arms, margin))
    out_dir.mkdir(parents=True, exist_ok=True)
    (out_dir / "summary.json").write_text(json.dumps(summary, indent=2))
    plot(runs, out_dir / "loss_vs_flops.png", "flops", summary)
    plot(runs, out_dir / "loss_vs_time.png", "time", summary)
    for name in EXTRA_PLOTS:  # one an earlier report left here would be published with these runs
        (out_dir / name).unlink(missing_ok=True)
    draws = (("delta_vs_flops.png", plot_delta), ("flops_to_target.png", plot_flops_to_target))
    written = tuple(name for name, draw in draws if draw(runs, out_dir / name, summary))
    (out_dir / "report.md").write_text(report_markdown(summary, runs, written))
    if show:
        print_table(summary, out_dir)
    if logger_cfg is not None:
        log_wandb(summary, out_dir, logger_cfg)
    return summary


def partial_report(runs: list, out_dir: Path, absent: str, *, title: str | None, margin: float, show: bool) -> dict:
    """Without the extra (``absent``): summary.json without statistics, the per-arm table, one line saying what to
    install; an earlier report's files go (they would disagree)."""
    summary = summarize(runs, out_dir, title, margin, derive=False)
    rebuild = f"grow compare report={shlex.quote(str(out_dir))}"
    summary["partial"] = f"{extra.needs('the statistics and figures', absent)}, then {rebuild}"
    out_dir.mkdir(parents=True, exist_ok=True)
    for name in (*REPORT_FILES, *EXTRA_PLOTS):
        (out_dir / name).unlink(missing_ok=True)
    (out_dir / "summary.json").write_text(json.dumps(summary, indent=2))
    if show:
        print_arms(summary)
    print(f"note: the arms' figures are in {out_dir / 'summary.json'}; {summary['partial']}", file=sys.stderr,
          flush=True)
    return summary
