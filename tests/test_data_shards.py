"""data=bin: nanoGPT raw files and llm.c shards, memory-mapped, sampled in proportion to their length,
checked (truncated, wrong magic, out-of-range ids: one line naming the file, exit 2)."""

import numpy as np
import pytest
import torch
from hydra import compose, initialize_config_dir

from grow import cli, data
from grow import train as train_mod
from grow.config import CONFIG_DIR
from grow.data import shards
from grow.run import load as load_run
from grow.run import validate

QUIET = lambda *a, **k: None  # noqa: E731
V = 64


def tokens(n, seed):
    """A learnable stream: runs of consecutive ids (mod V) from random starting points."""
    rng = np.random.default_rng(seed)
    starts = rng.integers(0, V, size=n // 8 + 1)
    return ((starts[:, None] + np.arange(8)[None, :]) % V).reshape(-1)[:n].astype(np.uint16)


@pytest.fixture
def shard_set(tmp_path):
    """Two training shards in the two formats (llm.c with a header, nanoGPT raw) and one val shard."""
    d = tmp_path / "shards"
    d.mkdir()
    data.write_shard(d / "fineweb_train_000001.bin", tokens(30_000, 1), header=True)
    data.write_shard(d / "train.bin", tokens(10_000, 2), header=False)
    data.write_shard(d / "fineweb_val_000000.bin", tokens(5_000, 3), header=True)
    return d


def bin_cfg(d, **kw):
    return {"name": "bin", "train": [str(d / "*train*.bin")], "val": [str(d / "*val*.bin")], "vocab_size": V, **kw}


def test_both_formats_are_memory_mapped_without_copies(shard_set):
    d = data.load(bin_cfg(shard_set), 16, log=QUIET)
    assert [len(a) for a in d.train] == [30_000, 10_000] and d.val_tokens == 5_000
    for arr in (*d.train, *d.val):
        assert isinstance(arr, np.memmap) and arr.mode == "r"
    assert d.train[0].offset == shards.HEADER_BYTES and d.train[1].offset == 0
    assert np.array_equal(d.train[0], tokens(30_000, 1)) and np.array_equal(d.train[1], tokens(10_000, 2))
    assert d.cache_dir is None and d.tokenizer_path is None and not d.built


def test_shard_batches_are_a_function_of_seed_and_sample_index_whatever_the_batch_sizes(shard_set):
    d = data.load(bin_cfg(shard_set), 16, log=QUIET)
    whole_x, whole_y = d.batch(7, 50, 64, 16)
    # the same 64 samples consumed by stages of batch sizes 3, 5, 8, 16, 32 (e.g. a growth schedule)
    parts, at = [], 50
    for bs in (3, 5, 8, 16, 32):
        parts.append(d.batch(7, at, bs, 16))
        at += bs
    assert torch.equal(torch.cat([p[0] for p in parts]), whole_x) and torch.equal(torch.cat([p[1] for p in parts]),
                                                                                   whole_y)
    assert torch.equal(d.batch(7, 50, 64, 16)[0], whole_x)  # a fresh call (a resumed run): the same samples
    assert torch.equal(whole_x[:, 1:], whole_y[:, :-1])
    # every row is a window of one shard
    streams = [np.asarray(a, dtype=np.int64) for a in d.train]
    for row in whole_x.numpy():
        assert any(any(np.array_equal(s[o:o + 16], row) for o in np.flatnonzero(s[:-16] == row[0])) for s in streams)


def test_shards_are_sampled_in_proportion_to_their_length(tmp_path):
    d = tmp_path / "s"
    d.mkdir()
    data.write_shard(d / "a_train.bin", np.zeros(30_000, np.uint16), header=True)  # all 0
    data.write_shard(d / "b_train.bin", np.ones(10_000, np.uint16), header=False)  # all 1
    data.write_shard(d / "val.bin", np.zeros(100, np.uint16))
    td = data.load(bin_cfg(d), 16, log=QUIET)
    x, _ = td.batch(0, 0, 8000, 16)
    share_b = float((x[:, 0] == 1).float().mean())
    expected = (10_000 - 17) / (30_000 - 17 + 10_000 - 17)
    assert abs(share_b - expected) < 0.02, share_b


def test_training_on_shards_of_both_formats(tmp_path, shard_set):
    with initialize_config_dir(str(CONFIG_DIR), version_base="1.3"):
        cfg = compose("train", overrides=["model=tiny", "data=bin", f"data.train=[{shard_set}/*train*.bin]",
                                          f"data.val=[{shard_set}/*val*.bin]", f"data.vocab_size={V}",
                                          "trainer.max_tokens=12000", "trainer.batch_size=8", "trainer.log_every=5",
                                          "trainer.eval_batches=2", "trainer.eval_batch_size=8",
                                          "trainer.progress=false", "trainer.eval_every=0", "optim.lr=3e-3"])
    validate(cfg)
    assert cfg.model.vocab_size == V
    summary = train_mod.train(load_run(cfg), tmp_path / "run")
    assert summary["final_config"]["vocab_size"] == V
    assert summary["final_val_loss"] < np.log(V) - 0.5  # learned the runs


def damaged(d, kind):
    good = tokens(4_000, 5)
    path = d / f"bad_{kind}.bin"
    if kind == "truncated":
        data.write_shard(path, good, header=True)
        path.write_bytes(path.read_bytes()[:-100])
    elif kind == "magic":
        data.write_shard(path, good, header=True)
        raw = bytearray(path.read_bytes())
        raw[0:4] = np.int32(20240521).tobytes()
        path.write_bytes(bytes(raw))
    elif kind == "version":
        data.write_shard(path, good, header=True)
        raw = bytearray(path.read_bytes())
        raw[4:8] = np.int32(2).tobytes()
        path.write_bytes(bytes(raw))
    elif kind == "odd":
        path.write_bytes(good.tobytes() + b"\0")
    elif kind == "id":
        bad = good.copy()
        bad[1234] = V  # one id at vocab_size
        data.write_shard(path, bad, header=False)
    return path


DAMAGE = {"truncated": "truncated shard", "magic": "wrong magic 20240521", "version": "version 2",
          "odd": "odd number of bytes", "id": f"token id {V} at position 1234"}


@pytest.mark.parametrize("kind", DAMAGE)
def test_a_damaged_shard_is_named(shard_set, kind):
    path = damaged(shard_set, kind)
    with pytest.raises(data.DataError) as info:
        data.load(bin_cfg(shard_set, train=[str(shard_set / "*train*.bin"), str(path)]), 16, log=QUIET)
    assert str(path) in str(info.value) and DAMAGE[kind] in str(info.value)
    assert "\n" not in str(info.value)


def test_ids_are_checked_on_a_sample_of_a_large_shard(tmp_path):
    n = (shards.CHECK_WINDOWS + 2) * shards.CHECK_TOKENS * 2
    arr = np.zeros(n, np.uint16)
    arr[-1] = V  # the last tokens are always in the sample
    path = data.write_shard(tmp_path / "big.bin", arr)
    with pytest.raises(data.DataError, match=f"position {n - 1}"):
        shards.check_ids(path, shards.open_shard(path), V)


@pytest.mark.parametrize("kind", ["truncated", "magic", "id"])
def test_a_damaged_shard_ends_the_cli_with_one_line_and_exit_2(tmp_path, monkeypatch, capsys, shard_set, kind):
    monkeypatch.chdir(tmp_path)
    path = damaged(shard_set, kind)
    with pytest.raises(SystemExit) as info:
        cli.main(["train", "model=tiny", "data=bin", f"data.train=[{path}]", f"data.val=[{shard_set}/*val*.bin]",
                  f"data.vocab_size={V}", "trainer.progress=false", f"hydra.run.dir={tmp_path / 'run'}"])
    err = [ln for ln in capsys.readouterr().err.splitlines() if ln.strip()]
    assert info.value.code == 2 and len(err) == 1, err
    assert err[0].startswith("error: ") and str(path) in err[0] and DAMAGE[kind] in err[0]
