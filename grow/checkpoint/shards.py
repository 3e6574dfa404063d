"""Sharded checkpoints of an FSDP run (``trainer.parallel=fsdp``, docs/distributed.md, "FSDP2", docs/fsdp.md).

Beside the usual ``ckpt-<...>.pt`` and its manifest (`grow.checkpoint.files`), a ``ckpt-<...>.dcp``
directory written by `torch.distributed.checkpoint` holds every rank's rows of the sharded tensors;
the ``.pt`` keeps what is small or not sharded and names the directory. Atomic: the ranks write
``.ckpt-<...>.dcp.tmp``, rank 0 renames it, then writes the ``.pt`` and the manifest last. `read`
gives every tensor whole in one process (DCP's ``no_dist`` load), so any number of ranks resumes,
samples, evaluates or exports it.
"""

from __future__ import annotations

import os
import shutil
import warnings
from pathlib import Path

import torch

from grow.faults import kill_point
from grow.parallel import distributed
from grow.parallel.fsdp import is_sharded, optimizer_tensors

SUFFIX = ".dcp"
MODEL, OPTIM = "model/", "optim/"


def dir_name(stem: str) -> str:
    return f"{stem}{SUFFIX}"


def split(model, opt) -> tuple[dict, dict, dict]:
    """(the sharded tensors for DCP, the model's other state on rank 0's host, the optimizer's state
    dict without its tensors): every rank takes part."""
    tensors, rest = {}, {}
    for key, value in model.state_dict().items():
        if is_sharded(value):
            tensors[MODEL + key] = value
        elif distributed.is_main():
            rest[key] = value.detach().cpu() if isinstance(value, torch.Tensor) else value
    for name, b, t in optimizer_tensors(opt):
        tensors[f"{OPTIM}{name}/{b}"] = t
    sd = opt.state_dict()
    return tensors, rest, {**sd, "state": {n: {} for n in sd["state"]}}


def write(ckpt_dir: Path, stem: str, tensors: dict) -> dict:
    """Every rank writes its shards of ``tensors`` into ``ckpt_dir/<stem>.dcp`` (atomically, above);
    returns ``{file: bytes}`` of the directory (rank 0; the manifest records it)."""
    import torch.distributed.checkpoint as dcp

    final, tmp = ckpt_dir / dir_name(stem), ckpt_dir / f".{dir_name(stem)}.tmp"
    if distributed.is_main():
        ckpt_dir.mkdir(parents=True, exist_ok=True)
        shutil.rmtree(tmp, ignore_errors=True)
        tmp.mkdir()
    distributed.barrier()
    dcp.save(tensors, checkpoint_id=str(tmp))
    distributed.barrier()
    files = {}
    if distributed.is_main():
        kill_point("ckpt.shards")
        for p in tmp.iterdir():
            with open(p, "rb") as f:
                os.fsync(f.fileno())
        shutil.rmtree(final, ignore_errors=True)  # rewriting a position
        os.replace(tmp, final)
        files = {p.name: p.stat().st_size for p in sorted(final.iterdir())}
    return files


def check(path: Path, files: dict) -> str | None:
    """What is wrong with the shard directory ``path`` against its manifest's ``files`` (None: nothing)."""
    if not path.is_dir():
        return f"its shard directory {path.name} is missing"
    for name, size in files.items():
        f = path / name
        if not f.is_file():
            return f"shard file {name} is missing"
        if f.stat().st_size != int(size):
            return f"shard file {name} has {f.stat().st_size} bytes, its manifest says {size}"
    return None


def read(path: Path) -> dict:
    """Every tensor of a shard directory, whole, on the host (one process; DCP reassembles the rows)."""
    import torch.distributed.checkpoint as dcp
    from torch.distributed.checkpoint.metadata import TensorStorageMetadata

    reader = dcp.FileSystemReader(str(path))
    meta = reader.read_metadata().state_dict_metadata
    out = {k: torch.empty(tuple(m.size), dtype=m.properties.dtype) for k, m in meta.items()
           if isinstance(m, TensorStorageMetadata)}
    with warnings.catch_warnings():  # "assuming the intent is to load in a single process": it is
        warnings.filterwarnings("ignore", message=".*single process.*", category=UserWarning)
        dcp.load(out, storage_reader=reader, no_dist=True)
    return out


def merge(payload: dict, tensors: dict) -> dict:
    """The payload of a plain checkpoint: the shards' whole tensors put back in their places."""
    for key, t in tensors.items():
        if key.startswith(MODEL):
            payload["model"][key[len(MODEL):]] = t
        else:
            name, _, b = key[len(OPTIM):].rpartition("/")
            payload["optimizer"]["state"][name][b] = t
    return payload


def prune(ckpt_dir: Path, kept: set[str]) -> None:
    """Remove shard directories of checkpoints not in ``kept`` (stems) and unfinished temporaries."""
    for p in ckpt_dir.glob(f"ckpt-*{SUFFIX}"):
        if p.name[: -len(SUFFIX)] not in kept:
            shutil.rmtree(p, ignore_errors=True)
    for p in ckpt_dir.glob(f".ckpt-*{SUFFIX}.tmp"):
        shutil.rmtree(p, ignore_errors=True)
