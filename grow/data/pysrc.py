"""``data=pysrc``: every ``.py`` file on the running interpreter's import path (or under ``data.roots``),
deduplicated by content, validation held out by whole top-level package; the rules and the
``manifest.json`` each run's summary names are in docs/data.md, "pysrc" (docs/design.md, "Data").
"""

from __future__ import annotations

import functools
import hashlib
import os
import sys
from collections.abc import Iterator
from pathlib import Path

from grow.data import valset

MANIFEST = "manifest.json"  # in the token cache directory


def import_roots() -> list[Path]:
    """The interpreter's import path: the existing directories of sys.path, resolved, the current directory
    and zip files left out."""
    out = []
    for p in sys.path:
        if not p or p == ".":
            continue
        path = Path(p).resolve()
        if path.is_dir() and path != Path.cwd().resolve() and path not in out:
            out.append(path)
    return out


def roots_of(cfg) -> list[Path]:
    return [Path(os.path.expanduser(r)).resolve() for r in cfg.roots] if cfg.roots else import_roots()


@functools.lru_cache(maxsize=4)
def _walk(roots: tuple[Path, ...]) -> tuple[tuple[Path, Path, str], ...]:
    """(root, file, top-level package) of every .py file, each under the deepest root holding it."""
    found = []
    for root in roots:
        inner = {r for r in roots if r != root and root in r.parents}
        for dirpath, dirnames, filenames in os.walk(root):
            here = Path(dirpath)
            dirnames[:] = sorted(d for d in dirnames if here / d not in inner and d != "__pycache__")
            for f in filenames:
                if f.endswith(".py"):
                    path = here / f
                    rel = path.relative_to(root)
                    package = rel.parts[0][:-3] if len(rel.parts) == 1 else rel.parts[0]
                    found.append((root, path, package))
    return tuple(sorted((x for x in found if x[1].is_file()), key=lambda x: (x[2], str(x[1]))))


def files(cfg) -> list[tuple[Path, Path, str]]:
    return list(_walk(tuple(roots_of(cfg))))


def is_val_package(package: str, val_every: int) -> bool:
    return int(hashlib.sha256(package.encode()).hexdigest(), 16) % val_every == 0


def identity(cfg) -> dict:
    """The corpus from metadata: the roots and every file's path, size and modification time."""
    rules = {k: getattr(cfg, k) for k in ("val_near_dup", "val_max_share") if getattr(cfg, k) is not None}
    return {"pysrc": [str(r) for r in roots_of(cfg)], "val_every": cfg.val_every, **rules,  # unset: as before
            "files": [[str(p), p.stat().st_size, p.stat().st_mtime_ns] for _, p, _ in files(cfg)]}


def split_documents(cfg, manifest: list[dict]) -> Iterator[tuple[bool, str]]:
    """``(is_val, text)`` per distinct file, in (package, path) order, up to ``data.max_bytes`` characters;
    each file read is appended to ``manifest`` (tokens filled in later). With data.val_near_dup or
    data.val_max_share the validation files come last, after `representative` dropped some (split "dropped")."""
    if cfg.val_near_dup is None and cfg.val_max_share is None:
        yield from _documents(cfg, manifest)
        return
    held: list[tuple[dict, str]] = []
    for is_val, text in _documents(cfg, manifest):
        if is_val:
            held.append((manifest.pop(), text))
        else:
            yield False, text
    for entry, text in representative(cfg, held):
        manifest.append(entry)
        if entry["split"] == "val":
            yield True, text


def representative(cfg, held: list[tuple[dict, str]]) -> list[tuple[dict, str]]:
    """The validation files (manifest entry, text) with near-duplicates (data.val_near_dup) and then files over
    a package's share (data.val_max_share) marked ``split: dropped`` with the reason (`grow.data.valset`)."""

    live = list(range(len(held)))
    if cfg.val_near_dup is not None:
        dup = valset.near_duplicates([held[i][1].encode("utf-8", errors="replace") for i in live], cfg.val_near_dup)
        for i, j in dup.items():
            held[live[i]][0].update(split="dropped", reason=f"near-duplicate of {held[live[j]][0]['path']}")
        live = [k for n, k in enumerate(live) if n not in dup]
    if cfg.val_max_share is not None:
        keep = valset.cap_shares([(held[k][0]["package"], held[k][0]["bytes"]) for k in live], cfg.val_max_share)
        for n, k in enumerate(live):
            if n not in keep:
                held[k][0].update(split="dropped", reason=f"over data.val_max_share={cfg.val_max_share:g}")
    return held


def _documents(cfg, manifest: list[dict]) -> Iterator[tuple[bool, str]]:
    entries = files(cfg)
    val = {pkg for _, _, pkg in entries if is_val_package(pkg, cfg.val_every)}
    if not val and entries:
        val = {entries[-1][2]}
    seen, total = set(), 0
    for root, path, package in entries:
        if cfg.max_bytes is not None and total >= cfg.max_bytes:
            break
        data = path.read_bytes()
        digest = hashlib.sha256(data).hexdigest()
        if digest in seen:
            continue
        seen.add(digest)
        text = data.decode("utf-8", errors="replace")
        if cfg.max_bytes is not None:
            text = text[: cfg.max_bytes - total]
        total += len(text)
        manifest.append({"root": str(root), "path": str(path.relative_to(root)), "package": package,
                         "split": "val" if package in val else "train", "bytes": len(data), "sha256": digest})
        yield package in val, text


def set_tokens(manifest: list[dict], lengths: dict[str, list[int]]) -> None:
    """Each manifest entry's token count (its text's ids in the cache, without the end-of-text token), from
    ``lengths``: each split's documents' counts in the order they were read, as the encoder gave them."""
    for split in ("train", "val"):
        part = [e for e in manifest if e["split"] == split]
        if len(part) != len(lengths[split]):  # one document per file read: anything else is a bug here
            raise RuntimeError(f"pysrc: {len(part)} {split} files read, {len(lengths[split])} documents encoded")
        for e, n in zip(part, lengths[split]):
            e["tokens"] = n


def val_packages(manifest: list[dict]) -> dict[str, dict]:
    """Per validation package, in stream order: its files, bytes, tokens and share of the split's bytes."""
    out: dict[str, dict] = {}
    for e in manifest:
        if e["split"] == "val":
            p = out.setdefault(e["package"], {"files": 0, "bytes": 0, "tokens": 0})
            p["files"], p["bytes"], p["tokens"] = p["files"] + 1, p["bytes"] + e["bytes"], p["tokens"] + e.get("tokens", 0)
    total = sum(p["bytes"] for p in out.values()) or 1
    for p in out.values():
        p["share"] = p["bytes"] / total
    return out


def summary(manifest: list[dict]) -> dict:
    """The corpus's counts: files, bytes and tokens per split, the validation packages with their shares, and
    the validation files dropped (`representative`)."""
    out: dict = {"files": len(manifest), "packages": len({e["package"] for e in manifest})}
    shares = val_packages(manifest)
    dropped = [e for e in manifest if e["split"] == "dropped"]
    out["val_largest_package"] = max(([p, v["share"]] for p, v in shares.items()), key=lambda x: x[1], default=None)
    out["dropped"] = {"files": len(dropped), "bytes": sum(e["bytes"] for e in dropped),
                      "near_duplicates": sum(e["reason"].startswith("near") for e in dropped),
                      "packages_left_out": sorted({e["package"] for e in dropped} - set(shares))}
    for split in ("train", "val"):
        part = [e for e in manifest if e["split"] == split]
        out[split] = {"files": len(part), "bytes": sum(e["bytes"] for e in part),
                      "tokens": sum(e.get("tokens", 0) for e in part),
                      "packages": sorted({e["package"] for e in part}) if split == "val" else
                      len({e["package"] for e in part})}
    return out
