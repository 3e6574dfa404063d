"""``grow schedule``: print the stage plan of the composed config, without training or writing files."""

from __future__ import annotations

import hydra
from omegaconf import DictConfig

from grow import branches
from grow.commands import in_place, reader_may_stop, user_errors
from grow.config import CONFIG_DIR
from grow.console import console
from grow.fsdp_growth.cost import format_growth_memory, plan_growth_costs
from grow.memory import format_memory, memory_budget, plan_memory
from grow.plan import format_plan
from grow.run import load as load_run

extra_overrides = in_place  # no run directory: the current one, no .hydra/ output


def normalize(argv: list[str]) -> list[str]:
    """``init=<model directory>``: the plan of a run from that checkpoint, as ``grow train`` would compose it."""
    from grow.hf.pretrained import command_line  # start-up speed

    return command_line(argv)


check = load_run  # the command's validation: the run, its plan, strategy and trigger built once


def job(run) -> None:
    """The plan of the checked run (`check`)."""
    with reader_may_stop():  # grow schedule | head
        show(run)


@hydra.main(config_path=str(CONFIG_DIR), config_name="train", version_base="1.3")
def main(cfg: DictConfig) -> None:
    """A job of ``grow schedule ... -m`` (Hydra's launcher; a single one runs `job` through `grow.cli`)."""
    with user_errors():
        run = load_run(cfg)
    job(run)


def show(run) -> None:
    """The plan, its notes, the memory plan (and under FSDP the growths' memory), on the console."""
    plan = run.plan
    console.print(format_plan(plan))
    trigger = run.trigger
    if run.grows and not trigger.planned:
        console.print(f"growth trigger {trigger.describe()}: the stage sizes above; each stage but the last ends "
                      f"where the trigger fires (steps, tokens and FLOPs above are the plan's, not a prediction), "
                      f"the last trains what is left of trainer.max_tokens", markup=False)
    for line in branches.describe(run):  # optim.decay_branches: what each budget costs and adds
        console.print(line, markup=False)
    note = run.growth_strategy.plan_note(run) if run.grows else None
    if note:
        console.print(note, markup=False)
    budget = memory_budget(run)
    world = run.trainer.world_size or 1
    ranks = f"per rank of {world}, {run.trainer.parallel}" if world > 1 else ""
    console.print(format_memory(plan_memory(run, plan, amp=planned_autocast(run, budget), budget=budget, world=world),
                                budget, ranks))
    if run.trainer.parallel == "fsdp" and world > 1 and len(list(plan)) > 1:
        console.print(growth_memory(run, plan, world, gpu=budget is not None and run.device != "cpu"))


def growth_memory(run, plan, world: int, gpu: bool):
    """The plan's growths' peak memory per rank under each trainer.fsdp_growth path (`grow.fsdp_growth.cost`)."""
    return format_growth_memory(plan_growth_costs(run, plan, world, gpu=gpu), world, gpu)


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
