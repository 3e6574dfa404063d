"""What the console shows: numbers, the growth panel (legend, grown dimensions, Δ, grouped strategy
figures, grid-edge warnings) and the stage plan numbered from 1."""

from __future__ import annotations

import pytest

from grow import console as ui
from grow.model import TransformerConfig

BEFORE = TransformerConfig(vocab_size=512, seq_len=32, n_layers=1, d_model=4, n_heads=1, d_qk=2, d_v=2, d_ff=8)
AFTER = BEFORE.replace(n_layers=2, d_model=8, d_qk=4, d_ff=16)

SVD_FIGURES = {  # what svd logged at a growth of a tiny run (a few keys), with its grid declared
    "svd/stats_seconds": 0.009023, "svd/stats_flops": 3.827e7, "svd/stats_loss": 6.206, "svd/gamma": 3.224e6,
    "svd/gamma_rel": 0.8, "svd/gamma_unit": 4.031e6, "svd/pred_decrease": 2.035e-4, "svd/linesearch_evals": 10,
    "svd/sigma_top/L0": 1.5, "svd/gamma_rel/grid_lo": 0.0125, "svd/gamma_rel/grid_hi": 0.8,
}


@pytest.mark.parametrize("x,text", [(0.0, "0"), (-5.75e-05, "-5.8e-05"), (0.012345, "+0.0123"), (-1.5, "-1.5000")])
def test_delta_has_a_sensible_precision(x, text):
    assert ui.fmt_delta(x) == text


@pytest.mark.parametrize("name,value,text", [
    ("svd/stats_seconds", 0.009023, "9.0ms"), ("svd/seconds", 2.5, "2.50s"), ("svd/stats_flops", 3.827e7, "38.3M"),
    ("svd/linesearch_evals", 10, "10"), ("svd/linesearch_evals", 10.0, "10"), ("svd/gamma", 3.224e6, "3.22e+06"),
    ("svd/gamma_rel", 0.8, "0.8"), ("svd/heldout_decrease", 2.48e-05, "2.48e-05"), ("vt/noise_ratio", 0.0, "0"),
])
def test_figures_are_formatted_by_their_unit(name, value, text):
    assert ui.fmt_figure(name, value) == text


def test_grown_dimensions_are_marked():
    text = ui.dims_change(BEFORE, AFTER)
    assert "N [bold]1→2[/bold]" in text and "h [bold]4→8[/bold]" in text and "E 1 " in text and "v 2 " in text


def test_strategy_figures_are_grouped_by_their_first_word():
    lines = dict((line.split()[0], line) for _, line in ui.figure_lines(SVD_FIGURES))
    assert lines["gamma"].split() == ["gamma", "3.22e+06", "·", "rel", "0.8", "·", "unit", "4.03e+06"]
    assert "seconds 9.0ms" in lines["stats"] and "flops 38.3M" in lines["stats"]
    single = [line for _, line in ui.figure_lines(SVD_FIGURES) if line.startswith("pred_decrease")]
    assert single == ["pred_decrease 0.000204 · linesearch_evals 10"]
    assert not any("sigma_top" in line or "grid_" in line for _, line in ui.figure_lines(SVD_FIGURES))


def test_a_figure_on_an_edge_of_its_declared_grid_is_found():
    assert ui.grid_edge_hits(SVD_FIGURES) == [("svd/gamma_rel", 0.8, "top", 0.0125, 0.8)]
    assert ui.grid_edge_hits({**SVD_FIGURES, "svd/gamma_rel": 0.0125})[0][2] == "bottom"
    assert ui.grid_edge_hits({**SVD_FIGURES, "svd/gamma_rel": 0.0}) == []  # "no change" is not an edge
    assert ui.grid_edge_hits({**SVD_FIGURES, "svd/gamma_rel": 0.2}) == []
    assert ui.grid_edge_hits({"svd/gamma_rel": 0.8}) == []  # no grid declared


def test_growth_panel_explains_the_letters_and_warns_at_a_grid_edge(monkeypatch):
    from rich.console import Console

    con = Console(record=True, width=200)
    monkeypatch.setattr(ui, "console", con)
    rec = {"growth/stage": 2, "growth/params_before": 4340, "growth/params_after": 9560, "growth/loss_before": 6.2045,
           "growth/loss_after": 6.2044, "growth/delta": -5.75e-05, "growth/seconds": 0.05}
    ui.growth_panel(rec, BEFORE, AFTER, SVD_FIGURES)
    text = con.export_text()
    assert "growth into stage 2" in text and "N 1→2" in text and "E 1 " in text
    assert "N layers" in text and "p MLP width" in text  # the legend
    assert "(Δ -5.8e-05)" in text and "+0.00e+00" not in text
    assert "warning: growth into stage 2: svd/gamma_rel=0.8 is the top of its grid (0.0125 … 0.8)" in text


def test_stage_plan_numbers_stages_from_one():
    from rich.console import Console

    from grow.plan import build_plan, format_plan

    plan = build_plan(AFTER, {"stages": 3}, max_tokens=100_000, batch_size=8)
    con = Console(record=True, width=200)
    con.print(format_plan(plan))
    text = con.export_text()
    rows = [line.split("│") for line in text.splitlines() if line.startswith("│")]
    assert [r[1].strip() for r in rows if r[1].strip().isdigit()] == ["1", "2", "3"]
    assert [s.number for s in plan] == [1, 2, 3] and [s.to_dict()["stage"] for s in plan] == [1, 2, 3]
    assert "N layers" in text


def test_the_run_summary_shows_a_long_run_directory_whole_on_80_columns(monkeypatch):
    """Before: the path was cut with an ellipsis on an 80-column terminal."""
    import io

    from rich.console import Console

    from grow import console as ui

    buf = io.StringIO()
    monkeypatch.setattr(ui, "console", Console(file=buf, width=80, highlight=False))
    path = "/home/someone/projects/growth/outputs/2026-11-24/20-41-07.123456_train_with_a_long_name"
    ui.summary_table({"run_dir": path, "strategy": "zero", "final_val_loss": 4.5})
    text = buf.getvalue()
    assert "…" not in text
    cells = "".join(line.split("│")[2].strip() for line in text.splitlines() if line.count("│") == 3)
    assert path in cells


@pytest.mark.parametrize("x,text", [(0, "0"), (999.4, "999"), (999.6, "1k"), (1234, "1.23k"), (999_950, "1M"),
                                    (4.79e18, "4.79E"), (4.79e21, "4.79e21"), (9.996e20, "1e21"), (-2.5e9, "-2.5G")])
def test_fmt_num_rounds_before_its_suffix_and_never_prints_an_exponent_with_one(x, text):
    """Before: 4.79e21 FLOPs printed as 4.79e+03E and 999,950 as 1e+03k."""
    assert ui.fmt_num(x) == text


def test_arms_that_differ_only_in_a_swept_value_stay_apart_on_a_narrow_terminal():
    """The results table's arm column folds rather than ending in "…" (before, at 100 columns, both arms of an
    optim.lr sweep read "basel… optim…")."""
    import io

    from rich.console import Console

    from grow.report.tables import COLUMNS, _rich_table

    headers = ["arm", "seeds", *(v[0] for v in COLUMNS.values())]
    arms = ["baseline optim.lr=0.001", "baseline optim.lr=0.01"]
    rows = [[arm, "0", *(["100.0% (1/1 reached)"] * len(COLUMNS))] for arm in arms]
    out = io.StringIO()
    Console(file=out, width=100).print(_rich_table("title", "caption", headers, rows))
    column = "".join(line.split("│")[1].strip() for line in out.getvalue().splitlines() if line.startswith("│"))
    assert "…" not in column and column == "".join(arms).replace(" ", "")


def test_a_growth_panel_says_the_copy_order_the_frozen_layers_and_the_optimizer(monkeypatch):
    """#65: the panels omitted MIDAS's copy order, SPARKLING's warmup and the frozen layers."""
    from types import SimpleNamespace

    from rich.console import Console

    from grow.growing import freeze_all_but, recipe_rows
    from grow.growth.base import get_strategy
    from grow.model import Transformer

    before, after = BEFORE.replace(n_layers=3), BEFORE.replace(n_layers=4)
    model = Transformer(after)
    freeze_all_but(model, {n for n, _ in model.named_parameters() if n.startswith("layers.2.")})
    cfg = SimpleNamespace(trainer=SimpleNamespace(train_new_only=True),
                          optim=SimpleNamespace(on_growth="keep", new_warmup_steps=20))
    rows = dict(recipe_rows(cfg, get_strategy({"name": "stack", "order": "middle"}), model, before))
    assert rows["layers"].startswith("copies of old layers [0, 1, 1, 2]")  # MIDAS: the middle block after itself
    assert rows["trains"] == "layers [2] of 4; the rest frozen (trainer.train_new_only)"
    assert rows["optimizer"] == "on_growth=keep; new entries' learning rate warmed up over 20 steps"  # SPARKLING's
    assert "layers" not in dict(recipe_rows(cfg, get_strategy({"name": "zero"}), model, before))  # no copies
    con = Console(record=True, width=200)
    monkeypatch.setattr(ui, "console", con)
    rec = {"growth/stage": 2, "growth/params_before": 4340, "growth/params_after": 9560, "growth/loss_before": 6.2,
           "growth/loss_after": 6.2, "growth/delta": 0.0, "growth/seconds": 0.05}
    ui.growth_panel(rec, before, after, {}, list(rows.items()))
    text = con.export_text()
    assert "copies of old layers [0, 1, 1, 2]" in text and "warmed up over 20 steps" in text
