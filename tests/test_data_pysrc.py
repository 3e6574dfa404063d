"""data=pysrc (grow/data/pysrc.py): every .py file under the roots, deduplicated by content, validation
held out by whole top-level package, with a manifest in the token cache that each run's summary.json
names; a 2-layer run on it."""

from __future__ import annotations

import json

import numpy as np
import pytest

from grow import cli
from grow.data import load, pysrc
from grow.data.config import DataConfig
from tests.conftest import TINY_RUN
from tests.helpers import pysrc_tree as _tree


def _cfg(tmp_path, **extra):
    return DataConfig.from_node({"name": "pysrc", "roots": [str(tmp_path / "src")], "vocab_size": 300,
                                 "cache_dir": str(tmp_path / "cache"), "val_every": 3, "num_proc": 1, **extra})


def test_pysrc_splits_by_package_dedups_by_content_and_writes_a_manifest(tmp_path):
    _tree(tmp_path / "src")
    cfg = _cfg(tmp_path)
    data = load(cfg, seq_len=32, log=lambda *_: None)
    doc = json.loads((data.cache_dir / pysrc.MANIFEST).read_text())
    entries = doc["files"]
    paths = [e["path"] for e in entries]
    assert "pkg_b/copy.py" not in paths and "pkg_a/util.py" in paths  # the later copy skipped
    assert not any("__pycache__" in p or p.endswith(".txt") for p in paths) and len(paths) == 9
    assert {e["package"] for e in entries} == {"pkg_a", "pkg_b", "pkg_c", "mod_d", "pkg_e", "pkg_f", "pkg_g"}
    for e in entries:  # the split is the package's: sha256(name) % val_every == 0
        assert e["split"] == ("val" if pysrc.is_val_package(e["package"], 3) else "train"), e
        assert e["sha256"] == __import__("hashlib").sha256((tmp_path / "src" / e["path"]).read_bytes()).hexdigest()
    val = {e["package"] for e in entries if e["split"] == "val"}
    assert val and val != {e["package"] for e in entries}, "both splits hold a package"
    # token counts: each split's .bin holds its files' tokens plus one end-of-text token per file
    for split, arrays in (("train", data.train), ("val", data.val)):
        part = [e for e in entries if e["split"] == split]
        assert sum(len(a) for a in arrays) == sum(e["tokens"] for e in part) + len(part), split
        assert doc["summary"][split]["files"] == len(part)
    assert doc["summary"]["val"]["packages"] == sorted(val)


def test_the_pysrc_cache_reads_and_tokenizes_each_file_once(tmp_path, monkeypatch):
    """#65: the manifest's per-file counts came from a second pass (every file read and encoded again, ~2.5 min
    without a line on the import path); now from the encoder's own pass, and equal to encoding each file alone."""
    from pathlib import Path

    from tokenizers import Tokenizer

    _tree(tmp_path / "src")
    reads, real = [], Path.read_bytes
    monkeypatch.setattr(Path, "read_bytes", lambda self: reads.append(self) or real(self))
    lines = []
    data = load(_cfg(tmp_path), seq_len=32, log=lines.append)
    src = [p for p in reads if (tmp_path / "src") in p.parents]
    assert src and len(src) == len(set(src)), "a file read twice"
    assert sum("tokenized pysrc" in str(ln) for ln in lines) == 1  # the one pass, said
    monkeypatch.undo()
    tok = Tokenizer.from_file(str(data.cache_dir / "tokenizer.json"))
    for e in json.loads((data.cache_dir / pysrc.MANIFEST).read_text())["files"]:
        text = (tmp_path / "src" / e["path"]).read_bytes().decode("utf-8", errors="replace")
        assert e["tokens"] == len(tok.encode(text, add_special_tokens=False).ids), e


def test_pysrc_reads_the_import_path_by_default_and_refuses_a_missing_root(tmp_path):
    roots = pysrc.import_roots()
    import sysconfig
    from pathlib import Path

    assert Path(sysconfig.get_paths()["stdlib"]).resolve() in roots
    from grow.errors import ConfigError

    with pytest.raises(ConfigError, match="data.roots"):
        _cfg(tmp_path, roots=[str(tmp_path / "nowhere")])


def test_a_two_layer_run_on_pysrc_names_its_manifest(tmp_path, monkeypatch):
    _tree(tmp_path / "src")
    monkeypatch.chdir(tmp_path)
    run = tmp_path / "run"
    try:
        cli.main(["train", *[a for a in TINY_RUN if not a.startswith("data.")], "data=pysrc",
                  f"data.roots=[{tmp_path / 'src'}]", "data.vocab_size=300", "data.val_every=3",
                  f"data.cache_dir={tmp_path / 'cache'}", "model.n_layers=2", "trainer.max_tokens=2048",
                  f"hydra.run.dir={run}"])
    except SystemExit as exc:
        assert exc.code in (0, None)
    s = json.loads((run / "summary.json").read_text())
    assert s["complete"] and np.isfinite(s["final_val_loss"]) and s["final_config"]["n_layers"] == 2
    manifest = json.loads(open(s["data"]["manifest"]).read())
    assert s["data"]["corpus"] == manifest["summary"] and s["data"]["corpus"]["files"] == 9
    assert s["data"]["val_tokens"] == manifest["summary"]["val"]["tokens"] + manifest["summary"]["val"]["files"]


def _ok(argv: list[str]) -> None:
    """``grow <argv>`` in this process, ended well."""
    try:
        cli.main(argv)
    except SystemExit as exc:
        assert exc.code in (0, None)


def test_grow_eval_of_a_pysrc_run_reads_its_validation_packages(tmp_path, monkeypatch, capsys):
    """grow eval of a data=pysrc run, with the run's own data and with data=pysrc given: the validation split
    the token cache holds (by package), every window of it (was: "data.name='pysrc': not a text source")."""
    _tree(tmp_path / "src")
    monkeypatch.chdir(tmp_path)
    run = tmp_path / "run"
    data = [f"data.roots=[{tmp_path / 'src'}]", "data.vocab_size=300", "data.val_every=3",
            f"data.cache_dir={tmp_path / 'cache'}"]
    _ok(["train", *[a for a in TINY_RUN if not a.startswith("data.")], "data=pysrc", *data, "model.n_layers=1",
         "model.seq_len=16", "trainer.max_tokens=1024", f"hydra.run.dir={run}"])
    s = json.loads((run / "summary.json").read_text())
    val_tokens = s["data"]["val_tokens"]
    for extra in ([], ["data=pysrc", *data]):
        capsys.readouterr()
        _ok(["eval", f"run={run}", "max_tokens=null", *extra])
        result = json.loads(capsys.readouterr().out.strip().splitlines()[-1])
        assert result["data"] == "pysrc" and result["data_is_the_runs"] and result["split"] == "val"
        # every whole window of the cache's validation tokens (the files and their end-of-text tokens)
        assert result["windows"] == (val_tokens - 1) // 16 and result["loss"] > 0
