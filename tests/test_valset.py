"""A validation split that represents the corpus (grow/data/valset.py, data.val_near_dup / data.val_max_share):
MinHash near-duplicates, the package-share cap's fixed point, their effect on a data=pysrc cache (validation files
dropped, the training split byte for byte as before), the per-package breakdown of trainer.full_val, and the
refusals."""

from __future__ import annotations

import hashlib
import json
import random

import numpy as np
import pytest
import torch

from grow.data import load, pysrc, valset
from grow.data.config import DataConfig
from grow.errors import ConfigError


def _code(seed: int, n: int) -> str:
    r = random.Random(seed)
    return "".join(f"def f{r.randrange(10**6)}(x, y):\n    return x * {r.randrange(999)} + y - {r.randrange(999)}\n\n"
                   for _ in range(n))


def test_near_duplicates_are_found_by_minhash_and_distinct_files_kept():
    """A codec table with a few entries changed is a near-duplicate of the first (exact Jaccard of their shingle
    sets ~0.9, the estimate within 0.15 of it); unrelated files are not; the first of a group stays."""
    table = "".join(f"    '\\x{i:02x}'  # 0x{i:02X} -> CHAR {i}\n" for i in range(256))
    other = table.replace("CHAR 17", "LETTER A").replace("CHAR 200", "LETTER B")
    files = [table.encode(), _code(1, 80).encode(), other.encode(), _code(2, 80).encode()]
    assert valset.near_duplicates(files, 0.5) == {2: 0}
    def grams(t: bytes) -> set:
        words = valset._WORD.findall(t)  # once per file (in the comprehension it was once per shingle: 3 s)
        return {b" ".join(words[i:i + 5]) for i in range(len(words) - 4)}

    exact = len(grams(files[0]) & grams(files[2])) / len(grams(files[0]) | grams(files[2]))
    estimate = float((valset.signature(files[0]) == valset.signature(files[2])).mean())
    assert 0.8 < exact < 1 and abs(estimate - exact) < 0.15
    assert float((valset.signature(files[1]) == valset.signature(files[3])).mean()) < 0.1


def test_the_share_cap_is_a_fixed_point_with_whole_files_and_refuses_too_few_packages():
    """Package a: 50 + 50 bytes, b: one 80-byte file, c..h: 20 each (120). At 30% the largest cap that works is
    50: a keeps its first file (50 of 170 = 29%), b's one file goes whole; at 25% a's 50 of 170 is too much, so
    only the small packages stay (20 of 120 each)."""
    files = [("a", 50), ("a", 50), ("b", 80)] + [(p, 20) for p in "cdefgh"]
    kept = valset.cap_shares(files, 0.25)
    by: dict[str, int] = {}
    for i in kept:
        by[files[i][0]] = by.get(files[i][0], 0) + files[i][1]
    assert max(by.values()) <= 0.25 * sum(by.values()) and kept == set(range(3, 9))
    assert valset.cap_shares(files, 0.3) == {0, *range(3, 9)}
    assert valset.cap_shares(files, 1.0) == set(range(9))
    with pytest.raises(ConfigError, match=r"data.val_max_share.*at least 4 of similar size are needed"):
        valset.cap_shares([("a", 10), ("b", 10), ("c", 10)], 0.25)


def _val_names(n: int, val_every: int) -> list[str]:
    out, i = [], 0
    while len(out) < n:
        name = f"vpkg{i}"
        if pysrc.is_val_package(name, val_every):
            out.append(name)
        i += 1
    return out


def _tree(root):
    """Validation packages (by sha256(name) % 4): `enc` with 5 near-identical tables, `big` one file larger than
    the rest together, 6 small ones; training packages besides."""
    names = _val_names(8, 4)
    enc, big, small = names[0], names[1], names[2:]
    table = "".join(f"    '\\x{i:02x}'  # 0x{i:02X} -> CHAR {i}\n" for i in range(256))
    for k in range(5):
        (root / enc).mkdir(parents=True, exist_ok=True)
        (root / enc / f"cp{k}.py").write_text(table.replace("CHAR 1", f"SIGN {k}"))
    (root / big).mkdir()
    (root / big / "topics.py").write_text(_code(7, 2000))
    for j, p in enumerate(small):
        (root / p).mkdir()
        (root / p / "m.py").write_text(_code(20 + j, 150))
    t = 0
    while pysrc.is_val_package(f"train{t}", 4) or t < 3:
        if not pysrc.is_val_package(f"train{t}", 4):
            (root / f"train{t}").mkdir()
            (root / f"train{t}" / "a.py").write_text(_code(100 + t, 400))
        t += 1
    return enc, big, small


def test_a_representative_validation_split_drops_validation_files_only(tmp_path):
    """With data.val_near_dup=0.5 and data.val_max_share=0.2: 4 of `enc`'s 5 tables dropped as near-duplicates,
    the one big file dropped whole (over the share), no package above 20% of the validation bytes, the summary
    naming the largest share and what was dropped; the training split's tokens byte for byte those of the cache
    built without the rules (another fingerprint)."""
    enc, big, small = _tree(tmp_path / "src")
    base = {"name": "pysrc", "roots": [str(tmp_path / "src")], "vocab_size": 300, "cache_dir": str(tmp_path / "c"),
            "val_every": 4, "num_proc": 1}
    plain = load(DataConfig.from_node(base), seq_len=32, log=lambda *_: None)
    rep = load(DataConfig.from_node({**base, "val_near_dup": 0.5, "val_max_share": 0.2}), seq_len=32, log=lambda *_: None)
    assert rep.cache_dir != plain.cache_dir
    doc = json.loads((rep.cache_dir / pysrc.MANIFEST).read_text())
    dropped = {e["path"]: e["reason"] for e in doc["files"] if e["split"] == "dropped"}
    assert sorted(dropped) == sorted([f"{enc}/cp{k}.py" for k in range(1, 5)] + [f"{big}/topics.py"])
    assert all(dropped[f"{enc}/cp{k}.py"] == f"near-duplicate of {enc}/cp0.py" for k in range(1, 5))
    shares = pysrc.val_packages(doc["files"])
    assert set(shares) == {enc, *small} and max(p["share"] for p in shares.values()) <= 0.2
    summary = doc["summary"]
    assert summary["val_largest_package"][1] == max(p["share"] for p in shares.values())
    assert summary["dropped"]["files"] == 5 and summary["dropped"]["near_duplicates"] == 4
    assert summary["dropped"]["packages_left_out"] == [big]
    digest = lambda d: hashlib.sha256((d.cache_dir / "train.bin").read_bytes()).hexdigest()
    assert digest(rep) == digest(plain)
    val = np.concatenate([np.asarray(a) for a in rep.val])
    assert len(val) == sum(e["tokens"] + 1 for e in doc["files"] if e["split"] == "val")


def test_the_full_split_breaks_down_by_package_every_token_scored(tmp_path):
    """`package_losses` on a tiny float64 model: each package's stretch in windows of the context (the last one
    shorter), so its loss is the mean over its every target token: checked against one forward over the stretch
    in float64 (rel 1e-12); the tokens add up to the split's less one per package."""
    from grow.checkpoint_eval import package_losses
    from grow.model import Transformer, TransformerConfig

    torch.manual_seed(0)
    model = Transformer(TransformerConfig(vocab_size=50, n_layers=1, d_model=16, n_heads=2, d_qk=8, d_v=8, d_ff=32,
                                          seq_len=8)).double().eval()
    entries = [{"package": "a", "tokens": 10, "bytes": 30}, {"package": "a", "tokens": 6, "bytes": 20},
               {"package": "b", "tokens": 4, "bytes": 50}]
    ids = np.random.default_rng(0).integers(0, 50, 10 + 1 + 6 + 1 + 4 + 1)
    out = package_losses(model, ids, entries, 4, torch.device("cpu"))
    assert [out[p]["tokens"] for p in "ab"] == [17, 4] and out["b"]["share"] == pytest.approx(0.5)

    def direct(seg):  # every target by windows of 8, by hand
        t = torch.from_numpy(seg)
        nats = 0.0
        for lo in range(0, len(t) - 1, 8):
            x, y = t[lo:lo + 8][None], t[lo + 1:lo + 9][None]
            x = x[:, : y.shape[1]]
            logits = model(x)[0] if isinstance(model(x), tuple) else model(x)
            nats += float(torch.nn.functional.cross_entropy(logits.reshape(-1, 50), y.reshape(-1), reduction="sum"))
        return nats / (len(t) - 1)

    assert out["a"]["loss"] == pytest.approx(direct(ids[:18]), rel=1e-12)
    assert out["b"]["loss"] == pytest.approx(direct(ids[18:]), rel=1e-12)
    assert package_losses(model, ids[:-1], entries, 4, torch.device("cpu")) is None  # counts that do not add up


@pytest.mark.parametrize("key,value", [("val_max_share", 1.5), ("val_near_dup", 0), ("val_max_share", "x")])
def test_a_bad_validation_rule_is_refused_naming_the_key(key, value, tmp_path):
    with pytest.raises(ConfigError) as e:
        DataConfig.from_node({"name": "pysrc", "vocab_size": 300, key: value})
    assert f"data.{key}" in str(e.value) and "(0, 1]" in str(e.value)


def test_the_report_states_the_validation_set_s_composition():
    """The report's data line names the held-out packages' count, the largest share and what was dropped, from the
    manifest summary every pysrc run's summary.json carries (grow.report.tables._val_set_line)."""
    from grow.report.tables import _data_line

    corpus = {"val": {"files": 9, "bytes": 48000, "tokens": 1, "packages": ["a", "b", "c"]},
              "val_largest_package": ["a", 0.1492], "dropped": {"files": 5, "bytes": 9000, "near_duplicates": 4,
                                                                "packages_left_out": ["big"]}}
    data = {"train_tokens": 10, "val_tokens": 5, "bigram_val_loss": 4.0, "bigram_lambda": 0.9, "corpus": corpus}
    line = " ".join(_data_line(data))
    assert ("Validation set: 3 held-out packages, 9 files, 48k bytes; the largest, `a`, is 14.9% of its bytes; 5 files "
            "(9k bytes) dropped, 4 of them near-duplicates") in line and "leaving out `big`." in line
    assert "Validation set" not in " ".join(_data_line({**data, "corpus": {"val": corpus["val"]}}))
