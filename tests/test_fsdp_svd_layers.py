"""svd by units on 2 gloo ranks with its statistics and eigenproblems divided by layer (docs/distributed.md, "FSDP2", `grow.growth.svd_stats.LayerOwners`): layer n's Sigma and T held and solved by rank n % 2 only,
its rows broadcast from there; the grown model equals one process's to 1e-10 (float64), with the
batches split over the ranks (4 rows) and run whole on both (5 rows: no even split)."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest
import torch

from grow.fsdp_growth import passes
from grow.growth import get_strategy
from grow.growth import svd as svd_mod
from grow.parallel import distributed
from tests.helpers import BASE, gen, make_batches, trained_like
from tests.ranks import finish, process_env, rank_env, rendezvous_env
from tests.test_fsdp_growth import built, by_units

TOL = 1e-10
N_LAYERS = 3  # rank 0 owns layers 0 and 2, rank 1 layer 1
# (svd's options, the model's shape, rows per batch). rope on 5 rows (whole batches on each rank): a rotary
# form's singular values come in equal pairs, so its one new row per pair is any vector of a plane and the
# sums' order under a split (as before the division) picks another one than one process. "faint": layer 1's
# W_O x 1e-12, so its singular values are below 1e-10 x every layer's largest (no new columns there) but not
# below its own largest (what rank 1 holds alone)
CASES = {"k": ({}, {}, 4), "odd-rows": ({}, {}, 5), "refactor": (dict(mode="refactor"), {}, 4),
         "seed004": (dict(update_existing="seed004"), {}, 4), "projected": (dict(update_existing="projected"), {}, 4),
         "rope": ({}, dict(positions="rope", rope_dim=8), 5), "gqa": ({}, dict(n_kv_heads=1, n_heads=4), 4),
         "faint": ({}, {}, 4)}


def grow_case(case: str) -> tuple[dict, dict]:
    """svd's growth of d_k by units in this process (one of the ranks, or alone): (the grown model's
    tensors, the statistics it held: layers of T and of the directions, bytes of Sigma and T)."""
    options, shape, rows = CASES[case]
    model = trained_like(BASE.replace(n_layers=N_LAYERS, d_ff=25, tie_embeddings=False, **shape))
    if case == "faint":
        with torch.no_grad():
            model.layers[1].attn.o.weight.mul_(1e-12)
    tgt = model.config.replace(d_qk=8)
    batches = make_batches(6, bsz=rows, cfg=model.config)
    strategy = get_strategy("svd", gamma=0.4, **options)
    held = {}
    stats = svd_mod.gradient_statistics

    def counted(*a, **kw):
        st = stats(*a, **kw)
        held["stats_bytes"] = sum(t.numel() * t.element_size() for t in (st.sigma_sum, st.t_sum))
        held["stats_layers"] = st.t_sum.shape[0]
        return st

    svd_mod.gradient_statistics = counted
    try:
        passes.prepare(strategy, model, model.config, tgt, batches, generator=gen(3), stage=1)
    finally:
        svd_mod.gradient_statistics = stats
    held["solved_layers"] = strategy.units.directions["W"].shape[0]
    kept, out = by_units(model, tgt, strategy)
    grown = built(tgt, kept, out)
    metrics, _ = passes.finish(strategy, grown, out.result)
    held["gamma"] = metrics["svd/gamma"]
    return {k: v.clone() for k, v in grown.state_dict().items() if isinstance(v, torch.Tensor)}, held


def worker(out: str) -> None:
    """One rank (torchrun's environment): every case, its tensors and what it held into ``out``."""
    distributed.init()
    torch.save({case: grow_case(case) for case in CASES}, f"{out}.{distributed.rank()}")
    distributed.shutdown()


@pytest.mark.fsdp
def test_svd_statistics_and_eigenproblems_are_divided_by_layer_on_two_ranks(tmp_path):
    rendezvous, out = rendezvous_env(), tmp_path / "grown"
    code = f"from tests.test_fsdp_svd_layers import worker; worker({json.dumps(str(out))})"
    procs = [subprocess.Popen([sys.executable, "-c", code], cwd=tmp_path, stdout=subprocess.PIPE,
                              stderr=subprocess.PIPE, text=True,
                              env=process_env({**rank_env(r, 2, rendezvous), "GROW_DIST_TIMEOUT": "60"}))
             for r in range(2)]
    for rc, _, err in finish(procs):
        assert rc == 0, err[-4000:]
    ranks = [torch.load(f"{out}.{r}") for r in range(2)]
    for case in CASES:
        want, alone = grow_case(case)
        assert alone["stats_layers"] == alone["solved_layers"] == N_LAYERS
        for r, results in enumerate(ranks):
            got, held = results[case]
            assert sorted(got) == sorted(want)
            worst = max(float((got[n] - want[n]).abs().max()) for n in want)
            assert worst <= TOL, (case, r, worst)
            assert held["gamma"] == pytest.approx(alone["gamma"], rel=TOL)
            mine = len(range(r, N_LAYERS, 2))  # layers n with n % 2 == r
            assert held["stats_layers"] == held["solved_layers"] == mine, (case, r, held)
            assert held["stats_bytes"] == alone["stats_bytes"] * mine // N_LAYERS, (case, r, held)
