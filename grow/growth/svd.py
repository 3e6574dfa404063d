"""``svd``: growing the attention key/query size d_k from the gradient (docs/strategies.md, "svd", "svd in detail").

L. Burgund, "Attention growing networks" (internship report) and the draft "Brouillon 2" (May 2025):
new query/key columns from the whitened truncated SVD of T = dL/dM (the report's fit, with its sign
and its Eckart-Young norm corrected), an optional first-order update of the existing columns
(``update_existing``: the draft's rule or the projected steepest step), and gamma chosen by a
held-out line search. Rotary and grouped-query heads solve one form per (head, pair) or key head.
Every dimension but k is delegated to ``base``.
"""

from __future__ import annotations

import math
import time
from dataclasses import dataclass, field
from typing import Any

import torch
import torch.distributed as dist

from grow import schema
from grow.console import fmt_num
from grow.errors import ConfigError
from grow.growth.base import GrowthContext, Site, Strategy, get_strategy, register
from grow.growth.svd_stats import (
    LayerOwners,
    ScoreStatistics,
    gradient_statistics,
    stats_flops,
    token_mean_loss,
)
from grow.model import rope_freqs
from grow.parallel import distributed

__all__ = [
    "best_low_rank_bilinear",
    "literal_low_rank_bilinear",
    "low_rank_bilinear_residual",
    "whitening",
    "SVD",
]


# ---------------------------------------------------------------------------------------------
# 1. Linear algebra
# ---------------------------------------------------------------------------------------------
def whitening(sigma: torch.Tensor, damping: float = 0.0, rcond: float | None = None):
    """``(Sigma_l^-1/2, Sigma_l^1/2)`` of the symmetric PSD ``sigma`` (..., h, h), where
    Sigma_l = Sigma + lambda I with lambda = damping * tr(Sigma)/h. Eigenvalues <= rcond x the
    largest (default h x eps) are dropped in both (pseudo-inverse square root)."""
    sigma = 0.5 * (sigma + sigma.mT)
    evals, vecs = torch.linalg.eigh(sigma)
    evals = evals.clamp_min(0)
    h = evals.shape[-1]
    d = evals + damping * evals.mean(-1, keepdim=True)
    if rcond is None:
        rcond = h * torch.finfo(d.dtype).eps
    keep = d > rcond * d.amax(-1, keepdim=True)
    safe = torch.where(keep, d, torch.ones_like(d))
    inv_sqrt = torch.where(keep, safe.rsqrt(), torch.zeros_like(d))
    sqrt = torch.where(keep, safe.sqrt(), torch.zeros_like(d))
    return (vecs * inv_sqrt.unsqueeze(-2)) @ vecs.mT, (vecs * sqrt.unsqueeze(-2)) @ vecs.mT


def _split_factors(P, s, Q, pre, rank: int, pre_k=None):
    """``A = pre @ P_r diag(sqrt s_r)``, ``C = pre_k @ Q_r diag(sqrt s_r)`` (``pre_k`` None: ``pre``),
    zero-padded to ``rank``."""
    r = min(rank, s.shape[-1])
    root = s[..., :r].clamp_min(0).sqrt().unsqueeze(-2)
    A = pre @ (P[..., :r] * root)
    C = (pre if pre_k is None else pre_k) @ (Q[..., :r] * root)
    if r < rank:
        pad = A.new_zeros(*A.shape[:-1], rank - r)
        A, C = torch.cat([A, pad], -1), torch.cat([C, pad], -1)
    return A, C


def best_low_rank_bilinear(X: torch.Tensor, B: torch.Tensor, rank: int, *, damping: float = 0.0,
                           rcond: float | None = None) -> tuple[torch.Tensor, torch.Tensor]:
    """``(A, C)`` (e x rank each) such that Z = A C^T minimises ||B - X Z X^T||_F subject to
    rank(Z) <= rank, through the SVD in the whitened basis (module docstring, §1).

    - ``X`` (s x e), ``B`` (s x s): exact. Thin SVD X = U_x S_x V_x^T (singular values below
      ``rcond`` x the largest, default max(s, e) x eps, are dropped), then the truncated SVD of
      D U_x^T B U_x D with D = S_x / sqrt(S_x^2 + lambda); the minimum is
      ||B||^2 - sum_{i<=rank} sigma_i(U_x^T B U_x)^2 when ``damping`` = 0.
    - ``X`` (n x s x e), ``B`` (n x s x s): the pooled approximation
      Z = Sigma^-1/2 [Sigma^-1/2 T_B Sigma^-1/2]_rank Sigma^-1/2 with Sigma = mean_b X_b^T X_b,
      T_B = mean_b X_b^T B_b X_b (exact when n = 1); duplicating the batch changes nothing.

    ``damping``: lambda = damping x tr(X^T X)/e added to X^T X (a ridge; 0 = exact). B need not
    be symmetric. The split of Z between A and C is balanced (sqrt of the singular values each).
    """
    if X.dim() == 2:
        if B.shape != (X.shape[0], X.shape[0]):
            raise ValueError(f"B must be {X.shape[0]} x {X.shape[0]} for X of shape {tuple(X.shape)}")
        U, s, Vh = torch.linalg.svd(X, full_matrices=False)
        if rcond is None:
            rcond = max(X.shape) * torch.finfo(X.dtype).eps
        keep = s > rcond * s[:1].clamp_min(torch.finfo(X.dtype).tiny)
        U, s, V = U[:, keep], s[keep], Vh[keep].mT
        lam = damping * (s * s).sum() / X.shape[1]
        sd = (s * s + lam).sqrt()
        ratio = s / sd
        core = (U.mT @ B @ U) * ratio[:, None] * ratio[None, :]
        P, sig, Qh = torch.linalg.svd(core)
        return _split_factors(P, sig, Qh.mT, V / sd[None, :], rank)
    if X.dim() == 3:
        if B.shape != (X.shape[0], X.shape[1], X.shape[1]):
            raise ValueError(f"B must be n x s x s for X of shape {tuple(X.shape)}")
        sigma = (X.mT @ X).mean(0)
        tb = (X.mT @ B @ X).mean(0)
        inv_sqrt, _ = whitening(sigma, damping, rcond)
        P, sig, Qh = torch.linalg.svd(inv_sqrt @ tb @ inv_sqrt)
        return _split_factors(P, sig, Qh.mT, inv_sqrt, rank)
    raise ValueError(f"X must be s x e or n x s x e, got shape {tuple(X.shape)}")


def literal_low_rank_bilinear(X: torch.Tensor, B: torch.Tensor, rank: int) -> tuple[torch.Tensor, torch.Tensor]:
    """The report's literal recipe, for comparison only: truncate Z* = X+ B X+^T by an SVD of Z*
    itself (optimal for ||Z - Z*||, not for ||B - X Z X^T||)."""
    Xp = torch.linalg.pinv(X)
    P, s, Qh = torch.linalg.svd(Xp @ B @ Xp.mT)
    eye = torch.eye(X.shape[-1], dtype=X.dtype, device=X.device)
    return _split_factors(P, s, Qh.mT, eye, rank)


def low_rank_bilinear_residual(X, B, A, C) -> torch.Tensor:
    """||B - X A C^T X^T||_F^2 (summed over the batch for 3-D X)."""
    return (B - X @ A @ C.mT @ X.mT).pow(2).sum()


# ---------------------------------------------------------------------------------------------
# 2. Factored changes of M: dM = X^T Y with X, Y (..., r, h) stacked rows
# ---------------------------------------------------------------------------------------------
def _inner_t(T, X, Y):
    """<T, X^T Y> per (layer, head): sum_r x_r^T T y_r."""
    return ((X @ T) * Y).sum((-2, -1))


def _pooled_inner(sigma, X1, Y1, X2, Y2, sigma_q=None):
    """<Sigma_q^1/2 X1^T Y1 Sigma^1/2, Sigma_q^1/2 X2^T Y2 Sigma^1/2> = sum((X1 S_q X2^T) * (Y1 S Y2^T)):
    the pooled estimate of mean_b <X_b dM1 X_b^T, X_b dM2 X_b^T> (sigma broadcast over heads; ``sigma_q``
    the query side's, None: ``sigma``)."""
    s = sigma.unsqueeze(-3)
    sq = s if sigma_q is None else sigma_q.unsqueeze(-3)
    return ((X1 @ sq @ X2.mT) * (Y1 @ s @ Y2.mT)).sum((-2, -1))


def _pooled_sq(sigma, X, Y, sigma_q=None):
    return _pooled_inner(sigma, X, Y, X, Y, sigma_q).clamp_min(0)


# ---------------------------------------------------------------------------------------------
# 3. The change of the k-grown model for a given gamma
# ---------------------------------------------------------------------------------------------
class _KChange:
    """The Q/K rows of every head of the k-grown model as a function of gamma.

    ``Wq0``, ``Wk0`` (L, E, k_hat, h): the rows as the base strategy left them (old rows first,
    old W_K already x sqrt(k_hat/k)); ``c`` (L, 1, 1, 1): mult_q mult_k / sqrt(k_hat). ``rows(g)``
    gives ``(dX, dY, q_rows, k_rows)``: the new rows and the change of every form, dM = dX^T dY
    (c folded in). ``unit_sq`` (L, E): ||X dM X^T||^2 of the first-order change at gamma = 1."""

    def __init__(self, d: dict, Wq0, Wk0, c, k: int):
        self.d, self.Wq0, self.Wk0, self.c, self.k = d, Wq0, Wk0, c, k
        self.k_hat = Wq0.shape[-2]

    def pred_decrease(self, X, Y) -> torch.Tensor:
        """-<T, dX^T dY> per (layer, form): the change's first-order decrease of the loss."""
        return -_inner_t(self.d["T"], X, Y)

    def change_sq(self, X, Y) -> torch.Tensor:
        """||X dM X^T||^2 per (layer, form), pooled."""
        return _pooled_sq(self.d["sigma"], X, Y, self.d["sigma_q"])

    def quad_lin(self, g: float):
        """(quadratic, linear) squared norms per (layer, form) of `quad_linear_ratio`, or None."""
        return None

    def quad_linear_ratio(self, g: float) -> float | None:
        """The draft's ||X dW_Q dW_K^T X^T|| / ||X (W_Q dW_K^T + dW_Q W_K^T) X^T|| over all heads."""
        both = self.quad_lin(g)
        return None if both is None else _norm_ratio(*both)


def _norm_ratio(quad: torch.Tensor, lin: torch.Tensor) -> float | None:
    """sqrt(sum quad / sum lin), None where lin sums to 0."""
    return math.sqrt(float(quad.sum()) / float(lin.sum())) if float(lin.sum()) > 0 else None


def _on(s, ref, width: int):
    """Columns whose singular value is not numerically 0 (relative to ``ref``), padded to ``width``."""
    on = s[..., :width] > 1e-10 * ref.clamp_min(torch.finfo(s.dtype).tiny)
    return torch.nn.functional.pad(on, (0, width - on.shape[-1])) if on.shape[-1] < width else on


def _projected_update(d, Rq, Rk, c):
    """The steepest first-order update of the existing columns (module docstring, §2, ``projected``):
    rows ``(dW_Q^T, dW_K^T)`` per unit gamma, whose whitened change is -P(W), P the orthogonal
    projection onto the tangent space at Sigma^1/2 M Sigma^1/2 of the rank-k matrices."""
    S, Si, W = d["sqrt"].unsqueeze(1), d["inv_sqrt"].unsqueeze(1), d["W"]
    Ut, Vt = (Rq @ S).mT, (Rk @ S).mT  # U~ = Sigma^1/2 W_Q, V~ = Sigma^1/2 W_K   (h x k)
    Up, Vp = torch.linalg.pinv(Ut), torch.linalg.pinv(Vt)  # (k x h); U~ U~^+ = P_U, V~ V~^+ = P_V
    PuW = Ut @ (Up @ W)
    dWk = -(Up @ W @ Si) / c  # c W_Q dW_K^T = -Sigma^-1/2 P_U W Sigma^-1/2
    dWq = -(Vp @ (W - PuW).mT @ Si) / c  # c dW_Q W_K^T = -Sigma^-1/2 (I - P_U) W P_V Sigma^-1/2
    return dWq, dWk


class _NewColumns(_KChange):
    """``mode: new``, optionally with an update of the existing columns (``update``: None,
    ``"seed004"`` or ``"projected"``; module docstring, §2)."""

    def __init__(self, d, Wq0, Wk0, c, k, update: str | None):
        super().__init__(d, Wq0, Wk0, c, k)
        p = self.k_hat - k
        self.valid = _on(d["s"], d.get("s_all", d["s"]).amax(), p)  # relative to every layer's largest
        inv_q = d.get("inv_sqrt_q", d["inv_sqrt"])  # the query side's (grouped heads: r blocks), else the same
        An, Cn = _split_factors(d["U"], d["s"], d["V"], inv_q.unsqueeze(1), p, d["inv_sqrt"].unsqueeze(1))
        self.An, self.Cn = An.mT, -Cn.mT  # rows (L, E, p, h): dM_new = gamma An^T Cn
        self.Rq, self.Rk = Wq0[..., :k, :], Wk0[..., :k, :]
        self.dWq = self.dWk = None  # rows of the existing columns' change per unit gamma
        if update == "seed004":
            T, sigma = d["T"], d["sigma"]
            dWq, dWk = -(self.Rk @ T.mT), -(self.Rq @ T)  # rows of -T W_K and -T^T W_Q
            X0, Y0 = c * torch.cat([self.Rq, dWq], -2), torch.cat([dWk, self.Rk], -2)  # dM0
            eta, rho2 = -_inner_t(T, X0, Y0), _pooled_sq(sigma, X0, Y0)
            tiny = torch.finfo(rho2.dtype).tiny
            coef = torch.where(rho2 > 0, eta / rho2.clamp_min(tiny), torch.zeros_like(eta))[..., None, None]
            self.dWq, self.dWk = coef * dWq, coef * dWk  # alpha = gamma eta / rho^2
        elif update == "projected":
            self.dWq, self.dWk = _projected_update(d, self.Rq, self.Rk, c)
        elif update is not None:  # pragma: no cover - SVD.__init__ checks the option
            raise ValueError(f"update={update!r}")
        X, Y = self._factor(1.0, linear=True)
        self.unit_sq = _pooled_sq(d["sigma"], X, Y, d.get("sigma_q"))

    def _factor(self, g: float, linear: bool = False):
        on = (self.valid if g > 0 else torch.zeros_like(self.valid))[..., None]
        a, b = on * self.An * math.sqrt(g), on * self.Cn * math.sqrt(g)
        X, Y = [a], [b]
        if self.dWq is not None:  # c (Rq + g dWq)^T (Rk + g dWk) - c Rq^T Rk
            c, gq, gk = self.c, g * self.dWq, g * self.dWk
            X += [c * self.Rq, c * gq] + ([] if linear else [c * gq])
            Y += [gk, self.Rk] + ([] if linear else [gk])
        return torch.cat(X, -2), torch.cat(Y, -2)

    def rows(self, g: float):
        X, Y = self._factor(g)
        p, k = self.An.shape[-2], self.k
        on = (self.valid if g > 0 else torch.zeros_like(self.valid))[..., None]
        scale = self.c.rsqrt()  # c' (q_new)^T k_new = dM_new
        new_q = torch.where(on, X[..., :p, :] * scale, self.Wq0[..., k:, :])
        new_k = torch.where(on, Y[..., :p, :] * scale, self.Wk0[..., k:, :])
        q_old, k_old = self.Rq, self.Rk
        if self.dWq is not None:
            q_old, k_old = self.Rq + g * self.dWq, self.Rk + g * self.dWk
        return X, Y, torch.cat([q_old, new_q], -2), torch.cat([k_old, new_k], -2)

    def quad_lin(self, g: float):
        if self.dWq is None or g <= 0:
            return None
        c, sigma, gq, gk = self.c, self.d["sigma"], g * self.dWq, g * self.dWk
        lin = _pooled_sq(sigma, torch.cat([c * self.Rq, c * gq], -2), torch.cat([gk, self.Rk], -2))
        return _pooled_sq(sigma, c * gq, gk), lin


class _Refactor(_KChange):
    """``mode: refactor``: the rank-k_hat whitened SVD of Sigma^1/2 M Sigma^1/2 - gamma W."""

    def __init__(self, d, Wq0, Wk0, c, k, damping: float):
        super().__init__(d, Wq0, Wk0, c, k)
        W = d["W"]
        sqrt_s = whitening(d["sigma"], damping)[1].unsqueeze(1)
        # M: the base's new columns add nothing (zero W_K rows, or vt's cancelling pairs)
        self.Mt = sqrt_s @ (c * (Wq0.mT @ Wk0)) @ sqrt_s
        # first order in gamma (Mt of rank k): -gamma [[W11, W12], [W21, [W22]_p]] in the bases of
        # Mt's singular vectors, with W22 = (I - P_U) W (I - P_V); its norm in the damped metric
        Um, _, Vmh = torch.linalg.svd(self.Mt)
        Uk, Vk = Um[..., :k], Vmh[..., :k, :].mT
        W22 = W - Uk @ (Uk.mT @ W)
        W22 = W22 - (W22 @ Vk) @ Vk.mT
        top = torch.linalg.svdvals(W22)[..., : self.k_hat - k]
        self.unit_sq = W.pow(2).sum((-2, -1)) - W22.pow(2).sum((-2, -1)) + top.pow(2).sum(-1)
        self._cache: dict[float, tuple] = {}

    def rows(self, g: float):
        if g not in self._cache:
            d, c, k_hat = self.d, self.c, self.k_hat
            U, s, Vh = torch.linalg.svd(self.Mt - g * d["W"])
            on = _on(s, s[..., :1], k_hat)[..., None]
            A, C = _split_factors(U, s, Vh.mT, d["inv_sqrt"].unsqueeze(1), k_hat)
            q_rows = torch.where(on, A.mT * c.rsqrt(), self.Wq0)
            k_rows = torch.where(on, C.mT * c.rsqrt(), torch.zeros_like(self.Wk0))
            X = torch.cat([c * q_rows, c * self.Wq0], -2)
            Y = torch.cat([k_rows, -self.Wk0], -2)
            self._cache = {g: (X, Y, q_rows, k_rows)}
        return self._cache[g]


def _by_layer(local: torch.Tensor, owners: LayerOwners, n_layers: int) -> torch.Tensor:
    """The (L, ...) tensor whose layer n is its owner's row of ``local`` (its layers, `LayerOwners.mine`):
    one broadcast per layer from its owner (rank 0 owns layer 0 and tells the shape)."""
    shape, dtype = distributed.broadcast_object((tuple(local.shape[1:]), local.dtype))
    out = torch.empty((n_layers, *shape), dtype=dtype, device=local.device)
    for i, n in enumerate(owners.mine(n_layers)):
        out[n] = local[i]
    for n in range(n_layers):
        dist.broadcast(out[n], src=owners.owner(n))
    return out


class _Owned:
    """A `_KChange` of the layers this rank owns (`LayerOwners`), seen by every rank as the whole
    model's: each layer's rows and sums are its owner's, broadcast (docs/distributed.md, "FSDP2")."""

    def __init__(self, change: _KChange, owners: LayerOwners, n_layers: int):
        self.change, self.owners, self.L = change, owners, n_layers
        self.mine = owners.mine(n_layers)
        self.unit_sq = self._whole(change.unit_sq)

    def _whole(self, t: torch.Tensor) -> torch.Tensor:
        return _by_layer(t, self.owners, self.L)

    def rows(self, g: float):
        return tuple(self._whole(t) for t in self.change.rows(g))

    def pred_decrease(self, X, Y) -> torch.Tensor:
        return self._whole(self.change.pred_decrease(X[self.mine], Y[self.mine]))

    def change_sq(self, X, Y) -> torch.Tensor:
        return self._whole(self.change.change_sq(X[self.mine], Y[self.mine]))

    def quad_linear_ratio(self, g: float) -> float | None:
        both = self.change.quad_lin(g)  # None on every rank alike (the mode, the rule, g)
        return None if both is None else _norm_ratio(*(self._whole(t) for t in both))


# ---------------------------------------------------------------------------------------------
# 4. The strategy
# ---------------------------------------------------------------------------------------------
def _as_batches(batches, need: int, what: str) -> list:
    """``need`` (inputs, targets) pairs: the list itself, or a single pair split along its rows."""
    batches = list(batches)
    if len(batches) == 1 and need > 1:
        inputs, targets = batches[0]
        if inputs.shape[0] >= need:
            return [(i, t) for i, t in zip(inputs.tensor_split(need), targets.tensor_split(need))]
    if len(batches) < need:
        raise ValueError(
            f"strategy 'svd' needs {need} batches ({what}), got {len(batches)}: pass grow(..., batch=[...]) "
            f"with {need} (inputs, targets) pairs (trainer.growth_batches >= {need}), or one pair of "
            f">= {need} sequences"
        )
    return batches


@dataclass
class _UnitsPlan:
    """What `SVD.prepare_units` computed for a growth by units, and the rows its units recorded."""

    directions: dict
    metrics: dict
    flops: float
    stats_loss: float
    stats_batches: list
    heldout: list
    t0: float
    reduce: Any
    amp: Any
    owners: LayerOwners | None = None
    records: list = field(default_factory=list)


# update_existing's values -> the rule (true: the option's former boolean form, the draft's rule)
UPDATE_EXISTING = {False: None, None: None, "false": None, "none": None, True: "seed004", "true": "seed004",
                   "seed004": "seed004", "projected": "projected"}


def qk_weights(cfg) -> tuple[str, str]:
    """The matrices k grows (`grow.schema`): W^Q, whose new rows are free, and W^K, whose new rows start at 0."""
    w = [e for e in schema.layer(cfg, "k") if e.key.endswith(".weight")]
    return next(e.key for e in w if not e.zero), next(e.key for e in w if e.zero)


@register("svd")
class SVD(Strategy):
    """Gradient-SVD growth of d_k (module docstring); every other dimension from ``base``."""

    grows_by_units = True  # its passes around the units (`passes_around_units`, grow/fsdp_growth/passes.py)
    own_dims = ("k",)
    exact_with = {"gamma": 0.0}  # the new columns at gamma = 0 (its base exact as well)

    def __init__(self, **options):
        super().__init__(**options)
        o = self.options
        if o["mode"] not in ("new", "refactor"):
            raise self.bad_option("mode", o["mode"], "allowed: new, refactor")
        u = o["update_existing"]
        if not isinstance(u, (bool, str, type(None))) or u not in UPDATE_EXISTING:
            raise self.bad_option("update_existing", u, "allowed: false, seed004, projected; true = seed004")
        self.update_existing = UPDATE_EXISTING[u]
        if self.update_existing and o["mode"] != "new":
            raise self.bad_option("update_existing", u, "applies to mode=new only (refactor refits all columns)")
        if o["base"] == "svd":
            raise self.bad_option("base", o["base"], "must be another strategy (zero or vt), not svd")
        g = o["gamma"]
        if not (g == "auto" or (isinstance(g, (int, float)) and not isinstance(g, bool) and g >= 0)):
            raise self.bad_option("gamma", g, "allowed: auto, or a number >= 0")
        grid = sorted(float(t) for t in o["gamma_grid"])
        if not grid or grid[0] != 0.0:
            raise self.bad_option("gamma_grid", o["gamma_grid"], "must include 0 and be >= 0")
        self.grid = grid
        if int(o["batches"]) < 1:
            raise self.bad_option("batches", o["batches"], "must be >= 1")
        if int(o["heldout"]) < (1 if g == "auto" else 0):
            raise self.bad_option("heldout", o["heldout"], "must be >= 1 with gamma=auto (its line search)")
        if float(o["damping"]) < 0:
            raise self.bad_option("damping", o["damping"], "must be >= 0")
        self.base = get_strategy(o["base"], **dict(o["base_options"] or {}))
        self.units: _UnitsPlan | None = None  # a growth by units' whole-model passes (`prepare_units`)

    layer_position_key = "base_options.layer_position"

    def layer_positions(self, source, target):
        """New layers are the base's (``base_options.layer_position``): svd grows d_k only."""
        return self.base.layer_positions(source, target)

    def check(self, run) -> None:
        """Its statistics and held-out batches fit in trainer.growth_batches at every growth of d_k."""
        super().check(run)
        o, stages = self.options, list(run.plan)
        need = int(o["batches"]) + (int(o["heldout"]) if o["gamma"] == "auto" else 0)
        for before, after in zip(stages, stages[1:]):
            if after.cfg.d_qk > before.cfg.d_qk and run.trainer.growth_batches < need:
                raise ConfigError("trainer.growth_batches", run.trainer.growth_batches,
                                  f"must be >= {need}: strategy {run.strategy.name} uses strategy.batches={o['batches']}"
                                  + (f" + strategy.heldout={o['heldout']}" if o["gamma"] == "auto" else "")
                                  + f" at the growth into stage {after.index + 1}")

    def plan_note(self, run) -> str:
        """svd's own passes (statistics, line search, linear algebra; at most, `planned_flops`) over the
        plan's growths of d_k, as a share of the plan's training FLOPs."""
        plan, stages = run.plan, list(run.plan)
        extra = sum(planned_flops(a.cfg, b.cfg, self.options, run.trainer.batch_size) for a, b in zip(stages, stages[1:]))
        pct = 100.0 * extra / max(plan.total_flops, 1)
        return (f"svd's statistics and line-search passes: at most {fmt_num(extra)} FLOPs over the plan's growths of "
                f"d_k, {pct:.3g}% of the plan's {fmt_num(plan.total_flops)} training FLOPs (counted in train/flops "
                "when they run)")

    # ---- hooks --------------------------------------------------------------------------
    def check_transition(self, source, target) -> None:
        """The base strategy's check (e.g. vt's pairs): every dimension but k is its to fill, and the
        k sites are filled by it first. On rotary or grouped-query heads only new columns are chosen
        (§4 of the module docstring): the refactor and the update of the old columns are refused."""
        self.base.check_transition(source, target)
        if target.d_qk <= source.d_qk:
            return
        if (source.positions == "rope" or source.group_size > 1) and (self.options["mode"] != "new"
                                                                       or self.update_existing):
            what = "rotary heads" if source.positions == "rope" else "grouped-query heads"
            raise ValueError(f"svd on {what} adds new columns only (mode=new, update_existing=false): the refactor "
                             "and the update of the existing columns assume S = X W_Q W_K^T X^T, one key per head")

    def initialize(self, model, generator=None) -> None:
        """The base strategy's stage-0 parameterization (vt: Table 1's variances)."""
        self.base.initialize(model, generator)

    def after_growth(self, opt, result, optim_name: str) -> None:
        self.base.after_growth(opt, result, optim_name)

    def after_step(self, model, opt, step_in_stage: int) -> bool:
        return self.base.after_step(model, opt, step_in_stage)

    def step_metrics(self) -> dict[str, float]:
        return self.base.step_metrics()

    def setup(self, ctx: GrowthContext) -> None:
        self.base.setup(ctx)
        self._rows: dict[int, torch.Tensor] = {}
        self._kmap: dict | None = None
        self._dir = None
        self._metrics: dict[str, float] = {}
        self._flops = 0.0
        self._stats_batches, self._heldout_batches = [], []
        if ctx.target.d_qk > ctx.source.d_qk and self.units is None:
            nb, nh = int(self.options["batches"]), int(self.options["heldout"])
            need = nb + (nh if self.options["gamma"] == "auto" else 0)
            what = f"{nb} for statistics + {nh} held-out for the gamma line search" if need > nb else \
                f"{nb} for statistics"
            batches = _as_batches(ctx.batches, need, what)
            self._stats_batches, self._heldout_batches = batches[:nb], batches[nb:]

    def before_expansion(self, ctx: GrowthContext, dim: str) -> None:
        self.base.before_expansion(ctx, dim)
        if dim == "k":
            self._t0 = time.perf_counter()
            self._dir = self._directions(ctx) if self.units is None else self.units.directions

    def fill(self, ctx: GrowthContext, site: Site) -> None:
        self.base.fill(ctx, site)
        if site.dim == "k":
            q, k = (site.slot(key) for key in qk_weights(ctx.source))
            # rows of key head g's coordinates in the grown weights, its k old ones, then its p new ones:
            # W^Q's (G, k_hat, r) for the r query heads of its group, W^K's (G, k_hat)
            self._rows[site.layer] = (torch.cat([q.old_idx, q.new_idx], dim=1),
                                      torch.cat([k.old_idx[..., 0], k.new_idx[..., 0]], dim=1))

    def after_expansion(self, ctx: GrowthContext, dim: str, model, param_map) -> None:
        if dim == "k":  # follow the k-grown q/k weights through the later expansions (v, p, E, N)
            self._k_source = ctx.model.config
            self._kmap = {n: (n, torch.arange(p.numel(), device=p.device).view(p.shape)) for n, p in model.named_parameters()
                          if n.endswith(qk_weights(self._k_source)) and not p.is_meta}  # a unit's own
        elif self._kmap is not None:
            self._kmap = {n: (param_map[mid][0], param_map[mid][1].reshape(-1)[idx])
                          for n, (mid, idx) in self._kmap.items()}
        self.base.after_expansion(ctx, dim, model, param_map)

    def finish(self, ctx: GrowthContext, model, param_map) -> None:
        """The base finishes first (vt rescales the old weights and moves the scale into the forward
        multipliers), then the k rows are chosen and written on the final model, in its units, so the
        change logged is the change returned; the base then revises what it derived from the values
        it had seen (vt: Eq. 5's multipliers of the rewritten weights)."""
        self.base.finish(ctx, model, param_map)
        if self._dir is None:
            return
        if self.units is not None:
            return self._record_unit(ctx, model)
        rows = _KRows(self, model)
        rows.as_forms(model.config.positions == "rope")
        names = self._grow_k(rows, model, ctx.reduce, ctx.amp)
        self._dir = None  # free the h x h tensors
        params = dict(model.named_parameters())
        self.base.rewrote(ctx, {n: params[n] for n in names})
        ctx.metrics.update(self._metrics)
        ctx.flops += self._flops
        if self.options["mode"] == "refactor":  # old Q/K rows now hold a new basis
            ctx.fresh |= set(names)

    # ---- by units (grow.fsdp_growth.passes, docs/distributed.md, "FSDP2") -----------------------------------
    def passes_around_units(self, source, target) -> bool:
        return target.d_qk > source.d_qk  # d_k grows: the statistics pass before the units, the line search after

    def statistics_flops(self, source, target, batch_size: int) -> float:
        """The statistics pass were d_k to grow here (`svd_stats.stats_flops`, no new rotary pairs counted):
        ``batches`` batches of ``batch_size`` sequences through ``source`` at ``target``'s width."""
        return stats_flops(source.replace(d_model=target.d_model), int(self.options["batches"]) * batch_size,
                           source.seq_len)

    def prepare_units(self, ctx: GrowthContext, owners: LayerOwners | None = None) -> None:
        """Before a growth of d_k by units: the statistics pass on ``ctx.model`` (the model about to grow
        k, whole or sharded; ``ctx.batches`` this rank's share, ``ctx.reduce`` their sum) and the
        directions, kept for the units (each records its layers' rows, `_record_unit`) and for
        `finish_units`. ``owners``: each layer's statistics and directions held by its owner only."""
        self.units = None
        self.setup(ctx)
        self._t0 = time.perf_counter()
        directions = self._directions(ctx, owners)
        self.units = _UnitsPlan(directions, dict(self._metrics), self._flops, self._stats_loss,
                                self._stats_batches, self._heldout_batches, self._t0, ctx.reduce, ctx.amp, owners)

    def _record_unit(self, ctx: GrowthContext, model) -> None:
        """An old block's unit: its layer's q/k rows as the base left them (whole), for `finish_units`;
        nothing written. An inserted block's unit has no rows of svd's (only old layers grow k's way)."""
        if ctx.new_layers:
            return
        layers = [n for n in range(self._k_source.n_layers) if f"layers.{n}.attn.q.weight" in self._kmap]
        if not layers:
            return
        rows = _KRows(self, model, layers)
        rows.as_forms(model.config.positions == "rope")
        rows.wq, rows.wk = [w.detach().clone() for w in rows.wq], [w.detach().clone() for w in rows.wk]
        self.units.records.append(rows)
        if self.options["mode"] == "refactor":
            ctx.fresh |= set(rows.names)

    def finish_units(self, model, sink, grown: GrowthContext) -> tuple[dict, float]:
        """After the units: gamma chosen on the grown ``model`` (whole or sharded, over the held-out
        batches and with the reduction `prepare_units` took) as `finish` chooses it, every recorded
        layer's rows written through ``sink(name, whole weight)``, and the base told of them as in `finish`
        (``grown``: the state, rates and metrics of the units put together); (svd's metrics, FLOPs)."""
        u, self.units = self.units, None
        self._dir, self._metrics, self._flops, self._stats_loss = u.directions, dict(u.metrics), u.flops, u.stats_loss
        self._stats_batches, self._heldout_batches, self._t0 = u.stats_batches, u.heldout, u.t0
        rows = _KRows.join(u.records)
        if rows.layers != list(range(self._k_source.n_layers)):
            raise RuntimeError(f"svd by units: rows recorded for layers {rows.layers}")
        rows.sink = sink
        self._grow_k(rows, model, u.reduce, u.amp, u.owners)
        self._dir = None
        self.base.rewrote(grown, dict(zip(rows.names, rows.wq + rows.wk)))  # the rows whole on every rank
        return dict(self._metrics), self._flops

    # ---- statistics and directions ------------------------------------------------------
    def _directions(self, ctx: GrowthContext, owners: LayerOwners | None = None) -> dict:
        """The statistics pass on the model about to grow k, and the whitened gradient's SVD (of the
        layers ``owners`` gives this rank, if given; every layer's singular values in ``s_all``)."""
        o = self.options
        cap = o["max_chunk_scores"]
        freqs = new_pair_freqs(ctx.source, ctx.target)
        st: ScoreStatistics = gradient_statistics(
            ctx.model, self._stats_batches, reduce=ctx.reduce,
            max_chunk_scores=None if cap is None else float(cap), amp=ctx.amp, rotary_freqs=freqs, owners=owners,
        )
        self._stats_loss = st.loss  # the loss before the growth on the statistics batches (actual decrease)
        self._flops += st.flops
        f64 = torch.float64
        sigma, T = st.sigma.to(f64), st.t.to(f64)  # (L, h, h), (L, E, h, h) or (L, E, P, 2h, 2h)
        if freqs is not None:  # one 2h x 2h form per head and new pair, metric diag(Sigma, Sigma)
            sigma = torch.stack([torch.block_diag(s_n, s_n) for s_n in sigma])
        else:
            T = T.unsqueeze(2)  # P = 1
        cfg = ctx.model.config
        G, r, P, H = cfg.kv_heads, cfg.group_size, T.shape[2], T.shape[-1]
        # one form per key head (and new pair): the r query heads' forms stacked, (L, G P, r H, H)
        T = T.view(T.shape[0], G, r, P, H, H).transpose(2, 3).reshape(T.shape[0], G * P, r * H, H)
        inv_sqrt, sqrt = whitening(sigma, float(o["damping"]))
        sigma_q, inv_sqrt_q = (sigma, inv_sqrt) if r == 1 else (
            torch.stack([torch.block_diag(*[t] * r) for t in sigma]),
            torch.stack([torch.block_diag(*[t] * r) for t in inv_sqrt]))
        W = inv_sqrt_q.unsqueeze(1) @ T @ inv_sqrt.unsqueeze(1)
        U, s, Vh = torch.linalg.svd(W)
        L = cfg.n_layers
        s_all = s if owners is None else _by_layer(s, owners, L)
        self._flops += linalg_flops(cfg, P if freqs is not None else 0)
        m = self._metrics
        for n in range(L):
            m[f"svd/sigma_top/L{n}"] = float(s_all[n, :, 0].max())
        m["svd/stats_seconds"] = st.seconds
        m["svd/stats_flops"] = st.flops
        m["svd/stats_loss"] = st.loss
        m["svd/score_rms"] = float((st.score_sq.sum() / (st.n_entries * cfg.n_heads * L)).sqrt())
        return {"sigma": sigma, "T": T, "inv_sqrt": inv_sqrt, "sqrt": sqrt, "W": W, "U": U, "s": s, "V": Vh.mT,
                "sigma_q": sigma_q, "inv_sqrt_q": inv_sqrt_q, "entries_per_seq": float(st.entries_per_seq),
                "s_all": s_all}

    # ---- the final model: choose gamma, write the rows ---------------------------------
    def _grow_k(self, rows: "_KRows", model, reduce, amp, owners: LayerOwners | None = None) -> list[str]:
        """Choose gamma on the final ``model`` (its held-out losses, ``reduce``d over the ranks, under
        ``amp``) and write the q/k ``rows`` of every k-grown head; returns the names written. ``owners``:
        the directions are of this rank's layers, their changes computed there and broadcast (`_Owned`)."""
        o, d, m = self.options, self._dir, self._metrics
        mine = slice(None) if owners is None else owners.mine(rows.L)
        Wq0, Wk0, c = rows.Wq0[mine], rows.Wk0[mine], rows.c[mine]
        if o["mode"] == "new":
            change: _KChange = _NewColumns(d, Wq0, Wk0, c, rows.k, self.update_existing)
        else:
            change = _Refactor(d, Wq0, Wk0, c, rows.k, float(o["damping"]))
        if owners is not None:
            change = _Owned(change, owners, rows.L)
        # gamma's unit: the pooled RMS of X dM X^T (first order) equals max(score RMS, score_floor)
        ent = d["entries_per_seq"]
        ref = max(m["svd/score_rms"], float(o["score_floor"]))
        mean_unit = float(change.unit_sq.mean())
        unit = ref * math.sqrt(ent / mean_unit) if mean_unit > 0 else 0.0

        fwd = model.config.flops_per_token() / 3.0  # forward only, per token (no dL/dW_out under no_grad)
        evals, search_flops = 0, 0.0

        def loss_at(t: float, batches) -> float:
            nonlocal evals, search_flops
            rows.write(change, t * unit)
            evals += 1
            loss, ntok = token_mean_loss(model, batches, reduce, amp)
            search_flops += fwd * ntok
            return loss

        t1 = time.perf_counter()
        held = self._heldout_batches
        if o["gamma"] == "auto":
            losses = _bracket(self.grid if unit > 0 else [0.0], lambda t: loss_at(t, held))
            t_best = min(losses, key=lambda t: (losses[t], t))
            l0, l_best = losses[0.0], losses[t_best]
        else:
            t_best = float(o["gamma"])
            l0 = loss_at(0.0, held) if held else None
            l_best = loss_at(t_best, held) if held else None
        g = t_best * unit
        actual = 0.0
        if g > 0:  # on the statistics batches: their loss before the growth came with the statistics
            actual = self._stats_loss - loss_at(t_best, self._stats_batches)
        rows.write(change, g)

        X, Y, _, _ = change.rows(g)
        m["svd/gamma"] = g
        m["svd/gamma_rel"] = t_best
        m["svd/gamma_unit"] = unit
        m["svd/pred_decrease"] = float(change.pred_decrease(X, Y).sum())
        m["svd/actual_decrease"] = actual
        if held:
            m["svd/heldout_decrease"] = l0 - l_best
            m["svd/heldout_loss"] = l_best
        m["svd/score_change_ratio"] = math.sqrt(float(change.change_sq(X, Y).mean()) / ent) / ref
        for n in range(rows.L):  # sum over heads of sum_{i<=p} sigma_i^2: mode new's decrease per unit gamma
            m[f"svd/sigma_sq/L{n}"] = float(d["s_all"][n, :, : rows.k_hat - rows.k].pow(2).sum())
        ratio = change.quad_linear_ratio(g)
        if ratio is not None:
            m["svd/quad_linear_ratio"] = ratio
        m["svd/linesearch_evals"] = evals
        m["svd/linesearch_flops"] = search_flops
        self._flops += search_flops
        m["svd/linesearch_seconds"] = time.perf_counter() - t1
        m["svd/seconds"] = time.perf_counter() - self._t0
        return rows.names


def new_pair_freqs(source, target) -> torch.Tensor | None:
    """The frequencies theta^(-2j/K) of the rotary pairs k/2 .. k_hat/2 - 1 a k growth adds (K: the
    anchored table, `grow.model.TransformerConfig.rope_anchor`), float64; None without rotary positions."""
    if source.positions != "rope":
        return None
    return rope_freqs(target.d_qk, source.rope_theta, target.rope_anchor)[source.d_qk // 2:]


class _KRows:
    """The q/k rows of the k-grown heads in the final model, one *form* per key head g: where they are
    (flat positions, through the expansions after k), what the base left there (``Wq0`` (L, G, k_hat,
    r h): the rows of the group's r query heads side by side, ``Wk0`` (L, G, k_hat, h), float64), the
    form's factor ``c`` (L, 1, 1, 1) = mult_q mult_k / sqrt(k_hat) of the final model, and `write` to
    put the rows of a change at gamma in place. Without grouped-query attention r = 1 and G = E.
    ``layers``: the input model's layers to take (None: all; a unit's growth takes its own, `join`
    puts the units' together); ``sink(name, tensor)``, if set, gets every weight `write` changed."""

    def __init__(self, strategy: "SVD", model, layers: list[int] | None = None):
        src, kmap, kept = strategy._k_source, strategy._kmap, strategy._rows
        self.layers = list(range(src.n_layers)) if layers is None else list(layers)
        self.L, self.k, self.k_hat = len(self.layers), src.d_qk, model.config.d_qk
        self.sink = None
        params, modules = dict(model.named_parameters()), dict(model.named_modules())
        q = [kmap[f"layers.{n}.attn.q.weight"] for n in self.layers]
        k = [kmap[f"layers.{n}.attn.k.weight"] for n in self.layers]
        self.names = [name for name, _ in q] + [name for name, _ in k]
        self.pos_q = [idx[kept[n][0]] for n, (_, idx) in zip(self.layers, q)]  # (G, k_hat, r, h) flat positions
        self.pos_k = [idx[kept[n][1]] for n, (_, idx) in zip(self.layers, k)]  # (G, k_hat, h)
        self.wq, self.wk = [params[name] for name, _ in q], [params[name] for name, _ in k]
        mults = [modules[nq.rsplit(".", 1)[0]].mult * modules[nk.rsplit(".", 1)[0]].mult for (nq, _), (nk, _) in zip(q, k)]
        c = torch.tensor([mu / math.sqrt(self.k_hat) for mu in mults], dtype=torch.float64, device=self.pos_k[0].device)
        if bool((c <= 0).any()):
            raise ValueError("strategy 'svd': the q/k forward multipliers must be positive")
        self.c = c.view(self.L, 1, 1, 1)

    @classmethod
    def join(cls, parts: list["_KRows"]) -> "_KRows":
        """One `_KRows` of the layers of ``parts`` (each after `as_forms`), in the layers' order."""
        parts = sorted(parts, key=lambda r: r.layers)
        rows = object.__new__(cls)
        rows.__dict__.update(parts[0].__dict__)
        rows.layers = [n for r in parts for n in r.layers]
        rows.L = len(rows.layers)
        for attr in ("pos_q", "pos_k", "wq", "wk"):
            setattr(rows, attr, [x for r in parts for x in getattr(r, attr)])
        rows.names = [n for r in parts for n in r.names[:r.L]] + [n for r in parts for n in r.names[r.L:]]
        for attr in ("Wq0", "Wk0", "c"):
            setattr(rows, attr, torch.cat([getattr(r, attr) for r in parts]))
        return rows

    def as_forms(self, rotary: bool) -> None:
        """The positions as forms, and the rows the base left there. Plain: (G, k_hat, r h) and (G, k_hat,
        h). ``rotary``: each new pair t (coordinates k/2 + t and k_hat/2 + k/2 + t of a head, the new rows
        k + t and k + P + t in the expansion's order) becomes one form of k = 0 old rows and one new row,
        per query head [row of its first coordinate | row of its second]: (G P, 1, r 2h) and (G P, 1, 2h);
        ``c`` keeps the real k_hat."""
        if rotary:
            P = (self.k_hat - self.k) // 2

            def pairs(t: torch.Tensor) -> torch.Tensor:  # (G, k_hat, [r,] h) -> (G P, 1, [r] 2h)
                new = t[:, self.k:]
                both = torch.cat([new[:, :P], new[:, P:]], dim=-1)  # (G, P, [r,] 2h)
                return both.flatten(0, 1).flatten(1).unsqueeze(1)

            self.pos_q, self.pos_k = [pairs(p) for p in self.pos_q], [pairs(p) for p in self.pos_k]
            self.k, self.k_hat = 0, 1
        else:
            self.pos_q = [p.flatten(-2) for p in self.pos_q]
        f64 = torch.float64
        self.Wq0 = torch.stack([w.detach().view(-1)[p] for w, p in zip(self.wq, self.pos_q)]).to(f64)
        self.Wk0 = torch.stack([w.detach().view(-1)[p] for w, p in zip(self.wk, self.pos_k)]).to(f64)

    @torch.no_grad()
    def write(self, change: "_KChange", g: float) -> None:
        _, _, q_rows, k_rows = change.rows(g)
        for n in range(self.L):
            self.wq[n].view(-1)[self.pos_q[n].reshape(-1)] = q_rows[n].reshape(-1).to(self.wq[n].dtype)
            self.wk[n].view(-1)[self.pos_k[n].reshape(-1)] = k_rows[n].reshape(-1).to(self.wk[n].dtype)
        if self.sink is not None:
            for name, w in zip(self.names, self.wq + self.wk):
                self.sink(name, w)


def _bracket(grid: list[float], loss) -> dict[float, float]:
    """The losses evaluated to find the minimum of ``loss`` over ``grid`` (sorted, grid[0] = 0), by a
    ternary search over the grid's indices: each round evaluates two interior points and drops the
    third of the range beyond the worse one, until at most three points remain, all evaluated;
    ``grid[0]`` is always evaluated (the held-out loss before the change). Exact for a unimodal
    sequence (strictly decreasing, then increasing: a first-order descent that the second order
    overtakes, the usual shape); 5 to 6 evaluations of the 8 of the default grid. Returns
    ``{t: loss}`` for every point evaluated."""
    cache: dict[int, float] = {}

    def at(i: int) -> float:
        if i not in cache:
            cache[i] = loss(grid[i])
        return cache[i]

    at(0)
    lo, hi = 0, len(grid) - 1
    while hi - lo > 2:
        m1, m2 = lo + (hi - lo) // 3, hi - (hi - lo) // 3
        if at(m1) < at(m2):
            hi = m2 - 1
        elif at(m1) > at(m2):
            lo = m1 + 1
        else:
            lo, hi = m1, m2
    for i in range(lo, hi + 1):
        at(i)
    return {grid[i]: v for i, v in cache.items()}


def linalg_flops(cfg, pairs: int = 0) -> float:
    """The linear algebra `SVD._directions` counts on the model ``cfg`` about to grow k (eigh of Sigma,
    the whitening, the SVD of each form; approximate): per layer 9 H^3, and per form (G P of them: a
    key head and, under rotary positions, one of the ``pairs`` new pairs) 22 r H^3 + 4 H^3, H = h (2h
    under rotary positions), r = E / G."""
    H = cfg.d_model * (2 if pairs else 1)
    forms = cfg.kv_heads * max(pairs, 1)
    return float(cfg.n_layers * 9 * H**3 + cfg.n_layers * forms * (22 * cfg.group_size * H**3 + 4 * H**3))


def planned_flops(source, target, options: dict, batch_size: int) -> float:
    """An upper bound on svd's own FLOPs for one growth of d_k from ``source`` to ``target`` (configs),
    for ``grow schedule``. The statistics pass and the linear algebra run on the model about to grow k,
    whose h has grown already (`grow.growth.base.ORDER`: h first): `stats_flops` (exact) over
    ``batches`` x ``batch_size`` sequences and `linalg_flops` of ``source`` at ``target``'s d_model.
    The line search runs the grown model's forward: every point of ``gamma_grid`` on the ``heldout``
    batches (the ternary search evaluates 5-6 of 8; a fixed gamma: 2) and once more on the statistics
    batches (the actual decrease). 0 when d_k does not grow."""
    if target.d_qk <= source.d_qk:
        return 0.0
    nb, nh = int(options.get("batches", 4)), int(options.get("heldout", 2))
    at_k, s = source.replace(d_model=target.d_model), source.seq_len
    pairs = (target.d_qk - source.d_qk) // 2 if source.positions == "rope" else 0
    flops = stats_flops(at_k, nb * batch_size, s, pairs) + linalg_flops(at_k, pairs)
    points = len(options.get("gamma_grid", [0] * 8)) if options.get("gamma", "auto") == "auto" else 2
    flops += (points * nh + nb) * batch_size * s * target.flops_per_token() / 3.0
    return float(flops)
