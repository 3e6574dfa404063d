"""The test suite's GPU tests (marker gpu), first in `make gpu-check`: the Triton AdamW kernel against torch's
fused AdamW, the float64 reference and the C pass, with no fallback (tests/test_triton_adamw.py), the
optimizer on CUDA (tests/test_optim.py), the chunked loss without a host sync (tests/test_model.py) and the
loss and attention kernels to bf16 rounding (tests/test_kernels.py). One pytest process; per test its outcome."""

from __future__ import annotations

import os
import subprocess
import sys
import tempfile
import xml.etree.ElementTree as ET
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent.parent
FILES = ("tests/test_triton_adamw.py", "tests/test_optim.py", "tests/test_model.py", "tests/test_kernels.py")
KERNEL = "tests/test_triton_adamw.py"  # the tests whose pass the gpu_tests target needs (the kernel on a GPU)


def check_gpu_tests(timeout: float = 240) -> dict:
    """``pytest -m gpu`` over `FILES`: counts, each failure's message, and whether the Triton kernel's GPU
    tests all ran and passed (None where none ran: no CUDA device)."""
    with tempfile.TemporaryDirectory(prefix="grow-gpu-tests-") as d:
        xml = Path(d) / "junit.xml"
        cmd = [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", "-m", "gpu", f"--junitxml={xml}", *FILES]
        out = subprocess.run(cmd, cwd=ROOT, capture_output=True, text=True, timeout=timeout,
                             env={**os.environ, "PYTHONPATH": os.pathsep.join([str(ROOT), os.environ.get("PYTHONPATH", "")])})
        tests = outcomes(xml) if xml.exists() else {}
    counts = {k: sum(v == k for v in tests.values()) for k in ("passed", "failed", "skipped")}
    kernel = {name: v for name, v in tests.items() if name.startswith(KERNEL.replace("/", ".").removesuffix(".py"))
              and "on_a_gpu" in name}
    ran = [v for v in kernel.values() if v != "skipped"]
    return {"returncode": out.returncode, **counts, "tests": tests,
            "kernel_passed": (all(v == "passed" for v in kernel.values()) and bool(kernel)) if ran else None,
            "tail": out.stdout[-1500:] if out.returncode not in (0,) else ""}


def outcomes(xml: Path) -> dict:
    """{classname.name: passed | failed | skipped} from pytest's JUnit XML."""
    out = {}
    for case in ET.parse(xml).iter("testcase"):
        kind = next((c.tag for c in case if c.tag in ("failure", "error", "skipped")), "passed")
        out[f"{case.get('classname')}.{case.get('name')}"] = {"error": "failed", "failure": "failed"}.get(kind, kind)
    return out
