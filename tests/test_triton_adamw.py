"""The growth-aware AdamW's Triton kernel (grow/optim/triton_adamw.py, grow/optim/triton_kernel.py): per
element against a float64 reference of the update and against the C pass, at several birth stages, on
tensors of odd sizes, float32, float64 and bfloat16; its (tensor, block) table built on the device; its
compiled code for sm_90 (128-bit loads, no FMA); on a GPU (marker gpu) against torch's fused AdamW and the
C pass, failing if the optimizer fell back to another route. Without Triton (torch's CPU wheels) the
tests that need it skip; the CPU ones run it in Triton's interpreter (TRITON_INTERPRET=1)."""

from __future__ import annotations

import re

import pytest
import torch

from grow.optim import triton_adamw as T

needs_cuda = pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")
SIZES = (1, 7, 1023, 1024, 1025, 3001, 4096 + 17)  # odd sizes: partial blocks, a tensor of one block, of one element
BETAS, EPS = (0.9, 0.95), 1e-8


def needs_triton():
    ok, why = T.available()
    if not ok:
        pytest.skip(why)


def case(dtype, stages: int, device: str = "cpu", seed: int = 0):
    """Tensors of `SIZES` with random gradients, moments (v >= 0), births in [0, stages) and a (K, S, 3) table
    of (neg_step, bc2_sqrt, decay) as `GrowthAwareAdamW._derived` gives them at several step counts."""
    g = torch.Generator().manual_seed(seed)
    rand = lambda n, scale=1.0: (torch.randn(n, generator=g, dtype=torch.float64) * scale)
    ps = [rand(n).to(dtype) for n in SIZES]
    gs = [rand(n, 1e-2).to(dtype) for n in SIZES]
    ms = [rand(n, 1e-2).to(dtype) for n in SIZES]
    vs = [(rand(n, 1e-2) ** 2).to(dtype) for n in SIZES]
    births = [torch.randint(0, stages, (n,), generator=g, dtype=torch.uint8) for n in SIZES]
    rows = []
    for k in range(len(SIZES)):
        per = []
        for s in range(stages):
            n = 1 + 7 * (stages - s) + k  # older stages have taken more steps
            a = 3e-3 * (1 + 0.1 * s)
            per.append((-a / (1 - BETAS[0] ** n), (1 - BETAS[1] ** n) ** 0.5, 1 - a * 0.1 if k % 2 else 1.0))
        rows.append(per)
    table = torch.tensor(rows, dtype=torch.float64).to(T.scalar_dtype(dtype))
    move = lambda ts: [t.to(device) for t in ts]
    return move(ps), move(gs), move(ms), move(vs), move(births), table.to(device)


def reference(ps, gs, ms, vs, births, table):
    """The update of every element in float64 from the same inputs (`grow.optim.adamw._derived`'s scalars of its
    birth stage), the C kernel's order of operations: per tensor ((p, m, v), (their terms' magnitudes)), the
    magnitudes the scale of a rounding error (a sum that cancels keeps its terms' absolute error)."""
    b1, b2 = BETAS
    out = []
    for k, (p, g, m, v, b) in enumerate(zip(ps, gs, ms, vs, births)):
        p, g, m, v = (t.double().cpu() for t in (p, g, m, v))
        row = table[k].double().cpu()[b.long().cpu()]
        mi = m + (1 - b1) * (g - m)
        vi = v * b2 + (1 - b2) * g * g
        step = (mi * row[:, 0]) / (vi.sqrt() / row[:, 1] + EPS)
        out.append(((p * row[:, 2] + step, mi, vi), ((p * row[:, 2]).abs() + step.abs(), m.abs() + g.abs(), vi)))
    return out


def ulps(got: torch.Tensor, want: torch.Tensor, dtype, terms: torch.Tensor | None = None) -> float:
    """The largest |got - want| in units of ``dtype``'s relative eps times ``terms`` (default |want|), floored at
    the smallest normal."""
    info = torch.finfo(dtype)
    scale = (want.double().abs() if terms is None else terms.double()).cpu().clamp_min(info.tiny) * info.eps
    return float(((got.double().cpu() - want.double().cpu()).abs() / scale).max())


# ---- the (tensor, block) table ---------------------------------------------------------------------


def test_the_block_table_is_built_on_the_device_and_lists_every_block_of_every_tensor():
    """The rows a Python loop over the blocks would give (k, j) for the j-th BLOCK-element block of tensor k,
    empty tensors included, built by torch ops (no loop over the ~6.5M blocks of a 7B model)."""
    sizes = (0, *SIZES, 5 * T.BLOCK, 0, 1)
    want = [(k, j) for k, n in enumerate(sizes) for j in range(-(-n // T.BLOCK))]
    got = T.chunk_table(sizes, torch.device("cpu"))
    assert got.dtype == torch.int64 and got.tolist() == [list(r) for r in want]
    assert T.chunk_table(sizes, torch.device("cpu")) is got  # cached per list of sizes


# ---- the kernel in Triton's interpreter --------------------------------------------------------------


@pytest.mark.parametrize("stages", [1, 3, 5])
@pytest.mark.parametrize("dtype", [torch.float32, torch.float64, torch.bfloat16], ids=["fp32", "fp64", "bf16"])
def test_in_the_interpreter_each_element_is_the_reference_s_update(dtype, stages, monkeypatch):
    """float32/float64: within 4 ulp of the float64 reference (a handful of IEEE roundings; an ulp of the terms'
    magnitude, where p * decay and the step cancel); bfloat16 (computed in float32, rounded once on store): within
    1 ulp, as a float64 update rounded to bfloat16 would be."""
    needs_triton()
    monkeypatch.setenv("TRITON_INTERPRET", "1")
    ps, gs, ms, vs, births, table = case(dtype, stages)
    want = reference(ps, gs, ms, vs, births, table)
    T.adamw_multi_tensor(ps, gs, ms, vs, births, table, (*BETAS, EPS))
    limit = 1.0 if dtype == torch.bfloat16 else 4.0
    for k, (values, terms) in enumerate(want):
        for name, got, w, t in zip("pmv", (ps[k], ms[k], vs[k]), values, terms):
            assert ulps(got, w, dtype, t) <= limit, (SIZES[k], name)


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64], ids=["fp32", "fp64"])
def test_in_the_interpreter_the_kernel_gives_the_c_pass_s_bits(dtype, monkeypatch):
    """No FMA, IEEE division and square root: the C kernel's bits (grow.optim.native), element by element."""
    from grow.optim.native import native_adamw

    needs_triton()
    kernel, why = native_adamw()
    if kernel is None:
        pytest.skip(why)
    monkeypatch.setenv("TRITON_INTERPRET", "1")
    a, b = case(dtype, 4), case(dtype, 4)
    T.adamw_multi_tensor(*a, (*BETAS, EPS))
    kernel(*b, (*BETAS, EPS))
    for x, y in zip(a[:4], b[:4]):
        assert all(torch.equal(s, t) for s, t in zip(x, y))


def test_an_unaligned_view_takes_the_scalar_loads_and_the_same_values(monkeypatch):
    """A tensor 4 bytes past a 16-byte boundary: ALIGNED=False (a 128-bit load there would fault on a GPU)."""
    needs_triton()
    monkeypatch.setenv("TRITON_INTERPRET", "1")
    launches = []
    real = T._kernel()

    class Spy:
        def __getitem__(self, grid):
            return lambda *a, **kw: launches.append(kw) or real[grid](*a, **kw)

    monkeypatch.setattr(T, "_kernel", lambda: Spy())
    ps, gs, ms, vs, births, table = case(torch.float32, 2)
    want = reference(ps, gs, ms, vs, births, table)
    T.adamw_multi_tensor(ps, gs, ms, vs, births, table, (*BETAS, EPS))
    ps2, gs2, ms2, vs2, births2, _ = case(torch.float32, 2)
    ps2[2] = torch.cat([torch.zeros(1), ps2[2]])[1:]  # one float32 in: 4 bytes off
    T.adamw_multi_tensor(ps2, gs2, ms2, vs2, births2, table, (*BETAS, EPS))
    assert [kw["ALIGNED"] for kw in launches] == [True, False]
    assert all(kw["enable_fp_fusion"] is False for kw in launches)  # the FMA policy (T.FP_FUSION)
    assert ps2[2].data_ptr() % 16 == 4 and ulps(ps2[2], want[2][0][0], torch.float32, want[2][1][0]) <= 4


def test_the_optimizer_records_which_route_updated_the_mixed_tensors(monkeypatch):
    """`GrowthAwareAdamW.routes`: tensors per route, so a test (and gpu-check) sees a fallback, not only a warning
    said once. The C pass on the CPU; eager with optim.compile off."""
    from tests.test_optim import run_through_two_growths

    routes = []
    run_through_two_growths(torch.float32, "native", monkeypatch, routes=routes)
    assert set(routes[0]) == {"native"} and routes[0]["native"] > 0


# ---- the code compiled for an H100/H200 (offline: Triton's compiler and ptxas, no GPU) -------------------


def compile_for_sm90(dtype, aligned: bool, fusion: bool = T.FP_FUSION) -> str:
    import importlib.util

    import triton
    import triton.language as tl
    from triton.backends.compiler import GPUTarget

    spec = importlib.util.spec_from_file_location("triton_kernel_sm90", T.__file__.replace("triton_adamw", "triton_kernel"))
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    scalar = "fp64" if dtype == torch.float64 else "fp32"
    sig = {"meta": "*i64", "chunks": "*i64", "table": f"*{scalar}", "consts": f"*{scalar}", "DTYPE": "constexpr",
           "LOW": "constexpr", "BLOCK": "constexpr", "ALIGNED": "constexpr"}
    tl_dtype = {torch.float32: tl.float32, torch.float64: tl.float64, torch.bfloat16: tl.bfloat16}[dtype]
    src = triton.compiler.ASTSource(fn=module.adamw_multi, signature=sig, constexprs={
        "DTYPE": tl_dtype, "LOW": True, "BLOCK": T.BLOCK, "ALIGNED": aligned})
    return triton.compile(src, target=GPUTarget("cuda", 90, 32), options={"enable_fp_fusion": fusion}).asm["ptx"]


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16, torch.float64], ids=["fp32", "bf16", "fp64"])
def test_compiled_for_sm90_the_full_blocks_load_and_store_128_bits_and_nothing_is_fused(dtype):
    """PTX for sm_90: with aligned addresses the parameters, moments and gradients move in 128-bit loads and stores
    (ld/st.global.v4.b32, v2.b64 for float64); unaligned, only scalar ones; never an fma (`FP_FUSION`: the
    same program with fusion on has them)."""
    needs_triton()
    wide = r"\.v2\.b64" if dtype == torch.float64 else r"\.v4\.b32"
    aligned, unaligned = compile_for_sm90(dtype, True), compile_for_sm90(dtype, False)
    assert re.search(r"ld\.global" + wide, aligned) and re.search(r"st\.global" + wide, aligned)
    assert not re.search(r"(ld|st)\.global\.v\d", unaligned)
    assert not re.search(r"\bfma\.", aligned) and not re.search(r"\bfma\.", unaligned)
    assert re.search(r"\bfma\.", compile_for_sm90(dtype, True, fusion=True))


# ---- on a GPU -------------------------------------------------------------------------------------------


@pytest.mark.gpu
@needs_cuda
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16], ids=["fp32", "bf16"])
def test_on_a_gpu_one_stage_is_torch_s_fused_adamw(dtype):
    """Every element of stage 0 (one row of scalars, as `_derived` gives them): torch's fused AdamW on the same
    tensors, within 8 float32 ulp of the terms' magnitude (its order of operations differs), within 1 ulp in
    bfloat16 (both compute in float32 and round once)."""
    needs_triton()
    lr, wd, n = 3e-3, 0.1, 11
    ps, gs, ms, vs, births, _ = case(dtype, 1, "cuda")
    births = [torch.zeros_like(b) for b in births]
    decay = [1 - lr * wd if k % 2 else 1.0 for k in range(len(ps))]
    table = torch.tensor([[(-lr / (1 - BETAS[0] ** n), (1 - BETAS[1] ** n) ** 0.5, d)] for d in decay],
                         dtype=torch.float32, device="cuda")
    fused = [[t.clone() for t in ts] for ts in (ps, gs, ms, vs)]
    terms = [t for _, t in reference(ps, gs, ms, vs, births, table)]  # the scale of a rounding where p and the step cancel
    T.adamw_multi_tensor(ps, gs, ms, vs, births, table, (*BETAS, EPS))
    step = torch.full((), float(n), device="cuda")
    for k in range(len(ps)):  # one call per tensor: the decay differs
        torch._fused_adamw_([fused[0][k]], [fused[1][k]], [fused[2][k]], [fused[3][k]], [], [step], lr=lr,
                            beta1=BETAS[0], beta2=BETAS[1], weight_decay=wd if k % 2 else 0.0, eps=EPS,
                            amsgrad=False, maximize=False, grad_scale=None, found_inf=None)
    limit = 1.0 if dtype == torch.bfloat16 else 8.0
    for k in range(len(ps)):
        for got, want, t in zip((ps[k], ms[k], vs[k]), (fused[0][k], fused[2][k], fused[3][k]), terms[k]):
            assert ulps(got, want, dtype, t) <= limit, SIZES[k]


@pytest.mark.gpu
@needs_cuda
@pytest.mark.parametrize("stages", [2, 4])
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16], ids=["fp32", "bf16"])
def test_on_a_gpu_each_element_is_the_reference_s_update_and_float32_the_c_pass_s_bits(dtype, stages):
    """Several birth stages, odd sizes: within 4 ulp of the float64 reference (bfloat16: 1 ulp); float32 equal to
    the C pass on the CPU bit for bit (no FMA, IEEE division and square root on both)."""
    from grow.optim.native import native_adamw

    needs_triton()
    gpu, cpu = case(dtype, stages, "cuda"), case(dtype, stages)
    want = reference(*gpu)
    T.adamw_multi_tensor(*gpu, (*BETAS, EPS))
    limit = 1.0 if dtype == torch.bfloat16 else 4.0
    for k, (values, terms) in enumerate(want):
        for got, w, t in zip((gpu[0][k], gpu[2][k], gpu[3][k]), values, terms):
            assert ulps(got, w, dtype, t) <= limit, SIZES[k]
    kernel, _ = native_adamw()
    if dtype == torch.float32 and kernel is not None:
        kernel(*cpu, (*BETAS, EPS))
        for x, y in zip(gpu[:4], cpu[:4]):
            assert all(torch.equal(s.cpu(), t) for s, t in zip(x, y))


@pytest.mark.gpu
@needs_cuda
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16], ids=["fp32", "bf16"])
def test_on_a_gpu_the_optimizer_s_grown_tensors_take_the_triton_kernel_and_never_fall_back(dtype, monkeypatch):
    """`GrowthAwareAdamW(compile=True)` on CUDA through two growths: every mixed tensor of every step by the Triton
    launch (`routes`), none by torch.compile's per-tensor pass or the eager ops."""
    from tests.test_optim import run_through_two_growths

    needs_triton()
    routes = []
    run_through_two_growths(dtype, "native", monkeypatch, device="cuda", routes=routes)
    assert set(routes[0]) == {"triton"} and routes[0]["triton"] > 0, routes[0]

