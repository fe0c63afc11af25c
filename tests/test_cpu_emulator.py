"""The CPU emulator of CUDA (``minipar.kernels.emulator``) itself: its PTX against an
independent model, and the mistakes it must catch.

The PTX instructions are checked through small probe kernels that call the same helpers
the flash kernels use (``flash_mma.cuh``) against ``tests/ptx_oracle.py``, written from the
PTX ISA and CUTLASS's layouts by someone who had not read the kernels.  Then the flash
kernels are broken on purpose, one way each, and the emulator must say so: a check that
cannot fail proves nothing.  Skipped where no C++ compiler is installed.
"""
from concurrent.futures import ThreadPoolExecutor

import numpy as np
import pytest

from minipar.kernels import emulator, flash_cuda
from minipar.kernels.emulator import EmulatedKernel, EmulatedKernels, EmulatorError, build
from tests import ptx_oracle as oracle
from tests.flash_runs import reference, run
from tests.tolerance import assert_sums_close

pytestmark = pytest.mark.skipif(emulator.compiler() is None, reason="no C++ compiler")

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
// A 16 x ROW tile of halves into swizzled shared memory, read back by the kernels' fragment
// loaders at three different places: A at columns 16..31, Bᵀ at rows 8..15 and columns
// 32..47, the ldmatrix pair at columns 48..63 (so the XOR of every chunk is exercised).
extern "C" __global__ void probe_fragments(const half_bits* tile, unsigned* a, unsigned* b_t, unsigned* b_pair) {
    extern __shared__ uint4 smem[];
    half_bits* s = (half_bits*)smem;
    for (int i = threadIdx.x; i < 16 * ROW; i += blockDim.x) s[swizzle(i / ROW, i % ROW, ROW)] = tile[i];
    __syncthreads();
    const int lane = threadIdx.x, g = lane / 4, t = lane % 4;
    unsigned fa[4], fb[2], fp[4];
    load_a(fa, s, ROW, 0, 16, g, t);
    load_b_transposed(fb, s, ROW, 8, 32, g, t);
    load_b_pair(fp, s, ROW, 0, 48, lane);
    for (int i = 0; i < 4; ++i) { a[4 * lane + i] = fa[i]; b_pair[4 * lane + i] = fp[i]; }
    for (int i = 0; i < 2; ++i) b_t[2 * lane + i] = fb[i];
}
// Rows [row0, row0 + 16) of a (n_rows, 64) matrix by cp.async into a swizzled tile, then out
// to `tile` unswizzled.  `early` gets the first 16 bytes of this thread's first destination
// as they are before the wait: undefined on a GPU, the fill byte on the emulator.
extern "C" __global__ void probe_cp_async(const half_bits* src, half_bits* tile, uint4* early, int row0, int n_rows) {
    extern __shared__ uint4 smem[];
    half_bits* s = (half_bits*)smem;
    load_tile_async(s, src, row0, 16, n_rows);
    const int r = threadIdx.x / (HEAD_DIM / 8), c = threadIdx.x % (HEAD_DIM / 8) * 8;
    early[threadIdx.x] = *(const uint4*)(s + swizzle(r, c, ROW));
    cp_async_wait_all();
    __syncthreads();
    for (int i = threadIdx.x; i < 16 * ROW; i += blockDim.x) tile[i] = s[swizzle(i / ROW, i % ROW, ROW)];
}
extern "C" __global__ void probe_convert(const float* x, unsigned* packed, half_bits* single, float* sums, float* maxes) {
    const int lane = threadIdx.x;
    packed[lane] = pack_half2(x[2 * lane], x[2 * lane + 1]);
    single[lane] = float_to_half(x[lane]);
    sums[lane] = quad_sum(x[lane]);
    maxes[lane] = quad_max(x[lane]);
}
'''
ROW = 64  # flash_mma.cuh's ROW at HEAD_DIM 64


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
        abs_sum = oracle.mma_m16n8k16_f32_f16(oracle.pack_a(np.abs(A).astype(np.float16)),
                                              oracle.pack_b(np.abs(B).astype(np.float16)),
                                              oracle.pack_c(np.abs(C).astype(np.float32)))
        assert_sums_close(d, oracle.mma_m16n8k16_f32_f16(a, b, c), dtype=np.float32, terms=17,
                          abs_sum=abs_sum)
        if A.dtype.kind == "i":  # small integers: every sum is exact, in any order
            np.testing.assert_array_equal(oracle.unpack_c(d), (A @ B + C).astype(np.float32))


def test_fragment_loaders_give_the_documented_fragments(probes):
    tile = np.random.default_rng(1).standard_normal((16, ROW)).astype(np.float16)
    a, b_t, b_pair = np.zeros((32, 4), np.uint32), np.zeros((32, 2), np.uint32), np.zeros((32, 4), np.uint32)
    probes("probe_fragments")((1,), (32,), (tile, a, b_t, b_pair), shared_mem=tile.nbytes)
    np.testing.assert_array_equal(a, oracle.pack_a(tile[:16, 16:32]))              # A = tile[0:16, 16:32]
    np.testing.assert_array_equal(b_t, oracle.pack_b(tile[8:16, 32:48].T))         # B = tile[8:16, 32:48]ᵀ
    np.testing.assert_array_equal(b_pair[:, :2], oracle.pack_b(tile[:16, 48:56]))  # ldmatrix.trans pair
    np.testing.assert_array_equal(b_pair[:, 2:], oracle.pack_b(tile[:16, 56:64]))


def test_swizzle_is_a_permutation_of_whole_chunks_within_each_row():
    """flash_mma.cuh's swizzle, rewritten here: chunk c of row r at chunk c ^ (r & mask)."""
    for row_len in (32, 64, 96, 128):
        mask = 7 if (row_len // 8) % 8 == 0 else 3
        rows = np.arange(16)[:, None]
        chunks = np.arange(row_len // 8)[None, :]
        placed = chunks ^ (rows & mask)
        assert (np.sort(placed, axis=1) == chunks).all(), row_len   # each row: a permutation
        if row_len in (64, 128):    # 8 consecutive rows, one chunk column: 8 distinct 128-byte offsets
            offsets = (rows[:8] * row_len * 2 + placed[:8] * 16) % 128
            assert all(len(set(offsets[:, c])) == 8 for c in range(row_len // 8))


def test_cp_async_copies_at_the_wait_and_zero_fills(probes):
    src = np.random.default_rng(4).standard_normal((20, ROW)).astype(np.float16)
    for row0, n_rows in ((0, 20), (8, 20)):       # the second: rows 12..15 lie past the matrix
        tile, early = np.zeros((16, ROW), np.float16), np.zeros((128, 4), np.uint32)
        probes("probe_cp_async")((1,), (128,), (src, tile, early, np.int32(row0), np.int32(n_rows)),
                                 shared_mem=tile.nbytes)
        want = np.zeros_like(tile)
        want[:n_rows - row0] = src[row0:row0 + 16]
        np.testing.assert_array_equal(tile, want)
        assert (early == 0xFFFFFFFF).all()        # nothing had landed before the wait


def test_conversions_and_quad_reductions(probes):
    x = (np.random.default_rng(2).standard_normal(64) * 100).astype(np.float32)
    # the top of fp16, a subnormal, -0, overflow; ties: to even (down, up), a subnormal tie
    x[:7] = [65519.0, 1e-7, -0.0, 70000.0, 1 + 2.0 ** -11, 1 + 3 * 2.0 ** -11, 1.5 * 2.0 ** -24]
    packed, single = np.zeros(32, np.uint32), np.zeros(32, np.uint16)
    sums, maxes = np.zeros(32, np.float32), np.zeros(32, np.float32)
    probes("probe_convert")((1,), (32,), (x, packed, single, sums, maxes))
    np.testing.assert_array_equal(packed, oracle.cvt_rn_f16x2_f32(x[1::2], x[0::2]))  # lo = x[2l]
    with np.errstate(over="ignore"):
        np.testing.assert_array_equal(single, x[:32].astype(np.float16).view(np.uint16))
    quads = x[:32].reshape(8, 4)
    assert_sums_close(sums, np.repeat(quads.sum(1), 4), dtype=np.float32, terms=4,
                      abs_sum=np.repeat(np.abs(quads).sum(1), 4))
    np.testing.assert_array_equal(maxes, np.repeat(quads.max(1), 4))


# ---- what the emulator refuses, as the GPU or CuPy would ------------------------------------

def test_launch_limits_and_argument_types(probes):
    x = np.zeros(64, np.float32)
    outs = (np.zeros(32, np.uint32), np.zeros(32, np.uint16), np.zeros(32, np.float32), np.zeros(32, np.float32))
    with pytest.raises(TypeError, match="numpy.int32 or numpy.float32"):
        probes("probe_mma")((1,), (32,), (x, x, x, 1))  # a Python int: CuPy passes 64 bits
    with pytest.raises(EmulatorError, match="4 arguments for 5 parameters"):
        probes("probe_convert")((1,), (32,), (x,) + outs[:3])
    with pytest.raises(EmulatorError, match="must opt in"):
        probes("probe_convert")((1,), (32,), (x,) + outs, shared_mem=48 * 1024 + 16)
    with pytest.raises(EmulatorError, match=r"grid \(1,70000,1\)"):
        probes("probe_convert")((1, 70000), (32,), (x,) + outs)
    with pytest.raises(EmulatorError, match="2048 threads per block"):
        probes("probe_convert")((1,), (2048,), (x,) + outs)


def test_launch_bounds_are_enforced():
    q = np.zeros((1, 1, 64, 64), np.float16)
    kernel = EmulatedKernels().get("flash_forward_f16", 64)
    args = (q, q, q, q.copy(), np.zeros((1, 1, 64), np.float32), np.int32(64), np.int32(64), np.int32(1),
            np.float32(0.125), np.int32(1))
    with pytest.raises(EmulatorError, match=r"256 threads exceed __launch_bounds__\(128\)"):
        kernel((1, 1), (256,), args, shared_mem=flash_cuda.shared_memory_bytes("flash_forward_f16", 64))


# ---- broken on purpose: the emulator must notice ------------------------------------------

def broken(*edits):
    """The f16 source with each (old, new) edit made; each old text must occur once."""
    source = flash_cuda.kernel_source("f16")
    for old, new in zip(edits[::2], edits[1::2]):
        assert source.count(old) == 1, old
        source = source.replace(old, new)
    return {"f16": source}


MISSING_BARRIER = broken("        __syncthreads();  // ds_tile complete\n", "")
MISSING_ATOMIC = broken("atomicAdd(dq + (tile.head_row + query) * HEAD_DIM + col, dq_part[nd][e] * scale);",
                        "dq[(tile.head_row + query) * HEAD_DIM + col] += dq_part[nd][e] * scale;")
LOOP = "    for (int k0 = 0, stage = 0; k0 < key_end; k0 += TC_FWD_BLOCK_K, stage ^= 1) {\n"
DIVERGENT_LANE = broken(LOOP, "    if (lane == 5) return;\n" + LOOP)
MISALIGNED_ROWS = broken("#define ROW HEAD_DIM ", "#define ROW (HEAD_DIM + 1) ")
# cp.async: tile k0 read without waiting for its copies; the next tile's copies issued
# before the barrier that ends every warp's reads of the stage they overwrite.
MISSING_WAIT = broken("        cp_async_wait_all();  // this thread's copies of tile k0 have landed...\n", "")
EARLY_PREFETCH = broken(
    "        __syncthreads();      // ...and everyone's; nobody still reads the other stage (last tile, or Q)\n", "",
    "        const half_bits* k_tile = stages + 2 * stage * KV_TILE;\n",
    "        __syncthreads();\n        const half_bits* k_tile = stages + 2 * stage * KV_TILE;\n")
SWAPPED_HALVES = broken('"f"(hi), "f"(lo)', '"f"(lo), "f"(hi)')

# the builds each test needs; by default the missing barrier's two (the race reported, the
# wrong result), the other broken kernels (a g++ build each) in the slow run
NEEDS = {"test_unordered_accesses_are_reported_races[missing __syncthreads]": [(MISSING_BARRIER, "race")],
         "test_unordered_accesses_are_reported_races[+= instead of atomicAdd]": [(MISSING_ATOMIC, "race")],
         "test_unordered_accesses_are_reported_races[cp.async before the barrier]": [(EARLY_PREFETCH, "race")],
         "test_missing_syncthreads_gives_wrong_results_when_a_warp_runs_ahead": [(MISSING_BARRIER, "memory")],
         "test_lane_that_skips_a_barrier_is_reported": [(DIVERGENT_LANE, "memory")],
         "test_misaligned_vector_access_is_reported": [(MISALIGNED_ROWS, "memory")],
         "test_wrong_operand_order_gives_wrong_results": [(SWAPPED_HALVES, "memory")],
         "test_reading_a_tile_before_its_cp_async_wait_gives_wrong_results": [(MISSING_WAIT, "memory")]}


@pytest.fixture(scope="module")
def broken_builds(request):
    """Build at once (one g++ per core) the broken kernels the selected tests use."""
    names = {item.name for item in request.session.items if item.module is request.module}
    jobs = [b for name, builds in NEEDS.items() if name in names for b in builds]
    with ThreadPoolExecutor() as pool:
        list(pool.map(lambda b: build(b[0]["f16"], 64, "flash_f16", b[1]), jobs))


def inputs(n_queries, n_keys, seed=0):
    rng = np.random.default_rng(seed)
    return [rng.standard_normal((1, 1, n, 64)).astype(np.float16) for n in (n_queries, n_keys, n_keys, n_queries)]


@pytest.mark.parametrize("sources,where", [
    (MISSING_BARRIER, r"flash_mma\.cuh.*flash_attention_f16\.cu"),  # the read (load_a), the write of dS
    pytest.param(MISSING_ATOMIC, r"flash_attention_f16\.cu", marks=pytest.mark.slow),  # two blocks' += on one dq
    pytest.param(EARLY_PREFETCH, r"flash_mma\.cuh.*flash_attention_f16\.cu", marks=pytest.mark.slow),  # cp.async, a read
], ids=["missing __syncthreads", "+= instead of atomicAdd", "cp.async before the barrier"])
def test_unordered_accesses_are_reported_races(broken_builds, sources, where):
    q, k, v, grad_out = inputs(150, 150)
    with pytest.raises(EmulatorError, match=r"(?s)data race.*" + where):
        run(q, k, v, grad_out, True, EmulatedKernels(check="race", sources=sources))


def test_missing_syncthreads_gives_wrong_results_when_a_warp_runs_ahead(broken_builds):
    q, k, v, grad_out = inputs(150, 150)
    dq = run(q, k, v, grad_out, True, EmulatedKernels(schedule="greedy", sources=MISSING_BARRIER))[2]
    want = reference(q, k, v, grad_out, True)[2]
    assert not np.abs(dq - want).max() <= 4e-3 * np.abs(want).max()  # NaN (unwritten dS) or wrong


@pytest.mark.slow
def test_lane_that_skips_a_barrier_is_reported(broken_builds):
    q, k, v, _ = inputs(70, 70)
    with pytest.raises(EmulatorError, match=r"(?s)deadlock in block \(0,0,0\).*finished: threads 5, 37, 69, 101"):
        flash_cuda.forward(q, k, v, True, kernels=EmulatedKernels(sources=DIVERGENT_LANE))


@pytest.mark.slow
def test_misaligned_vector_access_is_reported(broken_builds):
    q, k, v, _ = inputs(70, 70)
    with pytest.raises(EmulatorError, match="misaligned address"):
        flash_cuda.forward(q, k, v, True, kernels=EmulatedKernels(sources=MISALIGNED_ROWS))


@pytest.mark.slow
def test_wrong_operand_order_gives_wrong_results(broken_builds):
    q, k, v, grad_out = inputs(70, 70)
    out, _ = flash_cuda.forward(q, k, v, True, kernels=EmulatedKernels(sources=SWAPPED_HALVES))
    want = reference(q, k, v, grad_out, True)[0]
    assert np.abs(out - want).max() > 0.1


@pytest.mark.slow
def test_reading_a_tile_before_its_cp_async_wait_gives_wrong_results(broken_builds):
    q, k, v, _ = inputs(70, 150)
    out, _ = flash_cuda.forward(q, k, v, False, kernels=EmulatedKernels(sources=MISSING_WAIT))
    want = reference(q, k, v, q, False)[0]
    assert not np.abs(out - want).max() <= 0.1          # NaN (the fill) or wrong
