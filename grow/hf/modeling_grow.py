"""grow's transformer for ``transformers`` (``trust_remote_code=True``): copied by ``grow export`` beside the
weights of a model that is not a ``LlamaForCausalLM`` (the learned-position family, d_qk != d_v, a stage
before the end of its plan), and named in ``config.json``'s ``auto_map``. Self-contained: torch and
transformers only, no grow. It computes what ``grow.model.Transformer`` computes (docs/design.md §3):

    I = E[idx] (+ P for positions: learned),  x <- x + MHA(Norm(x)),  x <- x + MLP(Norm(x)),
    logits = Norm(x) W_out,   Norm(x) = g x / sqrt((sum x^2 + eps) / h)   (eps on the sum of squares)

with rotary positions anchored at ``rope_dim`` (pair i = (x_i, x_{i+k/2}) turns by m theta^(-2i/K)),
grouped-query attention (query head e reads key/value head floor(e / r)), a GELU / ReLU / SwiGLU MLP with
optional biases. Forward multipliers are folded into the weights by the export. No key/value cache:
``generate`` recomputes the window (the models grow exports are small) and padding is not supported.
"""

from __future__ import annotations

import math

import torch
import torch.nn as nn
import torch.nn.functional as F
from transformers import GenerationMixin, PretrainedConfig, PreTrainedModel
from transformers.modeling_outputs import CausalLMOutputWithPast

# the architecture's keys (grow.model.TransformerConfig's) and their defaults
DEFAULTS = {"vocab_size": 4096, "seq_len": 128, "n_layers": 4, "d_model": 256, "n_heads": 4, "d_qk": 64, "d_v": 64,
            "d_ff": 1024, "activation": "gelu", "positions": "learned", "rope_theta": 10000.0, "rope_dim": None,
            "n_kv_heads": None, "mlp_bias": True, "norm_eps": 1e-5}


class GrowConfig(PretrainedConfig):
    model_type = "grow"

    def __init__(self, **kwargs):
        for key, default in DEFAULTS.items():
            setattr(self, key, kwargs.pop(key, default))
        self.max_position_embeddings = self.seq_len
        kwargs["tie_word_embeddings"] = False  # the export writes W_out itself
        super().__init__(**kwargs)


class RMSNorm(nn.Module):
    def __init__(self, dim: int, eps: float):
        super().__init__()
        self.eps = eps
        self.weight = nn.Parameter(torch.ones(dim))

    def forward(self, x):
        return self.weight * x / torch.sqrt((x.pow(2).sum(-1, keepdim=True) + self.eps) / x.shape[-1])


def rotate(x, theta: float, anchor: int):
    T, k = x.shape[-2], x.shape[-1]
    inv = theta ** (-torch.arange(0, k, 2, dtype=torch.float64, device=x.device) / anchor)
    angles = torch.outer(torch.arange(T, dtype=torch.float64, device=x.device), inv)
    angles = torch.cat([angles, angles], dim=-1)
    cos, sin = angles.cos().to(x.dtype), angles.sin().to(x.dtype)
    x1, x2 = x.chunk(2, dim=-1)
    return x * cos + torch.cat([-x2, x1], dim=-1) * sin


class Attention(nn.Module):
    def __init__(self, c: GrowConfig):
        super().__init__()
        self.c, G = c, c.n_kv_heads or c.n_heads
        self.q = nn.Linear(c.d_model, c.n_heads * c.d_qk, bias=False)
        self.k = nn.Linear(c.d_model, G * c.d_qk, bias=False)
        self.v = nn.Linear(c.d_model, G * c.d_v, bias=False)
        self.o = nn.Linear(c.n_heads * c.d_v, c.d_model, bias=False)

    def forward(self, x):
        c, (B, T, _) = self.c, x.shape
        E, G = c.n_heads, c.n_kv_heads or c.n_heads
        q = self.q(x).view(B, T, E, c.d_qk).transpose(1, 2)
        k = self.k(x).view(B, T, G, c.d_qk).transpose(1, 2)
        v = self.v(x).view(B, T, G, c.d_v).transpose(1, 2)
        if c.positions == "rope":
            anchor = c.rope_dim or c.d_qk
            q, k = rotate(q, c.rope_theta, anchor), rotate(k, c.rope_theta, anchor)
        if G != E:
            k, v = k.repeat_interleave(E // G, dim=1), v.repeat_interleave(E // G, dim=1)
        y = F.scaled_dot_product_attention(q, k, v, is_causal=True, scale=1.0 / math.sqrt(c.d_qk))
        return self.o(y.transpose(1, 2).reshape(B, T, E * c.d_v))


class MLP(nn.Module):
    def __init__(self, c: GrowConfig):
        super().__init__()
        self.c = c
        self.fc1 = nn.Linear(c.d_model, c.d_ff, bias=c.mlp_bias)
        self.fc2 = nn.Linear(c.d_ff, c.d_model, bias=c.mlp_bias)
        self.gate = nn.Linear(c.d_model, c.d_ff, bias=False) if c.activation == "swiglu" else None

    def forward(self, x):
        if self.gate is not None:
            return self.fc2(F.silu(self.gate(x)) * self.fc1(x))
        return self.fc2(F.gelu(self.fc1(x)) if self.c.activation == "gelu" else F.relu(self.fc1(x)))


class Block(nn.Module):
    def __init__(self, c: GrowConfig):
        super().__init__()
        self.attn_norm, self.attn = RMSNorm(c.d_model, c.norm_eps), Attention(c)
        self.mlp_norm, self.mlp = RMSNorm(c.d_model, c.norm_eps), MLP(c)

    def forward(self, x):
        x = x + self.attn(self.attn_norm(x))
        return x + self.mlp(self.mlp_norm(x))


class GrowForCausalLM(PreTrainedModel, GenerationMixin):
    config_class = GrowConfig
    base_model_prefix = "grow"
    _supports_cache_class = False

    def __init__(self, config: GrowConfig):
        super().__init__(config)
        c = config
        self.wte = nn.Embedding(c.vocab_size, c.d_model)
        self.wpe = nn.Embedding(c.seq_len, c.d_model) if c.positions == "learned" else None
        self.layers = nn.ModuleList(Block(c) for _ in range(c.n_layers))
        self.norm = RMSNorm(c.d_model, c.norm_eps)
        self.lm_head = nn.Linear(c.d_model, c.vocab_size, bias=False)
        self.post_init()

    def _init_weights(self, module):
        pass  # every weight comes from the checkpoint

    def get_input_embeddings(self):
        return self.wte

    def set_input_embeddings(self, value):
        self.wte = value

    def prepare_inputs_for_generation(self, input_ids, **kwargs):
        return {"input_ids": input_ids[:, -self.config.seq_len:]}

    def forward(self, input_ids=None, attention_mask=None, labels=None, **kwargs):
        T = input_ids.shape[1]
        x = self.wte(input_ids)
        if self.wpe is not None:
            x = x + self.wpe(torch.arange(T, device=input_ids.device))
        for layer in self.layers:
            x = layer(x)
        logits = self.lm_head(self.norm(x))
        loss = None
        if labels is not None:
            loss = F.cross_entropy(logits[:, :-1].reshape(-1, logits.shape[-1]).float(), labels[:, 1:].reshape(-1))
        return CausalLMOutputWithPast(loss=loss, logits=logits)
