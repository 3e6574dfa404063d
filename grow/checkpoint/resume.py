"""Resume: which run, its command line, what a resume may change, and the checkpoint it continues from.

Resume (``grow train resume=<run dir>`` or ``resume=latest``) reloads the newest checkpoint,
truncates ``metrics.jsonl`` to the checkpoint's length, and continues: the per-step losses are
the same as a run never stopped (bitwise on CPU). The command line of the run is taken from the
checkpoint; overrides given with ``resume=`` may change only `RESUME_ACCEPTS` (where and how the run
reports and saves), anything else is refused before any work (`Resume.check_keeps_experiment`). A
resume is resolved once into a `Resume` (the run it names, the command line it came with), which every
step of it asks: the CLI's checks, Hydra's overrides, the config's validation and the trainer.
"""

from __future__ import annotations

import json
import os
import sys
from dataclasses import dataclass
from pathlib import Path

from grow.checkpoint.files import (
    SUBDIR,
    CheckpointError,
    atomic_write,
    checkpoint_dir,
    latest_complete,
    list_checkpoints,
    load,
)
from grow.errors import CONFIG_DIR, ConfigError


def resolve_resume(value, root: Path | str = "outputs") -> Path:
    """The run directory of ``resume=<dir>`` (or ``<dir>/checkpoints``) or ``resume=latest``: the run
    under ``outputs/`` with the newest checkpoint. `ConfigError` when there is none."""
    value = str(value)
    if value == "latest":
        return _latest_train_run(Path(root))
    run = Path(os.path.expanduser(value))
    if run.name == SUBDIR and run.is_dir():
        run = run.parent
    if run.is_file() and run.parent.name == SUBDIR:
        raise ConfigError("resume", value, f"resume takes a run directory and continues from its newest "
                                           f"checkpoint: resume={run.parent.parent} (to start from this "
                                           "checkpoint, delete the newer ones)")
    if not run.is_dir():
        raise ConfigError("resume", value, "no such run directory (give a run directory, or resume=latest)")
    if not list_checkpoints(run):
        raise ConfigError("resume", value, f"no checkpoint in {checkpoint_dir(run)}/ (a run writes one at every "
                                           "growth, at its end, every trainer.ckpt_minutes minutes and every "
                                           "trainer.ckpt_every steps: this one was stopped before its first)")
    return run


def _latest_train_run(root: Path) -> Path:
    """The ``grow train`` run under ``root`` with the newest checkpoint: a ``grow compare`` sweep's arms (their
    ``arm.json``) are left out, since their sweep resumes them (`compare_arm_problem`)."""
    manifests = [p for p in root.glob(f"**/{SUBDIR}/ckpt-*.json")] if root.is_dir() else []
    trains = [p for p in manifests if not (p.parent.parent / "arm.json").is_file()]
    if not trains:
        arms = (f" ({len({p.parent.parent for p in manifests})} grow compare arms have checkpoints: a sweep goes "
                "on when its grow compare command runs again with its hydra.sweep.dir)") if manifests else ""
        raise ConfigError("resume", "latest", f"no grow train run directory with a checkpoint under {root.resolve()}/"
                                              f"{arms}; give the run directory: resume=<run dir>")
    return max(trains, key=lambda p: p.stat().st_mtime_ns).parent.parent


def _key(arg: str) -> str:
    return arg.split("=", 1)[0].lstrip("+~")


def resume_arg(argv: list[str]) -> str | None:
    value = None
    for a in argv:
        if not a.startswith("-") and "=" in a and _key(a) == "resume":
            value = a.split("=", 1)[1].strip()
            if len(value) >= 2 and value[0] == value[-1] and value[0] in "'\"":
                value = value[1:-1]
    return None if value in (None, "", "null", "None") else value


def saved_overrides(meta: dict, argv: list[str]) -> list[str]:
    """The checkpointed run's command-line overrides, minus ``resume=`` and those ``argv`` replaces.

    A group given again (``strategy=vt``) drops the saved group choice and its keys (``strategy.*``);
    any other key given again drops the saved value of that key."""
    user = [_key(a) for a in argv if not a.startswith("-") and ("=" in a or a.startswith("~"))]
    groups = {k for k in user if "." not in k and (CONFIG_DIR / k).is_dir()}
    out = []
    for a in meta.get("overrides") or []:
        k = _key(a)
        if k == "resume" or k.startswith("hydra.") or k in user or any(k.startswith(g + ".") for g in groups):
            continue
        out.append(a)
    return out


# what a resume may change: where and how the run reports and saves, not what it computes
RESUME_ACCEPTS = ("resume", "device", "logger.", "trainer.progress", "trainer.log_every", "trainer.ckpt_every",
                  "trainer.ckpt_minutes",
                  "trainer.keep_checkpoints", "trainer.skip_nonfinite", "trainer.device_memory_gb",
                  "trainer.micro_batch_size", "trainer.compile", "trainer.parallel",
                  "trainer.fsdp_reshard_after_forward", "data.num_proc", "data.verify", "data.cache_dir")


def _quote(value: str) -> str:
    return "'" + value.replace("\\", "\\\\").replace("'", "\\'") + "'"


@dataclass(frozen=True)
class Resume:
    """A resume (``resume=<run dir>`` or ``resume=latest``), resolved once: the value given, the run
    directory it names (`resolve_resume`) and the command line it came with. Each step of a resume asks
    it: the overrides to compose (`overrides`, for the CLI's checks; `hydra_overrides`, for Hydra),
    whether the experiment is kept (`check_keeps_experiment`), whether the run already finished
    (`finished`), the newest checkpoint (`manifest`)."""

    value: str
    run: Path
    argv: tuple[str, ...] = ()

    @classmethod
    def of(cls, value, argv=()) -> "Resume | None":
        """The resume ``value`` names (None without one); `ConfigError` when it names no resumable run."""
        return None if value is None else cls(str(value), resolve_resume(value), tuple(argv))

    @classmethod
    def from_argv(cls, argv) -> "Resume | None":
        """The resume of a command line's ``resume=`` (None without one); a ``grow compare`` arm is refused
        with the command that resumes it (`compare_arm_problem`)."""
        resume = cls.of(resume_arg(list(argv)), argv)
        problem = None if resume is None else compare_arm_problem(resume.run, resume.value)
        if problem:
            raise ConfigError("resume", resume.value, problem)
        return resume

    def manifest(self) -> dict:
        """The newest checkpoint's manifest (a newer file without one is skipped, said in one line)."""
        return latest_complete(self.run)

    def overrides(self) -> list[str]:
        """The run's saved overrides that the command line does not replace, to compose before it."""
        return saved_overrides(self.manifest(), list(self.argv))

    def base_overrides(self) -> list[str]:
        """The run's own overrides (as it was started)."""
        return saved_overrides(self.manifest(), [])

    def hydra_overrides(self) -> list[str]:
        """For ``grow train``'s Hydra command line: `overrides` and ``hydra.run.dir=<the run>``."""
        return [*self.overrides(), f"hydra.run.dir={_quote(str(self.run))}"]

    def finished(self) -> dict | None:
        """The run's summary if it finished (a resume of it changes nothing), else None."""
        return finished(self.run)

    def complete_message(self, summary: dict) -> str:
        return complete_message(self.run, summary)

    def check_keeps_experiment(self, run_cfg, now_cfg) -> None:
        """`ConfigError` on the first key that the command line changes (``now_cfg`` against the run's own
        ``run_cfg``, both composed) beyond `RESUME_ACCEPTS`: the model, schedule, strategy, data,
        optimizer, seed, token budget... define the experiment, and a resume continues it as it was."""
        from omegaconf import OmegaConf

        before, after = (_flatten(OmegaConf.to_container(c, resolve=True)) for c in (run_cfg, now_cfg))
        changed = [k for k in set(before) | set(after)
                   if before.get(k, ...) != after.get(k, ...) and not k.startswith(RESUME_ACCEPTS)]
        if not changed:
            return
        key = min(changed, key=lambda k: (not k.endswith(".name"), k))  # a group's choice (strategy=...) first
        shown = key.removesuffix(".name") if key.endswith(".name") else key
        accepted = ", ".join(k.rstrip(".") + (".*" if k.endswith(".") else "") for k in RESUME_ACCEPTS[1:])
        raise ConfigError(shown, after.get(key, "(absent)"),
                          f"a resume continues {self.run} as it was ({shown}={before.get(key, '(absent)')!r}); "
                          f"start a new run to change it (a resume may change only {accepted})")


def compare_arm_problem(run: Path, value: str) -> str | None:
    """Why ``grow train resume=`` does not continue ``run`` when it is an arm of a ``grow compare`` sweep
    (its ``arm.json``): the arm's command line is compare's, and the sweep resumes its unfinished arms
    itself, so the line names the command to rerun (arm.json's, with the sweep directory)."""
    import shlex

    try:
        arm = json.loads((Path(run) / "arm.json").read_text())
    except (OSError, ValueError):
        return None
    sweep = Path(run).resolve().parent
    command = arm.get("command") if isinstance(arm, dict) else None
    again = (f"{command} hydra.sweep.dir={shlex.quote(str(sweep))}" if command and "hydra.sweep.dir=" not in command
             else command) or f"the same grow compare command line with hydra.sweep.dir={shlex.quote(str(sweep))}"
    if finished(run) is not None:  # rerunning its sweep would change nothing
        return f"{run} is an arm of the grow compare sweep {sweep}, and complete (summary.json): nothing to resume"
    return f"{run} is an arm of the grow compare sweep {sweep}; the sweep goes on with its arms: {again}"


def _first_difference(saved: dict, now: dict) -> tuple[str, object, object] | None:
    for k in now:
        if k in saved and saved[k] != now[k]:
            return k, saved[k], now[k]
    return None


def check_compatible(meta: dict, final_cfg, plan, optim_name: str | None = None) -> None:
    """Refuse to resume ``meta`` (a manifest or a payload) into a different model, schedule or optimizer."""
    where = meta.get("run_dir") or "the checkpoint"
    diff = _first_difference(meta["final_config"], final_cfg.to_dict())
    if diff:
        k, old, new = diff
        raise ConfigError(f"model.{k}", new, f"the checkpoint in {where} trains a model with {k}={old!r}; resume "
                                             "needs the same model (start a new run to change it)")
    stage = int(meta["stage"])
    if stage >= len(plan):
        raise ConfigError("schedule.stages", len(plan), f"the checkpoint in {where} is in stage {stage + 1}; "
                                                        "resume needs the same schedule")
    diff = _first_difference(meta["model_config"], plan[stage].cfg.to_dict())
    if diff:
        k, old, new = diff
        raise ConfigError("schedule", ..., f"stage {stage + 1} of this plan has {k}={new!r}, the checkpoint's model "
                                           f"in {where} {k}={old!r}; resume needs the same schedule")
    triggered = ((plan.schedule or {}).get("trigger") or {"name": "fixed"})["name"] != "fixed"
    if int(meta["step_in_stage"]) > plan[stage].steps and not triggered:  # a trigger's stages are not the plan's
        raise ConfigError("trainer.max_tokens", ..., f"the checkpoint in {where} is at step {meta['step_in_stage']} "
                                                     f"of stage {stage + 1}, which has {plan[stage].steps} steps in "
                                                     "this plan; resume needs the same token budget")
    saved_opt = meta.get("optimizer_kind")
    if optim_name and saved_opt and saved_opt != optim_name:
        raise ConfigError("optim.name", optim_name, f"the checkpoint in {where} holds a {saved_opt!r} optimizer")


def _flatten(d, prefix="") -> dict:
    out = {}
    if isinstance(d, dict):
        for k, v in d.items():
            out.update(_flatten(v, f"{prefix}{k}."))
        return out
    return {prefix[:-1]: d}


IGNORED_DIFFS = ("resume", "trainer.progress", "logger.")


def config_differences(saved: dict, now: dict) -> list[str]:
    """``key: old -> new`` for every config value that differs (resume, progress and W&B keys aside)."""
    a, b = _flatten(saved), _flatten(now)
    keys = sorted(k for k in set(a) | set(b) if a.get(k, ...) != b.get(k, ...) and not k.startswith(IGNORED_DIFFS))
    return [f"{k}: {a.get(k, '(absent)')!r} -> {b.get(k, '(absent)')!r}" for k in keys]


def truncate_metrics(run_dir: Path, offset: int, source: Path | None = None) -> None:
    """Make ``run_dir/metrics.jsonl`` the first ``offset`` bytes of ``source``'s (its own by default)."""
    dst = Path(run_dir) / "metrics.jsonl"
    src = Path(source) / "metrics.jsonl" if source is not None else dst
    if not src.exists():
        if offset:
            print(f"resume: note: {src} is missing; metrics.jsonl restarts at the checkpoint", file=sys.stderr)
        return
    if src.stat().st_size < offset:
        raise CheckpointError(src, f"metrics.jsonl has {src.stat().st_size} bytes, fewer than the checkpoint's "
                                   f"{offset}: it was truncated or replaced")
    if src == dst:
        with open(dst, "r+b") as f:
            f.truncate(offset)
        return
    Path(run_dir).mkdir(parents=True, exist_ok=True)
    with open(src, "rb") as f:
        head = f.read(offset)
    atomic_write(dst, lambda f: f.write(head))


def task_overrides() -> list[str]:
    """The command line's overrides of the running Hydra job ([] outside Hydra)."""
    try:
        from hydra.core.hydra_config import HydraConfig

        return list(HydraConfig.get().overrides.task) if HydraConfig.initialized() else []
    except Exception:  # noqa: BLE001 - no Hydra, or no job config
        return []


def open_resume(cfg, run_dir: Path, final_cfg, plan, device, *, is_main: bool = True, whole: bool = True,
                log=print) -> dict | None:
    """The checkpoint to resume from (``cfg.resume``, ``cfg`` a `grow.config.RunConfig`), checked and
    loaded (``whole``: `grow.checkpoint.files.load_file`); None without ``resume``.

    On the main process, ``run_dir/metrics.jsonl`` becomes the resumed run's up to the checkpoint."""
    resume = cfg.resumed
    if resume is None:
        return None
    run, meta = resume.run, resume.manifest()
    check_compatible(meta, final_cfg, plan, str(cfg.optim.name))
    payload = load(meta, map_location=device, whole=whole)
    st = payload["state"]
    check_compatible({**payload, "run_dir": str(run), "stage": st["stage"], "step_in_stage": st["step_in_stage"],
                      "optimizer_kind": payload["optimizer"].get("kind")}, final_cfg, plan, str(cfg.optim.name))
    if is_main:
        same = Path(run).resolve() == Path(run_dir).resolve()
        truncate_metrics(run_dir, int(payload["metrics_offset"]), None if same else run)
        log(f"resume: {meta['path']} (step {st['step']}, stage {st['stage'] + 1}/{len(plan)}, "
            f"step {st['step_in_stage']} of {plan[st['stage']].steps}, {payload['phase']})")
        diffs = config_differences(payload.get("config") or {}, cfg.raw)
        if diffs:
            log("resume: the config differs from the checkpoint's in " + "; ".join(diffs[:8])
                + (f" (and {len(diffs) - 8} more)" if len(diffs) > 8 else ""))
    return payload


def finished(run_dir: Path) -> dict | None:
    """The summary of a run that finished (``summary.json`` with ``"complete": true``), else None."""
    try:
        summary = json.loads((Path(run_dir) / "summary.json").read_text())
    except (OSError, ValueError):
        return None
    return summary if isinstance(summary, dict) and summary.get("complete") is True else None


def complete_message(run: Path, summary: dict) -> str:
    loss = summary.get("final_val_loss")
    loss = f"{loss:.4f}" if isinstance(loss, (int, float)) else loss
    return (f"resume: {run} is complete (strategy {summary.get('strategy')}, {summary.get('tokens')} tokens, "
            f"final val loss {loss}); nothing to do, nothing changed (train again into another directory)")
