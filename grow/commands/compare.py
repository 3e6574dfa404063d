"""``grow compare``: growth strategies against the fixed-size baseline, on the same data and seeds.

Before Hydra starts, `main` rewrites the command line (`expand_arms`: ``strategy=all``, the
``baseline`` and ``equal_flops`` pseudo-strategies of ``grow/arms/strategy/``, ``++strategy.<key>``);
each job runs `grow.compare.run_arm` and `grow.compare.ReportCallback` writes the report;
``grow compare report=<sweep dir>`` rebuilds it without training (docs/statistics.md).
"""

from __future__ import annotations

import os
import shlex
import sys
import uuid
from pathlib import Path

import hydra
from hydra.core.hydra_config import HydraConfig
from omegaconf import DictConfig

from grow.checkpoint import Interrupted
from grow.commands import user_errors
from grow.compare import arm_options, base_run, default_strategy, equal_flops_budget, run_arm
from grow.config import CONFIG_DIR, ConfigError, options
from grow.errors import ARMS_DIR, DISK_FULL_EXIT, DiskFull
from grow.overrides import jobs
from grow.report import build_report

PASS_THROUGH_FLAGS = ("-m", "--multirun")


def check(cfg: DictConfig) -> None:
    """The precheck of one job: the run `grow train` would run, and with ``compare.equal_flops`` a budget
    the equal-FLOPs arms can be given before any arm runs (`grow.compare.equal_flops_budget`)."""
    run = base_run(cfg)
    if cfg.compare.get("equal_flops") and run.schedule is not None:
        equal_flops_budget(run)


def normalize(argv: list[str]) -> list[str]:
    """``init=<model directory>``: every arm starts from the checkpoint's model, as `grow train`'s does
    (`grow.hf.pretrained.command_line`: model=pretrained unless a model is named)."""
    from grow.hf.pretrained import command_line  # start-up speed

    return command_line(argv)


def extra_overrides(argv: list[str]) -> list[str]:
    """Nothing to add in front: `main` rewrites the command line itself (it must replace ``strategy=``)."""
    return []


def _parse(texts: list[str]):
    from hydra.core.override_parser.overrides_parser import OverridesParser

    return OverridesParser.create().parse_overrides(texts)


def _bool_override(parsed, key: str) -> bool | None:
    for o in parsed:
        if o.key_or_group == key and not o.is_delete():
            if o.is_sweep_override() or not isinstance(o.value(), bool):
                raise ConfigError(key, o.get_value_element_as_str(), "must be true or false (not a sweep)")
            return bool(o.value())
    return None


def _strategies(o) -> list[str]:
    from hydra.core.override_parser.types import Glob

    value = o.value()
    if isinstance(value, Glob):
        names = value.filter(options("strategy"))
    elif o.is_sweep_override():
        names = list(o.sweep_string_iterator())
    elif isinstance(value, (list, tuple)):
        names = [str(v) for v in value]
    else:
        names = [str(value)]
    if names == ["all"]:  # every strategy there is (the registry's YAMLs, plugins included)
        names = options("strategy")
    if not names or any(not n for n in names):
        raise ConfigError("strategy", o.get_value_element_as_str(), "name at least one strategy, e.g. strategy=svd,zero")
    for n in names:
        if n not in options("strategy"):
            raise ConfigError("strategy", n, f"must be one of {', '.join(options('strategy'))}")
    return list(dict.fromkeys(names))


def _plain(o) -> bool:
    """``key=v``: not ``+key=v``, ``++key=v`` or ``~key``."""
    return not (o.is_add() or o.is_force_add() or o.is_delete())


def _forced(text: str, o) -> str:
    """A plain ``key=v`` as ``++key=v``, which sets the key whether or not the composed node has it."""
    return "++" + text if _plain(o) else text


def _option_of_one_arm(text: str, o) -> str:
    """``compare.options.<strategy>.<key>=v`` as an addition (the block is empty until given); a sweep of it is
    refused: it would name arms by a value only one strategy reads."""
    if not o.key_or_group.startswith("compare.options."):
        return text
    if o.is_sweep_override() and not o.is_delete():  # ``+``/``++`` too: the same sweep
        raise ConfigError(o.key_or_group, text.split("=", 1)[1], "one value, not a sweep (a sweep of one "
                          "strategy's option: grow compare strategy=<it> strategy.<key>=a,b)")
    return _forced(text, o)


def composable(overrides: list[str]) -> list[str]:
    """The overrides as configs Hydra composes, for `grow.commands.precheck`: the strategy override
    (``all``, ``glob(...)``, a list or a sweep) as the sweep of the strategies it names (`_strategies`);
    the pseudo-strategies `expand_arms` adds later are not configs of ``configs/strategy/``."""
    out = []
    for text, o in zip(overrides, _parse(overrides)):
        out.append(f"strategy={','.join(_strategies(o))}" if o.key_or_group == "strategy" and not o.is_delete()
                   else _option_of_one_arm(text, o))
    return out


def _check_options_name_arms(settings: DictConfig, strategies: list[str]) -> None:
    for name, value in arm_options(settings).items():
        if name not in strategies:
            raise ConfigError(f"compare.options.{name}", value,
                              f"not a strategy of this comparison; its strategies: {', '.join(strategies)}")


def report_dir(argv: list[str]) -> str | None:
    """The sweep directory of ``report=<dir>`` / ``compare.report=<dir>``, if given."""
    parsed = _parse([a for a in argv if not a.startswith("-")])
    for o in parsed:
        if o.key_or_group in ("report", "compare.report") and not o.is_delete() and o.value() not in (None, ""):
            return o.get_value_element_as_str()
    return None


def composed_compare(texts: list[str]) -> DictConfig:
    """The ``compare`` block of the command line's first job as Hydra composes it: compare.yaml's,
    then an experiment's (``+experiment=late-expansion`` may set ``compare.equal_flops: true``), then
    the command line's. Hydra's own keys and the strategy's are left out (compose refuses the first;
    ``strategy=all`` and the pseudo-strategies are not configs it can find)."""
    from hydra import compose, initialize_config_dir

    kept = [_option_of_one_arm(t, o) for t, o in zip(texts, _parse(texts))
            if not t.lstrip("+~").startswith(("hydra", "strategy"))]
    job = jobs(kept)[0]
    with initialize_config_dir(str(CONFIG_DIR), version_base="1.3"):
        return compose("compare", overrides=job).compare


def expand_arms(argv: list[str], invocation: str | None = None) -> list[str]:
    """The command line Hydra runs: the arms in the strategy sweep, the swept keys, an invocation id, the search path."""
    if any(a.startswith("-") and a not in PASS_THROUGH_FLAGS for a in argv):  # Hydra's own flags (--cfg, --help, ...)
        # on the overrides' side of them: argparse takes the overrides only as one run of arguments
        search = f"hydra.searchpath=['file://{ARMS_DIR}']"
        return [*argv, search] if argv[0].startswith("-") else [search, *argv]
    texts = [a for a in argv if not a.startswith("-")]
    parsed = _parse(texts)
    for key in ("compare.baseline", "compare.equal_flops"):
        _bool_override(parsed, key)  # a sweep of either is refused: they decide which arms there are
    settings = composed_compare(texts)
    baseline, equal = bool(settings.baseline), bool(settings.equal_flops)

    strategies, out, vary, at = [default_strategy()["name"]], [], [], 0
    for text, o in zip(texts, parsed):
        key = o.key_or_group
        if key == "strategy" and not o.is_delete():
            strategies, at = _strategies(o), len(out)  # the arms keep the strategy's place (the job order)
            continue
        text = _forced(text, o) if key.startswith("strategy.") else _option_of_one_arm(text, o)
        if o.is_sweep_override() and key != "seed":
            vary.append(key)
        out.append(text)
    _check_options_name_arms(settings, strategies)
    arms = (["baseline"] if baseline else []) + strategies + (["equal_flops"] if equal else [])
    keys = ",".join(f"'{k}'" for k in vary)
    out.insert(at, f"strategy={','.join(arms)}")
    return [*[a for a in argv if a in PASS_THROUGH_FLAGS], *out, f"compare.vary=[{keys}]", f"compare.invocation={invocation or uuid.uuid4().hex[:12]}",
            f"hydra.searchpath=['file://{ARMS_DIR}']"]


def job_overrides(overrides: list[str]) -> list[str]:
    """The overrides of the jobs Hydra runs (`expand_arms`), for ``grow compare ... --cfg job``."""
    return expand_arms(overrides)


@hydra.main(config_path=str(CONFIG_DIR), config_name="compare", version_base="1.3")
def app(cfg: DictConfig) -> float | None:
    """One job: one arm and seed of the sweep (`grow.compare.run_arm`)."""
    hydra_cfg = HydraConfig.get()
    try:
        with user_errors():
            return run_arm(cfg, hydra_cfg)
    except DiskFull as exc:  # the arm's earlier checkpoints are intact: a rerun of the sweep resumes it
        print(f"error: {exc}", file=sys.stderr)
        sys.exit(DISK_FULL_EXIT)
    except Interrupted as exc:  # SIGTERM / SIGINT: the arm checkpointed; a rerun of the sweep resumes it
        print(f"{exc.message.splitlines()[0]}\nto go on: the same grow compare command line with "
              f"hydra.sweep.dir={Path(str(hydra_cfg.sweep.dir)).absolute()}", file=sys.stderr)
        sys.exit(exc.exit_code)


def main() -> None:
    argv = sys.argv[1:]
    with user_errors():
        report = None if any(a.startswith("-") for a in argv if a not in PASS_THROUGH_FLAGS) else report_dir(argv)
        if report is not None:
            build_report([Path(report)], Path(report), key="report")
            return
        os.environ["GROW_COMMAND"] = shlex.join(["grow", "compare", *argv])  # arm.json's "command" (the report's)
        sys.argv = [sys.argv[0], *expand_arms(argv)]
    app()


if __name__ == "__main__":
    main()
