"""Issue 48's promises that are not kernel arithmetic (the bf16 kernels' results against the
float64 reference are in test_flash_emulated.py, with fp16's and fp32's):

- no silent fallback: a run's header says which code runs flash attention, and where no
  CUDA kernel takes the precision and head dim, that the array reference runs and why;
- the bf16 kernels are the entry points of one template with fp16's (flash_attention_f16.cu),
  and each takes only its own dtype where CuPy would check nothing (the fake CuPy does);
- the emulator's bf16 mma and conversions, and the ldmatrix loads (no .trans) of the K/V
  fragments, against the independent PTX model of tests/ptx_oracle.py.
"""
from types import SimpleNamespace

import ml_dtypes  # noqa: F401  (registers the "bfloat16" dtype with NumPy)
import numpy as np
import pytest

from minipar.config import TrainConfig
from minipar.kernels import emulator, flash_cuda
from minipar.kernels.emulator import source
from minipar.observe.monitor_text import header_lines
from tests import ptx_oracle as oracle
from tests.tolerance import assert_sums_close


def header(precision, backend_name, attention="flash", **model):
    config = TrainConfig(precision=precision, attention=attention, **model)
    h = dict(config=config.to_dict(), backend=backend_name, precision=precision, threads="1 per rank")
    monitor = SimpleNamespace(header=h, world_size=1, tokens_per_step=64, bytes_per_token=1.0,
                              peak_tflops=None, mfu_basis="fp32 GEMM")
    return [line for line in header_lines(monitor) if line.startswith("  attention:")]


@pytest.mark.parametrize("precision,backend_name,d_model,n_head,want", [
    ("bf16", "cupy", 128, 2, "flash, CUDA kernels flash_forward_bf16 / flash_backward_bf16 (d=64, tensor cores)"),
    ("fp32", "cupy", 80, 2, "flash, CUDA kernels flash_forward_f32 / flash_backward_f32 (d=40, "
                            "one thread per query row)"),
    ("bf16", "cupy", 80, 2, "flash, the tiled array reference on the GPU (many small launches, slow): "
                            "the bfloat16 kernel takes head dim 32, 64, 96, 128, not 40"),
    ("fp64", "cupy", 128, 2, "flash, the tiled array reference on the GPU (many small launches, slow): "
                             "no float64 kernel (fp32, fp16 and bf16 have one)"),
    ("bf16", "numpy", 128, 2, "flash, the tiled array reference (the CUDA kernels need the cupy backend, "
                              "not numpy)"),
])
def test_header_says_which_code_runs_flash_attention(precision, backend_name, d_model, n_head, want):
    assert header(precision, backend_name, d_model=d_model, n_head=n_head) == [f"  attention: {want}"]


def test_naive_attention_has_no_kernel_line():
    assert header("bf16", "cupy", attention="naive") == []


def test_bf16_kernels_take_bf16_arrays_only():
    """The entry points' pointer types name the dtype (bf16_bits, half_bits): the fake CuPy
    refuses a float16 array for a bf16 kernel, where a GPU would misread its bits."""
    kernels = {name: params for name, params, _ in source.kernels_of(flash_cuda.kernel_source("bf16"))}
    assert set(kernels) == {f"flash_{d}_{k}" for d in ("forward", "backward") for k in ("f16", "bf16")}
    for direction in ("forward", "backward"):
        bf16, f16 = kernels[f"flash_{direction}_bf16"], kernels[f"flash_{direction}_f16"]
        assert [name for _, name in bf16] == [name for _, name in f16]
        for (bf16_type, name), (f16_type, _) in zip(bf16, f16):
            assert bf16_type == f16_type.replace("half_bits", "bf16_bits"), name
    assert np.dtype("bfloat16").itemsize == 2 and flash_cuda.KINDS["bfloat16"] == "bf16"


# ---- the emulator's bf16 and ldmatrix instructions, against tests/ptx_oracle.py ---------------
# The kernels' own helpers (flash_mma.cuh) run in one-warp probes; bf16 values go through the
# oracle's fp16 packing as raw bits (it moves 16-bit patterns, whatever they encode).

PROBES = r'''
#include "flash_mma.cuh"
extern "C" __global__ void probe_mma_bf16(const unsigned* a, const unsigned* b, const float* c, float* d) {
    const int lane = threadIdx.x;
    unsigned af[4], bf[2];
    float acc[4];
    for (int i = 0; i < 4; ++i) { af[i] = a[4 * lane + i]; acc[i] = c[4 * lane + i]; }
    for (int i = 0; i < 2; ++i) bf[i] = b[2 * lane + i];
    Bf16::mma(acc, af, bf);
    for (int i = 0; i < 4; ++i) d[4 * lane + i] = acc[i];
}
extern "C" __global__ void probe_convert_bf16(const float* x, unsigned* packed, bf16_bits* single) {
    const int lane = threadIdx.x;
    packed[lane] = Bf16::pack2(x[2 * lane], x[2 * lane + 1]);
    single[lane] = Bf16::from_float(x[lane]);
}
// A 16 x ROW tile into swizzled shared memory, read back by the ldmatrix loaders: A at
// columns 16..31, the Bᵀ pair at rows 8..15 and columns 32..63, and the bare x4 at the
// addresses `rows` gives (element offsets into the unswizzled tile's copy after it).
extern "C" __global__ void probe_ldmatrix(const half_bits* tile, const int* rows, unsigned* a, unsigned* b_pair,
                                          unsigned* bare) {
    extern __shared__ uint4 smem[];
    half_bits* s = (half_bits*)smem;
    for (int i = threadIdx.x; i < 16 * ROW; i += blockDim.x) {
        s[swizzle(i / ROW, i % ROW, ROW)] = tile[i];
        s[16 * ROW + i] = tile[i];
    }
    __syncthreads();
    const int lane = threadIdx.x;
    unsigned fa[4], fb[4], fx[4];
    load_a_ldmatrix(fa, s, ROW, 0, 16, lane);
    load_b_transposed_pair(fb, s, ROW, 8, 32, lane);
    ldmatrix_x4(fx, s + 16 * ROW + rows[lane]);
    for (int i = 0; i < 4; ++i) { a[4 * lane + i] = fa[i]; b_pair[4 * lane + i] = fb[i]; bare[4 * lane + i] = fx[i]; }
}
'''
ROW = 64  # flash_mma.cuh's ROW at HEAD_DIM 64
BF16 = np.dtype("bfloat16")


@pytest.fixture(scope="module")
def probes():
    if emulator.compiler() is None:
        pytest.skip("no C++ compiler")
    program = emulator.build(flash_cuda.paste_includes(PROBES), ROW, "bf16_probes")
    return lambda name: emulator.EmulatedKernel(program, name)


def bits(values):
    """bf16 values as float16-typed bit patterns, for the oracle's 16-bit packing."""
    return np.asarray(values, BF16).view(np.float16)


def test_bf16_mma_is_the_matrix_product_in_fp32(probes):
    rng = np.random.default_rng(0)
    A, B, C = rng.standard_normal((16, 16)), rng.standard_normal((16, 8)), rng.standard_normal((16, 8))
    A, B, C = A.astype(BF16).astype(np.float64), B.astype(BF16).astype(np.float64), C.astype(np.float32)
    d = np.zeros((32, 4), np.float32)
    probes("probe_mma_bf16")((1,), (32,), (oracle.pack_a(bits(A)), oracle.pack_b(bits(B)), oracle.pack_c(C), d))
    assert_sums_close(oracle.unpack_c(d), A @ B + C, dtype=np.float32, terms=17,
                      abs_sum=np.abs(A) @ np.abs(B) + np.abs(C))


def test_bf16_conversions_round_to_nearest_even(probes):
    x = (np.random.default_rng(2).standard_normal(64) * 100).astype(np.float32)
    # ties to even (down, up), a subnormal, -0, the top of bf16, past it (to inf), NaN
    x[:8] = [1 + 2.0 ** -8, 1 + 3 * 2.0 ** -8, 1e-40, -0.0, 3.3895314e38, 3.4e38, np.nan, 1e-45]
    packed, single = np.zeros(32, np.uint32), np.zeros(32, np.uint16)
    probes("probe_convert_bf16")((1,), (32,), (x, packed, single))
    want = x.astype(BF16).view(np.uint16)  # ml_dtypes: round to nearest even
    nan = np.isnan(x)
    np.testing.assert_array_equal(single[~nan[:32]], want[:32][~nan[:32]])
    assert np.isnan(single.view(BF16)[nan[:32]].astype(np.float32)).all()
    np.testing.assert_array_equal(packed & 0xFFFF, np.where(nan[0::2], packed & 0xFFFF, want[0::2]))  # lo = x[2l]
    np.testing.assert_array_equal(packed >> 16, want[1::2])


def test_ldmatrix_loaders_give_the_documented_fragments(probes):
    tile = np.random.default_rng(1).standard_normal((16, ROW)).astype(BF16)
    rows = np.random.default_rng(3).choice(16 * ROW // 8, 32, replace=False).astype(np.int32) * 8
    a, b_pair, bare = (np.zeros((32, 4), np.uint32) for _ in range(3))
    probes("probe_ldmatrix")((1,), (32,), (tile, rows, a, b_pair, bare), shared_mem=2 * tile.nbytes)
    t = bits(tile)
    np.testing.assert_array_equal(a, oracle.pack_a(t[:16, 16:32]))              # A = tile[0:16, 16:32]
    np.testing.assert_array_equal(b_pair[:, :2], oracle.pack_b(t[8:16, 32:48].T))
    np.testing.assert_array_equal(b_pair[:, 2:], oracle.pack_b(t[8:16, 48:64].T))
    np.testing.assert_array_equal(bare, oracle.ldmatrix_x4_b16(t.reshape(-1), rows))
