"""The commands; each validates its config before any work (exit 2 on bad input; docs/design.md, "Commands").

A command module has ``main`` (its Hydra app, for ``-m`` and ``--help``), ``extra_overrides(argv)`` (overrides put
in front of the command line) and, but for ``grow compare``, ``job(checked)``: the command, given what ``check(cfg)``
returns (its own validation of the composed config; default: a run's, `grow.run.load`). It may have
``normalize(argv)``, a rewrite of the command line before anything parses it (`quote_values`).
"""

from __future__ import annotations

import os
import re
import sys
from contextlib import contextmanager

from grow.errors import ConfigError, DataError


@contextmanager
def user_errors():
    """Turn a `ConfigError` or `DataError` into one line on stderr and exit status 2."""
    try:
        yield
    except (ConfigError, DataError) as exc:
        print(f"error: {exc}", file=sys.stderr)
        sys.exit(2)


@contextmanager
def reader_may_stop():
    """A command that only prints (``grow schedule | head``): the reader closing the pipe ends it quietly, exit 0,
    as its output was taken (was Hydra's exit 1 without a message). Further writes go nowhere, so that the
    interpreter's own flush at exit raises nothing either."""
    try:
        yield
        sys.stdout.flush()  # a pipe holds the output in a buffer: this is where a closed one is found
    except BrokenPipeError:
        devnull = os.open(os.devnull, os.O_WRONLY)
        os.dup2(devnull, sys.stdout.fileno())
        sys.exit(0)
    except SystemExit as exc:  # rich's console ends a closed pipe itself, with exit status 1
        if isinstance(exc.__context__, BrokenPipeError):
            sys.exit(0)
        raise


def quote(text: str) -> str:
    """``text`` as a single-quoted Hydra string that reads back exactly (quotes, backslashes, ``${``)."""
    text = re.sub(r"(\\*)\$\{", lambda m: m.group(1) * 2 + "\\${", text)
    text = re.sub(r"(\\*)'", lambda m: m.group(1) * 2 + "\\'", text)
    text = re.sub(r"(\\+)$", lambda m: m.group(1) * 2, text)
    return f"'{text}'"


def _quoted(text: str) -> bool:
    return len(text) >= 2 and text[0] == text[-1] and text[0] in "'\""


def quote_values(argv: list[str], keys: tuple[str, ...] = (), lists: tuple[str, ...] = ()) -> list[str]:
    """The command line with the values of ``keys`` (paths, free text) quoted, so that a path with
    ``=`` or a prompt with brackets, colons or commas is taken as typed; ``lists`` keys take
    ``[a,b]`` or ``a,b`` and become a list of quoted strings. ``null`` and quoted values are kept."""
    out = []
    for arg in argv:
        key, eq, value = arg.partition("=")
        if eq and key in keys and value != "null" and not _quoted(value):
            arg = f"{key}={quote(value)}"
        elif eq and key in lists and value != "null":
            items = value[1:-1] if value.startswith("[") and value.endswith("]") else value
            parts = [p.strip() for p in items.split(",") if p.strip()]
            arg = f"{key}=[{','.join(p if _quoted(p) else quote(p) for p in parts)}]"
        out.append(arg)
    return out


def in_place(argv: list[str]) -> list[str]:
    """The ``extra_overrides`` of a command that writes no run directory (sample, eval, export, report,
    schedule): run in the current directory and skip Hydra's .hydra/ output."""
    return ["hydra.run.dir=.", "hydra.output_subdir=null"]

