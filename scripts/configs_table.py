"""README.md's table of configs, generated from configs/: every YAML file, listed by group.

    python scripts/configs_table.py            # rewrite the table between the README's markers
    python scripts/configs_table.py --check    # exit 1 if the README's table differs from configs/

Each group's one-line description is ``GROUPS`` below; a group without one is an error (add it here).
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
BEGIN, END = "<!-- configs:table -->", "<!-- /configs:table -->"
GROUPS = {  # group (a directory under configs/; "" for the top level) -> what its options choose
    "": "one per command: the defaults that `grow <command>` composes",
    "model": "the architecture at its final size (GPT-style; `llama-*`: rotary, SwiGLU, grouped-query; `<family>-tiny`: a transformers family, docs/hf.md, 'Checkpoint families'; `pretrained`: the init= checkpoint's)",
    "schedule": "the growth schedule, added with `+schedule=` (stages, grown dimensions, start sizes, rates)",
    "schedule/trigger": "when each growth happens (`schedule/trigger=<name>`)",
    "strategy": "how new (and rescaled old) weights are set at a growth",
    "data": "the token source, tokenizer and token cache ([docs/data.md](docs/data.md))",
    "optim": "the growth-aware optimizer and learning-rate schedule",
    "logger": "W&B project, entity, group, name, tags",
    "experiment": "whole setups, added with `+experiment=`",
    "hydra/launcher": "cluster sweeps (`hydra/launcher=slurm`)",
    "sweep": "the sweeps of `make sweep EXP=<name>` (read by `scripts/sweep.py`, not a Hydra group)",
}


def rows(configs: Path = ROOT / "configs") -> list[str]:
    """The table's lines: one row per directory of configs/ holding YAML files, each file a link."""
    by_group: dict[str, list[Path]] = {}
    for path in sorted(configs.rglob("*.yaml")):
        group = path.parent.relative_to(configs).as_posix()
        by_group.setdefault("" if group == "." else group, []).append(path)
    missing = sorted(set(by_group) - set(GROUPS))
    if missing:
        raise SystemExit(f"error: configs/{missing[0]}/: no description in scripts/configs_table.py's GROUPS")
    out = ["| group | options | what |", "| --- | --- | --- |"]
    for group in sorted(by_group, key=list(GROUPS).index):
        links = ", ".join(f"[`{p.stem}`]({p.relative_to(configs.parent).as_posix()})" for p in by_group[group])
        out.append(f"| {'`' + group + '/`' if group else 'top level'} | {links} | {GROUPS[group]} |")
    return out


def render(text: str, configs: Path = ROOT / "configs") -> str:
    """``text`` with the lines between the markers replaced by the table."""
    head, rest = text.split(BEGIN + "\n", 1)
    _, tail = rest.split(END, 1)
    return head + BEGIN + "\n" + "\n".join(rows(configs)) + "\n" + END + tail


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--readme", type=Path, default=ROOT / "README.md")
    ap.add_argument("--check", action="store_true", help="exit 1 if the table differs, write nothing")
    args = ap.parse_args(argv)
    text = args.readme.read_text()
    new = render(text)
    if args.check:
        if new != text:
            print(f"{args.readme}: the configs table differs from configs/: run python scripts/configs_table.py")
            return 1
        return 0
    if new != text:
        args.readme.write_text(new)
    return 0


if __name__ == "__main__":
    sys.exit(main())
