"""The learning rate over a whole run (docs/optimizer.md): a function of the tokens seen, so a growth never
restarts the schedule."""

from __future__ import annotations

import functools
import math
import numbers

LR_SCHEDULES = ("cosine", "wsd", "constant")


def lr_at(tokens: float, *, lr: float, total_tokens: float, warmup_tokens: float = 0, schedule: str = "cosine",
          min_lr_ratio: float = 0.1, decay_fraction: float = 0.2) -> float:
    """Learning rate after ``tokens`` training tokens of a run of ``total_tokens`` (all stages).

    * warmup: ``lr * tokens / warmup_tokens`` while ``tokens < warmup_tokens`` (linear from 0);
    * ``cosine``: then ``min + (lr - min) * (1 + cos(pi * q)) / 2`` with ``q = (tokens - warmup) /
      (total - warmup)``, reaching ``min = min_lr_ratio * lr`` at ``total_tokens``;
    * ``wsd`` (warmup-stable-decay): ``lr`` until ``(1 - decay_fraction) * total_tokens`` (or the end
      of warmup, if later), then linear down to ``min`` at ``total_tokens``;
    * ``constant``: ``lr`` after warmup.

    Past ``total_tokens`` the value stays at the end value. Convention: pass the tokens seen *at the
    end of* the step about to be taken (tokens before it + its batch), so the first step has a
    non-zero learning rate and the last step gets exactly the schedule's end value.
    """
    for key, value in (("tokens", tokens), ("lr", lr), ("total_tokens", total_tokens),
                       ("warmup_tokens", warmup_tokens), ("min_lr_ratio", min_lr_ratio),
                       ("decay_fraction", decay_fraction)):
        if isinstance(value, bool) or not isinstance(value, numbers.Real) or not math.isfinite(value):
            raise ValueError(f"{key}={value!r}: must be a finite number")
    if schedule not in LR_SCHEDULES:
        raise ValueError(f"schedule={schedule!r}: must be one of {', '.join(LR_SCHEDULES)}")
    if lr < 0:
        raise ValueError(f"lr={lr!r}: must be >= 0")
    if total_tokens <= 0:
        raise ValueError(f"total_tokens={total_tokens!r}: must be > 0")
    if not 0 <= warmup_tokens <= total_tokens:
        raise ValueError(f"warmup_tokens={warmup_tokens!r}: must be in [0, total_tokens={total_tokens}]")
    if not 0 <= min_lr_ratio <= 1:
        raise ValueError(f"min_lr_ratio={min_lr_ratio!r}: must be in [0, 1]")
    if not 0 < decay_fraction <= 1:
        raise ValueError(f"decay_fraction={decay_fraction!r}: must be in (0, 1]")
    if tokens < 0:
        raise ValueError(f"tokens={tokens!r}: must be >= 0")
    t = min(float(tokens), float(total_tokens))
    if warmup_tokens > 0 and t < warmup_tokens:
        return lr * t / warmup_tokens
    lo = lr * min_lr_ratio
    if schedule == "constant":
        return lr
    if schedule == "cosine":
        span = total_tokens - warmup_tokens
        q = 1.0 if span <= 0 else (t - warmup_tokens) / span
        return lo + (lr - lo) * 0.5 * (1.0 + math.cos(math.pi * q))
    start = max(float(warmup_tokens), (1.0 - decay_fraction) * total_tokens)
    if t <= start:
        return lr
    span = total_tokens - start
    q = 1.0 if span <= 0 else (t - start) / span
    return lr + (lo - lr) * q


def rewarm_factor(steps_since_growth: int, rewarm_steps: int) -> float:
    """The whole model's learning-rate factor at the ``steps_since_growth``-th step after a growth
    (1 for the first): ``min(1, steps_since_growth / rewarm_steps)``, 1 when ``rewarm_steps`` is 0.

    G_stack's recipe (Du et al., NeurIPS 2024; ``tongxuluo/prts`` ``pretrain/run_pretrain.py``) trains
    the stacked model as a new run: a new AdamW and its schedule from step 0, a linear warmup from 0
    (``get_lr``: ``learning_rate * it / warmup_iters``). Here the run's schedule goes on (``lr_at`` of
    the tokens seen) and this factor warms the whole model's rate up to it again, in the same linear
    shape; with ``optim.on_growth=reset`` that is the rebuilt optimizer and the re-warmup."""
    if rewarm_steps == 0:
        return 1.0
    return min(1.0, steps_since_growth / rewarm_steps)


def lr_schedule(o, max_tokens: int):
    """``tokens -> learning rate`` of a run under the ``optim`` config ``o`` (`lr_at` with its settings,
    bound once: a config lookup costs tens of microseconds and the loop asks every step)."""
    return functools.partial(lr_at, lr=o.lr, total_tokens=int(max_tokens), warmup_tokens=int(o.warmup * max_tokens),
                             schedule=o.schedule, min_lr_ratio=o.min_lr_ratio, decay_fraction=o.decay_fraction)
