// FlashAttention-2 for fp16 and bf16 inputs on tensor cores: the algorithm of
// flash_attention.cu and flash_reference.py, with every matrix product done by warp-wide
// mma.sync.m16n8k16 (fp16 × fp16 or bf16 × bf16 -> fp32) and the softmax statistics, exp
// and accumulators in fp32.  Each kernel is a template on the element type (`Fp16`, `Bf16`
// in flash_mma.cuh: the rounding into 16 bits and the mma), instantiated by four entry
// points at the end: flash_{forward,backward}_{f16,bf16}.  The two types share fragment
// layouts, so everything else — loads, swizzle, masks, softmax — is one code.
// Compiled by CuPy with flash_cuda.compile_options(d): -DHEAD_DIM=d (32, 64, 96 or 128) and
// the forward's key tile.  Tile sizes and the PTX helpers are in flash_mma.cuh; 16-bit
// values travel as their bits, converted with PTX cvt.
//
// Fragments (PTX ISA, "mma.m16n8k16", lane = 4·g + t):  A (16×16, row-major) holds
// A[g][2t..2t+1], A[g+8][2t..], A[g][2t+8..], A[g+8][2t+8..];  B (16×8) holds
// B[2t..2t+1][g], B[2t+8..2t+9][g];  C (16×8 fp32) holds C[g][2t..2t+1], C[g+8][2t..2t+1].
// So a thread owns rows g and g+8 of every tile; row statistics are reduced over the
// four lanes of a quad (shuffles by 1 and 2), and two C tiles side by side are exactly
// one A fragment: P and dS go from one product into the next without touching memory.
// Shared-memory tiles are XOR-swizzled (flash_mma.cuh, `swizzle`): the 8 rows one ldmatrix
// or fragment load touches fall in distinct banks, with no padding.  Softmax runs in base
// 2 with log2(e) folded into the score scale, so each exponential is one exp2.
//
// Grouped-query attention (`group` = G = H / Hkv query heads per KV head), as in
// flash_attention.cu: forward blocks of flat query head h read KV head h / G; backward
// blocks own one KV head's key tile and walk its G query heads in turn, keeping dK, dV
// in registers across the group (no atomics on dK/dV, one 16-bit store at the end).

#include "flash_mma.cuh"

// Forward.  Block = TC_BLOCK_Q queries, warp w owns rows 16w..16w+15; Q stays in registers
// as A fragments.  A K/V tile of TC_FWD_BLOCK_K keys (128, or 64 at d > 64: flash_cuda.py says
// why), copied to shared memory once, serves all 4 warps; 128 keys halve the iterations,
// barriers and softmax rescales.  Scores are in log2 units (S·scale·log2 e): exp is one exp2.
// K/V are double-buffered: while the warps compute on the tile in one stage, cp.async
// copies the next tile into the other, so global-memory latency hides behind the MMAs.
// Shared memory (halves): 2 stages × {k_tile, v_tile} [TC_FWD_BLOCK_K][ROW]; stage 1's k_tile
// first stages Q.
template <class Element>
__device__ __forceinline__ void
flash_forward(const half_bits* __restrict__ q, const half_bits* __restrict__ k,
              const half_bits* __restrict__ v, half_bits* __restrict__ out,
              float* __restrict__ lse, int n_queries, int n_keys, int causal, float scale, int group) {
    extern __shared__ uint4 smem_tc[];
    half_bits* const stages = (half_bits*)smem_tc;  // stage s: k_tile at 2s·KV_TILE, v_tile after it
    const int KV_TILE = TC_FWD_BLOCK_K * ROW;
    const index_t head = blockIdx.y, kv_head = head / group;  // query head h reads KV head h / G
    q += head * n_queries * HEAD_DIM;  out += head * n_queries * HEAD_DIM;  lse += head * n_queries;
    k += kv_head * n_keys * HEAD_DIM;  v += kv_head * n_keys * HEAD_DIM;
    const int warp = threadIdx.x / 32, lane = threadIdx.x % 32, g = lane / 4, t = lane % 4;
    const int q0 = blockIdx.x * TC_BLOCK_Q, offset = n_keys - n_queries;
    const int query[2] = {q0 + warp * 16 + g, q0 + warp * 16 + g + 8};  // this thread's two rows
    const float scale_log2 = scale * LOG2E;

    load_tile(stages + 2 * KV_TILE, q, q0, TC_BLOCK_Q, n_queries);
    __syncthreads();
    unsigned q_frag[HEAD_DIM / 16][4];
#pragma unroll
    for (int kd = 0; kd < HEAD_DIM / 16; ++kd) load_a(q_frag[kd], stages + 2 * KV_TILE, ROW, warp * 16, kd * 16, g, t);

    float acc[HEAD_DIM / 8][4] = {};
    float row_max[2] = {NEG_INF, NEG_INF}, row_sum[2] = {0.f, 0.f};  // row_sum: this lane's columns only
    const int q1 = min(q0 + TC_BLOCK_Q, n_queries);
    const int key_end = causal ? min(n_keys, q1 + offset) : n_keys;
    if (key_end > 0) {  // the first K/V tile into stage 0
        load_tile_async(stages, k, 0, TC_FWD_BLOCK_K, n_keys);
        load_tile_async(stages + KV_TILE, v, 0, TC_FWD_BLOCK_K, n_keys);
    }
    for (int k0 = 0, stage = 0; k0 < key_end; k0 += TC_FWD_BLOCK_K, stage ^= 1) {
        cp_async_wait_all();  // this thread's copies of tile k0 have landed...
        __syncthreads();      // ...and everyone's; nobody still reads the other stage (last tile, or Q)
        const int next_k0 = k0 + TC_FWD_BLOCK_K;
        if (next_k0 < key_end) {  // the next tile into the other stage, during this one's MMAs
            load_tile_async(stages + 2 * (stage ^ 1) * KV_TILE, k, next_k0, TC_FWD_BLOCK_K, n_keys);
            load_tile_async(stages + (2 * (stage ^ 1) + 1) * KV_TILE, v, next_k0, TC_FWD_BLOCK_K, n_keys);
        }
        const half_bits* k_tile = stages + 2 * stage * KV_TILE;
        const half_bits* v_tile = k_tile + KV_TILE;

        float s[TC_FWD_BLOCK_K / 8][4] = {};  // S = Q Kᵀ: 16 rows × the tile's keys, 8 per C tile
#pragma unroll
        for (int nk = 0; nk < TC_FWD_BLOCK_K / 8; ++nk) {
#pragma unroll
            for (int kd = 0; kd < HEAD_DIM / 16; kd += 2) {  // Kᵀ fragments of two d-steps per ldmatrix
                unsigned b[4];
                load_b_transposed_pair(b, k_tile, ROW, nk * 8, kd * 16, lane);
                Element::mma(s[nk], q_frag[kd], b);
                Element::mma(s[nk], q_frag[kd + 1], b + 2);
            }
        }
        const bool needs_mask = next_k0 > n_keys || (causal && next_k0 - 1 > q0 + offset);
#pragma unroll
        for (int nk = 0; nk < TC_FWD_BLOCK_K / 8; ++nk) {
#pragma unroll
            for (int e = 0; e < 4; ++e) {
                int key = k0 + nk * 8 + 2 * t + (e & 1);
                bool hidden = needs_mask && (key >= n_keys || (causal && key > query[e / 2] + offset));
                s[nk][e] = hidden ? NEG_INF : s[nk][e] * scale_log2;
            }
        }
#pragma unroll
        for (int r = 0; r < 2; ++r) {  // online softmax, rows g (r = 0) and g + 8 (r = 1)
            float tile_max = NEG_INF;
#pragma unroll
            for (int nk = 0; nk < TC_FWD_BLOCK_K / 8; ++nk)
                tile_max = fmaxf(tile_max, fmaxf(s[nk][2 * r], s[nk][2 * r + 1]));
            float new_max = fmaxf(row_max[r], quad_max(tile_max));
            float safe_max = new_max == NEG_INF ? 0.f : new_max;
            float rescale = exp2f(row_max[r] - safe_max);
            row_sum[r] *= rescale;
#pragma unroll
            for (int nd = 0; nd < HEAD_DIM / 8; ++nd) { acc[nd][2 * r] *= rescale; acc[nd][2 * r + 1] *= rescale; }
#pragma unroll
            for (int nk = 0; nk < TC_FWD_BLOCK_K / 8; ++nk) {
                s[nk][2 * r] = exp2f(s[nk][2 * r] - safe_max);
                s[nk][2 * r + 1] = exp2f(s[nk][2 * r + 1] - safe_max);
                row_sum[r] += s[nk][2 * r] + s[nk][2 * r + 1];
            }
            row_max[r] = new_max;
        }
#pragma unroll
        for (int kk = 0; kk < TC_FWD_BLOCK_K / 16; ++kk) {  // acc += P V, 16 keys at a time
            unsigned p_frag[4];
            c_pair_to_a<Element>(p_frag, s[2 * kk], s[2 * kk + 1]);
#pragma unroll
            for (int nd = 0; nd < HEAD_DIM / 8; nd += 2) {
                unsigned b[4];
                load_b_pair(b, v_tile, ROW, kk * 16, nd * 8, lane);
                Element::mma(acc[nd], p_frag, b);
                Element::mma(acc[nd + 1], p_frag, b + 2);
            }
        }
    }
#pragma unroll
    for (int r = 0; r < 2; ++r) {
        float total = quad_sum(row_sum[r]);
        float inv = total > 0.f ? 1.f / total : 0.f;
        if (query[r] >= n_queries) continue;
#pragma unroll
        for (int nd = 0; nd < HEAD_DIM / 8; ++nd)
            *(unsigned*)(out + (index_t)query[r] * HEAD_DIM + nd * 8 + 2 * t) =
                Element::pack2(acc[nd][2 * r] * inv, acc[nd][2 * r + 1] * inv);
        if (t == 0) lse[query[r]] = total > 0.f ? row_max[r] * LN2 + logf(total) : NEG_INF;
    }
}

// Backward.  Block = TC_BWD_BLOCK_K keys, warp w owns keys 16w..16w+15 and accumulates their
// dK, dV in registers while the block walks query tiles of TC_BWD_BLOCK_Q.  Per tile each
// warp forms the transposed products Sᵀ = K Qᵀ and dPᵀ = V dOᵀ (16 keys × 32 queries), so
// Pᵀ and dSᵀ come out as A fragments for dV += Pᵀ dO and dK += dSᵀ Q.  dS is written to
// shared memory once, and dQ += dS K · scale is a block-wide product added to the fp32 dq
// buffer with atomics (warp w: queries 16(w%2).., head-dim half w/2).
// The query tiles stream through two stages: while the warps work on tile i, cp.async
// copies Q and dO of tile i+1 into the other stage, and its L and D wait in registers
// until tile i is done.  With grouped-query attention the tiles of the G query heads of
// this block's KV head come one head after another (`query_tile`, flash_mma.cuh).
// Shared memory: k_tile, v_tile [TC_BWD_BLOCK_K][ROW]; 2 stages × {q_tile, do_tile}
// [TC_BWD_BLOCK_Q][ROW]; ds_tile [TC_BWD_BLOCK_Q][DS_ROW] (halves); 2 stages × {lse_tile
// (log2 units), delta_tile} [TC_BWD_BLOCK_Q] (floats).
template <class Element>
__device__ __forceinline__ void
flash_backward(const half_bits* __restrict__ q, const half_bits* __restrict__ k,
               const half_bits* __restrict__ v, const half_bits* __restrict__ grad_out,
               const float* __restrict__ lse, const float* __restrict__ delta,
               float* __restrict__ dq, half_bits* __restrict__ dk, half_bits* __restrict__ dv,
               int n_queries, int n_keys, int causal, float scale, int group) {
    extern __shared__ uint4 smem_tc[];
    const int Q_TILE = TC_BWD_BLOCK_Q * ROW, STATS = TC_BWD_BLOCK_Q;
    half_bits *k_tile = (half_bits*)smem_tc, *v_tile = k_tile + TC_BWD_BLOCK_K * ROW;
    half_bits* const qdo_stages = v_tile + TC_BWD_BLOCK_K * ROW;  // stage s: q_tile at 2s·Q_TILE, do_tile after it
    half_bits* const ds_tile = qdo_stages + 4 * Q_TILE;
    float* const stat_stages = (float*)(ds_tile + TC_BWD_BLOCK_Q * DS_ROW);  // stage s: lse at 2s·STATS, delta after
    const int kv_head = blockIdx.y;
    k += (index_t)kv_head * n_keys * HEAD_DIM;  v += (index_t)kv_head * n_keys * HEAD_DIM;
    dk += (index_t)kv_head * n_keys * HEAD_DIM;  dv += (index_t)kv_head * n_keys * HEAD_DIM;
    const int warp = threadIdx.x / 32, lane = threadIdx.x % 32, g = lane / 4, t = lane % 4;
    const int k0 = blockIdx.x * TC_BWD_BLOCK_K, offset = n_keys - n_queries;
    const int key[2] = {k0 + warp * 16 + g, k0 + warp * 16 + g + 8};  // this thread's two key rows
    const float scale_log2 = scale * LOG2E;

    load_tile(k_tile, k, k0, TC_BWD_BLOCK_K, n_keys);
    load_tile(v_tile, v, k0, TC_BWD_BLOCK_K, n_keys);
    float dk_acc[HEAD_DIM / 8][4] = {}, dv_acc[HEAD_DIM / 8][4] = {};
    // The first query that sees key k0 is k0 - offset; earlier query tiles are skipped.
    const int first_q = causal ? max(0, k0 - offset) / TC_BWD_BLOCK_Q * TC_BWD_BLOCK_Q : 0;
    const int tiles_per_head = (max(0, n_queries - first_q) + TC_BWD_BLOCK_Q - 1) / TC_BWD_BLOCK_Q;
    const int n_tiles = group * tiles_per_head;
    // Threads r < TC_BWD_BLOCK_Q carry row r's L and D into shared memory, in log2 units
    // (L = -inf, a row that sees nothing, becomes 0: its keys are all hidden anyway).
    const int r = threadIdx.x;
    float next_lse = 0.f, next_delta = 0.f;  // the next tile's, held while this one computes
    if (n_tiles > 0) {
        const QueryTile first = query_tile(0, kv_head, group, tiles_per_head, first_q, n_queries);
        load_tile_async(qdo_stages, q + first.head_row * HEAD_DIM, first.q0, TC_BWD_BLOCK_Q, n_queries);
        load_tile_async(qdo_stages + Q_TILE, grad_out + first.head_row * HEAD_DIM, first.q0, TC_BWD_BLOCK_Q, n_queries);
        if (r < STATS) {
            const bool inside = first.q0 + r < n_queries;
            const float l = inside ? lse[first.head_row + first.q0 + r] : 0.f;
            stat_stages[r] = l == NEG_INF ? 0.f : l * LOG2E;
            stat_stages[STATS + r] = inside ? delta[first.head_row + first.q0 + r] : 0.f;
        }
    }
    // Two barriers per tile.  The first (after the wait) makes tile i's copies visible and
    // frees the other stage: tile i-1's Q/dO/L/D were last read before its dS barrier, so
    // the next tile's copies may start; ds_tile, read after tile i-1's dS barrier, is
    // rewritten only after this one.
    for (int i = 0; i < n_tiles; ++i) {
        const int stage = i & 1;
        const QueryTile tile = query_tile(i, kv_head, group, tiles_per_head, first_q, n_queries);
        const int q0 = tile.q0;
        const half_bits *q_tile = qdo_stages + 2 * stage * Q_TILE, *do_tile = q_tile + Q_TILE;
        const float *lse_tile = stat_stages + 2 * stage * STATS, *delta_tile = lse_tile + STATS;
        cp_async_wait_all();  // this thread's copies of tile i have landed...
        __syncthreads();      // ...and everyone's
        const bool has_next = i + 1 < n_tiles;
        if (has_next) {  // tile i+1 into the other stage, during this tile's MMAs
            const QueryTile next = query_tile(i + 1, kv_head, group, tiles_per_head, first_q, n_queries);
            half_bits* next_q = qdo_stages + 2 * (stage ^ 1) * Q_TILE;
            load_tile_async(next_q, q + next.head_row * HEAD_DIM, next.q0, TC_BWD_BLOCK_Q, n_queries);
            load_tile_async(next_q + Q_TILE, grad_out + next.head_row * HEAD_DIM, next.q0, TC_BWD_BLOCK_Q, n_queries);
            if (r < STATS) {  // into registers now, to shared memory after this tile
                const bool inside = next.q0 + r < n_queries;
                next_lse = inside ? lse[next.head_row + next.q0 + r] : 0.f;
                next_delta = inside ? delta[next.head_row + next.q0 + r] : 0.f;
            }
        }

        float s[TC_BWD_BLOCK_Q / 8][4] = {}, dp[TC_BWD_BLOCK_Q / 8][4] = {};  // Sᵀ, dPᵀ
#pragma unroll
        for (int kd = 0; kd < HEAD_DIM / 16; ++kd) {
            unsigned k_frag[4], v_frag[4];
            load_a_ldmatrix(k_frag, k_tile, ROW, warp * 16, kd * 16, lane);
            load_a_ldmatrix(v_frag, v_tile, ROW, warp * 16, kd * 16, lane);
#pragma unroll
            for (int nq = 0; nq < TC_BWD_BLOCK_Q / 8; ++nq) {
                unsigned b[2];
                load_b_transposed(b, q_tile, ROW, nq * 8, kd * 16, g, t);
                Element::mma(s[nq], k_frag, b);
                load_b_transposed(b, do_tile, ROW, nq * 8, kd * 16, g, t);
                Element::mma(dp[nq], v_frag, b);
            }
        }
        const bool needs_mask = q0 + TC_BWD_BLOCK_Q > n_queries || k0 + TC_BWD_BLOCK_K > n_keys ||
                                (causal && k0 + TC_BWD_BLOCK_K - 1 > q0 + offset);
#pragma unroll
        for (int nq = 0; nq < TC_BWD_BLOCK_Q / 8; ++nq) {
#pragma unroll
            for (int e = 0; e < 4; ++e) {
                int col = nq * 8 + 2 * t + (e & 1), query = q0 + col, row_key = key[e / 2];
                bool hidden = needs_mask && (query >= n_queries || row_key >= n_keys ||
                                             (causal && row_key > query + offset));
                float p = hidden ? 0.f : exp2f(s[nq][e] * scale_log2 - lse_tile[col]);  // P = exp(S - L)
                s[nq][e] = p;
                dp[nq][e] = p * (dp[nq][e] - delta_tile[col]);                        // dS = P∘(dP - D)
                ds_tile[swizzle(col, warp * 16 + g + (e / 2) * 8, DS_ROW)] = Element::from_float(dp[nq][e]);
            }
        }
#pragma unroll
        for (int kq = 0; kq < TC_BWD_BLOCK_Q / 16; ++kq) {  // dV += Pᵀ dO, dK += dSᵀ Q
            unsigned p_frag[4], ds_frag[4];
            c_pair_to_a<Element>(p_frag, s[2 * kq], s[2 * kq + 1]);
            c_pair_to_a<Element>(ds_frag, dp[2 * kq], dp[2 * kq + 1]);
#pragma unroll
            for (int nd = 0; nd < HEAD_DIM / 8; nd += 2) {
                unsigned b[4];
                load_b_pair(b, do_tile, ROW, kq * 16, nd * 8, lane);
                Element::mma(dv_acc[nd], p_frag, b);
                Element::mma(dv_acc[nd + 1], p_frag, b + 2);
                load_b_pair(b, q_tile, ROW, kq * 16, nd * 8, lane);
                Element::mma(dk_acc[nd], ds_frag, b);
                Element::mma(dk_acc[nd + 1], ds_frag, b + 2);
            }
        }
        __syncthreads();  // ds_tile complete

        const int dq_row0 = (warp % 2) * 16, dq_col0 = (warp / 2) * (HEAD_DIM / 2);
        float dq_part[HEAD_DIM / 16][4] = {};
#pragma unroll
        for (int kk = 0; kk < TC_BWD_BLOCK_K / 16; ++kk) {
            unsigned ds_frag[4];
            load_a(ds_frag, ds_tile, DS_ROW, dq_row0, kk * 16, g, t);
#pragma unroll
            for (int nd = 0; nd < HEAD_DIM / 16; nd += 2) {
                unsigned b[4];
                load_b_pair(b, k_tile, ROW, kk * 16, dq_col0 + nd * 8, lane);
                Element::mma(dq_part[nd], ds_frag, b);
                Element::mma(dq_part[nd + 1], ds_frag, b + 2);
            }
        }
#pragma unroll
        for (int nd = 0; nd < HEAD_DIM / 16; ++nd) {
#pragma unroll
            for (int e = 0; e < 4; ++e) {
                int query = q0 + dq_row0 + g + (e / 2) * 8, col = dq_col0 + nd * 8 + 2 * t + (e & 1);
                if (query < n_queries)
                    atomicAdd(dq + (tile.head_row + query) * HEAD_DIM + col, dq_part[nd][e] * scale);
            }
        }
        if (has_next && r < STATS) {  // the other stage's L and D were last read before tile i-1's dS barrier
            stat_stages[2 * (stage ^ 1) * STATS + r] = next_lse == NEG_INF ? 0.f : next_lse * LOG2E;
            stat_stages[(2 * (stage ^ 1) + 1) * STATS + r] = next_delta;
        }
    }
#pragma unroll
    for (int r = 0; r < 2; ++r) {
        if (key[r] >= n_keys) continue;
#pragma unroll
        for (int nd = 0; nd < HEAD_DIM / 8; ++nd) {
            index_t at = (index_t)key[r] * HEAD_DIM + nd * 8 + 2 * t;
            *(unsigned*)(dk + at) = Element::pack2(dk_acc[nd][2 * r] * scale, dk_acc[nd][2 * r + 1] * scale);
            *(unsigned*)(dv + at) = Element::pack2(dv_acc[nd][2 * r], dv_acc[nd][2 * r + 1]);
        }
    }
}

// The entry points: one per direction and element type, each the template above.  The bf16
// ones take their 16-bit arrays as bf16_bits, the same bits under the name of their type.
extern "C" __global__ void __launch_bounds__(TC_THREADS)
flash_forward_f16(const half_bits* __restrict__ q, const half_bits* __restrict__ k,
                  const half_bits* __restrict__ v, half_bits* __restrict__ out,
                  float* __restrict__ lse, int n_queries, int n_keys, int causal, float scale, int group) {
    flash_forward<Fp16>(q, k, v, out, lse, n_queries, n_keys, causal, scale, group);
}

extern "C" __global__ void __launch_bounds__(TC_THREADS)
flash_forward_bf16(const bf16_bits* __restrict__ q, const bf16_bits* __restrict__ k,
                   const bf16_bits* __restrict__ v, bf16_bits* __restrict__ out,
                   float* __restrict__ lse, int n_queries, int n_keys, int causal, float scale, int group) {
    flash_forward<Bf16>(q, k, v, out, lse, n_queries, n_keys, causal, scale, group);
}

extern "C" __global__ void __launch_bounds__(TC_THREADS)
flash_backward_f16(const half_bits* __restrict__ q, const half_bits* __restrict__ k,
                   const half_bits* __restrict__ v, const half_bits* __restrict__ grad_out,
                   const float* __restrict__ lse, const float* __restrict__ delta,
                   float* __restrict__ dq, half_bits* __restrict__ dk, half_bits* __restrict__ dv,
                   int n_queries, int n_keys, int causal, float scale, int group) {
    flash_backward<Fp16>(q, k, v, grad_out, lse, delta, dq, dk, dv, n_queries, n_keys, causal, scale, group);
}

extern "C" __global__ void __launch_bounds__(TC_THREADS)
flash_backward_bf16(const bf16_bits* __restrict__ q, const bf16_bits* __restrict__ k,
                    const bf16_bits* __restrict__ v, const bf16_bits* __restrict__ grad_out,
                    const float* __restrict__ lse, const float* __restrict__ delta,
                    float* __restrict__ dq, bf16_bits* __restrict__ dk, bf16_bits* __restrict__ dv,
                    int n_queries, int n_keys, int causal, float scale, int group) {
    flash_backward<Bf16>(q, k, v, grad_out, lse, delta, dq, dk, dv, n_queries, n_keys, causal, scale, group);
}
