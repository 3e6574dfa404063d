"""`grow.events`: the supported way to watch a run (docs/extending.md, "An observer")."""

from __future__ import annotations

import pytest
import torch

from grow import events
from tests.conftest import TINY_RUN, run_config


def test_observers_see_each_growth_and_the_end_in_order(tmp_path):
    from grow.train import Trainer

    seen = []
    trainer = Trainer(run_config(*TINY_RUN, "+schedule=exp", "trainer.max_tokens=20000"), tmp_path / "run")
    with events.observing("grown", lambda t, stage: seen.append(("grown", stage.number, t.model.num_params()))), \
            events.observing("end", lambda t: seen.append(("end", t.model.num_params()))):
        trainer.run()
    assert [s[:2] for s in seen] == [("grown", 2), ("grown", 3), ("grown", 4), ("end", seen[-1][1])]
    sizes = [s[-1] for s in seen]
    assert sizes == sorted(sizes) and sizes[-1] == trainer.model.num_params()  # the grown model, each time
    trainer2 = Trainer(run_config(*TINY_RUN, "trainer.max_tokens=4000"), tmp_path / "run2")
    trainer2.run()
    assert len(seen) == 4  # unsubscribed after the block


def test_observers_see_each_step_and_each_validation_loss(tmp_path):
    from grow.metrics import read_metrics
    from grow.train import Trainer

    steps, losses = [], []
    trainer = Trainer(run_config(*TINY_RUN, "+schedule=exp", "trainer.max_tokens=20000"), tmp_path / "run")
    with events.observing("stepped", lambda t: steps.append(t.state.step)), \
            events.observing("evaluated", lambda t, loss: losses.append(loss)):
        trainer.run()
    assert steps == list(range(1, trainer.state.step + 1)) and len(steps) > 10  # each step once, after it
    logged = {r[k] for r in read_metrics(tmp_path / "run") for k in ("val/loss", "growth/loss_after") if k in r}
    assert set(losses) == logged and len(losses) >= len(logged) > 4  # every validation pass, and only those


def test_backward_observers_see_each_steps_gradients_before_the_update(tmp_path):
    """Once per step of the run, before the step is counted, with every gradient present; the clipped
    norm of those gradients is the ``gnorm`` given; a NaN written there is what the finite check reads."""
    from grow.checkpoint import NonFiniteLoss
    from grow.train import Trainer

    seen = []

    def look(t, loss, gnorm):
        grads = [p.grad for p in t.model.parameters()]
        norm = torch.linalg.vector_norm(torch.stack([torch.linalg.vector_norm(g) for g in grads]))
        seen.append((t.state.step, all(g is not None for g in grads), float(norm), float(gnorm), float(loss)))

    trainer = Trainer(run_config(*TINY_RUN, "trainer.max_tokens=4000", "trainer.grad_clip=0"), tmp_path / "run")
    with events.observing("backward", look):
        trainer.run()
    assert [s[0] for s in seen] == list(range(trainer.state.step)) and len(seen) > 3  # before each step is counted
    assert all(s[1] and s[2] == pytest.approx(s[3], rel=1e-5) and s[4] > 0 for s in seen)

    def spoil(t, loss, gnorm):
        if t.state.step == 2:
            gnorm.fill_(float("nan"))

    with events.observing("backward", spoil), pytest.raises(NonFiniteLoss, match=r"gradient norm \(nan\) at step 3 "):
        Trainer(run_config(*TINY_RUN, "trainer.max_tokens=4000"), tmp_path / "spoiled").run()


def test_an_unknown_event_names_the_allowed_ones():
    with pytest.raises(ValueError, match="allowed backward, stepped, evaluated, grown, end"):
        events.subscribe("grow", print)
