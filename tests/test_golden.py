"""A CPU run's metrics.jsonl is a function of its config: kept against golden files, on any CPU.

Restructuring the trainer must not change a number it writes. Each case trains a tiny growth run
in-process and compares its records, wall-clock fields aside, with files committed from another
machine. Float results differ in their last bits between CPUs (Intel and AMD, AVX-512, AVX2 or
neither, ARM): matmuls, norms and softmax sums add their partial sums in an order that depends on
the SIMD width and on the BLAS code path. So the comparisons are:

1. **float64 against ``tests/golden/<case>-float64.jsonl``, relative tolerance ``RTOL_FLOAT64`` =
   1e7 u64 (u64 = 2^-53, so ~1.1e-9).** The runs are the golden cases with ``precision=float64``
   (their stage-0 weights drawn in float64: torch's float32 normal sampler rounds differently with
   and without AVX2; and on every CPU the model's dropout masks are uniform draws, `grow.model.dropout`:
   torch's own CPU dropout takes its masks from MKL on Intel CPUs only, so vt-exp's dropout differed
   between Intel and AMD). A case amplifies a perturbation of its weights by up to ~1e6-1e7 over its run
   (vt-exp, measured: float32 rounding differences of u32 = 6e-8 grow to 0.35 in ``train/grad_norm``
   by its last step; float64 ones to 1.7e-11), so float64 rounding stays below ~1e-9, while any
   change of what a run computes (a learning rate 0.1% off: 3.6e-3 relative; Adam's eps 1e-8 ->
   1e-9: 1e-4) is far above it. This is the cross-machine guard against a restructuring.
2. **float32 against ``tests/golden/<case>.jsonl`` where the case does not amplify rounding
   (``FLOAT32_CASES``), relative tolerance ``8 S u32``** (S the run's optimizer steps, u32 = 2^-24):
   a reordered float32 sum moves a result by a few u32; each of the S steps passes such a change on
   and they add up, ×2 for squared figures (svd's σ²). svd-exp, S = 58: 2.8e-5; measured between
   this machine's SIMD paths (ATen default/AVX2/AVX-512, MKL SSE4.2/AVX2/AVX-512 and its
   conditional-numerical-reproducibility mode) and between an AMD EPYC and the Intel machine that
   wrote the file: at most 2.1e-6 (svd/sigma_sq), 1.9e-7 on grad_norm. vt-exp is not compared in
   float32: it amplifies rounding exponentially (above), no rounding bound holds across machines.
3. **float32 bitwise, same machine: every case twice in this process.** The same config on the same
   machine must give the same bits (no dependence on global state, dict order, uninitialised memory).

Keys that are differences of two losses (``growth/delta``, ``growth/recovery``, svd's
``*_decrease``) carry the absolute rounding of the losses: their tolerance is the relative one times
the largest validation loss of the file, not their own magnitude. Integers and strings are equal.

The tests never write their expectation: a deliberate change of what a run computes or logs
regenerates the files with ``python scripts/golden.py`` in the commit that makes the change, saying
why (``GROW_REGENERATE_GOLDEN`` is not read).
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from hydra import compose, initialize_config_dir

from grow import train as train_mod
from grow.config import CONFIG_DIR
from grow.metrics import read_metrics
from grow.run import load as load_run
from grow.run import validate
from tests.conftest import TINY_RUN

GOLDEN = Path(__file__).resolve().parent / "golden"
TIMING = ("seconds", "tokens_per_s", "train/mfu")  # wall-clock fields: the only ones that may differ
CASES = {
    # vt: lr multipliers and per-stage ages; dropout: the torch RNG; evaluations and recoveries mid-stage
    "vt-exp": [*TINY_RUN, "+schedule=exp", "strategy=vt", "schedule.grow=[d_model,d_ff,d_qk,d_v,n_layers]",
               "model.dropout=0.1", "trainer.max_tokens=30000", "trainer.recovery_steps=4", "trainer.eval_every=9"],
    # svd: growth batches, statistics, the line search; every dimension grows
    "svd-exp": [*TINY_RUN, "+schedule=exp", "strategy=svd", "+schedule.start.n_heads=2",
                "trainer.max_tokens=30000", "trainer.recovery_steps=3"],
}
FLOAT32_CASES = ("svd-exp",)  # the cases that do not amplify rounding (module docstring, 2.)
U32, U64 = 2.0**-24, 2.0**-53
RTOL_FLOAT64 = 1e7 * U64
DIFFERENCES = ("growth/delta", "growth/recovery", "_decrease")  # differences of two losses


def comparable(records: list[dict]) -> list[dict]:
    return [{k: v for k, v in r.items() if not any(t in k for t in TIMING)} for r in records]


def run_case(case: str, run_dir: Path, precision: str = "float32") -> list[dict]:
    """The case's records (wall-clock fields dropped), trained in-process into ``run_dir``."""
    with initialize_config_dir(str(CONFIG_DIR), version_base="1.3"):
        cfg = compose("train", overrides=[*CASES[case], f"precision={precision}"])
    validate(cfg)
    train_mod.train(load_run(cfg), run_dir)
    return comparable(read_metrics(run_dir))


def golden_path(case: str, precision: str) -> Path:
    return GOLDEN / (f"{case}.jsonl" if precision == "float32" else f"{case}-{precision}.jsonl")


def read_golden(case: str, precision: str) -> list[dict]:
    return [json.loads(line) for line in golden_path(case, precision).read_text().splitlines()]


def mismatches(got: list[dict], want: list[dict], rtol: float) -> list[str]:
    """Every value of ``got`` that differs from ``want`` by more than the tolerance (module docstring)."""
    if len(got) != len(want):
        return [f"{len(got)} records, {len(want)} expected"]
    loss_scale = max(abs(r["val/loss"]) for r in want if "val/loss" in r)
    bad = []
    for i, (g, w) in enumerate(zip(got, want)):
        if sorted(g) != sorted(w):
            bad.append(f"record {i}: keys {sorted(set(g) ^ set(w))} differ")
            continue
        for k, b in w.items():
            a = g[k]
            if isinstance(b, float) and isinstance(a, (int, float)) and not isinstance(a, bool):
                scale = loss_scale if any(d in k for d in DIFFERENCES) else abs(b)
                if not abs(a - b) <= rtol * scale:
                    bad.append(f"record {i} (step {w.get('train/step')}) {k}: {a!r} vs {b!r} "
                               f"(relative {abs(a - b) / max(scale, 1e-300):.2e} > {rtol:.2e})")
            elif a != b or type(a) is not type(b):
                bad.append(f"record {i} (step {w.get('train/step')}) {k}: {a!r} vs {b!r}")
    return bad


def float32_rtol(want: list[dict]) -> float:
    """8 S u32, S = the run's optimizer steps (module docstring, 2.)."""
    steps = max(r["train/step"] for r in want)
    return 8 * steps * U32


@pytest.mark.parametrize("case", sorted(CASES))
def test_float64_run_is_the_golden_one(case, tmp_path):
    bad = mismatches(run_case(case, tmp_path / "run", "float64"), read_golden(case, "float64"), RTOL_FLOAT64)
    assert not bad, "\n".join(bad[:20])


@pytest.fixture(scope="module")
def float32_run(tmp_path_factory):
    """The case's float32 records, trained once for the module: the golden comparison's run and the first of
    the two that must be bitwise equal."""
    runs = {}

    def get(case: str) -> list[dict]:
        if case not in runs:
            runs[case] = run_case(case, tmp_path_factory.mktemp(case) / "run")
        return runs[case]

    return get


@pytest.mark.parametrize("case", FLOAT32_CASES)
def test_float32_run_is_the_golden_one_within_rounding(case, float32_run):
    want = read_golden(case, "float32")
    bad = mismatches(float32_run(case), want, float32_rtol(want))
    assert not bad, "\n".join(bad[:20])


@pytest.mark.parametrize("case", sorted(CASES))
def test_float32_run_is_bitwise_the_same_twice_on_one_machine(case, tmp_path, float32_run):
    first, second = float32_run(case), run_case(case, tmp_path / "b")
    assert len(first) == len(second)
    for i, (a, b) in enumerate(zip(first, second)):
        assert json.dumps(a, sort_keys=True) == json.dumps(b, sort_keys=True), f"record {i}: {a} != {b}"


def test_the_tolerances_tell_a_real_change_from_rounding(tmp_path):
    """The float32 tolerance rejects a learning rate 0.1% off and one step fewer; it accepts the same
    values moved by a few ulps."""
    want = read_golden("svd-exp", "float32")
    rtol = float32_rtol(want)
    nudged = [{k: (v * (1 + 4 * U32) if isinstance(v, float) else v) for k, v in r.items()} for r in want]
    assert not mismatches(nudged, want, rtol)
    assert mismatches(want[:-1], want, rtol)
    with initialize_config_dir(str(CONFIG_DIR), version_base="1.3"):
        cfg = compose("train", overrides=[*CASES["svd-exp"], "optim.lr=0.002997"])
    validate(cfg)
    train_mod.train(load_run(cfg), tmp_path / "run")
    assert mismatches(comparable(read_metrics(tmp_path / "run")), want, rtol)
