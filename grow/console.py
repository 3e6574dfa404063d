"""What a run shows on the terminal (rich): a progress bar per stage, a panel per growth, a summary."""

from __future__ import annotations

import sys

from rich.console import Console
from rich.panel import Panel
from rich.progress import BarColumn, Progress, TextColumn, TimeElapsedColumn, TimeRemainingColumn
from rich.table import Table

# Not a terminal (a log file, a test): a wide fixed width so tables are not truncated.
console = Console(highlight=False, width=None if sys.stdout.isatty() else 160)


def fmt_num(x: float) -> str:
    """3 significant digits with an SI suffix: 1.23M, 456k, 7.89G."""
    for div, suffix in ((1e15, "P"), (1e12, "T"), (1e9, "G"), (1e6, "M"), (1e3, "k")):
        if abs(x) >= div:
            return f"{x / div:.3g}{suffix}"
    return f"{x:.3g}"


def dims(cfg) -> str:
    return (f"N={cfg.n_layers} h={cfg.d_model} E={cfg.n_heads} k={cfg.d_qk} v={cfg.d_v} p={cfg.d_ff}")


class StageProgress:
    """One rich progress bar for a stage; a no-op when disabled."""

    def __init__(self, enabled: bool, stage: int, n_stages: int, steps: int, start: int = 0):
        self.progress = None
        self.stage, self.n_stages, self.steps = stage, n_stages, steps
        self.next_line = start + max(steps // 10, 1)  # plain lines every 10% when not a terminal
        self.plain = enabled and not sys.stdout.isatty()
        if not enabled or self.plain:
            return
        self.progress = Progress(
            TextColumn(f"stage {stage + 1}/{n_stages}"),
            BarColumn(),
            TextColumn("{task.completed}/{task.total} steps"),
            TextColumn("loss {task.fields[loss]}"),
            TextColumn("{task.fields[tps]} tok/s"),
            TimeElapsedColumn(),
            TimeRemainingColumn(),
            console=console,
        )
        self.task = self.progress.add_task("train", total=steps, completed=start, loss="-", tps="-")
        self.progress.start()

    def update(self, steps: int, loss: float | None = None, tokens_per_s: float | None = None) -> None:
        if self.plain and loss is not None and (steps >= self.next_line or steps == self.steps):
            console.print(f"stage {self.stage + 1}/{self.n_stages} step {steps}/{self.steps} loss {loss:.4f} "
                          f"{fmt_num(tokens_per_s or 0)} tok/s")
            self.next_line = steps + max(self.steps // 10, 1)
        if self.progress is None:
            return
        fields = {}
        if loss is not None:
            fields["loss"] = f"{loss:.4f}"
        if tokens_per_s is not None:
            fields["tps"] = fmt_num(tokens_per_s)
        self.progress.update(self.task, completed=steps, **fields)

    def close(self) -> None:
        if self.progress is not None:
            self.progress.stop()


def growth_panel(rec: dict, before_cfg, after_cfg, extra: dict) -> None:
    body = (
        f"{dims(before_cfg)}\n→ {dims(after_cfg)}\n"
        f"params {fmt_num(rec['growth/params_before'])} → {fmt_num(rec['growth/params_after'])}   "
        f"val loss {rec['growth/loss_before']:.4f} → {rec['growth/loss_after']:.4f} "
        f"(Δ {rec['growth/delta']:+.2e})   {rec['growth/seconds']:.2f}s"
    )
    extra = {k: v for k, v in extra.items() if k.count("/") <= 1}  # per-parameter figures: metrics.jsonl only
    if extra:
        body += "\n" + "  ".join(f"{k}={v:.4g}" if isinstance(v, float) else f"{k}={v}" for k, v in extra.items())
    console.print(Panel(body, title=f"growth into stage {rec['growth/stage'] + 1}", expand=False))


def summary_table(summary: dict) -> None:
    t = Table(title="run summary", show_header=False)
    for key in ("run_dir", "strategy", "stages", "final_val_loss", "tokens", "flops", "params",
                "wall_seconds", "compile_seconds", "tokens_per_s"):
        if key in summary and summary[key] is not None:
            v = summary[key]
            t.add_row(key, fmt_num(v) if isinstance(v, (int, float)) and key not in ("stages",) and abs(v) >= 1000
                      else (f"{v:.4f}" if isinstance(v, float) else str(v)))
    console.print(t)
