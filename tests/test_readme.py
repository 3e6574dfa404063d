"""Every command line in README.md's and docs/usage.md's code blocks runs as written (on the tiny model), or
is marked here; the README's table of configs lists every file of configs/ (scripts/configs_table.py).

The lines are read from the two pages themselves: every non-empty line of a ```bash block (continuation
lines joined, comments dropped). Each one is run in-process (`grow_cli`, which answers as the real
process does: tests/test_cli.py) from a scratch directory and must exit 0, unless it is in ``NOT_RUN`` (a small explicit table of lines that need a GPU, several
torchrun ranks, SLURM, the network, or are make targets whose command runs here or elsewhere), with
the reason shown as the skip reason. A new README line that is in neither runs here, so an
unrunnable one fails until it is fixed or marked.

To keep it to about a minute on two cores, ``grow train`` and ``grow compare`` lines get the tiny
overrides appended (tests/conftest.py's ``TINY_RUN``, ``trainer.max_tokens=12288``, 6144 for compare) and their
``hydra.run.dir`` / ``hydra.sweep.dir`` under the scratch directory; ``grow sample`` a few tokens,
``grow eval`` a small corpus, ``grow report`` an ``out=`` there. Placeholders are substituted with
real runs made here (``PLACEHOLDERS``): ``<run dir>`` is the run of ``grow train +schedule=exp``,
``<sweep dir>`` the sweep of ``grow compare strategy=svd,zero``, and the resume examples'
``<stopped run dir>`` and ``outputs/2026-11-21/...`` a run stopped after its 12th step (as SIGTERM
stops one, in-process). The one line that is slow on a CPU (``trainer.compile=true``: torch.compile of
every stage's shapes, 32 s idle here, and a C++ compiler that ``make test`` does not otherwise need) is
marked ``slow``; the rest takes ~35 s idle.
"""

from __future__ import annotations

import json
import re
import shlex
import subprocess
import sys
from pathlib import Path

import pytest

from tests.conftest import ROOT, TINY_DATA, TINY_RUN, grow_cli

README = ROOT / "README.md"
PAGES = [README, *(ROOT / "docs" / f"{p}.md" for p in ("usage", "scaling", "fsdp"))]  # the pages whose commands run here
TINY_TRAIN = [*TINY_RUN, "trainer.max_tokens=12288"]  # 24 steps: past the stop at 12, the plateau line's eval at 20
TINY_COMPARE = [*TINY_RUN, "trainer.max_tokens=6144"]  # 12 steps: every arm's 4 stages train (1, 2, 3, 6 steps)
NOT_RUN = {  # README line (as shlex reads it, comment dropped) -> why it is not run here
    "make train": "tests/test_make.py runs it at a toy size",
    "make test": "runs this test suite",
    "make test-full": "runs this test suite and its slow tests",
    "make test-crash": "runs this test suite's crash tests (CI runs them)",
    "make test-fsdp": "runs this test suite's fsdp tests (CI runs them)",
    "torchrun --nproc_per_node=8 -m grow train +experiment=llama-7b-fsdp strategy=zero data=fineweb":
        "8 GPUs of 80 GB and FineWeb (tests/test_fsdp.py runs FSDP on two gloo ranks; the plan is tested in "
        "tests/test_memory.py)",
    "make test-slurm": "tests/test_slurm.py against a one-node SLURM (CI runs it)",
    "make bench": "tests/test_make.py runs it at a toy size",
    "make lint": "ruff over the sources: CI runs it",
    "make clean": "removes .venv, caches and outputs of the checkout",
    "torchrun --standalone --nproc_per_node=4 -m grow train +schedule=exp strategy=svd trainer.compile=true":
        "4 torchrun ranks on 4 GPUs (tests/test_distributed.py runs two gloo ranks on the CPU)",
    "torchrun --nnodes=2 --nproc_per_node=8 --rdzv-backend=c10d --rdzv-endpoint=node0:29500 -m grow train "
    "+schedule=exp trainer.batch_size=256": "two nodes of 8 GPUs",
    "pip install -e .[slurm]": "installs packages from the network",
    "grow compare strategy=svd,zero,vt seed=0,1,2 hydra/launcher=slurm hydra.launcher.partition=gpu "
    "hydra.launcher.timeout_min=600": "a SLURM cluster (sbatch) and hydra-submitit-launcher",
    "grow train -m +schedule=exp strategy=svd seed=0,1,2 hydra/launcher=slurm hydra.launcher.partition=gpu "
    "hydra.launcher.tasks_per_node=4 hydra.launcher.gpus_per_node=4": "a SLURM cluster with 4 GPUs a node",
}
SLOW = {  # run, but only in the slow suite
    "grow train +schedule=exp strategy=svd trainer.compile=true":
        "torch.compile of every stage's shapes on the CPU: 32 s on an idle 2-core machine (more loaded), "
        "and it needs a C++ compiler, which make test does not",
}
PLACEHOLDERS = {  # text in a README line -> the README line whose run replaces it (None: the stopped run)
    "<run dir>": "grow train +schedule=exp",
    "<sweep dir>": "grow compare strategy=svd,zero",
    "outputs/2026-11-21/...": None,
    "<stopped run dir>": None,
}


def readme_lines(text: str | None = None) -> list[tuple[str, str]]:
    """(raw line, normalized line) of every command in the ```bash blocks of ``text`` (default: the PAGES), in
    order: the raw line with its continuations joined, the normalized one as shlex splits it, comment dropped."""
    text = "\n".join(p.read_text() for p in PAGES) if text is None else text
    out = []
    for block in re.findall(r"^```bash\n(.*?)^```", text, flags=re.S | re.M):
        for raw in re.sub(r"\\\n\s*", " ", block).splitlines():
            words = shlex.split(raw, comments=True)
            if words:
                out.append((raw.split(" #")[0].strip() if " #" in raw else raw.strip(), " ".join(words)))
    return out


LINES = readme_lines()
NORMALIZED = [n for _, n in LINES]


def _params():
    for raw, norm in LINES:
        marks = [pytest.mark.slow] if norm in SLOW else []
        yield pytest.param(raw, norm, marks=marks, id=norm[:80])


class Workspace:
    """A scratch directory (the cwd of every command, so ``run=latest`` finds its runs) and the runs made
    in it, each README line run at most once."""

    def __init__(self, root: Path):
        self.root, self.done = root, {}

    def stopped_run(self) -> Path:
        """A run stopped after its 12th step as SIGTERM stops one (a checkpoint, exit 0), in this process."""
        if "stopped" not in self.done:
            from tests.helpers import grow_train_stopped_at

            out = grow_train_stopped_at(12, "+schedule=exp", *TINY_TRAIN, "hydra.run.dir=outputs/stopped", cwd=self.root)
            self.done["stopped"] = (out, self.root / "outputs" / "stopped")
        return self.done["stopped"][1]

    def substitute(self, raw: str) -> str:
        for text, source in PLACEHOLDERS.items():
            if text in raw:
                if source is None:
                    where = self.stopped_run()
                else:
                    assert source in NORMALIZED, f"README no longer shows {source!r}: update PLACEHOLDERS"
                    where = self.run(source)[1]
                raw = raw.replace(text, str(where.relative_to(self.root)))
        return raw

    def run(self, norm: str) -> tuple[subprocess.CompletedProcess, Path | None]:
        """Run README line ``norm`` (placeholders substituted, tiny overrides appended)."""
        if norm in self.done:
            return self.done[norm]
        raw = next(r for r, n in LINES if n == norm)
        words = shlex.split(self.substitute(raw), comments=True)
        assert words[0] == "grow", f"not a grow command: {raw!r}: run it here or add it to NOT_RUN"
        args, cmd = words[1:], words[1] if len(words) > 1 else ""
        where = self.root / "outputs" / "readme" / str(len(self.done))
        extra: list[str] = []
        if cmd == "train" and "--help" not in args and not any(a.startswith("resume=") for a in args):
            extra = [*TINY_TRAIN, f"hydra.{'sweep' if '-m' in args else 'run'}.dir={where}"]
        elif cmd == "compare":
            extra = [*TINY_COMPARE, f"hydra.sweep.dir={where}"]
        elif cmd == "sample":
            extra = ["max_new_tokens=8"]
        elif cmd == "eval":
            extra = [*TINY_DATA, "max_tokens=2000"]
        elif cmd == "report":
            extra = [f"out={where}"]
        given = {a.split("=", 1)[0] for a in args}
        extra = [e for e in extra if e.split("=", 1)[0] not in given]  # the README's own values win
        out = grow_cli(*args, *extra, cwd=self.root)
        runs = extra and cmd in ("train", "compare") and "--cfg" not in args  # --cfg prints the configs, runs nothing
        self.done[norm] = (out, where if runs else None)
        return self.done[norm]


@pytest.fixture(scope="module")
def workspace(tmp_path_factory):
    return Workspace(tmp_path_factory.mktemp("readme"))


def test_the_readme_shows_commands_and_every_mark_names_one_of_them():
    """The lines are found; NOT_RUN, SLOW and PLACEHOLDERS hold no line the README no longer shows."""
    assert len(LINES) >= 20 and any(n.startswith("grow compare") for n in NORMALIZED)
    for table in (NOT_RUN, SLOW):
        assert set(table) <= set(NORMALIZED), set(table) - set(NORMALIZED)
    assert {s for s in PLACEHOLDERS.values() if s} <= set(NORMALIZED)
    assert any(p in raw for raw, _ in LINES for p in PLACEHOLDERS)


def test_a_new_line_is_collected_and_runs_unless_marked():
    """What a README line added tomorrow meets: it is collected, and it is not excused."""
    new = readme_lines("```bash\ngrow train +schedule=linear strategy=msg   # new\n```\n")
    assert new == [("grow train +schedule=linear strategy=msg", "grow train +schedule=linear strategy=msg")]
    assert new[0][1] not in NOT_RUN and new[0][1] not in SLOW


@pytest.mark.parametrize("raw, norm", list(_params()))
def test_readme_command_runs_as_written(raw, norm, workspace):
    if norm in NOT_RUN:
        pytest.skip(f"not run here: {NOT_RUN[norm]}")
    out, where = workspace.run(norm)
    assert out.returncode == 0, (norm, out.returncode, out.stderr[-3000:])
    if where is not None:  # a train or compare run: it finished and wrote its summary
        summaries = list(where.glob("**/summary.json")) if where.is_dir() else []
        assert summaries, (norm, where)
        if norm.startswith("grow train") and "-m" not in norm.split():
            assert json.loads((where / "summary.json").read_text())["final_val_loss"] > 0
    if "resume=" in raw:  # the stopped run went on to its end
        assert (workspace.stopped_run() / "summary.json").is_file()
    if norm == "grow train --help":
        assert "strategy" in out.stdout


def test_the_configs_table_lists_every_config_and_is_what_the_script_writes(tmp_path):
    """Every YAML under configs/ is linked from the README's table, and scripts/configs_table.py writes the
    table the README has (run on a copy whose table is emptied)."""
    text = README.read_text()
    linked = set(re.findall(r"\]\((configs/[^)]+\.yaml)\)", text))
    assert linked == {p.relative_to(ROOT).as_posix() for p in (ROOT / "configs").rglob("*.yaml")}
    copy = tmp_path / "README.md"
    copy.write_text(re.sub(r"(<!-- configs:table -->\n).*?(<!-- /configs:table -->)", r"\1\2", text, flags=re.S))
    script = [sys.executable, str(ROOT / "scripts" / "configs_table.py"), "--readme", str(copy)]
    assert subprocess.run([*script, "--check"], capture_output=True).returncode == 1
    assert subprocess.run(script, capture_output=True).returncode == 0
    assert copy.read_text() == text
