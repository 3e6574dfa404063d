"""``grow report``: the report, plots and summary of any runs and sweeps (`grow.report.build_report`)."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import hydra
from omegaconf import DictConfig, OmegaConf

from grow.commands import in_place, quote_values, user_errors
from grow.config import CONFIG_DIR, ConfigError
from grow.errors import file_in_the_way
from grow.report import build_report, default_out_dir
from grow.report.extra import require as require_extra
from grow.report.published import is_published, read_published
from grow.runs import is_run_dir, run_dirs


def normalize(argv: list[str]) -> list[str]:
    """``runs=a,b`` or ``runs=[a,b]`` as a list of paths (which may contain ``=``); ``out``, ``title`` as typed."""
    return quote_values(argv, keys=("out", "title"), lists=("runs",))


@dataclass(frozen=True)
class ReportConfig:
    """``grow report``'s config (configs/report.yaml), checked once by `from_node`: at least one directory,
    each a run or a sweep of runs, or a published report's summary.json; ``out`` not a run directory."""

    runs: tuple[Path, ...]
    out: Path | None
    title: str | None
    equivalence_margin: float = 0.02

    @classmethod
    def from_node(cls, cfg: DictConfig) -> "ReportConfig":
        runs = None if OmegaConf.is_missing(cfg, "runs") else cfg.runs
        if not OmegaConf.is_list(runs) or not runs:
            raise ConfigError("runs", ..., "give run or sweep directories (or a published report's summary.json): "
                                           "grow report runs=[<dir>,<dir>]")
        for path in runs:
            if is_published(str(path)):
                read_published(str(path), "runs")
            else:
                run_dirs(Path(str(path)), "runs")
        if cfg.out is not None and is_run_dir(Path(str(cfg.out))):
            raise ConfigError("out", str(cfg.out), "is a run directory (its summary.json would be overwritten); "
                                                   "give a new directory")
        blocker = None if cfg.out is None else file_in_the_way(str(cfg.out))
        if blocker is not None:
            raise ConfigError("out", str(cfg.out), f"{blocker} is a file, not a directory: give a directory for "
                                                   "the report's files")
        require_extra("runs", ...)
        margin = cfg.get("equivalence_margin", cls.equivalence_margin)
        if isinstance(margin, bool) or not isinstance(margin, (int, float)) or not 0 < margin < float("inf"):
            raise ConfigError("equivalence_margin", margin, "must be a positive number of nats (e.g. 0.02)")
        return cls(tuple(Path(str(p)) for p in runs), None if cfg.out is None else Path(str(cfg.out)),
                   None if cfg.title is None else str(cfg.title), float(margin))


def check(cfg: DictConfig) -> ReportConfig:
    """The command's validation, before any work (`grow.commands.precheck`): the command's settings."""
    return ReportConfig.from_node(cfg)


extra_overrides = in_place  # no run directory: the current one, no .hydra/ output


def job(report: ReportConfig) -> None:
    """The report of the checked settings (`check`)."""
    with user_errors():
        build_report(list(report.runs), report.out or default_out_dir(), title=report.title, key="runs",
                     margin=report.equivalence_margin)


@hydra.main(config_path=str(CONFIG_DIR), config_name="report", version_base="1.3")
def main(cfg: DictConfig) -> None:
    """A job of ``grow report ... -m`` (Hydra's launcher; a single report runs `job` through `grow.cli`)."""
    with user_errors():
        report = check(cfg)
    job(report)


if __name__ == "__main__":
    main()
