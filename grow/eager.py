"""Code torch.compile must not trace: `run_eagerly` calls it behind a graph break, as
``torch.compiler.disable`` makes. Its own module, imported only while compiling, because
``torch.compiler.disable`` imports torch._dynamo (~1.5 s of a process's start-up; docs/model.md, "The model").
"""

from __future__ import annotations

import torch


@torch.compiler.disable
def run_eagerly(fn, *args):
    """``fn(*args)``, run eagerly however it is reached (torch.compile breaks its graph here)."""
    return fn(*args)
