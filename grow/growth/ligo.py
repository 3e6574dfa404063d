"""``ligo``: learned linear growth (docs/strategies.md, "ligo").

P. Wang, R. Panda, L. Torroba Hennigen, P. Greengard, L. Karlinsky, R. Feris, D. Cox, Z. Wang, Y. Kim,
"Learning to Grow Pretrained Models for Efficient Transformer Training", ICLR 2023 (code:
``VITA-Group/LiGO``, ``ligo.py``). The grown weights are a linear map of the old ones: each grown layer a
learned combination of the old layers (depth), each weight widened as B W A^T (width) with the residual
stream's maps shared by every layer; the map is trained ``steps`` AdamW steps on the growth batches'
loss, then applied. It grows h, p and N; heads and key/value sizes grow first by zero's rule.
Initialized at a function-preserving map (the design section says which); options in
``configs/strategy/ligo.yaml``.
"""

from __future__ import annotations

import math

import torch
from torch import nn

from grow import schema
from grow.console import fmt_num
from grow.device import autocast
from grow.errors import ConfigError
from grow.growth import grow
from grow.growth.base import GrowthContext, Strategy, register
from grow.growth.svd_stats import token_mean_loss
from grow.model import IGNORE_INDEX, Linear, Transformer, TransformerConfig

ADAM_EPS = 1e-6  # the reference's adam_epsilon


def normalized_rows(ctx: GrowthContext, n: int, m: int, key: str) -> torch.Tensor:
    """(n, m) uniform draws with rows summing to 1: the reference's ``rand`` width initialization."""
    w = ctx.rand((n, m), key=key)
    return w / w.sum(-1, keepdim=True)


def effective_params(model: Transformer) -> dict[str, torch.Tensor]:
    """The model's parameters with every Linear's forward multiplier folded into its weight (the grown
    model has multipliers 1), detached."""
    out = {name: p.detach() for name, p in model.named_parameters()}
    for name, mod in model.named_modules():
        if isinstance(mod, Linear) and mod.mult != 1.0 and f"{name}.weight" in out:
            out[f"{name}.weight"] = out[f"{name}.weight"] * mod.mult
    return out


class Operator(nn.Module):
    """The LiGO map from a model of config ``source`` to the parameters of a model of config ``target``
    that differs in h, p and N only; ``forward()`` returns them by name, ``flops`` the matmul FLOPs of
    one ``forward()`` and ``backward_flops`` those of its backward (a forward under grad mode: each matmul
    once per operand that needs a gradient, as FlopCounterMode counts it; the depth mix and the
    embeddings' maps read constant old weights, so the backward is less than twice the forward).

    Width: the residual stream's writers (E, P, W_O, W2, b2) are widened by B = [I; C] and its readers
    (W_Q, W_K, W_V, W1, W_gate, W_out) by A = [I; R], both shared by every layer; each grown layer l
    widens its MLP units by U_l = [I; F_l] on the incoming side (W1, W_gate, b1) and D_l = [I; G_l] on
    W2's; the norm gains become sqrt(h/h') A g. Depth: parameter ``key`` of grown layer l is
    sum_j d_key[l, j] W_j over the old layers j. Initialized with C = 0, G_l = 0, R and F_l uniform
    rows summing to 1, d the identity on the old layers and, for a new layer l, a copy of old layer
    l mod N except its writers (0): the function is preserved (docs/strategies.md, "ligo")."""

    def __init__(self, small: Transformer, target: TransformerConfig, ctx: GrowthContext):
        super().__init__()
        src = small.config
        h, hh, p, pp, n, nn_ = src.d_model, target.d_model, src.d_ff, target.d_ff, src.n_layers, target.n_layers
        self.gain_scale = math.sqrt(h / hh)
        # each parameter's role and axis in h and in p (grow.schema): which width map reaches it, on which side
        self.h_entries = {e.key: e for e in schema.trunk(src, "h") + schema.layer(src, "h")}
        self.p_entries = {e.key: e for e in schema.layer(src, "p")}
        # a layer's writers of the residual stream: zero in a new layer's depth map (its branch adds 0, as
        # Gesmundo & Maile's new layer), a copy of an old layer's everywhere else
        writers = set(schema.layer_writers(src))
        self.known = set(schema.layer_keys(src))
        params = effective_params(small)
        self.layer_keys = sorted({name.split(".", 2)[2] for name in params if name.startswith("layers.")})
        self.outer = {name: t for name, t in params.items() if not name.startswith("layers.")}
        self.stacks = {key: torch.stack([params[f"layers.{j}.{key}"] for j in range(n)]) for key in self.layer_keys}
        zeros = lambda *s: torch.zeros(s, dtype=ctx.dtype, device=ctx.device)  # noqa: E731
        self.writer = nn.Parameter(zeros(hh - h, h)) if hh > h else None  # C
        self.reader = nn.Parameter(normalized_rows(ctx, hh - h, h, "ligo.reader")) if hh > h else None  # R
        grows_p = pp > p
        self.unit_in = nn.ParameterList([normalized_rows(ctx, pp - p, p, f"ligo.unit_in.{l}") for l in range(nn_)] if grows_p else [])
        self.unit_out = nn.ParameterList([zeros(pp - p, p) for _ in range(nn_)] if grows_p else [])
        self.depth = nn.ParameterDict()
        for key in self.layer_keys:
            d = zeros(nn_, n)
            for l in range(nn_):
                if l < n or key not in writers:
                    d[l, l % n] = 1.0
            self.depth[key.replace(".", "_")] = nn.Parameter(d)
        self.flops = self.backward_flops = 0.0

    # ---- the maps (x: a stack of matrices or vectors along dim 0; m: (b, a), or (x's count, b, a) per layer) ----
    def _mm(self, a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
        n = max(a.shape[0] if a.dim() == 3 else 1, b.shape[0] if b.dim() == 3 else 1)
        f = 2.0 * n * a.shape[-2] * a.shape[-1] * b.shape[-1]
        self.flops += f
        if torch.is_grad_enabled():  # the backward's matmul per operand with a gradient, each as costly
            self.backward_flops += f * (int(a.requires_grad) + int(b.requires_grad))
        return a @ b

    def rows(self, x: torch.Tensor, m: torch.Tensor | None) -> torch.Tensor:
        """[x; m x] along dim 1 of each of the stack ``x`` (of matrices or vectors)."""
        if m is None:
            return x
        flat = x.reshape(x.shape[0], x.shape[1], -1)
        return torch.cat([x, self._mm(m, flat).reshape(x.shape[0], m.shape[-2], *x.shape[2:])], 1)

    def cols(self, x: torch.Tensor, m: torch.Tensor | None) -> torch.Tensor:
        """[x, x m^T] along the last axis of each matrix of the stack ``x``."""
        return x if m is None else torch.cat([x, self._mm(x, m.transpose(-1, -2))], -1)

    def gain(self, g: torch.Tensor) -> torch.Tensor:
        return g if self.reader is None else self.rows(g, self.reader) * self.gain_scale

    def widen(self, key: str, w: torch.Tensor, u: torch.Tensor | None, g: torch.Tensor | None) -> torch.Tensor:
        """Parameter ``key`` (the model's, or every grown layer's, stacked) from its depth-mixed values ``w``, with
        the layers' MLP maps ``u`` = (F_l) and ``g`` = (G_l) stacked (None: p does not grow): p's map first (the
        rows computing the neurons by U_l, the columns reading them by D_l), then h's (`_h_map`). A parameter
        neither reaches (a head coordinate's: Qwen2's biases, Qwen3's norms) stays."""
        if key not in self.h_entries and key not in self.known:
            raise KeyError(f"strategy 'ligo': no width map for parameter {key!r}")
        p = self.p_entries.get(key)
        if p is not None:
            w = self._side(p, w, u if p.role == "in" else g)
        h = self.h_entries.get(key)
        return w if h is None else self._h_map(h, w)

    def _side(self, e: schema.Entry, w: torch.Tensor, m: torch.Tensor | None) -> torch.Tensor:
        """``m`` applied on the side of ``w`` that grows: its rows (axis 0) or its last axis."""
        return self.rows(w, m) if e.axis == 0 else self.cols(w, m)

    def _h_map(self, e: schema.Entry, w: torch.Tensor) -> torch.Tensor:
        """h's map of one entry: a gain by sqrt(h/h') A, a reader of the stream by A, a writer by B."""
        if e.role == "gain":
            return self.gain(w)
        return self._side(e, w, self.writer if e.role == "in" else self.reader)

    def forward(self) -> dict[str, torch.Tensor]:
        self.flops = 0.0
        if torch.is_grad_enabled():  # a forward without grad (an evaluation) keeps the last backward's count
            self.backward_flops = 0.0
        out = {}
        for name, t in self.outer.items():
            # a stack of one; the embeddings are writers (a tied W_out reads through B: exact at C = 0)
            out[name] = self.widen(name, t.unsqueeze(0), None, None)[0]
        u = torch.stack(list(self.unit_in)) if len(self.unit_in) else None
        g = torch.stack(list(self.unit_out)) if len(self.unit_out) else None
        for key in self.layer_keys:  # every grown layer's at once: one depth mix, then each width map batched
            stack = self.stacks[key]
            mixed = self._mm(self.depth[key.replace(".", "_")], stack.reshape(stack.shape[0], -1))
            for l, w in enumerate(self.widen(key, mixed.view(mixed.shape[0], *stack.shape[1:]), u, g).unbind(0)):
                out[f"layers.{l}.{key}"] = w
        return out


def write(model: Transformer, params: dict[str, torch.Tensor]) -> None:
    """Copy ``params`` into ``model`` (every parameter) and set every forward multiplier to 1."""
    with torch.no_grad():
        for name, p in model.named_parameters():
            p.copy_(params[name])
    for mod in model.modules():
        if isinstance(mod, Linear):
            mod.mult = 1.0


def reduce_gradients(params: list, ntok: torch.Tensor, reduce) -> None:
    """The token-weighted mean gradient over the ranks: each rank's mean-loss gradient x its tokens, summed
    (``reduce``, with the token counts), / the tokens of all ranks. ``ntok`` ends as the sum."""
    grads = [p.grad.mul_(ntok.to(p.dtype)) for p in params]
    reduce([*grads, ntok])
    for g in grads:
        g.div_(ntok.to(g.dtype))


def train_operator(op: Operator, model: Transformer, batches: list, opts: dict, ctx: GrowthContext) -> dict:
    """AdamW on the operator's parameters over ``steps`` steps (batch i mod len(batches)), the learning rate
    decaying linearly to 0 without warmup, gradients clipped to ``grad_clip`` (the reference's
    ``run_grow_distributed.py``); the mean loss over all the batches before and after. Leaves the trained
    map applied to ``model``. Returns the figures and the FLOPs: every materialization of the map (its
    forward; a step's with its backward, `Operator.backward_flops`), every training step of the grown model
    (6 N per token with the attention term, `TransformerConfig.flops_per_token`) and the evaluations (a
    third of it): before and after, or one at ``steps=0``."""
    steps = int(opts["steps"])
    device = ctx.device
    flops = 0.0

    def evaluate() -> tuple[float, int]:
        nonlocal flops
        with torch.no_grad():
            write(model, op())
        flops += op.flops
        loss, ntok = token_mean_loss(model, batches, ctx.reduce, ctx.amp)
        flops += ntok * model.config.flops_per_token(batches[0][0].shape[1]) / 3.0
        return loss, ntok

    loss_start, _ = evaluate()
    if steps == 0:
        return {"ligo/loss_start": loss_start, "ligo/loss_end": loss_start, "flops": flops}
    params = list(op.parameters())
    opt = torch.optim.AdamW(params, lr=float(opts["lr"]), weight_decay=float(opts["weight_decay"]), eps=ADAM_EPS)
    sched = torch.optim.lr_scheduler.LambdaLR(opt, lambda s: 1.0 - s / steps)
    was_training = model.training
    model.train()
    for s in range(steps):
        x, y = (t.to(device) for t in batches[s % len(batches)])
        params_now = op()  # the map in the parameters' dtype; only the model's passes under autocast
        with autocast(device, ctx.amp):
            _, loss = torch.func.functional_call(model, params_now, (x, y))
        loss.backward()
        ntok = torch.tensor(float((y != IGNORE_INDEX).sum()), dtype=torch.float64, device=device)
        if ctx.reduce is not None:
            reduce_gradients(params, ntok, ctx.reduce)
        if float(opts["grad_clip"]) > 0:
            torch.nn.utils.clip_grad_norm_(params, float(opts["grad_clip"]))
        opt.step()
        sched.step()
        opt.zero_grad(set_to_none=True)
        flops += op.flops + op.backward_flops + float(ntok) * model.config.flops_per_token(x.shape[1])
    model.train(was_training)
    loss_end, _ = evaluate()
    return {"ligo/loss_start": loss_start, "ligo/loss_end": loss_end, "flops": flops}


def _check(name: str, value, ok: bool, allowed: str) -> None:
    if not ok:
        raise ConfigError(f"strategy.{name}", value, f"must be {allowed} (strategy ligo)")


@register("ligo")
class LiGO(Strategy):
    """A learned linear map of the old weights in h, p and N (module docstring); E, k, v by zero's rule."""

    own_dims = ("h", "p", "N")
    exact_with = {"steps": 0}  # the function-preserving initialization, not trained
    # VITA-Group/LiGO's README: the operator's 100 steps (run_grow_distributed.py --max_steps 100), then the grown
    # BERT trains run_lm_distributed.py --max_steps 400000 at the same batch (configs/bert_wiki.txt)
    reference_training_steps = 400_000
    # Under FSDP on more than one rank ligo does not grow by units: its operator trains through the whole grown
    # model on rank 0's CPU (the host path). trainer.fsdp_growth=auto refuses a growth into a model above this
    # many parameters (100 default steps of 16 x 256 tokens there: ~2 h at the one-thread rate the cost model
    # measured, grow.fsdp_growth.cost.HOST_FLOPS); trainer.fsdp_growth=host accepts it knowingly.
    host_max_params = 25_000_000

    def __init__(self, **options):
        super().__init__(**options)
        o = self.options
        num = lambda v: isinstance(v, (int, float)) and not isinstance(v, bool)  # noqa: E731
        _check("steps", o["steps"], isinstance(o["steps"], int) and not isinstance(o["steps"], bool)
               and o["steps"] >= 0, "an integer >= 0 (operator training steps; 0: the initial map)")
        _check("lr", o["lr"], num(o["lr"]) and o["lr"] > 0, "a number > 0")
        _check("weight_decay", o["weight_decay"], num(o["weight_decay"]) and o["weight_decay"] >= 0, "a number >= 0")
        _check("grad_clip", o["grad_clip"], num(o["grad_clip"]) and o["grad_clip"] >= 0, "a number >= 0 (0: off)")

    def batches_needed(self) -> int:
        """Growth batches the operator's training needs (`grow.run` checks trainer.growth_batches)."""
        return 1 if self.options["steps"] > 0 else 0

    def host_training_flops(self, source: TransformerConfig, target: TransformerConfig, batch_size: int,
                            growth_batches: int) -> float:
        """The operator's training through the whole grown model (`planned_flops`): on rank 0's host under FSDP."""
        return planned_flops(source, target, self.options, batch_size, growth_batches)

    def plan_note(self, run) -> str:
        """ligo's operator training and evaluations over the plan's growths (`planned_flops`, what
        ``growth/flops`` will count), as a share of the plan's training FLOPs."""
        o, t, plan, stages = self.options, run.trainer, run.plan, list(run.plan)
        extra = sum(planned_flops(a.cfg, b.cfg, o, t.batch_size, t.growth_batches) for a, b in zip(stages, stages[1:]))
        pct = 100.0 * extra / max(plan.total_flops, 1)
        return (f"ligo's operator training ({o['steps']} steps per growth on trainer.growth_batches={t.growth_batches}): "
                f"{fmt_num(extra)} FLOPs, {pct:.3g}% of the plan's {fmt_num(plan.total_flops)} training FLOPs "
                f"(counted in growth/flops)")

    def check_transition(self, source: TransformerConfig, target: TransformerConfig) -> None:
        super().check_transition(source, target)
        if target.parametrization != "standard":
            raise ValueError(f"strategy 'ligo': parametrization={target.parametrization!r}: must be standard (the "
                             "map writes stored weights; mup's output multiplier moves with the width)")
        if target.moe:  # its width and depth maps are of one MLP a layer
            raise ValueError(f"strategy 'ligo': n_experts={target.n_experts}: must be 1 (LiGO maps one MLP a layer; "
                             f"grow experts with strategy=upcycle)")

    def setup(self, ctx: GrowthContext) -> None:
        """The input model with heads and key/value sizes grown by zero's rule: the operator's source."""
        src, tgt = ctx.source, ctx.target
        self.check_transition(src, tgt)
        mid = tgt.replace(d_model=src.d_model, d_ff=src.d_ff, n_layers=src.n_layers)
        self._small = ctx.model if mid == src else grow(ctx.model, mid, "zero", generator=ctx.generator).model
        if self.options["steps"] > 0 and not ctx.batches:
            raise ValueError("strategy 'ligo' trains its operator on growth batches: pass grow(..., batch=[...]) "
                             "(trainer.growth_batches >= 1), or steps=0")

    def finish(self, ctx: GrowthContext, model: Transformer, param_map) -> None:
        op = Operator(self._small, ctx.target, ctx)
        self._small = None
        ctx.metrics["ligo/steps"] = float(self.options["steps"])
        if ctx.batches:
            figures = train_operator(op, model, ctx.batches, self.options, ctx)
            cost = figures.pop("flops")
            ctx.metrics.update(figures)
        else:
            with torch.no_grad():
                write(model, op())
            cost = op.flops
        ctx.flops += cost
        # the growth's whole operator cost (its training, evaluations and maps: what growth/flops adds), and
        # one materialization of the map forward and backward, from which tests recompute it
        ctx.metrics["ligo/operator_flops"] = cost
        ctx.metrics["ligo/map_flops"] = op.flops
        ctx.metrics["ligo/map_backward_flops"] = op.backward_flops
        ctx.fresh |= {name for name, _ in model.named_parameters()}  # no old entry keeps its meaning


def planned_flops(source: TransformerConfig, target: TransformerConfig, options: dict, batch_size: int,
                  growth_batches: int) -> float:
    """The FLOPs one growth's operator costs (`train_operator`'s count, exactly; for ``grow schedule``):
    the map is built on the meta device, so it counts its matmuls without computing them."""
    steps = int(options.get("steps", LiGO.option_defaults()["steps"]))
    mid = target.replace(d_model=source.d_model, d_ff=source.d_ff, n_layers=source.n_layers)
    with torch.device("meta"):
        small = Transformer(mid)
    ctx = GrowthContext(source=mid, target=target, model=small, batches=[], generator=None, stage=None, state=None)
    op = Operator(small, target, ctx)
    with torch.enable_grad():  # as a training step builds it: its backward's count too
        op()
    if growth_batches == 0:
        return op.flops
    tok, fpt = batch_size * target.seq_len, target.flops_per_token()
    evals = 2 if steps > 0 else 1  # loss before and after training; at steps=0 the one before
    return (steps * tok * fpt + evals * growth_batches * tok * fpt / 3 + (steps + evals) * op.flops
            + steps * op.backward_flops)

