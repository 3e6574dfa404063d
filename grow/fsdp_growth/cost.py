"""The cost of one growth under FSDP, per path of ``trainer.fsdp_growth`` (docs/distributed.md, "FSDP2", the formulas;
docs/fsdp.md "Cost of a growth at 7B", the figures): what each rank holds at the growth's peak, the bytes
its link and rank 0's PCIe carry, and their seconds at stated bandwidths. ``host``: the model and its
optimizer state gathered on rank 0's host, grown there, scattered back; ``sharded``: every rank gathers
one unit (a block, the root) at a time, grows it whole on its device and keeps its own rows."""

from __future__ import annotations

import os
from dataclasses import dataclass

import torch

from grow.console import fmt_num
from grow.errors import ConfigError
from grow.growth.base import Strategy, available, get_strategy, strategy_class
from grow.memory import GiB, activation_bytes_per_token, optimizer_kind, state_bytes, units
from grow.model import Transformer, TransformerConfig
from grow.parallel import distributed

PATHS = ("host", "sharded")
# Assumptions (bytes/s), docs/fsdp.md says where each comes from.
NVLINK = 450e9      # an H100 SXM's NVLink 4, one direction (900 GB/s both): the bus bandwidth of a ring in a node
INFINIBAND = 50e9   # one 400 Gb/s NDR NIC per GPU (8 per node): the bus bandwidth across nodes
PCIE = 25e9         # pageable host <-> device copies (`.cpu()`, `.to(device)`) on PCIe Gen5 x16 (64 GB/s line rate)
HBM = 3.35e12       # an H100 SXM's memory bandwidth (datasheet)
DEVICE_PASSES = 4   # sharded: passes over a unit's old and grown states on the device (read, draw, write, move)
# Measured (docs/bench/fsdp-growth-cpu-2026-11-26/, scripts/fsdp_growth_memory.py): the host path's grow phase
# per grown parameter, and a float32 matmul, on one thread of a 2-core Xeon (torchrun sets OMP_NUM_THREADS=1)
HOST_SECONDS_PER_PARAM = 6.895e-8
HOST_FLOPS = 84.5e9
MFU = 0.409         # docs/bench/h200-2026-11-26/gpu_check.json: gpt-124m's last stage, bf16, torch.compile


@dataclass(frozen=True)
class GrowthCost:
    """One growth on one of ``world`` ranks under ``path``, in bytes (see the module docstring)."""

    path: str
    states: int       # the old and the grown model and optimizer state, whole
    shards: int       # each rank's rows of the old and the grown model and optimizer state (both alive at once)
    transient: int    # each rank, beside its shards: one whole tensor (host) or one unit old and grown (sharded),
                      # a block's beside the root's weights
    rank0_host: int   # rank 0's host: the gathered old model and state, the host optimizer's copy, the grown ones
    link: int         # bytes through each rank's link, one direction: all-gathers received, rank 0's scatter sent
    pcie: int         # bytes over rank 0's PCIe (device -> host and back); 0 on a CPU run

    @property
    def device_peak(self) -> int:
        """Each rank's peak on its device (a GPU run)."""
        return self.shards + self.transient

    def host_peak(self, rank: int) -> int:
        """Rank ``rank``'s peak on its host when the device is the host (a CPU run, as measured here)."""
        return self.device_peak + (self.rank0_host if rank == 0 else 0)


def largest_tensor(cfg: TransformerConfig) -> int:
    """Elements of ``cfg``'s largest parameter (the model built on the meta device)."""
    with torch.device("meta"):
        return max(p.numel() for p in Transformer(cfg).parameters())


def growth_cost(old: TransformerConfig, new: TransformerConfig, world: int, path: str, *,
                optimizer: str = "adamw", param_dtype=torch.float32, gpu: bool = True) -> GrowthCost:
    """`GrowthCost` of growing ``old`` into ``new`` on ``world`` ranks (``gpu``: the shards live on
    devices and rank 0's copies cross PCIe)."""
    if path not in PATHS:
        raise ValueError(f"path: one of {', '.join(PATHS)}, not {path!r}")
    s, w = state_bytes(optimizer, param_dtype), param_dtype.itemsize
    p_old, p_new = old.num_params(), new.num_params()
    shards = -(-s * p_old // world) + -(-s * p_new // world)
    gathered = (world - 1) * s * p_old // world  # every unit (host: every tensor) of the old state, all-gathered
    if path == "host":
        rank0 = p_old * (w + 2 * (s - w)) + s * p_new
        transient = w * max(largest_tensor(old), largest_tensor(new))
        link = gathered + (world - 1) * s * p_new // world
        return GrowthCost(path, s * (p_old + p_new), shards, transient, rank0, link, s * (p_old + p_new) if gpu else 0)
    (r_old, b_old), (r_new, b_new) = units(old), units(new)
    # the root's unit whole with its state, then a block's with its state (the root's weights freed by then;
    # its masks, vectors, left out)
    transient = max(s * (r_old + r_new), s * (b_old + b_new))
    return GrowthCost(path, s * (p_old + p_new), shards, transient, 0, gathered, 0)


def stats_pass_seconds(flops: float, world: int, flops_per_s: float) -> float:
    """A data-parallel pass of ``flops`` in all on ``world`` ranks of ``flops_per_s`` each."""
    return flops / (world * flops_per_s)


def plan_growth_costs(run, plan, world: int, *, gpu: bool = True) -> list[dict]:
    """Per growth of ``plan`` (stage i -> i+1), `growth_cost` under each path: rows for `grow schedule`."""
    stages = list(plan)
    return [{"growth": f"{a.index + 1} -> {b.index + 1}",
             **{p: growth_cost(a.cfg, b.cfg, world, p, optimizer=optimizer_kind(run.optim), gpu=gpu) for p in PATHS}}
            for a, b in zip(stages, stages[1:])]


def format_growth_memory(rows: list[dict], world: int, gpu: bool):
    """The growths' peak memory per rank under both paths, as a rich table (`grow schedule`)."""
    from rich.table import Table

    cols = (("host: rank 0's host RAM", "host: each GPU", "sharded: each GPU") if gpu else
            ("host: rank 0", "host: other ranks", "sharded: each rank"))
    t = Table(title=f"peak memory of a growth per rank of {world}, FSDP (estimate; trainer.fsdp_growth=host | "
                    f"sharded), and the bytes each rank's link carries")
    for col in ("growth", *cols, "host: link", "sharded: link"):
        t.add_column(col, justify="right")
    for r in rows:
        h, s = r["host"], r["sharded"]
        first = h.rank0_host if gpu else h.host_peak(0)
        t.add_row(r["growth"], *(f"{b / GiB:.2f} GiB" for b in (first, h.device_peak, s.device_peak, h.link, s.link)))
    return t


@dataclass(frozen=True)
class Rates:
    """What the seconds of a growth are computed at (bytes/s, FLOP/s, seconds per parameter)."""

    link: float = NVLINK
    pcie: float = PCIE
    hbm: float = HBM
    host_seconds_per_param: float = HOST_SECONDS_PER_PARAM
    host_flops: float = HOST_FLOPS
    device_flops: float = MFU * 989e12  # an H100 SXM's dense bf16 peak, grow.device.PEAK_BF16_FLOPS


def growth_seconds(cost: GrowthCost, new: TransformerConfig, world: int, rates: Rates,
                   stats_flops: float = 0.0) -> dict[str, float]:
    """Seconds of one growth by part: ``copies`` (link, and PCIe on the host path), ``grow`` (host: rank 0's
    CPU at the measured rate per grown parameter; sharded: `DEVICE_PASSES` over every unit's old and grown
    states at HBM bandwidth, every rank growing each unit whole), ``stats`` (a statistics pass of
    ``stats_flops``: host on rank 0's CPU, sharded data-parallel on the ``world`` devices) and ``total``."""
    if cost.path == "host":
        parts = {"copies": cost.link / rates.link + cost.pcie / rates.pcie,
                 "grow": new.num_params() * rates.host_seconds_per_param,
                 "stats": stats_flops / rates.host_flops}
    else:
        parts = {"copies": cost.link / rates.link,
                 "grow": DEVICE_PASSES * cost.states / rates.hbm,
                 "stats": stats_pass_seconds(stats_flops, world, rates.device_flops)}
    return {**parts, "total": sum(parts.values())}


def _runs_statistics(cls) -> bool:
    return cls.statistics_flops is not Strategy.statistics_flops


def statistics_strategy(run) -> Strategy:
    """The strategy whose statistics pass the table prices: the run's where it declares one
    (`Strategy.statistics_flops`), else the first registered strategy that does (svd), at its YAML's options."""
    if _runs_statistics(type(run.growth_strategy)):
        return run.growth_strategy
    return get_strategy(next(n for n in available() if _runs_statistics(strategy_class(n))))


def stats_pass_flops(run, old: TransformerConfig, new: TransformerConfig) -> float:
    """That strategy's statistics pass were it to run at this growth (svd: were d_k to grow, no new rotary pairs
    counted; its ``batches`` of ``trainer.batch_size`` sequences through ``old`` at ``new``'s width)."""
    return statistics_strategy(run).statistics_flops(old, new, run.trainer.batch_size)


def cost_table(run, plan, world: int) -> str:
    """docs/fsdp.md's table "Cost of a growth at 7B": per growth and path, the memory, the bytes moved, the
    seconds by part at NVLink and at InfiniBand (`Rates`), and whether the growth takes under a minute
    (without, then with svd's statistics pass were d_k to grow there). Bytes in GB (1e9)."""
    head = ["growth", "path", "rank 0's host", "each GPU", "link", "copies (NVLink / IB)", "grow",
            "total (NVLink / IB)", "< 1 min", "svd statistics pass", "< 1 min with it (NVLink)"]
    lines = ["| " + " | ".join(head) + " |", "|" + " --- |" * len(head)]
    stages = list(plan)
    for a, b in zip(stages, stages[1:]):
        stats = stats_pass_flops(run, a.cfg, b.cfg)
        for path in PATHS:
            cost = growth_cost(a.cfg, b.cfg, world, path)
            nv, ib = (growth_seconds(cost, b.cfg, world, Rates(link=bw)) for bw in (NVLINK, INFINIBAND))
            with_stats = growth_seconds(cost, b.cfg, world, Rates(), stats)
            lines.append("| " + " | ".join([
                f"{a.index + 1} → {b.index + 1}", path, f"{cost.rank0_host / 1e9:.1f} GB",
                f"{cost.device_peak / 1e9:.1f} GB", f"{cost.link / 1e9:.1f} GB",
                f"{nv['copies']:.2f} / {ib['copies']:.2f} s", _seconds(nv["grow"]),
                f"{_seconds(nv['total'])} / {_seconds(ib['total'])}", _yes(max(nv["total"], ib["total"]) < 60),
                _seconds(with_stats["stats"]), _yes(with_stats["total"] < 60)]) + " |")
    return "\n".join(lines) + "\n"


# ---- a growth that trains on rank 0's host (`Strategy.host_max_params`: ligo's operator) --------------------


def host_training(strategy: Strategy, source: TransformerConfig, target: TransformerConfig, batch_size: int,
                  growth_batches: int, world: int) -> tuple[float, float]:
    """(GiB on rank 0's host, seconds) of a growth that trains through the whole grown model there (the host
    path): the gathered old and grown models and optimizer states (`growth_cost`), the grown parameters'
    gradients and one batch's activations (`grow.memory.activation_bytes_per_token`); the strategy's
    `Strategy.host_training_flops` at the host's measured one-thread rate."""
    held = growth_cost(source, target, world, "host").rank0_host
    train = 4 * target.num_params() + activation_bytes_per_token(target) * batch_size * target.seq_len
    flops = strategy.host_training_flops(source, target, batch_size, growth_batches)
    return (held + train) / GiB, flops / HOST_FLOPS


def _host_trainer(strategy: Strategy) -> Strategy | None:
    """The strategy, or the base it composes, that trains on the host (declares `Strategy.host_max_params`)."""
    while isinstance(strategy, Strategy):
        if strategy.host_max_params is not None:
            return strategy
        strategy = getattr(strategy, "base", None)
    return None


def _world(trainer) -> int:
    """The ranks of this run: torchrun's WORLD_SIZE, else the ones ``grow schedule`` plans for."""
    return int(os.environ["WORLD_SIZE"]) if distributed.wants_distributed() else int(trainer.world_size or 1)


def check_host(run) -> None:
    """Under FSDP on several ranks with trainer.fsdp_growth=auto, a growth on the host path into a model above its
    strategy's `Strategy.host_max_params` is refused in one line with the memory and time its training would take
    on rank 0's host (`host_training`)."""
    t, trainer = run.trainer, _host_trainer(run.growth_strategy)
    if trainer is None or t.parallel != "fsdp" or t.fsdp_growth != "auto" or _world(t) < 2:
        return
    stages, limit = list(run.plan), trainer.host_max_params
    for a, b in zip(stages, stages[1:]):
        if b.cfg.num_params() > limit:
            gib, seconds = host_training(trainer, a.cfg, b.cfg, t.batch_size, t.growth_batches, _world(t))
            raise ConfigError("trainer.fsdp_growth", "auto", (
                f"host (accepting it) or a strategy that grows by units: strategy={run.strategy.name} does not grow "
                f"by units, and the growth into stage {b.index + 1} ({fmt_num(b.cfg.num_params())} parameters, above "
                f"{fmt_num(limit)}) would train through the whole grown model on rank 0's CPU: {gib:.1f} GiB on "
                f"rank 0's host, ~{_seconds(seconds)} at {HOST_FLOPS / 1e9:.1f} GFLOP/s (one CPU thread, measured: "
                f"grow.fsdp_growth.cost.HOST_FLOPS)"))


def _seconds(x: float) -> str:
    return f"{x:.2f} s" if x < 600 else f"{x / 3600:.1f} h" if x < 3 * 86400 else f"{x / 86400:.0f} days"


def _yes(ok: bool) -> str:
    return "yes" if ok else "no"
