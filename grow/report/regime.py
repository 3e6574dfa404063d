"""What regime a report's runs are in (docs/statistics.md): non-embedding parameters, the unembedding's share
of the FLOPs, tokens per non-embedding parameter, epochs, bits per byte; and the grown arms' growth settings.
"""

from __future__ import annotations

import math

from grow.console import fmt_num
from grow.model import TransformerConfig


def non_embedding_params(cfg) -> int:
    """The parameters of the layers and the final norm: the token and position tables E, P and the
    unembedding W_out left out (Kaplan et al., "Scaling Laws for Neural Language Models", arXiv 2001.08361)."""
    return cfg.num_params(non_embedding=True) - (0 if cfg.tie_embeddings else cfg.vocab_size * cfg.d_model)


def unembedding_share(cfg) -> float:
    """The unembedding's share of the training FLOPs per token: 6 V h over `flops_per_token`."""
    return 6 * cfg.vocab_size * cfg.d_model / cfg.flops_per_token()


def bits_per_byte(loss: float | None, bytes_per_token: float | None) -> float | None:
    """Nats per token as bits per byte of text: loss / (ln 2 · bytes per token)."""
    if loss is None or not bytes_per_token:
        return None
    return loss / (math.log(2) * bytes_per_token)


def regime(summary: dict) -> dict | None:
    """The final model's regime figures from summary.json's ``scale`` (None before it recorded a model)."""
    sc = summary.get("scale") or {}
    if not sc.get("final_config"):
        return None
    cfg = TransformerConfig.from_dict(sc["final_config"])
    ne, data = non_embedding_params(cfg), sc.get("data") or {}
    active = ne - (cfg.num_params() - cfg.active_params())  # a token's non-embedding parameters (top_k experts)
    return {"params": cfg.num_params(), "non_embedding": ne, "unembedding_flops": unembedding_share(cfg),
            "active_non_embedding": active, "experts": (cfg.top_k, cfg.n_experts) if cfg.moe else None,
            "tokens_per_active": sc["tokens"] / active if sc.get("tokens") and cfg.moe else None,
            "tokens_per_non_embedding": sc["tokens"] / ne if sc.get("tokens") and ne else None,
            "epochs": data.get("epochs"), "val_tokens": data.get("val_tokens"),
            "bytes_per_token": data.get("val_bytes_per_token")}


def regime_lines(summary: dict) -> list[str]:
    """One paragraph: the regime, said before any table."""
    r = regime(summary)
    if r is None:
        return []
    bpt = r["bytes_per_token"]
    return [f"**Regime.** Final model: {fmt_num(r['non_embedding'])} non-embedding parameters of {fmt_num(r['params'])} "
            f"({100 * r['non_embedding'] / r['params']:.0f}%; the embeddings and the unembedding are the rest); the "
            f"unembedding does {100 * r['unembedding_flops']:.0f}% of the training FLOPs per token; "
            + (f"a mixture of experts (top {r['experts'][0]} of {r['experts'][1]}): {fmt_num(r['active_non_embedding'])} "
               f"active non-embedding parameters a token, {r['tokens_per_active']:.0f} training tokens per active one; "
               if r["experts"] else "")
            + (f"{r['tokens_per_non_embedding']:.0f} training tokens per non-embedding parameter; "
               if r["tokens_per_non_embedding"] else "")
            + (f"{r['epochs']:.2f} epochs of the training split; " if r["epochs"] is not None else "epochs not recorded; ")
            + (f"validation split {fmt_num(r['val_tokens'])} tokens; " if r["val_tokens"] else "")
            + (f"{bpt:.3f} bytes of text per validation token, so bits per byte = nats / (ln 2 · {bpt:.3f})."
               if bpt else "bits per byte not shown: these runs did not record the validation split's bytes per "
                           "token."), ""]


def growth_settings_rows(summary: dict) -> list[list[str]]:
    """Per grown arm: its strategy, its settings, its sizes and where it grew (from the stage plans)."""
    plans = {a: p for p in summary.get("schedules") or [] for a in p["arms"]}
    rows = []
    for e in summary["arms"]:
        if e["kind"] != "grown" or not e["runs"]:
            continue
        stages = (plans.get(e["arm"]) or {}).get("stages") or []
        steps, tokens = [s["steps"] for s in stages], [s["tokens"] for s in stages]
        at = ", ".join(f"{sum(steps[:i])} ({100 * sum(tokens[:i]) / sum(tokens):.0f}%)" for i in range(1, len(steps)))
        sizes = " → ".join(fmt_num(s["params"]) for s in stages if s.get("params"))
        setting = ", ".join(f"{k}={v}" for k, v in (e.get("setting") or {}).items()) or "defaults"
        rows.append([e["arm"], e.get("strategy") or "—", e.get("parameterization") or "model's own", setting,
                     sizes or "—", f"{at} of {sum(steps)}" if at else "—"])
    return rows
