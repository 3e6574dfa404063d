"""Packaging hook: the wheel carries the Hydra configs as ``grow/configs`` (metadata is in pyproject.toml).

``configs/`` at the top of the repository stays the one source; `build_py` copies it into the
build tree, so ``pip install .`` (not editable) and any wheel find it through
`grow.errors.CONFIG_DIR`. Editable installs read ``configs/`` in place and copy nothing.
"""

import shutil
from pathlib import Path

from setuptools import setup
from setuptools.command.build_py import build_py

ROOT = Path(__file__).resolve().parent


class BuildPyWithConfigs(build_py):
    def run(self):
        super().run()
        if getattr(self, "editable_mode", False):
            return
        dst = Path(self.build_lib) / "grow" / "configs"
        shutil.rmtree(dst, ignore_errors=True)
        shutil.copytree(ROOT / "configs", dst, ignore=shutil.ignore_patterns("__pycache__", "*.pyc"))

    def get_outputs(self, include_bytecode=True):
        outputs = list(super().get_outputs(include_bytecode))
        if not getattr(self, "editable_mode", False):
            base = Path(self.build_lib) / "grow" / "configs"
            outputs += [str(base / p.relative_to(ROOT / "configs")) for p in (ROOT / "configs").rglob("*.yaml")]
        return outputs


setup(cmdclass={"build_py": BuildPyWithConfigs})
