"""``grow <command> [hydra overrides]``: a small dispatcher over the commands (docs/design.md, "Commands").

A single job is composed once, checked into the command's object and run (`grow.commands.once`); ``grow compare``
and a ``-m`` sweep have every job composed and checked (`grow.commands.precheck`), then Hydra's launcher runs them.
Either way a bad value ends with one line and exit status 2 before any data or model work.
"""

from __future__ import annotations

import importlib
import os
import shlex
import signal
import sys
import threading
from contextlib import contextmanager
from pathlib import Path

from grow import plugins
from grow.commands import show
from grow.errors import ConfigError, DataError, file_in_the_way

COMMANDS = {
    "train": ("grow.commands.train", "train", "train a model: fixed size, or through a growth schedule (+schedule=exp)"),
    "compare": ("grow.commands.compare", "compare", "run growth strategies side by side against the fixed-size baseline"),
    "schedule": ("grow.commands.schedule", "train", "print the stage plan (dims, params, steps, batch, tokens, FLOPs)"),
    "sample": ("grow.commands.sample", "sample", "generate text from a run's checkpoint with the run's tokenizer"),
    "eval": ("grow.commands.eval", "eval", "validation loss and bits per byte of a run's checkpoint on any data"),
    "report": ("grow.commands.report", "report", "the report, plots and summary of any runs and sweeps, mixed"),
    "export": ("grow.commands.export", "export", "a run's checkpoint as a Hugging Face model directory (hf extra)"),
}
INFO_FLAGS = ("-h", "--help", "--hydra-help", "-c", "--cfg", "--info", "-i", "--shell-completion", "-sc", "-p", "--package")

USAGE = """usage: grow <command> [overrides ...]

commands:
{commands}

Overrides are Hydra's: key=value, group=option, +schedule=exp, a,b,c sweeps with -m.
Examples:
  grow train                              # the fixed-size baseline on the default config
  grow train +schedule=exp strategy=svd   # grow through the exponential schedule of Yuan et al. (2023)
  grow compare strategy=svd,zero          # strategies vs the baseline, same data and seeds
  grow schedule +schedule=exp             # the stage plan, without training
  grow sample run=latest prompt='def '    # text from the newest run's last checkpoint
  grow eval run=<run dir> data=stdlib     # loss and bits per byte of a checkpoint on a corpus
  grow report runs=[<dir>,<sweep dir>]    # one report over runs and sweeps from anywhere
  grow export run=<run dir> out=<dir>     # the checkpoint as a transformers model directory
  grow train --help                       # Hydra's help: config groups and the composed config
  grow --version                          # grow's version, the checkout's commit, torch's version
"""


def command() -> list[str]:
    """How a script starts grow in a new process: ``$GROW`` split as a shell would (make's ``GROW``: a wrapper, or
    the tests' warm fork), else this interpreter's ``-m grow``."""
    return shlex.split(os.environ.get("GROW", "")) or [sys.executable, "-m", "grow"]


def usage() -> str:
    width = max(len(c) for c in COMMANDS)
    lines = "\n".join(f"  {name:<{width}}  {desc}" for name, (_, _, desc) in COMMANDS.items())
    return USAGE.format(commands=lines)


def fail(message: str) -> None:
    print(f"error: {message}", file=sys.stderr)
    sys.exit(2)


def finished_run(resume) -> bool:
    """``grow train resume=<a run that finished>``: say so, change nothing (not even Hydra's .hydra/)."""
    done = resume.finished() if resume is not None else None
    if done is None:
        return False
    print(resume.complete_message(done))
    return True


def resume_of(command: str, argv: list[str]):
    """The run ``resume=`` names (`grow.checkpoint.Resume`), resolved once for the whole command (``latest``: the
    newest run now); None without one (only ``grow train`` resumes)."""
    from grow.checkpoint import Resume  # start-up speed

    return Resume.from_argv(argv) if command == "train" else None


def front(module, argv: list[str], resume) -> list[str]:
    """The overrides put before the command line: the command's own (`extra_overrides`), then a resume's (its run's
    overrides and its directory as the run directory; after the command's, so they win)."""
    return [*module.extra_overrides(argv), *(resume.hydra_overrides() if resume is not None else [])]


def check_new_run_dir(argv: list[str], resume) -> None:
    """A new run given ``hydra.run.dir=<dir>`` that holds another run is refused before Hydra writes
    its .hydra/ there (`grow.checkpoint.run_dir_problem`; the trainer checks again, whatever the directory);
    a resume's run (``resume``) may not have a live writer."""
    from grow import checkpoint  # start-up speed

    if resume is not None:
        live = checkpoint.holder(resume.run)
        if live:
            raise ConfigError("resume", resume.value, f"a live process ({live}) is training in {resume.run}; wait "
                                                      "for it to end (or stop it) first")
        return
    value = None
    for a in argv:
        key, eq, v = a.partition("=")
        if eq and key.lstrip("+") == "hydra.run.dir":
            value = v.strip().strip("'\"")
    if not value or "${" in value:
        return
    live = checkpoint.holder(Path(value))
    if live:
        raise ConfigError("hydra.run.dir", value, f"a live process ({live}) is training in this run directory")
    problem = checkpoint.run_dir_problem(Path(value), None)
    if problem:
        raise ConfigError("hydra.run.dir", value, problem)


def _override(argv: list[str], key: str) -> str | None:
    value = None
    for a in argv:
        k, eq, v = a.partition("=")
        if eq and k.lstrip("+") == key:
            value = v.strip().strip("'\"")
    return value


def check_output_dir(argv: list[str], key: str) -> None:
    """The directory a run or sweep writes (``key``: ``hydra.run.dir`` / ``hydra.sweep.dir``, by default
    under ``outputs/``) can be created and written, checked before Hydra creates it: a path through a
    file, a read-only file system or a directory without write permission is one line, exit 2 (Hydra
    would end in a traceback while creating ``.hydra/``). Only a temporary file is created and removed."""
    import tempfile


    value = _override(argv, key) or "outputs/"
    static = value.split("${")[0]
    path = Path(static) if "${" not in value or static.endswith("/") else Path(static).parent
    path = path.expanduser()
    blocker = file_in_the_way(path)
    if blocker is not None:
        raise ConfigError(key, value, f"{blocker} is a file, not a directory")
    existing = path
    while not existing.exists() and existing != existing.parent:
        existing = existing.parent
    try:
        tempfile.TemporaryFile(dir=existing).close()
    except OSError as exc:
        raise ConfigError(key, value, f"cannot write in {existing} ({exc.strerror or exc}); choose a writable "
                                      "directory") from None


def check_sweep_has_m(command: str, argv: list[str]) -> None:
    """A sweep (``seed=0,1``, ``range(..)``, ``choice(..)``) without ``-m``: one line saying to add it
    (Hydra's four-line "Ambiguous value" otherwise). ``grow compare`` is a sweep by itself."""
    from hydra.core.override_parser.overrides_parser import OverridesParser


    if command == "compare" or any(a in ("-m", "--multirun") for a in argv):
        return
    try:
        parsed = OverridesParser.create().parse_overrides([a for a in argv if not a.startswith("-")])
    except Exception:  # noqa: BLE001 - a line that does not parse: precheck says why, in one line
        return
    for o in parsed:
        if o.is_sweep_override():
            compare = "; to compare strategies against the baseline: grow compare" if command == "train" else ""
            raise ConfigError(o.get_key_element().lstrip("+~"), o.input_line.partition("=")[2],
                              f"a sweep runs with -m, one job per value (grow {command} ... {o.input_line} -m){compare}")


SLURM_LAUNCHERS = ("slurm", "submitit_slurm")


def check_launcher(argv: list[str]) -> None:
    """``hydra/launcher=slurm`` where no job can be submitted (`grow.slurm.unavailable`): one line before
    Hydra starts the launcher (submitit's traceback otherwise)."""
    from grow import slurm  # start-up speed

    launcher = _override(argv, "hydra/launcher")
    if launcher not in SLURM_LAUNCHERS:
        return
    problem = slurm.unavailable()
    if problem:
        raise ConfigError("hydra/launcher", launcher, f"{problem}: run it on a SLURM cluster's login node, or leave "
                                                      "hydra/launcher out to run the jobs here one after another")


def load_plugins() -> None:
    """The strategies of ``GROW_PLUGINS`` registered before anything composes a config (`grow.plugins`)."""

    try:
        plugins.load()
    except ConfigError as exc:
        fail(str(exc))


def main(argv: list[str] | None = None) -> None:
    argv = list(sys.argv[1:] if argv is None else argv)
    if not argv or argv[0] in ("-h", "--help", "help"):
        print(usage())
        return
    if argv[0] in ("-V", "--version", "version"):
        from grow.provenance import code_version, describe  # start-up speed

        print(describe(code_version()))  # what a run's summary.json records as its code
        return
    command, rest = argv[0], argv[1:]
    if command not in COMMANDS:
        fail(f"command={command!r}: must be one of {', '.join(COMMANDS)} (see grow --help)")
    module_name, config_name, _ = COMMANDS[command]
    load_plugins()
    module = importlib.import_module(module_name)
    rest = module.normalize(rest) if hasattr(module, "normalize") else rest
    if show.wanted(rest):
        return show_configs(command, module, config_name, rest)
    if any(a in INFO_FLAGS for a in rest):  # Hydra's --help, --info, ...: Hydra's app answers, nothing is checked
        try:
            sys.argv = [f"grow {command}", *front(module, rest, resume_of(command, rest)), *rest]
        except (ConfigError, DataError) as exc:
            fail(str(exc))
        return module.main()
    if command != "compare" and not any(a in ("-m", "--multirun", "hydra.mode=MULTIRUN") for a in rest):
        return run_single(command, module, config_name, rest)
    from grow.run import handing_over  # start-up speed

    with handing_over():  # the runs the precheck assembles are the jobs' (each plan and strategy built once)
        run_sweep(command, module, config_name, rest)


def run_single(command: str, module, config_name: str, rest: list[str]) -> None:
    """One job (`grow.commands.once`): composed once with Hydra's compose API, checked into the command's object
    (a run: `grow.run.load`), its directory written, the command's ``job`` called with the object."""
    import copy

    from grow.commands import once, precheck  # start-up speed
    from grow.run import load  # start-up speed

    own = [a for a in rest if not a.split("=")[0].lstrip("+~").startswith("hydra")]
    try:
        check_sweep_has_m(command, rest)
        precheck.check_added_once(own)
        resume = resume_of(command, rest)  # the one resolution of resume= (latest: the newest run now)
        if command == "train":  # a live writer first: its newest checkpoint may be mid-write, which is no news
            check_new_run_dir(rest, resume)
        overrides = [*(resume.hydra_overrides() if resume is not None else []), *rest]
        name = module.__name__.rpartition(".")[2]
        with precheck.composition_errors(config_name, [o for o in overrides if not o.startswith("hydra")]):
            cfg = once.compose(config_name, overrides, job_name=name)
            task, out = once.start(cfg)
            checked = precheck.check_one(config_name, own, copy.deepcopy(task), getattr(module, "check", load), resume)
        if finished_run(resume):
            return
        if command == "train":
            check_output_dir(rest, "hydra.run.dir")
        # under torchrun the process group is joined only now: a refusal above needs no peer (a rank that waited
        # for one would hang), and every rank then takes rank 0's run directory (the job composed again with it)
        joined = module.extra_overrides(rest)
        if joined:
            cfg = once.compose(config_name, [*joined, *overrides], job_name=name)
            task, out = once.start(cfg)
    except (ConfigError, DataError) as exc:
        fail(str(exc))
    with interrupts_end_in_one_line():
        once.write_run_dir(cfg, task, out)
        module.job(checked)


def show_configs(command: str, module, config_name: str, argv: list[str]) -> None:
    """``--cfg``: the config of each job the command would run, as the command rewrites its command line
    (``job_overrides``, else ``extra_overrides`` in front), composed and printed by `grow.commands.show`."""
    from grow.commands.precheck import hydra_error  # start-up speed

    try:
        cfg_type, package, resolve, overrides = show.parse(argv)
        rewrite = getattr(module, "job_overrides", None)
        overrides = rewrite(overrides) if rewrite else [*front(module, overrides, resume_of(command, overrides)),
                                                        *overrides]
        show.show(config_name, overrides, cfg_type, package, resolve)
    except (ConfigError, DataError) as exc:
        fail(str(exc))
    except Exception as exc:  # noqa: BLE001 - Hydra's and OmegaConf's composition errors, in one line
        fail(str(hydra_error(exc, config_name)))


def run_sweep(command: str, module, config_name: str, rest: list[str]) -> None:
    """``grow compare`` or a ``-m`` sweep: every job checked (`grow.commands.precheck`), then Hydra's launcher."""
    from grow.commands.precheck import precheck  # start-up speed

    try:
        check_sweep_has_m(command, rest)
        resume = resume_of(command, rest)
        if command == "train":  # a live writer first: its newest checkpoint may be mid-write, which is no news
            check_new_run_dir(rest, resume)
        precheck(config_name, rest, getattr(module, "check", None),  # a resume: no experiment changed
                 getattr(module, "composable", None))
        if finished_run(resume):
            return
        if command in ("train", "compare"):
            check_output_dir(rest, "hydra.sweep.dir")
            check_launcher(rest)
        sys.argv = [f"grow {command}", *front(module, rest, resume), *rest]
    except (ConfigError, DataError) as exc:
        fail(str(exc))
    with interrupts_end_in_one_line():
        module.main()


@contextmanager
def interrupts_end_in_one_line():
    """Ctrl-C ends a command with one line and exit status 130, never a traceback: one outside a run's
    own handling (composing, tokenizing; a run checkpoints, `grow.checkpoint.StopRequest`) ends here,
    and once the command exits with 130 a further Ctrl-C ends the process at once (os._exit: the
    checkpoint and the message are written; no KeyboardInterrupt inside the interpreter's exit)."""
    from grow.checkpoint import EXIT_CODES  # start-up speed

    try:
        yield
    except KeyboardInterrupt:
        print("stopped by Ctrl-C; what was written stays (checkpoints and caches are written atomically): run the "
              "command again to go on (a run: grow train resume=<run dir>)", file=sys.stderr)
        exc = SystemExit(EXIT_CODES["SIGINT"])
    except SystemExit as caught:
        exc = caught
    else:
        return
    if exc.code == EXIT_CODES["SIGINT"] and threading.current_thread() is threading.main_thread():
        signal.signal(signal.SIGINT, lambda *_: os._exit(EXIT_CODES["SIGINT"]))
    raise exc


if __name__ == "__main__":
    main()
