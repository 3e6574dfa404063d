"""make sweep-warmstart (scripts/warmstart.py): the start model of each growth factor, the heat map of a
sweep's cells, and the target itself at a reduced size (slow)."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest
from scipy import stats

from grow.model import TransformerConfig
from tests.conftest import TINY_DATA, assert_make_lists

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


@pytest.mark.slow
def test_sweep_warmstart_runs_at_a_reduced_size_and_writes_its_heat_map(tmp_path):
    assert_make_lists("sweep-warmstart ")
    sweep = tmp_path / "ws"
    out = subprocess.run([sys.executable, "scripts/warmstart.py", "run", str(sweep), "--factors", "2,4", "--ratios",
                          "2,4", "--seeds", "0", "--", "model=tiny", *TINY_DATA, "trainer.eval_batches=2",
                          "trainer.eval_batch_size=16", "trainer.progress=false", "trainer.eval_every=0"],
                         cwd=ROOT, capture_output=True, text=True, timeout=1800)
    assert out.returncode == 0, out.stderr[-3000:]
    cells = json.loads((sweep / "warmstart.json").read_text())["cells"]
    assert len(cells) == 4 and all(c["n"] == 1 for c in cells)
    assert all(abs(c["final"] / c["start"] / c["factor"] - 1) < 0.25 for c in cells)
    assert (sweep / "warmstart.png").is_file() and "| 4x |" in (sweep / "warmstart.md").read_text()


PUBLISHED = ROOT / "docs" / "results" / "warmstart" / "warmstart.json"


@pytest.mark.skipif(not PUBLISHED.is_file(), reason="the warm-start sweep is not published yet")
def test_docs_results_md_has_the_published_warmstart_table():
    """docs/results.md's warm-start table is what scripts/warmstart.py writes from the published warmstart.json,
    whose gaps are the means of its per-seed grown - scratch losses."""
    cells = warmstart.cells_of(PUBLISHED)
    for c in cells.values():  # Welch's unpaired t of the seeds' losses (no shared initialization)
        want = stats.ttest_ind(c["grown"], c["scratch"], equal_var=False)
        assert c["test"] == "welch" and c["n"] == len(c["grown"])
        assert c["gap"] == pytest.approx(sum(c["grown"]) / c["n"] - sum(c["scratch"]) / c["n_ref"], abs=1e-12)
        assert c["p"] == pytest.approx(want.pvalue, rel=1e-9)
    page = (ROOT / "docs" / "results.md").read_text()
    block = page.split("<!-- warmstart:table -->\n", 1)[1].split("<!-- /warmstart:table -->", 1)[0]
    assert block.strip().splitlines() == warmstart.table_rows(cells)
    assert (PUBLISHED.parent / "warmstart.png").is_file() and (PUBLISHED.parent / "warmstart.md").is_file()
