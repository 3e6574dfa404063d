"""What a plan's short check run says about the whole plan: each growth's share of the plan's
wall-clock, and the memory plan's estimate over the measured peak per stage."""

from __future__ import annotations

MEMORY_RANGE = (1.00, 1.10)  # estimate / measured peak: over (safe), by at most 10% (micro-batches not too small)


def growth_shares(plan, stages: list[dict], growth_seconds: list[float]) -> dict:
    """Each growth's seconds over the whole plan's wall-clock: every stage's steps at the tokens/s the
    check measured for it, plus the growths (the check's own runs are too short to be that plan)."""
    train = 0.0
    for stage, row in zip(plan, stages):
        if not row.get("tokens_per_s"):
            return {"growth_seconds": growth_seconds, "shares": None, "reason": f"stage {row['stage']}: no tokens/s"}
        train += stage.steps * stage.batch_size * stage.cfg.seq_len / row["tokens_per_s"]
    wall = train + sum(growth_seconds)
    return {"plan_train_seconds": train, "plan_wall_seconds": wall, "growth_seconds": growth_seconds,
            "shares": [s / wall for s in growth_seconds]}


def memory_ratios(stages: list[dict]) -> list[float | None]:
    return [row["estimate_over_measured"] for row in stages]


def in_range(ratios: list[float | None]) -> bool | None:
    """All within `MEMORY_RANGE`; None where nothing was measured (no CUDA device)."""
    if not ratios or any(r is None for r in ratios):
        return None
    return all(MEMORY_RANGE[0] <= r <= MEMORY_RANGE[1] for r in ratios)
