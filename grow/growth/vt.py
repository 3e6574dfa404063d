"""``vt``: variance transfer and learning-rate adaptation (docs/strategies.md, "vt", "vt in detail").

X. Yuan, P. Savarese and M. Maire, "Accelerated Training via Incrementally Growing Neural Networks
using Variance Transfer and Learning Rate Adaptation", NeurIPS 2023, on the transformer of
A. Gesmundo and K. Maile, arXiv:2308.06103: new units in (V, V)/(Z, -Z) pairs (Eq. 2-4; an odd
one out gets zero writers), Table 1's variances with compensating forward multipliers, and Eq. 5's
per-stage learning-rate multipliers. Options: ``configs/strategy/vt.yaml``.
"""

from __future__ import annotations

import functools
import math

import torch

from grow import schema
from grow.growth.base import GrowthContext, ParamMap, Site, Slot, Strategy, register
from grow.model import Linear, Transformer, TransformerConfig


@functools.lru_cache(maxsize=64)
def table1_layers(cfg: TransformerConfig) -> dict[str, int | None]:
    """Table 1's weights at sizes ``cfg``, from `grow.schema`'s h entries: a layer's readers of the residual
    stream (branch inputs, None) and the writers of its branches and W^out (outputs, with their fan-in C)."""
    out: dict[str, int | None] = {e.key: None for e in schema.layer(cfg, "h") if e.role == "out"}
    writers = [e for e in schema.layer(cfg, "h") if e.role == "in"] + [e for e in schema.trunk(cfg, "h")
                                                                      if e.role == "out"]
    out.update({e.key: schema.length(cfg, e.key, 1) for e in writers if e.key.endswith(".weight")})
    return out


def _key(name: str) -> str:
    return name.split(".", 2)[2] if name.startswith("layers.") else name


def table1_std(key: str, cfg: TransformerConfig) -> float | None:
    """Standard deviation of Table 1's new-entry variance for weight ``key`` at sizes ``cfg``
    (None for parameters Table 1 does not cover: embeddings, gains, biases)."""
    rules = table1_layers(cfg)
    if key not in rules:
        return None
    fan_in = rules[key]
    # an input (or hidden) layer: 1 / C_{t+1}; an output layer: 1 / C_{t+1}^2 (its fan-in E v, p or h)
    return 1.0 / math.sqrt(cfg.d_model) if fan_in is None else 1.0 / fan_in


def table1_rule(key: str, src: TransformerConfig, tgt: TransformerConfig):
    """(kind, C_t, C_{t+1}) of weight ``key`` for a growth src -> tgt, or None (no rule)."""
    rules = table1_layers(src)
    if key not in rules:
        return None
    if rules[key] is None:
        kind = "hidden" if tgt.d_model != src.d_model else "input"
        return kind, src.d_model, tgt.d_model
    return "output", rules[key], table1_layers(tgt)[key]


def table1_scale(key: str, src: TransformerConfig, tgt: TransformerConfig) -> float:
    """Table 1's old-weight factor for weight ``key``: 1 (input), sqrt(C_t/C_{t+1}) (hidden),
    C_t/C_{t+1} (output); 1 for parameters without a rule."""
    rule = table1_rule(key, src, tgt)
    if rule is None:
        return 1.0
    kind, c0, c1 = rule
    if kind == "input":
        return 1.0
    if kind == "hidden":
        return math.sqrt(c0 / c1)
    return c0 / c1


def stage_norms(weight: torch.Tensor, birth: torch.Tensor | int) -> dict[int, float]:
    """``{k: ||W_Dk||_F}`` for every stage k present in ``birth`` (a per-element tensor of ``weight``'s
    shape, or one stage for every element), summed in float64. A sharded ``weight`` (FSDP2's DTensor,
    ``birth`` its rows as the optimizer holds them): each rank sums its rows, the sums added over the ranks."""
    w = weight.detach()
    sharded = hasattr(w, "to_local")
    w = (w.to_local() if sharded else w).reshape(-1).double()
    if not isinstance(birth, torch.Tensor):
        birth = torch.full_like(w, int(birth), dtype=torch.long)
    b = birth.reshape(-1).to(device=w.device, dtype=torch.long)
    n = torch.tensor([int(b.max()) + 1 if b.numel() else 0], device=w.device)
    if sharded:  # every rank's sums the same length: the most stages any rank's rows hold
        torch.distributed.all_reduce(n, op=torch.distributed.ReduceOp.MAX)
    sums = torch.stack([torch.zeros(int(n), dtype=torch.float64, device=w.device).index_add_(0, b, w * w),
                        torch.bincount(b, minlength=int(n)).double()])  # squares and counts by stage
    if sharded:
        torch.distributed.all_reduce(sums)
    return {s: v for s, (v, c) in enumerate(zip(sums[0].sqrt().tolist(), sums[1].tolist())) if c > 0}


def lr_mult_key(name: str, k: int) -> str:
    """The logged key of the Eq. 5 multiplier of ``name``'s entries born at the 0-based stage index
    ``k``: ``vt/lr_mult/<name>/<k+1>``, the stage numbered from 1 as everywhere a user reads it."""
    return f"vt/lr_mult/{name}/{k + 1}"


def stage_lr_multipliers(weight: torch.Tensor, birth: torch.Tensor | int,
                         zero_born=()) -> dict[int, float]:
    """Eq. 5 with f = Frobenius norm: ``{k: ||W_Dk|| / ||W_Dref||}`` for every stage k present in
    ``birth`` (per element, or one stage), ref = the earliest stage present, except the stages in
    ``zero_born`` (norm 0 at birth: left out, i.e. 1). A reference of norm 0 gives 1 to every stage;
    a stage of norm 0 gets 1."""
    norms = stage_norms(weight, birth)
    stages = sorted(norms)
    ref = norms[stages[0]]
    return {s: (norms[s] / ref if ref > 0 and norms[s] > 0 else 1.0) for s in stages if s not in zero_born}


@register("vt")
class VarianceTransfer(Strategy):
    """Yuan et al. (NeurIPS 2023): (V, V)/(Z, -Z) pairs, Table 1 variances and rescalings, Eq. 5 multipliers."""

    grows_by_units = True  # Table 1 and Eq. 5 are per tensor (docs/distributed.md, "FSDP2")
    exact_with = {"noise_ratio": 0.0}

    def __init__(self, **options):
        super().__init__(**options)
        if self.options["variant"] not in ("default", "constraint"):
            raise self.bad_option("variant", self.options["variant"], "must be 'default' or 'constraint'")
        self.number_option("noise_ratio", 0)
        every = self.options["lr_refresh_every"]
        if isinstance(every, bool) or not isinstance(every, int) or every < 0:
            raise self.bad_option("lr_refresh_every", every, "must be an integer >= 0 (steps; 0 = frozen at the growth)")
        self._step_metrics: dict[str, float] = {}

    def parameterization(self) -> str:
        return "vt"

    @torch.no_grad()
    def initialize(self, model: Transformer, generator: torch.Generator | None = None) -> None:
        """The stage-0 model in Table 1's parameterization: every weight Table 1 covers drawn with
        its variance at the stage-0 sizes (1/h for branch inputs, 1/(E v)^2 and 1/p^2 for the
        branch outputs, 1/h^2 for W^out), so that old and new sub-weights start on the scales Table
        1 transfers between, and Eq. 5's ratios ||W_Dk|| / ||W_D0|| compare like with like."""
        for name, p in model.named_parameters():
            std = table1_std(_key(name), model.config)
            if std is not None:
                noise = torch.randn(p.shape, generator=generator, dtype=p.dtype) if generator is not None \
                    else torch.randn(p.shape, dtype=p.dtype)
                p.copy_(noise.to(p.device) * std)

    # ---- new entries ------------------------------------------------------------------------
    def free_values(self, ctx: GrowthContext, site: Site, slot: Slot) -> torch.Tensor:
        """Unpaired free entries (h readers, a new layer's W^Q, W^K): Table 1's variance."""
        std = table1_std(slot.key, ctx.target)
        if std is None:
            return super().free_values(ctx, site, slot)  # gains (x sqrt(h/h^)), biases
        return ctx.randn(slot.new_shape(), std, key=slot.name)

    def fill(self, ctx: GrowthContext, site: Site) -> None:
        if site.dim == "h":
            return super().fill(ctx, site)  # writers zero (Thm 3.5 of the expansions), readers Table 1
        if site.dim == "N":
            return self._fill_layer(ctx, site)
        if site.dim == "k" and ctx.source.positions == "rope":
            # no pairs under rotary positions: a (V, V) / (Z, -Z) pair cancels only if both coordinates
            # turn at one angle, and each new rotary pair turns at a frequency of its own (for one pair at
            # angle phi, q = (V x, V x), k = (Z y, -Z y) leaves 2 (V x)(Z y) sin(phi) in the score): every
            # new coordinate is a lone unit, W^Q from Table 1 (`free_values`), W^K zero
            return super().fill(ctx, site)
        self._pairs(ctx, site.slots, site.n_new)

    def _pairs(self, ctx: GrowthContext, slots: list[Slot], n_new: int) -> None:
        """(V, V) on "in" slots, (Z, -Z) on "out" slots, pairs (u, u + m) with m = n // 2, plus
        noise; for an odd n the last unit alone: "in" slots from Table 1, "out" slots 0."""
        r = float(self.options["noise_ratio"])
        half, lone = n_new // 2, n_new % 2
        for slot in slots:
            std = table1_std(slot.key, ctx.target) or 0.0
            shape = slot.new_shape()
            base_shape = (shape[0], half) + shape[2:]
            base = ctx.randn(base_shape, std, key=slot.name)
            other = base if slot.role == "in" else -base
            parts = [base, other]
            if lone:  # the last unit alone: readers from Table 1, writers 0 (module docstring)
                one = (shape[0], 1) + shape[2:]
                parts.append(ctx.randn(one, std, key=slot.name) if slot.role == "in" else base.new_zeros(one))
            values = torch.cat(parts, dim=1)
            noise = ctx.randn(shape, 1.0, key=slot.name) * (r * std)
            if lone and slot.role != "in":
                noise[:, -1] = 0.0  # the lone unit's writers stay exactly 0
            values += noise
            slot.set(slot.new_idx, values)

    def _fill_layer(self, ctx: GrowthContext, site: Site) -> None:
        """A new layer as a branch of new units: MLP neurons paired (W1/b1 (V, V), W2 (Z, -Z)),
        value coordinates of each head paired (W^V (V, V), W^O (Z, -Z)), an odd count's last unit
        alone (readers from Table 1, writers 0); W^Q, W^K free
        (Table 1 input variance), gains 1, biases 0."""
        cfg = ctx.target
        G, r, v, p = cfg.kv_heads, cfg.group_size, cfg.d_v, cfg.d_ff
        dev = ctx.device
        # p's entries and v's matrices (grow.schema) pair; a value bias (Qwen2's) is drawn as a lone bias, 0
        mlp_entries = schema.layer(cfg, "p")
        v_entries = [e for e in schema.layer(cfg, "v") if e.key.endswith(".weight")]
        paired_keys = {e.key for e in mlp_entries + v_entries}
        for slot in site.slots:
            if slot.key in paired_keys:
                continue
            values = (
                self.constrained_values(ctx, site, slot) if slot.zero else self.free_values(ctx, site, slot)
            )
            slot.set(slot.new_idx, values)
        s = {slot.key: slot for slot in site.slots}
        units_p = torch.arange(p, device=dev).view(1, p, 1)
        coords = torch.arange(v, device=dev)
        units_v = (torch.arange(G, device=dev)[:, None] * v + coords).view(G, v, 1)  # value heads' rows
        # W^O columns that read them: the r query heads of each group, (G, v, r)
        units_o = ((torch.arange(G * r, device=dev)[:, None] * v + coords).view(G, r, v)).transpose(1, 2)

        def view(key, axis, units, role):
            t = s[key]
            return Slot(t.name, t.tensor, axis, units[:, :0], units, role, False, key=key)

        self._pairs(ctx, [view(e.key, e.axis, units_p, e.role) for e in mlp_entries], p)
        self._pairs(ctx, [view(e.key, e.axis, units_v if e.role == "in" else units_o, e.role) for e in v_entries], v)

    # ---- old weights, multipliers, learning rates -------------------------------------------
    def finish(self, ctx: GrowthContext, model: Transformer, param_map: ParamMap) -> None:
        src, tgt = ctx.source, ctx.target
        params = dict(model.named_parameters())
        modules = dict(model.named_modules())
        compensate = bool(self.options["compensate"])
        constraint = self.options["variant"] == "constraint"
        scales = []
        with torch.no_grad():
            for new, idx in param_map.values():
                key = _key(new)
                rule = table1_rule(key, src, tgt)
                if rule is None:
                    continue
                if key == "lm_head.weight" and tgt.tie_embeddings:
                    continue  # W^out is E: rescaling it would rescale the input embedding too
                p = params[new]
                if p.is_meta:
                    continue  # another unit's (docs/distributed.md, "FSDP2"): each tensor's rule reads only itself
                flat = p.view(-1)
                pos = idx.reshape(-1)
                kind, c0, c1 = rule
                if constraint:
                    if p.numel() == pos.numel():
                        continue  # shape unchanged by this growth
                    ms = float(flat[pos].double().pow(2).mean())
                    if ms == 0.0:
                        continue
                    target_var = 1.0 / c0**2 if kind == "output" else 1.0 / c0
                    c = math.sqrt(target_var / ms)
                else:
                    c = table1_scale(key, src, tgt)
                if c == 1.0:
                    continue
                flat[pos] *= c
                scales.append(c)
                if compensate:
                    module = modules[new.rsplit(".", 1)[0]]
                    assert isinstance(module, Linear)
                    module.mult = module.mult / c
                    ctx.rescaled[new] = ctx.rescaled.get(new, 1.0) * c  # gradients x 1/c: moments follow
        if scales:
            ctx.metrics["vt/old_scale_min"] = min(scales)
            ctx.metrics["vt/old_scale_max"] = max(scales)
        ctx.metrics["vt/noise_ratio"] = float(self.options["noise_ratio"])

        # stages of birth, carried from growth to growth
        prev = ctx.state if isinstance(ctx.state, dict) else {}
        stage = ctx.stage if ctx.stage is not None else int(prev.get("stage", 0)) + 1
        if not 0 < stage < 256:
            raise ValueError(f"vt: stage={stage}: must be in 1..255")
        old_birth = prev.get("birth", {})
        birth = {}
        for name, p in params.items():
            if not p.is_meta:  # a unit's growth (docs/distributed.md, "FSDP2"): its own tensors' births
                birth[name] = torch.full(p.shape, stage, dtype=torch.uint8, device=p.device)
        for old, (new, idx) in param_map.items():
            if new not in birth:
                continue
            b, pos = old_birth.get(old), idx.reshape(-1)
            if b is not None and b.numel() == pos.numel():
                birth[new].view(-1)[pos] = b.to(pos.device).reshape(-1)
            else:  # no history (first growth): the old entries are stage 0
                birth[new].view(-1)[pos] = 0
        # (name, stage) pairs whose norm was 0 at birth, carried along the param map
        zero_born: dict[str, list[int]] = {}
        for old, stages in prev.get("zero_born", {}).items():
            if old in param_map and param_map[old][0] in birth:
                zero_born[param_map[old][0]] = list(stages)
        ctx.state = {"stage": stage, "birth": {n: b.cpu() for n, b in birth.items()}, "zero_born": zero_born}
        if self.options["lr_adaptation"]:
            ctx.lr_multipliers = {}
            self._eq5(ctx, {n: p for n, p in params.items() if p.dim() == 2 and not p.is_meta})

    # Table 1's factors are one per weight key and growth: every unit's extremes are over its own keys
    unit_metrics = {"vt/old_scale_min": min, "vt/old_scale_max": max}

    def unit_state(self, whole, part, yields):
        """The births and zero-born stages are per tensor: the union of each unit's own."""
        return {**whole, **{k: {**whole[k], **{n: v for n, v in part[k].items() if yields(n)}}
                            for k in ("birth", "zero_born")}}

    def _eq5(self, ctx: GrowthContext, weights: dict[str, torch.Tensor]) -> None:
        """Eq. 5's multipliers of the grown model's 2-D ``weights`` (by name) into ``ctx.lr_multipliers``
        and the metrics; a sub-weight born at this growth with norm 0 joins ``state["zero_born"]``
        (module docstring)."""
        st = ctx.state
        stage, zero_born = st["stage"], st["zero_born"]
        for name, p in weights.items():
            birth = st["birth"][name]
            if stage in zero_born.get(name, []):
                zero_born[name].remove(stage)  # a rewrite (svd) may have given it a scale
            if (birth == stage).any() and stage_norms(p, birth)[stage] == 0.0:
                zero_born.setdefault(name, []).append(stage)
            for key in [k for k in ctx.metrics if k.startswith(f"vt/lr_mult/{name}/")]:
                del ctx.metrics[key]
            ctx.lr_multipliers[name] = stage_lr_multipliers(p, birth, zero_born.get(name, ()))
            for k, m in ctx.lr_multipliers[name].items():
                ctx.metrics[lr_mult_key(name, k)] = m
        for name in [n for n, v in zero_born.items() if not v]:
            del zero_born[name]

    def rewrote(self, ctx: GrowthContext, weights: dict[str, torch.Tensor]) -> None:
        """A composing strategy (svd) rewrote ``weights`` after `finish`: their Eq. 5 multipliers
        again, on the values they now hold."""
        if ctx.lr_multipliers is not None:
            self._eq5(ctx, {n: w for n, w in weights.items() if n in ctx.lr_multipliers})

    # ---- during training ------------------------------------------------------------------------
    @torch.no_grad()
    def after_growth(self, opt, result, optim_name: str) -> None:
        """Under SGD, the growth's Eq. 5 multipliers become the optimizer's per-(parameter, stage)
        rates: Yuan et al.'s rule is an SGD rule. With Adam the adaptation is their Appendix C /
        Table 9's per-stage step counts, which the growth-aware AdamW applies to every strategy, so
        nothing is set here."""
        if result.lr_multipliers and optim_name == "sgd":
            opt.set_lr_multipliers(result.lr_multipliers)

    def after_step(self, model: Transformer, opt, step_in_stage: int) -> bool:
        """Eq. 5 on the current weights every ``lr_refresh_every`` steps: every (parameter, stage)
        multiplier the optimizer holds becomes ||W_Dk|| / ||W_Dref|| of the parameter's current
        values, with the optimizer's per-element stages of birth (`stage_lr_multipliers`; pairs it
        does not hold stay 1: norm 0 at birth, or an optimizer the trainer gives none, AdamW).
        The figures are kept for the log (`step_metrics`, keyed by stage number: `lr_mult_key`)."""
        every = int(self.options["lr_refresh_every"])
        held = getattr(opt, "multipliers", None)
        if not (self.options["lr_adaptation"] and every and step_in_stage % every == 0 and held):
            return False
        params = dict(model.named_parameters())
        fresh: dict[str, dict[int, float]] = {}
        for name, per_stage in held.items():
            ratios = stage_lr_multipliers(params[name], opt.birth[name])
            fresh[name] = {k: ratios[k] for k in per_stage if k in ratios}
        opt.set_lr_multipliers(fresh)
        self._step_metrics = {lr_mult_key(n, k): m for n, per in fresh.items() for k, m in per.items()}
        return False

    def step_metrics(self) -> dict[str, float]:
        return dict(self._step_metrics)
