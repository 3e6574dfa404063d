"""Growth triggers: when a growth run leaves a stage for the next (``schedule.trigger``,
docs/strategies.md). The sizes of the stages still come from the schedule (Yuan et al.'s Eq. 6);
a trigger decides when each growth happens. ``fixed`` keeps the plan's stage lengths (Eq. 7); the
others end a stage when their rule fires, and the last stage trains what is left of
``trainer.max_tokens``. One module per trigger, registered by name (`base.register`)."""

from grow.triggers.base import REGISTRY, Progress, Trigger, build, integer, names, number, register

__all__ = ["REGISTRY", "Progress", "Trigger", "build", "integer", "names", "number", "register"]
