"""The report copied to W&B: one run in the sweep's group with the tables and the plots (the files are the record).
"""

from __future__ import annotations

from pathlib import Path

from grow.console import console
from grow.metrics import server_url, wandb_mode
from grow.net import unreachable
from grow.report.tables import loss_rows, table_rows


def log_wandb(summary: dict, out_dir: Path, logger_cfg: dict) -> None:
    """One W&B run in the sweep's group with the summary table and the two plots (`grow.metrics.wandb_mode`:
    WANDB_MODE, or offline without credentials; never W&B's login prompt)."""
    mode, _ = wandb_mode()
    if mode == "disabled":
        return

    timeout = float(logger_cfg.get("init_timeout") or 10.0)
    if mode == "online" and unreachable(server_url(), timeout):
        mode = "offline"  # the runs said so already, each in one line

    try:
        import wandb

        headers, rows = table_rows(summary)
        run = wandb.init(project=logger_cfg.get("project", "grow"), entity=logger_cfg.get("entity"),
                         group=logger_cfg.get("group") or summary["group"], name="compare-report",
                         job_type="compare-report", dir=str(out_dir), config={"sweep_dir": summary["sweep_dir"]},
                         mode=mode)
        try:
            data = {"compare/summary": wandb.Table(columns=headers, data=rows)}
            headers, rows = loss_rows(summary)
            data["compare/differences"] = wandb.Table(columns=headers, data=rows)
            for name in ("loss_vs_flops", "loss_vs_time"):
                if (out_dir / f"{name}.png").exists():
                    data[f"compare/{name}"] = wandb.Image(str(out_dir / f"{name}.png"))
            run.log(data)
        finally:
            run.finish()
    except Exception as exc:  # noqa: BLE001 - W&B is a copy; the files are the record
        console.print(f"compare: W&B report table not logged: {str(exc).splitlines()[0] if str(exc) else exc}",
                      markup=False)
