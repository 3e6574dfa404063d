"""The jobs a command line's Hydra overrides describe, through Hydra's public override parser only.

A sweep (``a=1,2``, ``range(..)``, ``choice(..)``, ``glob(..)``) runs the cartesian product of its values,
as Hydra's basic sweeper runs it; the precheck, ``grow compare`` and the distributed run directory read
the jobs from here (docs/design.md, "Commands").
"""

from __future__ import annotations

import itertools

from grow.errors import ConfigError


def jobs(overrides: list[str], loader=None) -> list[list[str]]:
    """Each job's overrides, in the order Hydra's basic sweeper runs them: one list per point of the product of
    the sweeps, a key given twice keeping its first place and its last value. ``loader`` (a config loader) lets
    a ``glob(..)`` list its group's options. An empty command line is one job with no overrides."""
    from hydra.core.override_parser.overrides_parser import OverridesParser

    choices: dict[str, list[str]] = {}
    for o in OverridesParser.create(loader).parse_overrides(overrides):
        key = o.get_key_element()
        if not o.is_sweep_override():
            choices[key] = [f"{key}={o.get_value_element_as_str()}"]
        elif o.is_discrete_sweep():
            choices[key] = [f"{key}={value}" for value in o.sweep_string_iterator()]
        else:  # interval(..): a range for an optimizing sweeper to sample, not values to run one after another
            raise ConfigError(key.lstrip("+~"), o.input_line.partition("=")[2],
                              "an interval(...) has no values to run; list them (a=1,2) or use range(start,stop,step)")
    return [list(job) for job in itertools.product(*choices.values())]
