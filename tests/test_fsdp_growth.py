"""A growth one unit at a time (`grow.growth.units`, `grow.fsdp_growth.sharded`, docs/distributed.md, "FSDP2"): the units' tensors put
together are the whole growth's, bit for bit, for every strategy it supports and every dimension."""

from __future__ import annotations

from types import SimpleNamespace

import pytest
import torch

from grow import cli
from grow.fsdp_growth import passes
from grow.fsdp_growth.sharded import sharded_path
from grow.growth import Strategy, get_strategy, grow
from grow.growth.units import declared, grow_by_units, plan_units, supports
from grow.masks import build_model
from grow.model import Linear
from grow.run import load
from tests.conftest import TINY_DATA
from tests.helpers import BASE, CASES, gen, make_batches, make_cfg, target, trained_like

# integer factors (hyperclone's), and a d_ff that does not split evenly in two (uneven shards)
DOUBLED = {"h": dict(d_model=32), "k": dict(d_qk=8), "v": dict(d_v=12), "p": dict(d_ff=50), "E": dict(n_heads=4),
           "N": dict(n_layers=5)}


def grown_target(name: str, case: str):
    if name != "hyperclone":
        return target(case, BASE.replace(d_ff=25))
    dims = {k: v for d in DOUBLED.values() for k, v in d.items()} if case == "all" else DOUBLED[case]
    return BASE.replace(**{"d_ff": 25, **dims})


def by_units(model, tgt, name, **kw):
    sd = model.state_dict()
    skeleton = {k: (tuple(v.shape), v.dtype) if isinstance(v, torch.Tensor) else v for k, v in sd.items()}
    kept = {}

    def keep(n, t):
        assert n not in kept, f"{n} yielded twice"
        kept[n] = t.clone()

    before = {k: v.clone() for k, v in sd.items() if isinstance(v, torch.Tensor)}
    # every unit reads the same tensors (under FSDP the root is gathered once): no unit may modify them
    out = grow_by_units(model.config, skeleton, sd.__getitem__, tgt, name, keep, **{"generator": gen(3), "stage": 1, **kw})
    assert [k for k, v in before.items() if not torch.equal(v, sd[k])] == []
    return kept, out



def built(tgt, kept, out):
    """The plain model of a growth by units' tensors."""
    return build_model(tgt, {**kept, **{f"{n}._extra_state": {"mult": m} for n, m in out.mults.items()}})


def assert_units_are_whole(model, tgt, name, **kw):
    whole = grow(model, tgt, name, **{"generator": gen(3), "stage": 1, **kw})
    kept, out = by_units(model, tgt, name, **kw)
    want = {n: t for n, t in whole.model.state_dict().items() if isinstance(t, torch.Tensor)}
    assert sorted(kept) == sorted(want)
    assert [n for n in want if not torch.equal(kept[n], want[n])] == []
    assert out.mults == {n: m.mult for n, m in whole.model.named_modules() if isinstance(m, Linear)}
    res = out.result
    assert sorted(res.param_map) == sorted(whole.param_map)
    assert all(res.param_map[n][0] == whole.param_map[n][0] and torch.equal(res.param_map[n][1], whole.param_map[n][1])
               for n in whole.param_map)
    assert (res.fresh, res.metrics) == (whole.fresh, whole.metrics)
    assert same(res.rescaled, whole.rescaled)  # net2net's: a factor per entry
    assert res.lr_multipliers == whole.lr_multipliers  # vt's Eq. 5 rates
    assert same(res.state, whole.state)  # vt's births and zero-born stages, per tensor


def same(a, b) -> bool:
    """Equal values, tensors bit for bit, through dicts and lists."""
    if isinstance(a, torch.Tensor) or isinstance(b, torch.Tensor):
        return isinstance(a, torch.Tensor) and isinstance(b, torch.Tensor) and torch.equal(a, b)
    if isinstance(a, dict) and isinstance(b, dict):
        return sorted(a) == sorted(b) and all(same(a[k], b[k]) for k in a)
    return a == b


PLAIN = [n for n in declared() if n != "svd"]  # svd's passes around the units: test_svd_by_units_...


class Declared(Strategy):
    """A plugin's strategy (not registered): the zero rule, free entries halved, declared to grow by units."""

    name = "plugin-declared"
    grows_by_units = True

    def free_values(self, ctx, site, slot):
        return super().free_values(ctx, site, slot) * 0.5


class Undeclared(Declared):
    name = "plugin-undeclared"
    grows_by_units = False


class Inherits(Declared):
    """A subclass of a declared strategy that does not declare it itself (its hooks may read other units)."""

    name = "plugin-inherits"


class OverUndeclared(Declared):
    """Declared, over a base that is not: grows on the host (its base reads what it reads)."""

    name = "plugin-over"

    def __init__(self):
        super().__init__()
        self.base = Undeclared()


def test_growing_by_units_is_what_a_strategy_declares():
    """`supports` (and so trainer.fsdp_growth=auto's choice) reads the class's own `grows_by_units`, its base's
    too: a new strategy that does not declare it grows on the host (a subclass of one that does included), one
    that does by units (no list of names); of the built-in ones, ligo and upcycle (experts: on the host) do not."""
    assert [supports(s) for s in (Declared(), Undeclared(), Inherits(), OverUndeclared())] == [True, False, False, False]
    cfg = lambda mode: SimpleNamespace(trainer=SimpleNamespace(fsdp_growth=mode))  # noqa: E731
    assert sharded_path(cfg("auto"), Declared()) and not sharded_path(cfg("auto"), Undeclared())
    assert {"ligo", "upcycle"}.isdisjoint(declared())
    assert {"zero", "svd", "stack", "llama_pro", "dus", "msg", "hyperclone"} <= set(declared())


@pytest.mark.parametrize("case", ["all", "N"])
def test_a_plugin_declared_by_units_grows_by_units_as_the_whole_growth_float64(case):
    assert_units_are_whole(trained_like(BASE.replace(d_ff=25, tie_embeddings=False)), grown_target("zero", case),
                           Declared())


@pytest.mark.parametrize("case", CASES)
@pytest.mark.parametrize("name", PLAIN)
def test_a_growth_by_units_is_the_whole_growth_float64(name, case):
    assert_units_are_whole(trained_like(BASE.replace(d_ff=25, tie_embeddings=False)), grown_target(name, case), name)


@pytest.mark.parametrize("name", [n for n in PLAIN if n != "hyperclone"])
def test_a_second_growth_by_units_is_the_whole_growth_float64(name):
    """A grown model (msg: its masks mid-ramp, which only the unit's own layers may read) grown again."""
    model = trained_like(BASE.replace(d_ff=25, tie_embeddings=False))
    mid = grow(model, target("all", model.config), name, generator=gen(1), stage=1).model
    assert_units_are_whole(mid, mid.config.replace(d_model=40, d_ff=61, n_layers=6, n_heads=4, d_qk=9, d_v=11), name)


@pytest.mark.parametrize("variant", ["default", "constraint"])
def test_vt_by_units_carries_births_and_rates_from_growth_to_growth_float64(variant):
    """vt's second growth: the first's per-element births (stages 0 and 1 in one tensor), Eq. 5's rates
    over three stages, Table 1's factors (or the constraint variant's, from each tensor's own entries)."""
    vt = get_strategy("vt", variant=variant)
    model = trained_like(BASE.replace(d_ff=25, tie_embeddings=False))
    first = grow(model, target("all", model.config), vt, generator=gen(1), stage=1)
    tgt = first.model.config.replace(d_model=40, d_ff=61, n_layers=6, n_heads=4, d_qk=9, d_v=11)
    assert_units_are_whole(first.model, tgt, vt, stage=2, state=first.state)
    whole = grow(first.model, tgt, vt, generator=gen(3), stage=2, state=first.state)
    assert {0, 1, 2} <= set(whole.lr_multipliers["layers.0.mlp.fc1.weight"])


def test_units_hold_one_block_each_and_stack_reads_the_block_it_copies():
    stack = get_strategy("stack", order="repeat")
    units = plan_units(stack, BASE, BASE.replace(n_layers=4))
    assert [(sorted(u.old), sorted(u.new), sorted(u.grown), u.root) for u in units] == \
        [([], [], [], True), ([0], [], [0], False), ([1], [], [1], False), ([0], [2], [2], False),
         ([1], [3], [3], False)]


# svd: d_k grows in every case (its own growth), with each other dimension (h: the statistics on the model
# grown to the new h by units), and each of its modes and rules for the existing columns
SVD_CASES = {"k": {}, **{c: {} for c in ["h", "v", "p", "E", "N", "all"]}, "refactor": dict(mode="refactor"),
             "seed004": dict(update_existing="seed004"), "projected": dict(update_existing="projected"),
             "rope": dict(positions="rope", rope_dim=8), "gqa": dict(n_kv_heads=1), "stack": dict(base="stack"),
             "vt": dict(base="vt")}  # vt's Eq. 5 rates revised on the chosen rows

SHAPE = ("positions", "rope_dim", "n_kv_heads")  # of the model; the rest are svd's options


def svd_by_units(model, tgt, batches, options):
    """svd's growth by units as `grow.fsdp_growth.sharded.grow_sharded` runs it: statistics on the model about
    to grow k (grown by units to the new h first where h grows), the units, the line search on the grown
    model."""
    strategy = get_strategy("svd", **options)
    mid_cfg = passes.before_k(model.config, tgt)
    stats_on = model
    if mid_cfg.d_model != model.config.d_model:
        kept, out = by_units(model, mid_cfg, passes.BeforeK(strategy))
        stats_on = built(mid_cfg, kept, out)
    passes.prepare(strategy, stats_on, model.config, tgt, batches, generator=gen(3), stage=1)
    kept, out = by_units(model, tgt, strategy)
    grown = built(tgt, kept, out)
    metrics, flops = passes.finish(strategy, grown, out.result)
    out.result.metrics.update(metrics)
    return grown, out.result, flops


@pytest.mark.parametrize("case", list(SVD_CASES))
def test_svd_by_units_is_the_whole_growth_float64(case):
    options = {"gamma": 0.4, **{k: v for k, v in SVD_CASES[case].items() if k not in SHAPE}}
    shape = {k: v for k, v in SVD_CASES[case].items() if k in SHAPE}
    model = trained_like(BASE.replace(d_ff=25, tie_embeddings=False, **shape))
    dims = {"stack": "N", "vt": "all"}.get(case, case)  # stack's copies of old blocks, each with its old rows
    tgt = (target(dims, model.config) if dims in CASES and dims != "k" else model.config).replace(d_qk=8)
    batches = make_batches(6, cfg=model.config)
    whole = grow(model, tgt, get_strategy("svd", **options), batch=batches, generator=gen(3), stage=1)
    grown, res, flops = svd_by_units(model, tgt, batches, options)
    want = whole.model.state_dict()
    got = grown.state_dict()
    assert sorted(got) == sorted(want)
    worst = max(float((got[n] - want[n]).abs().max()) for n in want if isinstance(want[n], torch.Tensor))
    assert worst <= 1e-12, worst
    assert res.metrics.keys() == whole.metrics.keys()
    assert res.metrics["svd/gamma"] > 0 or case == "auto"
    timed = ("svd/stats_seconds", "svd/linesearch_seconds", "svd/seconds")
    assert all(res.metrics[k] == pytest.approx(v, rel=1e-12, abs=1e-12) for k, v in whole.metrics.items() if k not in timed)
    assert res.fresh == whole.fresh and same(res.rescaled, whole.rescaled)
    assert res.flops + flops == pytest.approx(whole.flops, rel=1e-12)
    assert same(res.state, whole.state)  # vt's births and zero-born stages
    rates = res.lr_multipliers or {}
    assert sorted(rates) == sorted(whole.lr_multipliers or {})
    assert all(rates[n][k] == pytest.approx(v, rel=1e-12) for n, per in (whole.lr_multipliers or {}).items()
               for k, v in per.items())


@pytest.mark.parametrize("mode", ["auto", "sharded"])
@pytest.mark.parametrize("base", ["zero", "vt"])
def test_svd_takes_the_sharded_path_over_zero_and_over_vt(mode, base):
    """trainer.fsdp_growth=sharded accepts svd (refused while its passes needed the whole model), over vt
    too (refused while vt's Eq. 5 rates were read from the whole model after svd's rows); auto takes it."""
    run = load(make_cfg("+schedule=exp", "strategy=svd", f"strategy.base={base}", f"trainer.fsdp_growth={mode}"))
    assert sharded_path(run, run.growth_strategy)


@pytest.mark.parametrize("case", CASES)
@pytest.mark.parametrize("name", [n for n in PLAIN if n != "vt"])  # vt's own parameterization: not under mup
def test_a_mup_growth_by_units_is_the_whole_growth_float64(name, case):
    """Under mup (W_out x m'/m and its multiplier / (m'/m) in the root unit; new hidden weights at sigma/sqrt(m'))."""
    base = BASE.replace(d_ff=25, tie_embeddings=False, parametrization="mup", mup_base_width=8)
    tgt = grown_target(name, case).replace(parametrization="mup", mup_base_width=8)
    assert_units_are_whole(trained_like(base), tgt, name)


@pytest.mark.parametrize("overrides", [["strategy=vt"], ["strategy=zero", "model.parametrization=mup",
                                                         "model.mup_base_width=16"]], ids=["vt", "mup"])
def test_vt_and_mup_runs_grow_by_units_under_fsdp(tmp_path, monkeypatch, capsys, overrides):
    """``trainer.fsdp_growth=sharded`` is taken (no longer refused), and ``auto`` chooses it."""
    monkeypatch.chdir(tmp_path)
    argv = ["schedule", "+schedule=exp", "model=tiny", *TINY_DATA, *overrides, "trainer.fsdp_growth=sharded"]
    try:
        cli.main(argv)
    except SystemExit as stop:
        assert not stop.code, capsys.readouterr().err
    auto = SimpleNamespace(trainer=SimpleNamespace(fsdp_growth="auto"))
    assert sharded_path(auto, get_strategy(overrides[0].split("=")[1]))


def test_the_grown_model_is_allocated_and_filled_one_unit_at_a_time(monkeypatch):
    """`grow.fsdp_growth.sharded._filled` (FSDP2's sharding left out: one rank's rows are the whole tensors): the root's
    own modules are allocated and filled first, then each block, and when a block is allocated the rows of every
    unit before it are already freed, so the rows and the grown model are not held whole at once; the model
    equals the rows (a tied W_out under both names; FSDP2's DTensors keep the tie, tests/test_fsdp.py)."""
    from dataclasses import replace

    from grow.fsdp_growth.sharded import _filled
    from grow.growth import GrowthResult
    from grow.growth.units import UnitsResult
    from grow.model import Transformer
    from grow.parallel import fsdp

    cfg = replace(BASE, n_layers=3, tie_embeddings=True)
    want = Transformer(cfg).double()
    rows = {k: v.clone() for k, v in want.state_dict().items() if isinstance(v, torch.Tensor)}
    out = UnitsResult(GrowthResult(model=None, param_map={}), skeleton={k: v.to("meta") for k, v in rows.items()},
                      mults={n: m.mult for n, m in want.named_modules() if isinstance(m, Linear)})
    monkeypatch.setattr(fsdp, "apply_fully_shard", lambda model, device, **kw: model)
    seen, to_empty = [], torch.nn.Module.to_empty

    def record(module, *, device, recurse=True):
        seen.append((type(module).__name__, {k.split(".")[1] for k in rows if k.startswith("layers.")}))
        return to_empty(module, device=device, recurse=recurse)

    monkeypatch.setattr(torch.nn.Module, "to_empty", record)
    got = _filled(cfg, out, torch.device("cpu"), fsdp.ShardOptions(torch.float64, None, True), rows)
    blocks = [left for kind, left in seen if kind == "Block"]
    assert [kind for kind, _ in seen][-3:] == ["Block"] * 3 and blocks == [{"0", "1", "2"}, {"1", "2"}, {"2"}]
    sd = got.state_dict()
    assert not rows and all(torch.equal(sd[k], v) for k, v in want.state_dict().items() if isinstance(v, torch.Tensor))
