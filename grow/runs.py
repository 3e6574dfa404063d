"""Run directories on disk: finding them and reading their config, records, checkpoints and tokenizer.

A run directory is what one training run writes: a ``grow train`` run (its config in ``.hydra/``) or
one arm of a ``grow compare`` sweep (``<sweep dir>/<arm>-seed<N>/`` with ``arm.json``); either holds
``metrics.jsonl``, ``checkpoints/`` and, once finished, ``summary.json`` (docs/usage.md). ``grow
sample`` and ``grow eval`` read a checkpoint and tokenizer (`find_checkpoint`, `load_model`,
`load_tokenizer`); `find_runs` describes a ``grow train`` run as ``arm.json`` describes an arm
(`arm_of_train_run`), so both go through the same report.
"""

from __future__ import annotations

import json
import os
import shlex
import sys
from dataclasses import dataclass, field
from pathlib import Path

from grow import checkpoint
from grow.data import DataConfig
from grow.data.cache import cache_path
from grow.data.config import EOT
from grow.device import resolve_device, resolve_precision
from grow.errors import ConfigError, DataError
from grow.growth.base import get_strategy
from grow.masks import build_model
from grow.metrics import read_metrics
from grow.model import TransformerConfig

RUN_FILES = ("arm.json", "config.yaml", ".hydra/config.yaml", "metrics.jsonl")
CONFIG_FILES = ("config.yaml", ".hydra/config.yaml")
NOT_A_RUN = ("not a grow run directory (a grow train run directory or an arm of a grow compare sweep, "
             "with metrics.jsonl, checkpoints/ and a config)")


def is_run_dir(d: Path) -> bool:
    d = Path(d)
    return d.is_dir() and (any((d / f).is_file() for f in RUN_FILES) or (d / "checkpoints").is_dir())


def is_complete(run_dir: Path) -> bool:
    try:
        return json.loads((Path(run_dir) / "summary.json").read_text()).get("complete") is True
    except (OSError, ValueError, AttributeError):
        return False


def read_config(run_dir: Path) -> dict | None:
    """The run's config as a plain dict (interpolations resolved where they can be), or None."""
    from omegaconf import OmegaConf

    for name in CONFIG_FILES:
        path = Path(run_dir) / name
        if path.is_file():
            cfg = OmegaConf.load(path)
            try:
                return OmegaConf.to_container(cfg, resolve=True)
            except Exception:  # noqa: BLE001 - an environment variable the run had and this shell lacks
                return OmegaConf.to_container(cfg, resolve=False)
    return None


def _read_json(path: Path) -> dict | None:
    try:
        return json.loads(Path(path).read_text())
    except (OSError, ValueError):
        return None


# ---- runs for the report ------------------------------------------------------------------------------


@dataclass
class FoundRun:
    """One run (an arm and a seed) as found on disk. ``arm`` is its ``arm.json`` (or `arm_of_train_run`);
    ``source`` the directory it was found through (its sweep, or itself); ``base`` the baseline run
    its ratios are taken against, ``matched`` the baseline in its strategy's parameterization (a
    grown run's, or a matched run itself; both set by the report)."""

    dir: Path
    arm: dict
    summary: dict | None = None
    failed: str | None = None
    records: list = field(default_factory=list)
    source: Path | None = None
    config: dict | None = None
    command: str | None = None
    base: "FoundRun | None" = None
    matched: "FoundRun | None" = None

    @property
    def label(self) -> str:
        return self.arm["arm"]

    @property
    def seed(self) -> int:
        return int(self.arm["seed"])

    @property
    def complete(self) -> bool:
        return self.summary is not None and self.summary.get("complete") is True


def parameterization(cfg: dict | None) -> str | None:
    """The parameterization of a run's strategy node (`grow.growth.base.Strategy.parameterization`:
    vt's Table 1 for vt, and for svd over a vt base), or None (the model's own initializer, or a
    strategy this version of grow cannot build)."""
    node = (cfg or {}).get("strategy")
    if not isinstance(node, dict) or not node.get("name"):
        return None
    try:
        return get_strategy(dict(node)).parameterization()
    except Exception:  # noqa: BLE001 - an old or unknown strategy: no parameterization to pair by
        return None


def arm_of_train_run(summary: dict | None, cfg: dict | None, name: str, job: int) -> dict:
    """The ``arm.json`` of a ``grow train`` run: a grown arm named after its strategy, the baseline (no
    schedule), or, without a schedule and with ``init=strategy`` for a strategy with its own
    parameterization, the matched baseline ``baseline init=<parameterization>`` (what ``grow compare``
    trains). Its plan FLOPs are the sum of its summary's stage plan."""
    summary, cfg = summary or {}, cfg or {}
    scheduled = cfg.get("schedule") is not None if cfg else summary.get("strategy") not in (None, "baseline")
    strategy = ((cfg.get("strategy") or {}).get("name") or summary.get("strategy")) if scheduled else None
    param = parameterization(cfg)
    matched = not scheduled and cfg.get("init") == "strategy" and param is not None
    plan = summary.get("stage_plan")
    label = strategy or (f"baseline init={param}" if matched else "baseline" if cfg or summary else name)
    return {"arm": label, "kind": "grown" if scheduled else "matched" if matched else "baseline",
            "strategy": strategy, "parameterization": param if scheduled or matched else None,
            "seed": int(cfg.get("seed", summary.get("seed", 0))), "setting": {}, "baseline_arm": "baseline",
            "job": job, "plan_flops": float(sum(s["flops"] for s in plan)) if plan else float("nan"),
            "plan": plan or []}


def _command(run_dir: Path, arm: dict, source: Path) -> str | None:
    """The command line that made the run: ``arm.json``'s, a compare sweep's ``multirun.yaml``, or
    ``grow train`` with the run's ``.hydra/overrides.yaml``."""
    if arm.get("command"):
        return arm["command"]
    from omegaconf import OmegaConf

    multirun = Path(source) / "multirun.yaml"
    if (run_dir / "arm.json").is_file() and multirun.is_file():
        task = OmegaConf.load(multirun).hydra.overrides.task
        return shlex.join(["grow", "compare", *uncompare(list(task))])
    overrides = run_dir / ".hydra" / "overrides.yaml"
    if overrides.is_file():
        return shlex.join(["grow", "train", *(str(o) for o in OmegaConf.load(overrides))])
    return None


def uncompare(task: list[str]) -> list[str]:
    """A compare sweep's Hydra overrides back as typed: without the arms and keys `grow compare` adds."""
    out = []
    for o in task:
        if o.startswith(("compare.vary=", "compare.invocation=", "hydra.searchpath=")):
            continue
        if o.startswith("strategy="):
            names = [n for n in o.split("=", 1)[1].split(",") if n not in ("baseline", "equal_flops")]
            if not names:
                continue
            o = "strategy=" + ",".join(names)
        out.append(o[2:] if o.startswith("++strategy.") else o)
    return out


def read_run(run_dir: Path, source: Path, job: int = 0) -> FoundRun:

    run_dir = Path(run_dir)
    summary = _read_json(run_dir / "summary.json") if is_complete(run_dir) else None
    cfg = read_config(run_dir)
    arm = _read_json(run_dir / "arm.json") or arm_of_train_run(summary, cfg, run_dir.name, job)
    run = FoundRun(run_dir, arm, summary=summary, source=Path(source), config=cfg)
    if summary is not None:
        run.records = read_metrics(run_dir)
    elif (run_dir / "failed.json").is_file():
        run.failed = (_read_json(run_dir / "failed.json") or {}).get("error", "failed")
    run.command = _command(run_dir, arm, run.source)
    return run


def run_dirs(path: Path, key: str = "runs") -> list[Path]:
    """The run directories of ``path``: itself when it is one, else those one level down (a sweep).
    `ConfigError` naming ``key`` when there is none. Reads no file."""
    path = Path(os.path.expanduser(str(path)))
    if not path.is_dir():
        raise ConfigError(key, str(path), "no such directory (a run directory or a sweep directory of runs)")
    if is_run_dir(path):
        return [path]
    found = sorted(d for d in path.iterdir() if is_run_dir(d))
    if not found:
        raise ConfigError(key, str(path), "neither a grow run directory nor a sweep of them (no arm.json, "
                                          "config.yaml, .hydra/config.yaml, metrics.jsonl or checkpoints/ in "
                                          "it or one level down)")
    return found


def find_runs(path: Path, key: str = "runs") -> list[FoundRun]:
    """The runs of ``path`` (`run_dirs`), read, in job order."""
    path = Path(os.path.expanduser(str(path)))
    runs = [read_run(d, path, i) for i, d in enumerate(run_dirs(path, key))]
    runs.sort(key=lambda r: (r.arm.get("job", 0), r.seed, r.dir.name))
    return runs


# ---- one run's checkpoint, model and tokenizer ----------------------------------------------------------


def resolve_run(value, key: str = "run", root: Path | str = "outputs") -> Path:
    """The run directory of ``run=<dir>`` (or ``<dir>/checkpoints``), or ``run=latest``: the run under
    ``outputs/`` with the newest checkpoint. `ConfigError` naming ``key`` when it is not a run with a
    checkpoint."""
    text = str(value)
    if text == "latest":
        found = list(Path(root).glob(f"**/{checkpoint.SUBDIR}/ckpt-*.json")) if Path(root).is_dir() else []
        if not found:
            raise ConfigError(key, text, f"no run directory with a checkpoint under {Path(root).resolve()}/ "
                                         f"(give the run directory: {key}=<run dir>)")
        return max(found, key=lambda p: p.stat().st_mtime_ns).parent.parent
    run = Path(os.path.expanduser(text))
    if run.name == checkpoint.SUBDIR and run.is_dir():
        run = run.parent
    if not run.is_dir():
        raise ConfigError(key, text, "no such directory (give a run directory, or latest)")
    if not checkpoint.list_checkpoints(run):
        why = NOT_A_RUN if not is_run_dir(run) else "no checkpoint in its checkpoints/ (deleted?)"
        raise ConfigError(key, text, why)
    return run


def find_checkpoint(run_dir: Path, ckpt=None) -> dict:
    """The manifest of the run's newest checkpoint (``ckpt`` null or ``latest``), or of ``ckpt``: a
    ``.pt`` or ``.json`` path, or a checkpoint's name in the run's ``checkpoints/``. Verified (size
    and SHA-256) before anything loads it."""
    run_dir = Path(run_dir)
    found = checkpoint.list_checkpoints(run_dir)
    if ckpt in (None, "", "latest"):
        checkpoint.latest_complete(run_dir)  # one line when a newer checkpoint file has no manifest (skipped)
        path = found[-1]
    else:
        given = Path(os.path.expanduser(str(ckpt)))
        names = [given, run_dir / given, checkpoint.checkpoint_dir(run_dir) / given]
        tries = [p.with_suffix(".json") if p.suffix in (".pt", ".json") else p.with_name(p.name + ".json")
                 for p in names]
        path = next((p for p in tries if p.is_file()), None)
        if path is None and (pt := explicit_file(run_dir, ckpt)) is not None:
            if pt not in _UNVERIFIED_SAID:  # once a process (the precheck and the command both look)
                _UNVERIFIED_SAID.add(pt)
                print(f"warning: ckpt={ckpt}: its manifest {pt.with_suffix('.json').name} is missing; loading "
                      f"{pt} without checking its size and SHA-256", file=sys.stderr, flush=True)
            return {"path": str(pt), "file": pt.name, "run_dir": str(pt.parent.parent), "unverified": True}
        if path is None:
            have = ", ".join(p.stem for p in found[-4:])
            raise ConfigError("ckpt", str(ckpt), f"no such checkpoint in {checkpoint.checkpoint_dir(run_dir)}/ "
                                                 f"(it has {have}; or ckpt=latest)")
    try:
        meta = checkpoint.read_manifest(path)
        checkpoint.verify(meta, full=True)
    except ConfigError as exc:
        raise ConfigError("ckpt", str(path.with_suffix(".pt")), exc.allowed) from None
    return meta


_UNVERIFIED_SAID: set[Path] = set()


def explicit_file(run_dir: Path, ckpt) -> Path | None:
    """The ``.pt`` file ``ckpt=`` names (a path, or a name in the run's ``checkpoints/``), when it exists."""
    if ckpt in (None, "", "latest"):
        return None
    given = Path(os.path.expanduser(str(ckpt)))
    names = [given, Path(run_dir) / given, checkpoint.checkpoint_dir(Path(run_dir)) / given]
    return next((p.with_suffix(".pt") for p in names if p.with_suffix(".pt").is_file()), None)


def load_model(meta: dict, device="cpu"):
    """(model in eval mode on ``device``, the checkpoint's payload): the architecture the checkpoint
    was saved at, its weights (every Linear's ``mult`` and any growth masks too, `grow.masks.build_model`)."""
    try:
        if meta.get("unverified"):  # an explicit ckpt= whose manifest is gone (`find_checkpoint`)
            payload = checkpoint.load_file(meta["path"], map_location="cpu")
            meta.update(step=payload["state"]["step"], stage=payload["state"]["stage"])
        else:
            payload = checkpoint.load(meta, map_location="cpu")
    except ConfigError as exc:
        raise ConfigError("ckpt", meta["path"], exc.allowed) from None
    model = build_model(TransformerConfig.from_dict(payload["model_config"]), payload["model"])
    return model.to(device).eval(), payload


def tokenizer_path(run_dir: Path, cfg: dict) -> Path:
    """``<run dir>/tokenizer.json`` (copied there by the trainer), else the one in the token cache the
    run's data config names (found by fingerprinting the corpus again, as the trainer did)."""
    own = Path(run_dir) / "tokenizer.json"
    if own.is_file():
        return own

    cache = cache_path(DataConfig.from_node(cfg["data"]))
    path = cache / "tokenizer.json"
    if not path.is_file():
        raise DataError(f"run={run_dir}: no tokenizer.json in the run directory, and its token cache {cache} "
                        "has none (moved or deleted: rerun grow train's data step with the run's data settings)")
    return path


def load_tokenizer(run_dir: Path, cfg: dict, vocab_size: int | None = None):
    """(the run's tokenizer, the file it was read from). A file the tokenizers library cannot read, or a
    tokenizer with more ids than the model's ``vocab_size``, is `DataError` (one line, exit 2)."""
    from tokenizers import Tokenizer

    path = tokenizer_path(run_dir, cfg)
    try:
        tok = Tokenizer.from_file(str(path))
    except Exception as exc:  # noqa: BLE001 - the library raises a bare Exception for a damaged file
        raise DataError(f"run={run_dir}: its tokenizer {path} cannot be read ({str(exc).splitlines()[0]}); "
                        "restore it (the token cache keeps a copy) or retrain the run") from None
    size = tok.get_vocab_size(with_added_tokens=True)
    if vocab_size is not None and size > vocab_size:
        raise DataError(f"run={run_dir}: its tokenizer {path} has {size} ids, the checkpoint's model "
                        f"{vocab_size}: not the tokenizer this model was trained with")
    return tok, path


def eot_token(cfg: dict) -> str:
    """The end-of-text token the run's documents end with (data.eot_token: grow's ``<|endoftext|>``, or a
    pretrained checkpoint's own end of sequence, `grow.hf.pretrained.prepare`)."""

    return str((cfg.get("data") or {}).get("eot_token") or EOT)


@dataclass
class OpenCheckpoint:
    """A run's checkpoint ready to use (`grow sample`, `grow eval`): the model on its device, in eval mode."""

    run_dir: Path
    meta: dict  # the checkpoint's manifest
    payload: dict
    model: object  # grow.model.Transformer
    device: object  # torch.device
    amp: object  # the autocast dtype of ``precision`` on that device, or None
    tokenizer: object
    tokenizer_path: Path


def require_checkpoint(cfg, usage: str) -> tuple[Path, dict]:
    """`checkpoint_of` for a command that reads a run (``grow sample``, ``grow eval``): a missing ``run=``
    is one `ConfigError` showing ``usage``."""
    from omegaconf import OmegaConf

    if OmegaConf.is_missing(cfg, "run") or cfg.run in (None, ""):
        raise ConfigError("run", ..., f"give a run directory: {usage} (or run=latest)")
    return checkpoint_of(cfg)


def checkpoint_of(cfg) -> tuple[Path, dict]:
    """(run directory, checkpoint manifest) that ``cfg.run`` and ``cfg.ckpt`` name (`find_checkpoint`); an
    explicit ``ckpt=`` file whose manifest is gone is used unverified, said in one warning line."""
    given = Path(os.path.expanduser(str(cfg.run)))
    pt = explicit_file(given, cfg.ckpt)
    run_dir = resolve_run(cfg.run) if pt is None else (given if given.is_dir() else pt.parent.parent)
    meta = find_checkpoint(run_dir, cfg.ckpt)
    _same_run(run_dir, Path(meta["path"]), cfg.ckpt)
    return run_dir, meta


def _same_run(run_dir: Path, pt: Path, ckpt) -> None:
    """Refuse a ``ckpt=`` in another run's ``checkpoints/``: its model would meet ``run=``'s tokenizer."""
    owner = pt.parent.parent
    if pt.parent.name == checkpoint.SUBDIR and owner.resolve() != Path(run_dir).resolve():
        raise ConfigError("ckpt", str(ckpt), f"is a checkpoint of the run {owner}, not of run={run_dir} (a model "
                                             f"goes with its own run's tokenizer): give run={owner} ckpt={pt.name}")


def open_checkpoint(cfg) -> OpenCheckpoint:
    """The checkpoint that ``cfg.run`` / ``cfg.ckpt`` name, on ``cfg.device`` at ``cfg.precision``, with
    the run's tokenizer."""
    run_dir, meta = checkpoint_of(cfg)
    device = resolve_device(str(cfg.device))
    _, amp = resolve_precision(str(cfg.precision), device)
    model, payload = load_model(meta, device)
    tok, tok_path = load_tokenizer(run_dir, payload["config"], model.config.vocab_size)
    return OpenCheckpoint(run_dir, meta, payload, model, device, amp, tok, tok_path)
