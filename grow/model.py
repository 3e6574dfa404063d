"""The decoder-only, pre-RMSNorm transformer of A. Gesmundo and K. Maile, "Composable Function-preserving
Expansions for Transformer Architectures", arXiv:2308.06103 (2023), §2, with Llama-style options, a
mixture-of-experts feed-forward, the pretrained families' flags (docs/design.md, "Checkpoint families") and
a chunked cross-entropy (docs/model.md, "The model").

Notation: h = d_model, E = n_heads, k = d_qk, v = d_v, p = d_ff, N = n_layers, V = vocab_size,
s = seq_len. RMSNorm puts eps on the *sum* of squares so that growing h stays exact; every ``Linear``
carries a forward multiplier ``mult`` (y = mult x W^T + b) for vt.
"""

from __future__ import annotations

import math
from contextlib import contextmanager
from contextvars import ContextVar
from dataclasses import asdict, dataclass, field, fields, replace

import torch
import torch.nn as nn
import torch.nn.functional as F

try:  # in grow; a copy vendored in an export (grow.hf.remote) runs without grow: its config was checked when written
    from grow.errors import ConfigError, check_bool, check_number, nearest_key, positive_int
    from grow.families import FAMILIES, check_family
    from grow.flags import REGISTRY as PLUGIN_FLAGS
    from grow.flags import active as active_flags
except ImportError:  # pragma: no cover - only in an exported directory
    check_family, FAMILIES, PLUGIN_FLAGS = None, None, {}

    def active_flags(cfg):
        return []

    class ConfigError(ValueError):
        def __init__(self, key: str, value, allowed: str):
            self.key, self.value, self.allowed = key, value, allowed
            super().__init__(f"{key}={value!r}: {allowed}")

    def positive_int(key, value, *rest, **kw):
        return value

    check_bool = check_number = positive_int

ACTIVATIONS = ("gelu", "relu", "swiglu", "geglu")
GATED = ("swiglu", "geglu")  # the activations with a gate matrix
PARAMETRIZATIONS = ("standard", "mup")
HIDDEN = ("attn.q.weight", "attn.k.weight", "attn.v.weight", "attn.o.weight", "mlp.fc1.weight", "mlp.fc2.weight",
          "mlp.gate.weight")  # the matrices whose fan-in and fan-out both grow with the width (mup's "hidden")
POSITIONS = ("learned", "rope")


def _one_of(choices):
    def check(key, value):
        if value not in choices:
            raise ConfigError(key, value, f"must be one of {', '.join(choices)}")
    return check


def _null_or_positive_int(key, value):
    return None if value is None else positive_int(key, value)


def _family(key, value):
    if value is not None and FAMILIES is not None and value not in FAMILIES:
        raise ConfigError(key, value, f"must be one of {', '.join(FAMILIES)} or null (grow's own model)")


def _plugin_flags(key, value):
    for name, v in dict(value).items():
        if name not in PLUGIN_FLAGS:
            raise ConfigError(name, v, "not a model key (a plugin's flag: its module in GROW_PLUGINS)")
        PLUGIN_FLAGS[name].check(name, v)


def _key(default, check, *args, **kw):
    """A config key: its default and the check its value passes (``check(key, value, *args)``), declared once."""
    return field(default=default, metadata={"check": lambda key, value: check(key, value, *args, **kw)})


@dataclass(frozen=True)
class TransformerConfig:
    """Architecture of a `Transformer` (``d_qk``, ``d_v`` per head). Each ``model.*`` key is defined here
    once, with its default and check (`_key`); rules across keys in `__post_init__` (docs/design.md, "The run config")."""

    vocab_size: int = _key(4096, positive_int)  # V (the YAMLs: ${data.vocab_size}, the tokenizer's)
    seq_len: int = _key(128, positive_int)  # s: context length
    n_layers: int = _key(4, positive_int)  # N: blocks
    d_model: int = _key(256, positive_int)  # h: residual width
    n_heads: int = _key(4, positive_int)  # E: query heads
    d_qk: int = _key(64, _null_or_positive_int)  # None: d_model / n_heads (which must divide)
    d_v: int = _key(64, _null_or_positive_int)  # None: d_model / n_heads
    d_ff: int = _key(1024, positive_int)  # p: MLP width (each of gate, up, down when gated)
    activation: str = _key("gelu", _one_of(ACTIVATIONS))  # gated: gate, up = fc1, down = fc2; geglu's gelu is tanh's
    positions: str = _key("learned", _one_of(POSITIONS))  # learned (P) | rope (rotary, rope_theta)
    rope_theta: float = _key(10000.0, check_number, 1, lo_open=True)  # rotary base: pair i turns by m theta^(-2i/k)
    rope_dim: int | None = _key(None, _null_or_positive_int)  # head size the rotary frequencies are anchored at (None = d_qk)
    n_kv_heads: int | None = _key(None, _null_or_positive_int)  # key/value heads (grouped-query attention); None = n_heads
    mlp_bias: bool = _key(True, check_bool)  # b1, b2 in the MLP
    tie_embeddings: bool = _key(False, check_bool)  # W_out = E^T
    norm_eps: float = _key(1e-5, check_number, 0)  # RMSNorm epsilon, on the sum of squares (exact as h grows)
    dropout: float = _key(0.0, check_number, 0, 1, hi_open=True)  # on attention weights, MLP, residuals, embedding
    init_std: float = _key(0.02, check_number, 0, lo_open=True)  # N(0, init_std^2); W_O, W2 by 1/sqrt(2N)
    parametrization: str = _key("standard", _one_of(PARAMETRIZATIONS))  # standard | mup (grow/mup.py)
    mup_base_width: int | None = _key(None, _null_or_positive_int)  # mup: h0, the width at which mup equals standard
    n_experts: int = _key(1, positive_int)  # X: experts of each layer's feed-forward (1 = the dense MLP); see `MoE`
    top_k: int = _key(1, positive_int)  # experts each token is routed to (token choice; <= n_experts)
    router_aux_coef: float = _key(0.01, check_number, 0)  # the load-balancing loss's weight (n_experts > 1)
    router_z_coef: float = _key(0.0, check_number, 0)  # the router z-loss's weight (n_experts > 1)
    family: str | None = _key(None, _family)  # its transformers family (grow.families): its rules hold, export writes it
    qkv_bias: bool = _key(False, check_bool)  # biases on the query, key and value projections (Qwen2)
    qk_norm: bool = _key(False, check_bool)  # an RMSNorm over each head's queries and keys before the rotation (Qwen3)
    qk_norm_eps: float = _key(1e-6, check_number, 0)  # its epsilon, on the sum of the head's k squares (as norm_eps)
    sliding_window: int | None = _key(None, _null_or_positive_int)  # a token sees itself and window - 1 before (Mistral)
    embed_scale: float = _key(1.0, check_number, 0, lo_open=True)  # embedding output multiplier (Gemma: sqrt(its d_model))
    rope_factor: float = _key(1.0, check_number, 1)  # Llama 3's rotary scaling (1 = none): low frequencies / factor, smoothly
    rope_low_freq_factor: float = _key(1.0, check_number, 0, lo_open=True)  # ... wavelengths > original_positions / it scaled
    rope_high_freq_factor: float = _key(4.0, check_number, 0, lo_open=True)  # ... those < original_positions / it kept
    rope_original_positions: int = _key(8192, positive_int)  # ... the context the rotary base was trained at
    flags: tuple = _key((), _plugin_flags)  # (key, value) of each plugin flag on (grow.flags), read as cfg.<key>

    def __post_init__(self) -> None:
        for f in fields(self):  # each key's own check, in declaration order
            if "check" in f.metadata:
                f.metadata["check"](f.name, getattr(self, f.name))
        on = sorted((k, v) for k, v in dict(self.flags).items() if v != PLUGIN_FLAGS[k].default)
        object.__setattr__(self, "flags", tuple(on))  # those on, sorted: equal configs compare equal
        for key in ("d_qk", "d_v"):  # null: d_model / n_heads
            if getattr(self, key) is None:
                object.__setattr__(self, key, self._head_size(key))
        self._check_heads()
        self._check_experts()
        self._check_mup()
        self._check_family_flags()

    @classmethod
    def defaults(cls) -> dict:
        """Every ``model.<key>`` at its default, a registered plugin flag's too."""
        return {**{f.name: f.default for f in fields(cls) if f.name != "flags"},
                **{key: flag.default for key, flag in PLUGIN_FLAGS.items()}}

    @classmethod
    def from_node(cls, node, prefix: str = "model") -> "TransformerConfig":
        """From the composed ``model`` node: unknown keys refused with the nearest, integral floats (2e7)
        taken as integers, errors named under ``prefix``."""
        names = {f.name: f for f in fields(cls) if f.name != "flags"}
        for key in node:
            if key not in names and key not in PLUGIN_FLAGS:
                hint = nearest_key(str(key), [*names, *PLUGIN_FLAGS]) or " (a plugin's flag: its module in GROW_PLUGINS)"
                raise ConfigError(f"{prefix}.{key}", node[key], f"not a key of {prefix}{hint}")
        whole = {k: int(v) for k, v in node.items() if isinstance(v, float) and v.is_integer()
                 and k in names and names[k].type.startswith("int")}
        plugin = tuple((k, v) for k, v in node.items() if k in PLUGIN_FLAGS)
        try:
            return cls(**{k: v for k, v in {**node, **whole}.items() if k in names}, flags=plugin)
        except ConfigError as exc:
            raise ConfigError(f"{prefix}.{exc.key}", exc.value, exc.allowed) from None

    def __getattr__(self, name: str):
        if name in PLUGIN_FLAGS:
            return dict(self.__dict__.get("flags", ())).get(name, PLUGIN_FLAGS[name].default)
        raise AttributeError(f"'TransformerConfig' object has no attribute {name!r}")

    def _head_size(self, key: str) -> int:
        if self.d_model % self.n_heads:
            raise ConfigError("d_model", self.d_model, f"must be divisible by model.n_heads={self.n_heads} when "
                                                       f"model.{key} is null (or set model.{key})")
        return self.d_model // self.n_heads

    def _check_heads(self) -> None:
        if self.positions == "rope" and self.d_qk % 2:
            raise ConfigError("d_qk", self.d_qk, "must be even with model.positions=rope (the rotation turns pairs "
                                                 "of coordinates)")
        if self.rope_dim is not None and (self.rope_dim < self.d_qk or self.rope_dim % 2):
            raise ConfigError("rope_dim", self.rope_dim, f"must be an even integer >= model.d_qk={self.d_qk} "
                                                         "(null: d_qk)")
        if self.n_kv_heads is not None and (self.n_kv_heads > self.n_heads or self.n_heads % self.n_kv_heads):
            raise ConfigError("n_kv_heads", self.n_kv_heads, f"must divide model.n_heads={self.n_heads} (null: one "
                                                             "per head)")

    def _check_experts(self) -> None:
        if self.top_k > self.n_experts:
            raise ConfigError("top_k", self.top_k, f"must be <= model.n_experts={self.n_experts} (experts a token "
                                                   "is routed to)")
        if self.n_experts > 1 and self.parametrization == "mup":
            raise ConfigError("n_experts", self.n_experts, "must be 1 with parametrization=mup (mup's rules for "
                                                           "experts and routers are not derived here)")

    def _check_mup(self) -> None:
        base = self.mup_base_width
        if self.parametrization != "mup":
            if base is not None:
                raise ConfigError("mup_base_width", base, "must be null with parametrization=standard")
            return
        if base is None:
            raise ConfigError("mup_base_width", base, "must be an integer >= 1 with parametrization=mup (the "
                                                      "width h0 at which mup equals standard)")
        if self.tie_embeddings:
            raise ConfigError("tie_embeddings", True, "must be false with parametrization=mup (the output "
                                                      "layer has its own multiplier and learning rate)")

    def _check_family_flags(self) -> None:
        if self.rope_factor != 1.0 and not self.rope_low_freq_factor < self.rope_high_freq_factor:
            raise ConfigError("rope_high_freq_factor", self.rope_high_freq_factor,
                              f"must be > model.rope_low_freq_factor={self.rope_low_freq_factor} with "
                              f"model.rope_factor={self.rope_factor} (Llama 3's smoothing divides by their difference)")
        if check_family is not None:
            check_family(self)

    def replace(self, **changes) -> "TransformerConfig":
        """`dataclasses.replace`, checked again; a plugin flag is set as ``flags=((key, value), ...)``."""
        return replace(self, **changes)

    def to_dict(self) -> dict:
        d = asdict(self)
        if self.parametrization == "standard":  # the configs written before mup existed, unchanged
            del d["parametrization"], d["mup_base_width"]
        if self.n_experts == 1 and self.top_k == 1:  # ... and before the experts: a dense model's keys unchanged
            for name in ("n_experts", "top_k", "router_aux_coef", "router_z_coef"):
                del d[name]
        for name, value in FLAG_DEFAULTS.items():  # ... and before the families: a flag at its default unwritten
            if d[name] == value and (name != "qk_norm_eps" or not self.qk_norm):
                del d[name]
        del d["flags"]
        return {**d, **dict(self.flags)}

    @property
    def gated(self) -> bool:
        """Whether the MLP has a gate matrix (SwiGLU, GeGLU): three matrices, not two."""
        return self.activation in GATED

    @property
    def moe(self) -> bool:
        """Whether each layer's feed-forward is a mixture of experts (`MoE`) rather than one `MLP`."""
        return self.n_experts > 1

    @property
    def width_mult(self) -> float:
        """m = h / h0 under mup (every hidden matrix's width multiplier, grow/mup.py); 1 in standard."""
        return self.d_model / self.mup_base_width if self.parametrization == "mup" else 1.0

    @classmethod
    def from_dict(cls, d) -> "TransformerConfig":
        names = {f.name for f in fields(cls)} - {"flags"}
        plugin = tuple((k, v) for k, v in dict(d).items() if k in PLUGIN_FLAGS)
        return cls(**{k: v for k, v in dict(d).items() if k in names}, flags=plugin)

    @property
    def kv_heads(self) -> int:
        """G: key/value heads (``n_kv_heads``, or one per query head)."""
        return self.n_heads if self.n_kv_heads is None else self.n_kv_heads

    @property
    def rope_anchor(self) -> int:
        """K: the head size the rotary frequencies theta^(-2i/K) are anchored at (``rope_dim``, or d_qk)."""
        return self.d_qk if self.rope_dim is None else self.rope_dim

    @property
    def group_size(self) -> int:
        """r = E / G: query heads per key/value head (1 without grouped-query attention)."""
        return self.n_heads // self.kv_heads

    # ---- counting -------------------------------------------------------------------------
    def expert_params(self) -> int:
        """Parameters of one feed-forward expert (the dense `MLP` when n_experts = 1): its matrices and biases."""
        h, p = self.d_model, self.d_ff
        return (3 if self.gated else 2) * h * p + ((p + h) if self.mlp_bias else 0)

    def _matmul_layer_params(self) -> int:
        """Matmul weights one token goes through in a layer: attention, the router (h X) and its top_k experts."""
        h, E, G, k, v, p = self.d_model, self.n_heads, self.kv_heads, self.d_qk, self.d_v, self.d_ff
        attn = h * E * k + h * G * (k + v) + E * v * h
        mlp = (3 if self.gated else 2) * h * p
        return attn + (h * self.n_experts + self.top_k * mlp if self.moe else mlp)

    def layer_params(self, active: bool = False) -> int:
        """Parameters of one transformer layer (two norm gains, attention, router, experts); ``active``: only the
        top_k experts a token uses (the total counts all n_experts)."""
        h, E, G, k, v = self.d_model, self.n_heads, self.kv_heads, self.d_qk, self.d_v
        attn = h * E * k + h * G * (k + v) + E * v * h
        experts = (self.top_k if active else self.n_experts) * self.expert_params()
        attn += (E * k + G * (k + v) if self.qkv_bias else 0) + (2 * k if self.qk_norm else 0)
        plugin = sum(flag.layer_params(self) for flag in active_flags(self))
        return 2 * h + attn + (h * self.n_experts if self.moe else 0) + experts + plugin

    def active_params(self, non_embedding: bool = False) -> int:
        """`num_params` with each layer's experts counted top_k times, not n_experts: what one token uses."""
        return self.num_params(non_embedding) - self.n_layers * (self.layer_params() - self.layer_params(True))

    def num_params(self, non_embedding: bool = False) -> int:
        """Exact parameter count of `Transformer(self)`, every expert counted; ``non_embedding``: without E
        and P (an untied W_out stays)."""
        h, V = self.d_model, self.vocab_size
        n = self.n_layers * self.layer_params() + h  # layers + final norm
        n += 0 if self.tie_embeddings else V * h  # W_out (shared with E when tied)
        if not non_embedding:
            n += V * h + (self.seq_len * h if self.positions == "learned" else 0)  # E and P
        return n

    def matmul_params(self) -> int:
        """Parameters that take part in a matmul per token: layers' weights and W_out (tied or not)."""
        return self.n_layers * self._matmul_layer_params() + self.d_model * self.vocab_size

    def flops_per_token(self, seq_len: int | None = None) -> int:
        """Training FLOPs per token, 6 * N_matmul + 6 * N * s * E * (k + v): N_matmul every weight in a
        matmul (W_out in, embeddings out; with experts the router and the top_k experts), E query heads
        whatever G, the full s x s products (docs/costs.md)."""
        s = self.seq_len if seq_len is None else seq_len
        return 6 * self.matmul_params() + 6 * self.n_layers * s * self.n_heads * (self.d_qk + self.d_v)


# the family and its flags: at their defaults, to_dict leaves them out and grow.hf.pretrained takes the checkpoint's
FLAGS = ("family", "qkv_bias", "qk_norm", "qk_norm_eps", "sliding_window", "embed_scale", "rope_factor",
         "rope_low_freq_factor", "rope_high_freq_factor", "rope_original_positions")
FLAG_DEFAULTS = {f.name: f.default for f in fields(TransformerConfig) if f.name in FLAGS}


def init_std(cfg: TransformerConfig, role: str) -> float:
    """Standard deviation of the initializer for a parameter role (GPT-2's: W_O, W2 by 1/sqrt(2N))."""
    if role == "out":
        return cfg.init_std / math.sqrt(2 * cfg.n_layers)
    return cfg.init_std


def param_role(name: str) -> str:
    """The initializer role of a parameter name: 'gain', 'bias', 'out' or 'weight'."""
    if name.endswith("norm.weight"):
        return "gain"
    if name.endswith(".bias"):
        return "bias"
    if name.endswith("attn.o.weight") or name.endswith("fc2.weight"):  # the writers of the residual (experts' too)
        return "out"
    return "weight"


def init_like(cfg: TransformerConfig, name: str, shape, *, dtype=torch.float32, device=None,
              generator: torch.Generator | None = None) -> torch.Tensor:
    """A fresh tensor of ``shape`` drawn from the model's own initializer for parameter ``name``:
    N(0, std^2) for weights, zeros for biases, ones for norm gains (a plugin flag's: its own)."""
    for flag in active_flags(cfg):
        t = flag.init(cfg, name.split(".", 2)[-1] if name.startswith("layers.") else name, shape, dtype, device)
        if t is not None:
            return t
    role = param_role(name)
    if role == "gain":
        return torch.ones(shape, dtype=dtype, device=device)
    if role == "bias":
        return torch.zeros(shape, dtype=dtype, device=device)
    std = init_std(cfg, role)
    if cfg.parametrization == "mup" and name.endswith(HIDDEN):  # variance 1/fan-in: std / sqrt(m)
        std = std / math.sqrt(cfg.width_mult)
    t = torch.empty(shape, dtype=dtype, device=device)
    if generator is not None and generator.device != t.device:
        cpu = torch.empty(shape, dtype=dtype).normal_(0.0, std, generator=generator)
        return cpu.to(device)
    return t.normal_(0.0, std, generator=generator)


def dropout(x: torch.Tensor, p: float, training: bool) -> torch.Tensor:
    """``F.dropout``, with the same masks on every CPU for a seed: torch's CPU dropout draws with MKL on
    Intel and its own generator elsewhere, so here the CPU's mask is ``torch.rand(...) >= p`` (float32)."""
    if not training or p == 0.0:
        return x
    if x.device.type != "cpu":
        return F.dropout(x, p, True)
    keep = torch.rand(x.shape, dtype=torch.float32) >= p
    return x * keep * (1.0 / (1.0 - p))


class Dropout(nn.Module):
    """``nn.Dropout`` through `dropout` (the same masks on every CPU)."""

    def __init__(self, p: float):
        super().__init__()
        self.p = p

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return dropout(x, self.p, self.training)


class Linear(nn.Module):
    """y = mult * (x @ W^T) + b, with a scalar forward multiplier kept in the state dict."""

    def __init__(self, in_features: int, out_features: int, bias: bool = False):
        super().__init__()
        self.in_features, self.out_features = in_features, out_features
        self.weight = nn.Parameter(torch.empty(out_features, in_features))
        self.bias = nn.Parameter(torch.zeros(out_features)) if bias else None
        self.mult = 1.0

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if self.mult == 1.0:
            return F.linear(x, self.weight, self.bias)
        y = F.linear(x, self.weight) * self.mult
        return y if self.bias is None else y + self.bias

    def get_extra_state(self):
        return {"mult": float(self.mult)}

    def set_extra_state(self, state) -> None:
        self.mult = float(state["mult"])

    def extra_repr(self) -> str:
        return f"{self.in_features}, {self.out_features}, bias={self.bias is not None}, mult={self.mult:g}"


class RMSNorm(nn.Module):
    """g * x / sqrt((sum x^2 + eps) / h): epsilon on the sum, so growing h is exact (see module doc)."""

    def __init__(self, dim: int, eps: float):
        super().__init__()
        self.eps = eps
        self.weight = nn.Parameter(torch.ones(dim))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        h = x.shape[-1]
        return F.rms_norm(x, (h,), self.weight, eps=self.eps / h)


def rope_freqs(k: int, theta: float, anchor: int | None = None, device=None, scaling=None) -> torch.Tensor:
    """The rotary frequencies theta^(-2i/K) of the pairs i < k/2, float64, K = ``anchor`` or k
    (docs/model.md, "k under rotary positions"); ``scaling``: `llama3_scaled`."""
    inv = theta ** (-torch.arange(0, k, 2, dtype=torch.float64, device=device) / (anchor or k))
    return inv if scaling is None or scaling.rope_factor == 1.0 else llama3_scaled(inv, scaling)


def llama3_scaled(inv: torch.Tensor, cfg: TransformerConfig) -> torch.Tensor:
    """Llama 3.1's frequencies (A. Grattafiori et al., "The Llama 3 Herd of Models", arXiv:2407.21783, and
    Meta's reference code): with L the original context and wavelength 2 pi / f, a frequency whose wavelength
    is below L / high_freq_factor is kept, one above L / low_freq_factor is divided by the factor s, and one
    between is interpolated, f ((1 - a) / s + a) with a = (L / wavelength - low) / (high - low). A function of
    each frequency alone, so a k growth keeps the old pairs' frequencies."""
    s, low, high, L = cfg.rope_factor, cfg.rope_low_freq_factor, cfg.rope_high_freq_factor, cfg.rope_original_positions
    wavelength = 2 * math.pi / inv
    a = (L / wavelength - low) / (high - low)
    out = torch.where(wavelength > L / low, inv / s, inv)
    medium = (wavelength >= L / high) & (wavelength <= L / low)
    return torch.where(medium, (1 - a) * inv / s + a * inv, out)


def rope_table(T: int, k: int, theta: float, device, dtype, anchor: int | None = None,
               scaling=None) -> tuple[torch.Tensor, torch.Tensor]:
    """cos and sin of the angles m * theta^(-2i/K), each (T, k), half-split (columns j and j + k/2: pair j);
    float64, then cast, so every dtype rotates by the same angles."""
    inv = rope_freqs(k, theta, anchor, device, scaling)
    angles = torch.outer(torch.arange(T, dtype=torch.float64, device=device), inv)
    angles = torch.cat([angles, angles], dim=-1)
    return angles.cos().to(dtype), angles.sin().to(dtype)


def rotate(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
    """Each pair (x_i, x_{i+k/2}) of the last dimension turned by its angle: x cos + rotate_half(x) sin,
    rotate_half(x) = (-x_2, x_1) for the halves x_1, x_2."""
    x1, x2 = x.chunk(2, dim=-1)
    return x * cos + torch.cat([-x2, x1], dim=-1) * sin


def causal_mask(T: int, window: int | None, device) -> torch.Tensor:
    """(T, T) booleans: query i sees key j <= i, and with a sliding ``window`` only i - j < window (Mistral's)."""
    mask = torch.ones(T, T, dtype=torch.bool, device=device).tril()
    return mask if window is None or window >= T else mask.triu(1 - window)


def sdpa_attention(q, k, v, scale: float, p_drop: float, score_hook=None, window: int | None = None) -> torch.Tensor:
    """Causal softmax(q k^T scale) v by torch's fused kernel (a sliding ``window`` as an explicit mask)."""
    if window is not None and window < q.shape[-2]:
        return F.scaled_dot_product_attention(q, k, v, attn_mask=causal_mask(q.shape[-2], window, q.device),
                                              dropout_p=p_drop, scale=scale)
    return F.scaled_dot_product_attention(q, k, v, is_causal=True, dropout_p=p_drop, scale=scale)


def eager_attention(q, k, v, scale: float, p_drop: float, score_hook=None, window: int | None = None) -> torch.Tensor:
    """The same with the scores materialized: ``score_hook`` sees them, and dropout draws `dropout`'s masks."""
    T = q.shape[-2]
    s = (q @ k.transpose(-2, -1)) * scale
    s = score_hook(s) if score_hook is not None else s
    mask = causal_mask(T, window, q.device)
    a = torch.softmax(s.masked_fill(~mask, float("-inf")), dim=-1)
    return dropout(a, p_drop, p_drop > 0.0) @ v


ATTENTION = {"sdpa": sdpa_attention, "eager": eager_attention}  # the kernels, by name (as transformers' are)


def attention_kernel(score_hook, p_drop: float, device: torch.device) -> str:
    """eager for a score hook or for dropout on the CPU (`dropout`: the same masks on every CPU), else sdpa."""
    return "eager" if score_hook is not None or (p_drop and device.type == "cpu") else "sdpa"


class Attention(nn.Module):
    """Multi-head causal attention, per-head query/key size k and value size v (Gesmundo & Maile Eq. 4)."""

    def __init__(self, cfg: TransformerConfig):
        super().__init__()
        h, E, G, k, v = cfg.d_model, cfg.n_heads, cfg.kv_heads, cfg.d_qk, cfg.d_v
        self.n_heads, self.kv_heads, self.d_qk, self.d_v = E, G, k, v
        self.q = Linear(h, E * k, bias=cfg.qkv_bias)
        self.k = Linear(h, G * k, bias=cfg.qkv_bias)
        self.v = Linear(h, G * v, bias=cfg.qkv_bias)
        self.o = Linear(E * v, h)
        # Qwen3's per-head norms, one gain of k shared by the heads; eps on the head's sum (RMSNorm's convention)
        self.q_norm = RMSNorm(k, cfg.qk_norm_eps) if cfg.qk_norm else None
        self.k_norm = RMSNorm(k, cfg.qk_norm_eps) if cfg.qk_norm else None
        self.dropout = cfg.dropout
        self.window = cfg.sliding_window
        self.rope_theta = cfg.rope_theta if cfg.positions == "rope" else None
        self.rope_anchor = cfg.rope_anchor
        self.rope_scaling = cfg if cfg.rope_factor != 1.0 else None

    def heads(self, x: torch.Tensor, rope=None):
        """Per-head q, k, v, (B, E, T, k|v); ``rope``: `rope_table`'s (here when None)."""
        B, T, _ = x.shape
        if torch.is_autocast_enabled(x.device.type):
            x = x.to(torch.get_autocast_dtype(x.device.type))  # once: backward saves one copy, not three
        E, G, k, v = self.n_heads, self.kv_heads, self.d_qk, self.d_v
        q, kk = self.q(x).view(B, T, E, k), self.k(x).view(B, T, G, k)
        if self.q_norm is not None:
            q, kk = self.q_norm(q), self.k_norm(kk)
        q, kk = q.transpose(1, 2), kk.transpose(1, 2)
        vv = self.v(x).view(B, T, G, v).transpose(1, 2)
        if self.rope_theta is not None:
            cos, sin = rope if rope is not None else rope_table(T, k, self.rope_theta, q.device, q.dtype,
                                                                self.rope_anchor, self.rope_scaling)
            cos, sin = cos.to(q.dtype), sin.to(q.dtype)  # no-ops unless autocast computes in another dtype
            q, kk = rotate(q, cos, sin), rotate(kk, cos, sin)
        if G != E:  # query head e reads kv head floor(e G / E)
            kk, vv = kk.repeat_interleave(E // G, dim=1), vv.repeat_interleave(E // G, dim=1)
        return q, kk, vv

    def forward(self, x: torch.Tensor, score_hook=None, rope=None) -> torch.Tensor:
        """``score_hook(S)`` gets the scaled pre-mask scores S (B, E, T, T) and returns those to use (svd's
        statistics; the eager kernel)."""
        B, T, _ = x.shape
        q, k, v = self.heads(x, rope)
        p_drop = self.dropout if self.training else 0.0
        kernel = ATTENTION[attention_kernel(score_hook, p_drop, x.device)]
        y = kernel(q, k, v, 1.0 / math.sqrt(self.d_qk), p_drop, score_hook, self.window)
        return self.o(y.transpose(1, 2).reshape(B, T, self.n_heads * self.d_v))


ACTIVATION_FUNCTIONS = {"gelu": F.gelu, "relu": F.relu, "swiglu": F.silu,
                        "geglu": lambda x: F.gelu(x, approximate="tanh")}


class MLP(nn.Module):
    """act(x W1 + b1) W2 + b2; gated, (act(x W_gate) * (x W1 + b1)) W2 + b2 with silu (``swiglu``) or tanh's
    gelu (``geglu``: Gemma's ``gelu_pytorch_tanh``)."""

    def __init__(self, cfg: TransformerConfig):
        super().__init__()
        self.fc1 = Linear(cfg.d_model, cfg.d_ff, bias=cfg.mlp_bias)
        self.fc2 = Linear(cfg.d_ff, cfg.d_model, bias=cfg.mlp_bias)
        self.gate = Linear(cfg.d_model, cfg.d_ff) if cfg.gated else None
        self.act = ACTIVATION_FUNCTIONS[cfg.activation]
        self.dropout = Dropout(cfg.dropout)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        hidden = self.act(self.fc1(x)) if self.gate is None else self.act(self.gate(x)) * self.fc1(x)
        return self.dropout(self.fc2(hidden))


class MoE(nn.Module):
    """Token-choice top-k mixture of `MLP` experts (A. Q. Jiang et al., "Mixtral of Experts",
    arXiv:2401.04088): router logits r = x W_r^T (X of them), the top_k experts of p = softmax(r), their
    weights renormalized to sum to 1, y = sum_i w_i expert_i(x); dropless. ``stats``: the latest forward's
    `router_losses`."""

    def __init__(self, cfg: TransformerConfig):
        super().__init__()
        self.top_k = cfg.top_k
        self.router = Linear(cfg.d_model, cfg.n_experts)
        self.experts = nn.ModuleList(MLP(cfg) for _ in range(cfg.n_experts))
        self.stats: tuple[torch.Tensor, torch.Tensor] | None = None

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        flat = x.reshape(-1, x.shape[-1])
        logits = self.router(flat)
        # the softmax in float32 at least (Mixtral's), in float64 for a float64 model
        probs = torch.softmax(logits.to(torch.promote_types(logits.dtype, torch.float32)), dim=-1)
        top, chosen = self.route(probs)
        weights = (top / top.sum(dim=-1, keepdim=True)).to(flat.dtype)
        self.stats = router_losses(logits, probs, chosen)
        out = torch.zeros_like(flat)
        slots = chosen.reshape(-1).argsort(stable=True)  # (token, choice) slots, grouped by expert
        counts = torch.bincount(chosen.reshape(-1), minlength=len(self.experts)).tolist()
        # every expert runs, on no tokens too: DDP's and FSDP2's reductions need a gradient on every rank
        for expert, part in zip(self.experts, slots.split(counts)):
            rows = part // self.top_k
            out.index_add_(0, rows, expert(flat[rows]) * weights.reshape(-1)[part, None])
        return out.view_as(x)


    def route(self, probs: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """The top_k scores of each token and their experts; a stable sort, not topk, so among equal
        probabilities (copied experts) the lowest index wins whatever the batch's shape."""
        return tuple(t[:, :self.top_k] for t in probs.sort(dim=-1, descending=True, stable=True))


_COUNTS_REDUCE: ContextVar = ContextVar("counts_reduce", default=None)


@contextmanager
def routing_counts_summed(reduce):
    """Within it, `router_losses` sums its routing counts over the ranks with ``reduce``: the whole batch's balance."""
    token = _COUNTS_REDUCE.set(reduce)
    try:
        yield
    finally:
        _COUNTS_REDUCE.reset(token)


def router_losses(logits: torch.Tensor, probs: torch.Tensor, chosen: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """The load-balancing loss X sum_e f_e P_e (f_e: the share of tokens routed to expert e, P_e: its mean
    router probability; W. Fedus, B. Zoph and N. Shazeer, "Switch Transformers", JMLR 2022, Eq. 4, with top_k
    choices as transformers' Mixtral counts them: top_k at balance) and the router z-loss mean_t
    logsumexp(r_t)^2 (B. Zoph et al., "ST-MoE", arXiv:2202.08906, Eq. 5). Under `routing_counts_summed` f is
    the ranks' together, P this rank's."""
    X = probs.shape[-1]
    counts = torch.zeros(X + 1, dtype=probs.dtype, device=probs.device)
    counts[:X].index_add_(0, chosen.reshape(-1), torch.ones(chosen.numel(), dtype=probs.dtype, device=probs.device))
    counts[X] = probs.shape[0]
    reduce = _COUNTS_REDUCE.get()
    if reduce is not None:
        reduce([counts])
    balance = X * (counts[:X] / counts[X] * probs.mean(dim=0)).sum()
    z = torch.logsumexp(logits.to(probs.dtype), dim=-1).pow(2).mean()
    return balance, z


class Block(nn.Module):
    def __init__(self, cfg: TransformerConfig):
        super().__init__()
        self.attn_norm = RMSNorm(cfg.d_model, cfg.norm_eps)
        self.attn = Attention(cfg)
        self.mlp_norm = RMSNorm(cfg.d_model, cfg.norm_eps)
        self.mlp = MoE(cfg) if cfg.moe else MLP(cfg)
        self.resid_dropout = Dropout(cfg.dropout)
        self.flags = active_flags(cfg)  # plugin flags (grow.flags); none: the plain forward
        for flag in self.flags:
            flag.build(self, cfg)

    def forward(self, x: torch.Tensor, score_hook=None, rope=None) -> torch.Tensor:
        y = self.resid_dropout(self.attn(self.attn_norm(x), score_hook, rope))
        x = x + (self.residual("attn", y) if self.flags else y)
        y = self.mlp(self.mlp_norm(x))
        return x + (self.residual("mlp", y) if self.flags else y)

    def residual(self, branch: str, y: torch.Tensor) -> torch.Tensor:
        """A branch's output through each plugin flag's `residual` hook."""
        for flag in self.flags:
            y = flag.residual(self, branch, y)
        return y


IGNORE_INDEX = -100  # a target that does not count (F.cross_entropy's default)
CE_CHUNK_ENTRIES = 1 << 26  # logits entries per chunk of the loss on an accelerator (256 MB of float32)
CE_CHUNK_ENTRIES_CPU = 1 << 20  # ... on a CPU: 4 MB, kept in cache (measured: docs/model.md, "The loss")


def ce_chunk_entries(device: torch.device) -> int:
    """Logits entries per chunk of `linear_cross_entropy` on ``device``."""
    return CE_CHUNK_ENTRIES_CPU if device.type == "cpu" else CE_CHUNK_ENTRIES


def _compute_dtype(x: torch.Tensor, weight: torch.Tensor) -> torch.dtype:
    """The dtype a matmul of ``x`` and ``weight`` runs in here: autocast's, else the weight's."""
    device = x.device.type
    if torch.is_autocast_enabled(device):
        return torch.get_autocast_dtype(device)
    return weight.dtype


class _LinearCrossEntropy(torch.autograd.Function):
    """``mean_i CE(mult * x_i W^T, y_i)`` over the targets that count, one chunk of tokens at a time, its
    gradients computed in the forward: dL/dz = (softmax(z) - onehot(y)) / n, dL/dx = mult dz W,
    dL/dW += mult dz^T x; backward scales them (docs/model.md, "The loss")."""

    @staticmethod
    def forward(ctx, x, weight, targets, mult: float, dtype: torch.dtype, grad: bool):
        n = (targets != IGNORE_INDEX).sum().clamp_min(1)
        w = weight.to(dtype)
        acc = torch.promote_types(weight.dtype, torch.float32)
        # ``grad``: the caller's grad mode; needs_input_grad follows requires_grad even under torch.no_grad()
        gx = torch.empty_like(x) if grad and ctx.needs_input_grad[0] else None
        gw = torch.zeros(weight.shape, dtype=acc, device=weight.device) if grad and ctx.needs_input_grad[1] else None
        total = torch.zeros((), dtype=torch.promote_types(x.dtype, torch.float32), device=x.device)
        chunk = max(1, ce_chunk_entries(x.device) // weight.shape[0])
        for lo in range(0, x.shape[0], chunk):
            xs, ys = x[lo:lo + chunk].to(dtype), targets[lo:lo + chunk]
            z = F.linear(xs, w)
            z = (z if mult == 1.0 else z * mult).to(total.dtype)
            total += F.cross_entropy(z, ys, ignore_index=IGNORE_INDEX, reduction="sum")
            if gx is None and gw is None:
                continue
            dz = torch.softmax(z, dim=-1)
            keep = ys != IGNORE_INDEX
            # a scatter, not boolean indexing (nonzero() syncs the host); an ignored row adds -0.0, zeroed below
            dz.scatter_add_(1, ys.clamp_min(0).unsqueeze(1), -keep.to(dz.dtype).unsqueeze(1))
            dz.mul_((keep.to(dz.dtype) / n).unsqueeze(1))
            dz = dz.to(dtype) if mult == 1.0 else (dz * mult).to(dtype)
            if gx is not None:
                gx[lo:lo + chunk] = dz @ w
            if gw is not None:
                gw += (dz.t() @ xs).to(acc)
        ctx.save_for_backward(*(t for t in (gx, gw) if t is not None))
        ctx.has = (gx is not None, gw is not None)
        return total / n

    @staticmethod
    def backward(ctx, grad):
        saved = iter(ctx.saved_tensors)
        gx, gw = (next(saved) * grad if has else None for has in ctx.has)
        return gx, gw, None, None, None, None


LOSS_OVERRIDE: list = []  # a training step's other loss kernel while `grow.kernels.training` runs it (trainer.loss_kernel)


def linear_cross_entropy(x: torch.Tensor, weight: torch.Tensor, targets: torch.Tensor, mult: float = 1.0):
    """Mean cross-entropy of the logits ``mult * x @ weight.T`` (x: (N, h), weight: (V, h), targets: (N,),
    IGNORE_INDEX ignored), never materializing them (`_LinearCrossEntropy`, or liger's under
    ``trainer.loss_kernel``); eager behind a graph break under torch.compile (docs/model.md, "The loss")."""
    fn = LOSS_OVERRIDE[-1] if LOSS_OVERRIDE else chunked_cross_entropy
    if torch.compiler.is_compiling():
        from grow.eager import run_eagerly  # start-up speed

        return run_eagerly(fn, x, weight, targets, mult)
    return fn(x, weight, targets, mult)


def chunked_cross_entropy(x: torch.Tensor, weight: torch.Tensor, targets: torch.Tensor, mult: float = 1.0):
    """`linear_cross_entropy`'s work, as eager code runs it."""
    return _LinearCrossEntropy.apply(x, weight, targets, float(mult), _compute_dtype(x, weight),
                                     torch.is_grad_enabled())


class Transformer(nn.Module):
    """``model(idx[B, T]) -> logits[B, T, V]``; ``model(idx, targets) -> (None, mean CE loss)``: with
    targets the loss comes from `linear_cross_entropy`, which never holds the whole logits."""

    def __init__(self, cfg: TransformerConfig, *, generator: torch.Generator | None = None):
        super().__init__()
        self.config = cfg
        # _weight: skip nn.Embedding's init (reset_parameters fills it; on meta it would import torch._dynamo)
        self.wte = nn.Embedding(cfg.vocab_size, cfg.d_model, _weight=torch.empty(cfg.vocab_size, cfg.d_model))
        self.wpe = (nn.Embedding(cfg.seq_len, cfg.d_model, _weight=torch.empty(cfg.seq_len, cfg.d_model))
                    if cfg.positions == "learned" else None)
        self.drop = Dropout(cfg.dropout)
        self.layers = nn.ModuleList(Block(cfg) for _ in range(cfg.n_layers))
        self.norm = RMSNorm(cfg.d_model, cfg.norm_eps)
        self.lm_head = Linear(cfg.d_model, cfg.vocab_size)
        if cfg.tie_embeddings:
            self.lm_head.weight = self.wte.weight
        if cfg.parametrization == "mup":
            self.lm_head.mult = 1.0 / cfg.width_mult  # mup's output multiplier 1/m (grow/mup.py)
        self.reset_parameters(generator)

    @torch.no_grad()
    def reset_parameters(self, generator: torch.Generator | None = None) -> None:
        """Fill every parameter from `init_like`; meta tensors are left alone."""
        for name, p in self.named_parameters():
            if p.is_meta:
                continue
            p.copy_(init_like(self.config, name, p.shape, dtype=p.dtype, generator=generator))

    def forward(self, idx: torch.Tensor, targets: torch.Tensor | None = None, *, score_hook=None):
        B, T = idx.shape
        if T > self.config.seq_len:
            raise ValueError(f"sequence length {T} exceeds seq_len={self.config.seq_len}")
        x = self.wte(idx)
        if self.config.embed_scale != 1.0:  # Gemma's sqrt(d), a constant of the config (kept as d grows)
            x = x * self.config.embed_scale
        if self.wpe is not None:
            x = x + self.wpe(torch.arange(T, device=idx.device))
        x = self.drop(x)
        rope = self.rope(T, x)
        for n, layer in enumerate(self.layers):
            hook = None if score_hook is None else (lambda s, n=n: score_hook(n, s))
            x = layer(x, hook, rope)
        x = self.norm(x)
        if targets is None:
            return self.lm_head(x)
        head = self.lm_head
        loss = linear_cross_entropy(x.reshape(-1, x.size(-1)), head.weight, targets.reshape(-1), head.mult)
        if self.config.moe and self.training:  # the training objective; an evaluation's loss is the cross-entropy
            balance, z = self.router_losses()
            loss = loss + self.config.router_aux_coef * balance + self.config.router_z_coef * z
        return None, loss

    def router_losses(self) -> tuple[torch.Tensor, torch.Tensor]:
        """The latest forward's load-balancing and z losses (`router_losses`), each the mean over the layers."""
        stats = [layer.mlp.stats for layer in self.layers]
        return tuple(torch.stack([s[i] for s in stats]).mean() for i in range(2))

    def router_metrics(self) -> dict[str, float]:
        """The latest training forward's router losses, to log (none for a dense model)."""
        if not self.config.moe or self.layers[0].mlp.stats is None:
            return {}
        balance, z = self.router_losses()
        return {"train/router_balance": float(balance.detach()), "train/router_z": float(z.detach())}

    def rope(self, T: int, x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor] | None:
        """The rotary table every layer turns by, in the attention's compute dtype; None with learned positions."""
        cfg = self.config
        if cfg.positions != "rope":
            return None
        device = x.device.type
        dtype = torch.get_autocast_dtype(device) if torch.is_autocast_enabled(device) else x.dtype
        return rope_table(T, cfg.d_qk, cfg.rope_theta, x.device, dtype, cfg.rope_anchor,
                          cfg if cfg.rope_factor != 1.0 else None)

    def num_params(self) -> int:
        return sum(p.numel() for p in self.parameters())
