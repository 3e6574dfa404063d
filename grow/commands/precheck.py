"""The command line, checked before any job runs (the CLI layer: `grow.cli` calls `precheck`, `check_one`).

Every job of a sweep (``grow compare``, ``-m``) is composed with Hydra's compose API and validated by the command's
own check (`grow.config.validate` for a run) before Hydra's launcher starts; a single job's one composition is
checked by `check_one` (`grow.commands.once`). Hydra's multi-line composition errors become one `ConfigError`
line naming the key, what is allowed and the nearest valid key (`hydra_error`)."""

from __future__ import annotations

import re
from contextlib import contextmanager

from omegaconf import DictConfig, OmegaConf

from grow.checkpoint import Resume
from grow.errors import CONFIG_DIR, ConfigError, options
from grow.overrides import jobs
from grow.run import validate
from grow.suggest import suggest


def _override_value(job: list[str], key: str):
    """The value text of ``key=...`` in ``job`` (``...`` when absent)."""
    for o in reversed(job):
        k, eq, v = o.partition("=")
        if eq and k.lstrip("+~") == key:
            return v
    return ...


def _compose_without(config_name: str, job: list[str], key: str) -> dict | None:
    """The composed config of ``job`` without its ``key=`` override, as plain data (None if it fails)."""
    from hydra import compose, initialize_config_dir

    rest = [o for o in job if o.partition("=")[0].lstrip("+~") != key]
    for overrides in (rest, []):
        try:
            with initialize_config_dir(str(CONFIG_DIR), version_base="1.3"):
                return OmegaConf.to_container(compose(config_name, overrides=overrides), resolve=False)
        except Exception:  # noqa: BLE001 - only a hint is at stake
            continue
    return None


def hydra_error(exc: Exception, config_name: str | None = None, job: list[str] | None = None) -> ConfigError:
    """Hydra's multi-line composition errors as one `ConfigError` (with the nearest valid key)."""
    text = str(exc).strip() or str(exc.__cause__ or "").strip()
    if "Could not find" in text:
        what = text.split("Could not find", 1)[1].split("\n", 1)[0].strip().strip("'")
        group, _, name = what.rpartition("/")
        return ConfigError(group, name, f"no such option; must be one of {', '.join(options(group))}")
    m = re.search(r"Could not override '([^']+)'", text)
    if m:
        key = m.group(1)
        value = _override_value(job or [], key)
        hint = suggest(key, value, _compose_without(config_name, job or [], key)) if config_name else ""
        return ConfigError(key, ..., f"not a key of the config{hint or ' (check the spelling)'}")
    lines = [ln.strip() for ln in text.splitlines() if ln.strip() and not ln.strip().startswith("See https")]
    override = getattr(exc, "override", None)
    if isinstance(override, str) and override:
        detail = [ln for ln in lines if not ln.startswith("Error parsing override")] or lines
        return ConfigError(override.split("=", 1)[0].lstrip("+~"), ...,
                           f"cannot parse the override {override!r}: {detail[0] if detail else 'bad syntax'}")
    return ConfigError("overrides", ..., lines[0] if lines else type(exc).__name__)


def precheck(config_name: str, argv: list[str], check=None, expand=None) -> None:
    """Compose and validate every job the command line describes; raise `ConfigError` on the first bad one.
    ``check(cfg)`` validates a composed config (default `validate`: a run's; sample, eval and report
    bring their own). ``expand(overrides)`` rewrites the overrides into configs Hydra can compose first
    (grow compare's: ``strategy=all`` as the strategies it names)."""
    from hydra import compose, initialize_config_dir
    from hydra.core.global_hydra import GlobalHydra
    from hydra.errors import HydraException
    from omegaconf.errors import OmegaConfBaseException

    args = [a for a in argv if not a.startswith("-") and not a.split("=")[0].lstrip("+~").startswith("hydra")]
    check_added_once(args)
    job: list[str] = []
    try:
        args = expand(args) if expand is not None else args
        with initialize_config_dir(str(CONFIG_DIR), version_base="1.3"):  # a glob(...) sweep lists its group
            every = jobs(args, GlobalHydra.instance().config_loader())
        for job in every:
            own = job
            resume = None
            if config_name == "train":  # resume=<run dir>: that run's own overrides first (grow.checkpoint)
                resume = Resume.from_argv(job)
                job = [*resume.overrides(), *job] if resume is not None else job
            with initialize_config_dir(str(CONFIG_DIR), version_base="1.3"):
                cfg = compose(config_name, overrides=job)
            check_one(config_name, own, cfg, check or validate, resume)
    except ConfigError:
        raise
    except (HydraException, OmegaConfBaseException) as exc:
        raise hydra_error(exc, config_name, job) from None


def check_one(config_name: str, own: list[str], cfg: DictConfig, check, resume: Resume | None = None):
    """The checks of one composed job (``own``: its command-line overrides; ``resume``: the run it continues, which
    it may change only in harmless keys); returns what ``check(cfg)`` returns (`grow.run.load`: the run)."""
    from hydra import compose, initialize_config_dir

    if resume is not None:
        with initialize_config_dir(str(CONFIG_DIR), version_base="1.3"):
            resume.check_keeps_experiment(compose(config_name, overrides=resume.base_overrides()), cfg)
    checked = check(cfg)
    if config_name == "train":
        _check_strategy_has_a_schedule(own, cfg)
        _check_train_new_only_has_a_schedule(cfg)
    return checked


@contextmanager
def composition_errors(config_name: str, job: list[str]):
    """Hydra's and OmegaConf's errors while composing or checking ``job`` as one `ConfigError` (`hydra_error`)."""
    from hydra.errors import HydraException
    from omegaconf.errors import OmegaConfBaseException

    try:
        yield
    except (HydraException, OmegaConfBaseException) as exc:
        raise hydra_error(exc, config_name, job) from None


def _check_train_new_only_has_a_schedule(cfg: DictConfig) -> None:
    """``trainer.train_new_only=true`` freezes what a growth did not create: without a schedule nothing grows, and
    the flag would be accepted and do nothing (`grow compare`'s baselines take it from the command line as every
    arm does, and ignore it there)."""
    if cfg.get("schedule") is None and cfg.trainer.get("train_new_only") is True:
        raise ConfigError("trainer.train_new_only", True, "needs a growth schedule (+schedule=exp, with "
                                                          "strategy=llama_pro): after each growth only the layers it "
                                                          "created train; without one every layer trains")


def check_added_once(args: list[str]) -> None:
    """A key added twice (``+schedule=exp +schedule=linear``) is one line: Hydra's sweeper keeps the last of the
    two, so the composition checked here succeeds, and Hydra's own run then stops with its message, exit 1."""
    added: dict[str, str] = {}
    for a in args:
        key, _, value = a.partition("=")
        if not key.startswith("+") or key.startswith("++"):
            continue
        if key in added:
            raise ConfigError(key.lstrip("+"), ..., f"added twice ({key}={added[key]}, then {key}={value}): add it "
                                                   f"once (a +group picks one option; a later {key[1:]}=<option> "
                                                   "replaces it)")
        added[key] = value


def _check_strategy_has_a_schedule(job: list[str], cfg: DictConfig) -> None:
    """A strategy given on the command line of a run without a schedule would be silently unused
    (the fixed-size baseline trains): refused, unless ``init=strategy`` asks for the baseline in the
    strategy's parameterization."""
    if cfg.get("schedule") is not None or cfg.get("init") == "strategy":
        return
    for o in job:
        key, _, value = o.partition("=")
        name = key.lstrip("+")
        if not key.startswith("~") and (name == "strategy" or name.startswith("strategy.")):
            raise ConfigError(name, value, "a growth strategy needs a growth schedule: add +schedule=exp "
                                                      "(without one, grow train trains the fixed-size baseline)")
