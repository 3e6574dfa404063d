"""Which runs, grouped into arms, and each run's baselines (`build_report`'s first step; docs/statistics.md).

Runs with the same label are the seeds of one arm; runs from different places that would give an
arm one seed twice get the config keys they differ in, else their directory (`distinguish`). Each run
is measured against a baseline of the same seed (`assign_baselines`): in its own sweep the one
``arm.json`` names; across sweeps one with the same final model, token budget and optimizer settings
(a learning-rate check's 1e-2 arm is not measured against a baseline trained at 3e-3). Kinds of arms
(``grown``, ``baseline``, ``matched``, ``equal_flops``): docs/statistics.md.
"""

from __future__ import annotations

import json
from pathlib import Path

from grow.runs import FoundRun, find_runs, parameterization

# Config keys that do not make two runs different experiments (they never name an arm).
NOT_AN_ARM = ("seed", "resume", "device", "logger", "trainer.progress", "trainer.keep_checkpoints",
              "trainer.ckpt_every", "trainer.ckpt_minutes", "data.cache_dir", "compare", "report",
              "optim.decay_branches")  # a fixed-size run's decay branches leave it bit for bit the same (grow.branches)


def collect(paths: list[Path], key: str = "runs") -> list[FoundRun]:
    """Every run of ``paths`` (runs and sweeps, mixed; a run named twice counts once), labelled and
    matched with its baseline."""
    runs, seen = [], set()
    for path in paths:
        for r in find_runs(Path(path), key):
            if r.dir.resolve() not in seen:
                seen.add(r.dir.resolve())
                runs.append(r)
    assign_baselines(runs)
    distinguish(runs)
    return runs


def _flat(d, prefix: str = "") -> dict:
    out = {}
    for k, v in (d or {}).items():
        name = f"{prefix}{k}"
        if isinstance(v, dict):
            out.update(_flat(v, f"{name}."))
        else:
            out[name] = v
    return out


def short_key(key: str) -> str:
    for prefix in ("schedule.", "strategy."):
        if key.startswith(prefix):
            return key[len(prefix):]
    return key


def _differences(runs: list[FoundRun]) -> list[str]:
    flats = [_flat(r.config) for r in runs]
    keys = sorted({k for f in flats for k in f})
    # a key some configs lack (written by an older grow) tells nothing apart: compare where it is set
    return [k for k in keys if not any(k == n or k.startswith(n + ".") for n in NOT_AN_ARM)
            and len({json.dumps(f[k], sort_keys=True) for f in flats if k in f}) > 1]


def _collides(runs: list[FoundRun]) -> bool:
    seeds = [r.seed for r in runs]
    return len(seeds) != len(set(seeds))


def distinguish(runs: list[FoundRun]) -> None:
    """Relabel the runs of a label that holds one seed twice: by the config keys their configs differ
    in, then (identical configs) by the directory they were found through."""
    by_label: dict[str, list[FoundRun]] = {}
    for r in runs:
        by_label.setdefault(r.label, []).append(r)
    for label, rs in by_label.items():
        if not _collides(rs):
            continue
        keys = _differences(rs)
        for r in rs:
            flat = _flat(r.config)
            r.arm["arm"] = " ".join([label, *(f"{short_key(k)}={flat.get(k)}" for k in keys)])
        groups: dict[str, list[FoundRun]] = {}
        for r in rs:
            groups.setdefault(r.label, []).append(r)
        for same in groups.values():
            if _collides(same):
                names = _source_names([r.source for r in same])
                for r in same:
                    r.arm["arm"] += f" [{names[r.source]}]"


def _source_names(sources: list[Path]) -> dict[Path, str]:
    """The shortest trailing parts of the source directories that tell them apart: 'sweepA', or
    'a/sweep' and 'b/sweep' for two sweeps of the same name."""
    unique = list(dict.fromkeys(Path(s).absolute() for s in sources))
    for k in range(1, max(len(s.parts) for s in unique) + 1):
        names = {s: "/".join(s.parts[-k:]) for s in unique}
        if len(set(names.values())) == len(unique):
            break
    return {s: names[Path(s).absolute()] for s in sources}


def _budget(r: FoundRun):
    return (r.config or {}).get("trainer", {}).get("max_tokens")


def _optim(r: FoundRun):
    """The run's optimizer settings that shape its training (not optim.decay_branches: `NOT_AN_ARM`)."""
    return {k: v for k, v in ((r.config or {}).get("optim") or {}).items() if k != "decay_branches"} or None


def _final(r: FoundRun):
    return (r.summary or {}).get("final_config") or r.arm.get("final_config")


def run_parameterization(r: FoundRun) -> str | None:
    """The parameterization of a grown or matched run: ``arm.json``'s, else its config's strategy's."""
    if r.arm.get("kind") not in ("grown", "matched"):
        return None
    if "parameterization" in r.arm:
        return r.arm["parameterization"]
    return parameterization(r.config)


def matched_label(baseline_arm: str | None, param: str) -> str:
    """The label of the matched baseline beside a baseline label: 'baseline model=tiny' ->
    'baseline init=vt model=tiny' (`grow.compare.arm_label`: the name, the tag, the swept values)."""
    base = baseline_arm or "baseline"
    return f"baseline init={param}{base[len('baseline'):]}" if base.startswith("baseline") else f"{base} init={param}"


def _pick(candidates: list[FoundRun], r: FoundRun, label: str | None) -> FoundRun | None:
    """The candidate of ``r``'s seed named ``label``, from ``r``'s own sweep first; from elsewhere only
    with the same final model, token budget and optimizer settings."""
    same = [b for b in candidates if b.label == label and b.seed == r.seed]
    own = [b for b in same if b.source == r.source]
    other = [b for b in same if b.source != r.source and _final(b) == _final(r) and _budget(b) == _budget(r)
             and _optim(b) == _optim(r)]
    return (own or other or [None])[0]


def assign_baselines(runs: list[FoundRun]) -> None:
    """``run.base``: the complete baseline run of the same seed named by the run's ``baseline_arm``, from its
    own sweep first; from elsewhere only with the same final model, token budget and optimizer settings. ``run.matched``: for a
    grown run whose strategy has a parameterization, the complete matched baseline of that
    parameterization and seed, found the same way; a matched run is its own."""
    bases = [r for r in runs if r.arm.get("kind") == "baseline" and r.complete]
    matched = [r for r in runs if r.arm.get("kind") == "matched" and r.complete]
    for r in runs:
        r.base = _pick(bases, r, r.arm.get("baseline_arm"))
        kind, param = r.arm.get("kind"), run_parameterization(r)
        if kind == "matched":
            r.matched = r if r.complete else None
        elif kind == "grown" and param:
            r.matched = _pick(matched, r, matched_label(r.arm.get("baseline_arm"), param))
