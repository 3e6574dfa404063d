"""How `grow.report.collect` names the arms of runs gathered from several places (docs/statistics.md)."""

from __future__ import annotations

from pathlib import Path

from grow.report.collect import distinguish
from grow.runs import FoundRun


def run(seed: int, source: str, **trainer) -> FoundRun:
    return FoundRun(dir=Path(f"/r/{source}/{seed}"), arm={"arm": "baseline", "seed": seed}, source=Path(f"/r/{source}"),
               config={"seed": seed, "trainer": trainer})


def test_a_key_an_older_run_lacks_does_not_name_an_arm():
    """Two budgets of one fixed size, one seed 0 written before ``trainer.full_val`` existed: the arms are
    told apart by the budget alone, and the older seed stays with its budget's other seeds."""
    runs = [run(0, "a", max_tokens=100), run(1, "a", max_tokens=100, full_val=True),
            run(0, "b", max_tokens=200, full_val=True), run(1, "b", max_tokens=200, full_val=True)]
    distinguish(runs)
    assert [r.label for r in runs] == ["baseline trainer.max_tokens=100"] * 2 + ["baseline trainer.max_tokens=200"] * 2
