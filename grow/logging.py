"""Where metrics go: ``metrics.jsonl`` in the run directory (always) and Weights & Biases.

W&B is never the only copy. Its mode (online, offline, disabled) comes from ``WANDB_MODE`` and is
never set here; the Makefile defaults it to ``offline`` and the tests use ``disabled``. Offline
runs are written under ``<run_dir>/wandb/`` and can be uploaded later with ``wandb sync``.

Every record carries ``train/tokens`` and ``train/flops``; W&B plots everything against tokens
(``define_metric``), with FLOPs available as an alternative x-axis.
"""

from __future__ import annotations

import json
import math
import os
from pathlib import Path

GROWTH_COLUMNS = [
    "growth/stage", "train/tokens", "train/flops", "growth/params_before", "growth/params_after",
    "growth/loss_before", "growth/loss_after", "growth/delta", "growth/seconds", "growth/recovery",
]


def _clean(value):
    if isinstance(value, float) and not math.isfinite(value):
        return str(value)
    if hasattr(value, "item"):
        return _clean(value.item())
    return value


class MetricsLogger:
    """Appends records to ``metrics.jsonl`` and mirrors them to a W&B run (rank 0 only)."""

    def __init__(self, run_dir: Path, *, enabled: bool = True, wandb_cfg=None, config: dict | None = None,
                 resume_id: str | None = None):
        self.run_dir = Path(run_dir)
        self.enabled = enabled
        self.wandb = None
        self.growth_rows: list[list] = []
        self._file = None
        if not enabled:
            return
        self.run_dir.mkdir(parents=True, exist_ok=True)
        self._file = open(self.run_dir / "metrics.jsonl", "a", buffering=1)
        if wandb_cfg is not None and os.environ.get("WANDB_MODE", "online") != "disabled":
            self._init_wandb(wandb_cfg, config or {}, resume_id)

    def _init_wandb(self, wcfg, config: dict, resume_id: str | None) -> None:
        import wandb

        self.wandb = wandb.init(
            project=wcfg.get("project", "grow"),
            entity=wcfg.get("entity"),
            group=wcfg.get("group"),
            name=wcfg.get("name"),
            tags=list(wcfg.get("tags") or []),
            dir=str(self.run_dir),
            config=config,
            id=resume_id,
            resume="allow" if resume_id else None,
        )
        self.wandb.define_metric("train/tokens")
        self.wandb.define_metric("train/flops")
        self.wandb.define_metric("*", step_metric="train/tokens")

    @property
    def wandb_id(self) -> str | None:
        return None if self.wandb is None else self.wandb.id

    @property
    def offset(self) -> int:
        """Bytes of ``metrics.jsonl`` written so far (a checkpoint records it; resume truncates to it)."""
        return 0 if self._file is None else self._file.tell()

    def log(self, record: dict) -> None:
        if not self.enabled:
            return
        record = {k: _clean(v) for k, v in record.items()}
        self._file.write(json.dumps(record) + "\n")
        if self.wandb is not None:
            self.wandb.log({k: v for k, v in record.items() if isinstance(v, (int, float))})

    def log_growth(self, record: dict) -> None:
        """A growth event: logged like any record and kept for the growth-events table."""
        self.log(record)
        self.growth_rows.append([_clean(record.get(c)) for c in GROWTH_COLUMNS])

    def update_growth(self, stage: int, key: str, value: float) -> None:
        """Fill a column of an earlier growth event (the recovery, known only later)."""
        col = GROWTH_COLUMNS.index(key)
        for row in self.growth_rows:
            if row[0] == stage:
                row[col] = _clean(value)

    def summary(self, summary: dict) -> None:
        if not self.enabled:
            return
        (self.run_dir / "summary.json").write_text(json.dumps(summary, indent=2, default=_clean))
        if self.wandb is not None:
            import wandb

            for k, v in summary.items():
                if isinstance(v, (int, float, str)):
                    self.wandb.summary[k] = v
            if self.growth_rows:
                self.wandb.log({"growth/events": wandb.Table(columns=GROWTH_COLUMNS, data=self.growth_rows)})

    def close(self) -> None:
        if self._file is not None:
            self._file.close()
            self._file = None
        if self.wandb is not None:
            self.wandb.finish()
            self.wandb = None


def read_metrics(run_dir: Path) -> list[dict]:
    path = Path(run_dir) / "metrics.jsonl"
    if not path.exists():
        return []
    return [json.loads(line) for line in path.read_text().splitlines() if line.strip()]
