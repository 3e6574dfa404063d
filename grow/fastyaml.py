"""OmegaConf's YAML loader on libyaml's C parser (docs/design.md, "Commands").

Hydra reads every config file of every compose with OmegaConf's loader, a new class each time on PyYAML's
pure-Python parser: about a fifth of a compose. `install` swaps in one class on `yaml.CSafeLoader` with
OmegaConf's resolvers, constructors and duplicate-key refusal; where PyYAML was built without libyaml,
nothing changes."""

from __future__ import annotations

import functools

import yaml
from omegaconf import _utils, basecontainer

_PURE = _utils.get_yaml_loader


@functools.cache
def loader():
    """OmegaConf's loader class on the C parser (its resolvers and constructors copied), built once."""
    pure = _PURE()

    class OmegaConfCLoader(yaml.CSafeLoader):
        yaml_implicit_resolvers = pure.yaml_implicit_resolvers
        yaml_constructors = pure.yaml_constructors

        def construct_mapping(self, node, deep=False):
            keys = set()  # OmegaConf refuses a duplicate key (PyYAML keeps the last)
            for key_node, _ in node.value:
                if key_node.tag == yaml.resolver.BaseResolver.DEFAULT_SCALAR_TAG:
                    if key_node.value in keys:
                        raise yaml.constructor.ConstructorError("while constructing a mapping", node.start_mark,
                                                                f"found duplicate key {key_node.value}",
                                                                key_node.start_mark)
                    keys.add(key_node.value)
            return yaml.constructor.SafeConstructor.construct_mapping(self, node, deep=deep)

    return OmegaConfCLoader


def install() -> None:
    """OmegaConf (and so Hydra) parse YAML with `loader` from now on in this process."""
    if getattr(yaml, "__with_libyaml__", False):
        _utils.get_yaml_loader = basecontainer.get_yaml_loader = loader
