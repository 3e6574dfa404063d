"""Growth-aware optimizers (DESIGN §6) and the learning-rate schedule over a whole run.

`GrowthAwareAdamW` and `GrowthAwareSGD` keep, for every parameter element, the *stage it was born
in* (a uint8 per element; a plain int while all elements of a parameter share one stage), and per
stage a step count (``stage_steps[s]`` = optimizer steps taken since stage s began). So that:

* at a growth (`grow`), old slices keep their moments (exp_avg / exp_avg_sq, or the momentum
  buffer) and their birth stage exactly; new elements start at zero with birth stage = the new
  stage, whose step count starts at 0 (``on_growth="keep"``, the default). ``"reset"`` rebuilds a
  fresh state instead (as re-instantiating the optimizer does, G_stack style) for comparison;
* Adam's bias correction of an element uses the step count of its birth stage (Yuan, Savarese &
  Maire, NeurIPS 2023, Appendix C, Table 9: the per-subcomponent "age" vector t, ``t[i]`` starting at 0 for a subcomponent grown
  at stage i). Why it matters: with a *carried* step count t >> 1 the bias corrections are ~1, and a
  new element's first update is ``lr * (1-b1) g / sqrt((1-b2) g^2) = lr * 0.1/sqrt(0.001) = 3.16 lr``
  at betas (0.9, 0.999), peaking at ~6.6 lr at the 12th step of a constant gradient. With its own
  count the first update is ``lr * g / (|g| + eps) <= lr``;
* the learning rate of element e is ``lr * mult[name][birth(e)] * warm(birth(e))``: per-parameter,
  per-stage multipliers (`set_lr_multipliers`, the variance-transfer adaptation of Yuan et al.'s Eq. 5,
  ``eta_k = eta_0 * ||W_dk|| / ||W_d0||``) and an optional linear warmup for elements born after
  stage 0 (``new_warmup_steps``: ``warm = min(1, n / new_warmup_steps)`` at the n-th step of their
  stage; 1 for stage 0 and when 0 = off). Weight decay is scaled by the same element lr.

Weight decay applies to parameters with ``dim >= 2`` only (weight matrices, embeddings and
W_out); biases and norm gains are never decayed. AdamW's decay is decoupled (``p *= 1 - lr *
wd``); SGD's is torch.optim.SGD's coupled L2 (``g += wd * p``) unless
``decoupled_weight_decay=True``.

The learning rate: ``opt.step(lr=...)`` sets ``opt.lr`` and steps (or assign ``opt.lr`` and call
``opt.step()``); `lr_at` gives it as a function of the tokens seen over the whole run, so a growth
never restarts the schedule.

Speed: each step, parameters whose elements all share the same per-stage scalars (one birth stage,
or several stages whose scalars have become equal) are grouped by those scalars and updated by
torch's fused AdamW kernel (``torch._fused_adamw_``, on CUDA and, with torch >= 2.4, on CPU; it
falls back to ``torch._foreach_*`` ops, the same ops as torch's foreach AdamW, where the kernel is
missing or ``fused=False``). Without growth this is the same work as torch's fused AdamW with two
parameter groups. Only parameters whose elements need different scalars take the per-element path:
foreach moment updates, then per tensor the per-stage scalars gathered by birth stage and ~6
elementwise kernels (measured on CPU: ~10x the fused kernel's time for those tensors). The scalars
are compared after rounding to the precision the kernels use (float32 for float32/bf16 tensors), so
equal keys mean identical arithmetic: with betas (0.9, 0.95) all stages' bias corrections round to
the same float32 ~340 steps after a growth (b2^n < 2^-25; ~17k steps at b2 = 0.999), and the grown
tensors are back on the fused path unless their lr multipliers differ.

Parameters must be given by their names in the *unwrapped* model (``model.named_parameters()``,
not a DDP or torch.compile wrapper, whose names carry a ``module.`` / ``_orig_mod.`` prefix);
the names key the growth map, the multipliers and the state dict. A parameter whose ``.grad`` is
None at a step is skipped (its moments do not move), but the stage step counts are global and
advance anyway: every parameter is expected to get a gradient at every step.
"""

from __future__ import annotations

import math
import numbers
import struct
from collections import defaultdict
from collections.abc import Iterable, Mapping

import torch

__all__ = ["GrowthAwareAdamW", "GrowthAwareSGD", "build_optimizer", "lr_at", "LR_SCHEDULES"]

LR_SCHEDULES = ("cosine", "wsd", "constant")
ON_GROWTH = ("keep", "reset")
_FORMAT = "grow.optim/1"


# ---- learning rate over the run ------------------------------------------------------------------


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


# ---- the optimizers ----------------------------------------------------------------------------------


def _f32(x: float) -> float:
    """``x`` rounded to float32, the precision the kernels use for scalars on float32/bf16/fp16 tensors."""
    return struct.unpack("f", struct.pack("f", x))[0]


def _check_number(key: str, value, lo: float | None = None, hi: float | None = None, *, lo_open=False,
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


class _GrowthAware:
    """Shared machinery: names, births, stage step counts, multipliers, growth and state dicts.

    Subclasses define ``kind``, ``_buffer_names``, ``_hyper()`` / ``_set_hyper()``,
    ``_derived(s, scale, decays)``, ``_uniform_update(...)`` and ``_mixed_update(...)``."""

    kind = "base"
    _buffer_names: tuple[str, ...] = ()

    def __init__(self, named_params: Iterable[tuple[str, torch.nn.Parameter]], *, lr: float, weight_decay: float,
                 new_warmup_steps: int):
        self.lr = _check_number("lr", lr, 0.0)
        self.weight_decay = _check_number("weight_decay", weight_decay, 0.0)
        if isinstance(new_warmup_steps, bool) or not isinstance(new_warmup_steps, numbers.Integral) \
                or new_warmup_steps < 0:
            raise ValueError(f"new_warmup_steps={new_warmup_steps!r}: must be an integer >= 0 (0 = off)")
        self.new_warmup_steps = int(new_warmup_steps)
        self.params: dict[str, torch.Tensor] = self._collect(named_params, "named_params")
        self.state: dict[str, dict[str, torch.Tensor]] = {n: self._zero_state(p) for n, p in self.params.items()}
        self.birth: dict[str, int | torch.Tensor] = {n: 0 for n in self.params}
        self._stages_in: dict[str, tuple[int, ...]] = {n: (0,) for n in self.params}
        self.stage = 0
        self.stage_steps: list[int] = [0]
        self.multipliers: dict[str, dict[int, float]] = {}

    # -- construction helpers --
    @staticmethod
    def _collect(named_params, what: str) -> dict[str, torch.Tensor]:
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
        if not out:
            raise ValueError(f"{what}: no trainable parameters")
        return out

    def _zero_state(self, p: torch.Tensor) -> dict[str, torch.Tensor]:
        return {b: torch.zeros_like(p, memory_format=torch.contiguous_format) for b in self._buffer_names}

    def _decays(self, p: torch.Tensor) -> bool:
        return self.weight_decay != 0.0 and p.dim() >= 2

    # -- per-stage scalars --
    def _warm(self, s: int) -> float:
        if s == 0 or self.new_warmup_steps == 0:
            return 1.0
        return min(1.0, self.stage_steps[s] / self.new_warmup_steps)

    def _scale(self, name: str, s: int) -> float:
        m = self.multipliers.get(name)
        return (1.0 if m is None else m.get(s, 1.0)) * self._warm(s)

    # -- public API --
    def birth_stage(self, name: str) -> torch.Tensor:
        """The birth stage of every element of parameter ``name`` (uint8, the parameter's shape)."""
        b = self.birth[name]
        if isinstance(b, torch.Tensor):
            return b
        p = self.params[name]
        return torch.full(p.shape, b, dtype=torch.uint8, device=p.device)

    def zero_grad(self, set_to_none: bool = True) -> None:
        for p in self.params.values():
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
                staged.setdefault(name, {})[int(s)] = _check_number(f"multipliers[{name!r}][{s}]", f, 0.0)
        for name, per_stage in staged.items():
            self.multipliers.setdefault(name, {}).update(per_stage)

    def clear_lr_multipliers(self) -> None:
        self.multipliers = {}

    @torch.no_grad()
    def step(self, lr: float | None = None) -> None:
        """One update of every parameter with a gradient, at learning rate ``lr`` (or ``self.lr``).

        Parameters are grouped by the scalars their kernels will use (rounded to the parameter's
        compute precision, so equal keys mean identical arithmetic): a parameter whose stages all
        give the same scalars joins a fast foreach/fused group; the others take the per-element path."""
        if lr is not None:
            self.lr = _check_number("lr", lr, 0.0)
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
                mixed[(p.device, p.dtype, decays)].append((name, stages, ders))
        for key, names in uniform.items():
            lr_eff, n = meta[key]
            self._uniform_update(names, key[3], lr_eff, n, key[2])
        for (_, _, decays), entries in mixed.items():
            self._mixed_update([e[0] for e in entries], self._gathered(entries), decays)

    def _derived(self, s: int, scale: float, decays: bool) -> tuple[float, ...]:  # pragma: no cover - abstract
        """The scalars the update kernels use for elements born at stage ``s`` with lr multiplier ``scale``."""
        raise NotImplementedError

    def _lists(self, names: list[str]):
        ps = [self.params[n] for n in names]
        gs = [p.grad for p in ps]
        bufs = [[self.state[n][b] for n in names] for b in self._buffer_names]
        return ps, gs, bufs

    def _gathered(self, entries) -> list[list[torch.Tensor | float]]:
        """Per mixed parameter, per derived scalar: the scalar of each element's birth stage (p's shape),
        or a plain float where all the parameter's stages share that scalar (no gather needed).

        One small (n_params, n_stages, n_scalars) table goes to the device per step (pinned and
        non-blocking on CUDA: no host sync); each parameter then gathers the columns that differ by
        birth stage."""
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
        table = host.to(device=p0.device, non_blocking=True).to(dtype)
        out = []
        for i, (name, _, ders) in enumerate(entries):
            p = self.params[name]
            idx = None
            cols: list[torch.Tensor | float] = []
            for c in range(width):
                if all(d[c] == ders[0][c] for d in ders[1:]):
                    cols.append(ders[0][c])
                    continue
                if idx is None:
                    idx = self.birth[name].reshape(-1).to(torch.int32)
                cols.append(torch.index_select(table[i, :, c].contiguous(), 0, idx).view(p.shape))
            out.append(cols)
        return out

    # -- growth --
    @torch.no_grad()
    def grow(self, new_named_params: Iterable[tuple[str, torch.nn.Parameter]],
             param_map: Mapping[str, tuple[str, torch.Tensor]], stage: int, on_growth: str = "keep",
             fresh: Iterable[str] = (), rescaled: Mapping[str, float] | None = None) -> None:
        """Move the optimizer onto the grown model's parameters, entering stage ``stage``.

        ``param_map[old_name] = (new_name, positions)``: ``positions`` (integer tensor, the old
        parameter's shape) holds, for each old element, its flat index in the new parameter. Every
        old parameter must be mapped, to distinct new parameters, at distinct positions.

        ``keep``: mapped elements keep their buffers and birth stage exactly; every other element
        (and every new parameter no old one maps to, e.g. an inserted layer) starts with zero
        buffers and birth stage ``stage``, whose step count starts at 0. Multipliers follow the map.
        ``reset``: a fresh state, as a newly built optimizer would have: zero buffers, every element
        born at ``stage`` (one step count, from 0), no multipliers. ``fresh``: new parameters that
        restart as if entirely new under ``keep`` too (their old entries were rewritten in a new
        basis, e.g. svd's refactor mode), so stale moments do not drive them. ``rescaled``
        (`grow.growth.GrowthResult.rescaled`): ``{new_name: c}`` where the growth stored every old
        entry of ``new_name`` x c and reads it x 1/c, so its gradients are x 1/c from now on; the
        kept buffers move into those units, each divided by c to its power (AdamW: exp_avg / c,
        exp_avg_sq / c^2; SGD: momentum / c), as if the gradients seen so far had been taken in the
        new parameterization."""
        if on_growth not in ON_GROWTH:
            raise ValueError(f"on_growth={on_growth!r}: must be one of {', '.join(ON_GROWTH)}")
        if isinstance(stage, bool) or not isinstance(stage, numbers.Integral) or not self.stage < stage <= 255:
            raise ValueError(f"stage={stage!r}: must be an integer in ({self.stage}, 255] (after the current stage "
                             f"{self.stage}; stage ids are uint8)")
        stage, fresh = int(stage), set(fresh)
        new_params = self._collect(new_named_params, "new_named_params")
        rescaled = dict(rescaled or {})
        for name, c in rescaled.items():
            if name not in new_params:
                raise ValueError(f"rescaled[{name!r}]: no such parameter in new_named_params")
            _check_number(f"rescaled[{name!r}]", c, 0.0, lo_open=True)
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
                if torch.unique(flat).numel() != flat.numel():
                    raise ValueError(f"param_map[{old!r}]: two old elements map to the same position of {new_name!r}")
            checked[old] = (new_name, flat)

        if on_growth == "reset":
            self.params = new_params
            self.state = {n: self._zero_state(p) for n, p in new_params.items()}
            self.birth = {n: stage for n in new_params}
            self._stages_in = {n: (stage,) for n in new_params}
            self.multipliers = {}
        else:
            state, birth = {}, {}
            for n, p in new_params.items():
                state[n] = self._zero_state(p)
                birth[n] = stage
            for old, (new_name, flat) in checked.items():
                np_ = new_params[new_name]
                old_bufs = self.state.pop(old)  # freed as we go: the peak is one parameter's old buffers
                c = float(rescaled.get(new_name, 1.0))
                for b in self._buffer_names:
                    src = old_bufs[b].reshape(-1).to(device=np_.device, dtype=np_.dtype)
                    if c != 1.0:
                        src = src / c ** self._buffer_powers[b]
                    state[new_name][b].view(-1).index_copy_(0, flat, src)
                del old_bufs, src
                ob = self.birth[old]
                if flat.numel() == np_.numel():  # every element is old: births move along
                    if isinstance(ob, int):
                        birth[new_name] = ob
                    else:
                        nb = torch.empty(np_.numel(), dtype=torch.uint8, device=np_.device)
                        nb.index_copy_(0, flat, ob.reshape(-1).to(np_.device))
                        birth[new_name] = nb.view(np_.shape)
                else:
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
            self._compact_births()
        self.stage = stage
        self.stage_steps = self.stage_steps + [0] * (stage + 1 - len(self.stage_steps))

    def _compact_births(self) -> None:
        """Births equal over a whole parameter become a plain int; cache the stages present."""
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
            "hyper": self._hyper(),
            "lr": self.lr,
            "stage": self.stage,
            "stage_steps": list(self.stage_steps),
            "multipliers": {n: dict(m) for n, m in self.multipliers.items()},
            "state": {n: {**self.state[n], "birth": self.birth[n]} for n in self.params},
        }

    @torch.no_grad()
    def load_state_dict(self, sd: Mapping) -> None:
        """Restore a `state_dict` onto this optimizer's parameters (same names and shapes)."""
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
        new_state, new_birth = {}, {}
        for n, p in self.params.items():
            entry = saved[n]
            new_state[n] = {}
            for b in self._buffer_names:
                t = entry[b]
                if tuple(t.shape) != tuple(p.shape):
                    raise ValueError(f"state dict: {n}.{b} has shape {tuple(t.shape)}, the parameter {tuple(p.shape)}")
                new_state[n][b] = t.detach().to(device=p.device, dtype=p.dtype, copy=True).contiguous()
            bt = entry["birth"]
            if isinstance(bt, torch.Tensor):
                if tuple(bt.shape) != tuple(p.shape):
                    raise ValueError(f"state dict: {n}.birth has shape {tuple(bt.shape)}, the parameter {tuple(p.shape)}")
                bt = bt.to(device=p.device, dtype=torch.uint8, copy=True)
            else:
                bt = int(bt)
            new_birth[n] = bt
        self._set_hyper(sd["hyper"])
        self.lr = float(sd["lr"])
        self.stage = stage
        self.stage_steps = [int(x) for x in sd["stage_steps"]]
        self.multipliers = {n: {int(s): float(f) for s, f in m.items()} for n, m in sd["multipliers"].items()}
        self.state, self.birth = new_state, new_birth
        self._compact_births()

    def _hyper(self) -> dict:  # pragma: no cover - abstract
        raise NotImplementedError

    def _set_hyper(self, h: Mapping) -> None:  # pragma: no cover - abstract
        raise NotImplementedError

    def _uniform_update(self, names, derived, lr_eff, n, decays) -> None:  # pragma: no cover - abstract
        raise NotImplementedError

    def _mixed_update(self, names, gathered, decays) -> None:  # pragma: no cover - abstract
        raise NotImplementedError

    def __repr__(self) -> str:
        n = sum(p.numel() for p in self.params.values())
        return (f"{type(self).__name__}({len(self.params)} tensors, {n} elements, stage={self.stage}, "
                f"stage_steps={self.stage_steps}, lr={self.lr:g})")


class GrowthAwareAdamW(_GrowthAware):
    """AdamW with per-element birth stages and per-stage step counts (see the module docstring).

    ``GrowthAwareAdamW(model.named_parameters(), lr=1e-3, betas=(0.9, 0.999), eps=1e-8,
    weight_decay=0.01, new_warmup_steps=0, fused=None)``. ``fused=None``: torch's fused AdamW
    kernel on CUDA and CPU where this torch has it (else foreach ops, silently); ``True``: the fused
    kernel, an error where it is missing; ``False``: foreach ops (bitwise torch's foreach/for-loop
    AdamW on CPU). Without growth the update is torch.optim.AdamW's with weight decay on the ``dim
    >= 2`` parameters only.
    """

    kind = "adamw"
    _buffer_names = ("exp_avg", "exp_avg_sq")
    _buffer_powers = {"exp_avg": 1, "exp_avg_sq": 2}  # units: gradient, gradient^2

    def __init__(self, named_params, lr: float = 1e-3, betas=(0.9, 0.999), eps: float = 1e-8,
                 weight_decay: float = 0.01, *, new_warmup_steps: int = 0, fused: bool | None = None):
        self._set_hyper({"betas": betas, "eps": eps, "fused": fused})
        super().__init__(named_params, lr=lr, weight_decay=weight_decay, new_warmup_steps=new_warmup_steps)

    def _set_hyper(self, h: Mapping) -> None:
        betas = h["betas"]
        if not (isinstance(betas, (tuple, list)) and len(betas) == 2):
            raise ValueError(f"betas={betas!r}: must be two numbers in [0, 1)")
        b1 = _check_number("betas[0]", betas[0], 0.0, 1.0, hi_open=True)
        b2 = _check_number("betas[1]", betas[1], 0.0, 1.0, hi_open=True)
        self.betas = (b1, b2)
        self.eps = _check_number("eps", h["eps"], 0.0)
        fused = h.get("fused")
        if fused not in (None, True, False):
            raise ValueError(f"fused={fused!r}: must be None (auto), True or False")
        self.fused = fused
        self._fused_ok: dict[str, bool] = {}
        if "weight_decay" in h:
            self.weight_decay = _check_number("weight_decay", h["weight_decay"], 0.0)
        if "new_warmup_steps" in h:
            self.new_warmup_steps = int(h["new_warmup_steps"])

    def _hyper(self) -> dict:
        return {"betas": list(self.betas), "eps": self.eps, "weight_decay": self.weight_decay,
                "new_warmup_steps": self.new_warmup_steps, "fused": self.fused}

    def _derived(self, s: int, scale: float, decays: bool) -> tuple[float, float, float]:
        n = self.stage_steps[s]
        b1, b2 = self.betas
        a = self.lr * scale
        decay = 1 - a * self.weight_decay if decays else 1.0
        # as torch's AdamW: step_size = lr / (1 - b1^n), denominator sqrt(v) / sqrt(1 - b2^n) + eps
        return ((a / (1 - b1 ** n)) * -1, (1 - b2 ** n) ** 0.5, decay)

    def _try_fused(self, ps, gs, ms, vs, lr_eff: float, n: int, decays: bool) -> bool:
        """torch's fused AdamW kernel on a uniform group; False where it is off or unavailable."""
        dev = ps[0].device.type
        if self.fused is False or (self.fused is None and dev not in ("cuda", "cpu")) \
                or not hasattr(torch, "_fused_adamw_") or not self._fused_ok.get(dev, True):
            return False
        b1, b2 = self.betas
        step = torch.full((), float(n), dtype=torch.float32, device=ps[0].device)
        try:
            torch._fused_adamw_(ps, gs, ms, vs, [], [step] * len(ps), lr=lr_eff, beta1=b1, beta2=b2,
                                weight_decay=self.weight_decay if decays else 0.0, eps=self.eps, amsgrad=False,
                                maximize=False, grad_scale=None, found_inf=None)
        except (RuntimeError, NotImplementedError):
            if self.fused:
                raise
            self._fused_ok[dev] = False  # e.g. torch < 2.4 has no CPU kernel: foreach from now on
            return False
        return True

    def _uniform_update(self, names, derived, lr_eff, n, decays) -> None:
        neg_step, bc2_sqrt, decay = derived
        b1, b2 = self.betas
        ps, gs, (ms, vs) = self._lists(names)
        if self._try_fused(ps, gs, ms, vs, lr_eff, n, decays):
            return
        if decays and decay != 1.0:
            torch._foreach_mul_(ps, decay)
        torch._foreach_lerp_(ms, gs, 1 - b1)
        torch._foreach_mul_(vs, b2)
        torch._foreach_addcmul_(vs, gs, gs, 1 - b2)
        denom = torch._foreach_sqrt(vs)
        torch._foreach_div_(denom, bc2_sqrt)
        torch._foreach_add_(denom, self.eps)
        torch._foreach_addcdiv_(ps, ms, denom, neg_step)

    def _mixed_update(self, names, gathered, decays) -> None:
        b1, b2 = self.betas
        ps, gs, (ms, vs) = self._lists(names)
        torch._foreach_lerp_(ms, gs, 1 - b1)
        torch._foreach_mul_(vs, b2)
        torch._foreach_addcmul_(vs, gs, gs, 1 - b2)
        for p, m, v, (neg_step, bc2_sqrt, decay) in zip(ps, ms, vs, gathered):
            if decays:
                p.mul_(decay)
            denom = v.sqrt().div_(bc2_sqrt).add_(self.eps)
            if isinstance(neg_step, torch.Tensor):  # p += m / (denom / neg_step), as torch's capturable path
                p.addcdiv_(m, denom.div_(neg_step))
            else:
                p.addcdiv_(m, denom, value=neg_step)


class GrowthAwareSGD(_GrowthAware):
    """SGD with momentum (the setting of Yuan et al.'s experiments), per-element birth stages and per-stage lr multipliers.

    ``GrowthAwareSGD(model.named_parameters(), lr=0.1, momentum=0.9, weight_decay=5e-4,
    nesterov=False, decoupled_weight_decay=False, new_warmup_steps=0)``. The update is
    torch.optim.SGD's (dampening 0): ``g += wd * p`` (``dim >= 2`` parameters only; or ``p *= 1 - lr
    * wd`` when ``decoupled_weight_decay``), ``buf = momentum * buf + g``, ``p -= lr * buf`` (Nesterov:
    ``p -= lr * (g + momentum * buf)``). A new element's buffer starts at 0, so its first update is
    ``lr * g``, as torch's first step. SGD has no bias correction: births only select multipliers
    and the new-element warmup.
    """

    kind = "sgd"
    _buffer_names = ("momentum_buffer",)
    _buffer_powers = {"momentum_buffer": 1}

    def __init__(self, named_params, lr: float = 0.1, momentum: float = 0.9, weight_decay: float = 0.0, *,
                 nesterov: bool = False, decoupled_weight_decay: bool = False, new_warmup_steps: int = 0):
        self._set_hyper({"momentum": momentum, "nesterov": nesterov, "decoupled_weight_decay": decoupled_weight_decay})
        super().__init__(named_params, lr=lr, weight_decay=weight_decay, new_warmup_steps=new_warmup_steps)

    def _set_hyper(self, h: Mapping) -> None:
        self.momentum = _check_number("momentum", h["momentum"], 0.0, 1.0, hi_open=True)
        for key in ("nesterov", "decoupled_weight_decay"):
            if not isinstance(h[key], bool):
                raise ValueError(f"{key}={h[key]!r}: must be true or false")
        if h["nesterov"] and self.momentum == 0:
            raise ValueError("nesterov=True: needs momentum > 0")
        self.nesterov, self.decoupled_weight_decay = h["nesterov"], h["decoupled_weight_decay"]
        if "weight_decay" in h:
            self.weight_decay = _check_number("weight_decay", h["weight_decay"], 0.0)
        if "new_warmup_steps" in h:
            self.new_warmup_steps = int(h["new_warmup_steps"])

    def _hyper(self) -> dict:
        return {"momentum": self.momentum, "nesterov": self.nesterov,
                "decoupled_weight_decay": self.decoupled_weight_decay, "weight_decay": self.weight_decay,
                "new_warmup_steps": self.new_warmup_steps}

    def _derived(self, s: int, scale: float, decays: bool) -> tuple[float, float]:
        a = self.lr * scale
        return (a, 1 - a * self.weight_decay if decays and self.decoupled_weight_decay else 1.0)

    def _direction(self, ps, gs, bufs, decays):
        """Momentum update of ``bufs``; returns the update directions (before the lr)."""
        if decays and not self.decoupled_weight_decay:
            gs = torch._foreach_add(gs, ps, alpha=self.weight_decay)
        if self.momentum == 0.0:
            return gs
        torch._foreach_mul_(bufs, self.momentum)
        torch._foreach_add_(bufs, gs)
        if self.nesterov:
            return torch._foreach_add(gs, bufs, alpha=self.momentum)
        return bufs

    def _uniform_update(self, names, derived, lr_eff, n, decays) -> None:
        lr, decay = derived
        ps, gs, (bufs,) = self._lists(names)
        if decay != 1.0:
            torch._foreach_mul_(ps, decay)
        d = self._direction(ps, gs, bufs, decays)
        torch._foreach_add_(ps, d, alpha=-lr)

    def _mixed_update(self, names, gathered, decays) -> None:
        ps, gs, (bufs,) = self._lists(names)
        if decays and self.decoupled_weight_decay:
            for p, (_, decay) in zip(ps, gathered):
                p.mul_(decay)
        d = self._direction(ps, gs, bufs, decays)
        for p, di, (lr, _) in zip(ps, d, gathered):
            if isinstance(lr, torch.Tensor):
                p.sub_(di * lr)
            else:
                p.sub_(di, alpha=lr)


# ---- from the config ------------------------------------------------------------------------------


def build_optimizer(model: torch.nn.Module, o) -> _GrowthAware:
    """The optimizer of the ``optim`` config (`grow.config.OptimConfig`, read by attribute) for ``model``.

    Reads ``name`` (adamw | sgd), ``lr``, ``weight_decay``, ``new_warmup_steps``; adamw: ``betas``,
    ``eps``, ``fused`` (None = auto); sgd: ``momentum``, ``nesterov``, ``decoupled_weight_decay``
    (false = torch.optim.SGD's coupled L2). The schedule keys (``schedule``, ``warmup``, ...) belong to
    `lr_at`, ``on_growth`` to `grow`."""
    common = {"lr": float(o.lr), "weight_decay": float(o.weight_decay), "new_warmup_steps": int(o.new_warmup_steps or 0)}
    params = model.named_parameters()
    if o.name == "adamw":
        return GrowthAwareAdamW(params, betas=(float(o.betas[0]), float(o.betas[1])), eps=float(o.eps), fused=o.fused,
                                **common)
    if o.name == "sgd":
        return GrowthAwareSGD(params, momentum=float(o.momentum), nesterov=bool(o.nesterov),
                              decoupled_weight_decay=bool(o.decoupled_weight_decay), **common)
    raise ValueError(f"optim.name={o.name!r}: must be adamw or sgd")
