"""`grow.overrides.jobs`: a command line's sweeps expanded into jobs through Hydra's public override parser, in the
order and with the text Hydra's basic sweeper gives (each expectation below is what Hydra 1.3's
``BasicSweeper.split_arguments`` returned for the same overrides)."""

import pytest

from grow.errors import CONFIG_DIR, ConfigError, options
from grow.overrides import jobs

CASES = [
    ([], [[]]),
    (["a=1,2", "b=x,y"], [["a=1", "b=x"], ["a=1", "b=y"], ["a=2", "b=x"], ["a=2", "b=y"]]),
    (["a=range(1,4)"], [["a=1"], ["a=2"], ["a=3"]]),
    (["a=range(0,1,0.5)"], [["a=0.0"], ["a=0.5"]]),
    (["a=choice(x,y)", "c=3"], [["a=x", "c=3"], ["a=y", "c=3"]]),
    (["a=sort(3,1,2)"], [["a=1"], ["a=2"], ["a=3"]]),
    (["a=[1,2],[3]"], [["a=[1,2]"], ["a=[3]"]]),
    # quoted commas are one value; a quoted comma inside a sweep comes back escaped
    (["p='a,b'", 'q="x,y"'], [["p='a,b'", 'q="x,y"']]),
    (["a=choice('x,y',z)"], [["a=x\\,y"], ["a=z"]]),
    # additions, forced additions, deletions and packages keep their prefix and suffix
    (["+key=1", "~key", "~k2=3"], [["+key=1", "~key=null", "~k2=3"]]),
    (["++a=1,2", "a@pkg=3"], [["++a=1", "a@pkg=3"], ["++a=2", "a@pkg=3"]]),
    # a key given twice keeps its first place and its last value
    (["a=1", "b=2", "a=3,4"], [["a=3", "b=2"], ["a=4", "b=2"]]),
    (["a=[1,2]", "b='x y'", "c=${d}", "e=", "f=null"], [["a=[1,2]", "b='x y'", "c=$\\{d\\}", "e=", "f=null"]]),
]


@pytest.mark.parametrize("overrides, expected", CASES, ids=[" ".join(c[0]) or "none" for c in CASES])
def test_jobs_are_hydras_basic_sweep(overrides, expected):
    assert jobs(overrides) == expected


def test_a_glob_lists_its_groups_options_with_a_config_loader():
    from hydra import initialize_config_dir
    from hydra.core.global_hydra import GlobalHydra

    with initialize_config_dir(str(CONFIG_DIR), version_base="1.3"):
        got = jobs(["strategy=glob(*)", "seed=0,1"], GlobalHydra.instance().config_loader())
    names = options("strategy")
    assert len(names) > 3
    assert got == [[f"strategy={n}", f"seed={s}"] for n in sorted(names) for s in (0, 1)]


def test_an_interval_is_one_line_naming_the_key():
    with pytest.raises(ConfigError, match=r"^trainer\.lr='interval\(0,1\)': an interval"):
        jobs(["+trainer.lr=interval(0,1)"])
