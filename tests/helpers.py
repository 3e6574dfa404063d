"""Helpers shared by the test files (no test file imports from another): small models and batches, the Llama
family from its definitions, runs compared and stopped in-process, the CLI's refusals. The settings of every
test and the CLI runners (`grow_cli` in-process, `run_grow` a real process) are in tests/conftest.py."""

from __future__ import annotations

import json
import math
import os
import socket
import subprocess
import sys
from pathlib import Path

import pytest
import torch
import torch.nn.functional as F
from hydra import compose, initialize_config_dir
from omegaconf import OmegaConf

from grow import cli, events
from grow.checkpoint import StopRequest
from grow.config import CONFIG_DIR
from grow.model import Transformer, TransformerConfig
from grow.plan import build_plan
from grow.run import validate
from tests.conftest import ROOT, TINY_RUN, grow_cli

# ---- small models for the growth tests (float64, every parameter non-zero) (test_growth.py) ------------------------

BASE = TransformerConfig(vocab_size=61, seq_len=16, n_layers=2, d_model=16, n_heads=2, d_qk=4, d_v=6, d_ff=24)


# one target per dimension (Gesmundo & Maile's letters), and all six at once
TARGETS = {
    "h": dict(d_model=24),
    "k": dict(d_qk=7),
    "v": dict(d_v=9),
    "p": dict(d_ff=40),
    "E": dict(n_heads=3),
    "N": dict(n_layers=4),
}


ALL = {k: v for d in TARGETS.values() for k, v in d.items()}


CASES = list(TARGETS) + ["all"]


def target(case: str, cfg: TransformerConfig = BASE) -> TransformerConfig:
    return cfg.replace(**(ALL if case == "all" else TARGETS[case]))


def trained_like(cfg: TransformerConfig = BASE, dtype=torch.float64, seed: int = 0, scale: float = 1.5) -> Transformer:
    """A model whose every parameter is random and non-zero (gains around 1, biases non-zero),
    with weights large enough that attention is far from uniform."""
    g = torch.Generator().manual_seed(seed)
    model = Transformer(cfg).to(dtype)
    with torch.no_grad():
        for name, p in model.named_parameters():
            noise = torch.randn(p.shape, generator=g, dtype=dtype)
            if name.endswith("norm.weight"):
                p.copy_(1.0 + 0.3 * noise)
            elif p.dim() == 1:
                p.copy_(0.2 * noise)
            else:
                p.copy_(noise / math.sqrt(p.shape[1]) * scale)
    return model


def tokens(cfg: TransformerConfig = BASE, B: int = 3, seed: int = 1) -> torch.Tensor:
    g = torch.Generator().manual_seed(seed)
    return torch.randint(0, cfg.vocab_size, (B, cfg.seq_len), generator=g)


def max_delta(a: Transformer, b: Transformer, idx: torch.Tensor) -> float:
    with torch.no_grad():
        return float((a(idx) - b(idx)).abs().max())


def gen(seed: int = 0) -> torch.Generator:
    return torch.Generator().manual_seed(seed)


# ---------------------------------------------------------------------------------------------
# No dead units
# ---------------------------------------------------------------------------------------------
def _new_slices(mask: torch.Tensor):
    """(axis, index) of every slice of a parameter that is entirely new (a new row, column...)."""
    for axis in range(mask.dim()):
        other = tuple(a for a in range(mask.dim()) if a != axis)
        full = mask.all(dim=other) if other else mask
        for i in torch.nonzero(full).flatten().tolist():
            yield axis, i


# ---- batches and logits for the data-driven strategies (test_svd.py) -----------------------------------------------

F64 = torch.float64
SVD_CFG = TransformerConfig(vocab_size=50, seq_len=16, n_layers=2, d_model=16, n_heads=2, d_qk=4, d_v=4, d_ff=32)


def make_batches(n: int, bsz: int = 3, cfg: TransformerConfig = SVD_CFG, seed: int = 1):
    g = torch.Generator().manual_seed(seed)
    out = []
    for _ in range(n):
        x = torch.randint(0, cfg.vocab_size, (bsz, cfg.seq_len), generator=g)
        # a learnable pattern (copy of the token 3 back) so gradients are structured
        y = torch.roll(x, 3, dims=1)
        out.append((x, y))
    return out


def logits(model, x):
    model.eval()
    with torch.no_grad():
        return model(x)


# ---- the Llama family written from its definitions (test_llama.py) -------------------------------------------------

LLAMA_RUN = ["model=llama-tiny", *[a for a in TINY_RUN if not a.startswith("model=")]]


def idx(cfg: TransformerConfig, B: int = 3, T: int | None = None, seed: int = 1) -> torch.Tensor:
    return torch.randint(0, cfg.vocab_size, (B, T or cfg.seq_len), generator=torch.Generator().manual_seed(seed))


def rms_norm(x: torch.Tensor, g: torch.Tensor, eps: float) -> torch.Tensor:
    return g * x / torch.sqrt((x.pow(2).sum(-1, keepdim=True) + eps) / x.shape[-1])


def textbook_rope(x: torch.Tensor, theta: float, anchor: int | None = None) -> torch.Tensor:
    """x (B, H, T, k) rotated by position as complex numbers: pair i is x_i + 1j x_{i+k/2} (the half-split
    layout), multiplied by exp(1j m theta^(-2i/K)), K = ``anchor`` (k when None: plain RoPE)."""
    T, k = x.shape[-2], x.shape[-1]
    K = anchor or k
    z = torch.complex(x[..., : k // 2], x[..., k // 2:])
    freqs = torch.tensor([theta ** (-2 * i / K) for i in range(k // 2)], dtype=torch.float64)
    z = z * torch.polar(torch.ones(T, k // 2, dtype=torch.float64), torch.arange(T)[:, None] * freqs)
    return torch.cat([z.real, z.imag], dim=-1)


def textbook_forward(m: Transformer, tokens: torch.Tensor, anchor: int | None = None) -> torch.Tensor:
    """The logits of a Llama-style `m`, written from the definitions: token embeddings only, per head
    e the key/value head floor(e G / E), rotary queries and keys (frequencies anchored at ``anchor``),
    softmax attention with an explicit causal mask, silu(x W_gate) * (x W1) through W2 (every forward
    multiplier 1)."""
    cfg = m.config
    E, G, k, v = cfg.n_heads, cfg.kv_heads, cfg.d_qk, cfg.d_v
    x = m.wte.weight[tokens]
    B, T, _ = x.shape
    causal = torch.ones(T, T, dtype=torch.bool).tril()
    for layer in m.layers:
        a = rms_norm(x, layer.attn_norm.weight, cfg.norm_eps)
        q = (a @ layer.attn.q.weight.T).view(B, T, E, k).transpose(1, 2)
        kk = (a @ layer.attn.k.weight.T).view(B, T, G, k).transpose(1, 2)
        vv = (a @ layer.attn.v.weight.T).view(B, T, G, v).transpose(1, 2)
        q, kk = textbook_rope(q, cfg.rope_theta, anchor), textbook_rope(kk, cfg.rope_theta, anchor)
        heads = []
        for e in range(E):
            g = e * G // E
            s = q[:, e] @ kk[:, g].transpose(-2, -1) / math.sqrt(k)
            heads.append(torch.softmax(s.masked_fill(~causal, float("-inf")), dim=-1) @ vv[:, g])
        x = x + torch.cat(heads, dim=-1) @ layer.attn.o.weight.T
        b = rms_norm(x, layer.mlp_norm.weight, cfg.norm_eps)
        x = x + (F.silu(b @ layer.mlp.gate.weight.T) * (b @ layer.mlp.fc1.weight.T)) @ layer.mlp.fc2.weight.T
    return rms_norm(x, m.norm.weight, cfg.norm_eps) @ m.lm_head.weight.T


def rel(a: torch.Tensor, b: torch.Tensor) -> float:
    return float((a - b).abs().max() / b.abs().max()) if not a.requires_grad else rel(a.detach(), b.detach())


# ---- runs compared, stopped and poisoned in-process (test_checkpoint.py) -------------------------------------------

TIMING = ("seconds", "tokens_per_s", "train/mfu")  # wall-clock fields: the only ones that may differ


def make_cfg(*overrides):
    with initialize_config_dir(str(CONFIG_DIR), version_base="1.3"):
        cfg = compose("train", overrides=list(overrides))
    validate(cfg)
    return cfg


def comparable(records):
    return [{k: v for k, v in r.items() if not any(t in k for t in TIMING)} for r in records]


def losses(records):
    return [(r.get("train/step"), k, v) for r in records for k, v in r.items() if "loss" in k]


class StopAt(StopRequest):
    """A stop request (as SIGTERM would make) at a given safe point of the loop."""

    def __init__(self, where: str, *, step: int | None = None, stage: int | None = None, name: str = "SIGTERM"):
        super().__init__()
        self.at, self.step, self.stage, self.name = where, step, stage, name

    def poll(self, state, where):
        if where != self.at:
            return None
        if self.step is not None and state.step < self.step:
            return None
        if self.stage is not None and state.stage != self.stage:
            return None
        return self.name


def grow_train_stopped_at(step: int, *args: str, cwd):
    """``grow train <args>`` through `grow_cli` (in this process), stopped after step ``step`` as SIGTERM stops a
    run (a checkpoint, exit 0): the first session of a resume test, without a process to signal."""
    from grow import checkpoint

    with pytest.MonkeyPatch.context() as m:
        m.setattr(checkpoint, "StopRequest", lambda: StopAt("step", step=step))
        out = grow_cli("train", *args, cwd=cwd)
    assert out.returncode == 0 and f"stopped by SIGTERM at step {step}" in out.stderr, out.stderr[-2000:]
    return out


def model_of(node) -> TransformerConfig:
    """The model config of a composed ``model`` node, as `grow.run.load` reads it."""
    return TransformerConfig.from_node(OmegaConf.to_container(node, resolve=True))


def plan_of(*overrides):
    cfg = make_cfg(*overrides)
    return build_plan(model_of(cfg.model), OmegaConf.to_container(cfg.schedule), max_tokens=int(cfg.trainer.max_tokens),
                      batch_size=int(cfg.trainer.batch_size))


def poison(bad_steps):
    """A NaN loss, gradient norm and gradients at the given (1-based) steps of the runs in the ``with`` block,
    through the ``backward`` event (`grow.events`): the test hook for non-finite steps."""
    count = {"n": 0}

    def fill(trainer, loss, gnorm):
        count["n"] += 1
        if count["n"] in bad_steps:
            for p in trainer.model.parameters():
                if p.grad is not None:
                    p.grad.fill_(float("nan"))
            loss.fill_(float("nan"))
            gnorm.fill_(float("nan"))

    return events.observing("backward", fill)


# ---- a growth run through the CLI (test_staged.py) -----------------------------------------------------------------

def run_schedule(tmp_path, strategy, *extra):
    run_dir = tmp_path / strategy
    out = grow_cli("train", "+schedule=exp", f"strategy={strategy}", *TINY_RUN, "trainer.max_tokens=40000",
                   "trainer.recovery_steps=5", *extra, f"hydra.run.dir={run_dir}", cwd=tmp_path)
    assert out.returncode == 0, out.stderr[-3000:]
    records = [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines()]
    summary = json.loads((run_dir / "summary.json").read_text())
    return out, records, summary


def growths(records):
    return [r for r in records if "growth/delta" in r]


# ---- a refusal of the CLI in-process (test_bad_inputs.py) ----------------------------------------------------------

def run_cli(argv, capsys) -> tuple[int, list[str]]:
    with pytest.raises(SystemExit) as info:
        cli.main(argv)
    err = capsys.readouterr().err
    assert "Traceback" not in err, err
    return info.value.code, [ln for ln in err.splitlines() if ln.strip()]


def expect_refusal(argv, text, capsys, tmp_path):
    code, lines = run_cli([*argv, f"hydra.run.dir={tmp_path / 'run'}"], capsys)
    assert code == 2, (code, lines)
    assert len(lines) == 1 and lines[0].startswith("error: "), lines
    assert text in lines[0], lines[0]
    assert not (tmp_path / "run").exists()  # refused before any work
    return lines[0]


def in_float64(hf) -> None:
    """transformers' decoders compute three things in float32 whatever the model's dtype: the rotary table (the
    rotary embedding casts the frequencies with ``.float()``), every RMSNorm (``.to(torch.float32)`` or
    ``.float()`` before the mean of squares) and Gemma's embedding scale (a float32 buffer). For a float64
    comparison of the mapping itself, all in float64 here; Llama 3's frequencies are transformers'
    ``_compute_llama3_parameters`` transcribed in float64 (tests/test_families.py checks grow's against
    transformers' own float32 ones)."""
    cfg = hf.config
    rope = dict(getattr(cfg, "rope_parameters", None) or {})
    theta = rope.get("rope_theta") or cfg.rope_theta
    k = getattr(cfg, "head_dim", None) or cfg.hidden_size // cfg.num_attention_heads
    inv = 1.0 / theta ** (torch.arange(0, k, 2, dtype=torch.float64) / k)
    if rope.get("rope_type") == "llama3":
        s, low, high, L = (rope[key] for key in ("factor", "low_freq_factor", "high_freq_factor",
                                                 "original_max_position_embeddings"))
        wavelen = 2 * math.pi / inv
        scaled = torch.where(wavelen > L / low, inv / s, inv)
        smooth = (L / wavelen - low) / (high - low)
        medium = ~(wavelen < L / high) * ~(wavelen > L / low)
        inv = torch.where(medium, (1 - smooth) * scaled / s + smooth * scaled, scaled)

    def rotary(x, position_ids):
        angles = position_ids[..., None].double() * inv
        emb = torch.cat([angles, angles], dim=-1)
        return emb.cos().to(x.dtype), emb.sin().to(x.dtype)

    hf.model.rotary_emb.forward = rotary
    for module in hf.modules():
        name = type(module).__name__
        if name == "GemmaRMSNorm":
            module.forward = (lambda m: lambda x: (1.0 + m.weight) * x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True)
                                                                                     + m.eps))(module)
        elif name.endswith("RMSNorm"):
            module.forward = (lambda m: lambda x: m.weight * x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True)
                                                                                + m.variance_epsilon))(module)
        elif hasattr(module, "scalar_embed_scale"):
            module.embed_scale = torch.tensor(module.scalar_embed_scale, dtype=torch.float64)


def no_hub(monkeypatch) -> str:
    """A Hub that refuses connections (HF_ENDPOINT: a closed loopback port), no proxy, no offline mode asked."""
    from grow import hub, net

    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        url = f"http://127.0.0.1:{sock.getsockname()[1]}"
    monkeypatch.setenv("HF_ENDPOINT", url)
    for name in (*net.PROXY_VARIABLES, *hub.OFFLINE_VARIABLES):
        monkeypatch.delenv(name, raising=False)
    return url


LOSSES = {
    "baseline": [4.00, 4.10, 4.20],
    "baseline init=vt": [3.95, 4.02, 4.15],
    "vt": [3.90, 4.05, 4.10],
    "zero": [4.30, 4.36, 4.50],
    "equal_flops size=s1": [4.20, 4.25, 4.40],
    "equal_flops": [4.50, 4.60, 4.70],
}
KINDS = {"baseline": ("baseline", {}), "baseline init=vt": ("matched", {"parameterization": "vt"}),
         "vt": ("grown", {"strategy": "vt", "parameterization": "vt"}),
         "zero": ("grown", {"strategy": "zero", "parameterization": None}),
         "equal_flops size=s1": ("equal_flops", {"size": 1, "budget_flops": 600.0}),
         "equal_flops": ("equal_flops", {"size": 2, "budget_flops": 600.0})}
FINAL = {"n_layers": 1, "d_model": 2, "n_heads": 1, "d_qk": 2, "d_v": 2, "d_ff": 4, "seq_len": 4, "vocab_size": 8}


def _records(kind: str, loss: float, flops: float) -> list[dict]:
    """A baseline-like curve (250, 5.0), (500, 4.6), (flops, loss); a grown one (300, 4.5), a growth
    to 4.52, (flops, loss). Training losses: the baseline's 5.0 at step 0 to 4.0 at step 10 (4.6 -> 4.1 over
    steps 4 -> 9); a grown run's 4.8 at step 4 (its growth) and 4.2 at step 9 (its recovery's end):
    0.1 more than the baseline's fall over the same steps."""
    if kind == "grown":
        return [{"train/loss": 5.2, "train/step": 0, "train/flops": 0.0}, {"train/loss": 4.8, "train/step": 4, "train/flops": 240.0},
                {"val/loss": 4.5, "train/flops": 300.0, "time/seconds": 1.0},
                {"growth/stage": 2, "growth/loss_before": 4.5, "growth/loss_after": 4.52, "growth/delta": 0.02,
                 "growth/flops": 0.0, "growth/seconds": 0.0, "train/flops": 300.0},
                {"train/loss": 4.2, "train/step": 9, "train/flops": 540.0}, {"val/loss": loss, "train/flops": flops, "time/seconds": 2.0}]
    return [{"train/loss": 5.0, "train/step": 0, "train/flops": 0.0}, {"train/loss": 4.0, "train/step": 10, "train/flops": 600.0},
            {"val/loss": 5.0, "train/flops": 250.0, "time/seconds": 0.5},
            {"val/loss": 4.6, "train/flops": 500.0, "time/seconds": 1.0},
            {"val/loss": loss, "train/flops": flops, "time/seconds": 2.0}]


def fake_sweep(d, losses=LOSSES, seeds=(0, 1, 2)):
    """A sweep directory as grow compare writes it (arm.json, summary.json, metrics.jsonl per arm and seed)."""
    for job, (label, values) in enumerate(losses.items()):
        kind, info = KINDS[label]
        flops = 600.0 if kind in ("grown", "equal_flops") else 1000.0
        for seed in seeds:
            if seed >= len(values) or values[seed] is None:
                continue
            run = d / f"{label.replace(' ', '_')}-seed{seed}"
            run.mkdir(parents=True)
            arm = {"arm": label, "kind": kind, "strategy": None, "seed": seed, "setting": {}, "baseline_arm": "baseline",
                   "job": job, "plan_flops": flops, **info}
            events = [{"growth/stage": 2, "growth/loss_before": 4.5, "growth/loss_after": 4.52, "growth/delta": 0.02,
                       "growth/recovery": -0.1, "growth/recovery_steps": 5, "train/step": 4, "train/flops": 240.0}] if kind == "grown" else []
            summary = {"complete": True, "final_val_loss": values[seed], "tokens": 1000, "flops": flops,
                       "train_flops": flops, "growth_flops": 0.0, "train_seconds": 2.0, "compile_seconds": 0.0,
                       "wall_seconds": 3.0, "params": 100, "final_config": FINAL, "growth_events": events,
                       "load_average": [1.0, 1.5], "stage_plan": [],
                       "data": {"train_tokens": 5000, "val_tokens": 500, "epochs": 1000 / 5000, "bigram_val_loss": 4.9,
                                "bigram_lambda": 0.9, "bigram_train_tokens": 5000}}
            (run / "arm.json").write_text(json.dumps(arm))
            (run / "summary.json").write_text(json.dumps(summary))
            recs = _records(kind, values[seed], flops)
            (run / "metrics.jsonl").write_text("".join(json.dumps(r) + "\n" for r in recs))
    return d


CODE = "def f{i}(x):\n    return [x * {i} for _ in range({i})]\n\n"


def pysrc_tree(root):
    """A tree of Python packages for data=pysrc: three packages and a top-level module; pkg_b/copy.py is
    pkg_a/util.py byte for byte (a vendored copy)."""
    files = {"pkg_a/__init__.py": 40, "pkg_a/util.py": 60, "pkg_b/__init__.py": 50, "pkg_b/sub/deep.py": 30,
             "pkg_c/main.py": 70, "mod_d.py": 45, "pkg_e/__init__.py": 55, "pkg_f/x.py": 35, "pkg_g/y.py": 65}
    for rel, n in files.items():
        path = root / rel
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(f"# {rel}\n" + "".join(CODE.format(i=i) for i in range(n)))
    (root / "pkg_b" / "copy.py").write_bytes((root / "pkg_a" / "util.py").read_bytes())
    (root / "pkg_a" / "__pycache__").mkdir()
    (root / "pkg_a" / "__pycache__" / "junk.py").write_text("never read")
    (root / "notes.txt").write_text("not python")
    return root


# ---- Makefile targets run through make itself (test_make.py, and the targets tested in their own files) -----------


def outside_make() -> dict:
    """This process's environment without what an enclosing make hands its recipes: its flags, and the variables
    of its command line, which make both lists in MAKEFLAGS and exports (under ``make test TORCH=...``, as CI runs
    it, every make a test starts would otherwise see that TORCH)."""
    flags = os.environ.get("MAKEFLAGS", "")
    given = {a.partition("=")[0] for a in flags.partition(" -- ")[2].split() if "=" in a} if " -- " in flags else set()
    drop = {"MAKEFLAGS", "MFLAGS", "MAKEOVERRIDES", "MAKELEVEL", *given}
    return {k: v for k, v in os.environ.items() if k not in drop}


def run_make(target: str, *variables: str, args=(), status: int = 0) -> subprocess.CompletedProcess:
    """``make <target> VENV=<this interpreter's> ARGS='<args>' <variables>`` in the checkout, its exit ``status``
    (make's: 2 when a recipe fails) and no install asserted. ``VENV`` is the running interpreter's environment and ``-o <its install stamp>`` keeps the stamp rule
    (a reinstall when pyproject.toml is newer than the stamp) from running; the recipes' grow commands are forked
    warm (``GROW``: tests/growd.py), or started as ``python -m grow`` under ``GROWD=0``."""
    from tests import growd

    venv = Path(sys.executable).parent.parent
    warm = growd.enabled()
    grow = f"{sys.executable} {ROOT / 'tests' / 'growd.py'}" if warm else f"{sys.executable} -m grow"
    cmd = ["make", "-o", f"{venv}/.grow-installed", target, f"VENV={venv}", f"ARGS={' '.join(args)}",
           f"GROW={grow}", *variables]
    env = {**outside_make(), **({"GROWD_SOCKET": growd.socket_path()} if warm else {})}
    out = subprocess.run(cmd, cwd=ROOT, capture_output=True, text=True, timeout=600, env=env)
    assert out.returncode == status, (cmd, out.stdout[-3000:], out.stderr[-3000:])
    assert "pip install" not in out.stdout, out.stdout  # nothing installed
    return out


# ---- models with every parameter random (the MoE and upcycling tests) ------------------------------------------


# the MoE and upcycling tests' two families: grouped-query Llama with 4 experts, GPT-style with 3 (top 2 each)
MOE_LLAMA = TransformerConfig(vocab_size=53, seq_len=16, n_layers=2, d_model=16, n_heads=4, d_qk=4, d_v=4, d_ff=24,
                              activation="swiglu", positions="rope", n_kv_heads=2, mlp_bias=False,
                              tie_embeddings=True, n_experts=4, top_k=2)
MOE_GPT = TransformerConfig(vocab_size=53, seq_len=16, n_layers=2, d_model=16, n_heads=2, d_qk=8, d_v=8, d_ff=24,
                            n_experts=3, top_k=2)


def random_like(cfg: TransformerConfig, seed: int = 0) -> Transformer:
    """Every parameter random and non-zero, routers sharp enough that the top-k choice matters."""
    g = torch.Generator().manual_seed(seed)
    model = Transformer(cfg).to(torch.float64)
    with torch.no_grad():
        for name, p in model.named_parameters():
            noise = torch.randn(p.shape, generator=g, dtype=torch.float64)
            p.copy_(1.0 + 0.3 * noise if name.endswith("norm.weight") else
                    0.2 * noise if p.dim() == 1 else noise / math.sqrt(p.shape[1]) * 1.5)
    return model
