"""What a run shows on the terminal (rich): a progress bar per stage, a panel per growth, a summary (docs/design.md, "Metrics, logging and the console").

Stages are numbered from 1; dimensions are written with Gesmundo & Maile's letters, explained by
`LEGEND`. Strategy figures are grouped by their first word and formatted by their unit
(`figure_lines`); a figure chosen from a grid may declare its edges as ``<figure>/grid_lo`` and
``<figure>/grid_hi``, and a choice on an edge is a warning (`grid_edge_hits`; docs/usage.md).
"""

from __future__ import annotations

import math
import sys

from rich.console import Console
from rich.markup import escape
from rich.panel import Panel
from rich.progress import BarColumn, Progress, TextColumn, TimeElapsedColumn, TimeRemainingColumn
from rich.table import Table

# Not a terminal (a log file, a test): a wide fixed width so tables are not truncated.
console = Console(highlight=False, width=None if sys.stdout.isatty() else 160)
# For commands whose stdout is their result (grow sample's text, grow eval's JSON line): the rest goes here.
err_console = Console(stderr=True, highlight=False, width=None if sys.stderr.isatty() else 160)

# TransformerConfig field -> the letter of Gesmundo & Maile (2023) used on screen, in display order.
DIM_LETTERS = {"n_layers": "N", "d_model": "h", "n_heads": "E", "d_qk": "k", "d_v": "v", "d_ff": "p"}
LEGEND = ("N layers · h residual width (d_model) · E heads · k query/key size per head · v value size per head · "
          "p MLP width (d_ff)")
MOE_LETTERS = {"n_experts": "X", "top_k": "top_k"}  # a mixture of experts' own columns, after the six
MOE_LEGEND = " · X experts a layer · top_k of them a token"
GRID_LO, GRID_HI = "grid_lo", "grid_hi"  # <figure>/grid_lo, <figure>/grid_hi: the edges of the grid it was chosen from


# ---- numbers ---------------------------------------------------------------------------------------


SI_SUFFIXES = ((1e18, "E"), (1e15, "P"), (1e12, "T"), (1e9, "G"), (1e6, "M"), (1e3, "k"))


def fmt_num(x: float) -> str:
    """3 significant digits with an SI suffix: 1.23M, 456k, 7.89G; from 1000E on, a power of ten: 4.79e21.
    Rounded first, then given its suffix: 999,950 is 1M, not 1e+03k."""
    if not math.isfinite(x):
        return str(x)
    x = float(f"{x:.3g}")
    if abs(x) >= 1e3 * SI_SUFFIXES[0][0]:
        mantissa, exponent = f"{x:.2e}".split("e")
        return f"{float(mantissa):g}e{int(exponent)}"
    for div, suffix in SI_SUFFIXES:
        if abs(x) >= div:
            return f"{x / div:.3g}{suffix}"
    return f"{x:.3g}"


def fmt_float(x: float) -> str:
    """4 significant digits in [1e-3, 1e5), 3 in exponent form outside: 0.8, 6.206, 2.48e-05, 3.22e+06."""
    if x == 0 or not math.isfinite(x):
        return "0" if x == 0 else str(x)
    return f"{x:.4g}" if 1e-3 <= abs(x) < 1e5 else f"{x:.3g}"


def fmt_delta(x: float) -> str:
    """A signed loss change: +0.0123, -5.8e-05 below 1e-3, and 0 for exactly no change."""
    if x == 0 or not math.isfinite(x):
        return "0" if x == 0 else str(x)
    return f"{x:+.4f}" if abs(x) >= 1e-3 else f"{x:+.1e}"


def fmt_seconds(x: float) -> str:
    return f"{x:.2f}s" if abs(x) >= 1 else f"{x * 1e3:.1f}ms"


def fmt_figure(name: str, value) -> str:
    """A strategy figure by its unit: ``*seconds`` as time, ``*flops`` with an SI suffix, counts as integers."""
    if isinstance(value, (bool, str)) or not isinstance(value, (int, float)):
        return str(value)
    if name.endswith("seconds"):
        return fmt_seconds(value)
    if name.endswith("flops"):
        return fmt_num(value)
    if isinstance(value, int) or (name.endswith("evals") and float(value).is_integer()):
        return str(int(value))
    return fmt_float(value)


# ---- dimensions --------------------------------------------------------------------------------------


def dims(cfg) -> str:
    return " ".join(f"{letter}={getattr(cfg, field)}" for field, letter in DIM_LETTERS.items())


def dim_letters(configs) -> dict[str, str]:
    """The columns of a table of these configs (dicts, as summaries hold them): the six letters, and X and
    top_k where any has experts (a dense table keeps its six)."""
    return {**DIM_LETTERS, **MOE_LETTERS} if any((c.get("n_experts") or 1) > 1 for c in configs) else DIM_LETTERS


def dims_change(before, after) -> str:
    """``N 1→2  h 4→8  E 1  ...`` (rich markup): a grown dimension as ``old→new`` in bold, the others as is."""
    cells = []
    for field, letter in DIM_LETTERS.items():
        old, new = getattr(before, field), getattr(after, field)
        cells.append(f"{letter} [bold]{old}→{new}[/bold]" if old != new else f"{letter} {new}")
    if before.moe or after.moe:  # X experts, top_k of them a token (a dense model's line unchanged)
        for field, letter in (("n_experts", "X"), ("top_k", "top_k")):
            old, new = getattr(before, field), getattr(after, field)
            cells.append(f"{letter} [bold]{old}→{new}[/bold]" if old != new else f"{letter} {new}")
    return "  ".join(cells)


# ---- strategy figures ----------------------------------------------------------------------------------


def figure_lines(metrics: dict) -> list[tuple[str, str]]:  # (strategy, line)
    """The strategy's figures as (strategy, line) pairs: figures sharing a first word on one line
    (``gamma 3.22e+06 · rel 0.8 · unit 4.03e+06``), the rest together on a last line.

    Only ``<strategy>/<name>`` figures: deeper keys (per-layer, per-parameter figures, grid
    declarations) are in metrics.jsonl only."""
    groups: dict[str, dict[str, list[tuple[str, str, str]]]] = {}  # prefix -> word -> (name, rest, text)
    for key, value in metrics.items():
        if key.count("/") != 1:
            continue
        prefix, name = key.split("/")
        word, _, rest = name.partition("_")
        groups.setdefault(prefix, {}).setdefault(word, []).append((name, rest, fmt_figure(name, value)))
    lines = []
    for prefix, words in groups.items():
        single = []
        for word, items in words.items():
            if len(items) == 1:
                single.append(f"{items[0][0]} {items[0][2]}")
            else:
                lines.append((prefix, f"{word:<10} " + " · ".join(f"{rest} {text}" if rest else text
                                                                 for _, rest, text in items)))
        if single:
            lines.append((prefix, " · ".join(single)))
    return lines


def grid_edge_hits(metrics: dict) -> list[tuple[str, float, str, float, float]]:
    """(figure, value, "top" | "bottom", lo, hi) for each figure equal to an edge of its declared grid."""
    hits = []
    for key, value in metrics.items():
        lo, hi = metrics.get(f"{key}/{GRID_LO}"), metrics.get(f"{key}/{GRID_HI}")
        if lo is None or hi is None or not isinstance(value, (int, float)) or isinstance(value, bool):
            continue
        if math.isclose(value, hi, rel_tol=1e-9, abs_tol=0.0):
            hits.append((key, float(value), "top", float(lo), float(hi)))
        elif math.isclose(value, lo, rel_tol=1e-9, abs_tol=0.0):
            hits.append((key, float(value), "bottom", float(lo), float(hi)))
    return hits


def edge_message(hit: tuple) -> str:
    key, value, edge, lo, hi = hit
    return (f"{key}={fmt_float(value)} is the {edge} of its grid ({fmt_float(lo)} … {fmt_float(hi)}): the line "
            f"search picked its edge, and a {'wider' if edge == 'top' else 'finer'} grid may find a better value")


# ---- progress and panels ---------------------------------------------------------------------------------


class StageProgress:
    """One rich progress bar for a stage; a no-op when disabled. ``stage`` is the plan's index (0-based);
    the bar shows the stage number (``stage 1/4`` for the first)."""

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


def growth_panel(rec: dict, before_cfg, after_cfg, extra: dict, recipe: list[tuple[str, str]] = ()) -> None:
    """The panel of one growth: dims before → after (grown ones marked), parameters, validation loss
    before → after and Δ, seconds, ``recipe``'s rows (`grow.train.recipe_rows`: the layers' sources, the frozen
    layers, the optimizer), the strategy's figures grouped, the legend; then a warning for each figure that
    sits on an edge of its grid. ``rec["growth/stage"]`` is the stage entered (1-based)."""
    body = Table.grid(padding=(0, 2))
    body.add_column(style="dim")
    body.add_column()
    body.add_row("dims", dims_change(before_cfg, after_cfg))
    body.add_row("params", f"{fmt_num(rec['growth/params_before'])} → {fmt_num(rec['growth/params_after'])}")
    body.add_row("val loss", f"{rec['growth/loss_before']:.4f} → {rec['growth/loss_after']:.4f}  "
                             f"(Δ {fmt_delta(rec['growth/delta'])})   growth took {fmt_seconds(rec['growth/seconds'])}")
    for key, text in recipe:
        body.add_row(key, escape(text))
    last = None
    for prefix, line in figure_lines(extra):
        body.add_row(prefix if prefix != last else "", escape(line))
        last = prefix
    body.add_row("", f"[dim]{escape(LEGEND)}; a→b: grown[/dim]")
    stage = rec["growth/stage"]
    console.print(Panel(body, title=f"growth into stage {stage}", expand=False))
    for hit in grid_edge_hits(extra):
        console.print(escape(f"warning: growth into stage {stage}: {edge_message(hit)}"))


def summary_table(summary: dict) -> None:
    t = Table(title="run summary", show_header=False)
    t.add_column(no_wrap=True)
    t.add_column(overflow="fold")  # a long run directory is folded onto more lines, never cut with an ellipsis
    for key in ("run_dir", "strategy", "stages", "final_val_loss", "full_val_loss", "tokens", "flops", "params",
                "active_params", "wall_seconds", "compile_seconds", "tokens_per_s"):
        if key == "active_params" and summary.get(key) == summary.get("params"):
            continue  # a dense model: every parameter is active
        if key == "stages" and summary.get("stages") is not None:
            t.add_row(key, stages_cell(summary))
        elif key in summary and summary[key] is not None:
            v = summary[key]
            t.add_row(key, fmt_num(v) if isinstance(v, (int, float)) and abs(v) >= 1000
                      else (f"{v:.4f}" if isinstance(v, float) else str(v)))
    console.print(t)


def stages_cell(summary: dict) -> str:
    """The stages a run trained: ``4``, or ``1 of 4`` when a growth trigger never fired in stage 1."""
    stayed = summary.get("stayed_at_stage")
    if stayed is None:
        return str(summary["stages"])
    return f"{stayed} of {summary['stages']}"
