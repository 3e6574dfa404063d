"""Documents -> (train, validation) token ids, in chunks, by worker processes, in bounded memory.

`split_stream` assigns each document to a split by its index (every ``val_every``-th, 1-based,
to validation; a corpus of fewer documents holds out the last 10% of its last one); `chunks`
groups them into chunks of about `CHUNK_CHARS` characters; `Encoder.map` encodes the chunks in
``num_proc`` worker processes (forked on Linux: nothing is imported again and the parent's pages
are shared; spawned elsewhere) and yields their ids in chunk order, with at most ``2 * num_proc``
chunks in flight. Each document's ids are followed by the end-of-text id; a chunk comes back as
two uint16 byte strings (train, val), its text's UTF-8 size and documents, and each one's id count.
The output is the same for any ``num_proc``; ``num_proc=1`` encodes in this process.
"""

from __future__ import annotations

import collections
import contextlib
import multiprocessing
import os
import signal
import sys
from collections.abc import Iterable, Iterator

import numpy as np

CHUNK_CHARS = 1 << 20  # characters per chunk sent to a worker
CHUNK_DOCS = 4096  # at most this many documents per chunk

Chunk = tuple[list[str], list[str]]  # (train texts, validation texts)


def split_stream(docs: Iterable[str], val_every: int) -> Iterator[tuple[bool, str]]:
    """``(is_val, text)`` per document: document i (1-based) is validation when i % val_every == 0.

    One document is held back, so that a corpus with no validation document (fewer than
    ``val_every``) can give the last 10% of its last document to validation instead."""
    held, n_val = None, 0
    for i, text in enumerate(docs, start=1):
        if held is not None:
            yield held
        held = (i % val_every == 0, text)
        n_val += held[0]
    if held is None:
        return
    if n_val:
        yield held
        return
    cut = int(len(held[1]) * 0.9)
    yield False, held[1][:cut]
    yield True, held[1][cut:]


def chunks(stream: Iterable[tuple[bool, str]]) -> Iterator[Chunk]:
    """Consecutive documents grouped into chunks of about `CHUNK_CHARS` characters."""
    train, val, size = [], [], 0
    for is_val, text in stream:
        (val if is_val else train).append(text)
        size += len(text)
        if size >= CHUNK_CHARS or len(train) + len(val) >= CHUNK_DOCS:
            yield train, val
            train, val, size = [], [], 0
    if train or val:
        yield train, val


# ---- the workers -----------------------------------------------------------------------------------

_tokenizer = None
_eot_id = 0


def _init_worker(tokenizer_json: str, eot_id: int, worker: bool = True) -> None:
    """Worker start: the tokenizer from its JSON. In a worker, the tokenizer's own threads are off (the
    processes are the parallelism) and Ctrl-C is left to the parent, which stops the pool."""
    global _tokenizer, _eot_id
    if worker:
        os.environ["TOKENIZERS_PARALLELISM"] = "false"
        signal.signal(signal.SIGINT, signal.SIG_IGN)
    from tokenizers import Tokenizer

    _tokenizer, _eot_id = Tokenizer.from_str(tokenizer_json), eot_id


def _ids(texts: list[str]) -> tuple[bytes, list[int]]:
    """(uint16 ids of ``texts``, each followed by the end-of-text id; each text's number of ids, without it)."""
    if not texts:
        return b"", []
    encode = getattr(_tokenizer, "encode_batch_fast", _tokenizer.encode_batch)  # fast: no offsets
    ids: list[int] = []
    lengths: list[int] = []
    for enc in encode(texts, add_special_tokens=False):
        ids += enc.ids
        ids.append(_eot_id)
        lengths.append(len(enc.ids))
    return np.array(ids, dtype=np.uint16).tobytes(), lengths


def encode_chunk(chunk: Chunk) -> tuple[bytes, bytes, int, int, tuple[list[int], list[int]]]:
    """(train ids, val ids, UTF-8 bytes of the chunk's text, documents, (each train document's number of ids,
    each val document's): a manifest's counts without a second pass, `grow.data.pysrc`)."""
    train, val = chunk
    nbytes = sum(len(t.encode("utf-8", errors="replace")) for t in (*train, *val))
    (train_ids, train_lengths), (val_ids, val_lengths) = _ids(train), _ids(val)
    return train_ids, val_ids, nbytes, len(train) + len(val), (train_lengths, val_lengths)


@contextlib.contextmanager
def _tokenizers_threads_off():
    """TOKENIZERS_PARALLELISM=false while the workers fork: they inherit it (and tokenizers does not
    warn that it forked after using its threads); this process keeps its own setting."""
    before = os.environ.get("TOKENIZERS_PARALLELISM")
    os.environ["TOKENIZERS_PARALLELISM"] = "false"
    try:
        yield
    finally:
        if before is None:
            del os.environ["TOKENIZERS_PARALLELISM"]
        else:
            os.environ["TOKENIZERS_PARALLELISM"] = before


class Encoder:
    """``num_proc`` tokenizer workers (or this process when 1); a context manager."""

    def __init__(self, tokenizer_json: str, eot_id: int, num_proc: int):
        self.num_proc = num_proc
        self.pool = None
        if num_proc > 1:
            ctx = multiprocessing.get_context("fork" if sys.platform.startswith("linux") else "spawn")
            with _tokenizers_threads_off():
                self.pool = ctx.Pool(num_proc, initializer=_init_worker, initargs=(tokenizer_json, eot_id))
        else:
            _init_worker(tokenizer_json, eot_id, worker=False)

    def map(self, items: Iterable[Chunk]) -> Iterator[tuple[bytes, bytes, int, int, tuple[list[int], list[int]]]]:
        """`encode_chunk` of each item, in order; at most 2 x num_proc items read ahead."""
        if self.pool is None:
            yield from map(encode_chunk, items)
            return
        pending = collections.deque()
        for item in items:
            pending.append(self.pool.apply_async(encode_chunk, (item,)))
            if len(pending) >= 2 * self.num_proc:
                yield pending.popleft().get()
        while pending:
            yield pending.popleft().get()

    def __enter__(self) -> Encoder:
        return self

    def __exit__(self, *exc) -> None:
        if self.pool is not None:
            if exc[0] is None:
                self.pool.close()
            else:
                self.pool.terminate()
            self.pool.join()
