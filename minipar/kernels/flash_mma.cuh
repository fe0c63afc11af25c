// Helpers shared by the tensor-core kernels of flash_attention_f16.cu: fp16 conversion,
// the warp-wide mma.sync.m16n8k16 product and loads of its operand fragments from shared
// memory, tile copies and quad reductions.  flash_cuda.kernel_source pastes this file where
// the .cu file includes it, before NVRTC sees the source; nvcc reads it directly.
#ifndef MINIPAR_FLASH_MMA_CUH
#define MINIPAR_FLASH_MMA_CUH

#include "flash_common.cuh"

#define TC_THREADS 128          // 4 warps
#define TC_BLOCK_Q 64           // forward: query rows per block, 16 per warp
#define TC_BLOCK_K 64           // keys per tile (forward) / per block, 16 per warp (backward)
#define TC_BWD_BLOCK_Q 32       // backward: queries per inner tile
#define ROW (HEAD_DIM + 8)      // shared-memory row length, halves
#define DS_ROW (TC_BLOCK_K + 8)
// B fragments come in pairs of 8 columns, and the dQ pass splits the head dim in two.
static_assert(HEAD_DIM % 32 == 0 && HEAD_DIM <= 128, "HEAD_DIM must be 32, 64, 96 or 128");

__device__ __forceinline__ unsigned pack_half2(float lo, float hi) {
    unsigned r;  // cvt.f16x2 puts its first source in the upper half
    asm("cvt.rn.f16x2.f32 %0, %1, %2;" : "=r"(r) : "f"(hi), "f"(lo));
    return r;
}

__device__ __forceinline__ half_bits float_to_half(float f) {
    half_bits h;
    asm("cvt.rn.f16.f32 %0, %1;" : "=h"(h) : "f"(f));
    return h;
}

__device__ __forceinline__ unsigned shared_address(const void* p) {
    unsigned a;
    asm("{ .reg .u64 t; cvta.to.shared.u64 t, %1; cvt.u32.u64 %0, t; }" : "=r"(a) : "l"(p));
    return a;
}

// c (16×8, fp32) += a (16×16) · b (16×8)
__device__ __forceinline__ void mma_16x8x16(float c[4], const unsigned a[4], const unsigned b[2]) {
    asm volatile("mma.sync.aligned.m16n8k16.row.col.f32.f16.f16.f32 "
                 "{%0,%1,%2,%3}, {%4,%5,%6,%7}, {%8,%9}, {%0,%1,%2,%3};"
                 : "+f"(c[0]), "+f"(c[1]), "+f"(c[2]), "+f"(c[3])
                 : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b[0]), "r"(b[1]));
}

// Two C tiles side by side (16×8 each, fp32) are one A fragment (16×16): pack to fp16.
__device__ __forceinline__ void c_pair_to_a(unsigned a[4], const float left[4], const float right[4]) {
    a[0] = pack_half2(left[0], left[1]);
    a[1] = pack_half2(left[2], left[3]);
    a[2] = pack_half2(right[0], right[1]);
    a[3] = pack_half2(right[2], right[3]);
}

// A fragment of the 16×16 block at `tile` (row-major, `row_len` halves per row).
__device__ __forceinline__ void load_a(unsigned a[4], const half_bits* tile, int row_len, int g, int t) {
    const half_bits* p = tile + g * row_len + 2 * t;
    a[0] = *(const unsigned*)(p);
    a[1] = *(const unsigned*)(p + 8 * row_len);
    a[2] = *(const unsigned*)(p + 8);
    a[3] = *(const unsigned*)(p + 8 * row_len + 8);
}

// B fragment of Mᵀ where M (8 rows × 16, row-major) is at `tile`: B[k][n] = M[n][k].
__device__ __forceinline__ void load_b_transposed(unsigned b[2], const half_bits* tile, int row_len, int g, int t) {
    const half_bits* p = tile + g * row_len + 2 * t;
    b[0] = *(const unsigned*)(p);
    b[1] = *(const unsigned*)(p + 8);
}

// B fragments of two 16×8 blocks of M (row-major, k = row) side by side: columns 0..7 in
// b[0..1], columns 8..15 in b[2..3].  ldmatrix.trans hands each lane M[2t..2t+1][g].
__device__ __forceinline__ void load_b_pair(unsigned b[4], const half_bits* tile, int lane) {
    const half_bits* p = tile + ((lane >> 3) & 1) * 8 * ROW + (lane & 7) * ROW + (lane >> 4) * 8;
    asm volatile("ldmatrix.sync.aligned.m8n8.x4.trans.shared.b16 {%0,%1,%2,%3}, [%4];"
                 : "=r"(b[0]), "=r"(b[1]), "=r"(b[2]), "=r"(b[3]) : "r"(shared_address(p)));
}

// rows [row0, row0 + rows) of a (n_rows, HEAD_DIM) matrix into shared memory, zero past n_rows.
__device__ __forceinline__ void load_tile(half_bits* tile, const half_bits* src, int row0, int rows, int n_rows) {
    const int chunks = HEAD_DIM / 8;  // 16-byte pieces per row
    for (int i = threadIdx.x; i < rows * chunks; i += blockDim.x) {
        int r = i / chunks, c = (i % chunks) * 8;
        uint4 piece = make_uint4(0, 0, 0, 0);
        if (row0 + r < n_rows) piece = *(const uint4*)(src + (index_t)(row0 + r) * HEAD_DIM + c);
        *(uint4*)(tile + r * ROW + c) = piece;
    }
}

__device__ __forceinline__ float quad_max(float x) {
    x = fmaxf(x, __shfl_xor_sync(0xffffffffu, x, 1));
    return fmaxf(x, __shfl_xor_sync(0xffffffffu, x, 2));
}

__device__ __forceinline__ float quad_sum(float x) {
    x += __shfl_xor_sync(0xffffffffu, x, 1);
    return x + __shfl_xor_sync(0xffffffffu, x, 2);
}

#endif  // MINIPAR_FLASH_MMA_CUH
