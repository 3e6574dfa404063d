"""The run's assembly (`grow.run`): one `grow train` builds its plan, its strategy and its trigger once
(and composes its config twice: checked, then run), and hands them to the trainer (docs/design.md, "Architecture", "The run config")."""

from __future__ import annotations

import json

from tests.conftest import TINY_RUN, grow_cli


def counting(monkeypatch, owner, name: str, counts: dict, key: str):
    """Wrap ``owner.name`` so that each call adds one to ``counts[key]``."""
    original = getattr(owner, name)

    def wrapper(*args, **kwargs):
        counts[key] += 1
        return original(*args, **kwargs)

    monkeypatch.setattr(owner, name, wrapper)


def test_one_grow_train_builds_the_plan_the_strategy_and_the_trigger_once(tmp_path, monkeypatch):
    import hydra

    from grow import plan, run
    from grow.growth.base import strategy_class
    from grow.triggers import base as triggers

    counts = {"plan": 0, "strategy": 0, "trigger": 0, "compose": 0}
    counting(monkeypatch, hydra, "compose", counts, "compose")  # Hydra's public compose, every grow caller's
    counting(monkeypatch, run, "build_plan", counts, "plan")
    counting(monkeypatch, plan, "build_plan", counts, "plan")  # whoever reaches it through grow.plan
    counting(monkeypatch, strategy_class("msg"), "__init__", counts, "strategy")
    counting(monkeypatch, triggers.Trigger, "__init__", counts, "trigger")
    result = grow_cli("train", *TINY_RUN, "+schedule=exp", "schedule.stages=2", "strategy=msg",
                      "trainer.max_tokens=6000", "trainer.ckpt_every=0", f"hydra.run.dir={tmp_path / 'run'}",
                      cwd=tmp_path)
    assert result.returncode == 0, result.stderr
    assert json.loads((tmp_path / "run" / "summary.json").read_text())["stages"] == 2  # it grew once
    assert counts == {"plan": 1, "strategy": 1, "trigger": 1, "compose": 1}  # composed once (grow.commands.once)
