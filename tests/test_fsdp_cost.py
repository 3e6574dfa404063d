"""grow.fsdp_growth.cost: a growth's memory per rank and bytes moved under trainer.fsdp_growth=host | sharded
(docs/distributed.md, "FSDP2"), against the formula recounted here from the modules themselves; grow schedule's
table of them; docs/fsdp.md's 7B table and the measured rates it uses."""

from __future__ import annotations

import json
import re

import pytest
import torch
from hydra import compose, initialize_config_dir

from grow.config import CONFIG_DIR
from grow.fsdp_growth.cost import HOST_FLOPS, HOST_SECONDS_PER_PARAM, cost_table, growth_cost
from grow.memory import GiB
from grow.model import Transformer, TransformerConfig
from grow.run import Run, load
from tests.conftest import ROOT

OLD = TransformerConfig(vocab_size=96, seq_len=16, n_layers=2, d_model=16, n_heads=2, d_qk=8, d_v=8, d_ff=40)
NEW = OLD.replace(n_layers=3, d_model=24, n_heads=3, d_ff=64)
BENCH = ROOT / "docs" / "bench" / "fsdp-growth-cpu-2026-11-26" / "fsdp_growth_memory.json"


def counted(cfg: TransformerConfig) -> tuple[int, int, int, int]:
    """(parameters, root, one block, largest tensor) of the module itself."""
    m = Transformer(cfg)
    block = sum(p.numel() for p in m.layers[0].parameters())
    total = sum(p.numel() for p in m.parameters())
    return total, total - cfg.n_layers * block, block, max(p.numel() for p in m.parameters())


def expected(old, new, world: int, path: str, s: int = 13, w: int = 4, gpu: bool = True) -> dict:
    """docs/distributed.md, "FSDP2"'s formula: s bytes of state per parameter (weight w, moments, uint8 birth)."""
    (po, ro, bo, lo), (pn, rn, bn, ln) = counted(old), counted(new)
    shards = -(-s * po // world) + -(-s * pn // world)
    if path == "host":
        return {"shards": shards, "transient": w * max(lo, ln), "rank0_host": po * (w + 2 * (s - w)) + s * pn,
                "link": (world - 1) * s * po // world + (world - 1) * s * pn // world,
                "pcie": s * (po + pn) if gpu else 0}
    return {"shards": shards, "transient": max(s * (ro + rn), s * (bo + bn)), "rank0_host": 0,
            "link": (world - 1) * s * po // world, "pcie": 0}


@pytest.mark.parametrize("path", ["host", "sharded"])
@pytest.mark.parametrize("world", [2, 3])
def test_a_growths_cost_is_the_formula(path, world):
    for optimizer, s in (("adamw", 13), ("sgd", 9)):
        for gpu in (True, False):
            got = growth_cost(OLD, NEW, world, path, optimizer=optimizer, gpu=gpu)
            assert {k: getattr(got, k) for k in ("shards", "transient", "rank0_host", "link", "pcie")} == \
                expected(OLD, NEW, world, path, s=s, gpu=gpu)
    got = growth_cost(OLD, NEW, world, path, param_dtype=torch.float64)
    assert got.rank0_host == expected(OLD, NEW, world, path, s=25, w=8)["rank0_host"]


def test_the_sharded_path_holds_no_host_copy_and_moves_less():
    host, sharded = (growth_cost(OLD, NEW, 8, p) for p in ("host", "sharded"))
    assert sharded.rank0_host == 0 < host.rank0_host and sharded.link < host.link


SMALL = ["model=llama-124m", "model.vocab_size=32000", "+schedule=depth", "schedule.start.n_layers=6",
         "trainer.parallel=fsdp", "trainer.world_size=2", "device=cpu"]


def run_of(*overrides) -> Run:
    with initialize_config_dir(str(CONFIG_DIR), version_base="1.3"):
        return load(compose("train", overrides=list(overrides)))


def test_grow_schedule_shows_each_growths_peak_per_rank_under_both_paths(tmp_path):
    from tests.conftest import grow_cli

    out = grow_cli("schedule", *SMALL, cwd=tmp_path)
    assert out.returncode == 0, out.stderr
    assert "peak memory of a growth per rank of 2" in out.stdout
    row = next(line for line in out.stdout.splitlines() if "1 -> 2" in line)
    shown = [float(x) for x in re.findall(r"([\d.]+) GiB", row)]
    old, new = (st.cfg for st in run_of(*SMALL).plan)
    host, sharded = (expected(old, new, 2, p, gpu=False) for p in ("host", "sharded"))
    want = [host["shards"] + host["transient"] + host["rank0_host"], host["shards"] + host["transient"],
            sharded["shards"] + sharded["transient"], host["link"], sharded["link"]]
    assert shown == [round(b / GiB, 2) for b in want]
    plain = grow_cli("schedule", *SMALL[:-3], cwd=tmp_path)  # not FSDP: no such table
    assert plain.returncode == 0 and "peak memory of a growth" not in plain.stdout


def test_the_model_accounts_for_rank_0s_measured_excess_on_the_cpu():
    """The measured run (scripts/fsdp_growth_memory.py): rank 0's peak above rank 1's is what the host
    path's rank0_host adds, to 10% (each process's own memory, Python and torch, is the same on both)."""
    r = json.loads(BENCH.read_text())
    row = next(x for x in r["rows"] if x["fsdp_growth"] == "host")
    old, new = (st.cfg for st in run_of("model=llama-124m", "model.vocab_size=32000", "+schedule=depth",
                                        "schedule.start.n_layers=6").plan)
    assert (old.num_params(), new.num_params()) == (row["params_before"], row["params_after"])
    cost = growth_cost(old, new, r["ranks"], "host", gpu=False)
    measured = (row["peak_rss_mb"][0] - row["peak_rss_mb"][1]) * 2**20
    assert abs(cost.host_peak(0) - cost.host_peak(1) - measured) <= 0.1 * measured


def test_the_rates_are_the_measured_ones():
    r = json.loads(BENCH.read_text())
    row = next(x for x in r["rows"] if x["fsdp_growth"] == "host")
    assert HOST_SECONDS_PER_PARAM == pytest.approx(row["grow_seconds_per_param"], rel=1e-3)
    assert HOST_FLOPS == pytest.approx(r["matmul_flops_one_thread"], rel=2e-3)


def test_docs_fsdp_has_the_models_7b_table():
    run = run_of("+experiment=llama-7b-fsdp")
    assert cost_table(run, run.plan, 8) in (ROOT / "docs" / "fsdp.md").read_text()
