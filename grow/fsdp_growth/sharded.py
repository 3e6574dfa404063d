"""A growth of a sharded model under FSDP, ``trainer.fsdp_growth=sharded`` (docs/distributed.md, "FSDP2",
docs/fsdp.md "A growth"): every rank grows every unit (`grow.growth.units.grow_by_units`), each unit's
tensors and optimizer state gathered whole, and keeps only its own rows of what the unit yields; a
strategy's whole-model passes run around the units (`grow.fsdp_growth.passes`).
"""

from __future__ import annotations

import time

import torch

from grow.device import to_device
from grow.errors import ConfigError
from grow.faults import kill_point
from grow.fsdp_growth import passes
from grow.growth.units import Unit, UnitsResult, declared, grow_by_units, layer_of, supports
from grow.masks import MASK_BUFFERS
from grow.model import Linear, Transformer, TransformerConfig
from grow.optim import build_optimizer
from grow.parallel import distributed, fsdp
from grow.steps import growth_batches


def sharded_path(cfg, strategy) -> bool:
    """``trainer.fsdp_growth``: sharded, host, or auto (sharded where `supports`; mup runs too: their
    rates are per parameter, set on the grown optimizer by `grow.growing.set_growth_rates`)."""
    mode = cfg.trainer.fsdp_growth
    return mode == "sharded" or (mode == "auto" and supports(strategy))


def check(run) -> None:
    """``trainer.fsdp_growth=sharded`` with a run (`grow.run.Run`) whose growths need the whole model: one line."""
    if run.trainer.fsdp_growth == "sharded" and run.grows and not supports(run.growth_strategy):
        raise ConfigError("trainer.fsdp_growth", "sharded",
                          f"host or auto for strategy={run.strategy.name} (grown by units: {', '.join(declared())})")


def _rows(t: torch.Tensor) -> torch.Tensor:
    """This rank's rows of a whole tensor as FSDP2 shards it (dim 0 in `torch.chunk`'s pieces), a copy."""
    pieces = torch.chunk(t, distributed.world_size(), dim=0)
    rank = distributed.rank()
    return pieces[rank].clone() if rank < len(pieces) else t.new_empty((0, *t.shape[1:]))


class _Named:
    """A module-like view of some named parameters, for `grow.optim.build_optimizer`."""

    def __init__(self, named):
        self.named = list(named)

    def named_parameters(self):
        return iter(self.named)

    def parameters(self):
        return iter(p for _, p in self.named)


class ShardedGrowth:
    """One growth of a sharded model and its optimizer by units (`grow_by_units` on every rank): each
    unit gathered whole (its parameters and their optimizer buffers and births), grown, and only this
    rank's rows of what it yields kept. ``phases``: seconds gathering, growing (each unit's model built and
    grown, its optimizer state moved), sharding."""

    def __init__(self, model, opt, optim_cfg, *, stage: int, on_growth: str, device):
        self.model, self.opt, self.optim_cfg = model, opt, optim_cfg
        self.stage, self.on_growth, self.device = stage, on_growth, device
        self.sd = model.state_dict()
        self.rows: dict[str, torch.Tensor] = {}  # this rank's rows of every grown parameter, whole buffers
        self.opt_rows: dict[str, dict] = {}
        self.head: dict | None = None  # the grown optimizer's state dict without its tensors
        self.multipliers: dict[str, dict] = {}  # the grown optimizer's carried learning-rate multipliers
        self.phases = {"gather": 0.0, "grow": 0.0, "shard": 0.0}
        self.param_names: set[str] = set()  # the grown model's parameters (tied ones under both names)
        self.root: dict[str, torch.Tensor] = {}  # the old root's tensors, gathered once per growth

    def _timed(self, phase: str, t0: float) -> None:
        self.phases[phase] += time.perf_counter() - t0

    def load(self, name: str) -> torch.Tensor:
        """``name``'s tensor whole; the root's gathered once and kept for the units that read it (a unit's
        growth does not modify its input): its weights until the root's unit is grown, its masks to the end."""
        if name in self.root:
            return self.root[name]
        t0, v = time.perf_counter(), self.sd[name]
        full = v.full_tensor() if fsdp.is_sharded(v) else v
        full = full.detach().to(self.device).clone()
        if layer_of(name) is None:
            self.root[name] = full
        self._timed("gather", t0)
        return full

    def keep(self, name: str, t: torch.Tensor) -> None:
        t0 = time.perf_counter()
        self.rows[name] = _rows(t) if name in self.param_names else t.clone()
        self._timed("shard", t0)

    def _gather_opt(self, names: list[str]) -> dict:
        """The optimizer's whole buffers and births of ``names`` (every rank takes part, in order)."""
        from torch.distributed.tensor import DTensor

        t0, state = time.perf_counter(), {}
        for name in names:
            like = self.opt.sharded[name]
            entry = dict(self.opt.state[name], birth=self.opt.birth_stage(name))
            state[name] = {b: DTensor.from_local(t, like.device_mesh, like.placements, shape=like.shape,
                                                 stride=like.stride(), run_check=False).full_tensor()
                           for b, t in entry.items()}
        self._timed("gather", t0)
        return state

    def after(self, unit: Unit, model, res, yields) -> None:
        """The unit's optimizer: the state of the old parameters that grow into what the unit yields
        gathered (not the root's in a block's unit, nor a copied block's), moved onto the grown tensors
        as one process moves it (`GrowthAware.grow`), this rank's rows kept."""
        self.param_names |= {n for n, _ in res.model.named_parameters(remove_duplicate=False)}
        old = [(n, p) for n, p in model.named_parameters()
               if not p.is_meta and n in self.opt.params and yields(res.param_map[n][0])]
        new = [(n, p) for n, p in res.model.named_parameters() if not p.is_meta and p.requires_grad and yields(n)]
        if not old:  # a new block (a copy or not): no old element maps to it, every element new, born now
            return self._fresh(new)
        state = self._gather_opt([n for n, _ in old])
        t0 = time.perf_counter()
        uopt = build_optimizer(_Named(old), self.optim_cfg, compile=False)
        hyper = uopt.hyperparameters()
        uopt.load_state_dict({**self.opt.state_dict(), "state": state})
        uopt.set_hyperparameters(hyper)
        names = {n for n, _ in new}
        uopt.grow(new, {n: res.param_map[n] for n, _ in old}, self.stage, on_growth=self.on_growth,
                  fresh={n for n in res.fresh if n in names},
                  rescaled={n: c for n, c in res.rescaled.items() if n in names})
        self._timed("grow", t0)
        t0 = time.perf_counter()
        self.multipliers.update({n: m for n, m in uopt.multipliers.items() if yields(n)})
        for n, _ in new:
            self.opt_rows[n] = {b: _rows(t) for b, t in {**uopt.state[n], "birth": uopt.birth_stage(n)}.items()}
        if unit.root:
            self.head = {k: v for k, v in uopt.state_dict().items() if k != "state"}
            # the blocks' units read only the root's masks (`unit_model`): its weights are freed now
            self.root = {n: t for n, t in self.root.items() if n.rpartition(".")[2] in MASK_BUFFERS}
        self._timed("shard", t0)

    def _fresh(self, new) -> None:
        for n, p in new:
            self.opt_rows[n] = {**{b: _rows(torch.zeros_like(p)) for b in self.opt._buffer_names},
                                "birth": _rows(torch.full(p.shape, self.stage, dtype=torch.uint8, device=p.device))}

    def build(self, target: TransformerConfig, out: UnitsResult, options, compile: bool):
        """(the grown FSDP2 model, its optimizer) from the rows every unit left on this rank."""
        t0 = time.perf_counter()
        model = _filled(target, out, self.device, options, self.rows)
        opt = build_optimizer(model, self.optim_cfg, compile=compile)
        hyper = opt.hyperparameters()
        state, self.opt_rows = {n: self.opt_rows.pop(n) for n in opt.params}, {}
        opt.load_state_dict({**self.head, "multipliers": self.multipliers, "state": state}, adopt=True)
        del state
        opt.set_hyperparameters(hyper)
        self._timed("shard", t0)
        return model, opt


@torch.no_grad()
def _filled(target: TransformerConfig, out: UnitsResult, device, options, rows: dict):
    """The grown FSDP2 model (`grow.parallel.fsdp.empty`, allocated one FSDP unit at a time) with this rank's ``rows`` of
    its parameters, its buffers whole, every Linear's multiplier from ``out.mults``: each unit's rows copied in
    and freed from ``rows`` as soon as the unit is allocated, so the grown rows and the grown model are held
    together one unit at a time, not whole."""
    done: set[int] = set()

    def fill(model, names: list[str]) -> None:
        params, buffers = dict(model.named_parameters(remove_duplicate=False)), dict(model.named_buffers())
        for name in names:
            t = rows.pop(name, None)
            if t is None:
                continue
            if name not in params:
                buffers[name].copy_(t)
            elif id(params[name]) not in done:  # a tied W_out is the embedding: once
                fsdp.local(params[name]).copy_(t)
                done.add(id(params[name]))

    model = fsdp.empty(target, out.skeleton, device, options, fill=fill)
    if rows:
        raise RuntimeError(f"sharded growth: rows of no grown tensor: {sorted(rows)[:5]}")
    for name, mod in model.named_modules():
        if isinstance(mod, Linear):
            mod.mult = out.mults[name]
    return model


def _statistics_pass(run, g: ShardedGrowth, skeleton: dict, stage, generator) -> None:
    """The strategy's pass before the units (`Strategy.passes_around_units`; svd growing d_k: its statistics),
    data-parallel, on the sharded model about to grow k (the input; where h grows too, the input grown to
    the new h by units, `_before_k`)."""
    cfg, t, model = run.cfg, run.cfg.trainer, run.model
    on = model
    if passes.before_k(model.config, stage.cfg).d_model != model.config.d_model:
        on = _before_k(g, skeleton, stage.cfg, run.strategy, generator, stage.index,
                       fsdp.ShardOptions.of(cfg, run.precision))
    batches = [to_device(b, g.device) for b in growth_batches(run.data, cfg.seed, stage.index, t.growth_batches,
                                                              t.batch_size, model.config.seq_len)]
    t0 = time.perf_counter()
    passes.prepare(run.strategy, on, model.config, stage.cfg, batches, generator=generator, stage=stage.index,
                     amp=run.precision.amp)
    g._timed("grow", t0)


def _before_k(g: ShardedGrowth, skeleton: dict, target: TransformerConfig, strategy, generator, stage: int, options):
    """The sharded model svd's whole growth takes its statistics on (`grow.fsdp_growth.passes.before_k`), grown by units."""
    mid = passes.before_k(g.model.config, target)
    with torch.device("meta"):
        params = {n for n, _ in Transformer(mid).named_parameters(remove_duplicate=False)}
    rows = {}

    def keep(name: str, t: torch.Tensor) -> None:
        rows[name] = _rows(t) if name in params else t.clone()

    out = grow_by_units(g.model.config, skeleton, g.load, mid, passes.BeforeK(strategy), keep,
                        generator=generator, stage=stage)
    return _filled(mid, out, g.device, options, rows)


def grow_sharded(run, stage, generator):
    """A growth of ``run``'s sharded model and optimizer by units (`ShardedGrowth`); ``run`` is a
    `grow.growing.GrowthInputs` (config, precision, data, strategy and its state, model, optimizer): (model,
    optimizer, the growth's `GrowthResult` fields without a model, seconds by phase). The caller sets the
    grown optimizer's learning-rate multipliers (`grow.growing.set_growth_rates`)."""
    cfg, model = run.cfg, run.model
    g = ShardedGrowth(model, run.opt, cfg.optim, stage=stage.index, on_growth=cfg.optim.on_growth,
                      device=run.precision.device)
    skeleton = {k: (tuple(v.shape), v.dtype) if isinstance(v, torch.Tensor) else v for k, v in g.sd.items()}
    around = passes.grows_k(run.strategy, model.config, stage.cfg)  # whole-model passes around the units
    if around:
        _statistics_pass(run, g, skeleton, stage, generator)
    t0, timed = time.perf_counter(), sum(g.phases.values())
    out = grow_by_units(model.config, skeleton, g.load, stage.cfg, run.strategy, g.keep, after=g.after,
                        generator=generator, stage=stage.index, state=run.strategy_state)
    # what the units did besides gathering and keeping rows is growing: each unit's model built and grown
    g.phases["grow"] += time.perf_counter() - t0 - (sum(g.phases.values()) - timed)
    kill_point("growth")
    g.root.clear()
    new_model, opt = g.build(stage.cfg, out, fsdp.ShardOptions.of(cfg, run.precision), cfg.trainer.compile)
    if around:  # svd: gamma's line search on the grown sharded model, the chosen rows into each rank's shards
        t0 = time.perf_counter()
        metrics, flops = passes.finish(run.strategy, new_model, out.result, _rows)
        out.result.metrics.update(metrics)
        out.result.flops += flops
        g._timed("grow", t0)
    return new_model, opt, out.result, g.phases
