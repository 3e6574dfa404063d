"""The trainer's side of a growth trigger (`StageClock`): how many steps a stage may take, whether it
ends now, and what each stage trained. Everything it remembers is in ``RunState.trigger_state``
(saved in every checkpoint), so a resumed run ends its stages where the run never stopped would."""

from __future__ import annotations

from grow.triggers.base import Progress, Trigger


class StageClock:
    """When the stages of ``plan`` end under ``trigger``, within ``max_tokens`` training tokens.

    Under ``fixed`` a stage takes the plan's steps (Eq. 7) and nothing else is asked. Under any
    other trigger a stage takes steps until the trigger fires (after a step or at an evaluation) or
    the next step would pass ``max_tokens``; the last stage takes what is left. A stage that reaches
    the budget before its trigger fires is the run's last (`RunState.stayed`)."""

    def __init__(self, trigger: Trigger, plan, max_tokens: int):
        self.trigger, self.plan, self.max_tokens = trigger, plan, int(max_tokens)

    @property
    def planned(self) -> bool:
        return self.trigger.planned

    # ---- a stage's length ----
    def begin(self, stage, state) -> None:
        """Start ``stage``'s record (once: a resumed run keeps the one it had)."""
        m = state.trigger_state
        if m.get("stage") == stage.index:
            return
        m.clear()
        m.update(stage=stage.index, start_step=state.step, start_tokens=state.tokens, start_flops=state.flops,
                 ended=False, train_sum=0.0, train_n=0, rule={})
        if not self.planned and stage.index < len(self.plan) - 1:
            self.trigger.begin_stage(m["rule"], self.progress(stage, state))

    def limit(self, stage, state) -> int:
        """The most steps ``stage`` may take: the plan's, or (a trigger) what the budget leaves."""
        if self.planned:
            return stage.steps
        m = state.trigger_state
        start = m["start_tokens"] if m.get("stage") == stage.index else state.tokens  # not begun: from now
        return max((self.max_tokens - start) // stage.tokens_per_step, 0)

    def ended(self, state) -> bool:
        """Whether the trigger ended the current stage (at an evaluation or after a step)."""
        return bool(state.trigger_state.get("ended"))

    # ---- what the trigger is asked ----
    def progress(self, stage, state) -> Progress:
        m = state.trigger_state
        return Progress(stage=stage.index, stages=len(self.plan), tokens=state.tokens,
                        stage_tokens=state.tokens - m.get("start_tokens", state.tokens), params=stage.params,
                        final_params=self.plan[-1].params, max_tokens=self.max_tokens,
                        budget_flops=float(self.plan.total_flops))

    def _asked(self, stage) -> bool:
        return not self.planned and stage.index < len(self.plan) - 1

    def after_step(self, stage, state) -> bool:
        """Whether ``stage`` ends after the step just taken."""
        if self._asked(stage) and self.trigger.after_step(state.trigger_state["rule"], self.progress(stage, state)):
            state.trigger_state["ended"] = True
        return self.ended(state)

    def logged(self, state, train_loss: float) -> None:
        """A training loss at a log point (``gap``'s mean since the previous evaluation)."""
        m = state.trigger_state
        m["train_sum"], m["train_n"] = m.get("train_sum", 0.0) + float(train_loss), m.get("train_n", 0) + 1

    def after_eval(self, stage, state, val_loss: float) -> bool:
        """Whether ``stage`` ends at this evaluation."""
        m = state.trigger_state
        train = m["train_sum"] / m["train_n"] if m.get("train_n") else None
        m["train_sum"], m["train_n"] = 0.0, 0
        if self._asked(stage) and self.trigger.after_eval(m["rule"], self.progress(stage, state), val_loss, train):
            m["ended"] = True
        return self.ended(state)

    # ---- a stage's end ----
    def finish(self, stage, state) -> None:
        """Record what ``stage`` trained; a stage that used the budget before its trigger fired ends the run."""
        m = state.trigger_state
        state.trained.append({"stage": stage.number, "steps": state.step - m["start_step"],
                              "tokens": state.tokens - m["start_tokens"], "flops": state.flops - m["start_flops"],
                              "start_step": m["start_step"], "start_tokens": m["start_tokens"],
                              "ended_by": "plan" if self.planned else "trigger" if m.get("ended") else
                              "end" if stage.index == len(self.plan) - 1 else "budget"})
        if not self.planned and stage.index < len(self.plan) - 1 and not m.get("ended"):
            state.stayed = stage.index
