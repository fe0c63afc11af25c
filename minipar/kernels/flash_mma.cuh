// Helpers shared by the tensor-core kernels of flash_attention_f16.cu: fp16 and bf16
// conversion, the warp-wide mma.sync.m16n8k16 product (`Fp16`, `Bf16`: the element type
// the kernels are instantiated for) and loads of its operand fragments from shared
// memory, tile copies (plain, and cp.async straight from global to shared memory), the
// backward's walk over query tiles and quad reductions.  Loads and copies move 16-bit
// values as bits, so they serve both element types.
//
// Shared-memory tiles are XOR-swizzled: a row of `row_len` halves is cut into 16-byte
// chunks, and chunk c of row r is stored at chunk position c ^ (r & mask) of that row
// (mask 7, or 3 when the chunk count is not a multiple of 8: d = 32, 96).  Fragment loads
// and ldmatrix read the same chunk column of 8 consecutive rows; unswizzled, rows of 128
// or 256 bytes put those 8 reads in the same 4 banks (8-way conflict), swizzled they cover
// all 32 banks — the job the old "+8 halves" row padding did, without the padding's
// shared memory, and with every 16-byte chunk still aligned for ldmatrix and cp.async.
//
// flash_cuda.kernel_source pastes this file where the .cu file includes it, before NVRTC
// sees the source; nvcc reads it directly.
#ifndef MINIPAR_FLASH_MMA_CUH
#define MINIPAR_FLASH_MMA_CUH

#include "flash_common.cuh"

#define TC_THREADS 128          // 4 warps
#define TC_BLOCK_Q 64           // forward: query rows per block, 16 per warp
// TC_FWD_BLOCK_K, forward: keys per K/V tile, chosen per head dim by flash_cuda.compile_options
#ifndef TC_FWD_BLOCK_K
#error "TC_FWD_BLOCK_K is not defined: compile with flash_cuda.compile_options(head_dim)"
#endif
#define TC_BWD_BLOCK_K 64       // backward: keys per block, 16 per warp
#define TC_BWD_BLOCK_Q 32       // backward: queries per inner tile
#define ROW HEAD_DIM            // shared-memory row length, halves (swizzled, no padding)
#define DS_ROW TC_BWD_BLOCK_K
// B fragments come in pairs of 8 columns, and the dQ pass splits the head dim in two.
static_assert(HEAD_DIM % 32 == 0 && HEAD_DIM <= 128, "HEAD_DIM must be 32, 64, 96 or 128");
static_assert(TC_FWD_BLOCK_K == 64 || TC_FWD_BLOCK_K == 128, "TC_FWD_BLOCK_K must be 64 or 128");
static_assert(TC_BLOCK_Q <= TC_FWD_BLOCK_K, "the forward stages Q in a K tile");

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

// Where element (row, col) of a swizzled tile with rows of `row_len` halves lives.
__device__ __forceinline__ int swizzle(int row, int col, int row_len) {
    const int mask = (row_len / 8) % 8 == 0 ? 7 : 3;
    return row * row_len + (((col >> 3) ^ (row & mask)) << 3) + (col & 7);
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

// bf16: fp32's exponent with 8 significant bits (fp16: 5 and 11).  Same fragment layouts,
// same fp32 accumulation; only the rounding into 16 bits and the mma's input type differ.
__device__ __forceinline__ unsigned pack_bf16x2(float lo, float hi) {
    unsigned r;  // operand %2 (hi) is cvt's first source: the upper half
    asm("cvt.rn.bf16x2.f32 %0, %2, %1;" : "=r"(r) : "f"(lo), "f"(hi));
    return r;
}

__device__ __forceinline__ half_bits float_to_bf16(float f) {
    half_bits h;
    asm("cvt.rn.bf16.f32 %0, %1;" : "=h"(h) : "f"(f));
    return h;
}

// c (16×8, fp32) += a (16×16) · b (16×8), bf16 inputs
__device__ __forceinline__ void mma_16x8x16_bf16(float c[4], const unsigned a[4], const unsigned b[2]) {
    asm volatile("mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32 "
                 "{%0,%1,%2,%3}, {%4,%5,%6,%7}, {%8,%9}, {%0,%1,%2,%3};"
                 : "+f"(c[0]), "+f"(c[1]), "+f"(c[2]), "+f"(c[3])
                 : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b[0]), "r"(b[1]));
}

// The element type a tensor-core kernel is instantiated for: rounding fp32 into it (one
// value, or two packed in a register, the lower index in the low half) and the mma on it.
struct Fp16 {
    static __device__ __forceinline__ unsigned pack2(float lo, float hi) { return pack_half2(lo, hi); }
    static __device__ __forceinline__ half_bits from_float(float f) { return float_to_half(f); }
    static __device__ __forceinline__ void mma(float c[4], const unsigned a[4], const unsigned b[2]) {
        mma_16x8x16(c, a, b);
    }
};
struct Bf16 {
    static __device__ __forceinline__ unsigned pack2(float lo, float hi) { return pack_bf16x2(lo, hi); }
    static __device__ __forceinline__ half_bits from_float(float f) { return float_to_bf16(f); }
    static __device__ __forceinline__ void mma(float c[4], const unsigned a[4], const unsigned b[2]) {
        mma_16x8x16_bf16(c, a, b);
    }
};

// Two C tiles side by side (16×8 each, fp32) are one A fragment (16×16) of the element type.
template <class Element>
__device__ __forceinline__ void c_pair_to_a(unsigned a[4], const float left[4], const float right[4]) {
    a[0] = Element::pack2(left[0], left[1]);
    a[1] = Element::pack2(left[2], left[3]);
    a[2] = Element::pack2(right[0], right[1]);
    a[3] = Element::pack2(right[2], right[3]);
}

// The two halves at (row, col), (row, col + 1) of a swizzled tile, as one register.
__device__ __forceinline__ unsigned pair_at(const half_bits* tile, int row, int col, int row_len) {
    return *(const unsigned*)(tile + swizzle(row, col, row_len));
}

// A fragment of the 16×16 block at (row0, col0) of a swizzled tile.
__device__ __forceinline__ void load_a(unsigned a[4], const half_bits* tile, int row_len, int row0, int col0,
                                       int g, int t) {
    a[0] = pair_at(tile, row0 + g, col0 + 2 * t, row_len);
    a[1] = pair_at(tile, row0 + g + 8, col0 + 2 * t, row_len);
    a[2] = pair_at(tile, row0 + g, col0 + 2 * t + 8, row_len);
    a[3] = pair_at(tile, row0 + g + 8, col0 + 2 * t + 8, row_len);
}

// B fragment of Mᵀ where M is the 8 × 16 block at (row0, col0) of a swizzled tile: B[k][n] = M[n][k].
__device__ __forceinline__ void load_b_transposed(unsigned b[2], const half_bits* tile, int row_len, int row0,
                                                  int col0, int g, int t) {
    b[0] = pair_at(tile, row0 + g, col0 + 2 * t, row_len);
    b[1] = pair_at(tile, row0 + g, col0 + 2 * t + 8, row_len);
}

// B fragments of two 16×8 blocks of M (k = row) side by side, M the 16 × 16 block at
// (row0, col0) of a swizzled tile: columns 0..7 in b[0..1], columns 8..15 in b[2..3].
// Lanes 8j..8j+7 address the 8 rows of matrix j; ldmatrix.trans hands each lane M[2t..2t+1][g].
__device__ __forceinline__ void load_b_pair(unsigned b[4], const half_bits* tile, int row_len, int row0, int col0,
                                            int lane) {
    const half_bits* p = tile + swizzle(row0 + ((lane >> 3) & 1) * 8 + (lane & 7), col0 + (lane >> 4) * 8, row_len);
    asm volatile("ldmatrix.sync.aligned.m8n8.x4.trans.shared.b16 {%0,%1,%2,%3}, [%4];"
                 : "=r"(b[0]), "=r"(b[1]), "=r"(b[2]), "=r"(b[3]) : "r"(shared_address(p)));
}

// ldmatrix.x4 (no .trans): four 8×8 blocks in one warp-wide instruction.  Lanes 8j..8j+7
// give the addresses of rows 0..7 of block j (16 bytes each), and lane 4g + t receives
// row g, columns 2t..2t+1 of block j in register j — the fragment layouts of mma's A and
// of Bᵀ, so one instruction replaces four (A) or four (two Bᵀ) 32-bit shared-memory loads
// per lane, and the 8 rows it reads lie in distinct banks (the swizzle).
__device__ __forceinline__ void ldmatrix_x4(unsigned r[4], const half_bits* lane_row) {
    asm volatile("ldmatrix.sync.aligned.m8n8.x4.shared.b16 {%0,%1,%2,%3}, [%4];"
                 : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3]) : "r"(shared_address(lane_row)));
}

// load_a by ldmatrix: blocks (rows 0-7, cols 0-7), (8-15, 0-7), (0-7, 8-15), (8-15, 8-15)
// of the 16×16 block at (row0, col0) are a[0..3].
__device__ __forceinline__ void load_a_ldmatrix(unsigned a[4], const half_bits* tile, int row_len, int row0,
                                                int col0, int lane) {
    ldmatrix_x4(a, tile + swizzle(row0 + (lane & 7) + ((lane >> 3) & 1) * 8, col0 + (lane >> 4) * 8, row_len));
}

// load_b_transposed for two 16-column steps at once, by ldmatrix: M the 8 × 32 block at
// (row0, col0), b[0..1] the B fragment of (columns 0..15)ᵀ, b[2..3] of (columns 16..31)ᵀ.
__device__ __forceinline__ void load_b_transposed_pair(unsigned b[4], const half_bits* tile, int row_len, int row0,
                                                       int col0, int lane) {
    ldmatrix_x4(b, tile + swizzle(row0 + (lane & 7), col0 + (lane >> 3) * 8, row_len));
}

// rows [row0, row0 + rows) of a (n_rows, HEAD_DIM) matrix into a swizzled tile, zero past n_rows.
__device__ __forceinline__ void load_tile(half_bits* tile, const half_bits* src, int row0, int rows, int n_rows) {
    const int chunks = HEAD_DIM / 8;  // 16-byte pieces per row
    for (int i = threadIdx.x; i < rows * chunks; i += blockDim.x) {
        int r = i / chunks, c = (i % chunks) * 8;
        uint4 piece = make_uint4(0, 0, 0, 0);
        if (row0 + r < n_rows) piece = *(const uint4*)(src + (index_t)(row0 + r) * HEAD_DIM + c);
        *(uint4*)(tile + swizzle(r, c, ROW)) = piece;
    }
}

// cp.async (sm_80+): 16 bytes from global to shared memory without passing through
// registers, so the copy runs while the thread computes.  `bytes` < 16 fills the rest with
// zeros.  Copies issued before a commit form one group; wait_all blocks until every group
// of this thread has landed (other threads then need a __syncthreads to see the data).
__device__ __forceinline__ void cp_async_16(half_bits* shared_dst, const half_bits* global_src, int bytes) {
    asm volatile("cp.async.cg.shared.global [%0], [%1], 16, %2;"
                 :: "r"(shared_address(shared_dst)), "l"(global_src), "r"(bytes) : "memory");
}
__device__ __forceinline__ void cp_async_commit() { asm volatile("cp.async.commit_group;" ::: "memory"); }
__device__ __forceinline__ void cp_async_wait_all() { asm volatile("cp.async.wait_group 0;" ::: "memory"); }

// load_tile by cp.async: issues the copies and commits them as one group (no wait).  Rows
// past n_rows are zero-filled (source size 0, from a row that exists: n_rows >= 1).
__device__ __forceinline__ void load_tile_async(half_bits* tile, const half_bits* src, int row0, int rows, int n_rows) {
    const int chunks = HEAD_DIM / 8;
    for (int i = threadIdx.x; i < rows * chunks; i += blockDim.x) {
        int r = i / chunks, c = (i % chunks) * 8;
        bool inside = row0 + r < n_rows;
        cp_async_16(tile + swizzle(r, c, ROW), src + (index_t)(inside ? row0 + r : 0) * HEAD_DIM + c, inside ? 16 : 0);
    }
    cp_async_commit();
}

// Backward's walk over query tiles: tile i is the (i mod T)-th of T = tiles_per_head tiles
// (from first_q on) of query head i / T of KV head kv_head's group.
struct QueryTile { index_t head_row; int q0; };  // first row of its head in (B·H·Nq) rows; its first query

__device__ __forceinline__ QueryTile query_tile(int i, int kv_head, int group, int tiles_per_head, int first_q,
                                                int n_queries) {
    return {(index_t)(kv_head * group + i / tiles_per_head) * n_queries, first_q + (i % tiles_per_head) * TC_BWD_BLOCK_Q};
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
