"""The CUDA kernels, run on the CPU by ``minipar.kernels.cpu_emulator``, against the reference.

No GPU is needed: the .cu source itself runs, one fiber per CUDA thread, with the
warp-wide PTX instructions modelled from the PTX ISA and checked here against an
independent model of them (``tests/ptx_oracle.py``, written from the documentation and
CUTLASS's layouts by someone who had not read the kernels).  Tolerances are the GPU
test's (tests/test_flash_gpu.py): fp32 1e-5 of the largest value; fp16 forward 2e-3
absolute, gradients 4e-3 of the largest gradient.  The last tests break a kernel on
purpose and check the emulator notices: a check that cannot fail proves nothing.
Skipped where no C++ compiler is installed.
"""
from concurrent.futures import ThreadPoolExecutor

import numpy as np
import pytest

from minipar.kernels import cpu_emulator, flash_cuda
from minipar.kernels.cpu_emulator import EmulatedKernel, EmulatedKernels, EmulatorError, build
from minipar.kernels.flash_reference import flash_backward_reference, flash_forward_reference
from tests import ptx_oracle as oracle

pytestmark = pytest.mark.skipif(cpu_emulator.compiler() is None, reason="no C++ compiler")

PROBES = r'''
#include "flash_mma.cuh"
// One warp.  mma: registers in, registers out (a: 32x4, b: 32x2, c and d: 32x4).
extern "C" __global__ void probe_mma(const unsigned* a, const unsigned* b, const float* c, float* d) {
    const int lane = threadIdx.x;
    unsigned af[4], bf[2];
    float acc[4];
    for (int i = 0; i < 4; ++i) { af[i] = a[4 * lane + i]; acc[i] = c[4 * lane + i]; }
    for (int i = 0; i < 2; ++i) bf[i] = b[2 * lane + i];
    mma_16x8x16(acc, af, bf);
    for (int i = 0; i < 4; ++i) d[4 * lane + i] = acc[i];
}
// A 16 x ROW tile of halves through shared memory, read back by the kernels' fragment loaders.
extern "C" __global__ void probe_fragments(const half_bits* tile, unsigned* a, unsigned* b_t, unsigned* b_pair) {
    extern __shared__ uint4 smem[];
    half_bits* s = (half_bits*)smem;
    for (int i = threadIdx.x; i < 16 * ROW; i += blockDim.x) s[i] = tile[i];
    __syncthreads();
    const int lane = threadIdx.x, g = lane / 4, t = lane % 4;
    unsigned fa[4], fb[2], fp[4];
    load_a(fa, s, ROW, g, t);
    load_b_transposed(fb, s, ROW, g, t);
    load_b_pair(fp, s, lane);
    for (int i = 0; i < 4; ++i) { a[4 * lane + i] = fa[i]; b_pair[4 * lane + i] = fp[i]; }
    for (int i = 0; i < 2; ++i) b_t[2 * lane + i] = fb[i];
}
extern "C" __global__ void probe_convert(const float* x, unsigned* packed, half_bits* single, float* sums, float* maxes) {
    const int lane = threadIdx.x;
    packed[lane] = pack_half2(x[2 * lane], x[2 * lane + 1]);
    single[lane] = float_to_half(x[lane]);
    sums[lane] = quad_sum(x[lane]);
    maxes[lane] = quad_max(x[lane]);
}
'''
ROW = 64 + 8  # flash_mma.cuh's ROW at HEAD_DIM 64


@pytest.fixture(scope="module")
def probes():
    exe = build(flash_cuda.paste_includes(PROBES), 64, "probes")
    return lambda name: EmulatedKernel(exe, name)


def test_mma_is_the_documented_matrix_product(probes):
    rng = np.random.default_rng(0)
    for A, B, C in [(rng.integers(-8, 9, (16, 16)), rng.integers(-8, 9, (16, 8)), rng.integers(-99, 99, (16, 8))),
                    (rng.standard_normal((16, 16)), rng.standard_normal((16, 8)), rng.standard_normal((16, 8)))]:
        a, b = oracle.pack_a(A.astype(np.float16)), oracle.pack_b(B.astype(np.float16))
        c = oracle.pack_c(C.astype(np.float32))
        d = np.zeros((32, 4), np.float32)
        probes("probe_mma")((1,), (32,), (a, b, c, d))
        want = oracle.mma_m16n8k16_f32_f16(a, b, c)
        np.testing.assert_allclose(d, want, rtol=1e-6, atol=1e-6)
        exact = A.dtype.kind == "i"  # small integers: every sum is exact, in any order
        assert not exact or np.array_equal(oracle.unpack_c(d), (A @ B + C).astype(np.float32))


def test_fragment_loaders_give_the_documented_fragments(probes):
    tile = np.random.default_rng(1).standard_normal((16, ROW)).astype(np.float16)
    a, b_t, b_pair = np.zeros((32, 4), np.uint32), np.zeros((32, 2), np.uint32), np.zeros((32, 4), np.uint32)
    probes("probe_fragments")((1,), (32,), (tile, a, b_t, b_pair), shared_mem=tile.nbytes)
    np.testing.assert_array_equal(a, oracle.pack_a(tile[:16, :16]))            # A = tile[0:16, 0:16]
    np.testing.assert_array_equal(b_t, oracle.pack_b(tile[:8, :16].T))         # B = tile[0:8, 0:16]ᵀ
    np.testing.assert_array_equal(b_pair[:, :2], oracle.pack_b(tile[:16, :8]))  # ldmatrix.trans pair
    np.testing.assert_array_equal(b_pair[:, 2:], oracle.pack_b(tile[:16, 8:16]))


def test_conversions_and_quad_reductions(probes):
    x = (np.random.default_rng(2).standard_normal(64) * 100).astype(np.float32)
    x[:4] = [65519.0, 1e-7, -0.0, 70000.0]  # rounding at the top, a subnormal, -0, overflow
    packed, single = np.zeros(32, np.uint32), np.zeros(32, np.uint16)
    sums, maxes = np.zeros(32, np.float32), np.zeros(32, np.float32)
    probes("probe_convert")((1,), (32,), (x, packed, single, sums, maxes))
    np.testing.assert_array_equal(packed, oracle.cvt_rn_f16x2_f32(x[1::2], x[0::2]))  # lo = x[2l]
    with np.errstate(over="ignore"):
        np.testing.assert_array_equal(single, x[:32].astype(np.float16).view(np.uint16))
    quads = x[:32].reshape(8, 4)
    np.testing.assert_allclose(sums, np.repeat(quads.sum(1), 4), rtol=1e-6)
    np.testing.assert_array_equal(maxes, np.repeat(quads.max(1), 4))
    np.testing.assert_array_equal(oracle.shfl_xor(x[:32], 1), x[:32].reshape(16, 2)[:, ::-1].ravel())


# ---- the flash-attention kernels -------------------------------------------------------

CASES = [  # (dtype, B, H, Nq, Nk, d)
    ("float32", 2, 1, 77, 77, 64),    # odd N: partial tiles
    ("float32", 1, 1, 1, 1, 64),
    ("float32", 1, 2, 100, 37, 40),   # causal rows 0..62 see nothing; d not a power of two
    ("float32", 1, 1, 37, 150, 40),   # fewer queries than keys
    ("float32", 1, 2, 128, 128, 64),  # whole tiles, several blocks per head
    ("float16", 1, 2, 77, 77, 64),
    ("float16", 1, 1, 1, 1, 64),
    ("float16", 1, 2, 100, 37, 64),
    ("float16", 1, 1, 37, 150, 64),
    ("float16", 1, 1, 130, 130, 32),
    ("float16", 1, 1, 70, 70, 96),
    ("float16", 1, 1, 70, 70, 128),
    ("float16", 2, 1, 256, 256, 128),  # whole tiles, several blocks per head
]


@pytest.fixture(scope="module", autouse=True)
def built_kernels():
    """Compile every program the module needs at once (one g++ per core)."""
    jobs = {(("f16" if dtype == "float16" else "f32"), d) for dtype, *_, d in CASES}
    with ThreadPoolExecutor() as pool:
        list(pool.map(lambda job: build(flash_cuda.kernel_source(job[0]), job[1], f"flash_{job[0]}"), jobs))


def inputs(dtype, batch, heads, n_queries, n_keys, head_dim, seed=0):
    rng = np.random.default_rng(seed)
    shapes = [(batch, heads, n_queries, head_dim), (batch, heads, n_keys, head_dim),
              (batch, heads, n_keys, head_dim), (batch, heads, n_queries, head_dim)]
    return [rng.standard_normal(s).astype(dtype) for s in shapes]


def reference(q, k, v, grad_out, causal):
    q, k, v, grad_out = (a.astype(np.float64) for a in (q, k, v, grad_out))
    out, lse = flash_forward_reference(q, k, v, causal)
    return (out, lse) + flash_backward_reference(q, k, v, out, lse, grad_out, causal)


def run(q, k, v, grad_out, causal, kernels):
    out, lse = flash_cuda.forward(q, k, v, causal, kernels=kernels)
    return (out, lse) + flash_cuda.backward(q, k, v, out, lse, grad_out, causal, kernels=kernels)


def errors(got, want):
    """Forward max abs error and the gradients' max errors relative to their largest value."""
    out, lse, *grads = got
    want_out, want_lse, *want_grads = want
    assert all(np.isfinite(a).all() for a in [out, *grads])
    assert np.array_equal(np.isneginf(lse), np.isneginf(want_lse))
    seen = np.isfinite(want_lse)
    np.testing.assert_allclose(lse[seen], want_lse[seen], atol=1e-4)
    scale = max(1.0, np.abs(want_out).max())
    return (np.abs(out - want_out).max() / scale,
            [np.abs(g - w).max() / max(1.0, np.abs(w).max()) for g, w in zip(grads, want_grads)])


@pytest.mark.parametrize("causal", [False, True])
@pytest.mark.parametrize("case", CASES, ids=lambda c: "%s-B%d-H%d-Nq%d-Nk%d-d%d" % c)
def test_kernels_match_reference(case, causal):
    dtype, *shape = case
    q, k, v, grad_out = inputs(dtype, *shape)
    got = run(q, k, v, grad_out, causal, EmulatedKernels())
    assert got[0].dtype == q.dtype and got[1].dtype == np.float32
    assert all(g.dtype == q.dtype for g in got[2:])
    forward_error, grad_errors = errors(got, reference(q, k, v, grad_out, causal))
    assert forward_error <= (1e-5 if dtype == "float32" else 2e-3), forward_error
    assert max(grad_errors) <= (1e-5 if dtype == "float32" else 4e-3), grad_errors


@pytest.mark.parametrize("dtype", ["float32", "float16"])
def test_results_do_not_depend_on_the_schedule(dtype):
    """Lockstep, greedy (the last warp runs ahead) and random schedules: bit-identical."""
    q, k, v, grad_out = inputs(dtype, 1, 1, 150, 150, 64, seed=3)
    first = run(q, k, v, grad_out, True, EmulatedKernels(order=0))
    for order in (1, 2):
        for a, b in zip(first, run(q, k, v, grad_out, True, EmulatedKernels(order=order))):
            np.testing.assert_array_equal(a, b)


# ---- broken on purpose: the emulator must notice ------------------------------------------

def broken(old, new):
    source = flash_cuda.kernel_source("f16")
    assert source.count(old) == 1, old
    return {"f16": source.replace(old, new)}


MISSING_BARRIER = broken("        __syncthreads();  // ds_tile complete\n", "")
DIVERGENT_LANE = broken("    for (int k0 = 0; k0 < key_end; k0 += TC_BLOCK_K) {\n",
                        "    if (lane == 5) return;\n    for (int k0 = 0; k0 < key_end; k0 += TC_BLOCK_K) {\n")
MISALIGNED_ROWS = broken("#define ROW (HEAD_DIM + 8)", "#define ROW (HEAD_DIM + 9)")
SWAPPED_HALVES = broken('"f"(hi), "f"(lo)', '"f"(lo), "f"(hi)')


@pytest.fixture(scope="module")
def broken_builds():
    with ThreadPoolExecutor() as pool:
        list(pool.map(lambda s: build(s["f16"], 64, "flash_f16"),
                      [MISSING_BARRIER, DIVERGENT_LANE, MISALIGNED_ROWS, SWAPPED_HALVES]))


def test_missing_syncthreads_is_caught_by_the_greedy_schedule(broken_builds):
    q, k, v, grad_out = inputs("float16", 1, 1, 150, 150, 64)
    want = reference(q, k, v, grad_out, True)
    _, grad_errors = errors(run(q, k, v, grad_out, True, EmulatedKernels(0, MISSING_BARRIER)), want)
    assert max(grad_errors) <= 4e-3  # lockstep hides the race...
    with pytest.raises(AssertionError):  # ...a warp running ahead reads the unwritten (NaN) dS tile
        errors(run(q, k, v, grad_out, True, EmulatedKernels(1, MISSING_BARRIER)), want)


def test_lane_that_skips_a_barrier_is_reported(broken_builds):
    q, k, v, _ = inputs("float16", 1, 1, 70, 70, 64)
    with pytest.raises(EmulatorError, match=r"(?s)deadlock in block \(0,0,0\).*finished: threads 5, 37, 69, 101"):
        flash_cuda.forward(q, k, v, True, kernels=EmulatedKernels(0, DIVERGENT_LANE))


def test_misaligned_vector_access_is_reported(broken_builds):
    q, k, v, _ = inputs("float16", 1, 1, 70, 70, 64)
    with pytest.raises(EmulatorError, match="misaligned address"):
        flash_cuda.forward(q, k, v, True, kernels=EmulatedKernels(0, MISALIGNED_ROWS))


def test_wrong_operand_order_gives_wrong_results(broken_builds):
    q, k, v, grad_out = inputs("float16", 1, 1, 70, 70, 64)
    forward_error, _ = errors(run(q, k, v, grad_out, True, EmulatedKernels(0, SWAPPED_HALVES)),
                              reference(q, k, v, grad_out, True))
    assert forward_error > 0.1


def test_gpt_with_flash_attention_runs_the_emulated_kernels(monkeypatch):
    """The whole path a GPU run takes — GPT, the autograd Function, flash_cuda's launches —
    with the kernels emulated: loss and every gradient equal the array reference's."""
    from minipar.kernels import flash_attention as module
    from minipar.nn.gpt import GPT, GPTConfig
    config = GPTConfig(vocab_size=32, seq_len=40, n_layer=2, d_model=48, n_head=2, attention="flash")
    ids = np.random.default_rng(0).integers(0, 32, (2, 41))
    calls = []
    real_forward = flash_cuda.forward
    monkeypatch.setattr(flash_cuda, "forward", lambda *a, **kw: calls.append(kw["kernels"]) or real_forward(*a, **kw))
    results = {}
    for implementation in ("reference", "emulated"):
        monkeypatch.setattr(module, "ATTENTION_IMPLEMENTATION", implementation)
        model = GPT(config, seed=0)
        _, loss = model(ids[:, :-1], ids[:, 1:])
        loss.backward()
        results[implementation] = (loss.data, {n: p.grad for n, p in model.named_parameters()})
    assert len(calls) == 2 and all(isinstance(k, EmulatedKernels) for k in calls)  # one per layer
    (ref_loss, ref_grads), (emu_loss, emu_grads) = results["reference"], results["emulated"]
    np.testing.assert_allclose(emu_loss, ref_loss, rtol=1e-5)
    for name, grad in ref_grads.items():
        np.testing.assert_allclose(emu_grads[name], grad, rtol=1e-4, atol=1e-5 * np.abs(grad).max(), err_msg=name)
