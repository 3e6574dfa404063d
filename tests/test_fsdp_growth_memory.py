"""scripts/fsdp_growth_memory.py at a toy size: one growth under FSDP on 2 gloo ranks per value of
trainer.fsdp_growth, each rank's peak resident memory and the growth's seconds by phase, as JSON and
markdown (docs/fsdp.md, "A growth measured on a CPU")."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest
import torch

from tests.conftest import ROOT

SCRIPT = ROOT / "scripts" / "fsdp_growth_memory.py"
TOY = ["model=tiny", "model.vocab_size=512", "data.vocab_size=512", "data.max_bytes=400000",
       "schedule.start.n_layers=1"]


@pytest.mark.fsdp
def test_the_script_measures_every_growth_path_on_two_ranks(tmp_path):
    sys.path.insert(0, str(ROOT / "scripts"))
    from fsdp_growth_memory import growth_paths

    out = subprocess.run([sys.executable, str(SCRIPT), "--out", str(tmp_path / "o"), *TOY], cwd=tmp_path,
                         capture_output=True, text=True, timeout=600)
    assert out.returncode == 0, out.stderr[-3000:]
    r = json.loads((tmp_path / "o" / "fsdp_growth_memory.json").read_text())
    names = [p or "host" for p in growth_paths()]
    assert "host" in names and [row["fsdp_growth"] for row in r["rows"]] == names
    assert r["ranks"] == 2 and r["torch"] == torch.__version__ and r["machine"]["cpu"]["model"]
    for row in r["rows"]:
        assert row["params_after"] > row["params_before"]
        assert set(row["phases"]) == {"gather", "grow", "shard"} and min(row["phases"].values()) > 0
        assert sum(row["phases"].values()) <= row["seconds"]  # phases of the growth's own clock
        if sys.platform.startswith("linux"):
            assert len(row["peak_rss_mb"]) == 2 and min(row["peak_rss_mb"]) > 0
            assert row["rank0_over_rank1"] == pytest.approx(row["peak_rss_mb"][0] / row["peak_rss_mb"][1])
    table = (tmp_path / "o" / "fsdp_growth_memory.md").read_text()
    assert all(f"| {n} |" in table for n in names) and "rank 1 peak RSS" in table
