"""A committed report's summary.json as a source of `grow report` (docs/statistics.md, "Published summaries as
sources"): its arms' per-run values join the arms of the runs read from disk, and every statistic is derived
again over the union (`grow.report.stats.derived_statistics`). Its runs are not on disk, so those arms have no
curves or growth rows; each of their runs carries the machine its summary names.
"""

from __future__ import annotations

import copy
import json
import os
from pathlib import Path

from grow.errors import ConfigError
from grow.report.stats import one_machine
from grow.runs import is_run_dir

SUMMARY = "summary.json"


def _path(path) -> Path:
    return Path(os.path.expanduser(str(path)))


def is_published(path) -> bool:
    """A report's summary.json, or a directory that holds one and no run (docs/results/<name>/)."""
    p = _path(path)
    if p.is_file():
        return p.name == SUMMARY
    return (p.is_dir() and (p / SUMMARY).is_file() and not is_run_dir(p)
            and not any(is_run_dir(d) for d in p.iterdir() if d.is_dir()))


def read_published(path, key: str = "runs") -> dict:
    """The summary of ``path`` (`is_published`); `ConfigError` naming ``key`` when it is not a report's."""
    p = _path(path)
    f = p if p.is_file() else p / SUMMARY
    try:
        s = json.loads(f.read_text())
    except (OSError, ValueError) as exc:
        raise ConfigError(key, str(path), f"not a readable summary.json ({exc.__class__.__name__})") from None
    if not isinstance(s, dict) or not isinstance(s.get("arms"), list) or not isinstance(s.get("scale"), dict):
        raise ConfigError(key, str(path), "not the summary.json of a grow compare or grow report report (no arms "
                                          "and scale)")
    return s


def _rename(entries: list[dict], names: dict[str, str]) -> None:
    """Every arm label of ``entries`` and every reference to one (an arm's and its runs' baseline and matched
    arms) through ``names``."""
    for e in entries:
        for d in (e, *e["runs"]):
            for k in ("arm", "baseline_arm", "matched_arm"):
                if d.get(k) in names:
                    d[k] = names[d[k]]


def _union(*lists) -> list:
    return list(dict.fromkeys(x for xs in lists for x in (xs or [])))


def merge(published: list[tuple[Path, dict]], summary: dict | None, out_dir: Path, title: str | None,
          derive) -> dict:
    """The report of published summaries (``[(path, summary)]``, first the one whose experiment it is: title
    and scale) and of ``summary`` (the runs on disk, or None). An arm of the runs on disk whose label a published
    arm has takes the name of its directory, ``baseline [sweep]`` (`grow.report.collect.distinguish`'s rule for
    identical configs: a published summary has no configs to tell them apart by). ``derive``: the derived
    statistics of a list of arms (`grow.report.stats.derived_statistics` at the report's margin)."""
    arms, seen = [], {}
    for path, s in published:
        machine = one_machine(s)
        for e in copy.deepcopy(s["arms"]):
            if e["arm"] in seen:
                raise ConfigError("runs", str(path), f"arm {e['arm']!r} is also in {seen[e['arm']]}: give each "
                                                     "published arm once")
            seen[e["arm"]] = str(path)
            for m in e["runs"]:  # the machine of every run of a one-machine summary; else not recorded per run
                m["machine"] = m.get("machine") or machine
            arms.append(e)
    new = copy.deepcopy(summary["arms"]) if summary else []
    if new:
        where = Path(summary["sources"][0]).name if len(summary["sources"]) == 1 else Path(out_dir).name
        _rename(new, {e["arm"]: f"{e['arm']} [{where}]" for e in new if e["arm"] in seen})
        for e in new:
            for m in e["runs"]:
                m["run_dir"] = m["run_dir"] if "/" in m["run_dir"] else f"{where}/{m['run_dir']}"
    first = published[0][1]
    scale = dict(first["scale"])
    for k in ("seeds", "corpus", "devices", "precision"):
        scale[k] = sorted(_union(scale.get(k), *((summary or {}).get("scale", {}).get(k),)), key=str)
    rest = summary or {}
    out = {"title": title or first["title"], "sweep_dir": str(Path(out_dir).absolute()),
           "sources": _union([str(_path(p).absolute()) for p, _ in published], rest.get("sources")),
           "published": [{"path": str(_path(p).absolute()), "title": s["title"], "runs": sum(len(e["runs"]) for e in s["arms"])}
                         for p, s in published],
           "group": Path(out_dir).name,
           "commands": _union(*(s.get("commands") for _, s in published), rest.get("commands")),
           "code": _union(*(s.get("code") for _, s in published), rest.get("code")),
           "machines": _union(*(s.get("machines") for _, s in published), rest.get("machines")),
           "accounting": first.get("accounting"), "scale": scale, "arms": arms + new}
    out.update(derive(out["arms"]))
    plans = {}
    for p in (*(s.get("schedules") or [] for _, s in published), rest.get("schedules") or []):
        for plan in p:
            kept = plans.setdefault(json.dumps(plan["stages"], sort_keys=True), copy.deepcopy(plan))
            kept["arms"] = _union(kept["arms"], plan["arms"])
    out["schedules"] = list(plans.values())
    return out
