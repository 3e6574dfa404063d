"""Where metrics go: ``metrics.jsonl`` in the run directory (always) and Weights & Biases (a copy).

``metrics.jsonl`` and ``summary.json`` are the record; W&B mirrors them and can never stop a run:
its mode, the bounded connection check, the one-line warnings and the resume of a W&B run are in
docs/design.md, "Metrics, logging and the console".
"""

from __future__ import annotations

import configparser
import json
import math
import netrc
import os
import re
import sys
from pathlib import Path
from urllib.parse import urlparse

from grow.checkpoint import atomic_write
from grow.errors import disk_full
from grow.faults import kill_point
from grow.net import unreachable

GROWTH_COLUMNS = [
    "growth/stage", "train/tokens", "train/flops", "growth/params_before", "growth/params_after",
    "growth/loss_before", "growth/loss_after", "growth/delta", "growth/seconds", "growth/recovery",
]
MODES = {"online": "online", "run": "online", "shared": "online", "offline": "offline", "dryrun": "offline",
         "disabled": "disabled"}
DEFAULT_HOST = "https://api.wandb.ai"


def _clean(value):
    if isinstance(value, float) and not math.isfinite(value):
        return str(value)
    if hasattr(value, "item"):
        return _clean(value.item())
    return value


def warn(message: str) -> None:
    """One ``warning: ...`` line on stderr."""
    print(f"warning: {message}", file=sys.stderr, flush=True)


def _first_line(exc: BaseException) -> str:
    text = str(exc).strip()
    return f"{type(exc).__name__}: {text.splitlines()[0][:300]}" if text else type(exc).__name__


# ---- which mode ----------------------------------------------------------------------------------


def _hosts(env) -> list[str]:
    """The W&B server(s) whose credentials count: ``WANDB_BASE_URL``, else the ``base_url`` of W&B's
    settings file, else the installed wandb's default server and W&B's classic cloud host."""
    if env.get("WANDB_BASE_URL"):
        return [env["WANDB_BASE_URL"]]

    path = Path(env.get("WANDB_CONFIG_DIR") or Path.home() / ".config" / "wandb") / "settings"
    parser = configparser.ConfigParser()
    try:
        parser.read(path)
        configured = parser.get("default", "base_url", fallback="")
    except (configparser.Error, OSError, UnicodeDecodeError):
        configured = ""
    if configured:
        return [configured]
    try:  # the library's default server (it moved between wandb versions)
        from wandb.sdk.wandb_settings import Settings

        default = str(Settings.model_fields["base_url"].default)
    except Exception:  # noqa: BLE001 - an older or a missing wandb
        default = DEFAULT_HOST
    return list(dict.fromkeys([default, DEFAULT_HOST]))


def has_credentials(env=None) -> bool:
    """Whether W&B would find credentials without prompting: an API key or identity token file in
    the environment, or the netrc entry of the W&B host (what ``wandb login`` writes)."""
    env = os.environ if env is None else env
    if env.get("WANDB_API_KEY") or env.get("WANDB_IDENTITY_TOKEN_FILE"):
        return True
    path = env.get("NETRC") or str(Path.home() / ".netrc")
    try:
        entries = netrc.netrc(path)
    except (OSError, netrc.NetrcParseError, UnicodeDecodeError):
        return False
    for url in _hosts(env):
        auth = entries.authenticators(urlparse(url).hostname or "")
        if auth and auth[2]:
            return True
    return False


def wandb_mode(env=None) -> tuple[str, str | None]:
    """(online | offline | disabled, why it is offline when nobody asked for it, else None)."""
    env = os.environ if env is None else env
    asked = (env.get("WANDB_MODE") or "").strip().lower()
    if env.get("WANDB_DISABLED", "").strip().lower() in ("true", "1", "yes") and not asked:
        return "disabled", None
    mode = MODES.get(asked)
    if asked and mode is None:
        return "offline", f"WANDB_MODE={asked!r} is not a W&B mode (online, offline, disabled)"
    if mode in ("offline", "disabled"):
        return mode, None
    if has_credentials(env):
        return "online", None
    if asked:
        return "offline", "WANDB_MODE=online but no W&B credentials (WANDB_API_KEY or `wandb login`)"
    return "offline", "no WANDB_MODE and no W&B credentials (WANDB_API_KEY or `wandb login`)"


def server_url() -> str:
    """The W&B server an online run talks to (`_hosts`' first)."""
    return _hosts(os.environ)[0]


def _drop_inherited_service() -> None:
    """Forget a W&B service token inherited from another process (``<version>-<pid>-...``)."""
    token = os.environ.get("WANDB_SERVICE", "")
    m = re.match(r"\d+-(\d+)-", token)
    if m and int(m.group(1)) != os.getpid():
        os.environ.pop("WANDB_SERVICE", None)


# ---- the logger ----------------------------------------------------------------------------------


class MetricsLogger:
    """Appends records to ``metrics.jsonl`` and mirrors them to a W&B run (rank 0 only)."""

    def __init__(self, run_dir: Path, *, enabled: bool = True, wandb_cfg=None, config: dict | None = None,
                 resume_id: str | None = None):
        self.run_dir = Path(run_dir)
        self.enabled = enabled
        self.wandb = None
        self.wandb_mode = "disabled"
        self.wandb_replaced: str | None = None  # a checkpoint's W&B id that could not be resumed
        self.wandb_error: str | None = None  # the W&B failure that turned it off
        self._wandb_id: str | None = None
        self._file = None
        if not enabled:
            return
        self.run_dir.mkdir(parents=True, exist_ok=True)
        with disk_full("metrics.jsonl", self.run_dir / "metrics.jsonl"):
            self._file = open(self.run_dir / "metrics.jsonl", "a", buffering=1)
        if wandb_cfg is not None:
            self.wandb_mode, why = wandb_mode()
            if self.wandb_mode != "disabled":
                self._init_wandb(wandb_cfg, config or {}, resume_id, why)

    # ---- W&B, guarded: any failure is one warning line and W&B is off -----------------------
    def _init_wandb(self, wcfg, config: dict, resume_id: str | None, why: str | None) -> None:
        try:
            import wandb
        except Exception as exc:  # noqa: BLE001 - a broken W&B install must not stop the run
            warn(f"W&B: cannot import wandb ({_first_line(exc)}); the run goes on without it "
                 "(metrics.jsonl is the record)")
            return
        _drop_inherited_service()
        if os.environ.get("WANDB_MODE") and MODES.get(os.environ["WANDB_MODE"].strip().lower()) is None:
            os.environ["WANDB_MODE"] = self.wandb_mode  # wandb itself would refuse the value it reads there
        timeout = float(wcfg.get("init_timeout") or 10.0)
        if self.wandb_mode == "online":
            url = server_url()
            print(f"W&B: connecting to {url} (up to {timeout:g} s; WANDB_MODE=offline skips this)",
                  file=sys.stderr, flush=True)
            problem = unreachable(url, timeout)
            if problem:
                self.wandb_mode = "offline"
                warn(f"W&B: cannot reach {url} ({problem}); logging offline to {self.run_dir / 'wandb'} "
                     f"(upload later with `wandb sync`; set WANDB_MODE=offline to skip the wait)")
        if why:
            print(f"W&B: {why}: logging offline to {self.run_dir / 'wandb'}; upload later with "
                  f"`wandb sync {self.run_dir / 'wandb'}/offline-run-*`", file=sys.stderr, flush=True)
        kwargs = dict(project=wcfg.get("project", "grow"), entity=wcfg.get("entity"), group=wcfg.get("group"),
                      name=wcfg.get("name"), tags=list(wcfg.get("tags") or []), dir=str(self.run_dir),
                      config=config, mode=self.wandb_mode)
        if hasattr(wandb, "Settings"):  # W&B's own wait at init, bounded the same way
            kwargs["settings"] = wandb.Settings(init_timeout=timeout)
        try:
            run = wandb.init(**kwargs, id=resume_id, resume="allow" if resume_id else None)
        except Exception as exc:  # noqa: BLE001
            if resume_id is None:
                self._off("init", exc)
                return
            try:  # the id is held elsewhere (a killed process's W&B service): a new W&B run
                run = wandb.init(**kwargs)
            except Exception as exc2:  # noqa: BLE001
                self._off("init", exc2)
                return
            self.wandb_replaced = resume_id
            warn(f"W&B: cannot resume W&B run {resume_id} ({_first_line(exc)}); logging to a new W&B run "
                 f"{run.id} (summary.json names both)")
        self.wandb, self._wandb_id = run, run.id
        try:
            run.define_metric("train/tokens")
            run.define_metric("train/flops")
            run.define_metric("*", step_metric="train/tokens")
        except Exception as exc:  # noqa: BLE001
            self._off("define_metric", exc)

    def _off(self, where: str, exc: BaseException) -> None:
        self.wandb_error = f"{where}: {_first_line(exc)}"
        warn(f"W&B {where} failed ({_first_line(exc)}); the run goes on without W&B (metrics.jsonl is the record)")
        run, self.wandb = self.wandb, None
        if run is not None and where != "finish":
            try:
                run.finish(exit_code=1)
            except Exception:  # noqa: BLE001 - already reported
                pass

    @property
    def wandb_id(self) -> str | None:
        """The W&B run's id (kept after a W&B failure, so that a resume tries that run again)."""
        return self._wandb_id

    @property
    def offset(self) -> int:
        """Bytes of ``metrics.jsonl`` written so far (a checkpoint records it; resume truncates to it)."""
        return 0 if self._file is None else self._file.tell()

    def log(self, record: dict) -> None:
        if not self.enabled:
            return
        record = {k: _clean(v) for k, v in record.items()}
        with disk_full("metrics.jsonl", self.run_dir / "metrics.jsonl", _RESUME_HINT.format(run=self.run_dir)):
            self._file.write(json.dumps(record) + "\n")
        kill_point("metrics")
        if self.wandb is not None:
            try:
                self.wandb.log({k: v for k, v in record.items() if isinstance(v, (int, float))})
            except Exception as exc:  # noqa: BLE001
                self._off("log", exc)

    def wandb_info(self) -> dict:
        """summary.json's ``wandb`` entry: the mode, the W&B run id, the id that could not be resumed."""
        return {"mode": self.wandb_mode, "id": self._wandb_id, "replaced_id": self.wandb_replaced,
                "error": self.wandb_error}

    def summary(self, summary: dict) -> None:
        if not self.enabled:
            return

        summary = {**summary, "wandb": self.wandb_info()}
        text = json.dumps(summary, indent=2, default=_clean).encode()
        with disk_full("summary.json", self.run_dir / "summary.json", _RESUME_HINT.format(run=self.run_dir)):
            atomic_write(self.run_dir / "summary.json", lambda f: f.write(text))
        kill_point("summary")
        if self.wandb is not None:
            try:
                import wandb

                for k, v in summary.items():
                    if isinstance(v, (int, float, str)):
                        self.wandb.summary[k] = v
                # the growth events as the run state holds them (`grow.state.RunState.growth_events`, recoveries filled)
                rows = [[_clean(ev.get(c)) for c in GROWTH_COLUMNS] for ev in summary.get("growth_events") or []]
                if rows:
                    self.wandb.log({"growth/events": wandb.Table(columns=GROWTH_COLUMNS, data=rows)})
            except Exception as exc:  # noqa: BLE001
                self._off("summary", exc)

    def close(self) -> None:
        if self._file is not None:
            try:
                with disk_full("metrics.jsonl", self.run_dir / "metrics.jsonl"):
                    self._file.close()
            finally:
                self._file = None
        if self.wandb is not None:
            run, self.wandb = self.wandb, None
            try:
                run.finish()
            except Exception as exc:  # noqa: BLE001
                self._off("finish", exc)


_RESUME_HINT = "the earlier checkpoints are intact: resume with `grow train resume={run}` once there is space"


def read_metrics(run_dir: Path) -> list[dict]:
    path = Path(run_dir) / "metrics.jsonl"
    if not path.exists():
        return []
    return [json.loads(line) for line in path.read_text().splitlines() if line.strip()]
