"""A CPU run's metrics.jsonl is a pure function of its config: kept bitwise against golden files.

Restructuring the trainer must not change a single number it writes. Each case trains a tiny growth
run in-process and compares its records, wall-clock fields aside, with ``tests/golden/<case>.jsonl``
(float equality: the JSON text of every value). A deliberate change of what a run computes or logs
regenerates the files (``GROW_REGENERATE_GOLDEN=1 pytest tests/test_golden.py``) in the commit that
makes the change, saying why.
"""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest
from hydra import compose, initialize_config_dir

from grow import train as train_mod
from grow.config import CONFIG_DIR, validate
from grow.logging import read_metrics
from tests.conftest import TINY_RUN

GOLDEN = Path(__file__).resolve().parent / "golden"
TIMING = ("seconds", "tokens_per_s", "train/mfu")  # wall-clock fields: the only ones that may differ
CASES = {
    # vt: lr multipliers and per-stage ages; dropout: the torch RNG; evaluations and recoveries mid-stage
    "vt-exp": [*TINY_RUN, "+schedule=exp", "strategy=vt", "schedule.grow=[d_model,d_ff,d_qk,d_v,n_layers]",
               "model.dropout=0.1", "trainer.max_tokens=30000", "trainer.recovery_steps=4", "trainer.eval_every=9"],
    # svd: growth batches, statistics, the line search; every dimension grows
    "svd-exp": [*TINY_RUN, "+schedule=exp", "strategy=svd", "+schedule.start.n_heads=2",
                "trainer.max_tokens=30000", "trainer.recovery_steps=3"],
}


def comparable(records: list[dict]) -> list[dict]:
    return [{k: v for k, v in r.items() if not any(t in k for t in TIMING)} for r in records]


@pytest.mark.parametrize("case", sorted(CASES))
def test_metrics_are_bitwise_the_golden_ones(case, tmp_path):
    with initialize_config_dir(str(CONFIG_DIR), version_base="1.3"):
        cfg = compose("train", overrides=CASES[case])
    validate(cfg)
    train_mod.train(cfg, tmp_path / "run")
    got = comparable(read_metrics(tmp_path / "run"))
    path = GOLDEN / f"{case}.jsonl"
    if os.environ.get("GROW_REGENERATE_GOLDEN") == "1":
        path.write_text("".join(json.dumps(r) + "\n" for r in got))
    want = [json.loads(line) for line in path.read_text().splitlines()]
    assert len(got) == len(want)
    for i, (g, w) in enumerate(zip(got, want)):
        assert json.dumps(g, sort_keys=True) == json.dumps(w, sort_keys=True), f"record {i}: {g} != {w}"
