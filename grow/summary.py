"""summary.json of a run (`make_summary`): its result, costs, stage plan and growth events, the data's
figures (`data_figures`) and the whole held-out split's loss (`grow.validation.full_validation`).
It reads the run's fixed parts (`grow.loop.RunParts`), its state and its final model, never the trainer.
The quantities: docs/design.md "How a run flows" (the summary) and "Costs and memory" (the FLOPs counted).
"""

from __future__ import annotations

import json
import os
from dataclasses import asdict
from pathlib import Path

from grow import branches
from grow import data as data_lib
from grow.data.floor import bigram_floor, bytes_per_token
from grow.hf import pretrained
from grow.loop import RunParts
from grow.parallel import distributed
from grow.provenance import code_version, machine
from grow.state import RunState
from grow.validation import full_validation


def data_figures(parts: RunParts, tokens: int) -> dict:
    """What a reader needs to judge the loss: the splits' sizes (epochs = tokens / train_tokens) and the
    count-based bigram floor on the run's validation batches (`grow.data.floor`); None for a stand-in
    without token arrays (scripts/gpu_check.py's random tokens)."""
    data = parts.data
    if not isinstance(data, data_lib.TokenData):
        return None
    return {"train_tokens": data.train_tokens, "val_tokens": data.val_tokens,
            "epochs": tokens / max(data.train_tokens, 1),
            **bigram_floor(data.train, parts.val, data.vocab_size), **bytes_per_token(data.val, data.tokenizer_path),
            **_corpus_manifest(data)}


def _corpus_manifest(data) -> dict:
    """data=pysrc: the token cache's manifest (every file read, its hash and tokens) and the corpus's counts."""
    path = data.cache_dir / data_lib.pysrc.MANIFEST if data.cache_dir is not None else None
    if path is None or not path.is_file():
        return {}
    return {"manifest": str(path), "corpus": json.loads(path.read_text())["summary"]}


def make_summary(parts: RunParts, state: RunState, model, final_loss: float, *, trigger: str, wall_seconds: float,
                 load_start: float) -> dict:
    """summary.json: the run's result, costs, stage plan and growth events; ``trigger`` its trigger's
    description, ``load_start`` the 1-minute load average when it started."""
    cfg, plan = parts.cfg, parts.cfg.plan
    stages = [
        {"stage": s.number, "config": s.cfg.to_dict(), "params": s.cfg.num_params(),
         "active_params": s.cfg.active_params(), "tokens": s.tokens,
         "steps": s.steps, "batch_size": s.batch_size, "flops": s.flops,
         "val_loss_end": state.stage_losses[s.index] if s.index < len(state.stage_losses) else None}
        for s in plan
    ]
    return {
        "run_dir": str(parts.run_dir),
        "strategy": cfg.strategy_name,
        "init": cfg.strategy.name if cfg.init_by_strategy else (cfg.init if pretrained.pretrained_dir(cfg.init)
                                                                  else "model"),
        "seed": cfg.seed,
        "stages": len(plan),
        "final_val_loss": final_loss,
        **full_validation(parts, model),  # the whole held-out split (trainer.full_val), evaluation FLOPs apart
        # the second endpoint: the mean logged training loss over the wsd decay phase (trainer.log_every apart)
        "decay_train_loss": state.decay_loss[0] / state.decay_loss[1] if state.decay_loss[1] else None,
        "decay_train_losses": state.decay_loss[1],
        "tokens": state.tokens,
        "flops": state.flops,
        "train_flops": state.flops - state.growth_flops,
        "growth_flops": state.growth_flops,
        "params": model.num_params(),
        "active_params": model.config.active_params(),  # a token's: top_k of n_experts experts (= params if dense)
        "final_config": model.config.to_dict(),
        "wall_seconds": wall_seconds,
        "load_average": [load_start, os.getloadavg()[0]],  # 1-minute load at the start and the end
        "train_seconds": state.train_seconds,
        "compile_seconds": state.compile_seconds,
        "tokens_per_s": state.tokens / max(state.train_seconds, 1e-9),
        "world_size": distributed.world_size(),
        "growth_events": state.growth_events,
        "stage_plan": stages,
        "data": data_figures(parts, state.tokens),
        "trigger": trigger,
        "decay_branches": [str(branches.branch_dir(Path(), b)) for b in cfg.optim.decay_branches],
        "stages_trained": state.trained,  # steps, tokens and FLOPs of each stage as trained
        "stayed_at_stage": None if state.stayed is None else state.stayed + 1,  # the trigger never fired there
        "state": {k: v for k, v in asdict(state).items() if k in ("step", "tokens", "samples", "skipped_nonfinite")},
        "code": code_version(),  # the package version, git commit and torch that trained it
        "machine": machine(),  # the CPU (model, SIMD level, torch's kernels) and GPU it trained on
        "complete": True,
    }
