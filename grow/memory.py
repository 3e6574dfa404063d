"""Memory plan: the estimated peak memory of a training step per stage, and the micro-batch that fits.

peak = states + activations(micro-batch) + one loss chunk, a formula in bytes (DDP and FSDP2);
the formula and what it counts: docs/costs.md "Costs and memory". The eager activation term is
checked against `measure_saved_bytes` (``saved_tensors_hooks``) to within 25%; the compiled one
(``compiled=True``: torch.compile recomputes each block's RMSNorm outputs) against the H200 peaks
committed in docs/bench/ to [1.00, 1.10].
"""

from __future__ import annotations

from dataclasses import dataclass, replace

import torch

from grow import flags
from grow.model import CE_CHUNK_ENTRIES, Transformer, TransformerConfig

MARGIN = 0.15  # the share of device memory left for the allocator, the CUDA context and fragmentation
GiB = 1024 ** 3


@dataclass(frozen=True)
class StepMemory:
    """The estimate's parts for one step, in bytes (see the module docstring)."""

    states: int
    activations: int
    transient: int

    @property
    def peak(self) -> int:
        return self.states + self.activations + self.transient


def _bytes(dtype: torch.dtype) -> int:
    return torch.empty((), dtype=dtype).element_size()


def state_bytes(optimizer: str = "adamw", param_dtype=torch.float32) -> int:
    """Bytes per parameter of the model and its optimizer state: the weight, the optimizer's buffers (two
    under adamw and sgd+l2, one under sgd) and the uint8 stage of birth; no gradient."""
    w = _bytes(param_dtype)
    return w + (2 * w if optimizer in ("adamw", "sgd+l2") else w) + 1


def activation_bytes_per_token(cfg: TransformerConfig, param_dtype=torch.float32, amp=None, *,
                               compiled: bool = False) -> int:
    """``N per_layer + head`` of docs/costs.md: bytes autograd keeps per token. ``compiled``: under
    torch.compile, whose partitioner recomputes pointwise results in the backward rather than keeping them:
    each block norm's normalized output (w h, from the saved input and 1/rms) and a gated MLP's silu(gate)
    (a p, from the saved gate) (the eager count was 1.19-1.27x the H200's gpt peaks, this one 1.03-1.06x)."""
    w, a = _bytes(param_dtype), _bytes(amp or param_dtype)
    h, E, k, v, p = cfg.d_model, cfg.n_heads, cfg.d_qk, cfg.d_v, cfg.d_ff
    norm = 2 * w * h + 4
    block_norm = norm - w * h if compiled else norm
    mlp = ((3 if compiled else 4) if cfg.gated else 2) * a * p
    if cfg.moe:  # top_k experts a token, each its MLP's tensors, plus its gathered input and weighted output (2 h)
        mlp = cfg.top_k * (mlp + 2 * a * h)
    per_layer = 2 * block_norm + a * h + a * E * (2 * k + 2 * v) + 4 * E + a * E * v + a * h + mlp
    per_layer += sum(flag.saved_bytes(cfg, a) for flag in flags.active(cfg))
    return cfg.n_layers * per_layer + 8 + norm + w * h


def units(cfg: TransformerConfig) -> tuple[int, int]:
    """(R, B): the parameters of the root (embeddings, final norm, W_out) and of one block."""
    one, two = replace(cfg, n_layers=1).num_params(), replace(cfg, n_layers=2).num_params()
    return one - (two - one), two - one


def step_memory(cfg: TransformerConfig, rows: int, *, optimizer: str = "adamw", param_dtype=torch.float32,
                amp=None, shards: int = 1, compiled: bool = False) -> StepMemory:
    """The estimate for a step of ``rows`` sequences of ``cfg.seq_len`` tokens through ``cfg`` on one
    rank; ``shards``: the ranks an FSDP run shards over (1: every rank holds the whole model);
    ``compiled``: the model runs under torch.compile (``trainer.compile``)."""
    w = _bytes(param_dtype)
    P = cfg.num_params()
    per_param = w + state_bytes(optimizer, param_dtype)  # the gradient, then the states
    if shards > 1:
        R, B = units(cfg)
        g = _bytes(amp) if amp else w
        states = -(-P * per_param // shards) + g * R + 2 * g * B + 4 * B + 4 * cfg.vocab_size * cfg.d_model
    else:
        states = P * (per_param + (_bytes(amp) if amp else 0)) + 4 * cfg.vocab_size * cfg.d_model
    acts = rows * cfg.seq_len * activation_bytes_per_token(cfg, param_dtype, amp, compiled=compiled)
    chunk = min(CE_CHUNK_ENTRIES, rows * cfg.seq_len * cfg.vocab_size)
    return StepMemory(states, acts, 3 * 4 * chunk)


def auto_micro_batch(cfg: TransformerConfig, rows: int, budget_bytes: float, **kw) -> int | None:
    """The micro-batch (sequences) for a step of ``rows``: the fewest passes whose estimated peak fits in
    ``(1 - MARGIN)`` of ``budget_bytes``, their rows spread evenly (256 rows with room for 157 -> 2
    passes of 128); None when not even one sequence fits."""
    usable = (1 - MARGIN) * budget_bytes
    if step_memory(cfg, 1, **kw).peak > usable:
        return None
    lo, hi = 1, rows
    while lo < hi:  # the peak grows with the rows: bisect for the most that fit
        mid = (lo + hi + 1) // 2
        lo, hi = (mid, hi) if step_memory(cfg, mid, **kw).peak <= usable else (lo, mid - 1)
    passes = -(-rows // lo)
    return -(-rows // passes)


def device_memory_bytes(device: torch.device) -> int | None:
    """Memory of a CUDA device this process may use: what is free plus what its own allocator holds
    (the current model and optimizer are in the estimate already); None elsewhere."""
    if device.type != "cuda":
        return None
    free, _total = torch.cuda.mem_get_info(device)
    return int(free + torch.cuda.memory_reserved(device))


def measure_saved_bytes(model: Transformer, rows: int, seq_len: int, amp=None) -> int:
    """Bytes that autograd saves for backward in one forward of ``rows`` random sequences of ``seq_len``
    tokens with targets (``saved_tensors_hooks``), counting each storage once and leaving out the
    parameters' own storage; the returned loss is included."""
    params = {p.untyped_storage().data_ptr() for p in model.parameters()}
    seen: set[int] = set()
    total = 0

    def pack(t: torch.Tensor):
        nonlocal total
        storage = t.untyped_storage()
        if storage.data_ptr() not in params and storage.data_ptr() not in seen:
            seen.add(storage.data_ptr())
            total += storage.nbytes()
        return t

    device = next(model.parameters()).device
    idx = torch.randint(0, model.config.vocab_size, (rows, seq_len), device=device)
    with torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t):
        with torch.autocast(device.type, dtype=amp or torch.bfloat16, enabled=amp is not None):
            _, loss = model(idx, idx)
    return total + loss.untyped_storage().nbytes()


def measured_bytes_per_token(model: Transformer, seq_len: int, amp=None) -> float:
    """Saved bytes per token: the difference between 2 and 1 sequences (what does not grow with the
    batch, such as autocast's copies of the weights, cancels)."""
    return (measure_saved_bytes(model, 2, seq_len, amp) - measure_saved_bytes(model, 1, seq_len, amp)) / seq_len


def memory_budget(run, device: torch.device | None = None) -> float | None:
    """Bytes a step may use: ``trainer.device_memory_gb`` when set, else the CUDA device's free memory;
    None on a CPU (no limit is known: the whole batch in one pass)."""
    gb = run.trainer.device_memory_gb
    if gb is not None:
        return gb * GiB
    if device is None:
        device = torch.device("cuda" if torch.cuda.is_available() else "cpu")
    return device_memory_bytes(device)


def optimizer_kind(optim) -> str:
    """``step_memory``'s ``optimizer`` for an ``optim:`` config: "adamw", "sgd", or "sgd+l2" (SGD with
    coupled L2, weight decay and momentum keeps a second buffer, `grow.optim.sgd`)."""
    if optim.name == "sgd" and not optim.decoupled_weight_decay and optim.weight_decay > 0 and optim.momentum > 0:
        return "sgd+l2"
    return optim.name


def shards_of(run, world: int) -> int:
    """The ranks a run's states are sharded over: ``world`` under ``trainer.parallel=fsdp``, else 1."""
    return world if run.trainer.parallel == "fsdp" else 1


def plan_memory(run, plan, *, amp=None, budget: float | None = None, world: int = 1) -> list[dict]:
    """Per stage, on one of ``world`` ranks: the estimated peak at the rank's whole share of the batch,
    the micro-batch ``trainer.micro_batch_size`` gives (``auto``: `auto_micro_batch` for ``budget``,
    default `memory_budget`), its peak, and whether it fits. ``amp``: the autocast dtype the run will
    use (bf16 on a GPU); under ``trainer.parallel=fsdp`` the states are sharded over the ``world`` ranks."""
    budget = memory_budget(run) if budget is None else budget
    kw = {"optimizer": optimizer_kind(run.optim), "amp": amp, "shards": shards_of(run, world),
          "compiled": run.trainer.compile}
    rows = []
    for stage in plan:
        mine = -(-stage.batch_size // world)  # this rank's rows (the first ranks' share)
        full = step_memory(stage.cfg, mine, **kw).peak
        micro = run.trainer.micro_batch_size
        if micro is None:
            micro = mine if budget is None else auto_micro_batch(stage.cfg, mine, budget, **kw)
        micro = None if micro is None else min(micro, mine)
        peak = step_memory(stage.cfg, micro or 1, **kw).peak
        fits = micro is not None and (budget is None or peak <= (1 - MARGIN) * budget)
        rows.append({"stage": stage.index + 1, "batch": stage.batch_size, "rows": mine, "micro_batch": micro,
                     "full_batch_gb": full / GiB, "peak_gb": peak / GiB, "fits": fits})
    return rows


def format_memory(rows: list[dict], budget: float | None, ranks: str = ""):
    """The memory plan as a rich table (`grow schedule`); ``ranks``: e.g. "per rank of 8, FSDP"."""
    from rich.table import Table

    where = f"{budget / GiB:.1f} GiB" if budget is not None else "no limit known (CPU): the whole batch"
    per = f"; {ranks}" if ranks else ""
    t = Table(title=f"memory per step (estimate{per}; device memory: {where}, {MARGIN:.0%} kept free)")
    for col in ("stage", "batch", "rows per rank", "micro-batch", "peak at rows", "peak at micro-batch", "fits"):
        t.add_column(col, justify="right")
    for r in rows:
        micro = "—" if r["micro_batch"] is None else str(r["micro_batch"])
        t.add_row(str(r["stage"]), str(r["batch"]), str(r["rows"]), micro, f"{r['full_batch_gb']:.2f} GiB",
                  f"{r['peak_gb']:.2f} GiB", "yes" if r["fits"] else "[red]NO[/red]")
    return t
