"""The published svd runs' FLOPs with what their evaluations ran uncounted (docs/results.md, "Accounting").

Until `grow.model._LinearCrossEntropy` took the caller's grad mode, every forward under torch.no_grad()
also computed dL/dW_out, 2 h V FLOPs a token, which svd's count of its line search (one forward a
token) left out. A summary records each run's total growth FLOPs only; a growth's count is exact:

    stats_flops + linalg_flops (on the h-grown model, `grow.growth.svd`) + n_g x (grown forward of one batch)

with n_g the line search's batch evaluations (2 held-out batches per grid point evaluated, + the 4
statistics batches when the actual decrease is measured). The n_g are the unique such counts whose
total equals the recorded growth FLOPs to the FLOP (an error otherwise); the uncounted FLOPs are
sum_g n_g x 2 h_g V x batch x s. Each svd run gets ``uncounted_eval_flops`` and its ``growth_flops``,
``flops`` and ``flops_pct_baseline`` include them; the arm's statistics and the runs' rows of
report.md are recomputed, then `scripts/results.py refresh` rewrites the reports' summary sections
and docs/results.md. A run that
has ``uncounted_eval_flops`` is left alone (the step can be rerun).

    python scripts/svd_eval_flops.py [--root DIR]
"""

from __future__ import annotations

import argparse
import itertools
import json
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from grow.console import fmt_num  # noqa: E402
from grow.growth.base import yaml_options  # noqa: E402
from grow.growth.svd import linalg_flops  # noqa: E402
from grow.growth.svd_stats import stats_flops  # noqa: E402
from grow.model import TransformerConfig  # noqa: E402
from grow.report.stats import stat  # noqa: E402

sys.path.insert(0, str(ROOT / "scripts"))
from results import published, refresh  # noqa: E402

KEY = "uncounted_eval_flops"
# the sweeps whose svd runs ran uncounted evaluations (published before issue 42's fix); later ones count them
SWEEPS = ("small-1m", "small-4m", "llama-small-1m")


def _config(d: dict) -> TransformerConfig:
    return TransformerConfig(**{k: v for k, v in d.items() if k in TransformerConfig.__dataclass_fields__})


def growths(stages: list[dict]) -> list[dict]:
    """Per growth of d_k: its exact statistics + linear-algebra FLOPs, one batch's grown forward, and
    the FLOPs one batch's evaluation ran uncounted (2 h V per token, h the grown model's)."""
    nb = int(yaml_options("svd")["batches"])
    out = []
    for a, b in zip(stages, stages[1:]):
        src, tgt, tokens = _config(a["config"]), _config(b["config"]), b["batch_size"] * b["config"]["seq_len"]
        if tgt.d_qk <= src.d_qk:
            continue
        at_k = src.replace(d_model=tgt.d_model)
        pairs = (tgt.d_qk - src.d_qk) // 2 if src.positions == "rope" else 0
        out.append({"fixed": stats_flops(at_k, nb * b["batch_size"], src.seq_len, pairs) + linalg_flops(at_k, pairs),
                    "forward": tgt.flops_per_token() // 3 * tokens, "uncounted": 2 * tgt.d_model * tgt.vocab_size * tokens})
    return out


def evaluations(growth_flops: float, per: list[dict]) -> tuple[int, ...]:
    """The line search's batch evaluations of each growth that make ``growth_flops`` exactly."""
    o = yaml_options("svd")
    nb, nh, points = int(o["batches"]), int(o["heldout"]), len(o["gamma_grid"])
    counts = sorted({nh * e + a for e in range(1, points + 1) for a in (0, nb)})
    rest = growth_flops - sum(g["fixed"] for g in per)
    found = [ns for ns in itertools.product(counts, repeat=len(per))
             if abs(sum(n * g["forward"] for n, g in zip(ns, per)) - rest) < 1]
    if len(found) != 1:
        raise SystemExit(f"error: growth FLOPs {growth_flops:.0f}: {len(found)} decompositions into line-search "
                         "evaluations (need exactly one)")
    return found[0]


def correct(summary: dict) -> bool:
    """Add the uncounted evaluation FLOPs to the svd runs of ``summary`` (in place); whether any changed."""
    changed = False
    for arm in (a for a in summary["arms"] if a.get("strategy") == "svd"):
        per = growths(next(s for s in summary["schedules"] if arm["arm"] in s["arms"])["stages"])
        for run in (r for r in arm["runs"] if KEY not in r):
            ns = evaluations(run["growth_flops"], per)
            extra = float(sum(n * g["uncounted"] for n, g in zip(ns, per)))
            ratio = (run["flops"] + extra) / run["flops"]
            run[KEY] = extra
            run["growth_flops"] += extra
            run["flops"] += extra
            if run.get("flops_pct_baseline") is not None:
                run["flops_pct_baseline"] *= ratio
            changed = True
        for key in ("flops", "growth_flops", "flops_pct_baseline"):
            arm[key] = stat([r.get(key) for r in arm["runs"]])
    return changed


def run_rows(report: str, summary: dict) -> str:
    """``report`` (report.md) with the FLOPs and growth FLOPs cells of the svd runs' rows under "## Runs"
    as ``summary`` has them (`grow.report.tables`' formatting; the rest of the row as it was)."""
    lines = report.split("\n")
    for arm in (a for a in summary["arms"] if a.get("strategy") == "svd"):
        for run in arm["runs"]:
            head = f"| {arm['arm']} | {run['seed']} | `{run['run_dir']}` |"
            for i, line in enumerate(lines):
                if line.startswith(head):
                    cells = line.split(" | ")
                    cells[5], cells[6] = fmt_num(run["flops"]), fmt_num(run["growth_flops"])
                    lines[i] = " | ".join(cells)
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--root", type=Path, default=ROOT)
    args = parser.parse_args(argv)
    done = []
    for name, d in published(args.root).items():
        if name not in SWEEPS:
            continue
        summary = json.loads((d / "summary.json").read_text())
        if correct(summary):
            (d / "summary.json").write_text(json.dumps(summary, indent=2))
            done.append(name)
        (d / "report.md").write_text(run_rows((d / "report.md").read_text(), summary))
    refresh(args.root)
    print(f"corrected {', '.join(done) or 'nothing'}; refreshed the reports and docs/results.md")
    return 0


if __name__ == "__main__":
    sys.exit(main())
