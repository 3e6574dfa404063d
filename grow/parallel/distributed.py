"""Several processes, one run: PyTorch's own DDP under ``torchrun`` (docs/distributed.md).

`init` joins the ranks from torchrun's environment; without it everything here is a no-op for one
process (``world_size() == 1``, reductions return their input, `wrap` returns the model). Batch
sharding, bit-identical growth on every rank, rank-0-only output and the one-line handling of dead
or hung peers (``GROW_DIST_TIMEOUT``, ``GROW_DIST_PREP_TIMEOUT``): docs/distributed.md.
"""

from __future__ import annotations

import atexit
import contextlib
import os
import re
import sys
from datetime import datetime, timedelta

import torch
import torch.distributed as dist
from torch.nn.parallel import DistributedDataParallel as DDP

from grow.errors import CONFIG_DIR, ConfigError
from grow.overrides import jobs

ENV_TIMEOUT = "GROW_DIST_TIMEOUT"
ENV_PREP_TIMEOUT = "GROW_DIST_PREP_TIMEOUT"
DEFAULT_TIMEOUT_S = 600.0
DEFAULT_PREP_TIMEOUT_S = 7200.0

_prep_group = None  # a gloo group with the long timeout, for the waits before training
_local_rank = 0


# ---- the environment ----------------------------------------------------------------------------


def _export_submitit_env(env) -> bool:
    """In a multi-task SLURM job started by submitit, set the torchrun variables from SLURM's."""
    if "RANK" in env or env.get("SUBMITIT_EXECUTOR") != "slurm" or int(env.get("SLURM_NTASKS", "1") or 1) <= 1:
        return False
    try:
        from submitit.helpers import TorchDistributedEnvironment
    except ImportError:
        return False
    TorchDistributedEnvironment().export()
    return True


def wants_distributed(env=None) -> bool:
    """True in a process started by ``torchrun`` (or any launcher that sets RANK and WORLD_SIZE)."""
    env = os.environ if env is None else env
    if env is os.environ:
        _export_submitit_env(env)
    return "RANK" in env and "WORLD_SIZE" in env and "MASTER_ADDR" in env and "MASTER_PORT" in env


def _seconds(name: str, default: float) -> float:
    raw = os.environ.get(name)
    if raw in (None, ""):
        return default
    try:
        value = float(raw)
    except ValueError:
        value = -1.0
    if not value > 0:
        raise ConfigError(name, raw, "a number of seconds > 0 (environment variable)")
    return value


def timeout_s() -> float:
    """The bound on every collective of the default group (``GROW_DIST_TIMEOUT``, seconds)."""
    return _seconds(ENV_TIMEOUT, DEFAULT_TIMEOUT_S)


def backend() -> str:
    return "cpu:gloo,cuda:nccl" if torch.cuda.is_available() else "gloo"


def init() -> bool:
    """Join the process group described by the environment (idempotent); False when there is none."""
    global _prep_group, _local_rank

    if dist.is_available() and dist.is_initialized():
        return True
    if not (dist.is_available() and wants_distributed()):
        return False
    _local_rank = int(os.environ.get("LOCAL_RANK", "0"))
    if torch.cuda.is_available():
        torch.cuda.set_device(_local_rank % torch.cuda.device_count())
    dist.init_process_group(backend=backend(), init_method="env://", timeout=timedelta(seconds=timeout_s()))
    _prep_group = dist.new_group(backend="gloo", timeout=timedelta(seconds=_seconds(ENV_PREP_TIMEOUT,
                                                                                      DEFAULT_PREP_TIMEOUT_S)))
    atexit.register(shutdown)
    return True


def shutdown() -> None:
    """Leave the process group (at exit; a no-op when there is none)."""
    global _prep_group

    if dist.is_available() and dist.is_initialized():
        _prep_group = None
        dist.destroy_process_group()


def is_initialized() -> bool:

    return dist.is_available() and dist.is_initialized()


def rank() -> int:

    return dist.get_rank() if is_initialized() else 0


def world_size() -> int:

    return dist.get_world_size() if is_initialized() else 1


def is_main() -> bool:
    """Rank 0 (or the only process): the one that logs, prints and writes."""
    return rank() == 0


def device(dev: torch.device) -> torch.device:
    """This rank's device, with its index: ``cuda`` becomes ``cuda:LOCAL_RANK`` in a multi-process
    run and the current device in one process (``torch.cuda.set_device`` refuses a bare ``cuda``)."""
    if dev.type == "cuda" and dev.index is None:
        index = _local_rank % torch.cuda.device_count() if is_initialized() else torch.cuda.current_device()
        dev = torch.device("cuda", index)
    if dev.type == "cuda":
        torch.cuda.set_device(dev)
    return dev


# ---- collectives ----------------------------------------------------------------------------------


def barrier() -> None:

    if is_initialized():
        dist.barrier()


def all_reduce_sum(tensors) -> None:
    """Sum each tensor across ranks, in place (the ``reduce`` hook of data-driven strategies)."""
    if not is_initialized():
        return
    for t in tensors:
        dist.all_reduce(t, op=dist.ReduceOp.SUM)


def sum_float(x: float) -> float:
    """The sum of a Python float over ranks (float64 on CPU: gloo)."""
    if not is_initialized():
        return x
    t = torch.tensor([x], dtype=torch.float64)
    all_reduce_sum([t])
    return float(t)


def global_mean(local_mean: torch.Tensor, n_local: int, n_total: int) -> float:
    """The mean over all ranks' rows of a per-rank mean over ``n_local`` rows (``n_total`` in all)."""
    if not is_initialized():
        return float(local_mean)
    return sum_float(float(local_mean) * n_local) / n_total


def broadcast_object(obj):
    """Rank 0's ``obj`` on every rank (over the gloo preparation group)."""
    if not is_initialized():
        return obj
    box = [obj if is_main() else None]
    dist.broadcast_object_list(box, src=0, group=_prep_group)
    return box[0]


def all_gather_object(obj) -> list:
    """Every rank's ``obj``, in rank order (over the gloo preparation group); ``[obj]`` in one process."""
    if not is_initialized():
        return [obj]
    box = [None] * world_size()
    dist.all_gather_object(box, obj, group=_prep_group)
    return box


@contextlib.contextmanager
def main_first():
    """Rank 0 runs the block first (e.g. builds the data cache), then the other ranks run it."""
    if not is_initialized():
        yield
        return
    if not is_main():
        dist.barrier(group=_prep_group)
    yield
    if is_main():
        dist.barrier(group=_prep_group)


def assert_same(model: torch.nn.Module, what: str) -> None:
    """Raise unless every rank holds bit-identical parameters (and Linear multipliers).

    Compares a fingerprint per parameter (sum, sum of squares, a position-weighted sum, in float64)
    gathered from every rank: identical parameters give identical fingerprints on identical hardware."""
    if not is_initialized() or world_size() == 1:
        return
    parts = []
    with torch.no_grad():
        for _, p in model.named_parameters():
            x = p.detach().reshape(-1).to(torch.float64)
            w = torch.arange(1, x.numel() + 1, device=x.device, dtype=torch.float64).remainder_(997.0)
            parts.append(torch.stack([x.sum(), x.square().sum(), (x * w).sum()]))
        mults = [float(m.mult) for m in model.modules() if hasattr(m, "mult")]
        fp = torch.cat([torch.cat(parts).cpu(), torch.tensor(mults, dtype=torch.float64)])
    got = [torch.empty_like(fp) for _ in range(world_size())]
    dist.all_gather(got, fp)
    bad = [r for r, g in enumerate(got) if not torch.equal(g, got[0])]
    if bad:
        raise RuntimeError(f"{what}: ranks {bad} hold different parameters from rank 0 (the growth strategy "
                           f"is not deterministic across ranks)")


# ---- batches ----------------------------------------------------------------------------------------


def shard_range(n: int) -> tuple[int, int]:
    """Rows ``[lo, hi)`` of a global batch of ``n`` rows that this rank computes."""
    r, w = rank(), world_size()
    return r * n // w, (r + 1) * n // w


def loss_scale(n: int) -> float:
    """Factor on this rank's mean loss so that DDP's average of gradients is the global mean's."""
    lo, hi = shard_range(n)
    return (hi - lo) * world_size() / n


def shard_batch(batch):
    """This rank's rows of an ``(inputs, targets)`` batch."""
    lo, hi = shard_range(batch[0].shape[0])
    return tuple(t[lo:hi] for t in batch)


def check_batch(n: int, what: str) -> None:
    """Every rank needs at least one row of every global batch."""
    if n < world_size():
        raise ConfigError(what, n, f"at least the number of ranks ({world_size()}): every rank computes a "
                                   f"shard of each global batch")


def check_world_size(planned: int | None) -> None:
    """A run with ``trainer.world_size`` set runs on that many ranks (the memory plan was made for them)."""
    if planned is not None and planned != world_size():
        raise ConfigError("trainer.world_size", planned, f"null or {world_size()}, the ranks this run was started "
                                                          "with (torchrun --nproc_per_node, SLURM tasks)")


def wrap(model: torch.nn.Module, dev: torch.device) -> torch.nn.Module:
    """``model`` in DistributedDataParallel in a multi-process run (the model itself otherwise)."""
    if not is_initialized():
        return model

    return DDP(model, device_ids=[dev.index] if dev.type == "cuda" else None, gradient_as_bucket_view=True)


# ---- failures -------------------------------------------------------------------------------------

_PEER_MARKERS = ("connection closed", "connection reset", "timed out", "timeout", "broken pipe",
                 "gloo", "nccl", "socket", "peer", "watchdog")


def is_peer_failure(exc: BaseException) -> bool:
    """A failed collective: a peer died (closed connection) or hung (timeout)."""
    if isinstance(exc, getattr(dist, "DistError", ())):  # includes joining the group failing
        return True
    if not is_initialized() or world_size() == 1:
        return False
    return isinstance(exc, RuntimeError) and any(m in str(exc).lower() for m in _PEER_MARKERS)


@contextlib.contextmanager
def peer_errors():
    """A collective that fails because another rank died or hung: one line, exit status 1, no hang."""
    try:
        yield
    except Exception as exc:  # noqa: BLE001 - only peer failures are handled, the rest re-raised
        if not is_peer_failure(exc):
            raise
        first = (str(exc).strip().splitlines() or [type(exc).__name__])[0][:300]
        where = f"{os.environ.get('RANK', rank())}/{os.environ.get('WORLD_SIZE', world_size())}"
        print(f"error: rank {where}: lost contact with the other ranks ({first}); another rank "
              f"died or hung (collective timeout {timeout_s():g}s, {ENV_TIMEOUT}); exiting", file=sys.stderr)
        sys.stdout.flush()
        sys.stderr.flush()
        os._exit(1)


# ---- the run directory ----------------------------------------------------------------------------

_NOW = re.compile(r"\$\{now:([^}]*)\}")


def resolve_now(pattern: str, when: datetime) -> str:
    """``pattern`` with every ``${now:FMT}`` replaced by ``when.strftime(FMT)`` (other interpolations kept)."""
    return _NOW.sub(lambda m: when.strftime(m.group(1)), pattern)


def _dir_key(arg: str) -> str | None:
    key = arg.split("=", 1)[0].lstrip("+~")
    return key if key in ("hydra.run.dir", "hydra.sweep.dir") and "=" in arg else None


def _composed_dirs(config_name: str, argv: list[str]) -> dict[str, str]:
    """The raw (unresolved) ``hydra.run.dir`` / ``hydra.sweep.dir`` of the composed config."""
    from hydra import compose, initialize_config_dir
    from omegaconf import OmegaConf


    args = [a for a in argv if not a.startswith("-") and not _dir_key(a)]
    try:
        job = jobs(args)[0]
        with initialize_config_dir(str(CONFIG_DIR), version_base="1.3"):
            cfg = compose(config_name, overrides=job, return_hydra_config=True)
        hydra_cfg = OmegaConf.to_container(cfg.hydra, resolve=False)
        return {"hydra.run.dir": hydra_cfg["run"]["dir"], "hydra.sweep.dir": hydra_cfg["sweep"]["dir"]}
    except Exception:  # noqa: BLE001 - e.g. a launcher plugin not installed here: use train.yaml's
        raw = OmegaConf.load(CONFIG_DIR / f"{config_name}.yaml").hydra
        return {"hydra.run.dir": raw.run.dir, "hydra.sweep.dir": raw.sweep.dir}


def _quote(value: str) -> str:
    return "'" + value.replace("\\", "\\\\").replace("'", "\\'") + "'"


def hydra_overrides(config_name: str, argv: list[str]) -> list[str]:
    """Overrides that make every rank's Hydra agree on the run (and sweep) directory.

    Hydra names the run directory with ``${now:...}``, each rank's own clock: ranks started a
    millisecond apart would write to different directories. Rank 0 takes the directory patterns
    (the user's ``hydra.run.dir=`` / ``hydra.sweep.dir=`` if given, else the composed config's),
    replaces each ``${now:FMT}`` with its own clock, and broadcasts the result; every rank then
    passes it as an override. A user's own pattern in ``argv`` is rewritten in place (it comes
    after these overrides on the command line and would win). Ranks other than 0 also get
    ``hydra.output_subdir=null``: they write nothing, not even Hydra's ``.hydra/``."""
    if not is_initialized():
        return []
    agreed = None
    if is_main():
        dirs = _composed_dirs(config_name, argv)
        for a in argv:
            if _dir_key(a):
                value = a.split("=", 1)[1]
                if len(value) >= 2 and value[0] == value[-1] and value[0] in "'\"":
                    value = value[1:-1]
                dirs[_dir_key(a)] = value
        when = datetime.now()
        agreed = {k: resolve_now(v, when) for k, v in dirs.items()}
    agreed = broadcast_object(agreed)
    out = []
    for key, value in agreed.items():
        at = [i for i, a in enumerate(argv) if _dir_key(a) == key]
        for i in at:
            argv[i] = f"{argv[i].split('=', 1)[0]}={_quote(value)}"
        if not at:
            out.append(f"{key}={_quote(value)}")
    if not is_main():
        out.append("hydra.output_subdir=null")
    return out
