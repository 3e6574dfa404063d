"""Data pipeline (DESIGN §10): cache reuse, deterministic batches, local text and datasets files."""

import json

import numpy as np
import pytest
import torch
from omegaconf import OmegaConf

from grow import data


def cfg(tmp_path, **kw):
    base = dict(name="stdlib", vocab_size=512, max_bytes=200_000, val_every=20, cache_dir=str(tmp_path / "cache"))
    base.update(kw)
    return OmegaConf.create(base)


def test_second_load_reuses_the_cache(tmp_path, monkeypatch):
    c = cfg(tmp_path)
    first = data.load(c, 32, log=lambda *a: None)
    assert first.built
    calls = []
    monkeypatch.setattr(data, "tokenize", lambda *a, **k: calls.append(1))
    monkeypatch.setattr(data, "train_tokenizer", lambda *a, **k: calls.append(1))
    second = data.load(c, 32, log=lambda *a: None)
    assert not second.built and calls == []
    assert np.array_equal(first.train, second.train)


def test_corrupt_cache_is_detected_and_rebuilt(tmp_path):
    c = cfg(tmp_path)
    d = data.load(c, 32, log=lambda *a: None).cache_dir
    path = d / "train.bin"
    raw = path.read_bytes()
    path.write_bytes(raw[: len(raw) // 2])  # truncated
    assert not data.cache_is_valid(d)
    again = data.load(c, 32, log=lambda *a: None)
    assert again.built and len(again.train) * 2 == len(raw)


def test_batches_are_a_function_of_seed_and_sample_index(tmp_path):
    d = data.load(cfg(tmp_path), 16, log=lambda *a: None)
    x1, y1 = d.batch(3, 100, 8, 16)
    x2, y2 = d.batch(3, 100, 8, 16)
    assert torch.equal(x1, x2) and torch.equal(y1, y2)
    assert torch.equal(x1[:, 1:], y1[:, :-1])  # targets are the next tokens
    # the stream does not depend on the batch size: samples 104..107 are the same in both
    x3, _ = d.batch(3, 104, 4, 16)
    assert torch.equal(x1[4:], x3)
    # and it crosses generator blocks seamlessly
    xa, _ = d.batch(3, data.BLOCK - 2, 4, 16)
    xb, _ = d.batch(3, data.BLOCK, 2, 16)
    assert torch.equal(xa[2:], xb)
    x4, _ = d.batch(4, 100, 8, 16)
    assert not torch.equal(x1, x4)  # another seed, another stream


def test_validation_batches_are_fixed(tmp_path):
    d = data.load(cfg(tmp_path), 16, log=lambda *a: None)
    a, b = d.val_batches(2, 4, 16), d.val_batches(2, 4, 16)
    assert all(torch.equal(p[0], q[0]) for p, q in zip(a, b))
    assert int(a[0][0].max()) < 512


def test_text_files_source(tmp_path):
    files = []
    for i in range(25):
        p = tmp_path / f"doc{i:02d}.txt"
        p.write_text(("the quick brown fox jumps over the lazy dog %d\n" % i) * 200)
        files.append(str(p))
    d = data.load(cfg(tmp_path, name="text", files=[str(tmp_path / "doc*.txt")]), 16, log=lambda *a: None)
    tok = data.load_tokenizer(d.cache_dir)
    text = tok.decode([int(t) for t in d.train[:40]])
    assert "quick brown fox" in text


def test_hf_source_on_a_local_jsonl_file(tmp_path):
    path = tmp_path / "corpus.jsonl"
    with path.open("w") as f:
        for i in range(60):
            f.write(json.dumps({"body": f"row {i}: " + "lorem ipsum dolor sit amet " * 30}) + "\n")
    c = cfg(tmp_path, name="hf", path=str(path), text_field="body", split="train")
    d = data.load(c, 16, log=lambda *a: None)
    assert len(d.train) > 1000 and len(d.val) > 100


def test_hf_missing_column_is_a_clear_error(tmp_path):
    path = tmp_path / "corpus.jsonl"
    path.write_text(json.dumps({"body": "x " * 100}) + "\n")
    with pytest.raises(data.DataError, match="text_field"):
        data.load(cfg(tmp_path, name="hf", path=str(path), text_field="text"), 16, log=lambda *a: None)


def test_hf_unreachable_dataset_names_it(tmp_path, monkeypatch):
    import datasets

    def offline(*a, **k):
        raise ConnectionError("Couldn't reach the hub")

    monkeypatch.setattr(datasets, "load_dataset", offline)
    with pytest.raises(data.DataError, match="some/dataset.*data=stdlib"):
        data.load(cfg(tmp_path, name="hf", path="some/dataset"), 16, log=lambda *a: None)
