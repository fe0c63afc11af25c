"""``flash_attention(q, k, v, causal=True)``: attention as one autograd Function.

    from minipar.kernels.flash_attention import flash_attention
    out = flash_attention(q, k, v, causal=True)     # q (B, H, N, d), k, v (B, Hkv, N, d) -> (B, H, N, d)
    out.backward(grad)                               # dq, dk, dv from the saved log-sum-exp

Grouped-query attention: k and v may have Hkv heads with H a multiple of Hkv; query
head h reads KV head h // (H/Hkv) in place (no repeated K/V anywhere), and the
gradient of a KV head is the sum over its group's query heads.  Hkv == H is ordinary
multi-head attention.

Forward saves only q, k, v, the output and the log-sum-exp L (B·H·N numbers), never
the N×N probabilities: backward rebuilds each tile as P = exp(S - L).  Which code
runs is decided per call:

- NumPy backend: the tiled array reference (``flash_reference``);
- CuPy backend: the CUDA kernels (``flash_cuda``) — fp16 and bf16 on tensor cores,
  fp32 in the plain kernel — when the dtype and head dim are ones they are built for,
  otherwise the same array reference running on the GPU through ``xp``: far slower (a
  few small launches per tile), so ``describe`` says which runs, and why, for the
  header of a training run.

``implementation=`` (an argument of every call, held by ``nn.AttentionCore``; no global)
may be ``"reference"`` to force the array code on either backend (the GPU tests compare
the two that way), or ``"emulated"`` to run the CUDA kernels on NumPy arrays through
``kernels.emulator`` (slow; for testing without a GPU); None chooses by backend.
"""
from __future__ import annotations

from minipar.autograd import Function
from minipar.backend import backend_name
from minipar.kernels import flash_reference

IMPLEMENTATIONS = (None, "reference", "emulated")


def _cuda_kernels(q, implementation=None):
    """What launches the CUDA kernels for this call (see module doc), or None."""
    from minipar.kernels import flash_cuda
    if implementation not in IMPLEMENTATIONS:
        raise ValueError(f"implementation must be None, 'reference' or 'emulated', "
                         f"got {implementation!r}")
    supported = flash_cuda.supports(q.dtype, q.shape[-1])
    if implementation == "emulated":
        if not supported or backend_name() != "numpy":
            raise ValueError(f"'emulated' runs the CUDA kernels on NumPy arrays of float32, float16 or "
                             f"bfloat16 (head dim as flash_cuda.supports); got {backend_name()} {q.dtype}, "
                             f"d={q.shape[-1]}")
        from minipar.kernels.emulator import EmulatedKernels
        return EmulatedKernels()
    if implementation is None and backend_name() == "cupy" and supported:
        return flash_cuda.CupyKernels()
    return None


def describe(backend, dtype, head_dim):
    """Which code runs flash attention on ``backend`` ("numpy", "cupy") for this dtype and
    head dim, in words: the CUDA kernels, or the array reference and why no kernel runs
    (the choice ``_cuda_kernels`` makes with ``implementation=None``)."""
    from minipar.kernels import flash_cuda
    if backend != "cupy":
        return f"flash, the tiled array reference (the CUDA kernels need the cupy backend, not {backend})"
    why = flash_cuda.missing_kernel(dtype, head_dim)
    if why is not None:
        return f"flash, the tiled array reference on the GPU (many small launches, slow): {why}"
    kind = flash_cuda.KINDS[str(dtype)]
    how = "tensor cores" if kind in flash_cuda.TENSOR_CORE_KINDS else "one thread per query row"
    return f"flash, CUDA kernels flash_forward_{kind} / flash_backward_{kind} (d={head_dim}, {how})"


def _check_shapes(q, k, v):
    if q.ndim != 4 or k.ndim != 4 or v.ndim != 4:
        raise ValueError(f"flash_attention wants (B, H, N, d) arrays, got {q.shape}, {k.shape}, {v.shape}")
    if k.shape != v.shape or q.shape[0] != k.shape[0] or q.shape[-1] != k.shape[-1]:
        raise ValueError(f"q {q.shape}, k {k.shape}, v {v.shape}: batch and head dim must "
                         "agree and k, v must have the same shape")
    if k.shape[1] < 1 or q.shape[1] % k.shape[1]:
        raise ValueError(f"q has {q.shape[1]} heads and k, v {k.shape[1]}: the query heads must be "
                         "a whole multiple of the key/value heads")


def flash_forward(q, k, v, causal=True, implementation=None):
    """Arrays in; ``(out, lse)`` out, from the kernel or the reference (see module doc)."""
    _check_shapes(q, k, v)
    kernels = _cuda_kernels(q, implementation)
    if kernels is not None:
        from minipar.kernels import flash_cuda
        return flash_cuda.forward(q, k, v, causal, kernels=kernels)
    return flash_reference.flash_forward_reference(q, k, v, causal)


def flash_backward(q, k, v, out, lse, grad_out, causal=True, implementation=None):
    """Arrays in; ``(dq, dk, dv)`` out."""
    kernels = _cuda_kernels(q, implementation)
    if kernels is not None:
        from minipar.kernels import flash_cuda
        return flash_cuda.backward(q, k, v, out, lse, grad_out, causal, kernels=kernels)
    return flash_reference.flash_backward_reference(q, k, v, out, lse, grad_out, causal)


class FlashAttention(Function):
    """O = softmax(Q Kᵀ/sqrt(d) + causal mask) V, saving (q, k, v, O, L) for backward."""

    @staticmethod
    def forward(ctx, q, k, v, causal=True, implementation=None):
        out, lse = flash_forward(q, k, v, causal, implementation)
        ctx.save_for_backward(q, k, v, out, lse)
        ctx.causal, ctx.implementation = causal, implementation
        return out

    @staticmethod
    def backward(ctx, grad_out):
        q, k, v, out, lse = ctx.saved
        dq, dk, dv = flash_backward(q, k, v, out, lse, grad_out, ctx.causal, ctx.implementation)
        return dq, dk, dv


def flash_attention(q, k, v, causal=True, implementation=None):
    """Tensors (B, H, Nq, d), (B, Hkv, Nk, d), (B, Hkv, Nk, d) -> Tensor (B, H, Nq, d), H % Hkv == 0.

    Causal masking is bottom-right aligned (query i sees key j iff j <= i + Nk - Nq);
    rows that see no key give 0.  ``implementation``: see the module doc.
    """
    return FlashAttention.apply(q, k, v, causal=causal, implementation=implementation)


dense_attention = flash_reference.dense_attention
