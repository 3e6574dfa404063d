"""``pip install .`` (not editable): the wheel carries the Hydra configs and `grow` runs from it (#16 item 5).

The wheel is built offline from a copy of the sources (no build isolation: the setuptools of this
environment, no index). It is installed without its dependencies into a fresh virtualenv that sees
this environment's packages through a ``.pth`` line (torch, hydra, ... are not downloaded again),
and `grow schedule +schedule=exp` runs from that virtualenv, outside the repository.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import sysconfig
import zipfile
from pathlib import Path

import pytest

from tests.conftest import ROOT

SOURCES = ("grow", "configs", "pyproject.toml", "setup.py", "MANIFEST.in", "README.md")


@pytest.fixture(scope="module")
def wheel(tmp_path_factory) -> Path:
    d = tmp_path_factory.mktemp("wheel")
    src = d / "src"
    src.mkdir()
    for name in SOURCES:
        p = ROOT / name
        if p.is_dir():
            shutil.copytree(p, src / name, ignore=shutil.ignore_patterns("__pycache__", "*.pyc"))
        else:
            shutil.copy2(p, src / name)
    out = subprocess.run([sys.executable, "-m", "pip", "wheel", "-q", "--no-deps", "--no-build-isolation",
                          "--no-index", "-w", str(d / "dist"), str(src)], capture_output=True, text=True, timeout=300)
    assert out.returncode == 0, out.stderr[-3000:]
    (whl,) = (d / "dist").glob("grow-*.whl")
    return whl


def test_the_wheel_carries_every_config(wheel):
    names = set(zipfile.ZipFile(wheel).namelist())
    want = {f"grow/configs/{p.relative_to(ROOT / 'configs').as_posix()}" for p in (ROOT / "configs").rglob("*.yaml")}
    assert want and want <= names, sorted(want - names)
    assert "grow/cli.py" in names and "grow/faults.py" in names


def test_grow_runs_from_a_non_editable_install(wheel, tmp_path):
    venv = tmp_path / "venv"
    subprocess.run([sys.executable, "-m", "venv", "--without-pip", str(venv)], check=True, timeout=120)
    py = venv / "bin" / "python"
    site = subprocess.run([str(py), "-c", "import sysconfig; print(sysconfig.get_paths()['purelib'])"],
                          capture_output=True, text=True, check=True).stdout.strip()
    # this environment's packages as a fallback after the venv's own (plain path lines: no .pth of theirs runs,
    # so the editable install of the source tree stays invisible)
    here = {sysconfig.get_paths()["purelib"], sysconfig.get_paths()["platlib"]}
    Path(site, "zz-deps.pth").write_text("\n".join(sorted(here)) + "\n")
    # the checkout off the path, and installed even where pip sees this environment's grow of the same version
    # (an egg-info in a PYTHONPATH checkout, the editable install behind zz-deps.pth) and would skip it
    env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}
    out = subprocess.run([sys.executable, "-m", "pip", "--python", str(py), "install", "-q", "--no-deps", "--no-index",
                          "--force-reinstall", str(wheel)], capture_output=True, text=True, timeout=300, env=env)
    assert out.returncode == 0, out.stderr[-3000:]
    where = subprocess.run([str(py), "-c", "import grow.errors as e; print(e.CONFIG_DIR)"], cwd=tmp_path, env=env,
                           capture_output=True, text=True, timeout=120)
    assert where.returncode == 0, where.stderr[-2000:]
    config_dir = Path(where.stdout.strip())
    assert config_dir == Path(site) / "grow" / "configs" and (config_dir / "train.yaml").is_file()
    run = subprocess.run([str(venv / "bin" / "grow"), "schedule", "+schedule=exp"], cwd=tmp_path, env=env,
                         capture_output=True, text=True, timeout=300)
    assert run.returncode == 0, run.stderr[-3000:]
    assert "stage" in run.stdout.lower() and "Primary config directory not found" not in run.stderr
    bad = subprocess.run([str(venv / "bin" / "grow"), "train", "+schedul=exp"], cwd=tmp_path, env=env,
                         capture_output=True, text=True, timeout=300)
    assert bad.returncode == 2 and "did you mean +schedule=exp?" in bad.stderr, bad.stderr[-2000:]
