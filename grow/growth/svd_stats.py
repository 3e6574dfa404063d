"""The statistics pass of the ``svd`` strategy (docs/strategies.md, "svd", "svd in detail").

Per layer n and head e: Sigma_n = mean over sequences of X^T X and T_{n,e} = dLbar/dM_{n,e}
= (1/N_tok) sum_b X_b^T G_{b,e} X_b, X the attention's normalized input, kept as sums and counts
(`ScoreStatistics`) for a cross-rank ``reduce``; chunked so memory stays below a training step's,
under the training's autocast with float32 (or float64) sums.
"""

from __future__ import annotations

import contextlib
import time
from dataclasses import dataclass, fields
from typing import Callable, Iterable, Sequence

import torch
import torch.distributed as dist

Batch = tuple[torch.Tensor, torch.Tensor]
IGNORE_INDEX = -100  # F.cross_entropy's default, used by the model's loss


@dataclass
class ScoreStatistics:
    """Sums and counts of one statistics pass (all tensors on the model's device).

    sigma_sum   (L, h, h)     sum over sequences of X^T X
    t_sum       (L, E, h, h)  sum over sequences of X^T G X, G from the token-*sum* loss
    score_sq    (L,)          sum of S^2 over all heads and all T x T entries (before the mask)
    loss_sum    ()            sum of the token losses
    n_seq, n_tokens           sequences, target tokens (not ignore_index)
    n_entries   ()            sum over sequences of T_b^2 (score entries per head)
    """

    sigma_sum: torch.Tensor
    t_sum: torch.Tensor
    score_sq: torch.Tensor
    loss_sum: torch.Tensor
    n_seq: torch.Tensor
    n_tokens: torch.Tensor
    n_entries: torch.Tensor
    seconds: float = 0.0
    flops: float = 0.0

    def tensors(self) -> list[torch.Tensor]:
        return [getattr(self, f.name) for f in fields(self) if isinstance(getattr(self, f.name), torch.Tensor)]

    @property
    def sigma(self) -> torch.Tensor:
        """Sigma_n = mean over sequences of X^T X, (L, h, h)."""
        return self.sigma_sum / self.n_seq

    @property
    def t(self) -> torch.Tensor:
        """T_{n,e} = gradient of the token-mean loss with respect to M_{n,e}, (L, E, h, h)."""
        return self.t_sum / self.n_tokens

    @property
    def loss(self) -> float:
        return float(self.loss_sum / self.n_tokens)

    @property
    def entries_per_seq(self) -> torch.Tensor:
        """Mean number of score entries per sequence and head (s^2 for fixed-length batches)."""
        return self.n_entries / self.n_seq


@dataclass(frozen=True)
class LayerOwners:
    """Layers divided among ``world`` ranks (docs/distributed.md, "FSDP2"): layer n's statistics and
    eigenproblem are rank ``n % world``'s. ``split``: every rank runs its own share of the batches, so
    each chunk's per-layer partial is summed onto its owner (`dist.reduce`); else every rank runs them
    all and a non-owner skips the layer."""

    rank: int
    world: int
    split: bool

    def owner(self, n: int) -> int:
        return n % self.world

    def mine(self, n_layers: int) -> list[int]:
        return [n for n in range(n_layers) if self.owner(n) == self.rank]

    def runs(self, n: int) -> bool:
        """Whether this rank computes layer n's partial (an owner, or every rank where it is a share)."""
        return self.split or self.owner(n) == self.rank

    def add(self, n: int, part: torch.Tensor, acc: torch.Tensor, slot: dict[int, int]) -> None:
        """Layer n's partial of one chunk into its owner's accumulator (``acc[slot[n]]``)."""
        if self.split:
            dist.reduce(part, dst=self.owner(n))
        if self.owner(n) == self.rank:
            acc[slot[n]] += part


def _count_tokens(targets: torch.Tensor) -> int:
    return int((targets != IGNORE_INDEX).sum())


def stats_flops(cfg, n_seq: int, seq_len: int, pairs: int = 0) -> float:
    """FLOPs of the statistics pass for ``n_seq`` sequences of length ``s = seq_len`` (B = n_seq,
    tokens = B s), counting what runs (``tests/test_svd.py`` checks it against torch's
    ``FlopCounterMode``; every matmul of m x n by n x p counts 2 m n p):

    - forward: 2 tokens N_matmul (every weight in a matmul, W_out included) and per layer the score
      and value products, 2 B E s^2 (k + v);
    - backward, ``autograd.grad`` with respect to layer 0's scores only, so no weight gradient and
      nothing below layer 0's scores: the input gradient of every matmul weight but layer 0's
      W_Q, W_K, W_V (2 tokens (N_matmul - h E (2k + v))); the attention of layers 1..N-1 (gradients
      of the probabilities and of V, of Q and of K: 2 B E s^2 (2k + 2v)); layer 0's only the
      gradient of its probabilities (2 B E s^2 v);
    - the accumulations, per layer: T: 2 B E s^2 h (G X) + 2 B s E h^2 (X^T (G X)); Sigma: 2 B s h^2;
      with ``pairs`` new rotary pairs (`rotary_form`) T is instead, per pair, G X_c and G X_s
      (2 x 2 B E s^2 h) and four products X^T (G X) (4 x 2 B s E h^2).
    """
    B, s = n_seq, seq_len
    tokens = B * s
    h, E, L, k, v = cfg.d_model, cfg.n_heads, cfg.n_layers, cfg.d_qk, cfg.d_v
    n_mm = cfg.matmul_params()
    forward = 2 * tokens * n_mm + L * 2 * B * E * s * s * (k + v)
    backward = 2 * tokens * (n_mm - h * E * (2 * k + v)) + (L - 1) * 2 * B * E * s * s * (2 * k + 2 * v) \
        + 2 * B * E * s * s * v
    t_acc = 2 * B * E * s * s * h + 2 * B * s * E * h * h if not pairs else \
        pairs * (4 * B * E * s * s * h + 8 * B * s * E * h * h)
    acc = L * (t_acc + 2 * B * s * h * h)
    return float(forward + backward + acc)


def activation_entries(cfg, seq_len: int, explicit_scores: bool) -> int:
    """Tensor entries a training-mode forward keeps for its backward, per sequence: every layer's
    inputs and outputs of the norms, projections and MLP (``6 h + 2 E (k + v) + 3 p`` per token),
    the vocabulary's logits with their softmax and gradient (``3 V`` per token), and, on the
    explicit attention path of the statistics pass (``explicit_scores``), the scores, the masked
    scores, the probabilities and two gradients of that size (``5 E s`` per token and layer)."""
    s, h, E, k, v, p, L = seq_len, cfg.d_model, cfg.n_heads, cfg.d_qk, cfg.d_v, cfg.d_ff, cfg.n_layers
    per_token = L * (6 * h + 2 * E * (k + v) + 3 * p) + 3 * cfg.vocab_size
    if explicit_scores:
        per_token += L * 5 * E * s
    return s * per_token


def stats_chunk(cfg, batch_seqs: int, seq_len: int, max_chunk_scores: float | None = None) -> int:
    """Sequences per forward of the statistics pass, for batches of ``batch_seqs`` sequences (a
    training batch): as many as keep its activations within a training step's on the whole batch
    (`activation_entries`), and within ``max_chunk_scores`` score entries if given; at least 1."""
    train = batch_seqs * activation_entries(cfg, seq_len, explicit_scores=False)
    chunk = train // activation_entries(cfg, seq_len, explicit_scores=True)
    if max_chunk_scores is not None:
        chunk = min(chunk, int(max_chunk_scores // (cfg.n_layers * cfg.n_heads * seq_len * seq_len)))
    return max(1, min(batch_seqs, int(chunk)))


def autocast(device: torch.device, amp: torch.dtype | None):
    """The training's autocast (``amp`` None: off, the parameters' dtype)."""
    if device.type not in ("cuda", "cpu"):
        return contextlib.nullcontext()
    if amp is None:
        return torch.autocast(device_type=device.type, enabled=False)
    return torch.autocast(device_type=device.type, dtype=amp)


def _sync(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


@torch.no_grad()
def rotary_form(x: torch.Tensor, g: torch.Tensor, freqs: torch.Tensor) -> torch.Tensor:
    """The gradient of a sequence's loss with respect to a new rotary pair's bilinear form, per head and
    frequency: for x (B, T, h), G = dL/dS (B, E, T, T) and the pairs' frequencies omega (P,),

        M = [[C, S], [-S, C]]  (E, P, 2h, 2h, summed over B),   C = X^T (G o cos) X,  S = X^T (G o sin) X,

    with (G o cos)_mn = G_mn cos((m - n) omega). A pair with query rows a = (a1, a2) and key rows
    b = (b1, b2) (the coordinates i and i + k/2) adds c a^T N_mn b to S_mn, N_mn = [[cos, sin], [-sin, cos]]
    x_m x_n^T at Delta = (m - n) omega (`grow.model.rotate`: q.k = cos Delta (q1 k1 + q2 k2) + sin Delta
    (q1 k2 - q2 k1)), so dL = c a^T M b to first order. With X_c = diag(cos m omega) X and X_s likewise,
    cos((m - n) w) = cos m w cos n w + sin m w sin n w gives C = X_c^T G X_c + X_s^T G X_s and
    S = X_s^T G X_c - X_c^T G X_s (docs/strategies.md, "svd")."""
    T = x.shape[1]
    angles = torch.arange(T, device=x.device, dtype=torch.float64)[:, None] * freqs.to(x.device, torch.float64)[None, :]
    cos, sin = angles.cos().to(x.dtype).T, angles.sin().to(x.dtype).T  # (P, T)
    xc, xs = x[:, None] * cos[None, :, :, None], x[:, None] * sin[None, :, :, None]  # (B, P, T, h)
    gc, gs = torch.einsum("betu,bpuj->beptj", g, xc), torch.einsum("betu,bpuj->beptj", g, xs)
    C = torch.einsum("bpti,beptj->epij", xc, gc) + torch.einsum("bpti,beptj->epij", xs, gs)
    S = torch.einsum("bpti,beptj->epij", xs, gc) - torch.einsum("bpti,beptj->epij", xc, gs)
    return torch.cat([torch.cat([C, S], -1), torch.cat([-S, C], -1)], -2)


def gradient_statistics(
    model,
    batches: Iterable[Batch],
    *,
    reduce: Callable[[list[torch.Tensor]], None] | None = None,
    max_chunk_scores: float | None = None,
    amp: torch.dtype | None = None,
    accumulate_dtype: torch.dtype | None = None,
    rotary_freqs: torch.Tensor | None = None,
    owners: LayerOwners | None = None,
) -> ScoreStatistics:
    """One pass over ``batches`` ((inputs, targets) LongTensor pairs) computing `ScoreStatistics`.

    ``reduce(tensors)`` (optional) is called once, after the local pass, on the list of sum
    tensors; it must sum them across processes in place (``dist.all_reduce`` on each). The model
    is put in eval mode (no dropout) for the pass and restored; its parameters' ``.grad`` are not
    touched. ``amp``: the training's autocast dtype (None: none, the scores in the parameters'
    dtype). Chunks: `stats_chunk` (module docstring). ``rotary_freqs`` (P,): the frequencies of the
    new rotary pairs of a k growth; T is then `rotary_form`'s M per head and pair, (L, E, P, 2h, 2h).
    ``owners``: Sigma and T held by their layers' owners only (the layers ``owners.mine(L)``, in that
    order; ``reduce`` then sums the other tensors only).
    """
    cfg = model.config
    p0 = next(model.parameters())
    device = p0.device
    acc_dtype = accumulate_dtype or (torch.float64 if p0.dtype == torch.float64 else torch.float32)
    L, h, E = cfg.n_layers, cfg.d_model, cfg.n_heads
    zeros = lambda *shape: torch.zeros(shape, dtype=acc_dtype, device=device)
    local = owners or LayerOwners(rank=0, world=1, split=False)  # one process: every layer here, none reduced
    held = local.mine(L)
    slot = {n: i for i, n in enumerate(held)}
    t_shape = (len(held), E, h, h) if rotary_freqs is None else (len(held), E, len(rotary_freqs), 2 * h, 2 * h)
    st = ScoreStatistics(
        sigma_sum=zeros(len(held), h, h), t_sum=zeros(*t_shape), score_sq=zeros(L), loss_sum=zeros(),
        n_seq=zeros(), n_tokens=zeros(), n_entries=zeros(),
    )

    xs: dict[int, torch.Tensor] = {}
    scores: list[torch.Tensor] = []

    def capture_x(n):
        def hook(module, args, output):
            xs[n] = args[0].detach()
        return hook

    def accumulate_t(n):
        def hook(g):
            if not local.runs(n):
                return None
            x = xs[n].to(acc_dtype)  # (B, T, h)
            if rotary_freqs is not None:
                part = rotary_form(x, g.to(acc_dtype), rotary_freqs)
            else:
                gx = g.to(acc_dtype) @ x.unsqueeze(1)  # (B, E, T, h)
                part = torch.einsum("bti,betj->eij", x, gx)
            local.add(n, part, st.t_sum, slot)  # this chunk's layer-n partial, complete: onto its owner, then freed
            return None
        return hook

    def score_hook(n, s):
        st.score_sq[n] += s.detach().to(acc_dtype).pow(2).sum()
        s.register_hook(accumulate_t(n))
        scores.append(s)
        return s

    was_training = model.training
    model.eval()
    # only layer 0's W_Q needs a gradient for its scores (and everything above them) to have one:
    # no parameter's gradient is computed (the fused loss would otherwise form W_out's in forward)
    requires = {p: p.requires_grad for p in model.parameters()}
    for p in requires:
        p.requires_grad_(False)
    model.layers[0].attn.q.weight.requires_grad_(True)
    handles = [layer.attn.register_forward_hook(capture_x(n)) for n, layer in enumerate(model.layers)]
    _sync(device)
    t0 = time.perf_counter()
    flops = 0.0
    try:
        with autocast(device, amp):
            for inputs, targets in batches:
                inputs, targets = inputs.to(device), targets.to(device)
                B, T = inputs.shape
                chunk = stats_chunk(cfg, B, T, max_chunk_scores)
                for i in range(0, B, chunk):
                    idx, tgt = inputs[i:i + chunk], targets[i:i + chunk]
                    ntok = _count_tokens(tgt)
                    if ntok == 0:
                        continue
                    scores.clear()
                    xs.clear()
                    with torch.enable_grad():
                        _, loss = model(idx, tgt, score_hook=score_hook)
                        total = loss * ntok
                        torch.autograd.grad(total, scores[0])
                    for n in range(L):
                        if local.runs(n):
                            x = xs[n].to(acc_dtype)
                            local.add(n, torch.einsum("bti,btj->ij", x, x), st.sigma_sum, slot)
                    st.loss_sum += total.detach().to(acc_dtype)
                    st.n_seq += idx.shape[0]
                    st.n_tokens += ntok
                    st.n_entries += idx.shape[0] * T * T
                    flops += stats_flops(cfg, idx.shape[0], T, 0 if rotary_freqs is None else len(rotary_freqs))
        scores.clear()
        xs.clear()
        if reduce is not None:
            local_seq = float(st.n_seq)
            reduce([t for t in st.tensors() if owners is None or (t is not st.sigma_sum and t is not st.t_sum)])
            flops *= float(st.n_seq) / max(local_seq, 1.0)  # FLOPs of every rank's shard: the cost is global
    finally:
        for hnd in handles:
            hnd.remove()
        for p, flag in requires.items():
            p.requires_grad_(flag)
        model.train(was_training)
    _sync(device)
    st.seconds = time.perf_counter() - t0
    st.flops = flops
    if float(st.n_tokens) == 0:
        raise ValueError("svd statistics: the statistics batches hold no target tokens")
    return st


def token_mean_loss(model, batches: Sequence[Batch], reduce=None, amp: torch.dtype | None = None) -> tuple[float, int]:
    """(token-weighted mean cross-entropy, tokens) of ``model`` over ``batches`` (eval mode, no
    grad, under the training's autocast ``amp``, float64 sums); ``reduce`` sums the two totals
    across processes, like the statistics. One forward per batch: a training batch's forward
    without the activations a backward would keep, so below a training step's memory."""
    was_training = model.training
    model.eval()
    device = next(model.parameters()).device
    total = torch.zeros((), dtype=torch.float64, device=device)
    count = torch.zeros((), dtype=torch.float64, device=device)
    try:
        with torch.no_grad(), autocast(device, amp):
            for inputs, targets in batches:
                inputs, targets = inputs.to(device), targets.to(device)
                ntok = _count_tokens(targets)
                if ntok == 0:
                    continue
                _, loss = model(inputs, targets)
                total += loss.to(torch.float64) * ntok
                count += ntok
    finally:
        model.train(was_training)
    if reduce is not None:
        reduce([total, count])
    return float(total / count.clamp_min(1)), int(count)
