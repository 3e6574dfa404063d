"""`DataConfig`: every ``data.*`` key, its meaning, its default and its check, in one place (docs/data.md).

`DataConfig.from_node` builds the frozen dataclass from the composed ``data`` node and raises
`ConfigError` on the first bad key, before any data work; code past validation reads the values by
attribute, so it runs on this dataclass and on the DictConfig alike. The ``tokenizer_vocab`` resolver,
registered on import, makes ``data.vocab_size`` follow ``data.tokenizer`` (docs/data.md, "Recipes").
"""

from __future__ import annotations

import codecs
import functools
import glob
import math
import os
from dataclasses import dataclass, fields
from pathlib import Path

from omegaconf import OmegaConf

from grow.errors import ConfigError, file_in_the_way

EOT = "<|endoftext|>"  # the default end-of-text token (GPT-2's)
MAX_VOCAB = 65536  # token ids are stored as uint16
SOURCES = ("stdlib", "pysrc", "text", "hf", "bin")
VERIFY = ("size", "full")
LOCAL_BUILDERS = {"json": "json", "jsonl": "json", "csv": "csv", "parquet": "parquet", "txt": "text"}

# the keys each source accepts (data=<source> composes exactly these from configs/data/<source>.yaml)
_COMMON = {"name", "vocab_size", "tokenizer", "eot_token"}
_TOKENIZED = _COMMON | {"cache_dir", "max_bytes", "val_every", "tokenizer_sample_bytes", "num_proc", "verify"}
KEYS = {
    "stdlib": _TOKENIZED,
    "pysrc": _TOKENIZED | {"roots", "val_max_share", "val_near_dup"},
    "text": _TOKENIZED | {"files", "encoding"},
    "hf": _TOKENIZED | {"path", "config", "split", "text_field", "revision", "streaming"},
    "bin": _COMMON | {"train", "val"},
}


@dataclass(frozen=True)
class DataConfig:
    """The validated ``data`` node (see ``configs/data/*.yaml`` for the recipes)."""

    name: str  # stdlib | text | hf (tokenized here, cached) | bin (pre-tokenized shards)
    vocab_size: int  # ids 0..vocab_size-1; with `tokenizer`, that tokenizer's (its largest id + 1)
    tokenizer: str | None = None  # null: train a byte-level BPE; else a tokenizer.json used as given
    eot_token: str = EOT  # appended after every document
    cache_dir: str = "~/.cache/grow"  # token caches, one directory per fingerprint
    max_bytes: int | None = None  # stop reading after this many characters (null: the whole corpus)
    val_every: int = 20  # every val_every-th document goes to the validation split
    tokenizer_sample_bytes: int = 50_000_000  # the BPE trains on the first this-many characters of train
    num_proc: int | None = None  # tokenizer worker processes (null: one per core)
    verify: str = "size"  # size: check the cache by its manifest's sizes; full: also its SHA-256
    files: tuple[str, ...] = ()  # text: paths or globs, each file one document
    encoding: str = "utf-8"  # text: the files' encoding (any Python codec); undecodable bytes are counted
    path: str | None = None  # hf: a hub dataset name, a local data file or a save_to_disk directory
    config: str | None = None  # hf: the dataset's configuration name
    split: str = "train"  # hf: the split to read (validation is carved out of it by document)
    text_field: str = "text"  # hf: the column holding the text
    revision: str | None = None  # hf: the hub revision (a commit pins the cache's identity)
    streaming: bool = False  # hf: datasets' streaming mode (nothing downloaded up front)
    train: tuple[str, ...] = ()  # bin: globs of the training shards
    val: tuple[str, ...] = ()  # bin: globs of the validation shards
    roots: tuple[str, ...] = ()  # pysrc: directories of .py trees (empty: the interpreter's import path)
    val_max_share: float | None = None  # pysrc: no package above this share of the validation bytes (null: no cap)
    val_near_dup: float | None = None  # pysrc: drop a validation file this similar (MinHash Jaccard) to an earlier one

    @classmethod
    def from_node(cls, node) -> DataConfig:
        """The checked config of a ``data`` node; `ConfigError` naming the first bad key."""
        if isinstance(node, cls):
            return node
        raw = _plain(node)
        name = raw.get("name")
        if name not in SOURCES:
            raise ConfigError("data.name", name, f"must be one of {', '.join(SOURCES)}")
        unknown = sorted(set(raw) - KEYS[name])
        if unknown:
            raise ConfigError(f"data.{unknown[0]}", raw[unknown[0]],
                              f"not a key of data={name} (its keys: {', '.join(sorted(KEYS[name]))})")
        values = {f.name: raw[f.name] for f in fields(cls) if f.name in raw and raw[f.name] is not _MISSING}
        values.update(_check_tokenizer(name, raw))
        values["vocab_size"] = _check_vocab(name, raw, values.get("tokenizer"))
        if name != "bin":
            values.update(_check_tokenized(raw))
        values.update({"text": _check_text, "hf": _check_hf, "bin": _check_bin, "pysrc": _check_pysrc}.get(name, dict)(raw))
        return cls(**values)

    @property
    def workers(self) -> int:
        """Tokenizer worker processes: ``num_proc``, or the cores this process may use."""
        if self.num_proc is not None:
            return self.num_proc
        return len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count() or 1


# ---- the tokenizer and the vocabulary ------------------------------------------------------------


@functools.lru_cache(maxsize=8)
def _tokenizer_ids(path: str, size: int, mtime_ns: int) -> tuple[int, dict]:
    """(largest id + 1, {token: id}) of a tokenizer.json; cached by the file's identity."""
    from tokenizers import Tokenizer

    vocab = Tokenizer.from_file(path).get_vocab(with_added_tokens=True)
    return (max(vocab.values()) + 1 if vocab else 0), vocab


def tokenizer_ids(path: str) -> tuple[int, dict]:
    """(number of ids, vocabulary) of the tokenizer.json at ``path`` (``~`` expanded)."""
    p = Path(os.path.expanduser(path))
    st = p.stat()
    return _tokenizer_ids(str(p.resolve()), st.st_size, st.st_mtime_ns)


def tokenizer_vocab(path, default):
    """The ``tokenizer_vocab`` resolver: the ids of ``path`` (a tokenizer.json), or ``default`` when
    ``path`` is null or unreadable (`DataConfig.from_node` then names the problem)."""
    if path is None or str(path) in ("", "None", "null"):
        return default
    try:
        return tokenizer_ids(str(path))[0]
    except Exception:  # noqa: BLE001 - reported by from_node with the key
        return default


OmegaConf.register_new_resolver("tokenizer_vocab", tokenizer_vocab, replace=True)


def _check_tokenizer(name: str, raw: dict) -> dict:
    path, eot = raw.get("tokenizer"), raw.get("eot_token", EOT)
    if not isinstance(eot, str) or not eot:
        raise ConfigError("data.eot_token", eot, "must be a non-empty string, e.g. '<|endoftext|>'")
    if path is None:
        return {"tokenizer": None}
    if not isinstance(path, str) or not Path(os.path.expanduser(path)).is_file():
        raise ConfigError("data.tokenizer", path, "no such file: the path of a HuggingFace tokenizer.json (GPT-2's: "
                                                  "huggingface-cli download openai-community/gpt2 tokenizer.json "
                                                  "--local-dir ~/.cache/grow/gpt2), or null to train a BPE")
    try:
        n_ids, vocab = tokenizer_ids(path)
    except Exception as exc:  # noqa: BLE001 - any parse failure becomes one line
        raise ConfigError("data.tokenizer", path, f"not a HuggingFace tokenizer.json ({_first_line(exc)})") from None
    if n_ids > MAX_VOCAB:
        raise ConfigError("data.tokenizer", path, f"has {n_ids} token ids; the uint16 token cache holds at most "
                                                  f"{MAX_VOCAB}")
    if name != "bin" and eot not in vocab:
        raise ConfigError("data.eot_token", eot, f"not a token of data.tokenizer={path} (name its end-of-text "
                                                 "token, e.g. data.eot_token='</s>')")
    return {"tokenizer": path}


def _check_vocab(name: str, raw: dict, tokenizer: str | None) -> int:
    vocab = _int("data.vocab_size", raw.get("vocab_size"), 1)
    if tokenizer is not None:
        n_ids = tokenizer_ids(tokenizer)[0]
        if vocab != n_ids:
            raise ConfigError("data.vocab_size", vocab, f"must be {n_ids}, the ids of data.tokenizer={tokenizer} "
                                                        "(leave data.vocab_size unset: it follows the tokenizer)")
    elif name != "bin" and not 257 <= vocab <= MAX_VOCAB:
        raise ConfigError("data.vocab_size", vocab, f"must be in [257, {MAX_VOCAB}] (256 bytes + the "
                                                    "end-of-text token; uint16 cache)")
    elif vocab > MAX_VOCAB:
        raise ConfigError("data.vocab_size", vocab, f"must be at most {MAX_VOCAB} (uint16 token ids)")
    return vocab


# ---- the other keys ----------------------------------------------------------------------------------


def _check_tokenized(raw: dict) -> dict:
    """The keys of the sources tokenized here (stdlib, text, hf)."""
    out = {}
    if raw.get("max_bytes") is not None:
        out["max_bytes"] = _int("data.max_bytes", raw["max_bytes"], 1)
    out["val_every"] = _int("data.val_every", raw.get("val_every", 20), 1)
    if out["val_every"] < 2:
        raise ConfigError("data.val_every", raw["val_every"], "must be >= 2 (every n-th document is held out)")
    out["tokenizer_sample_bytes"] = _int("data.tokenizer_sample_bytes", raw.get("tokenizer_sample_bytes",
                                                                                DataConfig.tokenizer_sample_bytes), 1)
    if raw.get("num_proc") is not None:
        out["num_proc"] = _int("data.num_proc", raw["num_proc"], 1)
    if raw.get("verify", "size") not in VERIFY:
        raise ConfigError("data.verify", raw["verify"], "must be size (check the cache's sizes) or full (and its "
                                                        "SHA-256)")
    cache_dir = raw.get("cache_dir", DataConfig.cache_dir)
    if not isinstance(cache_dir, str) or not cache_dir:
        raise ConfigError("data.cache_dir", cache_dir, "must be a directory path")
    blocker = file_in_the_way(cache_dir)
    if blocker is not None:  # the cache's mkdir would fail
        env = " (here from GROW_CACHE_DIR)" if os.environ.get("GROW_CACHE_DIR") == cache_dir else ""
        raise ConfigError("data.cache_dir", cache_dir, f"{blocker} is a file, not a directory: set data.cache_dir "
                                                       f"or GROW_CACHE_DIR to a directory{env}")
    return out


def _check_text(raw: dict) -> dict:
    files = _patterns("data.files", raw.get("files"), "give one or more text files, e.g. data.files=[corpus.txt]")
    for pattern in files:
        matches = glob.glob(os.path.expanduser(pattern))
        if not matches:
            raise ConfigError("data.files", pattern, "no such file (paths or globs of local text files)")
        if not any(os.path.isfile(m) for m in matches):
            example = os.path.join(pattern.rstrip("/"), "*.txt")
            raise ConfigError("data.files", pattern, f"names only directories; name the files in them, e.g. "
                                                     f"data.files=['{example}']")
    encoding = raw.get("encoding", "utf-8")
    try:
        codecs.lookup(str(encoding))
    except LookupError:
        raise ConfigError("data.encoding", encoding, "a Python codec name, e.g. utf-8, latin-1, cp1252") from None
    return {"files": files, "encoding": str(encoding)}


def _share(key: str, value) -> float | None:
    """A fraction in (0, 1], or null."""
    if value is None or value is _MISSING:
        return None
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not 0 < value <= 1:
        raise ConfigError(key, value, "must be a fraction in (0, 1], or null (off)")
    return float(value)


def _check_pysrc(raw: dict) -> dict:
    """``data.roots``: null or [] for the interpreter's import path, else existing directories; the validation
    set's rules (``data.val_max_share``, ``data.val_near_dup``: fractions in (0, 1] or null)."""
    shares = {k: _share(f"data.{k}", raw.get(k)) for k in ("val_max_share", "val_near_dup")}
    return {**_check_roots(raw), **shares}


def _check_roots(raw: dict) -> dict:
    roots = raw.get("roots")
    if roots is None or roots == [] or roots is _MISSING:
        return {"roots": ()}
    items = [roots] if isinstance(roots, str) else roots
    if not isinstance(items, (list, tuple)) or not all(isinstance(r, str) and r for r in items):
        raise ConfigError("data.roots", roots, "must be a list of directories, e.g. data.roots=[~/src/myproject]")
    for r in items:
        if not Path(os.path.expanduser(r)).is_dir():
            raise ConfigError("data.roots", r, "no such directory (directories of .py files; [] for the "
                                               "interpreter's import path)")
    return {"roots": tuple(items)}


def _check_hf(raw: dict) -> dict:
    path = raw.get("path")
    if path is _MISSING or not path:
        raise ConfigError("data.path", ..., "name a dataset, e.g. data.path=roneneldan/TinyStories")
    if not isinstance(path, str):
        raise ConfigError("data.path", path, "must be a dataset name or a local path")
    local = Path(os.path.expanduser(path))
    if local.is_file() and local.suffix.lstrip(".").lower() not in LOCAL_BUILDERS:
        raise ConfigError("data.path", path, f"unknown file type (use one of {', '.join(LOCAL_BUILDERS)})")
    for key in ("split", "text_field"):
        if not isinstance(raw.get(key, "x"), str) or not raw.get(key, "x"):
            raise ConfigError(f"data.{key}", raw[key], "must be a non-empty string")
    for key in ("config", "revision"):
        if raw.get(key) is not None and not isinstance(raw[key], str):
            raise ConfigError(f"data.{key}", raw[key], "must be a string or null")
    if not isinstance(raw.get("streaming", False), bool):
        raise ConfigError("data.streaming", raw["streaming"], "must be true or false")
    return {"path": path}


def _check_bin(raw: dict) -> dict:
    out = {}
    for key in ("train", "val"):
        patterns = _patterns(f"data.{key}", raw.get(key), f"give the {key} shards, e.g. data.{key}=['shards/*_{key}_*.bin']")
        for pattern in patterns:
            if not any(Path(m).is_file() for m in glob.glob(os.path.expanduser(pattern))):
                raise ConfigError(f"data.{key}", pattern, "no such file (paths or globs of .bin token shards)")
        out[key] = patterns
    return out


# ---- helpers --------------------------------------------------------------------------------------------

_MISSING = object()


def _plain(node) -> dict:
    """A dict of the node's values (``???`` -> `_MISSING`), from a DictConfig or a mapping."""
    if OmegaConf.is_config(node):
        out = {}
        for key in node:
            out[str(key)] = _MISSING if OmegaConf.is_missing(node, key) else _container(node[key])
        return out
    return dict(node)


def _container(value):
    return OmegaConf.to_container(value, resolve=True) if OmegaConf.is_config(value) else value


def _int(key: str, value, lo: int) -> int:
    """An integer >= lo (an integral float such as 1e9 counts); a bool, a string or null is refused."""
    if isinstance(value, float) and math.isfinite(value) and value.is_integer():
        value = int(value)
    if not isinstance(value, int) or isinstance(value, bool) or value < lo:
        raise ConfigError(key, None if value is _MISSING else value,
                          "must be a positive integer" if lo == 1 else f"must be an integer >= {lo}")
    return value


def _patterns(key: str, value, hint: str) -> tuple[str, ...]:
    if value is _MISSING or value is None or value == [] or value == "":
        raise ConfigError(key, ..., hint)
    items = [value] if isinstance(value, str) else value
    if not isinstance(items, (list, tuple)) or not all(isinstance(p, str) and p for p in items):
        raise ConfigError(key, value, "must be a list of paths or globs")
    return tuple(items)


def _first_line(exc: BaseException) -> str:
    text = str(exc).strip()
    return (text.splitlines()[0] if text else type(exc).__name__)[:160]
