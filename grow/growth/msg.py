"""``msg``: Masked Structural Growth: new structure enters through a mask that ramps from 0 to 1.

Yiqun Yao, Zheng Zhang, Jing Li, Yequan Wang, "Masked Structural Growth for 2x Faster Language Model
Pre-training", ICLR 2024, arXiv 2305.02869 (code: ``cofe-ai/MSG``). Every new structure is
multiplied by c_t = min(1, t/R), R = ``ramp_steps``; at c = 0 the function is kept whatever the new
weights. Where each mask acts, the masked RMSNorm and the ramp: docs/strategies.md, "stack, hyperclone, msg", "msg in detail".
"""

from __future__ import annotations

import torch

from grow import masks as M
from grow import schema
from grow.growth.base import GrowthContext, ParamMap, Site, Strategy, held, register
from grow.growth.expand import layer_positions
from grow.growth.stack import copy_block
from grow.model import Transformer

# the options that choose between the reference code's rules (first) and grow's earlier ones
CHOICES = {"mlp_mask": ("pre_act", "post_act"), "new_layer": ("blend", "branches"), "new_layer_init": ("copy", "init")}


@register("msg")
class MSG(Strategy):
    """New structure masked, the masks ramped to 1 over ``ramp_steps`` optimizer steps, then removed."""

    grows_by_units = True  # per tensor; a copied new block reads its old block (`block_sources`)

    def __init__(self, **options):
        super().__init__(**options)
        r = self.options["ramp_steps"]
        if isinstance(r, bool) or not isinstance(r, int) or r < 1:
            raise self.bad_option("ramp_steps", r, "must be an integer >= 1")
        for key, allowed in CHOICES.items():
            if self.options[key] not in allowed:
                raise self.bad_option(key, self.options[key], f"must be one of {', '.join(allowed)}")
        self._left: dict = {}  # see `ramp`

    def block_sources(self, n_old: int, n_new: int, inserted: list[int]) -> dict[int, int]:
        """A copied new block reads the old block it copies (`copied_layer`); an initialized one none."""
        if self.options["new_layer_init"] != "copy":
            return {}
        return {j: copied_layer(n_old, inserted, j) for j in inserted}

    # ---- the growth ----------------------------------------------------------------------
    def setup(self, ctx: GrowthContext) -> None:
        """Keep the input model's masks (a growth in the middle of a ramp carries them over)."""
        self._old = {mod: {k: t.detach().clone() for k, t in bufs.items()} for mod, bufs in M.masks(ctx.model).items()}

    def constrained_values(self, ctx, site, slot):
        """MSG: the mask, not the value, preserves the function: initializer values here too."""
        return self.free_values(ctx, site, slot)

    def fill(self, ctx: GrowthContext, site: Site) -> None:
        if site.dim == "N" and self.options["new_layer_init"] == "copy":
            n_old = ctx.model.config.n_layers
            where = self.layer_positions(ctx.model.config, ctx.model.config.replace(n_layers=site.new_size))
            return copy_block(ctx, site, copied_layer(n_old, layer_positions(n_old, site.new_size, where), site.layer))
        super().fill(ctx, site)
        if site.dim == "h":  # masked statistics: old gains as they were, new gains the initializer's 1
            for slot in site.slots:
                if slot.role == "gain":
                    old = ctx.model.get_parameter(slot.name).detach()
                    slot.set(slot.old_idx, old.view(slot.old_shape()))
                    slot.set(slot.new_idx, ctx.init(slot.name, slot.new_shape()))
                    # stored as they were: no sqrt(h/h_hat) rescaling for the optimizer to convert moments by
                    ctx.expansion_scales.pop(slot.name, None)

    def finish(self, ctx: GrowthContext, model: Transformer, param_map: ParamMap) -> None:
        install_masks(model, param_map, self._old, self.options["mlp_mask"], self.options["new_layer"],
                      source=ctx.source)
        ctx.metrics["msg/masks"] = float(sum(1 for *_, t in M.mask_buffers(model) if not t.is_meta))

    def units_done(self, metrics: dict[str, float], names) -> None:
        """Grown by units: the grown model's masks counted from its tensors (a copied block's unit holds two
        layers)."""
        if "msg/masks" in metrics:
            metrics["msg/masks"] = float(sum(n.rpartition(".")[2] in M.MASK_BUFFERS for n in names))

    # ---- during training -------------------------------------------------------------------
    def after_step(self, model: Transformer, opt, step_in_stage: int) -> bool:
        return ramp(model, int(self.options["ramp_steps"]), self._left)


def copied_layer(n_old: int, inserted: list[int], layer: int) -> int:
    """The old layer that the new layer at index ``layer`` of the grown model copies (MSG's
    ``new_block_init_strategy="copy"``). New layers appended at the end (``inserted`` = n_old ..
    N_hat - 1) follow MSG's ``stack_block`` order: old layers 0 .. n_old - 1 repeated, then the last
    (N_hat mod n_old); a new layer elsewhere copies the old layer right before it (MSG's
    ``grow_block``: the layer at ``position - 1``), or old layer 0 if none is before it."""
    if inserted == list(range(n_old, n_old + len(inserted))):
        n_new = n_old + len(inserted)
        order = list(range(n_old)) * (n_new // n_old - 1) + list(range(n_old))[n_old - n_new % n_old:][: n_new % n_old]
        return order[layer - n_old]
    before = layer - sum(1 for i in inserted if i < layer)  # old layers before it
    return max(before - 1, 0)


def ramp(model: torch.nn.Module, ramp_steps: int, left: dict | None = None) -> bool:
    """Every mask entry k/R -> min(k+1, R)/R; masks at 1 removed. True if a mask was removed.

    ``left`` caches, per mask tensor, the steps until all its entries are 1 (R minus the
    smallest k), read from the tensor once (one host read per mask after a growth or a resume,
    none in the steps after): the ramp itself runs on the device without a host sync."""
    left = {} if left is None else left
    changed = False
    R = ramp_steps
    with torch.no_grad():
        for _, module, name, t in list(M.mask_buffers(model)):
            key = id(t)
            if key not in left or left[key][0] is not t:
                left[key] = (t, R - int(torch.round(t.min().double() * R)))
            k = torch.round(t.double() * R) + 1
            t.copy_(k.clamp_(max=R) / R)
            n = left[key][1] - 1
            left[key] = (t, n)
            if n <= 0:
                M.remove_mask(module, name)
                del left[key]
                changed = True
    return changed


# ---- which masks a grown model gets -------------------------------------------------------------
def _placed(size: int, positions: torch.Tensor, old: torch.Tensor | None, like: torch.Tensor) -> torch.Tensor:
    """A mask of ``size``: 0 (new) except ``old`` (1 where absent) at ``positions``."""
    m = torch.zeros(size, dtype=like.dtype, device=like.device)
    m[positions] = 1.0 if old is None else old.to(like.dtype)
    return m


def _module(key: str) -> str:
    return key.rsplit(".", 1)[0]


def _modules(entries, role: str) -> list[str]:
    """The modules of the ``entries`` (`grow.schema`) in ``role``, each once, in order."""
    return list(dict.fromkeys(_module(e.key) for e in entries if e.role == role))


def install_masks(model: Transformer, pmap: ParamMap, old: dict[str, dict[str, torch.Tensor]],
                  mlp_mask: str = "pre_act", new_layer: str = "blend", *, source=None) -> None:
    """Give the grown ``model`` its masks: every unit the param map does not reach is new (mask 0),
    every old unit keeps its mask value in the input model (``old``, by module name; 1 if it had
    none). Only masks with an entry below 1 are installed. ``mlp_mask``: "pre_act" masks the MLP
    units before the activation (fc1's output), "post_act" after it (fc2's input); ``new_layer``:
    "blend" mixes a new layer with its input (the block's ``mask_block``), "branches" masks its two
    residual branches (``mask_gate`` of W^O and W2). ``source``: the input model's config (the param map's
    names are its own; by default the grown model's)."""
    cfg = model.config
    ref = held(model)  # the masks' device and dtype: a unit's (the root on the meta device in a block's unit)
    h_mask = _placed(cfg.d_model, pmap["norm.weight"][1], old.get("norm", {}).get("mask_stat"), ref)
    old_module = {new.rsplit(".", 1)[0]: o.rsplit(".", 1)[0] for o, (new, _) in pmap.items()}  # new module -> old
    # h's writers (grow.schema's "in"): their new channels masked; its gains: their statistics skip them
    for mod in _modules(schema.trunk(cfg, "h"), "in"):
        _put(model, mod, "mask_out", h_mask)
    for mod in _modules(schema.trunk(cfg, "h"), "gain"):
        _put(model, mod, "mask_stat", h_mask)
    h = schema.layer(cfg, "h")
    reader = next(e.key for e in h if e.role == "out")  # a matrix of every layer (W^Q)
    for n in range(cfg.n_layers):
        pre = f"layers.{n}."
        if model.get_parameter(pre + reader).is_meta:  # another unit's layer (docs/distributed.md, "FSDP2")
            continue
        for mod in _modules(h, "gain"):
            _put(model, pre + mod, "mask_stat", h_mask)
        for mod in _modules(h, "in"):
            _put(model, pre + mod, "mask_out", h_mask)
        src = old_module.get(pre + _module(reader))  # the old layer's module, None for an inserted layer
        if src is None:
            _gate(model, pre, torch.zeros((), dtype=ref.dtype, device=ref.device), new_layer)
        else:
            _unit_masks(model, (pre, src[: -len(_module(reader))]), pmap, old, (mlp_mask, new_layer),
                        source=source or cfg)


def _gate(model: Transformer, pre: str, gate: torch.Tensor, new_layer: str) -> None:
    """Layer ``pre``'s gate: the block blended (``blend``) or its two branches masked (``branches``)."""
    if new_layer == "blend":
        _put(model, pre[:-1], "mask_block", gate)
    else:
        for mod in _modules(schema.layer(model.config, "h"), "in"):  # the branches' writers
            _put(model, pre + mod, "mask_gate", gate)


def _unit_masks(model: Transformer, layer: tuple[str, str], pmap: ParamMap, old: dict, rules: tuple[str, str], *,
                source) -> None:
    """The masks of layer ``pre`` (``layers.n.``), grown from the input model's layer ``old_pre``
    (``layer`` = (pre, old_pre)): its gate (if it was still ramping), query/key and value coordinates
    (E and k, v) and MLP units; ``rules`` = (mlp_mask, new_layer), see `install_masks`."""
    cfg, ref = model.config, held(model)
    pre, old_pre = layer
    mlp_mask, new_layer = rules

    def was(mod: str, name: str):
        return old.get(old_pre + mod, {}).get(name)

    def rows(param: str) -> torch.Tensor:  # rows of the grown weight that hold old rows
        return pmap[old_pre + param][1][:, 0] // cfg.d_model

    writer = _modules(schema.layer(cfg, "h"), "in")[0]  # the attention branch's (W^O)
    gate = was(writer, "mask_gate")
    gate = old.get(old_pre[:-1], {}).get("mask_block") if gate is None else gate
    if gate is not None:
        _gate(model, pre, gate, new_layer)
    E, k, v = cfg.n_heads, cfg.d_qk, cfg.d_v
    # the projections whose rows are head coordinates (k's and v's rows: W^Q, W^K, W^V), each masked by row
    coords = [e.key for dim in ("k", "v") for e in schema.layer(cfg, dim) if e.axis == 0 and e.role != "gain"]
    for key in dict.fromkeys(c for c in coords if c.endswith(".weight")):
        mod = _module(key)
        _put(model, pre + mod, "mask_out", _placed(schema.length(cfg, key, 0), rows(key), was(mod, "mask_out"), ref))
    if cfg.n_kv_heads is not None:  # a new head of a group reads old keys and values: mask its output
        q, o = (e.key for e in schema.layer(cfg, "E") if e.key.endswith(".weight"))  # its rows and W^O's columns
        heads = torch.zeros(E, v, dtype=ref.dtype, device=ref.device)
        heads[torch.unique(rows(q) // k)] = 1.0
        cols = pmap[old_pre + o][1][0] % (E * v)  # W^O's old columns in the grown one
        prev = was(_module(o), "mask_in")
        if prev is not None:
            heads.view(-1)[cols] = prev.to(ref.dtype)
        _put(model, pre + _module(o), "mask_in", heads.view(-1))
    _mlp_masks(model, pre, _mlp(source), (rows, was), mlp_mask)


def _mlp(cfg) -> tuple[str, str]:
    """The MLP's W1 (it computes the units: p's first "in" entry) and W2 (it reads them), by `grow.schema`."""
    p = schema.layer(cfg, "p")
    return p[0].key, next(e.key for e in p if e.role == "out")


def _mlp_masks(model: Transformer, pre: str, old_mlp: tuple[str, str], lookups, mlp_mask: str) -> None:
    """Layer ``pre``'s MLP unit mask, from the input model's W1 and W2 (``old_mlp``) and its rows and masks
    (``lookups``: `_unit_masks`'s rows and was)."""
    (fc1, fc2), (rows, was) = old_mlp, lookups
    was_units = was(_module(fc1), "mask_out")
    units = _placed(model.config.d_ff, rows(fc1), was(_module(fc2), "mask_in") if was_units is None else was_units,
                    held(model))
    if not bool((units < 1).any()):
        return
    if model.config.moe:  # a dense layer's new units, copied into its experts: one mask each would be needed
        raise ValueError("strategy 'msg': cannot mask new MLP units of a layer that becomes experts in the same "
                         "growth; grow d_ff and n_experts in two growths")
    new_fc1, new_fc2 = _mlp(model.config)
    if mlp_mask == "pre_act":
        _put(model, pre + _module(new_fc1), "mask_out", units)
    else:
        _put(model, pre + _module(new_fc2), "mask_in", units)


def _put(model: Transformer, module: str, name: str, mask: torch.Tensor) -> None:
    if bool((mask < 1).any()):
        M.set_mask(model.get_submodule(module), name, mask)
