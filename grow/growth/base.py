"""The strategy interface, the registry, and the objects an expansion hands to a strategy.

`grow` grows one dimension at a time in `ORDER` (h, k, v, p, E, N); each expansion of
`grow.growth.expand` places the old entries (with the rescalings that belong to the transformation),
describes the new ones as `Site`s of `Slot`s for ``strategy.fill``, and checks that every new entry
was filled (docs/model.md, "The six expansions"). The `Strategy` hooks and how to add one: docs/strategies.md.
"""

from __future__ import annotations

import copy
import hashlib
import importlib
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable, ClassVar, Iterable, Mapping

import torch

from grow import plugins
from grow.errors import CONFIG_DIR, ConfigError, check_number
from grow.model import Transformer, TransformerConfig, init_like

# Dimension keys in Gesmundo & Maile's notation -> TransformerConfig fields.
DIMS: dict[str, str] = {
    "h": "d_model",
    "k": "d_qk",
    "v": "d_v",
    "p": "d_ff",
    "E": "n_heads",
    "N": "n_layers",
    "X": "n_experts",  # experts of a layer's feed-forward (no letter in Gesmundo & Maile; grow.growth.experts)
}
# experts last: a dense model grows as dense, then is upcycled
ORDER: tuple[str, ...] = ("h", "k", "v", "p", "E", "N", "X")
# Config fields a growth cannot change (the function would change, or nothing could map it).
FIXED_FIELDS: tuple[str, ...] = (
    "vocab_size",
    "seq_len",
    "activation",
    "positions",
    "rope_theta",
    "n_kv_heads",
    "mlp_bias",
    "tie_embeddings",
    "norm_eps",
    "family",  # ... and the family's flags (grow.families)
    "qkv_bias",
    "qk_norm",
    "qk_norm_eps",
    "sliding_window",
    "embed_scale",
    "rope_factor",
    "rope_low_freq_factor",
    "rope_high_freq_factor",
    "rope_original_positions",
)

ParamMap = dict  # dict[str, tuple[str, torch.LongTensor]]


# ---------------------------------------------------------------------------------------------
# What grow() returns
# ---------------------------------------------------------------------------------------------
@dataclass
class GrowthResult:
    """What `grow.growth.grow` returns: the grown ``model`` (``.config == target_cfg``), ``param_map``
    ``{old_name: (new_name, idx)}`` and the rest; each field's contract: docs/strategies.md, "`GrowthResult`'s contracts"."""

    model: Transformer
    param_map: ParamMap
    metrics: dict[str, float] = field(default_factory=dict)
    flops: float = 0.0
    state: Any = None
    lr_multipliers: dict[str, dict[int, float]] | None = None
    fresh: set[str] = field(default_factory=set)
    rescaled: dict = field(default_factory=dict)


def held(model: torch.nn.Module) -> torch.Tensor | None:
    """A parameter ``model`` holds: not on the meta device, where a unit's growth leaves the others (docs/distributed.md, "FSDP2")."""
    return next((p for p in model.parameters() if not p.is_meta), None)


def identity_map(model: torch.nn.Module) -> ParamMap:
    """The param map of "no change": every parameter to itself, element i to position i."""
    return {
        name: (name, torch.arange(p.numel(), device=p.device).view(p.shape))
        for name, p in model.named_parameters()
    }


def compose_maps(first: ParamMap, second: ParamMap) -> ParamMap:
    """The map of ``first`` followed by ``second``: index the second map with the first."""
    out = {}
    for old, (mid, idx1) in first.items():
        new, idx2 = second[mid]
        out[old] = (new, idx2.reshape(-1)[idx1])
    return out


def new_entry_mask(param_map: ParamMap, model: torch.nn.Module) -> dict[str, torch.Tensor]:
    """``{name: BoolTensor}`` for every parameter of the grown ``model``: True where the entry is new."""
    params = dict(model.named_parameters())
    masks = {name: torch.ones(p.shape, dtype=torch.bool, device=p.device) for name, p in params.items()}
    for new, idx in param_map.values():
        masks[new].view(-1)[idx.reshape(-1)] = False
    return masks


# ---------------------------------------------------------------------------------------------
# What an expansion hands to a strategy
# ---------------------------------------------------------------------------------------------
@dataclass
class Slot:
    """One parameter of a `Site`, seen along the growing ``axis``: ``tensor`` is the whole new parameter
    (new entries NaN until filled); ``old_idx`` / ``new_idx`` are positions along ``axis``, (G, U_old, w) / (G, U_new, w)."""

    name: str
    tensor: torch.Tensor
    axis: int
    old_idx: torch.Tensor
    new_idx: torch.Tensor
    role: str
    zero: bool
    init_scale: float = 1.0
    module: str | None = None  # the owning Linear, for its forward multiplier
    key: str = ""  # the name without ``layers.n.``, e.g. "attn.q.weight"

    def _view(self) -> torch.Tensor:
        return self.tensor.movedim(self.axis, 0)

    def get(self, idx: torch.Tensor) -> torch.Tensor:
        """Entries at unit positions ``idx`` (G, U, w): a copy of shape (G, U, w, *rest)."""
        return self._view()[idx]

    def set(self, idx: torch.Tensor, values) -> None:
        """Write ``values`` (broadcastable to (G, U, w, *rest)) at unit positions ``idx``."""
        view = self._view()
        if not torch.is_tensor(values):
            values = torch.as_tensor(values, dtype=view.dtype, device=view.device)
        view[idx] = values.to(dtype=view.dtype, device=view.device).expand(*idx.shape, *view.shape[1:])

    def new_shape(self) -> tuple[int, ...]:
        """Shape of ``get(new_idx)``."""
        return tuple(self.new_idx.shape) + tuple(self._view().shape[1:])

    def old_shape(self) -> tuple[int, ...]:
        return tuple(self.old_idx.shape) + tuple(self._view().shape[1:])


@dataclass
class Site:
    """The new entries one expansion creates in one layer (``layer``; None for h, the whole model).

    ``groups`` G; ``n_old`` / ``n_new`` units per group (N: 0 and 1); ``mults`` every Linear's forward
    multiplier by module name, which a strategy may change (Yuan et al.'s compensation)."""

    dim: str
    layer: int | None
    groups: int
    n_old: int
    n_new: int
    old_size: int
    new_size: int
    slots: list[Slot]
    mults: dict[str, float]

    def slot(self, key: str) -> Slot:
        """The slot whose ``key`` (or full name) is ``key``, e.g. ``site.slot("attn.q.weight")``."""
        for s in self.slots:
            if s.key == key or s.name == key:
                return s
        raise KeyError(f"no slot {key!r} in this {self.dim} site (have {[s.key for s in self.slots]})")


@dataclass(frozen=True)
class Passes:
    """How a strategy's own passes on the model run (svd's): under autocast ``amp``, ``reduce`` summing
    tensors over the ranks in place (None: none / one process)."""

    amp: torch.dtype | None = None
    reduce: Callable[[list[torch.Tensor]], None] | None = None


@dataclass
class GrowthContext:
    """Everything a strategy may read or write during one `grow` call."""

    source: TransformerConfig  # the input model's config
    target: TransformerConfig  # the config being grown to
    model: Transformer  # the current model: the input, then each intermediate one
    batches: list  # (inputs, targets) tuples
    generator: torch.Generator | None
    stage: int | None
    state: Any  # in: the previous growth's; out: this one's
    metrics: dict[str, float] = field(default_factory=dict)
    flops: float = 0.0
    lr_multipliers: dict[str, dict[int, float]] | None = None
    amp: torch.dtype | None = None  # see Passes
    reduce: Callable[[list[torch.Tensor]], None] | None = None
    fresh: set = field(default_factory=set)  # see GrowthResult
    # keyed by the current model's names: grow renames it after each expansion and multiplies in ``expansion_scales``
    rescaled: dict = field(default_factory=dict)
    expansion_scales: dict = field(default_factory=dict)
    dim: str = ""  # "setup", one of ORDER, "finish": part of every draw's key (`stream`)
    # a unit's growth: the new layers it computes (None: all; the rest stay on the meta device, docs/distributed.md, "FSDP2")
    new_layers: set | None = None
    unit_device: torch.device | None = None
    _streams: dict = field(default_factory=dict, repr=False)

    @property
    def device(self) -> torch.device:
        """Where the model's tensors are (a unit's growth: the unit's device)."""
        return self.unit_device or next(self.model.parameters()).device

    @property
    def dtype(self) -> torch.dtype:
        return next(self.model.parameters()).dtype

    def stream(self, key: str) -> torch.Generator | None:
        """The generator of the draws for ``key`` (a grown parameter's name) in this expansion, seeded from
        ``generator``'s seed, `dim` and ``key`` (docs/strategies.md, "Random draws"); None without a ``generator``."""
        if not isinstance(key, str) or not key:
            raise ValueError(f"GrowthContext.stream: key={key!r}: must be a non-empty string (the drawn "
                             "tensor's name), so a unit grown alone draws what the whole growth draws")
        if self.generator is None:
            return None
        gen = self._streams.get((self.dim, key))
        if gen is None:
            text = f"{self.generator.initial_seed()}/{self.dim}/{key}"
            seed = int.from_bytes(hashlib.blake2b(text.encode(), digest_size=8).digest(), "little") >> 1
            gen = self._streams[(self.dim, key)] = torch.Generator().manual_seed(seed)
        return gen

    def randn(self, shape, std: float = 1.0, *, key: str) -> torch.Tensor:
        """N(0, std^2) on the model's device and dtype, drawn from ``stream(key)``."""
        gen = self.stream(key)
        device = self.device if gen is None else gen.device  # drawn on the stream's CPU: alike on any device
        return torch.randn(shape, generator=gen, dtype=self.dtype, device=device).to(self.device) * std

    def rand(self, shape, *, key: str) -> torch.Tensor:
        """U[0, 1) on the model's device and dtype, drawn from ``stream(key)``."""
        gen = self.stream(key)
        device = self.device if gen is None else gen.device
        return torch.rand(shape, generator=gen, dtype=self.dtype, device=device).to(self.device)

    def init(self, name: str, shape) -> torch.Tensor:
        """Fresh values from the model's own initializer for parameter ``name`` (target config)."""
        return init_like(
            self.target, name, shape, dtype=self.dtype, device=self.device, generator=self.stream(name)
        )


# ---------------------------------------------------------------------------------------------
# The strategy base class and the registry
# ---------------------------------------------------------------------------------------------
class Strategy:
    """Decides the values of a growth's new (and, if it wants, rescaled old) entries; the base class is
    the ``zero`` rule. Options: the keys of ``configs/strategy/<name>.yaml``, checked by ``__init__``
    (docs/strategies.md, "Growth strategies")."""

    name: ClassVar[str] = "base"
    defaults: ClassVar[dict[str, Any]] = {}  # the options of a strategy without a YAML (a plugin's)
    # the dimensions it grows by its own rule; the others go to `delegate` (`Run.strategy_warnings` warns if none grows)
    own_dims: ClassVar[tuple[str, ...]] = ORDER
    # the options under which it is exactly function-preserving (tested in float64), or None (random, stack)
    exact_with: ClassVar[dict[str, Any] | None] = {}
    # a growth that trains (ligo): steps after a growth in its source's plan, so `make bench` weighs its
    # growth share against stages that long, not a 4-minute run's (docs/bench.md)
    reference_training_steps: ClassVar[int | None] = None

    def __init__(self, **options):
        defaults = self.option_defaults()
        unknown = sorted(set(options) - set(defaults))
        if unknown:
            allowed = ", ".join(sorted(defaults)) or "none"
            raise ConfigError(f"strategy.{unknown[0]}", options[unknown[0]],
                              f"not an option of strategy {self.name}; allowed: {allowed}")
        self.options = {**defaults, **options}

    @classmethod
    def option_defaults(cls) -> dict[str, Any]:
        """Every option with its default: the strategy's YAML (`yaml_options`), over the class's ``defaults``."""
        return {**copy.deepcopy(cls.defaults), **yaml_options(cls.name)}

    def number_option(self, key: str, lo: float | None = None, hi: float | None = None, **open_ends) -> float:
        """The option ``key`` as a finite number in [lo, hi] (`grow.errors.check_number`), else `bad_option`'s refusal."""
        try:
            return check_number(key, self.options[key], lo, hi, **open_ends)
        except ConfigError as exc:
            raise self.bad_option(key, exc.value, exc.allowed) from None

    def bad_option(self, key: str, value, allowed: str) -> ConfigError:
        """The one-line refusal of the option ``strategy.<key>=<value>``, for `__init__` to raise."""
        return ConfigError(f"strategy.{key}", value, f"{allowed} (strategy {self.name})")

    def delegate(self) -> str:
        """The strategy that grows the dimensions outside `own_dims`: the ``base`` option, else zero."""
        return str(self.options.get("base", "zero"))

    def __repr__(self) -> str:
        opts = ", ".join(f"{k}={v!r}" for k, v in self.options.items())
        return f"{type(self).__name__}({opts})"

    # ---- hooks ------------------------------------------------------------------------------
    def check(self, run) -> None:
        """Refuse with a one-line `ConfigError`, before any work, a setting of ``run`` (a `grow.run.Run`)
        this strategy cannot train; after the shared checks. Default: its ``base`` strategy's."""
        base = getattr(self, "base", None)
        if isinstance(base, Strategy):
            base.check(run)

    def plan_note(self, run) -> str | None:
        """One line ``grow schedule`` prints under the plan of ``run`` (the strategy's own passes and their
        share of the training FLOPs, say), or None. Default: none."""
        return None

    def batches_needed(self) -> int:
        """Growth batches every growth trains on (ligo's operator); trainer.growth_batches must hold them."""
        return 0

    def check_transition(self, source: TransformerConfig, target: TransformerConfig) -> None:
        """Raise ValueError if this strategy cannot grow ``source`` into ``target`` (every stage boundary,
        before any work). Default: `check_growth`."""
        check_growth(source, target)

    # the option `layer_positions` reads, for the config check's one line
    layer_position_key: ClassVar[str] = "layer_position"

    def layer_positions(self, source: TransformerConfig, target: TransformerConfig):
        """Where `grow` inserts the new layers: the ``where`` of `grow.growth.expand.layer_positions`.
        Default: the ``layer_position`` option, else "end"."""
        return self.options.get("layer_position", "end")

    def parameterization(self) -> str | None:
        """The parameterization `initialize` puts a model in (vt: its Table 1), its ``base``'s, or None (the
        model's own); `grow compare` trains a baseline in each (``init=strategy``)."""
        base = getattr(self, "base", None)
        return base.parameterization() if isinstance(base, Strategy) else None

    def initialize(self, model: Transformer, generator: torch.Generator | None = None) -> None:
        """Re-initialize the stage-0 model of a growth run into `parameterization`, before training. Default: keep it."""

    def setup(self, ctx: GrowthContext) -> None:
        """Once, before any expansion."""

    def before_expansion(self, ctx: GrowthContext, dim: str) -> None:
        """Once per grown dimension, before its sites are filled (``ctx.model`` not yet grown)."""

    def fill(self, ctx: GrowthContext, site: Site) -> None:
        """Fill every new entry of ``site`` from `constrained_values` or `free_values`."""
        for slot in site.slots:
            if slot.new_idx.numel() == 0:
                continue
            if slot.zero:
                values = self.constrained_values(ctx, site, slot)
            else:
                values = self.free_values(ctx, site, slot)
            slot.set(slot.new_idx, values)

    def free_values(self, ctx: GrowthContext, site: Site, slot: Slot) -> torch.Tensor:
        """Free entries: the model's initializer times ``slot.init_scale``."""
        values = ctx.init(slot.name, slot.new_shape())
        return values if slot.init_scale == 1.0 else values * slot.init_scale

    def constrained_values(self, ctx: GrowthContext, site: Site, slot: Slot) -> torch.Tensor:
        """Entries under Gesmundo & Maile's function-preserving constraint: zero."""
        return torch.zeros(slot.new_shape(), dtype=slot.tensor.dtype, device=slot.tensor.device)

    def router_values(self, ctx: GrowthContext, name: str, shape) -> torch.Tensor:
        """The router ``name`` (X' x h) a dense layer gets when it becomes X' experts: free (the experts are
        copies), from the model's initializer."""
        return ctx.init(name, shape)

    def after_expansion(self, ctx: GrowthContext, dim: str, model: Transformer, param_map: ParamMap) -> None:
        """Once per grown dimension, with the grown model and that expansion's param map."""

    def finish(self, ctx: GrowthContext, model: Transformer, param_map: ParamMap) -> None:
        """Once at the end, with the final model and the composed param map."""

    def rewrote(self, ctx: GrowthContext, weights: dict[str, torch.Tensor]) -> None:
        """A composing strategy (svd) rewrote ``weights`` (by name) after this one's `finish`: recompute what
        `finish` derived from them (vt: Eq. 5's multipliers). Default: nothing."""

    # ---- a growth by units (grow/growth/units.py, docs/distributed.md, "FSDP2") ------------------------------------
    # a metric's reduction over the units (min, max); one not named is summed
    unit_metrics: ClassVar[dict[str, Callable[[float, float], float]]] = {}

    def unit_reduction(self, key: str) -> Callable[[float, float], float] | None:
        """`unit_metrics`' reduction of ``key``, this strategy's or its base's."""
        base = getattr(self, "base", None)
        own = self.unit_metrics.get(key)
        return own if own is not None or not isinstance(base, Strategy) else base.unit_reduction(key)

    # Whether it can grow one unit at a time (docs/distributed.md, "FSDP2", for the contract); each class
    # declares it itself, not inherited (`declares_by_units`): a subclass's hooks may read other units.
    grows_by_units: ClassVar[bool] = False

    @classmethod
    def declares_by_units(cls) -> bool:
        """Whether this very class sets ``grows_by_units = True`` (a parent's declaration does not count)."""
        return bool(vars(cls).get("grows_by_units", False))

    def by_units(self) -> bool:
        """Whether this growth runs by units: its class declares it, and its base strategy's too, if it has one."""
        base = getattr(self, "base", None)
        return self.declares_by_units() and (not isinstance(base, Strategy) or base.by_units())

    def block_sources(self, n_old: int, n_new: int, inserted: list[int]) -> dict[int, int]:
        """{new block: the old block its growth reads} of a depth growth, the new blocks at ``inserted``.
        Default: the base strategy's, or none."""
        base = getattr(self, "base", None)
        return base.block_sources(n_old, n_new, inserted) if isinstance(base, Strategy) else {}

    def passes_around_units(self, source: TransformerConfig, target: TransformerConfig) -> bool:
        """Whether a growth by units runs whole-model passes around them, `prepare_units` before and
        `finish_units` after (grow/fsdp_growth/passes.py; svd growing d_k). Default: no."""
        return False

    def statistics_flops(self, source: TransformerConfig, target: TransformerConfig, batch_size: int) -> float:
        """FLOPs of the statistics pass it would run around the units (svd: were d_k to grow); docs/fsdp.md's
        cost table. Default: 0."""
        return 0.0

    # ---- a growth on rank 0's host under FSDP (grow/fsdp_growth/cost.py, docs/distributed.md, "FSDP2") ------------
    # a strategy that trains through the whole grown model there (ligo): the grown size above which
    # trainer.fsdp_growth=auto refuses it (`grow.fsdp_growth.cost.check_host`); None: no training
    host_max_params: ClassVar[int | None] = None

    def host_training_flops(self, source: TransformerConfig, target: TransformerConfig, batch_size: int,
                            growth_batches: int) -> float:
        """FLOPs the growth trains through the whole grown model on rank 0's host. Default: 0."""
        return 0.0

    def units_done(self, metrics: dict[str, float], names: Iterable[str]) -> None:
        """Revise the whole growth's ``metrics`` once its units are put together, ``names`` the grown model's
        tensors (msg's mask counts). Default: the base strategy's, or nothing."""
        base = getattr(self, "base", None)
        if isinstance(base, Strategy):
            base.units_done(metrics, names)

    def unit_state(self, whole: Any, part: Any, yields: Callable[[str], bool]) -> Any:
        """The whole growth's state from ``whole`` (the units' so far) and ``part``, a block unit's (its
        tensors those ``yields`` names). Default: the base strategy's, else ``whole``."""
        base = getattr(self, "base", None)
        return base.unit_state(whole, part, yields) if isinstance(base, Strategy) else whole

    # ---- during training ----------------------------------------------------------------------
    def after_growth(self, opt, result: "GrowthResult", optim_name: str) -> None:
        """Once per growth, after `GrowthAwareOptimizer.grow`: set optimizer state from what the growth
        derived (vt under SGD: Eq. 5's rates). Default: nothing."""

    def after_step(self, model: Transformer, opt, step_in_stage: int) -> bool:
        """After every applied step of a growth run (``step_in_stage`` 1 after the stage's first): act from
        what the model and optimizer hold, so a resumed run does the same (msg's ramp). True when the
        model's structure changed, so the trainer rebuilds its wrapper. Default: False."""
        return False

    def step_metrics(self) -> dict[str, float]:
        """The latest `after_step`'s figures for the next log record. Default: none."""
        return {}


REGISTRY: dict[str, type[Strategy]] = {}
# Strategy name -> module of grow.growth that defines it (when it is not the name itself).
_MODULES = {"random": "random_init"}


def register(name: str):
    """Class decorator: ``@register("zero") class Zero(Strategy): ...``."""
    def deco(cls: type[Strategy]) -> type[Strategy]:
        cls.name = name
        REGISTRY[name] = cls
        return cls

    return deco


def configs_dir() -> Path:
    """The ``configs/`` directory (`grow.errors.CONFIG_DIR`)."""
    return CONFIG_DIR


def available() -> list[str]:
    """Strategy names with a YAML (configs/strategy/ or a plugin's) or registered: the one list."""
    names = set(REGISTRY) | set(plugins.yaml_names())
    d = configs_dir() / "strategy"
    if d.is_dir():
        names |= {p.stem for p in d.glob("*.yaml")}
    return sorted(names)


def yaml_path(name: str) -> Path:
    """``configs/strategy/<name>.yaml``, or a plugin strategy's YAML."""
    return plugins.yaml_path(name) or configs_dir() / "strategy" / f"{name}.yaml"


def yaml_options(name: str) -> dict[str, Any]:
    """The options in the strategy's YAML (`yaml_path`, without its ``name:`` key); {} if absent."""
    return plugins.yaml_options("strategy", name)


def strategy_class(name: str) -> type[Strategy]:
    """The class registered as ``name``, importing ``grow.growth.<module>`` (or the plugins) on first use."""
    plugins.load()
    if name not in REGISTRY:
        module = _MODULES.get(name, name)
        try:
            importlib.import_module(f"grow.growth.{module}")
        except ModuleNotFoundError as e:
            if e.name != f"grow.growth.{module}":
                raise
    if name not in REGISTRY:
        raise ValueError(f"unknown growth strategy {name!r} (available: {', '.join(available())})")
    return REGISTRY[name]


def get_strategy(strategy: "str | Mapping | Strategy" = "zero", **options) -> Strategy:
    """A strategy from a name, a mapping ``{"name": ..., **options}`` or an instance (as is, no ``options``);
    keyword options over the mapping's over the YAML's."""
    if isinstance(strategy, Strategy):
        if options:
            raise ValueError("options cannot be given together with a Strategy instance")
        return strategy
    if isinstance(strategy, Mapping) or hasattr(strategy, "keys"):
        spec = dict(strategy)
        if "name" not in spec:
            raise ValueError(f"strategy mapping needs a 'name' key, got {sorted(spec)}")
        name = spec.pop("name")
        options = {**spec, **options}
    elif isinstance(strategy, str):
        name = strategy
    else:
        raise TypeError(f"strategy must be a name, a mapping or a Strategy, got {type(strategy).__name__}")
    return strategy_class(name)(**options)


def check_growth(source: TransformerConfig, target: TransformerConfig) -> None:
    """Refuse what no expansion can do: shrinking, changing a fixed field, moving the rotary frequencies
    (docs/model.md, "k under rotary positions")."""
    for dim, fld in DIMS.items():
        a, b = getattr(source, fld), getattr(target, fld)
        if b < a:
            raise ValueError(
                f"cannot shrink {fld} ({dim}) from {a} to {b}: growth only adds units (target must be >= {a})"
            )
    plugin_flags = sorted(set(dict(source.flags)) | set(dict(target.flags)))  # grow.flags: fixed too
    for fld in (*FIXED_FIELDS, *plugin_flags):
        a, b = getattr(source, fld), getattr(target, fld)
        if a != b:
            raise ValueError(f"cannot change {fld} from {a!r} to {b!r} by growth: it must stay {a!r}")
    if source.moe:
        grown = [fld for dim, fld in DIMS.items() if dim != "X" and getattr(target, fld) != getattr(source, fld)]
        if grown:
            raise ValueError(f"cannot grow {grown[0]} of a mixture of experts (n_experts={source.n_experts}): only "
                             f"n_experts grows once a layer has experts; grow {grown[0]} while the model is dense "
                             f"(n_experts=1), then upcycle")
    if source.qk_norm and target.d_qk != source.d_qk:
        raise ValueError(f"cannot grow d_qk from {source.d_qk} to {target.d_qk} under per-head q/k norms (qk_norm): a "
                         "norm over the head's coordinates keeps the function only if the new query and key "
                         "coordinates are all zero, and then no gradient reaches them (docs/design.md, \"Checkpoint "
                         "families\"); grow the heads (n_heads) instead")
    if source.positions == "rope" and source.rope_anchor != target.rope_anchor:
        raise ValueError(f"cannot grow d_qk from {source.d_qk} to {target.d_qk} under rotary frequencies anchored at "
                         f"{source.rope_anchor} -> {target.rope_anchor}: the old pairs would turn at new frequencies; "
                         f"anchor every stage at the final head size (rope_dim={target.rope_anchor})")


def rms(t: torch.Tensor) -> float:
    """Root mean square of a tensor (0 for an empty one)."""
    return float(t.pow(2).mean().sqrt()) if t.numel() else 0.0

