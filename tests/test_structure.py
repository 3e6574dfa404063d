"""The code's structure: no import cycle among grow's modules, no function with more than 8 parameters,
few grow imports inside functions (each saying why it is lazy), sources cited by name, and prose in
proportion (module docstrings of at most 10 lines, docstrings and comments at most 30% of grow's text:
the maths and the contracts live once, in docs/design.md).

Imports are read from the source (module level and inside functions alike), so a cycle hidden in
a lazy import is found too. A package's ``__init__`` counts as the package's module.

Citations: what a user or contributor reads names the papers (Gesmundo & Maile, Yuan et al.,
Burgund's report and draft; README's References) and the sections of docs/design.md, never the
"seed 00N" labels, a "DESIGN §N" or "DESIGN.md" of a copy outside the repository, or a
``../shared`` path.
"""

from __future__ import annotations

import ast
import functools
import io
import re
import tokenize
from pathlib import Path

from tests.conftest import ROOT

PACKAGE = ROOT / "grow"
MAX_PARAMS = 8
MAX_LAZY_IMPORTS = 35
LAZY_REASONS = ("# start-up speed", "# optional extra")
MAX_MODULE_DOCSTRING_LINES = 10
MAX_PROSE_SHARE = 0.30  # docstrings + comments over all characters of grow/*.py (27.8% when this was written)


def module_name(path: Path) -> str:
    parts = list(path.relative_to(ROOT).with_suffix("").parts)
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


@functools.cache
def parse(source: str) -> ast.Module:
    """``ast.parse``, once per text: several tests below read the same files of grow (the trees are only read)."""
    return ast.parse(source)


def modules() -> dict[str, ast.Module]:
    return {module_name(p): parse(p.read_text()) for p in sorted(PACKAGE.rglob("*.py"))}


def imports_of(name: str, tree: ast.Module, known: set[str]) -> set[str]:
    """The grow modules ``name`` imports (``from grow import x`` counts x when x is a module)."""
    out = set()
    package = name if (PACKAGE / Path(*name.split(".")[1:]) / "__init__.py").exists() else name.rpartition(".")[0]
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            out |= {a.name for a in node.names if a.name in known}
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                base = ".".join(package.split(".")[: len(package.split(".")) - node.level + 1] + ([base] if base else []))
            if base in known:
                out.add(base)
            out |= {f"{base}.{a.name}" for a in node.names if f"{base}.{a.name}" in known}
    out.discard(name)
    return out


def cycles(graph: dict[str, set[str]]) -> list[list[str]]:
    """Every module that can reach itself, with one path back (depth-first search)."""
    found = []
    for start in graph:
        stack, seen = [(start, [start])], set()
        while stack:
            node, path = stack.pop()
            for nxt in graph[node]:
                if nxt == start:
                    found.append([*path, start])
                    stack.clear()
                    break
                if nxt not in seen:
                    seen.add(nxt)
                    stack.append((nxt, [*path, nxt]))
    return found


def test_no_module_imports_one_that_imports_it_back():
    mods = modules()
    known = set(mods)
    graph = {name: imports_of(name, tree, known) for name, tree in mods.items()}
    # a package's __init__ re-exporting its submodules is not a cycle of its submodules
    for name in graph:
        graph[name] = {m for m in graph[name] if not (name.startswith(m + ".") and m in known)}
    assert graph["grow.train"] >= {"grow.config", "grow.checkpoint"}  # the scan sees imports
    assert cycles(graph) == []


def room(module: str) -> str:
    """The part of grow a module belongs to: its top-level package (``grow.growth``), or itself (``grow.steps``)."""
    return ".".join(module.split(".")[:2])


def room_graph() -> dict[str, set[str]]:
    """Which of grow's parts (top-level packages and modules) import which, module imports lifted to their parts."""
    mods = modules()
    known = set(mods)
    graph: dict[str, set[str]] = {room(name): set() for name in mods if name != "grow"}
    for name, tree in mods.items():
        if name != "grow":
            graph[room(name)] |= {room(m) for m in imports_of(name, tree, known) if m != "grow"} - {room(name)}
    return graph


def test_grows_parts_stand_in_floors_none_imports_one_above_it():
    """grow's parts (a package counts whole, as a newcomer reads it) import each other without a loop, so they
    stand in floors, each above what it imports: the rank and sharding helpers (grow.parallel) below the
    growth, optimizers, steps and checkpoints that use them, and a growth under FSDP (grow.fsdp_growth) above
    the growth strategies and optimizers it runs by units (docs/design.md, "Architecture")."""
    graph = room_graph()
    assert graph["grow.train"] >= {"grow.config", "grow.checkpoint", "grow.parallel"}  # the scan sees imports
    assert cycles(graph) == []
    assert not graph["grow.parallel"] & {"grow.growth", "grow.optim", "grow.steps", "grow.checkpoint", "grow.fsdp_growth"}
    assert {"grow.growth", "grow.optim", "grow.parallel"} <= graph["grow.fsdp_growth"]


def lazy_grow_imports(tree: ast.Module, inside: bool = False):
    """The imports of grow modules (``grow``, ``grow.*``, relative) nested in a function of ``tree``."""
    for node in ast.iter_child_nodes(tree):
        if inside and isinstance(node, ast.Import) and any(a.name.split(".")[0] == "grow" for a in node.names):
            yield node
        elif inside and isinstance(node, ast.ImportFrom) and (node.level or (node.module or "").split(".")[0] == "grow"):
            yield node
        yield from lazy_grow_imports(node, inside or isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)))


def test_grow_imports_inside_functions_are_few_and_say_why():
    """An import of grow inside a function is lazy for start-up speed (``grow --help`` imports no torch) or
    for an optional extra (the ``hf`` extra's transformers), and says which in a trailing comment; any
    other belongs at the module's top."""
    lazy, unexplained = [], []
    for path in sorted(PACKAGE.rglob("*.py")):
        lines = path.read_text().splitlines()
        for node in lazy_grow_imports(parse(path.read_text())):
            where = f"{path.relative_to(ROOT)}:{node.lineno}: {lines[node.lineno - 1].strip()}"
            lazy.append(where)
            if not lines[node.end_lineno - 1].rstrip().endswith(LAZY_REASONS):
                unexplained.append(where)
    assert any(w.startswith("grow/cli.py:") for w in lazy)  # the scan sees them
    assert len(lazy) <= MAX_LAZY_IMPORTS, "\n".join(lazy)
    assert unexplained == []


def private_imports(tree: ast.Module) -> list[str]:
    """The imports of ``tree`` that reach into Hydra's or OmegaConf's private parts (a ``_`` module or name)."""
    found = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            names = [a.name for a in node.names]
        elif isinstance(node, ast.ImportFrom) and not node.level:
            names = [f"{node.module}.{a.name}" for a in node.names]
        else:
            continue
        found += [n for n in names if n.split(".")[0] in ("hydra", "omegaconf")
                  and any(part.startswith("_") for part in n.split(".")[1:])]
    return found


def test_grow_uses_hydras_and_omegaconfs_public_api_only():
    """No ``hydra._internal`` (its sweeper's job expansion, its mode read and per-job check patched away) and no
    swap of OmegaConf's private YAML loader: they break on a minor release (docs/design.md, "Commands")."""
    assert private_imports(ast.parse("from hydra._internal.hydra import Hydra\nfrom omegaconf import _utils")) == [
        "hydra._internal.hydra.Hydra", "omegaconf._utils"]  # the scan sees them
    found = {name: private_imports(tree) for name, tree in modules().items()}
    for where in ("scripts", "tests"):  # the suite counts through public hooks too (hydra.compose, a Callback)
        found |= {str(p.relative_to(ROOT)): private_imports(parse(p.read_text()))
                  for p in sorted((ROOT / where).rglob("*.py"))}
    assert {name: f for name, f in found.items() if f} == {}


def test_no_function_takes_more_than_eight_parameters():
    long = []
    for name, tree in modules().items():
        for node in ast.walk(tree):
            if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
                a = node.args
                params = [*a.posonlyargs, *a.args, *a.kwonlyargs]
                params = [p for p in params if p.arg not in ("self", "cls")]
                if len(params) > MAX_PARAMS:
                    long.append(f"{name}.{node.name}: {len(params)}")
    assert long == []


# Where a reader meets the citations: the package, its configs, docs, scripts, tests, the README.
CITING = ["grow", "configs", "docs", "scripts", "tests", "README.md", "Makefile"]
STALE_CITATIONS = [
    re.compile(r"\bseeds? 00", re.IGNORECASE),  # "seed 002", "seeds 001 and 004": name the paper
    re.compile(r"DESIGN §"),  # the design's sections are docs/design.md's
    re.compile(r"DESIGN\.md"),  # (case-sensitive: docs/design.md is the right name)
    re.compile(r"\.\./shared", re.IGNORECASE),  # nothing outside the repository
]


def citing_files() -> list[Path]:
    out = []
    for entry in CITING:
        path = ROOT / entry
        for f in sorted(path.rglob("*")) if path.is_dir() else [path]:
            if f.is_file() and "__pycache__" not in f.parts and f.resolve() != Path(__file__).resolve():
                out.append(f)
    return out


def test_sources_are_cited_by_name_and_the_design_is_docs_design_md():
    files = citing_files()
    assert {"README.md", "Makefile"} <= {f.name for f in files} and len(files) > 50  # the scan sees them
    stale = []
    for f in files:
        try:
            text = f.read_text(encoding="utf-8")
        except UnicodeDecodeError:  # not text
            continue
        for n, line in enumerate(text.splitlines(), 1):
            stale += [f"{f.relative_to(ROOT)}:{n}: {line.strip()}" for p in STALE_CITATIONS if p.search(line)]
    assert stale == []
    readme = (ROOT / "README.md").read_text(encoding="utf-8")
    assert "](docs/design.md)" in readme  # the README links the design
    assert (ROOT / "docs" / "design.md").is_file()


def test_module_docstrings_are_at_most_ten_lines():
    """A module docstring says what the module is for and names its section of docs/design.md; the
    contracts and the maths stand there once."""
    long, seen = [], 0
    for path in sorted(PACKAGE.rglob("*.py")):
        doc = ast.get_docstring(parse(path.read_text()), clean=False)
        seen += doc is not None
        if doc is not None and len(doc.splitlines()) > MAX_MODULE_DOCSTRING_LINES:
            long.append(f"{path.relative_to(ROOT)}: {len(doc.splitlines())} lines")
    assert seen > 50  # the scan sees them
    assert long == [], f"module docstrings over {MAX_MODULE_DOCSTRING_LINES} lines:\n" + "\n".join(long)


def prose_chars(source: str) -> int:
    """Characters of ``source`` in comments and in module, class and function docstrings."""
    comments = sum(len(t.string) for t in tokenize.generate_tokens(io.StringIO(source).readline)
                   if t.type == tokenize.COMMENT)
    nodes = (ast.Module, ast.ClassDef, ast.FunctionDef, ast.AsyncFunctionDef)
    docs = sum(len(ast.get_docstring(n, clean=False) or "") for n in ast.walk(parse(source)) if isinstance(n, nodes))
    return comments + docs


def test_prose_counts_comments_and_every_docstring():
    source = '"""Mod."""\n\n\nclass A:\n    """Cls."""\n\n    def f(self):  # why\n        """Fn."""\n        return "not prose"\n'
    assert prose_chars(source) == len("Mod.") + len("Cls.") + len("# why") + len("Fn.")


def test_docstrings_and_comments_are_at_most_thirty_percent_of_grow():
    prose = total = 0
    for path in sorted(PACKAGE.rglob("*.py")):
        source = path.read_text()
        prose, total = prose + prose_chars(source), total + len(source)
    assert total > 500_000  # the scan sees the package
    assert prose / total <= MAX_PROSE_SHARE, f"docstrings and comments are {prose / total:.1%} of grow/'s characters"


# The trainer trains: what a summary, a decay branch or a growth reads of the run is handed to it
# (grow.loop.RunParts, grow.branches.Trunk, grow.growing.GrowthInputs), never the Trainer itself.
TAKES_EXPLICIT_INPUTS = ["grow/branches.py", "grow/summary.py", "grow/validation.py", "grow/growing.py",
                         "grow/start.py", "grow/loop.py", "grow/fsdp_growth/sharded.py"]
MAX_TRAIN_LINES = 400


def test_no_module_the_trainer_calls_reaches_into_the_trainer():
    reach = []
    for rel in TAKES_EXPLICIT_INPUTS:
        tree = ast.parse((ROOT / rel).read_text())
        for node in ast.walk(tree):
            if isinstance(node, ast.Name) and node.id in ("trainer", "Trainer"):
                reach.append(f"{rel}:{node.lineno}: {node.id}")
            elif isinstance(node, ast.arg) and node.arg == "trainer":
                reach.append(f"{rel}:{node.lineno}: parameter trainer")
            elif isinstance(node, ast.ImportFrom) and node.module == "grow.train":
                reach.append(f"{rel}:{node.lineno}: imports grow.train")
    assert reach == []


def test_the_training_and_a_decay_branch_step_by_one_function():
    """One step loop: `Trainer.step` and `grow.branches.run_branch` both call `grow.loop.advance`, and neither
    steps an optimizer itself (the arithmetic is not copied)."""
    for rel, fn in (("grow/train.py", "step"), ("grow/branches.py", "run_branch")):
        tree = ast.parse((ROOT / rel).read_text())
        body = next(n for n in ast.walk(tree) if isinstance(n, ast.FunctionDef) and n.name == fn)
        calls = {ast.unparse(n.func) for n in ast.walk(body) if isinstance(n, ast.Call)}
        assert "advance" in calls, (rel, sorted(calls))
        assert not any(c.endswith((".step", ".zero_grad", "stepper")) for c in calls), (rel, sorted(calls))


def test_train_py_is_at_most_400_lines():
    lines = len((PACKAGE / "train.py").read_text().splitlines())
    assert lines <= MAX_TRAIN_LINES, f"grow/train.py is {lines} lines (issue 62: the trainer trains, at most 400)"
