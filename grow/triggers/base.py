"""The trigger interface (`Trigger`), what a trigger sees (`Progress`), and the registry."""

from __future__ import annotations

import copy
import difflib
import importlib
from dataclasses import dataclass
from typing import ClassVar

from grow import plugins
from grow.errors import CONFIG_DIR, ConfigError, check_number, options

REGISTRY: dict[str, type["Trigger"]] = {}
GROUP = "schedule/trigger"  # the config group of the triggers' YAMLs: configs/schedule/trigger/<name>.yaml


@dataclass(frozen=True)
class Progress:
    """Where the run is when a trigger is asked (after a step, or after an evaluation)."""

    stage: int  # the current stage's index (0-based)
    stages: int  # stages in the plan
    tokens: int  # training tokens of the whole run so far
    stage_tokens: int  # training tokens since the current stage began
    params: int  # parameters of the current model
    final_params: int  # parameters of the plan's final model
    max_tokens: int  # the run's token budget (trainer.max_tokens)
    budget_flops: float  # the plan's training FLOPs (the budget C of a compute-optimal formula)


class Trigger:
    """When to grow. A trigger is built once per run from its config node (``options``: the keys of
    its YAML, each one's default and comment there, once: `option_defaults`; checked by `check_options`), keeps whatever it remembers in ``memory`` (a plain dict
    that the trainer stores in every checkpoint, so a resumed run decides as the run never stopped),
    and is asked after every step (`after_step`) and after every evaluation (`after_eval`) whether
    the current stage ends now. It is not asked in the last stage."""

    name: ClassVar[str] = "base"
    defaults: ClassVar[dict] = {}  # the options of a trigger without a YAML (a plugin's, say)
    needs_evals: ClassVar[bool] = False  # reads validation losses: the run must evaluate (trainer.eval_every)

    def __init__(self, options: dict | None = None):
        self.options = self.check_options({**self.option_defaults(), **(options or {})})

    @property
    def planned(self) -> bool:
        """Whether the stages keep the plan's lengths (``fixed``)."""
        return False

    @classmethod
    def option_defaults(cls) -> dict:
        """Every option and its default: its YAML's over ``defaults``."""
        return {**copy.deepcopy(cls.defaults), **plugins.yaml_options(GROUP, cls.name)}

    @classmethod
    def check_options(cls, options: dict) -> dict:
        known = cls.option_defaults()
        unknown = sorted(set(options) - set(known))
        if unknown:
            key = unknown[0]
            near = difflib.get_close_matches(key, list(known), n=1)
            hint = f" (did you mean schedule.trigger.{near[0]}?)" if near else ""
            raise ConfigError(f"schedule.trigger.{key}", options[key], f"not an option of trigger {cls.name}; "
                             f"allowed: {', '.join(['name', *known])}{hint}")
        return options

    def check(self, run) -> None:
        """Refuse, before any work, a setting of the growth run ``run`` (a `grow.run.Run`) this trigger
        cannot decide in, with a one-line `ConfigError`: by default two growths in one step
        (`check_plan`), or no evaluations for a trigger that reads validation losses."""
        self.check_plan(run.plan, run.plan[0].tokens_per_step)
        if self.needs_evals and run.trainer.eval_every == 0:
            raise ConfigError("trainer.eval_every", 0, f"trigger {self.name} reads the validation losses the run "
                              "makes during a stage; allowed: an integer >= 1 (steps between evaluations)")

    def check_plan(self, plan, tokens_per_step: int) -> None:
        """Refuse, before any work, a setting that would make two growths fall in one step."""

    def begin_stage(self, memory: dict, progress: Progress) -> None:
        """A stage begins (after a growth, or the run's start): forget what belonged to the last one."""

    def after_step(self, memory: dict, progress: Progress) -> bool:
        """Whether the current stage ends after this step. Default: never (an evaluation may end it)."""
        return False

    def after_eval(self, memory: dict, progress: Progress, val_loss: float, train_loss: float | None) -> bool:
        """Whether the current stage ends at this evaluation (``train_loss``: the mean of the training
        losses logged since the previous evaluation, None when none was). Default: never."""
        return False

    def describe(self) -> str:
        opts = ", ".join(f"{k}={v}" for k, v in self.options.items())
        return f"{self.name}({opts})" if opts else self.name


def register(name: str):
    def deco(cls):
        cls.name = name
        REGISTRY[name] = cls
        return cls
    return deco


def names() -> tuple[str, ...]:
    """The triggers, found by convention: a YAML in configs/schedule/trigger/ (or a plugin's, `grow.plugins`)
    beside a module ``grow/triggers/<name>.py`` (or the plugin's) that registers the class."""
    return tuple(options(GROUP))


def build(node: dict | None) -> Trigger:
    """The trigger of a ``schedule.trigger`` node (``{name: ..., <options>}``; None: ``fixed``)."""
    cls, options = _class_of(node)
    return cls(options)


def checked(node: dict | None) -> dict:
    """A ``schedule.trigger`` node with every option filled in and checked by its trigger's class
    (`Trigger.check_options`), building no trigger: the run builds its one (`grow.run.assemble`)."""
    cls, options = _class_of(node)
    return {"name": cls.name, **cls.check_options({**cls.option_defaults(), **options})}


def _class_of(node: dict | None) -> tuple[type[Trigger], dict]:
    node = dict(node or {"name": "fixed"})
    name = node.pop("name", "fixed")
    plugins.load()
    if name not in REGISTRY and (CONFIG_DIR / GROUP / f"{name}.yaml").is_file():
        importlib.import_module(f"grow.triggers.{name}")
    if name not in REGISTRY:
        raise ConfigError("schedule.trigger.name", name, f"must be one of {', '.join(names())}")
    return REGISTRY[name], node


# ---- option checks shared by the triggers ----------------------------------------------------------


def integer(key: str, value, lo: int) -> int:
    if isinstance(value, float) and value.is_integer():
        value = int(value)
    if not isinstance(value, int) or isinstance(value, bool) or value < lo:
        raise ConfigError(f"schedule.trigger.{key}", value, f"must be an integer >= {lo}")
    return value


def number(key: str, value, lo: float | None = None, **open_ends) -> float:
    try:
        return check_number(key, value, lo, **open_ends)
    except ConfigError as exc:
        raise ConfigError(f"schedule.trigger.{key}", exc.value, exc.allowed) from None
