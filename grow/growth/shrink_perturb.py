"""``shrink_perturb``: theta = lambda * pad(theta_small) + sigma * theta_init (docs/design.md §5.6).

J. T. Ash and R. P. Adams, "On Warm-Starting Neural Network Training", NeurIPS 2020, as the growth operator
of N. Mallik et al., "When is Warmstarting Effective for Scaling Language Models?", arXiv 2605.13405. pad:
the expansions with every new entry 0 (their own rescalings kept: lambda = 1, sigma = 0 preserves the
function); theta_init: one draw of the grown model's initializer per parameter, in ``named_parameters``
order, from the growth's generator. Any dimension; not function-preserving.

Options (``configs/strategy/shrink_perturb.yaml``): ``shrink`` (lambda), ``noise`` (sigma), ``layer_position``.
"""

from __future__ import annotations

import torch

from grow.growth.base import GrowthContext, Site, Slot, Strategy, register


@register("shrink_perturb")
class ShrinkPerturb(Strategy):
    """Zero-pad, then every parameter <- shrink x itself + noise x a fresh draw of the initializer."""

    grows_by_units = True  # each grown tensor from its own old one and its own draws
    exact_with = None  # shrinking and noise change the function (lambda=1, sigma=0 is the zero padding)
    # Ash & Adams' reference code (JordanAsh/warm_start run.py: --shrink 0.4 --perturb 0.1, defaults and README)
    defaults = {"shrink": 0.4, "noise": 0.1, "layer_position": "end"}

    def __init__(self, **options):
        super().__init__(**options)
        for key in ("shrink", "noise"):
            value = self.options[key]
            if isinstance(value, bool) or not isinstance(value, (int, float)) or value < 0:
                raise self.bad_option(key, value, "must be a number >= 0")

    def free_values(self, ctx: GrowthContext, site: Site, slot: Slot) -> torch.Tensor:
        return self.constrained_values(ctx, site, slot)  # zero padding: every new entry 0 before the perturbation

    def finish(self, ctx: GrowthContext, model, param_map) -> None:
        lam, sigma = float(self.options["shrink"]), float(self.options["noise"])
        with torch.no_grad():
            for name, p in model.named_parameters():
                p.mul_(lam).add_(ctx.init(name, p.shape), alpha=sigma)
        ctx.metrics["shrink_perturb/shrink"] = lam
        ctx.metrics["shrink_perturb/noise"] = sigma
