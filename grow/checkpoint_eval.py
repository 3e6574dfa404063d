"""``grow eval``: the validation loss and bits per byte of a run's checkpoint on any data config.

The split is tokenized with the run's tokenizer and cut into non-overlapping windows (`windows`);
one JSON line on stdout (`evaluate`), a table on stderr, nothing written; ``harness=<task,...>``
runs lm-evaluation-harness instead (`grow.hf.harness`). docs/design.md, "Commands", "grow eval".
"""

from __future__ import annotations

import json
import math
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import torch
from omegaconf import DictConfig, OmegaConf

from grow import data as data_lib
from grow import runs
from grow.config import ConfigError, positive_int, validate_device
from grow.console import err_console, fmt_num
from grow.data import DataConfig, pysrc
from grow.data.encode import split_stream
from grow.data.sources import documents
from grow.device import autocast
from grow.errors import DataError
from grow.hf import require
from grow.hf.harness import HARNESS_MODULES

SPLITS = ("val", "train")


@dataclass(frozen=True)
class EvalConfig:
    """``grow eval``'s config (configs/eval.yaml), checked once by `from_node`; ``data`` is the data
    config node given on the command line (None: the run's own)."""

    run: str
    ckpt: str | None
    data: DictConfig | None
    split: str
    max_tokens: int | None
    batch_size: int
    device: str
    precision: str
    harness: tuple[str, ...] | None = None  # lm-evaluation-harness tasks (grow.hf.harness) instead of the loss
    harness_limit: int | None = None
    harness_include: Path | None = None

    @classmethod
    def from_node(cls, cfg: DictConfig) -> "EvalConfig":
        """A run with a checkpoint, a valid data config if one is given, settings in range."""
        runs.require_checkpoint(cfg, "grow eval run=<run dir> [data=...]")
        harness = _harness(cfg)
        if cfg.get("data") is not None:
            DataConfig.from_node(cfg.data)
        if cfg.split not in SPLITS:
            raise ConfigError("split", cfg.split, f"must be one of {', '.join(SPLITS)}")
        validate_device(cfg)
        return cls(run=str(cfg.run), ckpt=None if cfg.ckpt is None else str(cfg.ckpt), data=cfg.get("data"),
                   split=str(cfg.split),
                   max_tokens=None if cfg.max_tokens is None else positive_int("max_tokens", cfg.max_tokens),
                   batch_size=positive_int("batch_size", cfg.batch_size), device=str(cfg.device),
                   precision=str(cfg.precision), **harness)


def _harness(cfg: DictConfig) -> dict:
    """The harness keys, checked: tasks as a list, a limit >= 1, an include directory that exists."""
    tasks = cfg.get("harness")
    if tasks is None:
        return {}

    tasks = [t.strip() for t in (tasks.split(",") if isinstance(tasks, str) else list(tasks)) if str(t).strip()]
    if not tasks:
        raise ConfigError("harness", cfg.harness, "name one or more lm-evaluation-harness tasks: harness=arc_easy,piqa")
    include = cfg.get("harness_include")
    if include is not None and not Path(str(include)).expanduser().is_dir():
        raise ConfigError("harness_include", include, "must be a directory of task YAMLs")
    limit = cfg.get("harness_limit")
    require("harness", ",".join(tasks), *HARNESS_MODULES)
    return {"harness": tuple(str(t) for t in tasks),
            "harness_limit": None if limit is None else positive_int("harness_limit", limit),
            "harness_include": None if include is None else Path(str(include)).expanduser()}


def check(cfg: DictConfig) -> "EvalConfig":
    """The command's validation, before any work (`grow.commands.precheck`): the command's settings."""
    return EvalConfig.from_node(cfg)


def windows(ids: np.ndarray, seq_len: int, max_tokens: int | None = None) -> tuple[torch.Tensor, torch.Tensor]:
    """(inputs, targets), each [n, seq_len]: consecutive non-overlapping windows of the token stream,
    targets the inputs shifted by one; n * seq_len <= max_tokens (at least one window)."""
    n = (len(ids) - 1) // seq_len
    if max_tokens is not None:
        n = min(n, max(int(max_tokens) // seq_len, 1))
    if n < 1:
        raise DataError(f"data: the split has {len(ids)} tokens, fewer than seq_len+1={seq_len + 1}; "
                        "use more data (data.max_bytes)")
    flat = torch.from_numpy(np.asarray(ids[: n * seq_len + 1], dtype=np.int64))
    return flat[:-1].view(n, seq_len), flat[1:].view(n, seq_len)


@torch.no_grad()
def cross_entropy_sum(model, x: torch.Tensor, y: torch.Tensor, batch_size: int, device, amp=None) -> float:
    """Summed cross-entropy (nats) of every target token, in batches of ``batch_size`` windows."""
    total = 0.0
    for xb, yb in zip(x.split(batch_size), y.split(batch_size)):
        xb, yb = xb.to(device), yb.to(device)
        with autocast(device, amp):
            _, loss = model(xb, yb)  # the chunked loss: the whole logits are never held
        total += float(loss) * yb.numel()
    return total


def package_losses(model, ids: np.ndarray, entries: list[dict], batch_size: int, device, amp=None) -> dict | None:
    """data=pysrc: the mean loss of each validation package (the trainer.full_val breakdown), every target token
    of its stretch of the split scored: the package's files (manifest ``entries`` of split val, in stream order,
    each ``tokens`` ids and its end-of-text) in windows of the model's context, the last one shorter. None when
    the entries do not add up to ``ids`` (a cache from before the manifest counted tokens)."""
    if not entries or sum(e.get("tokens", -1) + 1 for e in entries) != len(ids) or any("tokens" not in e for e in entries):
        return None
    spans: dict[str, list[int]] = {}
    at = 0
    for e in entries:
        span = spans.setdefault(e["package"], [at, at])
        span[1] = at = at + e["tokens"] + 1
    seq, total = model.config.seq_len, sum(e["bytes"] for e in entries) or 1
    out = {}
    for pkg, (lo, hi) in spans.items():
        flat = torch.from_numpy(np.asarray(ids[lo:hi], dtype=np.int64))
        n, nats = len(flat) - 1, 0.0
        full = n // seq * seq
        if full:
            nats += cross_entropy_sum(model, flat[:full].view(-1, seq), flat[1:full + 1].view(-1, seq), batch_size, device, amp)
        if n > full:
            nats += cross_entropy_sum(model, flat[full:-1].view(1, -1), flat[full + 1:].view(1, -1), 1, device, amp)
        out[pkg] = {"loss": nats / max(n, 1), "tokens": n,
                    "share": sum(e["bytes"] for e in entries if e["package"] == pkg) / total}
    return out


def text_bytes(tok, y: torch.Tensor) -> int:
    """UTF-8 bytes of the text the target tokens decode to (``<|endoftext|>``: none)."""
    return len(tok.decode(y.reshape(-1).tolist(), skip_special_tokens=True).encode("utf-8"))


def split_ids(data_cfg, tok, split: str, max_tokens: int | None = None) -> np.ndarray:
    """The ``split`` of the data config's documents, tokenized with ``tok`` (documents joined by EOT),
    read until ``max_tokens + 1`` ids are there; ``data=bin``: the shards' own ids; ``data=pysrc``: its
    files, split by package as its token cache is."""
    cfg = DataConfig.from_node(data_cfg)
    if cfg.name == "bin":
        arrays = getattr(data_lib.load(cfg, 1, log=lambda *a, **k: None), split)
        return np.concatenate([np.asarray(a[: (max_tokens or len(a)) + 1], dtype=np.int64) for a in arrays])
    eot = tok.token_to_id(cfg.eot_token)
    ids: list[int] = []
    # split as the token cache splits (grow.data.cache): pysrc by whole package, the others by document index
    stream = (pysrc.split_documents(cfg, []) if cfg.name == "pysrc" else
              split_stream(documents(cfg), cfg.val_every))
    for is_val, text in stream:
        if is_val == (split == "val"):
            ids += tok.encode(text).ids + [eot]
            if max_tokens is not None and len(ids) > max_tokens:
                break
    if not ids:
        raise DataError(f"data.name={cfg.name!r}: the {split} split is empty")
    return np.asarray(ids, dtype=np.int64)


def evaluate(cfg: EvalConfig) -> dict:
    """Loss and bits per byte of the checkpoint on the data (see the module docstring)."""
    c = runs.open_checkpoint(cfg)
    run_dir, meta, payload, model, device, amp = c.run_dir, c.meta, c.payload, c.model, c.device, c.amp
    tok, tok_path = c.tokenizer, c.tokenizer_path
    runs_data = OmegaConf.create(payload["config"]["data"])
    data_cfg = cfg.data if cfg.data is not None else runs_data
    same_data = DataConfig.from_node(data_cfg) == DataConfig.from_node(runs_data)
    ids = split_ids(data_cfg, tok, str(cfg.split), cfg.max_tokens)
    x, y = windows(ids, model.config.seq_len, cfg.max_tokens)
    nats = cross_entropy_sum(model, x, y, int(cfg.batch_size), device, amp)
    n_bytes = text_bytes(tok, y)
    return {
        "run": str(run_dir), "checkpoint": meta["file"], "step": int(meta["step"]), "stage": int(meta["stage"]) + 1,
        "data": str(data_cfg.name), "data_is_the_runs": same_data, "split": str(cfg.split),
        "tokenizer": str(tok_path), "seq_len": model.config.seq_len, "windows": int(x.size(0)),
        "tokens": int(y.numel()), "bytes": n_bytes, "loss": nats / y.numel(),
        "bits_per_byte": nats / math.log(2) / max(n_bytes, 1), "bytes_per_token": n_bytes / y.numel(),
    }


def show(result: dict) -> None:
    """The JSON line on stdout, the table on stderr."""
    from rich.markup import escape
    from rich.table import Table


    print(json.dumps(result), flush=True)
    t = Table(title=escape(f"grow eval: {result['checkpoint']} of {result['run']}"), show_header=False)
    rows = [("data", f"{result['data']} ({result['split']} split{', the run' + chr(39) + 's data' if result['data_is_the_runs'] else ''})"),
            ("checkpoint", f"step {result['step']}, stage {result['stage']}"),
            ("tokens", f"{fmt_num(result['tokens'])} in {result['windows']} windows of {result['seq_len']}"),
            ("bytes", f"{fmt_num(result['bytes'])} ({result['bytes_per_token']:.3f} per token)"),
            ("loss", f"{result['loss']:.4f} nats per token"), ("bits per byte", f"{result['bits_per_byte']:.4f}"),
            ("note", "the loss of every window of the split; a run's val/loss and final_val_loss average "
                     "trainer.eval_batches fixed random windows of it, so they differ by sampling")]
    for key, value in rows:
        t.add_row(key, escape(value))
    err_console.print(t)
