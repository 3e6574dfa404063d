"""grow's `Transformer` as a ``transformers`` model (``trust_remote_code=True``; docs/hf.md): a thin
wrapper, not a second implementation. ``grow export`` writes this file beside the weights with grow/model.py
vendored verbatim as ``grow_model.py`` (`grow.hf.remote.save_remote`), so the export needs torch and
transformers only. The weights are the wrapped model's (``model.<grow name>``), multipliers folded. No
key/value cache: ``generate`` recomputes the window (the models grow exports are small); no padding."""

from __future__ import annotations

import dataclasses

import torch
import torch.nn.functional as F
from transformers import GenerationMixin, PretrainedConfig, PreTrainedModel
from transformers.modeling_outputs import CausalLMOutputWithPast

try:  # in an exported directory: grow/model.py, vendored beside this file
    from .grow_model import IGNORE_INDEX, Transformer, TransformerConfig
except ImportError:  # in grow itself
    from grow.model import IGNORE_INDEX, Transformer, TransformerConfig

FIELDS = {f.name: f.default for f in dataclasses.fields(TransformerConfig) if f.name != "flags"}  # no plugin flags
# fields stored under transformers' names: a config attribute ``top_k`` is a generation parameter to transformers
RENAMED = {"top_k": "num_experts_per_tok"}


class GrowConfig(PretrainedConfig):
    """`TransformerConfig`'s fields as a ``PretrainedConfig``, under transformers' names too."""

    model_type = "grow"
    attribute_map = {"num_hidden_layers": "n_layers", "hidden_size": "d_model", "num_attention_heads": "n_heads",
                     "max_position_embeddings": "seq_len", "intermediate_size": "d_ff"}

    def __init__(self, **kwargs):
        for key, default in FIELDS.items():
            name = RENAMED.get(key, key)
            setattr(self, name, kwargs.pop(key, kwargs.pop(name, default)))
        kwargs["tie_word_embeddings"] = False  # the export writes W_out itself
        kwargs.setdefault("use_cache", False)  # no key/value cache
        super().__init__(**kwargs)

    def grow_config(self) -> TransformerConfig:
        return TransformerConfig(**{key: getattr(self, RENAMED.get(key, key)) for key in FIELDS})


class GrowForCausalLM(PreTrainedModel, GenerationMixin):
    config_class = GrowConfig
    base_model_prefix = "model"
    _no_split_modules = ["Block"]

    def __init__(self, config: GrowConfig):
        super().__init__(config)
        self.model = Transformer(config.grow_config())
        self.post_init()

    def _init_weights(self, module):
        pass  # every weight comes from the checkpoint

    def state_dict(self, *args, **kwargs):
        """The tensors only: grow's Linear multipliers (extra state, not tensors) are folded into the weights."""
        sd = super().state_dict(*args, **kwargs)
        for key in [k for k, v in sd.items() if not isinstance(v, torch.Tensor)]:
            del sd[key]
        return sd

    @classmethod
    def _supports_default_dynamic_cache(cls) -> bool:
        return False  # generate's no-cache path, whatever use_cache says

    def get_input_embeddings(self):
        return self.model.wte

    def set_input_embeddings(self, value):
        self.model.wte = value

    def prepare_inputs_for_generation(self, input_ids, **kwargs):
        return {"input_ids": input_ids[:, -self.config.seq_len:], "attention_mask": kwargs.get("attention_mask")}

    def forward(self, input_ids=None, attention_mask=None, labels=None, **kwargs):
        if attention_mask is not None and not bool(attention_mask.all()):
            raise ValueError("GrowForCausalLM does not support padding: give unpadded rows (attention_mask all ones)")
        logits = self.model(input_ids)
        loss = None
        if labels is not None:
            loss = F.cross_entropy(logits[:, :-1].reshape(-1, logits.shape[-1]).float(), labels[:, 1:].reshape(-1),
                                   ignore_index=IGNORE_INDEX)
        return CausalLMOutputWithPast(loss=loss, logits=logits)
