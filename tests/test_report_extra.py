"""The ``report`` extra (scipy, statsmodels, matplotlib; grow.report.extra): the core runs without it.

The real commands run in processes forked warm (tests/growd.py's bare copy, which imported none of the three:
`NONE_YET`) whose path finder cannot see the three packages (`HIDE`: what a machine without them has, ModuleNotFoundError
on import), never by uninstalling them; the report's split is checked in-process on a fake sweep with
`grow.report.extra.missing` saying one is absent.
"""

from __future__ import annotations

import json
import re
import subprocess
import sys

import pytest

from grow.errors import ConfigError
from tests.conftest import ROOT, TINY_RUN, assert_one_line_error, grow_cli
from tests.helpers import fake_sweep

EXTRA = ("scipy", "statsmodels", "matplotlib")
INSTALL = "pip install 'grow[report]'"
# `python -c` with the extra hidden from the path finder (find_spec: None, as where it is not installed), then grow
HIDE = f"""
import importlib.machinery as m, sys
class Hidden(m.PathFinder):
    @classmethod
    def find_spec(cls, name, path=None, target=None):
        return None if name.partition('.')[0] in {EXTRA!r} else super().find_spec(name, path, target)
sys.meta_path[:] = [Hidden if f is m.PathFinder else f for f in sys.meta_path]
"""
# the forked process's premise: nothing it inherited from the warm server holds one of the three
NONE_YET = f"assert not [m for m in sys.modules if m.partition('.')[0] in {EXTRA!r}], 'the server imported the extra'\n"
CORE = ("grow.cli", "grow.train", "grow.compare", "grow.report", "grow.commands.train", "grow.commands.schedule",
        "grow.commands.sample", "grow.commands.eval", "grow.commands.export", "grow.commands.compare",
        "grow.commands.report")
TOKENS = ["trainer.max_tokens=2048", "trainer.eval_batches=1"]


def hidden(*args: str, cwd) -> subprocess.CompletedProcess:
    """``grow <args>`` in a process of its own (forked warm, not a fresh interpreter: 2-3 s less) without the extra."""
    from tests.ranks import forked_python

    return forked_python(HIDE + NONE_YET + f"from grow.cli import main\nsys.argv = ['grow', *{list(args)!r}]\nmain()\n",
                         cwd=cwd, timeout=600, bare=True)


def test_the_extra_is_declared_once_and_make_install_installs_it():
    """pyproject.toml: the three in the ``report`` extra, in no other list (core or extra); the Makefile's
    install line names it."""
    import tomllib  # Python >= 3.11, as the suite's environment

    project = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]
    name = lambda req: re.match(r"[A-Za-z0-9_.-]+", req).group(0).lower()
    lists = {"core": project["dependencies"], **project["optional-dependencies"]}
    assert sorted(map(name, lists.pop("report"))) == sorted(EXTRA)
    assert {k: [r for r in v if name(r) in EXTRA] for k, v in lists.items()} == {k: [] for k in lists}
    assert '-e ".[dev,hf,report]"' in (ROOT / "Makefile").read_text()


def test_the_core_modules_import_none_of_the_extra(tmp_path):
    """Importing every command's module (and the trainer, compare's arms, the report's package) imports none of
    the three: run in a process forked from the warm server, whose sys.modules holds only what these imports and
    the bare server's (tests/ranks.py's PRELOAD: grow's commands, torch, Hydra) brought, a fresh process's and more."""
    from tests.ranks import forked_python

    code = (f"import sys\nimport {', '.join(CORE)}\n"
            f"print(sorted(m for m in sys.modules if m.partition('.')[0] in {EXTRA!r}))")
    out = forked_python(code, cwd=tmp_path, timeout=300, bare=True)
    assert out.returncode == 0, out.stderr[-2000:]
    assert out.stdout.strip() == "[]", out.stdout


def test_the_hidden_packages_do_not_import(tmp_path):
    """The test's premise: under `HIDE` each of the three raises ModuleNotFoundError (and importlib finds none)."""
    code = HIDE + ("import importlib, importlib.util\nfor n in " + repr(EXTRA) + ":\n"
                   "    assert importlib.util.find_spec(n) is None, n\n"
                   "    try:\n        importlib.import_module(n)\n    except ModuleNotFoundError:\n        continue\n"
                   "    raise SystemExit(n + ' imported')\nprint('hidden')")
    out = subprocess.run([sys.executable, "-c", code], cwd=tmp_path, capture_output=True, text=True, timeout=120)
    assert out.returncode == 0 and out.stdout.strip() == "hidden", out.stdout + out.stderr[-2000:]


@pytest.fixture(scope="module")
def bare(tmp_path_factory):
    """A `grow train` and a 2-arm `grow compare` (baseline and zero) run without the extra."""
    cwd = tmp_path_factory.mktemp("bare")
    train = hidden("train", *TINY_RUN, *TOKENS, f"hydra.run.dir={cwd / 'run'}", cwd=cwd)
    compare = hidden("compare", "strategy=zero", *TINY_RUN, *TOKENS, "trainer.max_tokens=4096", "schedule.stages=2",
                     f"hydra.sweep.dir={cwd / 'sweep'}", cwd=cwd)
    return cwd, train, compare


def test_train_runs_without_the_extra(bare):
    cwd, train, _ = bare
    assert train.returncode == 0, train.stderr[-4000:]
    assert json.loads((cwd / "run" / "summary.json").read_text())["complete"]


def test_compare_trains_every_arm_and_says_in_one_line_what_the_report_needs(bare):
    """Exit 0, both arms finished, summary.json with every arm's figures and no statistics, no report.md or
    plots, and one line naming the extra and how to rebuild."""
    cwd, _, compare = bare
    assert compare.returncode == 0, compare.stderr[-4000:]
    sweep = cwd / "sweep"
    arms = sorted(p.parent.name for p in sweep.glob("*/summary.json"))
    assert arms == ["baseline-seed0", "zero-seed0"]
    assert all(json.loads((sweep / a / "summary.json").read_text())["complete"] for a in arms)
    summary = json.loads((sweep / "summary.json").read_text())
    assert [e["arm"] for e in summary["arms"]] == ["baseline", "zero"]
    assert all(e["final_val_loss"]["n"] == 1 for e in summary["arms"])
    assert not {"tests", "headline", "mde", "seed_blocked", "effective_compute"} & set(summary)
    assert not any((sweep / f).exists() for f in ("report.md", "loss_vs_flops.png", "loss_vs_time.png"))
    notes = [ln for ln in compare.stderr.splitlines() if INSTALL in ln]
    assert len(notes) == 1 and "scipy is not installed" in notes[0] and f"grow compare report={sweep}" in notes[0]


def test_report_commands_without_the_extra_are_one_line_exit_2_and_write_nothing(bare):
    cwd, _, compare = bare
    assert compare.returncode == 0, compare.stderr[-4000:]
    sweep = cwd / "sweep"
    before = (sweep / "summary.json").read_text()
    out = hidden("report", f"runs=[{sweep}]", f"out={cwd / 'new'}", cwd=cwd)
    assert_one_line_error(out, "runs")
    assert INSTALL in out.stderr and not (cwd / "new").exists()
    out = hidden("compare", f"report={sweep}", cwd=cwd)
    assert_one_line_error(out, "report=")
    assert INSTALL in out.stderr and (sweep / "summary.json").read_text() == before
    assert not (sweep / "report.md").exists()


def test_with_the_extra_the_report_of_that_sweep_is_rebuilt_whole(bare):
    cwd, _, compare = bare
    assert compare.returncode == 0, compare.stderr[-4000:]
    sweep = cwd / "sweep"
    out = grow_cli("compare", f"report={sweep}", cwd=cwd)
    assert out.returncode == 0, out.stderr[-4000:]
    summary = json.loads((sweep / "summary.json").read_text())
    assert "partial" not in summary and "tests" in summary
    assert (sweep / "report.md").is_file() and (sweep / "loss_vs_flops.png").is_file()


# ---- in-process: the split of build_report ------------------------------------------------------------


def test_partial_report_holds_the_full_reports_figures_and_removes_its_stale_files(tmp_path, monkeypatch):
    """Without the extra, summary.json's arms (every per-arm and per-run figure) equal the full report's
    exactly (the same stdlib arithmetic), without the derived statistics; the earlier report's files go."""
    from grow.report import build_report, extra

    sweep = fake_sweep(tmp_path / "sweep")
    full = build_report([sweep], sweep, key="report", show=False)
    assert (sweep / "report.md").is_file()
    monkeypatch.setattr(extra, "missing", lambda: "statsmodels")
    part = build_report([sweep], sweep, key="report", show=False, partial=True)
    written = json.loads((sweep / "summary.json").read_text())
    assert written == json.loads(json.dumps(part))
    strip = lambda e: {k: v for k, v in e.items() if k != "comparisons"}
    assert [strip(e) for e in written["arms"]] == [strip(e) for e in json.loads(json.dumps(full["arms"]))]
    assert "statsmodels is not installed" in written["partial"] and "tests" not in written
    assert written["columns"] == full["columns"]
    assert not any((sweep / f).exists() for f in ("report.md", "loss_vs_flops.png", "loss_vs_time.png"))


def test_build_report_without_the_extra_refuses_before_writing(tmp_path, monkeypatch):
    from grow.report import build_report, extra

    sweep = fake_sweep(tmp_path / "sweep")
    monkeypatch.setattr(extra, "missing", lambda: "matplotlib")
    with pytest.raises(ConfigError, match=r"matplotlib is not installed\): pip install 'grow\[report\]'"):
        build_report([sweep], tmp_path / "out", key="runs", show=False)
    with pytest.raises(ConfigError, match="^report="):
        build_report([sweep], sweep, key="report", show=False)
    assert not (tmp_path / "out").exists() and not (sweep / "summary.json").exists()
