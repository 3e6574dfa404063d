"""4. stages: the trainer's step time on each stage of the default schedule, tokens/s and, on a GPU,
the MFU (tokens/s x FLOPs per token / the device's dense bf16 peak, from its name)."""

from __future__ import annotations

from benchmarks.common import Bench, StepTimer, dims, median


def stage_times(b: Bench, step: dict | None = None) -> list[dict]:
    """(4): the trainer's step time on each stage of the plan (median of timed blocks), tokens/s
    and MFU; the last stage's from ``step`` (`bench_step`'s result) when given."""
    s, rows = b.s, []
    for stage in b.plan:
        compile_s = None
        if step is not None and stage.index == len(b.plan) - 1:
            step_s, compile_s = step["grow_s"], step["compile_s"]
        else:
            timer = StepTimer(b.device, s["block"])
            state = b.run_trainer(stage, b.model(stage.cfg), timer, s["warmup"] + s["stage_steps"])
            step_s = median(timer.times[s["warmup"]:])
            compile_s = state.compile_seconds if s["compile"] else None
        tps = stage.tokens_per_step / step_s
        fpt = stage.cfg.flops_per_token()
        rows.append({"stage": stage.index, "dims": dims(stage.cfg), "params": stage.params,
                     "batch_size": stage.batch_size, "steps": stage.steps, "step_s": step_s, "tokens_per_s": tps,
                     "flops_per_token": fpt, "mfu": tps * fpt / b.peak if b.peak else None, "compile_s": compile_s})
    return rows
