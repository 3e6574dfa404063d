"""Tokenizers: a byte-level BPE trained on a bounded sample, or a HuggingFace ``tokenizer.json``.

With ``data.tokenizer: null`` a byte-level BPE (GPT-2's pre-tokenization and byte alphabet, the
end-of-text token as its one special token) is trained on the first
``data.tokenizer_sample_bytes`` characters of the training split: its cost and memory are bounded
whatever the corpus size. With ``data.tokenizer: <path>`` that file is used as given (its
normalizer, pre-tokenizer and model untouched; no special tokens added but the end-of-text token
after each document). Either way the tokenizer is saved as ``tokenizer.json`` in the token cache
and copied into the run directory (`grow.data.TokenData.save_tokenizer`).
"""

from __future__ import annotations

from collections.abc import Iterable
from pathlib import Path

from grow.data.config import EOT

TOKENIZER_VERSION = "bytelevel-bpe-v1"  # changes the cache fingerprint when the training recipe changes


def train_bpe(texts: Iterable[str], vocab_size: int, eot_token: str = EOT):
    """A byte-level BPE of ``vocab_size`` tokens trained on ``texts``; ``eot_token`` is id 0."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers

    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=vocab_size,
        special_tokens=[eot_token],
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=False,
    )
    tok.train_from_iterator(texts, trainer)
    return tok


def read_tokenizer(path):
    """The tokenizer of a ``tokenizer.json`` file."""
    from tokenizers import Tokenizer

    return Tokenizer.from_file(str(path))


def load_tokenizer(where):
    """The tokenizer of a token cache or run directory (its ``tokenizer.json``), or of that file itself."""
    where = Path(where)
    return read_tokenizer(where / "tokenizer.json" if where.is_dir() else where)
