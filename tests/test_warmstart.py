"""The warmstart sweep (configs/sweep/warmstart.yaml, scripts/warmstart.py): the start model of each growth factor,
the spec's cells against that rule, and the heat map of a sweep's cells (tests/test_make.py runs a cell through make)."""

from __future__ import annotations

import json
import sys
from pathlib import Path

import pytest

stats = pytest.importorskip("scipy.stats")  # the report extra; make test installs it

from grow.model import TransformerConfig  # noqa: E402

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "scripts"))
import warmstart  # noqa: E402


@pytest.mark.parametrize("factor", [1.5, 2, 4, 8])
def test_the_start_model_is_the_width_nearest_the_factor(factor):
    from dataclasses import replace

    final = TransformerConfig(vocab_size=512, seq_len=32, n_layers=2, d_model=32, n_heads=2, d_qk=16, d_v=16, d_ff=64)
    dims = warmstart.start_widths(final, factor)
    got = final.num_params() / replace(final, **dims).num_params()
    assert abs(got / factor - 1) < 0.25, (dims, got)
    assert all(2 <= dims[d] <= getattr(final, d) and dims[d] % 2 == 0 for d in dims)
    assert dims["d_model"] < final.d_model


def _fake_cell(d: Path, grown: dict, scratch: dict) -> None:
    d.mkdir(parents=True)
    arms = [{"kind": "grown", "runs": [{"seed": s, "final_val_loss": v} for s, v in grown.items()]},
            {"kind": "equal_flops", "runs": [{"seed": s, "final_val_loss": v} for s, v in scratch.items()]}]
    (d / "summary.json").write_text(json.dumps({"arms": arms}))


def test_the_heat_map_is_the_welch_gap_per_cell(tmp_path):
    """A cell's gap is mean(grown) − mean(scratch) with Welch's unpaired t (SciPy's ttest_ind, equal_var=False): a grown
    run shares no initialization with the model from scratch of its seed. The paired form (SD of the per-seed
    differences: 0.1414 in f2-r5) would fail here. The table says the test; render redoes it from warmstart.json."""
    _fake_cell(tmp_path / "f2-r5", {0: 3.0, 1: 3.2}, {0: 3.1, 1: 3.1})
    _fake_cell(tmp_path / "f4-r5", {0: 3.5}, {0: 3.0, 1: 3.0})  # seed 1 of the grown arm not finished
    _fake_cell(tmp_path / "f2-r10", {0: 3.0, 1: 3.3, 2: 3.1}, {0: 2.9, 1: 3.0, 2: 3.05})
    assert warmstart.heat_map(tmp_path) == 0
    cells = warmstart.cells_of(tmp_path / "warmstart.json")
    assert cells[(2.0, 5.0)]["gap"] == pytest.approx(0.0, abs=1e-12) and cells[(2.0, 5.0)]["n"] == 2
    assert cells[(2.0, 5.0)]["se"] == pytest.approx((0.02 / 2) ** 0.5, rel=1e-12)  # √(s_g²/n + s_r²/n), s_r = 0
    assert cells[(4.0, 5.0)]["gap"] == pytest.approx(0.5) and cells[(4.0, 5.0)]["se"] is None
    c = cells[(2.0, 10.0)]
    want = stats.ttest_ind([3.0, 3.3, 3.1], [2.9, 3.0, 3.05], equal_var=False)
    assert c["test"] == "welch" and c["p"] == pytest.approx(want.pvalue, rel=1e-12)
    assert c["t"] == pytest.approx(want.statistic, rel=1e-12)
    assert "sd" not in c and "gaps" not in c  # no paired figure
    md = (tmp_path / "warmstart.md").read_text()
    assert "| growth factor \\ tokens per final parameter (Welch's t: gap ± SE, n, p) |" in md
    assert "| 2x | +0.0000 ± 0.1000 (n=2, p=1) |" in md and "| 4x | +0.5000 (n=1) |" in md
    assert (tmp_path / "warmstart.png").stat().st_size > 1000
    table = md.split("\n\n")[2]
    assert warmstart.render(tmp_path) == 0 and (tmp_path / "warmstart.md").read_text().split("\n\n")[2] == table


def test_no_finished_cell_is_an_error(tmp_path):
    assert warmstart.heat_map(tmp_path) == 2


def test_the_specs_cells_are_the_factors_and_budgets_the_rule_gives():
    """Every cell of configs/sweep/warmstart.yaml starts at `start_widths`' model for its factor and trains r x the
    final model's parameters in tokens; the grid is 1.5, 2, 4, 8 x 2, 5, 10, 20, 40, the small budgets first."""
    import yaml

    spec = yaml.safe_load((ROOT / "configs" / "sweep" / "warmstart.yaml").read_text())
    model, _ = warmstart.final_model([o for o in spec["common"] if o.startswith(("model", "data"))])
    cells = [(float(k[1:].split("-r")[0]), float(k.split("-r")[1])) for k in spec["arms"]]
    assert cells == [(f, r) for r in (2, 5, 10, 20, 40) for f in (1.5, 2, 4, 8)]
    for (f, r), (label, arm) in zip(cells, spec["arms"].items()):
        want = [*(f"+schedule.start.{d}={v}" for d, v in warmstart.start_widths(model, f).items()),
                f"trainer.max_tokens={int(r * model.num_params())}"]
        assert arm == {"kind": "compare", "dir": label, "overrides": want}, label
