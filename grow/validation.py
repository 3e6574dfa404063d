"""The whole held-out split's loss of a run's final model or a decay branch's (``trainer.full_val``):
every non-overlapping window, per package for a data=pysrc corpus, its evaluation FLOPs counted apart
from training's. docs/design.md "How a run flows" (the summary) and "Costs and memory".
"""

from __future__ import annotations

import json

import numpy as np

from grow import data as data_lib
from grow.checkpoint_eval import cross_entropy_sum, package_losses, windows
from grow.loop import RunParts


def full_validation(parts: RunParts, model) -> dict:
    """trainer.full_val: the final model's mean loss over every non-overlapping window of the held-out split
    (`grow eval`'s windows, the shards joined), beside final_val_loss's trainer.eval_batches sampled windows;
    its forward FLOPs (2 N_matmul + 2 N s E (k + v) a token: a third of docs/costs.md's training FLOPs) are evaluation
    FLOPs, never in ``flops``. docs/design.md, "Architecture". Nulls when off, or for a stand-in without token arrays.
    ``model``: the run's, or a decay branch's copy (`grow.branches`)."""
    data = parts.data
    if not parts.cfg.trainer.full_val or not isinstance(data, data_lib.TokenData):
        return {"full_val_loss": None, "full_val_tokens": None, "full_val_flops": None, "full_val_packages": None}

    ids = np.concatenate([np.asarray(a, dtype=np.int64) for a in data.val])
    x, y = windows(ids, model.config.seq_len)
    was_training = model.training
    model.eval()
    batch, device, amp = parts.cfg.trainer.eval_batch_size, parts.precision.device, parts.precision.amp
    nats = cross_entropy_sum(model, x, y, batch, device, amp)
    packages = package_losses(model, ids, _val_entries(data), batch, device, amp)  # data=pysrc: per package
    model.train(was_training)
    scored = y.numel() + sum(p["tokens"] for p in (packages or {}).values())
    return {"full_val_loss": nats / y.numel(), "full_val_tokens": int(y.numel()),
            "full_val_flops": float(scored * (model.config.flops_per_token() // 3)), "full_val_packages": packages}


def _val_entries(data) -> list[dict]:
    """The validation files of a data=pysrc cache's manifest, in stream order ([] for another source)."""
    path = data.cache_dir / data_lib.pysrc.MANIFEST if data.cache_dir is not None else None
    if path is None or not path.is_file():
        return []
    return [e for e in json.loads(path.read_text())["files"] if e["split"] == "val"]
