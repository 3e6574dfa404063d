"""The per-element bookkeeping of the growth-aware optimizers (docs/optimizer.md).

Per element the stage it was born in, per stage a step count, and what follows from them whatever
the update rule: the move onto a grown model (`GrowthAware.grow`), the per-stage scalars
(`_derived`: multipliers, new-element warmup, the rule's own), the dispatch of a step between the
uniform and the per-element paths (`GrowthAware.step`), and the state dict.
"""

from __future__ import annotations

import math
import numbers
import struct
from collections import defaultdict
from collections.abc import Iterable, Mapping

import torch

from grow.parallel.fsdp import is_sharded

ON_GROWTH = ("keep", "reset")
_FORMAT = "grow.optim/1"


def _f32(x: float) -> float:
    """``x`` rounded to float32, the precision the kernels use for scalars on float32/bf16/fp16 tensors."""
    return struct.unpack("f", struct.pack("f", x))[0]


def check_hyperparameter(key: str, value, lo: float | None = None, hi: float | None = None, *, lo_open=False,
                         hi_open=False) -> float:
    if isinstance(value, bool) or not isinstance(value, numbers.Real) or not math.isfinite(value):
        raise ValueError(f"{key}={value!r}: must be a finite number")
    bad = (lo is not None and (value < lo or (lo_open and value == lo))) or \
          (hi is not None and (value > hi or (hi_open and value == hi)))
    if bad:
        lb = "(" if lo_open else "["
        rb = ")" if hi_open else "]"
        raise ValueError(f"{key}={value!r}: must be in {lb}{lo if lo is not None else '-inf'}, "
                         f"{hi if hi is not None else 'inf'}{rb}")
    return float(value)


class _StageIndex:
    """``values[birth]`` for a per-stage vector ``values`` (S,), as cheaply as the births allow.

    A 2-D parameter grown by adding rows and columns has births ``birth[r, c] = max(rb[r], cb[c])``
    (an entry exists from the stage its row and its column both exist). Then ``values[birth]`` is
    the row gather ``V[rb]`` of the small (S, C) table ``V[i, c] = values[max(i, cb[c])]``: a copy
    of whole rows, not an element gather; when every row is as old (rb constant: e.g. W_out or E,
    whose vocabulary rows never grow) it is the broadcast row ``V[rb0]``, and when every column is
    (cb constant) the column ``values[max(rb, cb0)]``. Other births (1-D parameters, any other
    pattern) take the element gather ``values[birth]``."""

    def __init__(self, birth: torch.Tensor, n_stages: int):
        self.shape = tuple(birth.shape)
        b = birth.to(torch.long)
        self.flat = self.rows = self.grid = self.cols = None
        if b.dim() == 2:
            rb, cb = b.amin(dim=1), b.amin(dim=0)
            if torch.equal(torch.maximum(rb[:, None], cb[None, :]), b):
                if bool((rb == rb[0]).all()):
                    self.grid = torch.maximum(rb[:1, None], cb[None, :])  # (1, C): a broadcast row
                elif bool((cb == cb[0]).all()):
                    self.cols = torch.maximum(rb, cb[:1])[:, None]  # (R, 1): a broadcast column
                else:
                    stages = torch.arange(n_stages, device=b.device)
                    self.grid = torch.maximum(stages[:, None], cb[None, :])  # (S, C)
                    self.rows = rb
                return
        self.flat = b.reshape(-1).to(torch.int32)

    def expand(self, values: torch.Tensor) -> torch.Tensor:
        """``values[birth]`` (values: (S,) on the parameter's device), broadcastable to the shape."""
        if self.flat is not None:
            return torch.index_select(values.contiguous(), 0, self.flat).view(self.shape)
        if self.cols is not None:
            return values[self.cols]
        table = values[self.grid]
        return table if self.rows is None else torch.index_select(table, 0, self.rows)


class MixedBatch:
    """The per-stage scalars of one step's mixed parameters, for the rule's per-element path: the
    device table (`GrowthAware._stage_table`, built on first use) and, on request, each scalar
    expanded by birth stage (`GrowthAware._gathered`). ``entries``: (name, stages, derived per stage)."""

    def __init__(self, opt: "GrowthAware", entries):
        self.opt, self.entries = opt, entries
        self._table: torch.Tensor | None = None

    @property
    def table(self) -> torch.Tensor:
        if self._table is None:
            self._table = self.opt._stage_table(self.entries)
        return self._table

    def gathered(self) -> list[list[torch.Tensor | float]]:
        return self.opt._gathered(self.entries, self.table)


class GrowthAware:
    """The per-element bookkeeping shared by the growth-aware optimizers (module docstring).

    An update rule (`grow.optim.adamw`, `grow.optim.sgd`) subclasses it and defines ``kind``,
    ``_buffer_powers`` (its state buffers and their units: the power of the gradient each holds),
    ``hyperparameters()`` / ``set_hyperparameters()``, ``_derived(s, scale, decays)`` (the scalars its kernels use for
    elements born at stage s), ``_uniform_update(...)`` and ``_mixed_update(...)``."""

    kind = "base"
    _buffer_powers: dict[str, int] = {}

    @property
    def _buffer_names(self) -> tuple[str, ...]:
        return tuple(self._buffer_powers)

    def __init__(self, named_params: Iterable[tuple[str, torch.nn.Parameter]], *, lr: float, weight_decay: float,
                 new_warmup_steps: int):
        self.lr = check_hyperparameter("lr", lr, 0.0)
        self.weight_decay = check_hyperparameter("weight_decay", weight_decay, 0.0)
        if isinstance(new_warmup_steps, bool) or not isinstance(new_warmup_steps, numbers.Integral) \
                or new_warmup_steps < 0:
            raise ValueError(f"new_warmup_steps={new_warmup_steps!r}: must be an integer >= 0 (0 = off)")
        self.new_warmup_steps = int(new_warmup_steps)
        # a sharded (FSDP2) parameter: the optimizer holds its local rows, and `sharded` the DTensor
        # whose gradient they take at each step (`_local_grads`); every update is element-wise
        self.sharded: dict[str, torch.Tensor] = {}
        self.params: dict[str, torch.Tensor] = self._collect(named_params, "named_params")
        self.state: dict[str, dict[str, torch.Tensor]] = {n: self._zero_state(p) for n, p in self.params.items()}
        self.birth: dict[str, int | torch.Tensor] = {n: 0 for n in self.params}
        self._stages_in: dict[str, tuple[int, ...]] = {n: (0,) for n in self.params}
        self._index: dict[str, torch.Tensor] = {}  # int32 flat births of the mixed parameters, built once
        self.stage = 0
        self.stage_steps: list[int] = [0]
        self.multipliers: dict[str, dict[int, float]] = {}

    # -- construction helpers --
    def _collect(self, named_params, what: str) -> dict[str, torch.Tensor]:
        """``{name: parameter}`` of the trainable parameters (a sharded one: its local rows, the
        parameter itself recorded in ``sharded``)."""
        out: dict[str, torch.Tensor] = {}
        seen: dict[int, str] = {}
        for item in named_params:
            if not (isinstance(item, tuple) and len(item) == 2 and isinstance(item[0], str)
                    and isinstance(item[1], torch.Tensor)):
                raise ValueError(f"{what}: expected (name, parameter) pairs as from model.named_parameters(), "
                                 f"got {type(item).__name__}")
            name, p = item
            if not p.requires_grad:
                continue
            if name in out:
                raise ValueError(f"{what}: parameter name {name!r} appears twice")
            if id(p) in seen:
                raise ValueError(f"{what}: {name!r} is the same tensor as {seen[id(p)]!r} (pass each parameter once)")
            if not p.is_floating_point():
                raise ValueError(f"{what}: {name!r} has dtype {p.dtype}; parameters must be floating point")
            seen[id(p)] = name
            out[name] = p
            if is_sharded(p):  # FSDP2's sharded parameter
                self.sharded[name] = p
                out[name] = p.detach().to_local()
        if not out:
            raise ValueError(f"{what}: no trainable parameters")
        return out

    reset_keeps_births = False  # see `grow`: true where births only select rates (SGD)
    mixed_by_decay = True  # the per-element path takes one group per weight-decay setting (SGD's coupled L2 needs it)

    def _convert(self, name: str, bufs: dict, c: float) -> dict:
        """The buffers of parameter ``name`` (before the growth) in the units of a growth that stores it
        x c and reads it x 1/c: the gradients to come are x 1/c, so a buffer of gradient^power units
        is / c^power (``_buffer_powers``). A rule whose buffer mixes units overrides this (SGD's
        coupled L2)."""
        return {b: bufs[b] / c ** power for b, power in self._buffer_powers.items()}

    def _zero_state(self, p: torch.Tensor) -> dict[str, torch.Tensor]:
        return {b: torch.zeros_like(p, memory_format=torch.contiguous_format) for b in self._buffer_names}

    def _decays(self, p: torch.Tensor) -> bool:
        return self.weight_decay != 0.0 and p.dim() >= 2

    # -- per-stage scalars --
    def _warm(self, s: int) -> float:
        if s == 0 or self.new_warmup_steps == 0:
            return 1.0
        return min(1.0, self.stage_steps[s] / self.new_warmup_steps)

    # -- public API --
    def birth_stage(self, name: str) -> torch.Tensor:
        """The birth stage of every element of parameter ``name`` (uint8, the parameter's shape)."""
        b = self.birth[name]
        if isinstance(b, torch.Tensor):
            return b
        p = self.params[name]
        return torch.full(p.shape, b, dtype=torch.uint8, device=p.device)

    def _local_grads(self) -> None:
        """Each sharded parameter's local rows take their share of its gradient."""
        for name, p in self.sharded.items():
            self.params[name].grad = None if p.grad is None else p.grad.to_local()

    def zero_grad(self, set_to_none: bool = True) -> None:
        for p in [*self.sharded.values(), *self.params.values()]:
            if p.grad is None:
                continue
            if set_to_none:
                p.grad = None
            else:
                p.grad.detach_()
                p.grad.zero_()

    def set_lr_multipliers(self, multipliers: Mapping[str, Mapping[int, float]]) -> None:
        """Set per-parameter, per-stage learning-rate multipliers: ``{param_name: {stage: factor}}``.

        Elements of ``param_name`` born at ``stage`` train with ``lr * factor`` (weight decay scaled
        alike). Entries are merged into the current ones (a later call overrides the same (name,
        stage)); absent entries are 1.0. Multipliers follow their parameter through a growth
        (``keep``: renamed along the growth map) and are cleared by ``reset``."""
        if not isinstance(multipliers, Mapping):
            raise ValueError(f"multipliers={multipliers!r}: must be a mapping {{param_name: {{stage: factor}}}}")
        staged: dict[str, dict[int, float]] = {}
        for name, per_stage in multipliers.items():
            if name not in self.params:
                raise ValueError(f"multipliers[{name!r}]: no such parameter in the optimizer")
            if not isinstance(per_stage, Mapping):
                raise ValueError(f"multipliers[{name!r}]={per_stage!r}: must be a mapping {{stage: factor}}")
            for s, f in per_stage.items():
                if isinstance(s, bool) or not isinstance(s, numbers.Integral) or not 0 <= s <= self.stage:
                    raise ValueError(f"multipliers[{name!r}][{s!r}]: stage must be an integer in [0, {self.stage}] "
                                     f"(the current stage)")
                staged.setdefault(name, {})[int(s)] = check_hyperparameter(f"multipliers[{name!r}][{s}]", f, 0.0)
        for name, per_stage in staged.items():
            self.multipliers.setdefault(name, {}).update(per_stage)

    @torch.no_grad()
    def step(self, lr: float | None = None) -> None:
        """One update of every parameter with a gradient, at learning rate ``lr`` (or ``self.lr``).

        Parameters are grouped by the scalars their kernels will use (rounded to the parameter's
        compute precision, so equal keys mean identical arithmetic): a parameter whose stages all
        give the same scalars joins a fast foreach/fused group; the others take the per-element path."""
        if lr is not None:
            self.lr = check_hyperparameter("lr", lr, 0.0)
        self._local_grads()
        self.stage_steps = [n + 1 for n in self.stage_steps]
        warm = [self._warm(s) for s in range(len(self.stage_steps))]
        cache: dict[tuple, tuple] = {}
        uniform: dict[tuple, list[str]] = defaultdict(list)
        meta: dict[tuple, tuple[float, int]] = {}
        mixed: dict[tuple, list[tuple[str, tuple, list]]] = defaultdict(list)
        for name, p in self.params.items():
            if p.grad is None:
                continue
            if p.grad.is_sparse:
                raise RuntimeError(f"{name}: sparse gradients are not supported")
            decays = self._decays(p)
            f64 = p.dtype == torch.float64
            mults = self.multipliers.get(name)
            stages = self._stages_in[name]
            ders, scales = [], []
            for s in stages:
                scale = (mults.get(s, 1.0) if mults else 1.0) * warm[s]
                k = (s, scale, decays, f64)
                d = cache.get(k)
                if d is None:
                    d = cache[k] = tuple(x if f64 else _f32(x) for x in self._derived(s, scale, decays))
                ders.append(d)
                scales.append(scale)
            if all(d == ders[0] for d in ders[1:]):
                key = (p.device, p.dtype, decays, ders[0])
                uniform[key].append(name)
                n = max(self.stage_steps[s] for s in stages)
                if key not in meta or n > meta[key][1]:
                    meta[key] = (self.lr * scales[0], n)
            else:
                mixed[(p.device, p.dtype, decays if self.mixed_by_decay else None)].append((name, stages, ders))
        for key, names in uniform.items():
            lr_eff, n = meta[key]
            self._uniform_update(names, key[3], lr_eff, n, key[2])
        for (_, _, decays), entries in mixed.items():
            self._mixed_update([e[0] for e in entries], MixedBatch(self, entries), decays)

    def _derived(self, s: int, scale: float, decays: bool) -> tuple[float, ...]:  # pragma: no cover - abstract
        """The scalars the update kernels use for elements born at stage ``s`` with lr multiplier ``scale``."""
        raise NotImplementedError

    def _lists(self, names: list[str]):
        ps = [self.params[n] for n in names]
        gs = [p.grad for p in ps]
        bufs = [[self.state[n][b] for n in names] for b in self._buffer_names]
        return ps, gs, bufs

    def _stage_table(self, entries) -> torch.Tensor:
        """The (n_params, n_stages, n_scalars) table of the mixed parameters' per-stage scalars, on
        the device in the kernels' scalar precision. It goes there as one small copy per step
        (pinned and non-blocking on CUDA: no host sync); rows of stages a parameter lacks are 0."""
        S = len(self.stage_steps)
        width = len(entries[0][2][0])
        rows = []
        for _, stages, ders in entries:
            per = [(0.0,) * width] * S
            for s, d in zip(stages, ders):
                per[s] = d
            rows.append(per)
        p0 = self.params[entries[0][0]]
        dtype = torch.float64 if p0.dtype == torch.float64 else torch.float32  # the kernels' scalar precision
        host = torch.tensor(rows, dtype=torch.float64)
        if p0.device.type == "cuda":  # a pageable copy would block the host until the stream drains
            host = host.pin_memory()
        return host.to(device=p0.device, non_blocking=True).to(dtype)

    def _gathered(self, entries, table: torch.Tensor) -> list[list[torch.Tensor | float]]:
        """Per mixed parameter, per derived scalar: the scalar of each element's birth stage, as a
        tensor broadcastable to p's shape, or a plain float where all the parameter's stages share
        that scalar. Each parameter reads the columns of ``table`` (`_stage_table`) that differ by
        birth stage through its `_StageIndex`."""
        S = len(self.stage_steps)
        out = []
        for i, (name, _, ders) in enumerate(entries):
            index = None
            cols: list[torch.Tensor | float] = []
            for c in range(len(ders[0])):
                if all(d[c] == ders[0][c] for d in ders[1:]):
                    cols.append(ders[0][c])
                    continue
                if index is None:
                    index = self._index.get(name)
                    if index is None:  # once per growth (or load), not once per step
                        index = self._index[name] = _StageIndex(self.birth[name], S)
                cols.append(index.expand(table[i, :, c]))
            out.append(cols)
        return out

    def forget(self, names: Iterable[str]) -> None:
        """Drop parameters ``names`` and everything held for them: they are frozen from now on
        (``trainer.train_new_only``), with no state, no step and no place in the state dict."""
        for n in list(names):
            for held in (self.params, self.state, self.birth, self._stages_in, self.multipliers, self.sharded,
                         self._index):
                held.pop(n, None)

    # -- growth --
    @torch.no_grad()
    def grow(self, new_named_params: Iterable[tuple[str, torch.nn.Parameter]],
             param_map: Mapping[str, tuple[str, torch.Tensor]], stage: int, on_growth: str = "keep",
             fresh: Iterable[str] = (), rescaled: Mapping[str, float] | None = None) -> None:
        """Move the optimizer onto the grown model's parameters, entering stage ``stage``.

        ``param_map[old_name] = (new_name, positions)``, the old elements' flat indices in the new
        parameter; every old parameter mapped, to distinct new parameters, at distinct positions.

        ``keep``: mapped elements keep their buffers and birth stage; every other element starts with
        zero buffers, born at ``stage``. ``reset``: a fresh state (with ``reset_keeps_births``, SGD, only
        the buffers cleared: Yuan et al.'s Eq. 5 rates go on). ``fresh``: parameters that restart under
        ``keep`` too. ``rescaled`` (`GrowthResult.rescaled`, ``{new_name: c}``): the kept buffers divided
        by c to their power (AdamW: exp_avg / c, exp_avg_sq / c^2); docs/optimizer.md, "The growth-aware optimizer"."""
        if on_growth not in ON_GROWTH:
            raise ValueError(f"on_growth={on_growth!r}: must be one of {', '.join(ON_GROWTH)}")
        if isinstance(stage, bool) or not isinstance(stage, numbers.Integral) or not self.stage < stage <= 255:
            raise ValueError(f"stage={stage!r}: must be an integer in ({self.stage}, 255] (after the current stage "
                             f"{self.stage}; stage ids are uint8)")
        stage = int(stage)
        new_params = self._collect(new_named_params, "new_named_params")
        rescaled = self._checked_rescaled(rescaled, new_params)
        checked = self._checked_map(param_map, new_params)
        if on_growth == "reset" and self.reset_keeps_births:  # SGD: only the buffers cleared (see the class)
            self._keep(new_params, checked, stage, set(fresh), rescaled)
            self.state = {n: self._zero_state(p) for n, p in new_params.items()}
        elif on_growth == "reset":
            self.params = new_params
            self.state = {n: self._zero_state(p) for n, p in new_params.items()}
            self.birth = {n: stage for n in new_params}
            self.multipliers = {}
        else:
            self._keep(new_params, checked, stage, set(fresh), rescaled)
        self._compact_births()
        self.stage = stage
        self.stage_steps = self.stage_steps + [0] * (stage + 1 - len(self.stage_steps))

    @staticmethod
    def _checked_rescaled(rescaled, new_params) -> dict[str, float | torch.Tensor]:
        """``rescaled`` checked: per parameter a number, or a tensor of the new parameter's shape (a factor per
        entry, read at the old entries' positions: net2net's split units), every factor finite and > 0."""
        out = dict(rescaled or {})
        for name, c in out.items():
            if name not in new_params:
                raise ValueError(f"rescaled[{name!r}]: no such parameter in new_named_params")
            if not isinstance(c, torch.Tensor):
                check_hyperparameter(f"rescaled[{name!r}]", c, 0.0, lo_open=True)
            elif tuple(c.shape) != tuple(new_params[name].shape) or not bool((torch.isfinite(c) & (c > 0)).all()):
                raise ValueError(f"rescaled[{name!r}]: a tensor of factors must have the parameter's shape "
                                 f"{tuple(new_params[name].shape)} and finite entries > 0")
        return out

    def _checked_map(self, param_map, new_params) -> dict[str, tuple[str, torch.Tensor]]:
        """``{old: (new_name, flat positions as int64 on the new parameter's device)}``, or a
        ValueError naming the first entry that is not a valid growth map."""
        if not isinstance(param_map, Mapping):
            raise ValueError(f"param_map: must be a mapping {{old_name: (new_name, positions)}}, got "
                             f"{type(param_map).__name__}")
        for old in param_map:
            if old not in self.params:
                raise ValueError(f"param_map[{old!r}]: no such parameter in the optimizer before the growth")
        missing = [n for n in self.params if n not in param_map]
        if missing:
            raise ValueError(f"param_map: no entry for old parameter {missing[0]!r} ({len(missing)} unmapped); "
                             f"every old parameter must map into the grown model")
        targets: dict[str, str] = {}
        checked: dict[str, tuple[str, torch.Tensor]] = {}
        for old, entry in param_map.items():
            if not (isinstance(entry, (tuple, list)) and len(entry) == 2):
                raise ValueError(f"param_map[{old!r}]={entry!r}: must be (new_name, positions)")
            new_name, pos = entry
            if new_name not in new_params:
                raise ValueError(f"param_map[{old!r}]: new parameter {new_name!r} is not in new_named_params")
            if new_name in targets:
                raise ValueError(f"param_map[{old!r}]: {new_name!r} is also the target of {targets[new_name]!r}")
            targets[new_name] = old
            op, np_ = self.params[old], new_params[new_name]
            if not isinstance(pos, torch.Tensor) or pos.dtype.is_floating_point or pos.dtype == torch.bool:
                raise ValueError(f"param_map[{old!r}]: positions must be an integer tensor")
            if tuple(pos.shape) != tuple(op.shape):
                raise ValueError(f"param_map[{old!r}]: positions have shape {tuple(pos.shape)}, the old parameter "
                                 f"{tuple(op.shape)}")
            flat = pos.reshape(-1).to(device=np_.device, dtype=torch.long)
            if flat.numel():
                lo, hi = int(flat.min()), int(flat.max())
                if lo < 0 or hi >= np_.numel():
                    raise ValueError(f"param_map[{old!r}]: positions span [{lo}, {hi}], outside [0, {np_.numel() - 1}] "
                                     f"of {new_name!r} {tuple(np_.shape)}")
                hit = torch.zeros(np_.numel(), dtype=torch.bool, device=np_.device)
                hit[flat] = True  # a scatter, not torch.unique's sort: 25 of a 124M growth's 34 s went to the sort
                if int(hit.count_nonzero()) != flat.numel():
                    raise ValueError(f"param_map[{old!r}]: two old elements map to the same position of {new_name!r}")
            checked[old] = (new_name, flat)
        return checked

    def _keep(self, new_params, checked, stage: int, fresh: set, rescaled: dict) -> None:
        """``on_growth="keep"``: old elements carry their buffers (in the rescaled units) and births
        to their new positions; everything else starts at zero, born at ``stage``."""
        state = {n: self._zero_state(p) for n, p in new_params.items()}
        birth: dict[str, int | torch.Tensor] = {n: stage for n in new_params}
        for old, (new_name, flat) in checked.items():
            np_ = new_params[new_name]
            old_bufs = self.state.pop(old)  # freed as we go: the peak is one parameter's old buffers
            c = rescaled.get(new_name, 1.0)
            if isinstance(c, torch.Tensor):  # a factor per entry: the old entries' own, in the old shape
                ref = next(iter(old_bufs.values()))
                c = c.reshape(-1).to(flat.device)[flat].view(ref.shape).to(device=ref.device, dtype=ref.dtype)
            elif float(c) == 1.0:
                c = None
            if c is not None:
                old_bufs = self._convert(old, old_bufs, c)
            for b in self._buffer_powers:
                src = old_bufs[b].reshape(-1).to(device=np_.device, dtype=np_.dtype)
                state[new_name][b].view(-1).index_copy_(0, flat, src)
            del old_bufs, src
            ob = self.birth[old]
            if flat.numel() == np_.numel() and isinstance(ob, int):  # every element old, one stage
                birth[new_name] = ob
                continue
            nb = torch.full((np_.numel(),), stage, dtype=torch.uint8, device=np_.device)
            if isinstance(ob, int):
                nb.index_fill_(0, flat, ob)
            else:
                nb.index_copy_(0, flat, ob.reshape(-1).to(np_.device))
            birth[new_name] = nb.view(np_.shape)
        for n in fresh:
            state[n], birth[n] = self._zero_state(new_params[n]), stage
        self.multipliers = {checked[o][0]: dict(m) for o, m in self.multipliers.items()
                            if o in checked and checked[o][0] not in fresh}
        self.params, self.state, self.birth = new_params, state, birth

    def _compact_births(self) -> None:
        """Births equal over a whole parameter become a plain int; cache the stages present."""
        self._index = {}
        for n, b in list(self.birth.items()):
            if isinstance(b, torch.Tensor):
                present = tuple(int(s) for s in torch.unique(b).tolist())
                if len(present) == 1:
                    self.birth[n] = present[0]
                    self._stages_in[n] = present
                else:
                    self._stages_in[n] = present
            else:
                self._stages_in[n] = (int(b),)

    # -- state dict --
    def state_dict(self) -> dict:
        """Everything the optimizer knows, keyed by parameter name, as tensors and plain Python values
        (loadable with ``torch.load(weights_only=True)``). Tensors are the live buffers, not copies."""
        return {
            "format": _FORMAT,
            "kind": self.kind,
            "hyper": self.hyperparameters(),
            "lr": self.lr,
            "stage": self.stage,
            "stage_steps": list(self.stage_steps),
            "multipliers": {n: dict(m) for n, m in self.multipliers.items()},
            "state": {n: {**self.state[n], "birth": self.birth[n]} for n in self.params},
        }

    @torch.no_grad()
    def load_state_dict(self, sd: Mapping, adopt: bool = False) -> None:
        """Restore a `state_dict` onto this optimizer's parameters (same names and shapes). ``adopt``: keep the
        given tensors themselves where they already have the parameter's device and dtype (the caller gives
        them up: a sharded growth's rows, never held twice), and free the current state first; else copies."""
        if not isinstance(sd, Mapping) or sd.get("format") != _FORMAT:
            got = sd.get("format") if isinstance(sd, Mapping) else type(sd).__name__
            raise ValueError(f"state dict: not a {_FORMAT} optimizer state (got {got!r})")
        if sd["kind"] != self.kind:
            raise ValueError(f"state dict: holds a {sd['kind']!r} optimizer, this one is {self.kind!r}")
        saved = sd["state"]
        missing = [n for n in self.params if n not in saved]
        extra = [n for n in saved if n not in self.params]
        if missing or extra:
            raise ValueError(f"state dict: parameter names differ (missing {missing[:3]}, unexpected {extra[:3]})")
        stage = int(sd["stage"])
        if adopt:  # the state the given tensors replace, freed before they are taken, not after
            self.state = {}
        new_state, new_birth = {}, {}
        for n, p in self.params.items():
            entry = saved[n]
            new_state[n] = {}
            for b in self._buffer_names:
                if b not in entry:
                    raise ValueError(f"state dict: no {n}.{b} (saved by an optimizer with other settings or an "
                                     f"older grow)")
                t = entry[b]
                if tuple(t.shape) != tuple(p.shape):
                    raise ValueError(f"state dict: {n}.{b} has shape {tuple(t.shape)}, the parameter {tuple(p.shape)}")
                new_state[n][b] = t.detach().to(device=p.device, dtype=p.dtype, copy=not adopt).contiguous()
            bt = entry["birth"]
            if isinstance(bt, torch.Tensor):
                if tuple(bt.shape) != tuple(p.shape):
                    raise ValueError(f"state dict: {n}.birth has shape {tuple(bt.shape)}, the parameter {tuple(p.shape)}")
                bt = bt.to(device=p.device, dtype=torch.uint8, copy=not adopt)
            else:
                bt = int(bt)
            new_birth[n] = bt
        self.set_hyperparameters(sd["hyper"])
        self.lr = float(sd["lr"])
        self.stage = stage
        self.stage_steps = [int(x) for x in sd["stage_steps"]]
        self.multipliers = {n: {int(s): float(f) for s, f in m.items()} for n, m in sd["multipliers"].items()}
        self.state, self.birth = new_state, new_birth
        self._compact_births()

    # -- what an update rule defines --
    def hyperparameters(self) -> dict:  # pragma: no cover - abstract
        raise NotImplementedError

    def set_hyperparameters(self, h: Mapping) -> None:  # pragma: no cover - abstract
        raise NotImplementedError

    def _uniform_update(self, names, derived, lr_eff, n, decays) -> None:  # pragma: no cover - abstract
        raise NotImplementedError

    def _mixed_update(self, names, mixed: MixedBatch, decays) -> None:  # pragma: no cover - abstract
        raise NotImplementedError

    def __repr__(self) -> str:
        n = sum(p.numel() for p in self.params.values())
        return (f"{type(self).__name__}({len(self.params)} tensors, {n} elements, stage={self.stage}, "
                f"stage_steps={self.stage_steps}, lr={self.lr:g})")
