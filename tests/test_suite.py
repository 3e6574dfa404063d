"""The suite runs as a packager or an IDE runs it: plain ``pytest`` with no plugin beside pytest, and every
process a test starts as a fresh interpreter when the warm server is off (``GROWD=0``; tests/README.md)."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

from tests.helpers import run_make
from tests.ranks import forked_python, process_env

ROOT = Path(__file__).resolve().parent.parent

# A site hook that makes the dev extra's pytest plugins absent, as on a machine with only pytest installed.
WITHOUT_PLUGINS = '''
import sys
class _Absent:
    def find_spec(self, name, path=None, target=None):
        if name.split(".")[0] in ("xdist", "pytest_cov"):
            raise ModuleNotFoundError(f"No module named {name!r}", name=name)
sys.meta_path.insert(0, _Absent())
'''


def test_plain_pytest_runs_a_test_file_with_only_pytest_installed(tmp_path):
    (tmp_path / "sitecustomize.py").write_text(WITHOUT_PLUGINS)
    env = process_env({"PYTHONPATH": os.pathsep.join([str(tmp_path), str(ROOT)])})
    env.pop("PYTEST_ADDOPTS", None)
    env.pop("PYTEST_PLUGINS", None)
    out = subprocess.run([sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider",
                          "tests/test_model.py", "-k", "test_parameter_count_matches_formula"], cwd=ROOT, env=env,
                         capture_output=True, text=True, timeout=300)
    assert out.returncode == 0, out.stdout[-3000:] + out.stderr[-3000:]
    assert " passed" in out.stdout and "xdist" not in out.stdout + out.stderr


def test_growd_off_starts_every_process_as_a_fresh_interpreter(tmp_path, monkeypatch):
    code = "import os, sys; print(os.getppid(), 'torch' in sys.modules)"
    warm = forked_python(code, cwd=tmp_path)
    monkeypatch.setenv("GROWD", "0")
    cold = forked_python(code, cwd=tmp_path)
    assert warm.returncode == cold.returncode == 0, (warm.stderr, cold.stderr)
    warm_parent, warm_torch = warm.stdout.split()
    cold_parent, cold_torch = cold.stdout.split()
    assert int(cold_parent) == os.getpid() and cold_torch == "False"  # this process's child, nothing preloaded
    assert int(warm_parent) != os.getpid() and warm_torch == "True"  # the server's fork, torch imported


def test_make_test_ends_a_hung_test_with_its_stack(tmp_path):
    """The Makefile's plugin set loads pytest-timeout: a test past the limit fails (here 1 s, lowered from the
    Makefile's 300 for the check) instead of holding the suite, and CI, until an outer limit."""
    (tmp_path / "test_hang.py").write_text("import time\n\n\ndef test_hangs():\n    time.sleep(120)\n")
    out = run_make("test", "JOBS=0", args=("-o timeout=1", "-p no:cacheprovider", str(tmp_path / "test_hang.py")),
                   status=2)
    assert "Timeout (>1.0s)" in out.stdout and "1 failed" in out.stdout, out.stdout[-2000:]
