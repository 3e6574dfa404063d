"""Model flags from outside the package (docs/extending.md, "A model flag"): a `ModelFlag` is a ``model.<key>``
with its default, its check and hooks for the parameters it adds to a `grow.model.Block`, each branch's output,
the parameter schema, the count and the init. A ``GROW_PLUGINS`` module registers one (`register`); the built-in
flags are fields of `grow.model.TransformerConfig`. A model vendored in an export runs without this module.
"""

from __future__ import annotations

from typing import Any, ClassVar

REGISTRY: dict[str, "ModelFlag"] = {}  # model key -> its flag, for every plugin imported so far


class ModelFlag:
    """One ``model.<key>``, off at its ``default``; the hooks read ``cfg.<key>``."""

    key: ClassVar[str] = ""
    default: ClassVar[Any] = None

    def check(self, key: str, value) -> None:
        """Refuse a bad value: `grow.errors.ConfigError(key, value, allowed)`."""

    def build(self, block, cfg) -> None:
        """Add the flag's parameters to ``block``."""

    def residual(self, block, branch: str, y):
        """``y``, the output of ``branch`` ("attn" or "mlp"), as the residual stream adds it."""
        return y

    def schema(self, cfg, dim: str) -> list:
        """The `grow.schema.Entry`s of the layer's parameters that dimension ``dim`` reaches."""
        return []

    def layer_params(self, cfg) -> int:
        return 0

    def saved_bytes(self, cfg, a: int) -> int:
        """Bytes autograd keeps per token and layer for the flag (``a``: a compute element's), `grow.memory`'s."""
        return 0

    def init(self, cfg, key: str, shape, dtype, device):
        """A fresh tensor for the layer's parameter ``key`` (None: not the flag's)."""
        return None


def register(cls: type[ModelFlag]) -> type[ModelFlag]:
    """Class decorator: ``@register class X(ModelFlag)``."""
    if not cls.key:
        raise ValueError(f"{cls.__name__}: a model flag needs a key")
    REGISTRY[cls.key] = cls()
    return cls


def active(cfg) -> list[ModelFlag]:
    return [REGISTRY[key] for key, _ in cfg.flags]
