"""A growth of a training run's model and optimizer between two stages, in one process, on rank 0's
host, or by units on every rank (`grow.fsdp_growth.sharded`); what it takes of the run is a
`GrowthInputs`, never the trainer. `grow.train.Trainer.grow_into` evaluates around it and records it.
The contracts: docs/design.md "How a run flows" (the growth step) and "FSDP2" (a sharded growth).
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field

import torch

from grow import mup, rss
from grow.device import to_device
from grow.faults import kill_point
from grow.fsdp_growth import sharded
from grow.growth import Passes, grow
from grow.growth.stack import BlockCopies
from grow.optim import build_optimizer
from grow.parallel import distributed, fsdp
from grow.steps import growth_batches


@dataclass
class GrowthInputs:
    """What a growth reads of the run: its config, precision and data (the growth batches), the run's
    one strategy and its state, and the model and optimizer it grows."""

    cfg: object  # grow.run.Run
    precision: object  # grow.device.Precision
    data: object
    strategy: object  # grow.growth.Strategy
    strategy_state: dict
    model: object
    opt: object


@dataclass
class GrowthInfo:
    """What the trainer keeps of a growth done on another rank (`grow_sharded`)."""

    state: dict
    flops: float
    metrics: dict
    phases: dict[str, float] = field(default_factory=dict)  # seconds by phase (rank 0's: gather, grow, shard)


def grow_model(g: GrowthInputs, stage, gen, *, host: bool):
    """The growth into ``stage`` of ``g.model`` and ``g.opt`` (moved onto the grown parameters):
    (grown model, `grow.growth.GrowthResult`). ``host``: the one-process growth on rank 0's host
    of an FSDP run (`grow_on_host`): the whole growth batches, no reduction, no autocast."""
    p, t, model, opt = g.precision, g.cfg.trainer, g.model, g.opt
    batches = growth_batches(g.data, g.cfg.seed, stage.index, t.growth_batches, t.batch_size, model.config.seq_len)
    device = torch.device("cpu") if host else p.device
    batches = [to_device(b if host else distributed.shard_batch(b), device) for b in batches]
    # a strategy's passes run under the training's autocast, their sums over all ranks
    reduce = distributed.all_reduce_sum if distributed.is_initialized() and not host else None
    passes = Passes(amp=None if host else p.amp, reduce=reduce)
    res = grow(model, stage.cfg, strategy=g.strategy, batch=batches, generator=gen,  # the run's one strategy
               stage=stage.index, state=g.strategy_state, passes=passes)
    new_model = res.model.to(device)
    kill_point("growth")
    param_map = res.param_map
    if t.train_new_only:  # only what the growth created trains: the rest frozen, its optimizer state dropped
        freeze_all_but(new_model, born_at(res.param_map, new_model))
        opt.forget(list(opt.params))
        param_map = {}
    opt.grow(list(new_model.named_parameters()), param_map, stage.index,
             on_growth=g.cfg.optim.on_growth, fresh=res.fresh,
             rescaled=res.rescaled)  # kept moments follow the strategy's compensated rescalings
    set_growth_rates(g, opt, res, stage)
    return new_model, res


def set_growth_rates(g: GrowthInputs, opt, res, stage) -> None:
    """The learning-rate multipliers a growth into ``stage`` sets on the grown optimizer ``opt``
    (in one process, on rank 0's host, or by units on every rank: `grow.fsdp_growth.sharded`)."""
    g.strategy.after_growth(opt, res, g.cfg.optim.name)  # vt under SGD: Eq. 5's rates
    if mup.is_mup(stage.cfg):  # every hidden matrix at the grown width's eta / m' (grow/mup.py)
        opt.set_lr_multipliers(mup.lr_multipliers(stage.cfg, opt.params, stage.index))


def grow_sharded(g: GrowthInputs, stage, gen):
    """A growth under FSDP (docs/fsdp.md "A growth"), by units on every rank (`grow.fsdp_growth.sharded`) or
    on rank 0's host (`grow_on_host`), as ``trainer.fsdp_growth`` says: (model, optimizer,
    `GrowthInfo`) on every rank."""
    if sharded.sharded_path(g.cfg, g.strategy):
        model, opt, res, phases = sharded.grow_sharded(g, stage, gen)
        set_growth_rates(g, opt, res, stage)  # per parameter: vt's Eq. 5 under SGD, mup's 1/m
        return model, opt, GrowthInfo(res.state, float(res.flops), dict(res.metrics), phases)
    return grow_on_host(g, stage, gen)


def grow_on_host(g: GrowthInputs, stage, gen):
    """The model and optimizer gathered on rank 0's host, grown there as one process grows them
    (`grow_model`), sharded again (`shard`)."""
    t0 = time.perf_counter()
    plain, opt_state = fsdp.gather(g.model), fsdp.gather_optimizer(g.opt)
    t1 = time.perf_counter()
    grown = opt = info = None
    if distributed.is_main():
        opt = build_optimizer(plain, g.cfg.optim, compile=False)
        opt.load_state_dict(opt_state)
        host = GrowthInputs(g.cfg, g.precision, g.data, g.strategy, g.strategy_state, plain, opt)
        grown, res = grow_model(host, stage, gen, host=True)
        info = GrowthInfo(res.state, float(res.flops), dict(res.metrics),
                          {"gather": t1 - t0, "grow": time.perf_counter() - t1})
    info = distributed.broadcast_object(info)
    t2 = time.perf_counter()
    model, opt = shard(g.cfg, g.precision, grown, opt.state_dict() if opt is not None else None)
    info.phases = {"gather": t1 - t0, "grow": t2 - t1, "shard": time.perf_counter() - t2}
    return model, opt, info


def shard(cfg, precision, plain, opt_state: dict | None):
    """(the FSDP2 model, its optimizer) of rank 0's plain model and optimizer state dict (None on
    the other ranks; None everywhere: a fresh optimizer), `grow.parallel.fsdp`."""
    model = fsdp.shard(plain, precision.device, fsdp.ShardOptions.of(cfg, precision))
    opt = build_optimizer(model, cfg.optim, compile=cfg.trainer.compile)
    if distributed.broadcast_object(opt_state is not None):
        hyper = opt.hyperparameters()
        fsdp.shard_optimizer(opt, opt_state)
        opt.set_hyperparameters(hyper)
    return model, opt


def sharded_growth_measures(info: GrowthInfo, peak_mb: float | None) -> dict:
    """A sharded growth's records: ``growth/seconds_<phase>`` and every rank's peak resident memory
    (`grow.rss.peaks_by_rank`: every rank takes part; none where ``peak_mb`` is None)."""
    return {**{f"growth/seconds_{k}": v for k, v in info.phases.items()}, **rss.peaks_by_rank(peak_mb)}


def recipe_rows(cfg, strategy, model, before_cfg) -> list[tuple[str, str]]:
    """What a growth's panel says of how it was made, besides the strategy's figures: which old layer each layer
    copies (a strategy of block copies: G_stack's repeat, MIDAS's middle block, LLaMA Pro, depth up-scaling), the
    layers that train after it (``trainer.train_new_only``), and what the optimizer does to old and new entries."""
    rows = []
    n_old, n_new = before_cfg.n_layers, model.config.n_layers
    if isinstance(strategy, BlockCopies) and n_new != n_old:
        rows.append(("layers", f"copies of old layers {strategy.sources(n_old, n_new)} (layer i of the grown model "
                               f"is a copy of old layer [i])"))
    if cfg.trainer.train_new_only:
        trains = trainable_layers(model)
        rows.append(("trains", f"layers {trains} of {n_new}; the rest frozen (trainer.train_new_only)"))
    o = cfg.optim
    warm = f"; new entries' learning rate warmed up over {o.new_warmup_steps} steps" if o.new_warmup_steps else ""
    rows.append(("optimizer", f"on_growth={o.on_growth}{warm}"))
    return rows


def born_at(param_map, model) -> set[str]:
    """Names of ``model``'s parameters that no old parameter maps to: created whole by the growth (new layers)."""
    mapped = {new for new, _ in param_map.values()}
    return {n for n, _ in model.named_parameters() if n not in mapped}


def freeze_all_but(model, names: set[str]) -> None:
    """``requires_grad`` only for the parameters ``names`` (autograd then skips the others' weight gradients)."""
    for n, p in model.named_parameters():
        p.requires_grad_(n in names)


def trainable_layers(model) -> list[int]:
    """Indices of the layers with a parameter that trains."""
    return sorted({int(n.split(".")[1]) for n, p in model.named_parameters() if p.requires_grad and n.startswith("layers.")})
