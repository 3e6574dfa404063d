"""Data pipeline (docs/design.md, "Data"): cache reuse without reading the corpus, atomic builds, streaming
tokenization in bounded memory, deterministic batches, local text and datasets files."""

import json
import os
import socket

import numpy as np
import pytest
import torch
from omegaconf import OmegaConf

from grow import data
from grow.data import cache, encode
from tests.helpers import no_hub

QUIET = lambda *a, **k: None  # noqa: E731


def cfg(tmp_path, **kw):
    base = dict(name="stdlib", vocab_size=512, max_bytes=200_000, val_every=20, cache_dir=str(tmp_path / "cache"),
                num_proc=1)
    base.update(kw)
    return OmegaConf.create(base)


def forbid(monkeypatch, module, name):
    def called(*a, **k):
        raise AssertionError(f"{module.__name__}.{name} was called")

    monkeypatch.setattr(module, name, called)


def test_second_load_reads_no_document_and_hashes_nothing(tmp_path, monkeypatch):
    c = cfg(tmp_path)
    first = data.load(c, 32, log=QUIET)
    assert first.built
    for name in ("documents", "train_bpe", "sha256_file", "Encoder"):  # no reading, training, hashing, encoding
        forbid(monkeypatch, cache, name)
    lines = []
    second = data.load(c, 32, log=lines.append)
    assert not second.built and second.cache_dir == first.cache_dir
    assert np.array_equal(first.train[0], second.train[0])
    assert len(lines) == 1 and lines[0].startswith("data: reusing the token cache")


def test_verify_full_hashes_every_file(tmp_path, monkeypatch):
    c = cfg(tmp_path)
    d = data.load(c, 32, log=QUIET).cache_dir
    hashed = []
    real = cache.sha256_file
    monkeypatch.setattr(cache, "sha256_file", lambda p: hashed.append(p.name) or real(p))
    assert not data.load(cfg(tmp_path, verify="full"), 32, log=QUIET).built
    assert sorted(hashed) == sorted(cache.FILES)
    assert data.cache_is_valid(d, full=True)


def test_a_truncated_cache_is_rebuilt_and_a_corrupt_one_caught_by_verify_full(tmp_path):
    c = cfg(tmp_path)
    d = data.load(c, 32, log=QUIET).cache_dir
    path = d / "train.bin"
    raw = path.read_bytes()
    path.write_bytes(raw[: len(raw) // 2])  # truncated: the size check catches it
    assert not data.cache_is_valid(d)
    lines = []
    again = data.load(c, 32, log=lines.append)
    assert again.built and again.train[0].nbytes == len(raw)
    assert any("damaged" in ln and "rebuilding" in ln for ln in lines)
    flipped = bytearray(raw)
    flipped[100] ^= 1
    path.write_bytes(bytes(flipped))  # same size, other content: only the SHA-256 sees it
    assert data.cache_is_valid(d) and not data.cache_is_valid(d, full=True)
    assert data.load(cfg(tmp_path, verify="full"), 32, log=QUIET).built
    assert path.read_bytes() == raw


def test_the_fingerprint_follows_the_files_identity(tmp_path):
    doc = tmp_path / "a.txt"
    doc.write_text("hello world " * 2000)
    c = data.DataConfig.from_node(cfg(tmp_path, name="text", files=[str(doc)]))
    before = data.fingerprint(c)
    assert data.fingerprint(c) == before
    os.utime(doc, ns=(1, 1))  # same content, another modification time: treated as another corpus
    assert data.fingerprint(c) != before


def test_an_interrupted_build_leaves_nothing_a_later_run_uses(tmp_path, monkeypatch):
    c = cfg(tmp_path)
    real, calls = encode.encode_chunk, []

    def interrupted(chunk):
        calls.append(1)
        if len(calls) == 2:
            raise KeyboardInterrupt
        return real(chunk)

    monkeypatch.setattr(encode, "encode_chunk", interrupted)
    monkeypatch.setattr(encode, "CHUNK_CHARS", 20_000)
    with pytest.raises(KeyboardInterrupt):
        data.load(c, 32, log=QUIET)
    assert list((tmp_path / "cache").iterdir()) == []  # no cache, no temporary directory
    # a build killed outright leaves its temporary directory: never read, removed by the next build
    d = cache.cache_path(data.DataConfig.from_node(c))
    stale = d.parent / f".{d.name}.tmp-{socket.gethostname()}-{2**22 + 12345}"
    (stale / "x").mkdir(parents=True)
    monkeypatch.setattr(encode, "encode_chunk", real)
    assert data.load(c, 32, log=QUIET).built
    assert [p.name for p in (tmp_path / "cache").iterdir()] == [d.name]


def test_workers_give_the_same_tokens_as_one_process(tmp_path, monkeypatch):
    monkeypatch.setattr(encode, "CHUNK_CHARS", 30_000)  # several chunks in flight
    one = data.load(cfg(tmp_path / "a", num_proc=1), 32, log=QUIET)
    two = data.load(cfg(tmp_path / "b", num_proc=2), 32, log=QUIET)
    assert np.array_equal(one.train[0], two.train[0]) and np.array_equal(one.val[0], two.val[0])


def test_the_encoder_reads_at_most_two_chunks_per_worker_ahead(monkeypatch):
    """Bounded memory: documents are pulled only as the workers keep up."""
    tok = data.train_bpe(["abc def ghi"] * 10, 300)
    pulled = []

    def chunks():
        for i in range(20):
            pulled.append(i)
            yield ["abc def"] * 3, []

    with encode.Encoder(tok.to_str(), 0, 2) as enc:
        for k, _ in enumerate(enc.map(chunks())):
            assert len(pulled) <= k + 1 + 4  # yielded k+1 results, at most 2 x 2 pending
    assert len(pulled) == 20


def test_the_bpe_trains_on_a_bounded_sample(tmp_path, monkeypatch):
    seen = []
    real = cache.train_bpe
    monkeypatch.setattr(cache, "train_bpe", lambda texts, *a: real(seen.extend(texts) or seen, *a))
    d = data.load(cfg(tmp_path, tokenizer_sample_bytes=50_000), 32, log=QUIET)
    sample = sum(len(t) for t in seen)
    assert 50_000 <= sample < 50_000 + max(len(t) for t in seen)  # stops at the document that reaches it
    text = data.load_tokenizer(d.cache_dir).decode([int(t) for t in d.train[0]])
    assert len(text) > 3 * sample  # while the whole (200 kB) corpus is tokenized


def test_the_console_shows_the_first_tokenization_with_its_rate(tmp_path):
    lines = []
    data.load(cfg(tmp_path), 32, log=lines.append)
    assert any(ln.startswith("data: training a byte-level BPE") for ln in lines)
    done = [ln for ln in lines if ln.startswith("data: tokenized stdlib")]
    assert len(done) == 1 and " MB/s" in done[0] and "train" in done[0]


def test_batches_are_a_function_of_seed_and_sample_index(tmp_path):
    d = data.load(cfg(tmp_path), 16, log=QUIET)
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
    d = data.load(cfg(tmp_path), 16, log=QUIET)
    a, b = d.val_batches(2, 4, 16), d.val_batches(2, 4, 16)
    assert all(torch.equal(p[0], q[0]) for p, q in zip(a, b))
    assert int(a[0][0].max()) < 512


def test_text_files_source(tmp_path):
    for i in range(25):
        (tmp_path / f"doc{i:02d}.txt").write_text(("the quick brown fox jumps over the lazy dog %d\n" % i) * 200)
    d = data.load(cfg(tmp_path, name="text", files=[str(tmp_path / "doc*.txt")]), 16, log=QUIET)
    tok = data.load_tokenizer(d.cache_dir)
    text = tok.decode([int(t) for t in d.train[0][:40]])
    assert "quick brown fox" in text
    assert tok.decode([int(t) for t in d.val[0][:40]]).startswith("the quick brown fox jumps over the lazy dog 19\n")


def test_a_corpus_smaller_than_val_every_documents_holds_out_a_tail(tmp_path):
    (tmp_path / "one.txt").write_text("alpha beta gamma delta " * 500)
    d = data.load(cfg(tmp_path, name="text", files=[str(tmp_path / "one.txt")]), 16, log=QUIET)
    assert d.val_tokens > 17 and d.train_tokens > 8 * d.val_tokens


def write_jsonl(path, n, field="body"):
    with path.open("w") as f:
        for i in range(n):
            f.write(json.dumps({field: f"row {i}: " + "lorem ipsum dolor sit amet " * 30, "id": i}) + "\n")
    return path


def test_hf_source_on_a_local_jsonl_file(tmp_path):
    path = write_jsonl(tmp_path / "corpus.jsonl", 60)
    d = data.load(cfg(tmp_path, name="hf", path=str(path), text_field="body", split="train"), 16, log=QUIET)
    assert d.train_tokens > 1000 and d.val_tokens > 100
    tok = data.load_tokenizer(d.cache_dir)
    assert tok.decode([int(t) for t in d.train[0][:6]]).startswith("row 0: lorem")


def test_hf_max_bytes_stops_reading(tmp_path):
    path = write_jsonl(tmp_path / "corpus.jsonl", 200)
    full = data.load(cfg(tmp_path, name="hf", path=str(path), text_field="body", max_bytes=None), 16, log=QUIET)
    part = data.load(cfg(tmp_path, name="hf", path=str(path), text_field="body", max_bytes=20_000), 16, log=QUIET)
    assert part.train_tokens + part.val_tokens < (full.train_tokens + full.val_tokens) / 5


def test_hf_missing_column_is_a_clear_error(tmp_path):
    path = tmp_path / "corpus.jsonl"
    path.write_text(json.dumps({"body": "x " * 100}) + "\n")
    with pytest.raises(data.DataError, match="text_field"):
        data.load(cfg(tmp_path, name="hf", path=str(path), text_field="text"), 16, log=QUIET)
    assert [p.name for p in (tmp_path / "cache").iterdir()] == []  # nothing left behind


def test_hf_unreachable_dataset_names_it(tmp_path, monkeypatch, reachable_hub):
    """The Hub reached, the dataset not (datasets' own error): one line naming it."""
    import datasets

    def offline(*a, **k):
        raise ConnectionError("Couldn't reach the hub")

    monkeypatch.setattr(datasets, "load_dataset", offline)
    with pytest.raises(data.DataError, match="some/dataset.*data=stdlib"):
        data.load(cfg(tmp_path, name="hf", path="some/dataset"), 16, log=QUIET)


@pytest.fixture
def reachable_hub(monkeypatch):
    """A Hub the probe reaches (HF_ENDPOINT: a loopback socket that listens), for tests that stand in for it."""
    from grow import hub, net

    with socket.socket() as server:
        server.bind(("127.0.0.1", 0))
        server.listen(4)
        monkeypatch.setenv("HF_ENDPOINT", f"http://127.0.0.1:{server.getsockname()[1]}")
        for name in (*net.PROXY_VARIABLES, *hub.OFFLINE_VARIABLES):
            monkeypatch.delenv(name, raising=False)
        yield


def test_hf_offline_fails_at_once_without_asking_the_hub(tmp_path, monkeypatch):
    """Offline (#45): one line naming the dataset, the Hub and the ways on, before datasets' retries (~30 s)."""
    import datasets

    url = no_hub(monkeypatch)
    forbid(monkeypatch, datasets, "load_dataset")
    with pytest.raises(data.DataError) as info:
        data.load(cfg(tmp_path, name="hf", path="some/dataset"), 16, log=QUIET)
    message = str(info.value)
    assert message.startswith(f"data.path='some/dataset': a Hub dataset, and the Hugging Face Hub ({url}) is "
                              "unreachable: ") and "\n" not in message
    assert "HF_HUB_OFFLINE=1 reads a copy already in the local Hugging Face cache" in message and "data=stdlib" in message


def test_hf_offline_mode_asks_datasets_for_its_cache_without_probing(tmp_path, monkeypatch):
    """HF_HUB_OFFLINE=1: no probe (a cached copy must still load); datasets itself is asked."""
    import datasets

    no_hub(monkeypatch)
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    asked = []

    def load_dataset(path, *a, **k):
        asked.append(path)
        raise ConnectionError("Couldn't reach 'some/dataset' on the Hub (OfflineModeIsEnabled)")

    monkeypatch.setattr(datasets, "load_dataset", load_dataset)
    with pytest.raises(data.DataError, match="OfflineModeIsEnabled"):
        data.load(cfg(tmp_path, name="hf", path="some/dataset"), 16, log=QUIET)
    assert asked == ["some/dataset"]


def test_hf_streaming_reads_the_hub_in_streaming_mode(tmp_path, monkeypatch, reachable_hub):
    """data.streaming=true hands streaming=True (and the revision) to datasets; the rows are read in batches."""
    import datasets

    local = write_jsonl(tmp_path / "corpus.jsonl", 60, field="text")
    calls = []
    real = datasets.load_dataset

    def fake_hub(path, name=None, **kw):
        calls.append((path, name, kw))
        return real("json", data_files=str(local), split="train", streaming=kw["streaming"])

    monkeypatch.setattr(datasets, "load_dataset", fake_hub)
    c = cfg(tmp_path, name="hf", path="org/corpus", config="sample", revision="abc123", streaming=True)
    d = data.load(c, 16, log=QUIET)
    assert calls == [("org/corpus", "sample", {"split": "train", "revision": "abc123", "streaming": True})]
    assert d.train_tokens > 1000
    # the identity of a hub dataset is its name, config, split, revision and mode: the second start reads nothing
    forbid(monkeypatch, datasets, "load_dataset")
    assert not data.load(c, 16, log=QUIET).built


def test_the_status_line_is_redrawn_on_a_terminal_and_printed_every_few_seconds_in_a_log(monkeypatch):
    import io

    from rich.console import Console

    from grow.data import progress

    term = Console(file=io.StringIO(), force_terminal=True, width=200, highlight=False, color_system=None)
    p = progress.Progress(term.print, "corpus")
    assert p.status is not None  # a rich status line, redrawn in place
    p.update(2_000_000, 500_000, 20_000, 100)
    assert "2.0 MB of text" in p.line() and "MB/s" in p.line() and "520k tokens" in p.line()
    p.done("/cache/x")
    assert "data: tokenized corpus: 2.0 MB of text, 100 documents -> 500k train + 20k val tokens" in term.file.getvalue()
    lines = []
    monkeypatch.setattr(progress, "PLAIN_EVERY", 0.0)
    plain = progress.Progress(lines.append, "corpus")  # not a console: plain lines through log
    assert plain.status is None
    plain.update(1_000_000, 1, 1, 1)
    assert len(lines) == 1 and lines[0].startswith("data: tokenizing corpus: 1.0 MB of text")


def test_bytes_that_are_not_the_encoding_are_counted_and_said(tmp_path, capsys):
    """Before: a Latin-1 file and random bytes were read with U+FFFD in silence. Now one warning line
    counts the undecodable bytes per corpus and names the files; data.encoding reads them right."""
    from grow.data.sources import _read_files

    latin = tmp_path / "latin.txt"
    latin.write_bytes("Café crème brûlée\n".encode("latin-1"))  # é è û é: 4 bytes that are not UTF-8
    good = tmp_path / "good.txt"
    good.write_text("plain ascii\n")
    docs = list(_read_files([good, latin], None))
    assert docs[1] == "Caf\ufffd cr\ufffdme br\ufffdl\ufffde\n"
    err = capsys.readouterr().err.strip().splitlines()
    assert err == ["warning: data: 4 bytes of 1 file(s) (latin.txt) are not valid utf-8 and were read as U+FFFD; "
                   "if they are text in another encoding, set data.encoding (e.g. latin-1)"]
    assert list(_read_files([good, latin], None, "latin-1"))[1] == "Café crème brûlée\n"
    assert capsys.readouterr().err == ""


def test_the_encoding_is_checked_and_keys_the_cache(tmp_path):
    from grow.config import ConfigError
    from grow.data import DataConfig
    from grow.data.sources import identity

    (tmp_path / "a.txt").write_text("x")
    node = {"name": "text", "files": [str(tmp_path / "a.txt")], "vocab_size": 300}
    with pytest.raises(ConfigError, match="data.encoding='bogus'"):
        DataConfig.from_node({**node, "encoding": "bogus"})
    utf8, latin = DataConfig.from_node(node), DataConfig.from_node({**node, "encoding": "latin-1"})
    assert identity(utf8) != identity(latin)


def test_an_empty_local_file_says_so(tmp_path):
    """Before: the loader's failure with `offline machines can use data=stdlib ...`, as if it were the network."""
    from grow.data import DataConfig
    from grow.data.sources import documents
    from grow.errors import DataError

    (tmp_path / "empty.jsonl").write_text("")
    cfg = DataConfig.from_node({"name": "hf", "path": str(tmp_path / "empty.jsonl"), "vocab_size": 300})
    with pytest.raises(DataError, match="the file is empty") as err:
        list(documents(cfg))
    assert "offline" not in str(err.value)


def test_a_small_corpus_says_its_size_and_a_tokenizer_short_of_data_vocab_size(tmp_path):
    """#65: a tokenizer trained to data.vocab_size=512 on a small corpus ended with fewer ids, said nowhere, and the
    log called the corpus "0.0 MB"."""
    from grow.data.progress import fmt_bytes

    assert (fmt_bytes(512), fmt_bytes(49_200), fmt_bytes(2_000_000)) == ("512 B", "49.2 kB", "2.0 MB")
    lines = []
    d = data.load(cfg(tmp_path, vocab_size=4096, max_bytes=20_000), 32, log=lines.append)
    said = [ln for ln in lines if "ids, not data.vocab_size=4096" in ln]
    assert len(said) == 1 and "embedding rows" in said[0], lines
    got = int(said[0].split("the tokenizer has ", 1)[1].split()[0])
    assert got == data.load_tokenizer(d.cache_dir).get_vocab_size() < 4096
    assert not any("0.0 MB" in ln for ln in lines) and any(" kB of text" in ln for ln in lines), lines


def test_a_build_that_finishes_second_leaves_the_published_cache_in_place(tmp_path):
    """Two processes building one fresh cache at once: the one finishing second must not move the first one's
    directory away while others read it (an FSDP test's rank once met a missing train.bin that way)."""
    c = data.DataConfig.from_node(cfg(tmp_path))
    d = data.load(cfg(tmp_path), 32, log=QUIET).cache_dir
    reader = open(d / "train.bin", "rb")  # a process reading the published cache
    before = (d.stat().st_ino, (d / "train.bin").stat().st_ino)
    cache.build_cache(d, c, log=QUIET)  # the slower process's build, published second
    assert (d.stat().st_ino, (d / "train.bin").stat().st_ino) == before
    assert reader.read(16) == (d / "train.bin").read_bytes()[:16]
    reader.close()
    assert not list(d.parent.glob(f".{d.name}.tmp-*"))  # its own build removed
