"""One stage numbering everywhere a user reads it: the first stage is stage 1, the first growth enters
stage 2 (`grow schedule`'s table, the console, metrics.jsonl, summary.json, the report)."""

from __future__ import annotations

import json
import re

from tests.conftest import TINY_RUN, grow_cli

ARGS = ["+schedule=exp", "strategy=zero", *(a for a in TINY_RUN if not a.startswith("trainer.progress")),
        "trainer.max_tokens=30000"]


def table_stages(text: str) -> list[int]:
    """The stage column of the first table printed (grow schedule's stage plan)."""
    first = text.split("└", 1)[0]
    cells = [line.split("│")[1].strip() for line in first.splitlines() if line.startswith("│")]
    return [int(c) for c in cells if c.isdigit()]


def test_console_metrics_summary_and_schedule_number_stages_alike(tmp_path):
    plan = grow_cli("schedule", *ARGS, cwd=tmp_path)
    assert plan.returncode == 0, plan.stderr[-2000:]
    run_dir = tmp_path / "run"
    out = grow_cli("train", *ARGS, "trainer.progress=true", f"hydra.run.dir={run_dir}", cwd=tmp_path)
    assert out.returncode == 0, out.stderr[-3000:]
    records = [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines()]
    summary = json.loads((run_dir / "summary.json").read_text())

    stages = {
        "grow schedule": table_stages(plan.stdout),
        "progress lines": sorted({int(s) for s in re.findall(r"^stage (\d+)/4 step", out.stdout, re.M)}),
        "metrics.jsonl stage": sorted({r["stage"] for r in records if "stage" in r}),
        "summary.json stage_plan": [s["stage"] for s in summary["stage_plan"]],
    }
    growths = {
        "growth panels": [int(s) for s in re.findall(r"growth into stage (\d+)", out.stdout)],
        "metrics.jsonl growth/stage": [r["growth/stage"] for r in records if "growth/delta" in r],
        "summary.json growth_events": [e["growth/stage"] for e in summary["growth_events"]],
    }
    assert all(v == [1, 2, 3, 4] for v in stages.values()), stages
    assert all(v == [2, 3, 4] for v in growths.values()), growths
    # a record's stage is the stage whose model made it: the first training record is in stage 1
    first = next(r for r in records if "train/loss" in r)
    assert first["stage"] == 1
