// The fused elementwise ops of minipar's autograd as CUDA C: LayerNorm, tanh GELU and the
// causal attention softmax, forward and backward, and AdamW's update, each the formula of
// its NumPy op (minipar/autograd/ops_nn.py, ops_math.py, minipar/optim.py) in one pass
// over memory instead of a chain of array kernels.  Compiled at run time by CuPy (cupy.RawModule, NVRTC) through
// fused_cuda.py, once per storage type, which it selects with one line before this file:
//
//   STORAGE_F32   storage_t = float
//   STORAGE_F16   storage_t = fp16 as its raw 16 bits (IEEE binary16)
//   STORAGE_BF16  storage_t = bf16 as its raw 16 bits (the upper half of an fp32)
//
// The 16-bit types are raw bits, not __half / __nv_bfloat16: NVRTC under CuPy then needs
// no CUDA include path, and g++ compiles the same text for the CPU emulator
// (minipar/kernels/emulator).  Arithmetic is always fp32: to_float on every load,
// from_float (round to nearest even) on every store — the mixed-precision rule of the
// NumPy ops, which take statistics of half values in float32.
//
// Row kernels run one block per row (blockDim.x a multiple of 32, at most MAX_THREADS),
// each thread striding over the row; block_sum / block_max combine one value per
// thread through warp shuffles and warp_partials, 32 floats of dynamic shared memory.
// A row is read two or three times; the later reads hit L1/L2.

#if defined(STORAGE_F16) + defined(STORAGE_BF16) + defined(STORAGE_F32) != 1
#error "define exactly one of STORAGE_F32, STORAGE_F16, STORAGE_BF16 (fused_cuda.kernel_source does)"
#endif

#define MAX_THREADS 256
#define FULL_WARP 0xffffffffu
#define NEG_INF (__uint_as_float(0xff800000u))
typedef long long index_t;

#if defined(STORAGE_F32)
typedef float storage_t;
__device__ __forceinline__ float to_float(storage_t v) { return v; }
__device__ __forceinline__ storage_t from_float(float f) { return f; }
#elif defined(STORAGE_F16)
typedef unsigned short storage_t;
// binary16 -> fp32, exactly: exponent and mantissa moved to fp32's positions, then × 2^112
// moves the exponent bias from 15 to 127 (subnormal halves land on normal floats); the
// all-ones exponent (inf, NaN) is set by hand.
__device__ __forceinline__ float to_float(storage_t h) {
    const unsigned moved = (unsigned)(h & 0x7fffu) << 13;
    float f = __uint_as_float(moved) * __uint_as_float(0x77800000u);  // 2^112
    if ((h & 0x7c00u) == 0x7c00u) f = __uint_as_float(moved | 0x7f800000u);
    return __uint_as_float(__float_as_uint(f) | (unsigned)(h & 0x8000u) << 16);
}
__device__ __forceinline__ storage_t from_float(float f) {
    unsigned short h;
    asm("cvt.rn.f16.f32 %0, %1;" : "=h"(h) : "f"(f));
    return h;
}
#else
typedef unsigned short storage_t;
__device__ __forceinline__ float to_float(storage_t b) { return __uint_as_float((unsigned)b << 16); }
// fp32 -> bf16, round to nearest even: add 0x7fff plus the lowest kept bit, keep the top half.
__device__ __forceinline__ storage_t from_float(float f) {
    const unsigned u = __float_as_uint(f);
    if ((u & 0x7fffffffu) > 0x7f800000u) return (storage_t)((u >> 16) | 0x40u);  // NaN stays NaN
    return (storage_t)((u + 0x7fffu + ((u >> 16) & 1u)) >> 16);
}
#endif

// ---- block-wide reductions -------------------------------------------------------------
// Every thread passes one value and gets the combination over the block: a butterfly in
// each warp (after it every lane holds its warp's total), lane 0 of each warp writes to
// warp_partials, and every warp reduces the partials itself.  The first __syncthreads
// keeps a previous call's readers ahead of this call's writers.
__device__ __forceinline__ float combine(float a, float b, bool take_max) { return take_max ? fmaxf(a, b) : a + b; }

__device__ float block_reduce(float v, bool take_max) {
    extern __shared__ float warp_partials[];
    const int lane = threadIdx.x % 32, warp = threadIdx.x / 32, warps = blockDim.x / 32;
    for (int o = 16; o > 0; o >>= 1) v = combine(v, __shfl_xor_sync(FULL_WARP, v, o), take_max);
    __syncthreads();
    if (lane == 0) warp_partials[warp] = v;
    __syncthreads();
    v = lane < warps ? warp_partials[lane] : (take_max ? NEG_INF : 0.f);
    for (int o = 16; o > 0; o >>= 1) v = combine(v, __shfl_xor_sync(FULL_WARP, v, o), take_max);
    return v;
}
__device__ __forceinline__ float block_sum(float v) { return block_reduce(v, false); }
__device__ __forceinline__ float block_max(float v) { return block_reduce(v, true); }

// ---- LayerNorm (one block per row of d values) -------------------------------------------
// μ = Σx/d, σ = sqrt(Σ(x-μ)²/d + eps), x̂ = (x-μ)/σ, y = x̂·w + b.  Saves x̂ (fp32) and
// inv_sigma = 1/σ (fp32, one per row): what LayerNorm.backward reads.
extern "C" __global__ void __launch_bounds__(MAX_THREADS)
layernorm_forward(const storage_t* __restrict__ x, const storage_t* __restrict__ weight,
                  const storage_t* __restrict__ bias, storage_t* __restrict__ y,
                  float* __restrict__ xhat, float* __restrict__ inv_sigma, int d, float eps) {
    const index_t start = (index_t)blockIdx.x * d;
    x += start;  y += start;  xhat += start;
    float sum = 0.f;
    for (int j = threadIdx.x; j < d; j += blockDim.x) sum += to_float(x[j]);
    const float mean = block_sum(sum) / d;
    float squares = 0.f;  // two passes, as the NumPy op: no cancellation in E[x²] - μ²
    for (int j = threadIdx.x; j < d; j += blockDim.x) {
        const float c = to_float(x[j]) - mean;
        squares += c * c;
    }
    const float inv = 1.f / sqrtf(block_sum(squares) / d + eps);
    if (threadIdx.x == 0) inv_sigma[blockIdx.x] = inv;
    for (int j = threadIdx.x; j < d; j += blockDim.x) {
        const float xh = (to_float(x[j]) - mean) * inv;
        xhat[j] = xh;
        y[j] = from_float(xh * to_float(weight[j]) + to_float(bias[j]));
    }
}

// With ĝ = dy·w:  dx = (ĝ - mean(ĝ) - x̂·mean(ĝ·x̂)) · inv_sigma.  (dw = Σ_rows dy·x̂ and
// db = Σ_rows dy are sums down columns: fused_cuda leaves them to array reductions.)
extern "C" __global__ void __launch_bounds__(MAX_THREADS)
layernorm_backward(const storage_t* __restrict__ grad, const float* __restrict__ xhat,
                   const float* __restrict__ inv_sigma, const storage_t* __restrict__ weight,
                   storage_t* __restrict__ dx, int d) {
    const index_t start = (index_t)blockIdx.x * d;
    grad += start;  xhat += start;  dx += start;
    float sum_g = 0.f, sum_gx = 0.f;
    for (int j = threadIdx.x; j < d; j += blockDim.x) {
        const float gh = to_float(grad[j]) * to_float(weight[j]);
        sum_g += gh;
        sum_gx += gh * xhat[j];
    }
    const float mean_g = block_sum(sum_g) / d, mean_gx = block_sum(sum_gx) / d;
    const float inv = inv_sigma[blockIdx.x];
    for (int j = threadIdx.x; j < d; j += blockDim.x) {
        const float gh = to_float(grad[j]) * to_float(weight[j]);
        dx[j] = from_float((gh - mean_g - xhat[j] * mean_gx) * inv);
    }
}

// ---- GELU, tanh form (element by element, a grid-stride loop over n values) --------------
// u = c·(x + 0.044715·x³), c = sqrt(2/π);  t = tanh(u);  y = 0.5·x·(1 + t).  Saves t.
// dx = dy · 0.5·((1 + t) + x·(1 - t²)·c·(1 + 3·0.044715·x²)).
#define GELU_C 0.7978845608028654f           // sqrt(2/π)
#define GELU_CA 0.035677408136300125f        // 0.044715·sqrt(2/π)
#define GELU_3CA 0.10703222440890037f        // 3·0.044715·sqrt(2/π)

extern "C" __global__ void __launch_bounds__(MAX_THREADS)
gelu_forward(const storage_t* __restrict__ x, storage_t* __restrict__ y, storage_t* __restrict__ t, int n) {
    const index_t stride = (index_t)gridDim.x * blockDim.x;
    for (index_t i = (index_t)blockIdx.x * blockDim.x + threadIdx.x; i < n; i += stride) {
        const float v = to_float(x[i]);
        const storage_t th = from_float(tanhf(v * (GELU_C + GELU_CA * v * v)));
        t[i] = th;  // y from the stored t, as the NumPy op computes y from its t array
        y[i] = from_float(0.5f * v * (1.f + to_float(th)));
    }
}

extern "C" __global__ void __launch_bounds__(MAX_THREADS)
gelu_backward(const storage_t* __restrict__ x, const storage_t* __restrict__ t,
              const storage_t* __restrict__ grad, storage_t* __restrict__ dx, int n) {
    const index_t stride = (index_t)gridDim.x * blockDim.x;
    for (index_t i = (index_t)blockIdx.x * blockDim.x + threadIdx.x; i < n; i += stride) {
        const float v = to_float(x[i]), th = to_float(t[i]);
        const float slope = 0.5f * ((1.f + th) + v * (1.f - th * th) * (GELU_C + GELU_3CA * v * v));
        dx[i] = from_float(to_float(grad[i]) * slope);
    }
}

// ---- AdamW (a grid-stride loop over a flat parameter, like GELU) --------------------------
// m = β1·m + (1-β1)·g;  v = β2·v + (1-β2)·g²;  p -= lr·(m·ŝ1 / (sqrt(v·ŝ2) + eps) + wd·p)
// with ŝ1 = 1/(1-β1^t), ŝ2 = 1/(1-β2^t) and 1-β rounded once, from the caller
// (optim.adamw_update); wd is weight_decay, or decay[i] per element (a flat bucket's mask:
// 0 on biases and norms; without one, decay is any array and is not read).  p, m, v are read
// and written once each; the update uses m and v as stored, as the NumPy op does.
extern "C" __global__ void __launch_bounds__(MAX_THREADS)
adamw_update(storage_t* __restrict__ p, const storage_t* __restrict__ g, storage_t* __restrict__ m,
             storage_t* __restrict__ v, const storage_t* __restrict__ decay, int decay_per_element,
             int n, float lr, float beta1, float one_minus_beta1, float beta2, float one_minus_beta2,
             float eps, float weight_decay, float m_hat_scale, float v_hat_scale) {
    const index_t stride = (index_t)gridDim.x * blockDim.x;
    for (index_t i = (index_t)blockIdx.x * blockDim.x + threadIdx.x; i < n; i += stride) {
        const float gi = to_float(g[i]), pi = to_float(p[i]);
        const storage_t mi = from_float(beta1 * to_float(m[i]) + one_minus_beta1 * gi);
        const storage_t vi = from_float(beta2 * to_float(v[i]) + one_minus_beta2 * (gi * gi));
        m[i] = mi;
        v[i] = vi;
        const float step = to_float(mi) * m_hat_scale / (sqrtf(to_float(vi) * v_hat_scale) + eps);
        const float wd = decay_per_element ? to_float(decay[i]) : weight_decay;
        p[i] = from_float(pi - lr * (step + wd * pi));
    }
}

// ---- unscale and check (the loss scaler's pass over one gradient) -------------------------
// g *= inv_scale in place, and flag[0] += 1 once per thread that met an inf or NaN (exponent
// bits all ones) after the multiply: flag > 0 iff some element is non-finite.  One atomic per
// thread, only on an overflow; the host reads the flag once per step with the norm.
extern "C" __global__ void __launch_bounds__(MAX_THREADS)
unscale_check(storage_t* __restrict__ g, float* __restrict__ flag, int n, float inv_scale) {
    const index_t stride = (index_t)gridDim.x * blockDim.x;
    bool bad = false;
    for (index_t i = (index_t)blockIdx.x * blockDim.x + threadIdx.x; i < n; i += stride) {
        const float v = to_float(g[i]) * inv_scale;
        g[i] = from_float(v);
        bad |= (__float_as_uint(v) & 0x7f800000u) == 0x7f800000u;
    }
    if (bad) atomicAdd(flag, 1.f);
}

// ---- unscale, check and square many tensors in one launch --------------------------------
// The multi-tensor form of the pass above (PyTorch's _amp_foreach_non_finite_check_and_unscale_
// with the norm's squares folded in): g holds many gradients back to back (the fp32 master
// gradients of amp.MixedPrecision), tensor t ending before ends[t], with norm weight
// weights[t].  g *= inv_scale in place (no write when inv_scale = 1), flag[0] > 0 iff some
// element is non-finite, squares[0] += Σ_t weights[t] Σ_{i in t} g_i² (fp32, one atomic per
// block).  The ends only grow and so does i, so a thread's tensor index only moves forward.
extern "C" __global__ void __launch_bounds__(MAX_THREADS)
unscale_check_norm(storage_t* __restrict__ g, const int* __restrict__ ends,
                   const float* __restrict__ weights, int n_tensors, int n, float inv_scale,
                   float* __restrict__ flag, float* __restrict__ squares) {
    const index_t stride = (index_t)gridDim.x * blockDim.x;
    bool bad = false;
    float sum = 0.f;
    int t = 0;
    for (index_t i = (index_t)blockIdx.x * blockDim.x + threadIdx.x; i < n; i += stride) {
        while (t < n_tensors - 1 && i >= ends[t]) ++t;
        const float v = to_float(g[i]) * inv_scale;
        if (inv_scale != 1.f) g[i] = from_float(v);
        bad |= (__float_as_uint(v) & 0x7f800000u) == 0x7f800000u;
        sum += weights[t] * v * v;
    }
    if (bad) atomicAdd(flag, 1.f);
    sum = block_sum(sum);
    if (threadIdx.x == 0) atomicAdd(squares, sum);
}

// ---- attention softmax (one block per row: one query of one (batch, head)) ---------------
// P = softmax(scale·S + M) over the keys; with causal, M = -inf where key j > query i +
// (Nk - Nq), so row i sees keys 0 .. i + Nk - Nq.  A row that sees no key gets P = 0
// (the flash kernels' convention; the NumPy op gives NaN there).
extern "C" __global__ void __launch_bounds__(MAX_THREADS)
softmax_forward(const storage_t* __restrict__ scores, storage_t* __restrict__ probs,
                int n_queries, int n_keys, int causal, float scale) {
    const index_t start = (index_t)blockIdx.x * n_keys;
    scores += start;  probs += start;
    const int query = (int)(blockIdx.x % n_queries);
    const int visible = causal ? max(0, min(n_keys, query + n_keys - n_queries + 1)) : n_keys;
    float row_max = NEG_INF;
    for (int j = threadIdx.x; j < visible; j += blockDim.x) row_max = fmaxf(row_max, scale * to_float(scores[j]));
    row_max = block_max(row_max);
    float sum = 0.f;
    for (int j = threadIdx.x; j < visible; j += blockDim.x) sum += expf(scale * to_float(scores[j]) - row_max);
    sum = block_sum(sum);
    const float inv_sum = visible > 0 ? 1.f / sum : 0.f;
    for (int j = threadIdx.x; j < n_keys; j += blockDim.x)
        probs[j] = from_float(j < visible ? expf(scale * to_float(scores[j]) - row_max) * inv_sum : 0.f);
}

// dS = scale · P ∘ (dP - Σ_j dP∘P), row by row.  Masked keys have P = 0, so dS = 0 there:
// the mask needs no second look.
extern "C" __global__ void __launch_bounds__(MAX_THREADS)
softmax_backward(const storage_t* __restrict__ probs, const storage_t* __restrict__ grad,
                 storage_t* __restrict__ dscores, int n_keys, float scale) {
    const index_t start = (index_t)blockIdx.x * n_keys;
    probs += start;  grad += start;  dscores += start;
    float dot = 0.f;
    for (int j = threadIdx.x; j < n_keys; j += blockDim.x) dot += to_float(grad[j]) * to_float(probs[j]);
    dot = block_sum(dot);
    for (int j = threadIdx.x; j < n_keys; j += blockDim.x)
        dscores[j] = from_float(scale * to_float(probs[j]) * (to_float(grad[j]) - dot));
}
