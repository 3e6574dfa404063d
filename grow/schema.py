"""The parameter schema: for a `TransformerConfig`, which parameters each growth dimension reaches, along which
axis and in which role (docs/model.md, "Parameter schema"). The one place a flag (biases, q/k norms, a gate,
experts, tied embeddings, learned positions, `grow.flags`) adds a parameter; the expansions and the strategies
that map parameters by name read it instead of spelling the names.
"""

from __future__ import annotations

from dataclasses import dataclass

from grow import flags

# a layer's attention projections, by the size they are per head: query and key k, value v
_QK, _V = ("attn.q", "attn.k"), "attn.v"


@dataclass(frozen=True)
class Entry:
    """One parameter a dimension reaches. ``key``: its name in a layer ("mlp.fc1.weight") or in the model
    ("wte.weight"); ``axis``: the axis that grows; ``role``: "in" (it computes the new units: their rows
    write them), "out" (it reads the new units), "gain" (a norm's) or "scale" (a branch's
    per-channel multiplier: old entries kept); ``zero``: its new entries are 0 for
    the function to stay (Gesmundo & Maile, Thm 3.1-3.5); ``per``: the letter the axis is a product with
    (heads "E" or "G" for k and v, head sizes "k" or "v" for E; "" when the axis is the dimension alone)."""

    key: str
    axis: int
    role: str
    zero: bool = False
    per: str = ""


def ffn_prefixes(cfg) -> list[str]:
    """The feed-forward MLPs of a layer: the dense one, or each expert of a mixture (`grow.model.MoE`)."""
    return [f"mlp.experts.{j}." for j in range(cfg.n_experts)] if cfg.moe else ["mlp."]


def _biases(cfg, names, flag: bool) -> list[str]:
    return [f"{n}.bias" for n in names] if flag else []


def _h_layer(cfg) -> list[Entry]:
    """h: the norm gains, the matrices that read the residual stream (zero-free) and the writers (zero)."""
    out = [Entry("attn_norm.weight", 0, "gain")]
    out += [Entry(f"{n}.weight", 1, "out") for n in (*_QK, _V)]
    out += [Entry("attn.o.weight", 0, "in", True), Entry("mlp_norm.weight", 0, "gain")]
    if cfg.moe:
        out.append(Entry("mlp.router.weight", 1, "out"))
    for mlp in ffn_prefixes(cfg):
        out.append(Entry(mlp + "fc1.weight", 1, "out"))
        out += [Entry(mlp + "gate.weight", 1, "out")] if cfg.gated else []
        out.append(Entry(mlp + "fc2.weight", 0, "in", True))
        out += [Entry(b, 0, "in", True) for b in _biases(cfg, [mlp + "fc2"], cfg.mlp_bias)]
    return out


def _p_layer(cfg) -> list[Entry]:
    """p: each MLP's neurons, computed by fc1 (and the gate), read by fc2 (zero: Thm 3.1)."""
    out = []
    for mlp in ffn_prefixes(cfg):
        out.append(Entry(mlp + "fc1.weight", 0, "in"))
        out += [Entry(b, 0, "in") for b in _biases(cfg, [mlp + "fc1"], cfg.mlp_bias)]
        out += [Entry(mlp + "gate.weight", 0, "in")] if cfg.gated else []
        out.append(Entry(mlp + "fc2.weight", 1, "out", True))
    return out


def _E_layer(cfg) -> list[Entry]:
    """E: the query heads; under grouped-query attention (``n_kv_heads``) the key/value heads stay (the new
    query heads join the groups), without it every head has its own key and value and they grow too."""
    sides = ("attn.q",) if cfg.n_kv_heads is not None else (*_QK, _V)
    out = []
    for n in sides:
        out.append(Entry(f"{n}.weight", 0, "in", per="v" if n == _V else "k"))
        out += [Entry(b, 0, "in", per="v" if n == _V else "k") for b in _biases(cfg, [n], cfg.qkv_bias)]
    return out + [Entry("attn.o.weight", 1, "out", True, per="v")]


def _k_layer(cfg) -> list[Entry]:
    """k: each query head's and key head's coordinates (W^K zero: Thm 3.4); Qwen3's per-head norms, whose
    gain is k long (`grow.growth.base.check_growth` refuses k under them)."""
    out = [Entry("attn.q.weight", 0, "in", per="E"), Entry("attn.k.weight", 0, "out", True, per="G")]
    if cfg.qkv_bias:
        out += [Entry("attn.q.bias", 0, "in", per="E"), Entry("attn.k.bias", 0, "out", True, per="G")]
    if cfg.qk_norm:
        out += [Entry("attn.q_norm.weight", 0, "gain"), Entry("attn.k_norm.weight", 0, "gain")]
    return out


def _v_layer(cfg) -> list[Entry]:
    """v: each value head's coordinates, read by W^O's columns of its query heads (zero: Thm 3.3)."""
    out = [Entry("attn.v.weight", 0, "in", per="G"), Entry("attn.o.weight", 1, "out", True, per="E")]
    return out + [Entry(b, 0, "in", per="G") for b in _biases(cfg, [_V], cfg.qkv_bias)]


def _X_layer(cfg) -> list[Entry]:
    """X: the router's rows (one an expert) and each expert's parameters, whole (an expert is the unit, as a
    layer is N's: `grow.growth.experts` copies it)."""
    prefixes = tuple(ffn_prefixes(cfg))
    keys = dict.fromkeys(e.key for e in (*_p_layer(cfg), *_h_layer(cfg)) if e.key.startswith(prefixes))
    return [Entry("mlp.router.weight", 0, "in")] * cfg.moe + [Entry(k, 0, "unit") for k in keys]


LAYER = {"h": _h_layer, "k": _k_layer, "v": _v_layer, "p": _p_layer, "E": _E_layer, "X": _X_layer}


def layer(cfg, dim: str) -> list[Entry]:
    """The entries of one layer that dimension ``dim`` (h, k, v, p, E, X) reaches, keys relative to the layer,
    then each plugin flag's (`grow.flags.ModelFlag.schema`)."""
    return LAYER[dim](cfg) + [e for flag in flags.active(cfg) for e in flag.schema(cfg, dim)]


def _embeddings(cfg) -> list[Entry]:
    """h: the embeddings write the residual stream (their new columns zero: Thm 3.5)."""
    return [Entry("wte.weight", 1, "in", True)] + [Entry("wpe.weight", 1, "in", True)] * (cfg.positions == "learned")


def _head(cfg) -> list[Entry]:
    """h: the final norm's gain, and an untied output layer reading the stream (tied, it is the embedding)."""
    return [Entry("norm.weight", 0, "gain")] + [Entry("lm_head.weight", 1, "out")] * (not cfg.tie_embeddings)


def trunk(cfg, dim: str) -> list[Entry]:
    """The entries outside the layers ``dim`` reaches: h's embeddings, final norm and output layer; none else."""
    return _embeddings(cfg) + _head(cfg) if dim == "h" else []


def entries(cfg, dim: str) -> list[tuple[str, Entry]]:
    """(full name, entry) of every parameter ``dim`` reaches, in the model's order: embeddings, layers, head."""
    inner = [(f"layers.{n}.{e.key}", e) for n in range(cfg.n_layers) for e in layer(cfg, dim)]
    if dim != "h":
        return inner
    return [(e.key, e) for e in _embeddings(cfg)] + inner + [(e.key, e) for e in _head(cfg)]


SIZES = {"h": "d_model", "k": "d_qk", "v": "d_v", "p": "d_ff", "E": "n_heads", "X": "n_experts"}  # letter -> field


def size(cfg, letter: str) -> int:
    """The size a letter of `Entry` stands for in ``cfg`` (G: the key/value heads; "": 1)."""
    return cfg.kv_heads if letter == "G" else 1 if letter == "" else getattr(cfg, SIZES[letter])


def length(cfg, key: str, axis: int) -> int:
    """The length of parameter ``key``'s ``axis`` (a layer's or the trunk's), as the schema declares it."""
    for dim in LAYER:
        for e in layer(cfg, dim) + trunk(cfg, dim):
            if e.key == key and e.axis == axis and e.role != "unit":
                return size(cfg, dim) * size(cfg, e.per)
    raise KeyError(f"no growth dimension reaches axis {axis} of {key!r}")


def layer_keys(cfg) -> list[str]:
    """Every parameter of a layer (the unit of N: a new layer has them all), in the schema's order."""
    return list(dict.fromkeys(e.key for dim in LAYER for e in layer(cfg, dim)))


def layer_writers(cfg) -> list[str]:
    """A layer's writers of the residual stream (zero in a new layer, which then adds 0: Thm 3.6)."""
    return [e.key for e in layer(cfg, "h") if e.zero]


def param_names(cfg) -> list[str]:
    """Every parameter name of `grow.model.Transformer(cfg)` (a tied output layer is the embedding)."""
    names = [e.key for e in trunk(cfg, "h")]
    return names + [f"layers.{n}.{key}" for n in range(cfg.n_layers) for key in layer_keys(cfg)]
