"""``grow schedule``: print the stage plan of the composed config, without training or writing files."""

from __future__ import annotations

import hydra
from omegaconf import DictConfig

from grow.commands import in_place, user_errors
from grow.config import CONFIG_DIR

extra_overrides = in_place  # no run directory: the current one, no .hydra/ output


@hydra.main(config_path=str(CONFIG_DIR), config_name="train", version_base="1.3")
def main(cfg: DictConfig) -> None:
    from grow.console import console
    from grow.memory import format_memory, memory_budget, plan_memory
    from grow.plan import format_plan
    from grow.run import load as load_run

    with user_errors():
        run = load_run(cfg)
        plan = run.plan
    console.print(format_plan(plan))
    trigger = run.trigger
    if run.grows and not trigger.planned:
        console.print(f"growth trigger {trigger.describe()}: the stage sizes above; each stage but the last ends "
                      f"where the trigger fires (steps, tokens and FLOPs above are the plan's, not a prediction), "
                      f"the last trains what is left of trainer.max_tokens", markup=False)
    if run.strategy.name == "svd":
        console.print(svd_share(run, plan))
    if run.strategy.name == "ligo":
        console.print(ligo_share(run, plan))
    budget = memory_budget(run)
    world = run.trainer.world_size or 1
    ranks = f"per rank of {world}, {run.trainer.parallel}" if world > 1 else ""
    console.print(format_memory(plan_memory(run, plan, amp=planned_autocast(run, budget), budget=budget, world=world),
                                budget, ranks))


def svd_share(run, plan) -> str:
    """One line: svd's own passes (statistics, line search, linear algebra; at most, `grow.growth.svd.
    planned_flops`) over the plan's growths of d_k, as a share of the plan's training FLOPs."""
    from grow.console import fmt_num
    from grow.growth.base import yaml_options
    from grow.growth.svd import planned_flops

    options = {**yaml_options("svd"), **dict(run.strategy.options)}
    stages = list(plan)
    extra = sum(planned_flops(a.cfg, b.cfg, options, run.trainer.batch_size) for a, b in zip(stages, stages[1:]))
    pct = 100.0 * extra / max(plan.total_flops, 1)
    return (f"svd's statistics and line-search passes: at most {fmt_num(extra)} FLOPs over the plan's growths of d_k, "
            f"{pct:.3g}% of the plan's {fmt_num(plan.total_flops)} training FLOPs (counted in train/flops when they run)")


def ligo_share(run, plan) -> str:
    """One line: ligo's operator training and evaluations over the plan's growths (`grow.growth.ligo.
    planned_flops`, what `growth/flops` will count), as a share of the plan's training FLOPs."""
    from grow.console import fmt_num
    from grow.growth.base import yaml_options
    from grow.growth.ligo import planned_flops

    options, t = {**yaml_options("ligo"), **dict(run.strategy.options)}, run.trainer
    stages = list(plan)
    extra = sum(planned_flops(a.cfg, b.cfg, options, t.batch_size, t.growth_batches) for a, b in zip(stages, stages[1:]))
    pct = 100.0 * extra / max(plan.total_flops, 1)
    return (f"ligo's operator training ({options['steps']} steps per growth on trainer.growth_batches={t.growth_batches}): "
            f"{fmt_num(extra)} FLOPs, {pct:.3g}% of the plan's {fmt_num(plan.total_flops)} training FLOPs "
            f"(counted in growth/flops)")


def planned_autocast(run, budget):
    """The autocast dtype the run would use where the memory plan is made for: a GPU when one is here
    or ``trainer.device_memory_gb`` is given (bf16 under ``precision=auto|bfloat16``), else this CPU."""
    import torch

    gpu = budget is not None and run.device != "cpu"
    if run.precision == "bfloat16" or (run.precision == "auto" and gpu):
        return torch.bfloat16
    return None


if __name__ == "__main__":
    main()
