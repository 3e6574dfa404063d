"""The six function-preserving expansions of A. Gesmundo and K. Maile, "Composable Function-preserving
Expansions for Transformer Architectures", arXiv:2308.06103 (2023): Table 1, Def. 3.1-3.6, Thm 3.1-3.6
(docs/model.md, "The model"; notation h, E, k, v, p, N as there, a hat marking the grown size).

Each function takes a `Transformer` and the new size of one dimension and returns
``(grown_model, param_map)`` (the contract: docs/strategies.md); the new entries' values come from a
strategy, the rescalings that belong to a transformation (Def. 3.4, 3.5) are applied here for every
strategy, and `grow.growth.base.compose_maps` composes the maps. The input model is never modified;
device, dtype, every Linear's ``mult`` and the train/eval mode are kept.
"""

from __future__ import annotations

import math
from typing import Callable, Iterable

import torch
import torch.nn as nn

from grow import schema
from grow.errors import ConfigError
from grow.growth.base import (
    DIMS,
    GrowthContext,
    ParamMap,
    Site,
    Slot,
    Strategy,
    get_strategy,
)
from grow.growth.experts import grow_experts
from grow.model import Linear, Transformer, TransformerConfig

__all__ = [
    "grow_mlp",
    "add_heads",
    "grow_value_size",
    "grow_key_size",
    "grow_hidden_size",
    "add_layers",
    "EXPANSIONS",
    "layer_positions",
]


# ---------------------------------------------------------------------------------------------
# Machinery: place old entries, describe new ones, let the strategy fill them, build the model
# ---------------------------------------------------------------------------------------------
class _Plan:
    """The grown parameters of one expansion, built from the old model.

    ``pos[name][a]`` are the positions of the old indices along axis ``a`` in the new tensor;
    ``shape[name]`` the new shape; ``rename[name]`` the new name (layer insertion)."""

    def __init__(self, model: Transformer, new_cfg: TransformerConfig, ctx: GrowthContext):
        self.model, self.new_cfg, self.new_layers = model, new_cfg, ctx.new_layers
        self.old = dict(model.named_parameters())
        self.device, self.dtype = ctx.device, next(iter(self.old.values())).dtype
        self.rename = {n: n for n in self.old}
        self.shape = {n: list(p.shape) for n, p in self.old.items()}
        self.pos = {n: [self.arange(s) for s in p.shape] for n, p in self.old.items()}
        self.scale_old: dict[str, float] = {}
        self.added: dict[str, tuple[int, ...]] = {}  # new parameters with no old counterpart
        self.tensors: dict[str, torch.Tensor] = {}
        self.mults = {n: m.mult for n, m in model.named_modules() if isinstance(m, Linear)}

    def arange(self, n: int, start: int = 0) -> torch.Tensor:
        return torch.arange(start, start + n, device=self.device)

    def grow_axis(self, name: str, axis: int, positions: torch.Tensor, size: int) -> None:
        self.pos[name][axis] = positions.reshape(-1)
        self.shape[name][axis] = size

    def materialize(self) -> None:
        """New tensors: old entries at their positions (times ``scale_old``), new ones NaN."""
        for name, p in self.old.items():  # a tensor on the meta device (another unit's, docs/distributed.md, "FSDP2") stays there
            new = torch.full(self.shape[name], float("nan"), dtype=self.dtype, device=p.device)
            ix = _broadcast_ix(self.pos[name])
            value = p.detach()
            if name in self.scale_old:
                value = value * self.scale_old[name]
            new[ix] = value
            self.tensors[self.rename[name]] = new
        for name, shape in self.added.items():
            absent = self.new_layers is not None and int(name.split(".")[1]) not in self.new_layers
            self.tensors[name] = torch.full(shape, float("nan"), dtype=self.dtype,
                                            device="meta" if absent else self.device)

    def param_map(self) -> ParamMap:
        """Each old tensor's new name and flat positions; a matrix another unit holds (on the meta device,
        docs/distributed.md, "FSDP2") gets its positions there too: that unit computes them (a vector's, cheap, everywhere)."""
        out = {}
        for name, p in self.old.items():
            if p.is_meta and p.dim() > 1:
                out[name] = (self.rename[name], torch.empty(p.shape, dtype=torch.long, device="meta"))
                continue
            strides = _strides(self.shape[name])
            flat = sum(
                (pos.view([-1 if a == b else 1 for b in range(p.dim())]) * st)
                for a, (pos, st) in enumerate(zip(self.pos[name], strides))
            )
            out[name] = (self.rename[name], torch.as_tensor(flat, device=self.device).expand(p.shape).clone())
        return out

    def slot(
        self, name: str, axis: int, old_idx, new_idx, role: str, zero: bool, init_scale: float = 1.0
    ) -> Slot:
        module = name.rsplit(".", 1)[0]
        key = name.split(".", 2)[2] if name.startswith("layers.") else name
        return Slot(
            name=name,
            tensor=self.tensors[name],
            axis=axis,
            old_idx=old_idx,
            new_idx=new_idx,
            role=role,
            zero=zero,
            init_scale=init_scale,
            module=module if module in self.mults else None,
            key=key,
        )

    def build(self) -> Transformer:
        """The grown Transformer, holding exactly the filled tensors."""
        for name, t in self.tensors.items():
            if not t.is_meta and torch.isnan(t).any():
                raise RuntimeError(
                    f"growth left {int(torch.isnan(t).sum())} entries of {name} unfilled (NaN)"
                )
        cfg = self.new_cfg
        with torch.device("meta"):
            new = Transformer(cfg)
        for name, t in self.tensors.items():
            module_name, attr = name.rsplit(".", 1)
            old_name = next((o for o, r in self.rename.items() if r == name), None)
            requires_grad = self.old[old_name].requires_grad if old_name is not None else True
            setattr(new.get_submodule(module_name), attr, nn.Parameter(t, requires_grad=requires_grad))
        if cfg.tie_embeddings:
            new.lm_head.weight = new.wte.weight
        for name, m in new.named_modules():
            if isinstance(m, Linear):
                m.mult = float(self.mults.get(name, 1.0))
        for name, p in new.named_parameters():
            if p.is_meta and not any(t.is_meta for t in self.tensors.values()):  # pragma: no cover - a bug
                raise RuntimeError(f"growth did not produce parameter {name}")
        new.train(self.model.training)
        return new


def _broadcast_ix(pos: list[torch.Tensor]) -> tuple[torch.Tensor, ...]:
    nd = len(pos)
    return tuple(p.view([-1 if a == b else 1 for b in range(nd)]) for a, p in enumerate(pos))


def _strides(shape) -> list[int]:
    strides, acc = [], 1
    for s in reversed(shape):
        strides.append(acc)
        acc *= s
    return list(reversed(strides))


def _units(positions: torch.Tensor, groups: int, width: int) -> torch.Tensor:
    """Reshape flat positions to (G, U, w)."""
    return positions.reshape(groups, -1, width)


def _per_head(E: int, old: int, new: int, device, rotary: bool = False) -> tuple[torch.Tensor, torch.Tensor]:
    """Positions (E, old) and (E, new - old) of each head's old and new coordinates when every head's
    block grows old -> new. Plain: head e's coordinate j goes to e*new + j, its new coordinates are
    e*new + old ... e*new + new-1. ``rotary`` (the half-split layout, coordinate j and j + k/2 form
    rotary pair j): the first half stays, the second half moves to the new second half,
    j -> j + (new - old)/2 for j >= old/2, and the new pairs old/2 .. new/2 - 1 take the coordinates
    [old/2, new/2) and [new/2 + old/2, new) (docs/model.md, "k under rotary positions")."""
    base = torch.arange(E, device=device)[:, None] * new
    j = torch.arange(old, device=device)
    if not rotary:
        return base + j[None, :], base + torch.arange(old, new, device=device)[None, :]
    a, b = old // 2, new // 2
    old_pos = torch.where(j < a, j, j - a + b)
    new_pos = torch.cat([torch.arange(a, b, device=device), torch.arange(b + a, new, device=device)])
    return base + old_pos[None, :], base + new_pos[None, :]


def _by_group(pos: torch.Tensor, groups: int) -> torch.Tensor:
    """(E, U) positions of the E = G r query heads' coordinates -> (G, U, r): unit u of group g holds
    coordinate u of its r query heads g r .. g r + r - 1 (under grouped-query attention a key/value
    coordinate is read by all of them; r = 1 without it)."""
    E, U = pos.shape
    return pos.view(groups, E // groups, U).transpose(1, 2).contiguous()


def _run(
    model: Transformer,
    new_cfg: TransformerConfig,
    strategy,
    ctx: GrowthContext | None,
    generator,
    describe: Callable[[_Plan], None],
    sites: Callable[[_Plan], Iterable[Site]],
) -> tuple[Transformer, ParamMap]:
    """Common driver: plan -> materialize -> strategy fills each site -> build."""
    strat: Strategy = get_strategy(strategy)
    if ctx is None:
        ctx = GrowthContext(
            source=model.config,
            target=new_cfg,
            model=model,
            batches=[],
            generator=generator,
            stage=None,
            state=None,
        )
    ctx.model = model
    plan = _Plan(model, new_cfg, ctx)
    with torch.no_grad():
        describe(plan)
        # the compensated rescalings of this transformation, by new name (GrowthResult.rescaled)
        ctx.expansion_scales = {plan.rename[n]: s for n, s in plan.scale_old.items()}
        plan.materialize()
        for site in sites(plan):
            site.slots = [s for s in site.slots if not s.tensor.is_meta]  # another unit's (docs/distributed.md, "FSDP2")
            if site.slots:
                strat.fill(ctx, site)
        grown = plan.build()
    return grown, plan.param_map()


def _layer_slots(plan: _Plan, n: int, specs) -> list[Slot]:
    return [plan.slot(f"layers.{n}.{key}", *rest) for key, *rest in specs]


# ---------------------------------------------------------------------------------------------
# Gesmundo & Maile §3.1 — MLP expansion (p)
# ---------------------------------------------------------------------------------------------
def grow_mlp(model: Transformer, d_ff: int, strategy="zero", *, ctx=None, generator=None):
    """MLP expansion p -> p_hat in every layer (Gesmundo & Maile Def. 3.1, Thm 3.1; docs/model.md, "The six expansions"; docs/model.md, "p under SwiGLU").

    Thm 3.1: new W2 rows M^{Wl2} := 0 keep the function for any new W1 columns, b1 entries (and, under
    SwiGLU, gate rows). Sites: one per layer, units = neurons; fc1 (and gate) rows and fc1.bias "in"
    (free), fc2 columns "out" (zero)."""
    cfg = model.config
    p, q = cfg.d_ff, d_ff
    _check_size("d_ff", p, q)
    new_cfg = cfg.replace(d_ff=q)
    entries = schema.layer(cfg, "p")  # fc1 (its bias, the gate) "in", fc2 "out" and zero

    def describe(plan):
        ar = plan.arange(p)
        for n in range(cfg.n_layers):
            for e in entries:
                plan.grow_axis(f"layers.{n}.{e.key}", e.axis, ar, q)

    def sites(plan):
        old, new = _units(plan.arange(p), 1, 1), _units(plan.arange(q - p, p), 1, 1)
        for n in range(cfg.n_layers):
            specs = [(e.key, e.axis, old, new, e.role, e.zero) for e in entries]
            yield Site("p", n, 1, p, q - p, p, q, _layer_slots(plan, n, specs), plan.mults)

    return _run(model, new_cfg, strategy, ctx, generator, describe, sites)


# ---------------------------------------------------------------------------------------------
# Gesmundo & Maile §3.2 — head addition (E)
# ---------------------------------------------------------------------------------------------
def add_heads(model: Transformer, n_heads: int, strategy="zero", *, ctx=None, generator=None):
    """Head addition E -> E_hat in every layer (Gesmundo & Maile Def. 3.2, Thm 3.2; docs/model.md, "The six expansions"; docs/model.md, "Heads under grouped-query attention").

    Thm 3.2: the new heads' W^O rows M^{WO} := 0 keep the function for any new Q/K/V. The new heads go
    after the old ones (under grouped-query attention they join the groups, reading their group's
    key/value head). Sites: one per layer, units = heads; q/k/v "in" (free), o "out" (zero)."""
    cfg = model.config
    E, F = cfg.n_heads, n_heads
    _check_size("n_heads", E, F)
    new_cfg = cfg.replace(n_heads=F)
    if cfg.n_kv_heads is not None:
        return _add_heads_to_groups(model, new_cfg, strategy, ctx, generator)
    entries = schema.layer(cfg, "E")  # q, k, v (and biases) "in", o "out" and zero; each head `per` k or v wide
    width = {"k": cfg.d_qk, "v": cfg.d_v}

    def describe(plan):
        for n in range(cfg.n_layers):
            for e in entries:
                w = width[e.per]
                plan.grow_axis(f"layers.{n}.{e.key}", e.axis, plan.arange(E * w), F * w)

    def sites(plan):
        units = {per: (_units(plan.arange(E * w), 1, w), _units(plan.arange((F - E) * w, E * w), 1, w))
                 for per, w in width.items()}
        for n in range(cfg.n_layers):
            specs = [(e.key, e.axis, *units[e.per], e.role, e.zero) for e in entries]
            yield Site("E", n, 1, E, F - E, E, F, _layer_slots(plan, n, specs), plan.mults)

    return _run(model, new_cfg, strategy, ctx, generator, describe, sites)


def _group_heads(G: int, r: int, r_hat: int, width: int, device) -> tuple[torch.Tensor, torch.Tensor]:
    """(G, r, width) positions of each group's old heads' entries and (G, r_hat - r, width) of its new
    ones, when every group of r heads (``width`` entries each) becomes r_hat heads, old ones first."""
    heads = torch.arange(G, device=device)[:, None] * r_hat
    old = (heads + torch.arange(r, device=device))[..., None] * width + torch.arange(width, device=device)
    new = (heads + torch.arange(r, r_hat, device=device))[..., None] * width + torch.arange(width, device=device)
    return old, new


def _add_heads_to_groups(model: Transformer, new_cfg: TransformerConfig, strategy, ctx, generator):
    """`add_heads` under grouped-query attention: new heads join the G groups (see its docstring)."""
    cfg = model.config
    G, r, r_hat = cfg.kv_heads, cfg.group_size, new_cfg.group_size
    entries = schema.layer(cfg, "E")  # the query side only: q (and its bias) "in", o "out" and zero
    width = {"k": cfg.d_qk, "v": cfg.d_v}

    def describe(plan):
        for n in range(cfg.n_layers):
            for e in entries:
                w = width[e.per]
                plan.grow_axis(f"layers.{n}.{e.key}", e.axis, _group_heads(G, r, r_hat, w, plan.device)[0], G * r_hat * w)

    def sites(plan):
        units = {per: _group_heads(G, r, r_hat, w, plan.device) for per, w in width.items()}
        for n in range(cfg.n_layers):
            specs = [(e.key, e.axis, *units[e.per], e.role, e.zero) for e in entries]
            yield Site("E", n, G, r, r_hat - r, cfg.n_heads, new_cfg.n_heads, _layer_slots(plan, n, specs), plan.mults)

    return _run(model, new_cfg, strategy, ctx, generator, describe, sites)


# ---------------------------------------------------------------------------------------------
# Gesmundo & Maile §3.3 — heads expansion (v)
# ---------------------------------------------------------------------------------------------
def grow_value_size(model: Transformer, d_v: int, strategy="zero", *, ctx=None, generator=None):
    """Heads expansion v -> v_hat, every head of every layer (Gesmundo & Maile Def. 3.3, Thm 3.3; docs/model.md, "The six expansions").

    Thm 3.3: each head's new W^O rows M^{WO}_e := 0 keep the function for any new W^V columns. Sites:
    one per layer, one group per key/value head, units = value coordinates; v rows "in" (free), o
    columns "out" (zero; under grouped-query attention the r query heads' columns, w = r)."""
    cfg = model.config
    v, w = cfg.d_v, d_v
    _check_size("d_v", v, w)
    return _grow_head_size(model, cfg.replace(d_v=w), "v", strategy, ctx, generator)


def _grow_head_size(model: Transformer, new_cfg: TransformerConfig, dim: str, strategy, ctx, generator):
    """k or v: every head's block of the query-side weight (W^Q rows for k, W^O columns for v; E
    heads) and of the key/value-side weight (W^K rows, W^V rows; G heads) grows old -> new, the
    rotary permutation for k under ``positions: rope`` (`_per_head`). Sites: one per layer, G groups,
    units = coordinates; W^Q / W^V "in", W^K / W^O "out" (the zero-constrained one)."""
    cfg = model.config
    E, G = cfg.n_heads, cfg.kv_heads
    old, new = getattr(cfg, DIMS[dim]), getattr(new_cfg, DIMS[dim])
    rotary = dim == "k" and cfg.positions == "rope"
    # (name, axis, heads, role, zero): the query side has E heads, the key/value side G. A q/k norm's gain (k
    # long) is not grown: `grow.growth.base.check_growth` refuses k under them
    heads = {"E": E, "G": G}
    specs = [(e.key, e.axis, heads[e.per], e.role, e.zero) for e in schema.layer(cfg, dim) if e.role != "gain"]

    def positions(heads, device):
        o, n = _per_head(heads, old, new, device, rotary)
        return _by_group(o, G), _by_group(n, G)

    def describe(plan):
        for n in range(cfg.n_layers):
            for key, axis, heads, _, _ in specs:
                plan.grow_axis(f"layers.{n}.{key}", axis, _per_head(heads, old, new, plan.device, rotary)[0],
                               heads * new)
            if dim == "k":  # Def. 3.4: the old W^K (and b^K), the zero side, x sqrt(k_hat/k), for the new temperature
                for key in (key for key, _, _, _, zero in specs if zero):
                    plan.scale_old[f"layers.{n}.{key}"] = math.sqrt(new / old)

    def sites(plan):
        for n in range(cfg.n_layers):
            slots = [(key, axis, *positions(heads, plan.device), role, zero) for key, axis, heads, role, zero in specs]
            yield Site(dim, n, G, old, new - old, old, new, _layer_slots(plan, n, slots), plan.mults)

    return _run(model, new_cfg, strategy, ctx, generator, describe, sites)


# ---------------------------------------------------------------------------------------------
# Gesmundo & Maile §3.4 — attention expansion (k)
# ---------------------------------------------------------------------------------------------
def grow_key_size(model: Transformer, d_qk: int, strategy="zero", *, ctx=None, generator=None):
    """Attention expansion k -> k_hat, every head of every layer (Gesmundo & Maile Def. 3.4, Thm 3.4; docs/model.md, "The six expansions"; docs/model.md, "k under rotary positions").

    Thm 3.4: new W^K columns M^{WK} := 0, with the old W^K x sqrt(k_hat/k) (applied here, for every
    strategy: the temperature 1/sqrt(k) -> 1/sqrt(k_hat)), keep the scores. Under rotary positions the
    old pairs' second halves move to i + k_hat/2 (`_per_head`) and the new pairs turn at the anchored
    table's lower frequencies. Sites: one per layer, one group per key head; q rows "in" (free), k rows
    "out" (zero)."""
    cfg = model.config
    k, m = cfg.d_qk, d_qk
    _check_size("d_qk", k, m)
    return _grow_head_size(model, cfg.replace(d_qk=m), "k", strategy, ctx, generator)


# ---------------------------------------------------------------------------------------------
# Gesmundo & Maile §3.5 — hidden dimension expansion (h)
# ---------------------------------------------------------------------------------------------
def grow_hidden_size(model: Transformer, d_model: int, strategy="zero", *, ctx=None, generator=None):
    """Hidden dimension expansion h -> h_hat (Gesmundo & Maile Def. 3.5, Thm 3.5; docs/model.md, "The six expansions").

    Thm 3.5: the new writers of the residual stream (columns of E, P, W^O, W2, b2) := 0 and every old
    gain x sqrt(h/h_hat) (applied here) keep the function (RMSNorm's eps is on the sum). The new gain
    entries are free, not 0 as the paper says (docs/model.md, "The six expansions"'s correction): role "gain", initialized as
    the rescaled old gains (``init_scale``). One site for the whole model, units = channels."""
    cfg = model.config
    h, H = cfg.d_model, d_model
    _check_size("d_model", h, H)
    new_cfg = cfg.replace(d_model=H)
    gain_scale = math.sqrt(h / H)
    # mup: the grown W_out is stored x m'/m = H/h afterwards (`grow.mup.regrow`); a fresh draw for its new
    # columns is taken at h/H x sigma, so that it ends at sigma, mup's init at the new width
    head_scale = h / H if cfg.parametrization == "mup" else 1.0

    # (name, axis, role, zero): the writers of the residual stream "in" and zero, its readers "out", the gains
    specs = [(name, e.axis, e.role, e.zero) for name, e in schema.entries(cfg, "h")]

    def describe(plan):
        ar = plan.arange(h)
        for name, axis, role, _ in specs:
            plan.grow_axis(name, axis, ar, H)
            if role == "gain":
                plan.scale_old[name] = gain_scale

    def sites(plan):
        old, new = _units(plan.arange(h), 1, 1), _units(plan.arange(H - h, h), 1, 1)
        scale = {"lm_head.weight": head_scale}
        slots = [
            plan.slot(name, axis, old, new, role, zero, gain_scale if role == "gain" else scale.get(name, 1.0))
            for name, axis, role, zero in specs
        ]
        yield Site("h", None, 1, h, H - h, h, H, slots, plan.mults)

    return _run(model, new_cfg, strategy, ctx, generator, describe, sites)


# ---------------------------------------------------------------------------------------------
# Gesmundo & Maile §3.6 — layer addition (N)
# ---------------------------------------------------------------------------------------------
def layer_positions(n_old: int, n_new: int, where="end", key: str = "layer_position") -> list[int]:
    """Indices, in the grown model, of the ``n_new - n_old`` inserted layers.

    ``where``: "end" (after the last layer), "start" (before the first), "interleave" (spread
    evenly: new layer i, for i < added, follows the first floor((i+1) n_old / added) old layers,
    so 4 -> 8 gives old, new, old, new, ...), or an explicit list of indices in the grown model.
    A bad ``where`` is a `ConfigError` naming ``key`` (the option it came from)."""
    added = n_new - n_old
    if added <= 0:
        return []
    if isinstance(where, str):
        if where == "end":
            return list(range(n_old, n_new))
        if where == "start":
            return list(range(added))
        if where == "interleave":
            after = [(i + 1) * n_old // added for i in range(added)]  # old layers before new layer i
            return [a + i for i, a in enumerate(after)]
        raise ConfigError(key, where, "must be 'end', 'start', 'interleave' or a list of indices")
    if not isinstance(where, (list, tuple)) or not all(isinstance(x, int) and not isinstance(x, bool) for x in where):
        raise ConfigError(key, where, "must be 'end', 'start', 'interleave' or a list of indices")
    pos = sorted(where)
    if len(pos) != added or len(set(pos)) != added or pos[0] < 0 or pos[-1] >= n_new:
        raise ConfigError(key, list(where), f"need {added} distinct indices in [0, {n_new - 1}] of the grown model")
    return pos


def add_layers(model: Transformer, n_layers: int, strategy="zero", *, ctx=None, generator=None, where="end"):
    """Layer addition N -> N_hat at any positions (Gesmundo & Maile Def. 3.6, Thm 3.6; docs/model.md, "The six expansions").

    Thm 3.6: the new layer's W^O, W2, b2 := 0 make it the identity; following layers are renumbered
    (the param map renames them). ``where``: see `layer_positions`. One site per new layer, every
    parameter a "layer" slot whose single unit spans the tensor."""
    cfg = model.config
    N, M = cfg.n_layers, n_layers
    _check_size("n_layers", N, M)
    new_cfg = cfg.replace(n_layers=M)
    positions = layer_positions(N, M, where)
    old_to_new = [i for i in range(M) if i not in positions]

    # shapes of a layer's parameters and its Linear modules (the same in every layer)
    layer_shapes = {
        name.split(".", 2)[2]: tuple(p.shape)
        for name, p in model.named_parameters()
        if name.startswith("layers.0.")
    }
    layer_linears = [name for name, m in model.layers[0].named_modules() if isinstance(m, Linear)]
    writers = set(schema.layer_writers(cfg))  # zero: the new layer adds 0 to the residual stream

    def describe(plan):
        for name in plan.old:
            if name.startswith("layers."):
                _, n, rest = name.split(".", 2)
                plan.rename[name] = f"layers.{old_to_new[int(n)]}.{rest}"
        mults = {}
        for mod, mult in plan.mults.items():
            if mod.startswith("layers."):
                _, n, rest = mod.split(".", 2)
                mod = f"layers.{old_to_new[int(n)]}.{rest}"
            mults[mod] = mult
        for n in positions:
            for mod in layer_linears:
                mults[f"layers.{n}.{mod}"] = 1.0
        plan.mults.clear()
        plan.mults.update(mults)
        for n in positions:
            for key, shape in layer_shapes.items():
                plan.added[f"layers.{n}.{key}"] = shape

    def sites(plan):
        for n in positions:
            slots = []
            for key, shape in layer_shapes.items():
                new = plan.arange(shape[0]).view(1, 1, shape[0])
                old = new[:, :0]
                slots.append(plan.slot(f"layers.{n}.{key}", 0, old, new, "layer", key in writers))
            yield Site("N", n, 1, 0, 1, N, M, slots, plan.mults)

    return _run(model, new_cfg, strategy, ctx, generator, describe, sites)


def _check_size(field: str, old: int, new: int) -> None:
    if not isinstance(new, int) or new < old:
        raise ValueError(
            f"cannot shrink {field} from {old} to {new}: growth only adds units (must be >= {old})"
        )


# dimension letter -> expansion function
EXPANSIONS = {
    "h": grow_hidden_size,
    "k": grow_key_size,
    "v": grow_value_size,
    "p": grow_mlp,
    "E": add_heads,
    "N": add_layers,
    "X": grow_experts,
}
