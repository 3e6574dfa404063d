"""``grow export``: a run's checkpoint as a Hugging Face model directory (docs/hf.md).

The directory holds what ``AutoModelForCausalLM.from_pretrained(out)`` and ``AutoTokenizer.from_pretrained(out)``
load without a network (`load_hint`): ``config.json`` and ``model.safetensors`` of a ``LlamaForCausalLM``
(`grow.hf.llama`) or, for any other grow model, of a ``GrowForCausalLM`` with grow's own code (`grow.hf.remote`),
the run's tokenizer as a ``PreTrainedTokenizerFast`` that prepends the end-of-text token as ``grow sample`` does,
``generation_config.json`` (greedy up to the model's context, as ``grow sample temperature=0``) and a ``README.md`` model card
(the run's model, plan, strategy, tokens and final validation loss, from its summary). Every file is written
with the mode umask gives (transformers writes the weights 0600).
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path

import torch
from omegaconf import DictConfig

from grow import runs
from grow.data.config import EOT
from grow.errors import ConfigError
from grow.hf import require
from grow.hf.llama import llama_blockers, to_llama
from grow.hf.mixtral import mixtral_blockers, to_mixtral
from grow.hf.remote import save_remote, to_remote

TOKENIZER_CLASS = "PreTrainedTokenizerFast"  # what every transformers version loads from tokenizer.json
DTYPES = {"float32": torch.float32, "bfloat16": torch.bfloat16, "float64": torch.float64}


@dataclass(frozen=True)
class ExportConfig:
    """``grow export``'s config (configs/export.yaml), checked once by `from_node`."""

    run: str
    ckpt: str | None
    out: Path
    dtype: str

    @classmethod
    def from_node(cls, cfg: DictConfig) -> "ExportConfig":
        """A run with a checkpoint, an output directory that is empty or absent, a dtype; `ConfigError`."""
        runs.require_checkpoint(cfg, "grow export run=<run dir> out=<dir>")
        if cfg.get("out") in (None, "", "???"):
            raise ConfigError("out", cfg.get("out"), "give the directory to write: out=<dir> (absent or empty)")
        out = Path(str(cfg.out)).expanduser()
        if out.exists() and (not out.is_dir() or any(out.iterdir())):
            raise ConfigError("out", str(out), "exists and is not an empty directory (nothing is overwritten)")
        if str(cfg.dtype) not in DTYPES:
            raise ConfigError("dtype", cfg.dtype, f"must be one of {', '.join(DTYPES)}")
        require("command", "export", "safetensors", "transformers")
        return cls(run=str(cfg.run), ckpt=None if cfg.ckpt is None else str(cfg.ckpt), out=out, dtype=str(cfg.dtype))


def check(cfg: DictConfig) -> "ExportConfig":
    """The command's validation, before any work (`grow.commands.precheck`): the command's settings."""
    return ExportConfig.from_node(cfg)


def hf_tokenizer(tokenizer_file: Path, context: int, eot: str = EOT):
    """The run's tokenizer as a ``PreTrainedTokenizerFast``, its end-of-text token as BOS, EOS and padding, and
    prepended to every text it encodes (with ``add_special_tokens``, transformers' default): the document start
    grow trains on and ``grow sample`` conditions on (`grow.sampling.sample`), so ``generate(**tok(text))``
    continues what ``grow sample`` continues; ``context`` tokens at most (the model's). ``eot``: the run's
    (`grow.runs.eot_token`: a pretrained checkpoint's own end of sequence when the run started from one)."""
    from tokenizers import Tokenizer
    from tokenizers.processors import TemplateProcessing
    from transformers import PreTrainedTokenizerFast

    tok = Tokenizer.from_file(str(tokenizer_file))
    # a pretrained checkpoint's own template (Llama's "<s> $A") stays, the document start before it: training
    # encoded each document with it, and grow sample's prompt is [eot, *encode(text)]
    own, specials = own_template(tok)
    start = [(eot, tok.token_to_id(eot)), *specials]
    tok.post_processor = TemplateProcessing(single=f"{eot} {own}", pair=f"{eot} {own} {eot} $B:1", special_tokens=start)
    # unk_token too: transformers 5's AutoTokenizer loads a Qwen2 export as Qwen2Tokenizer, which adds its default
    # unknown token "<|endoftext|>" as a new id past the model's vocabulary when none is named (byte-level: never used)
    return PreTrainedTokenizerFast(tokenizer_object=tok, bos_token=eot, eos_token=eot, pad_token=eot, unk_token=eot,
                                   model_max_length=context)


def own_template(tok) -> tuple[str, list[tuple[str, int]]]:
    """The single-text template of a tokenizer's own ``TemplateProcessing`` ("<s> $A": Llama's; "$A" without one)
    and its special tokens (name, id)."""
    import json

    state = json.loads(tok.to_str()).get("post_processor") or {}
    if state.get("type") != "TemplateProcessing":
        return "$A", []
    pieces = [p["SpecialToken"]["id"] if "SpecialToken" in p else "$A" for p in state["single"]]
    return " ".join(pieces), [(name, int(v["ids"][0])) for name, v in state["special_tokens"].items()]


def model_card(run_dir: Path, meta: dict, payload: dict, cfg, arch: str) -> str:
    """The README.md of an exported model: what the run was and how far it got, from its own files."""
    summary = _summary(run_dir)
    config = payload.get("config") or {}
    schedule = config.get("schedule")
    strategy = (config.get("strategy") or {}).get("name") if schedule else "baseline (fixed size)"
    lines = ["---", "library_name: transformers", "tags: [grow, growth]", "---", "",
             f"# {run_dir.name}", "",
             f"Exported by `grow export` from `{run_dir}` (checkpoint `{meta['file']}`, step {meta['step']}, "
             f"stage {int(meta['stage']) + 1}).", "",
             "| | |", "| --- | --- |",
             f"| architecture | {arch}: {cfg.n_layers} layers, hidden {cfg.d_model}, {cfg.n_heads} heads "
             f"({cfg.kv_heads} key/value), head sizes {cfg.d_qk} (query/key) and {cfg.d_v} (value), MLP {cfg.d_ff}, vocabulary {cfg.vocab_size}, "
             f"context {cfg.seq_len} |",
             f"| strategy | {strategy} |"]
    if schedule:
        lines.append(f"| schedule | `{json.dumps(schedule, sort_keys=True)}` |")
    for key, label in (("tokens", "tokens trained"), ("final_val_loss", "final validation loss (nats/token)"),
                       ("flops", "training FLOPs")):
        if summary.get(key) is not None:
            lines.append(f"| {label} | {summary[key]} |")
    lines += ["", f"Load it with {load_hint('<this directory>', arch)}; documents start after the end-of-text "
              f"token `{runs.eot_token(payload['config'])}` (the BOS token here), as in training, and the tokenizer prepends it. `generate()` "
              f"with its defaults decodes greedily up to the context ({cfg.seq_len} tokens): `grow sample "
              f"temperature=0`'s tokens.", ""]
    return "\n".join(lines)


def load_hint(out, arch: str) -> str:
    """How to load an export: grow's own code needs ``trust_remote_code=True`` for the model and for the tokenizer
    (transformers' ``AutoTokenizer`` reads the model's config first); ``PreTrainedTokenizerFast`` runs none."""
    if arch in ("LlamaForCausalLM", "MixtralForCausalLM"):
        return f"`AutoModelForCausalLM.from_pretrained('{out}')` and `AutoTokenizer.from_pretrained('{out}')`"
    return (f"`AutoModelForCausalLM.from_pretrained('{out}', trust_remote_code=True)` and "
            f"`AutoTokenizer.from_pretrained('{out}', trust_remote_code=True)` (or "
            f"`PreTrainedTokenizerFast.from_pretrained('{out}')`, which runs no code)")


def _summary(run_dir: Path) -> dict:
    try:
        return json.loads((run_dir / "summary.json").read_text())
    except (OSError, ValueError):
        return {}


def export(cfg: ExportConfig) -> Path:
    """Write the run's checkpoint to ``cfg.out`` (`write_model`); returns it."""
    run_dir, meta = runs.checkpoint_of(cfg)
    model, payload = runs.load_model(meta, "cpu")
    return write_model(run_dir, meta, (model, payload), cfg.out, cfg.dtype)


def write_model(run_dir: Path, meta: dict, loaded, out: Path, dtype: str = "float32") -> Path:
    """The checkpoint ``meta`` of ``run_dir`` (``loaded`` = (model, payload), `grow.runs.load_model`) as a
    model directory in ``out``: a ``LlamaForCausalLM`` or ``MixtralForCausalLM`` when it is one, else a ``GrowForCausalLM`` with grow's
    code; the tokenizer, the generation config, the model card."""
    from transformers.utils import logging as hf_logging

    hf_logging.disable_progress_bar()  # the command prints what it wrote
    model, payload = loaded
    tok, tok_path = runs.load_tokenizer(run_dir, payload["config"], model.config.vocab_size)
    native = not llama_blockers(model.config) or not mixtral_blockers(model.config)
    convert = to_remote if not native else to_mixtral if model.config.moe else to_llama
    try:
        hf = convert(model.double(), DTYPES[dtype])
    except ValueError as exc:
        raise ConfigError("ckpt", meta["file"], str(exc)) from None
    eot = tok.token_to_id(runs.eot_token(payload["config"]))
    hf.config.bos_token_id = hf.config.eos_token_id = hf.config.pad_token_id = eot
    hf.generation_config.bos_token_id = hf.generation_config.eos_token_id = eot
    hf.generation_config.pad_token_id = eot
    # generate()'s default length: the model's context (transformers' own default is 20 tokens), greedy; grow sample
    # crops its context to seq_len, so beyond it the two would part
    hf.generation_config.max_length, hf.generation_config.do_sample = model.config.seq_len, False
    out.mkdir(parents=True, exist_ok=True)
    save_remote(hf, out) if not native else hf.save_pretrained(out, safe_serialization=True)
    hf_tokenizer(tok_path, model.config.seq_len, runs.eot_token(payload["config"])).save_pretrained(out)
    tok_config = json.loads((out / "tokenizer_config.json").read_text())  # transformers 5 names its own class
    (out / "tokenizer_config.json").write_text(json.dumps({**tok_config, "tokenizer_class": TOKENIZER_CLASS}, indent=2))
    card = out / "README.md"
    card.write_text(model_card(run_dir, meta, payload, model.config, type(hf).__name__))
    for path in out.iterdir():  # the mode of a file written plainly (umask's), for the weights too
        path.chmod(card.stat().st_mode & 0o777)
    return out
