"""``grow sample``: text from a run's checkpoint (the model of that point of the run), with the run's own
tokenizer (`grow.runs.load_tokenizer`); the options are in docs/usage.md.

The plain loop, no KV cache (the models are small): the context is ``<|endoftext|>`` and the prompt,
cropped to ``seq_len`` from the left; each step samples from ``softmax(logits / temperature)`` over the
``top_k`` likeliest tokens (``temperature=0``: the likeliest), and stops at ``max_new_tokens`` or
``<|endoftext|>``. Ids the tokenizer does not have are never sampled. The text goes to stdout, the
rest to stderr.
"""

from __future__ import annotations

import sys
from dataclasses import dataclass

import torch
from omegaconf import DictConfig

from grow import runs
from grow.config import ConfigError, check_number, positive_int, validate_device
from grow.console import dims
from grow.console import err_console as err
from grow.device import autocast


@dataclass(frozen=True)
class SampleConfig:
    """``grow sample``'s config (configs/sample.yaml), checked once by `from_node`."""

    run: str
    ckpt: str | None
    prompt: str
    max_new_tokens: int
    temperature: float
    top_k: int | None
    num_samples: int
    seed: int
    device: str
    precision: str

    @classmethod
    def from_node(cls, cfg: DictConfig) -> "SampleConfig":
        """A run with a checkpoint, and sampling settings in range; `ConfigError` naming the key."""
        runs.require_checkpoint(cfg, "grow sample run=<run dir>")
        validate_device(cfg)
        if not isinstance(cfg.seed, int) or isinstance(cfg.seed, bool) or cfg.seed < 0:
            raise ConfigError("seed", cfg.seed, "must be an integer >= 0")
        if not isinstance(cfg.prompt, str):
            raise ConfigError("prompt", cfg.prompt, "must be text (quote it: 'prompt=\"...\"')")
        try:
            cfg.prompt.encode("utf-8")
        except UnicodeEncodeError:  # bytes the shell passed that are not UTF-8 (Python kept them as surrogates)
            raw = cfg.prompt.encode("utf-8", errors="surrogateescape")
            raise ConfigError("prompt", raw, "must be UTF-8 text (these bytes are not: the terminal or the file "
                                             "it came from is in another encoding; convert it, e.g. iconv -t utf-8)"
                              ) from None
        return cls(run=str(cfg.run), ckpt=None if cfg.ckpt is None else str(cfg.ckpt), prompt=cfg.prompt,
                   max_new_tokens=positive_int("max_new_tokens", cfg.max_new_tokens),
                   temperature=check_number("temperature", cfg.temperature, 0),
                   top_k=None if cfg.top_k is None else positive_int("top_k", cfg.top_k),
                   num_samples=positive_int("num_samples", cfg.num_samples), seed=int(cfg.seed),
                   device=str(cfg.device), precision=str(cfg.precision))


def check(cfg: DictConfig) -> "SampleConfig":
    """The command's validation, before any work (`grow.commands.precheck`): the command's settings."""
    return SampleConfig.from_node(cfg)


@dataclass(frozen=True)
class Decoding:
    """How each next token is drawn: ``temperature`` (0: greedy), the ``top_k`` most likely only (None:
    all), ids below ``vocab`` only (None: every logit), and ``stop``: the id after which a row draws no more."""

    temperature: float = 1.0
    top_k: int | None = None
    vocab: int | None = None
    stop: int | None = None


@torch.no_grad()
def generate(model, idx: torch.Tensor, max_new_tokens: int, decoding: Decoding = Decoding(),
             generator: torch.Generator | None = None) -> torch.Tensor:
    """``idx`` [B, T] followed by up to ``max_new_tokens`` tokens per row drawn by ``decoding``; every row
    stops once it drew ``decoding.stop`` (later positions repeat it). Autocast, if any, is the caller's."""
    temperature, top_k, vocab, stop = decoding.temperature, decoding.top_k, decoding.vocab, decoding.stop
    seq_len = model.config.seq_len
    done = torch.zeros(idx.size(0), dtype=torch.bool, device=idx.device)
    for _ in range(max_new_tokens):
        logits = model(idx[:, -seq_len:])[:, -1, :].float()
        if vocab is not None and vocab < logits.size(-1):
            logits[:, vocab:] = -float("inf")
        if temperature == 0:
            nxt = logits.argmax(dim=-1, keepdim=True)
        else:
            logits = logits / temperature
            if top_k is not None and top_k < logits.size(-1):
                kth = torch.topk(logits, top_k, dim=-1).values[:, -1:]
                logits = logits.masked_fill(logits < kth, -float("inf"))
            nxt = torch.multinomial(torch.softmax(logits, dim=-1), 1, generator=generator)
        if stop is not None:
            nxt = torch.where(done[:, None], torch.full_like(nxt, stop), nxt)
            done |= nxt[:, 0] == stop
        idx = torch.cat([idx, nxt], dim=1)
        if stop is not None and bool(done.all()):
            break
    return idx


def sample(cfg: SampleConfig) -> list[str]:
    """Print ``num_samples`` continuations of ``prompt`` from the run's checkpoint; returns the texts."""
    from rich.markup import escape


    c = runs.open_checkpoint(cfg)
    run_dir, meta, model, device, amp, tok, tok_path = c.run_dir, c.meta, c.model, c.device, c.amp, c.tokenizer, \
        c.tokenizer_path
    eot = tok.token_to_id(runs.eot_token(c.payload["config"]))
    prompt = [eot, *tok.encode(str(cfg.prompt)).ids]
    err.print(escape(f"run {run_dir}: checkpoint {meta['file']} (step {meta['step']}, stage {int(meta['stage']) + 1}), "
                     f"{dims(model.config)}, tokenizer {tok_path}"))
    err.print(escape(f"temperature {cfg.temperature}, top_k {cfg.top_k}, seed {cfg.seed}, "
                     f"up to {cfg.max_new_tokens} new tokens; {len(prompt) - 1} prompt tokens"))
    gen = torch.Generator(device).manual_seed(int(cfg.seed))
    idx = torch.tensor([prompt] * int(cfg.num_samples), dtype=torch.long, device=device)
    with autocast(device, amp):
        rule = Decoding(float(cfg.temperature), cfg.top_k, vocab=tok.get_vocab_size(), stop=eot)
        out = generate(model, idx, int(cfg.max_new_tokens), rule, generator=gen)
    texts = []
    for i, row in enumerate(out.tolist(), start=1):
        ids = row[1:]
        ids = ids[: ids.index(eot, len(prompt) - 1)] if eot in ids[len(prompt) - 1:] else ids
        texts.append(tok.decode(ids, skip_special_tokens=True))
        if cfg.num_samples > 1:
            sys.stdout.flush()
            err.print(f"--- sample {i}/{cfg.num_samples}")
        print(texts[-1], flush=True)
    return texts
