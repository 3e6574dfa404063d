"""``shrink_perturb``: theta = lambda * pad(theta_small) + sigma * theta_init (docs/strategies.md, "shrink_perturb, llama_pro, dus; training only the new layers; the MIDAS and SPARKLING recipes").

J. T. Ash and R. P. Adams, "On Warm-Starting Neural Network Training", NeurIPS 2020, as the growth operator
of N. Mallik et al., "When is Warmstarting Effective for Scaling Language Models?", arXiv 2605.13405. pad:
the expansions with every new entry 0 (their own rescalings kept: lambda = 1, sigma = 0 preserves the
function); theta_init: one draw of the grown model's initializer per parameter, from that parameter's own
stream, as a fresh model at the grown size would have it in every parametrization (mup's W_out included).
Any dimension; not function-preserving. The optimizer restarts (the reference's new optimizer every round)
unless ``moments: keep``. Options: ``configs/strategy/shrink_perturb.yaml``.
"""

from __future__ import annotations

import torch

from grow import mup
from grow.growth.base import GrowthContext, Site, Slot, Strategy, register

MOMENTS = ("reset", "keep")


@register("shrink_perturb")
class ShrinkPerturb(Strategy):
    """Zero-pad, then every parameter <- shrink x itself + noise x a fresh draw of the initializer."""

    grows_by_units = True  # each grown tensor from its own old one and its own draws
    exact_with = None  # shrinking and noise change the function (lambda=1, sigma=0 is the zero padding)
    # its YAML's defaults are Ash & Adams' reference code's (JordanAsh/warm_start run.py: --shrink 0.4 --perturb
    # 0.1, defaults and README; each round trains with a new optimizer: moments reset)

    def __init__(self, **options):
        super().__init__(**options)
        for key in ("shrink", "noise"):
            self.number_option(key, 0)
        if self.options["moments"] not in MOMENTS:
            raise self.bad_option("moments", self.options["moments"], f"must be one of {', '.join(MOMENTS)}")

    def free_values(self, ctx: GrowthContext, site: Site, slot: Slot) -> torch.Tensor:
        return self.constrained_values(ctx, site, slot)  # zero padding: every new entry 0 before the perturbation

    def finish(self, ctx: GrowthContext, model, param_map) -> None:
        lam, sigma = float(self.options["shrink"]), float(self.options["noise"])
        # mup: `grow` stores W_out x m'/m after this (`mup.regrow`), so its draw is taken x m/m' to end as a fresh
        # mup model's at the grown width (the expansion's new W_out columns are drawn so too)
        head = ctx.source.width_mult / ctx.target.width_mult if mup.is_mup(ctx.target) else 1.0
        with torch.no_grad():
            for name, p in model.named_parameters():
                if p.is_meta:  # another unit's tensor (a growth by units, docs/distributed.md, "FSDP2"): not drawn here
                    continue
                scale = sigma * head if name == "lm_head.weight" else sigma
                p.mul_(lam).add_(ctx.init(name, p.shape), alpha=scale)
                if self.options["moments"] == "reset":
                    ctx.fresh.add(name)
        ctx.metrics["shrink_perturb/shrink"] = lam
        ctx.metrics["shrink_perturb/noise"] = sigma
