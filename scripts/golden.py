"""Regenerate tests/golden/ (the expectations of tests/test_golden.py) on this machine.

Usage::

    python scripts/golden.py            # every case: <case>-float64.jsonl, and <case>.jsonl for the float32 cases
    python scripts/golden.py vt-exp-float64     # only the files named (their stems)

Run it only in the commit that deliberately changes what a run computes or logs, and say why in
that commit: tests/test_golden.py compares every run with these files (float64 to ~1e-9, float32
within the rounding its docstring derives) and never writes them itself.
"""

from __future__ import annotations

import json
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))


def main(argv: list[str]) -> int:
    import torch

    from tests.test_golden import CASES, FLOAT32_CASES, golden_path, run_case

    torch.set_num_threads(1)
    files = [(case, precision) for case in sorted(CASES)
             for precision in (("float64", "float32") if case in FLOAT32_CASES else ("float64",))]
    unknown = set(argv) - {golden_path(c, p).stem for c, p in files}
    if unknown:
        print(f"error: no golden file {sorted(unknown)}; the files: "
              f"{', '.join(golden_path(c, p).stem for c, p in files)}", file=sys.stderr)
        return 2
    for case, precision in files:
        if not argv or golden_path(case, precision).stem in argv:
            with tempfile.TemporaryDirectory() as tmp:
                records = run_case(case, Path(tmp) / "run", precision)
            path = golden_path(case, precision)
            path.write_text("".join(json.dumps(r) + "\n" for r in records))
            print(f"wrote {path.relative_to(ROOT)}: {len(records)} records")
    return 0


if __name__ == "__main__":
    raise SystemExit(main(sys.argv[1:]))
