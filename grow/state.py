"""`RunState`: where a run is, everything needed to continue it (saved in every checkpoint,
`grow.checkpoint`)."""

from __future__ import annotations

from dataclasses import dataclass, field


@dataclass
class RunState:
    """Where a run is; everything needed to continue it (saved in checkpoints)."""

    stage: int = 0
    step_in_stage: int = 0
    step: int = 0  # optimizer steps over the whole run
    tokens: int = 0  # training tokens seen
    samples: int = 0  # position in the training sample stream
    flops: float = 0.0  # training + growth-pass FLOPs
    growth_flops: float = 0.0
    train_seconds: float = 0.0  # wall-clock of training steps and growths (compile time apart)
    wall_seconds: float = 0.0  # wall-clock of the processes that ran it, up to the last step or growth
    compile_seconds: float = 0.0
    skipped_nonfinite: int = 0
    strategy_state: object = None
    recoveries: list = field(default_factory=list)  # [stage, due_step, loss_after, steps] awaiting a measurement
    growth_events: list = field(default_factory=list)
    stage_losses: list = field(default_factory=list)
    trigger_state: dict = field(default_factory=dict)  # what the growth trigger remembers (grow.triggers)
    trained: list = field(default_factory=list)  # per stage trained: its steps, tokens and FLOPs as trained
    stayed: int | None = None  # the stage a run ended in because its trigger never fired (None: it did not)
    decay_loss: list = field(default_factory=lambda: [0.0, 0])  # sum and count of the logged training losses in the decay phase

    def position(self) -> dict:
        """The fields every record carries: where in the run it was written."""
        return {"train/tokens": self.tokens, "train/flops": self.flops, "train/step": self.step}


# ---- devices and precision ----------------------------------------------------------------------
