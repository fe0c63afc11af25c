// FlashAttention-2 as CUDA C, compiled at run time by CuPy (cupy.RawModule) with
// -DHEAD_DIM=d.  This file: flash_forward_f32 / flash_backward_f32, one thread per row,
// fp32, line for line the NumPy reference (flash_reference.py) — the kernels to read
// first.  flash_attention_f16.cu holds the same algorithm on tensor cores.
//
// Layout: q, out, dq are (B·H, Nq, HEAD_DIM); k, v, dk, dv are (B·Hkv, Nk, HEAD_DIM), all
// contiguous; lse and delta are (B·H, Nq) fp32.  Grouped-query attention: `group` = G =
// H / Hkv query heads share one KV head, and flat query head h (= b·H + h') reads flat KV
// head h / G (= b·Hkv + h'/G) in place.  Forward: gridDim.y = B·H.  Backward: gridDim.y =
// B·Hkv, and each block walks the G query heads of its KV head one after another,
// accumulating dK, dV over all of them before one plain store — a per-group loop rather
// than atomics into an fp32 copy of dK/dV: deterministic, no extra buffer or cast, and
// G = 1 runs exactly the multi-head kernel.  Causal masking is
// bottom-right aligned: query i sees key j iff j <= i + (Nk - Nq).  A row that sees no key
// gets output 0 and lse -inf.  Forward:  m' = max(m, rowmax S), l' = e^(m-m') l + rowsum P,
// acc' = e^(m-m') acc + P V, O = acc / l, L = m + log l.  Backward (one block per key tile,
// loop over query tiles): P = exp(S - L), dV += Pᵀ dO, dP = dO Vᵀ, dS = P∘(dP - D),
// dK += dSᵀ Q·scale, dQ += dS K·scale (fp32 atomics into a zeroed buffer).

#include "flash_common.cuh"

__device__ __forceinline__ bool key_hidden(int key, int query, int n_keys, int causal, int offset) {
    return key >= n_keys || (causal && key > query + offset);
}

// =====================================================================================
// fp32: one thread per query row (forward) / per key row (backward)
// =====================================================================================
#define F32_BLOCK_Q 64  // query rows per forward block = threads per block
#define F32_BLOCK_K 32  // keys per forward tile
#define F32_BWD_BLOCK 32  // keys per backward block = queries per tile = threads

// Dynamic shared memory (floats): q_tile [F32_BLOCK_Q][HEAD_DIM+1], k_tile, v_tile
// [F32_BLOCK_K][HEAD_DIM], score_tile [F32_BLOCK_Q][F32_BLOCK_K+1]; the +1 because thread r
// reads row r, so rows must start in different banks.  acc[] stays in registers.
extern "C" __global__ void __launch_bounds__(F32_BLOCK_Q)
flash_forward_f32(const float* __restrict__ q, const float* __restrict__ k,
                  const float* __restrict__ v, float* __restrict__ out, float* __restrict__ lse,
                  int n_queries, int n_keys, int causal, float scale, int group) {
    extern __shared__ float smem_f32[];
    float* q_tile = smem_f32;
    float* k_tile = q_tile + F32_BLOCK_Q * (HEAD_DIM + 1);
    float* v_tile = k_tile + F32_BLOCK_K * HEAD_DIM;
    float* score_tile = v_tile + F32_BLOCK_K * HEAD_DIM;
    const index_t head = blockIdx.y, kv_head = head / group;  // query head h reads KV head h / G
    q += head * n_queries * HEAD_DIM;  out += head * n_queries * HEAD_DIM;  lse += head * n_queries;
    k += kv_head * n_keys * HEAD_DIM;  v += kv_head * n_keys * HEAD_DIM;
    const int q0 = blockIdx.x * F32_BLOCK_Q, row = threadIdx.x, query = q0 + row;
    const int q1 = min(q0 + F32_BLOCK_Q, n_queries), offset = n_keys - n_queries;

    for (int i = threadIdx.x; i < F32_BLOCK_Q * HEAD_DIM; i += blockDim.x) {
        int r = i / HEAD_DIM, c = i % HEAD_DIM;
        q_tile[r * (HEAD_DIM + 1) + c] = q0 + r < n_queries ? q[(index_t)(q0 + r) * HEAD_DIM + c] : 0.f;
    }
    float row_max = NEG_INF, row_sum = 0.f, acc[HEAD_DIM];
#pragma unroll
    for (int c = 0; c < HEAD_DIM; ++c) acc[c] = 0.f;

    const int key_end = causal ? min(n_keys, q1 + offset) : n_keys;  // later tiles: all hidden
    for (int k0 = 0; k0 < key_end; k0 += F32_BLOCK_K) {
        __syncthreads();  // the previous K/V tile is no longer read
        for (int i = threadIdx.x; i < F32_BLOCK_K * HEAD_DIM; i += blockDim.x) {
            bool inside = k0 + i / HEAD_DIM < n_keys;
            k_tile[i] = inside ? k[(index_t)k0 * HEAD_DIM + i] : 0.f;
            v_tile[i] = inside ? v[(index_t)k0 * HEAD_DIM + i] : 0.f;
        }
        __syncthreads();
        float* scores = score_tile + row * (F32_BLOCK_K + 1);  // this row's S_ij
        float tile_max = NEG_INF;
        for (int j = 0; j < F32_BLOCK_K; ++j) {
            float s = 0.f;
            for (int c = 0; c < HEAD_DIM; ++c) s += q_tile[row * (HEAD_DIM + 1) + c] * k_tile[j * HEAD_DIM + c];
            scores[j] = key_hidden(k0 + j, query, n_keys, causal, offset) ? NEG_INF : s * scale;
            tile_max = fmaxf(tile_max, scores[j]);
        }
        float new_max = fmaxf(row_max, tile_max);
        float safe_max = new_max == NEG_INF ? 0.f : new_max;  // nothing visible yet: no NaN
        float rescale = expf(row_max - safe_max);
        row_sum *= rescale;
#pragma unroll
        for (int c = 0; c < HEAD_DIM; ++c) acc[c] *= rescale;
#pragma unroll 1
        for (int j = 0; j < F32_BLOCK_K; ++j) {
            float p = expf(scores[j] - safe_max);
            row_sum += p;
#pragma unroll
            for (int c = 0; c < HEAD_DIM; ++c) acc[c] += p * v_tile[j * HEAD_DIM + c];
        }
        row_max = new_max;
    }
    __syncthreads();  // stage O through q_tile so the global store is coalesced
    float inv_sum = row_sum > 0.f ? 1.f / row_sum : 0.f;
#pragma unroll
    for (int c = 0; c < HEAD_DIM; ++c) q_tile[row * (HEAD_DIM + 1) + c] = acc[c] * inv_sum;
    if (query < n_queries) lse[query] = row_sum > 0.f ? row_max + logf(row_sum) : NEG_INF;
    __syncthreads();
    for (int i = threadIdx.x; i < F32_BLOCK_Q * HEAD_DIM; i += blockDim.x) {
        int r = i / HEAD_DIM, c = i % HEAD_DIM;
        if (q0 + r < n_queries) out[(index_t)(q0 + r) * HEAD_DIM + c] = q_tile[r * (HEAD_DIM + 1) + c];
    }
}

// Dynamic shared memory (floats), B = F32_BWD_BLOCK, P = HEAD_DIM + 1:
// k_tile, v_tile, dk_acc, dv_acc [B][P] | q_tile, do_tile [B][HEAD_DIM] | ds_tile [B][B+1] | lse, delta [B]
extern "C" __global__ void __launch_bounds__(F32_BWD_BLOCK)
flash_backward_f32(const float* __restrict__ q, const float* __restrict__ k,
                   const float* __restrict__ v, const float* __restrict__ grad_out,
                   const float* __restrict__ lse, const float* __restrict__ delta,
                   float* __restrict__ dq, float* __restrict__ dk, float* __restrict__ dv,
                   int n_queries, int n_keys, int causal, float scale, int group) {
    const int B = F32_BWD_BLOCK, P = HEAD_DIM + 1;
    extern __shared__ float smem_f32[];
    float *k_tile = smem_f32, *v_tile = k_tile + B * P, *dk_acc = v_tile + B * P, *dv_acc = dk_acc + B * P;
    float *q_tile = dv_acc + B * P, *do_tile = q_tile + B * HEAD_DIM, *ds_tile = do_tile + B * HEAD_DIM;
    float *lse_tile = ds_tile + B * (B + 1), *delta_tile = lse_tile + B;
    const index_t kv_head = blockIdx.y, head = kv_head * group;  // the group's first query head
    q += head * n_queries * HEAD_DIM;  grad_out += head * n_queries * HEAD_DIM;  dq += head * n_queries * HEAD_DIM;
    lse += head * n_queries;  delta += head * n_queries;
    k += kv_head * n_keys * HEAD_DIM;  v += kv_head * n_keys * HEAD_DIM;
    dk += kv_head * n_keys * HEAD_DIM;  dv += kv_head * n_keys * HEAD_DIM;
    const int k0 = blockIdx.x * B, row = threadIdx.x, key = k0 + row, offset = n_keys - n_queries;

    for (int i = threadIdx.x; i < B * HEAD_DIM; i += blockDim.x) {
        int r = i / HEAD_DIM, c = i % HEAD_DIM;
        bool inside = k0 + r < n_keys;
        k_tile[r * P + c] = inside ? k[(index_t)(k0 + r) * HEAD_DIM + c] : 0.f;
        v_tile[r * P + c] = inside ? v[(index_t)(k0 + r) * HEAD_DIM + c] : 0.f;
        dk_acc[r * P + c] = 0.f;
        dv_acc[r * P + c] = 0.f;
    }
    // The first query that sees key k0 is k0 - offset; earlier query tiles are skipped.
    const int first_q = causal ? max(0, k0 - offset) / B * B : 0;
    // Two barriers per query tile.  The one after the loads also guards this tile's loads:
    // the previous tile's q/dO/L/D were last read before its dS barrier, and its dS tile
    // (read after that barrier) is rewritten only after this tile's load barrier — also
    // when the previous tile belonged to the previous query head of the group.
    for (int member = 0; member < group; ++member) {  // the G query heads of this KV head
        for (int q0 = first_q; q0 < n_queries; q0 += B) {
            for (int i = threadIdx.x; i < B * HEAD_DIM; i += blockDim.x) {
                bool inside = q0 + i / HEAD_DIM < n_queries;
                q_tile[i] = inside ? q[(index_t)q0 * HEAD_DIM + i] : 0.f;
                do_tile[i] = inside ? grad_out[(index_t)q0 * HEAD_DIM + i] : 0.f;
            }
            if (row < B) {
                bool inside = q0 + row < n_queries;
                float l = inside ? lse[q0 + row] : 0.f;
                lse_tile[row] = l == NEG_INF ? 0.f : l;  // such rows are fully hidden anyway
                delta_tile[row] = inside ? delta[q0 + row] : 0.f;
            }
            __syncthreads();
            for (int i = 0; i < B; ++i) {  // this thread: key row `row`, every query of the tile
                const int query = q0 + i;
                float s = 0.f, dp = 0.f;
                for (int c = 0; c < HEAD_DIM; ++c) s += q_tile[i * HEAD_DIM + c] * k_tile[row * P + c];
                bool hidden = query >= n_queries || key_hidden(key, query, n_keys, causal, offset);
                float p = hidden ? 0.f : expf(s * scale - lse_tile[i]);         // P = exp(S - L)
                for (int c = 0; c < HEAD_DIM; ++c) dv_acc[row * P + c] += p * do_tile[i * HEAD_DIM + c];  // dV += Pᵀ dO
                for (int c = 0; c < HEAD_DIM; ++c) dp += do_tile[i * HEAD_DIM + c] * v_tile[row * P + c];  // dP = dO Vᵀ
                float ds = p * (dp - delta_tile[i]);                               // dS = P∘(dP - D)
                ds_tile[i * (B + 1) + row] = ds;
                for (int c = 0; c < HEAD_DIM; ++c) dk_acc[row * P + c] += ds * q_tile[i * HEAD_DIM + c] * scale;
            }
            __syncthreads();  // the dS tile is complete
            // dQ_i += dS_ij K_j · scale: now thread `row` owns query q0 + row.
            if (q0 + row < n_queries) {
                for (int c = 0; c < HEAD_DIM; ++c) {
                    float sum = 0.f;
                    for (int j = 0; j < B; ++j) sum += ds_tile[row * (B + 1) + j] * k_tile[j * P + c];
                    atomicAdd(&dq[(index_t)(q0 + row) * HEAD_DIM + c], sum * scale);
                }
            }
        }
        q += n_queries * HEAD_DIM;  grad_out += n_queries * HEAD_DIM;  dq += n_queries * HEAD_DIM;  // next head
        lse += n_queries;  delta += n_queries;
    }
    // dK, dV rows were last accumulated before the last dS barrier (or only zeroed, by
    // the same thread that now writes them out): no barrier needed.
    for (int i = threadIdx.x; i < B * HEAD_DIM; i += blockDim.x) {
        int r = i / HEAD_DIM, c = i % HEAD_DIM;
        if (k0 + r < n_keys) {
            dk[(index_t)(k0 + r) * HEAD_DIM + c] = dk_acc[r * P + c];
            dv[(index_t)(k0 + r) * HEAD_DIM + c] = dv_acc[r * P + c];
        }
    }
}
