"""Launching the fused elementwise kernels (``fused_elementwise.cu``) from CuPy.

LayerNorm, the tanh GELU and the causal attention softmax are each one kernel per
direction, and AdamW's update one kernel, instead of a chain of array ops (one pass over memory where CuPy's array code
makes five to ten).  The autograd ops (``ops_nn.LayerNorm``, ``ops_attention.AttentionSoftmax``,
``ops_math.Gelu``) call these functions on the CuPy backend when ``supports`` says yes;
each returns what the NumPy math returns, so forward and backward keep one contract:

    layernorm_forward(x, w, b, eps)      -> y, x̂ (fp32), inv_sigma (rows, 1) fp32
    layernorm_backward(dy, x̂, inv_sigma, w, needs) -> dx, dw = Σ dy·x̂, db = Σ dy
    gelu_forward(x) -> y, t = tanh(u);    gelu_backward(x, t, dy) -> dx
    attention_softmax_forward(S, scale, causal) -> P;  attention_softmax_backward(P, dP, scale) -> dS
    adamw_update(p, g, m, v, lr, β1, β2, eps, wd, ŝ1, ŝ2)   p, m, v in place; wd a number or like p
    unscale_check(g, inv_scale, flag)    g *= inv_scale in place; flag[0] > 0 if g has inf/NaN
    unscale_check_norm(flat, ends, weights, inv_scale, flag, squares)   the same over many
                                         tensors back to back, one launch, squares[0] += Σ w·g²

The source is compiled once per storage type by ``cupy.RawModule`` (NVRTC; CuPy caches
the binary on disk), the type chosen by a ``#define`` line put before the file, so the
text is the whole cache key.  Launch geometry:

    row kernels   grid = rows, one block per row, threads = the row length rounded up to
                  a warp, at most MAX_THREADS; 32 floats of dynamic shared memory
    GELU, AdamW   grid-stride loop, STRIDE_THREADS per block, at most STRIDE_MAX_BLOCKS blocks

``kernels=`` (default ``CupyKernels()``) is what launches: ``EmulatedKernels()`` runs the
same launch code on NumPy arrays, the .cu file executed by the CPU emulator
(``minipar.kernels.emulator``), so the tests check this file without a GPU.

Importing this module registers it with the autograd ops for the CuPy backend
(``ops_math.use_fused_kernels``; ``import minipar.nn`` imports it): autograd may not
import kernels, which are built on it.  ``MINIPAR_CUDA_KERNELS=0`` in the environment
leaves them unregistered (the array code runs).
"""
from __future__ import annotations

import functools
import os
import sys
from pathlib import Path

from minipar.autograd import ops_math
from minipar.autograd.ops_nn import layernorm_param_grads
from minipar.kernels import emulator

KERNEL_DIR = Path(__file__).resolve().parent
SOURCE = KERNEL_DIR / "fused_elementwise.cu"
OPS = ("layernorm", "gelu", "attention_softmax", "adamw", "unscale_check", "unscale_check_norm")
KINDS = {"float32": "f32", "float16": "f16", "bfloat16": "bf16"}  # dtype name -> build
MAX_THREADS = 256            # = MAX_THREADS of the .cu file (its __launch_bounds__)
REDUCE_SHARED_BYTES = 32 * 4  # warp_partials: one float per warp, up to 32 warps
STRIDE_THREADS, STRIDE_MAX_BLOCKS = 256, 8192  # 2M threads: every SM full, then the loop strides
MAX_ELEMENTS = 2**31 - 1     # the kernels count elements and rows in int


def supports(dtype, *other_dtypes, elements=0):
    """Whether the fused kernels take these arrays: every dtype the same one of float32,
    float16, bfloat16 (else the array code runs, e.g. float64 or mixed dtypes), and no
    more than 2^31 - 1 elements."""
    name = str(dtype)
    return name in KINDS and all(str(d) == name for d in other_dtypes) and elements <= MAX_ELEMENTS


def kernel_source(kind):
    """The text NVRTC (or the emulator) compiles for storage ``kind``: "f32", "f16", "bf16"."""
    return f'#define STORAGE_{kind.upper()}\n#line 1 "{SOURCE.name}"\n' + SOURCE.read_text()


@functools.lru_cache(maxsize=None)
def _module(kind):
    import cupy
    return cupy.RawModule(code=kernel_source(kind))


class CupyKernels:
    """The real thing: CuPy arrays, kernels compiled by NVRTC."""

    @property
    def xp(self):
        import cupy
        return cupy

    @staticmethod
    def get(name, kind):
        return _module(kind).get_function(name)


class EmulatedKernels(emulator.EmulatedKernels):
    """The same members on the CPU: NumPy arrays, the kernels run by the emulator.
    Options as ``minipar.kernels.emulator.EmulatedKernels`` (``check``: "memory" is
    ASan/UBSan, "race" TSan; ``schedule``, ``seed``, ``fill``); ``sources`` maps
    "f32"/"f16"/"bf16" to CUDA text to run instead of ``fused_elementwise.cu``."""

    def get(self, name, kind):
        source = self.sources.get(kind) or kernel_source(kind)
        program = emulator.build(source, 0, f"fused_{kind}", self.check)
        return emulator.EmulatedKernel(program, name, **self.options)


def _row_threads(n):
    """Threads for a row of n values: whole warps, one value each, at most MAX_THREADS."""
    return min(MAX_THREADS, max(32, -(-n // 32) * 32))


def _launch(kernels, name, dtype, blocks, threads, args, shared=REDUCE_SHARED_BYTES):
    """Every argument is an array or a 4-byte numpy scalar (a Python number would be passed
    as 64 bits)."""
    kernel = kernels.get(name, KINDS[str(dtype)])
    kernel((int(blocks),), (int(threads),), tuple(args), shared_mem=shared)


def _contiguous(kernels, *arrays):
    return [kernels.xp.ascontiguousarray(a) for a in arrays]


def layernorm_forward(x, weight, bias, eps=1e-5, kernels=None):
    """(y like x, x̂ (rows, d) fp32, inv_sigma (rows, 1) fp32) over the last axis of x."""
    kernels = kernels or CupyKernels()
    xp = kernels.xp
    d = x.shape[-1]
    x2, weight, bias = _contiguous(kernels, x.reshape(-1, d), weight, bias)
    rows = x2.shape[0]
    y = xp.empty(x2.shape, dtype=x.dtype)
    xhat = xp.empty(x2.shape, dtype=xp.float32)
    inv_sigma = xp.full((rows, 1), xp.nan, dtype=xp.float32)  # stays NaN only if d == 0
    if x2.size:
        _launch(kernels, "layernorm_forward", x.dtype, rows, _row_threads(d),
                (x2, weight, bias, y, xhat, inv_sigma, xp.int32(d), xp.float32(eps)))
    return y.reshape(x.shape), xhat, inv_sigma


def layernorm_backward(grad, xhat, inv_sigma, weight, needs=(True, True, True), kernels=None):
    """(dx, dw, db), None where ``needs`` (for x, w, b) is False.  dx by the kernel; dw and
    db are sums over rows, taken as the NumPy op takes them (``layernorm_param_grads``)."""
    kernels = kernels or CupyKernels()
    xp = kernels.xp
    rows, d = xhat.shape
    g2 = grad.reshape(rows, d)
    gw, gb = layernorm_param_grads(g2, xhat, weight.dtype, needs[1:])
    gx = None
    if needs[0]:
        g2, xhat, inv_sigma, weight = _contiguous(kernels, g2, xhat, inv_sigma, weight)
        gx = xp.empty(g2.shape, dtype=grad.dtype)
        if g2.size:
            _launch(kernels, "layernorm_backward", grad.dtype, rows, _row_threads(d),
                    (g2, xhat, inv_sigma, weight, gx, xp.int32(d)))
        gx = gx.reshape(grad.shape)
    return gx, gw, gb


def _stride_blocks(n):
    return min(STRIDE_MAX_BLOCKS, max(1, -(-n // STRIDE_THREADS)))


def gelu_forward(x, kernels=None):
    """(y, t), both like x: y = 0.5·x·(1 + t), t = tanh(c·(x + 0.044715·x³))."""
    kernels = kernels or CupyKernels()
    xp = kernels.xp
    (flat,) = _contiguous(kernels, x.reshape(-1))
    y, t = xp.empty_like(flat), xp.empty_like(flat)
    if flat.size:
        _launch(kernels, "gelu_forward", x.dtype, _stride_blocks(flat.size), STRIDE_THREADS,
                (flat, y, t, xp.int32(flat.size)), shared=0)
    return y.reshape(x.shape), t.reshape(x.shape)


def gelu_backward(x, t, grad, kernels=None):
    """dx like x: dy · 0.5·((1 + t) + x·(1 - t²)·c·(1 + 3·0.044715·x²))."""
    kernels = kernels or CupyKernels()
    xp = kernels.xp
    xf, tf, gf = _contiguous(kernels, x.reshape(-1), t.reshape(-1), grad.reshape(-1))
    dx = xp.empty_like(xf)
    if xf.size:
        _launch(kernels, "gelu_backward", x.dtype, _stride_blocks(xf.size), STRIDE_THREADS,
                (xf, tf, gf, dx, xp.int32(xf.size)), shared=0)
    return dx.reshape(grad.shape)


def attention_softmax_forward(scores, scale, causal=True, kernels=None):
    """P like scores (..., Nq, Nk): softmax over keys of scale·S, keys j > i + Nk - Nq
    masked when causal.  A row that sees no key is 0 (the NumPy op gives NaN)."""
    kernels = kernels or CupyKernels()
    xp = kernels.xp
    n_queries, n_keys = scores.shape[-2:]
    (s2,) = _contiguous(kernels, scores.reshape(-1, n_keys))
    p = xp.empty(s2.shape, dtype=scores.dtype)
    if s2.size:
        _launch(kernels, "softmax_forward", scores.dtype, s2.shape[0], _row_threads(n_keys),
                (s2, p, xp.int32(n_queries), xp.int32(n_keys), xp.int32(bool(causal)), xp.float32(scale)))
    return p.reshape(scores.shape)


def attention_softmax_backward(probs, grad, scale, kernels=None):
    """dS in P's dtype (dP is cast to it first): scale · P ∘ (dP - Σ_keys dP∘P)."""
    kernels = kernels or CupyKernels()
    xp = kernels.xp
    n_keys = probs.shape[-1]
    grad = grad.astype(probs.dtype, copy=False)
    p2, g2 = _contiguous(kernels, probs.reshape(-1, n_keys), grad.reshape(-1, n_keys))
    ds = xp.empty(g2.shape, dtype=probs.dtype)
    if g2.size:
        _launch(kernels, "softmax_backward", probs.dtype, g2.shape[0], _row_threads(n_keys),
                (p2, g2, ds, xp.int32(n_keys), xp.float32(scale)))
    return ds.reshape(grad.shape)


def adamw_update(p, g, m, v, lr, beta1, beta2, eps, weight_decay, m_hat_scale, v_hat_scale,
                 kernels=None):
    """``optim.adamw_update`` as one kernel over p, g, m, v (contiguous, one shape and dtype),
    p, m, v read and written once each, in place.  ``weight_decay`` is a number or an array
    like p (a flat bucket's per-element mask)."""
    kernels = kernels or CupyKernels()
    xp = kernels.xp
    flat = [a.reshape(-1) for a in (p, g, m, v)]
    per_element = bool(getattr(weight_decay, "ndim", 0))
    if per_element:                             # an array like p, read at decay[i]
        if weight_decay.size != p.size:
            raise ValueError(f"weight decay has {weight_decay.size} values for {p.size} parameters")
        (decay,) = _contiguous(kernels, weight_decay.astype(p.dtype, copy=False).reshape(-1))
        weight_decay = 0.0
    else:                                       # a number, passed by value; decay is not read
        decay = flat[1]
    if p.size:
        scalars = [xp.float32(c) for c in (lr, beta1, 1 - beta1, beta2, 1 - beta2, eps, weight_decay,
                                           m_hat_scale, v_hat_scale)]
        _launch(kernels, "adamw_update", p.dtype, _stride_blocks(p.size), STRIDE_THREADS,
                (*flat, decay, xp.int32(per_element), xp.int32(p.size), *scalars), shared=0)


def unscale_check(g, inv_scale, flag, kernels=None):
    """The loss scaler's unscale and overflow check as one pass over a contiguous gradient:
    g *= inv_scale in place, and flag (a float32 device array) gets a positive ``flag[0]``
    if any element is inf or NaN; nothing is read back (PyTorch's GradScaler does the same
    in ``_amp_foreach_non_finite_check_and_unscale_``)."""
    kernels = kernels or CupyKernels()
    xp = kernels.xp
    if g.size:
        _launch(kernels, "unscale_check", g.dtype, _stride_blocks(g.size), STRIDE_THREADS,
                (g.reshape(-1), flag, xp.int32(g.size), xp.float32(inv_scale)), shared=0)


def unscale_check_norm(flat, ends, weights, inv_scale, flag, squares, kernels=None):
    """``unscale_check`` over many tensors in one launch, the global norm's squares with it.

    ``flat``: the tensors back to back (one contiguous buffer; ``amp.MixedPrecision``'s
    master gradients); ``ends`` (int32): where each ends; ``weights`` (float32): each one's
    w in ||g||² = Σ w·g².  flat *= inv_scale in place, ``flag[0]`` > 0 if any element is
    inf or NaN, ``squares[0]`` += Σ w·g² of the unscaled values (fp32, summed over blocks by
    atomics: the order, hence the last bits, may vary from run to run).  Nothing is read back."""
    kernels = kernels or CupyKernels()
    xp = kernels.xp
    if flat.size:
        _launch(kernels, "unscale_check_norm", flat.dtype, _stride_blocks(flat.size), STRIDE_THREADS,
                (flat.reshape(-1), ends, weights, xp.int32(len(ends)), xp.int32(flat.size),
                 xp.float32(inv_scale), flag, squares))


# MINIPAR_CUDA_KERNELS=0 leaves CuPy's array code in their place: an ablation on a GPU, and
# the CPU dry runs of the benchmarks, where each launch would be a CPU-emulator process
if os.environ.get("MINIPAR_CUDA_KERNELS", "1") != "0":
    ops_math.use_fused_kernels(sys.modules[__name__], backend="cupy")
