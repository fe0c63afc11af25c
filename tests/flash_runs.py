"""Helpers shared by the emulated flash-attention tests: one forward + backward through
``flash_cuda``'s launch code, and the float64 reference of the same."""
import numpy as np

from minipar.kernels import flash_cuda
from minipar.kernels.flash_reference import flash_backward_reference, flash_forward_reference


def reference(q, k, v, grad_out, causal):
    """(out, lse, dq, dk, dv) in float64, from the (already rounded) inputs.

    Grouped-query inputs (k, v with H/G heads) are answered the long way round, so that
    the kernels' in-place grouping is checked against something that does not group:
    K and V repeated G times along the heads, plain multi-head attention, and the
    repeated heads' dK, dV summed back over each group."""
    q, k, v, grad_out = (a.astype(np.float64) for a in (q, k, v, grad_out))
    group = q.shape[1] // k.shape[1]
    k_rep, v_rep = np.repeat(k, group, axis=1), np.repeat(v, group, axis=1)
    out, lse = flash_forward_reference(q, k_rep, v_rep, causal)
    dq, dk, dv = flash_backward_reference(q, k_rep, v_rep, out, lse, grad_out, causal)
    fold = lambda g: g.reshape(k.shape[:2] + (group,) + k.shape[2:]).sum(axis=2)
    return out, lse, dq, fold(dk), fold(dv)


def run(q, k, v, grad_out, causal, kernels):
    """(out, lse, dq, dk, dv) from the kernels ``kernels`` launches."""
    out, lse = flash_cuda.forward(q, k, v, causal, kernels=kernels)
    return (out, lse) + flash_cuda.backward(q, k, v, out, lse, grad_out, causal, kernels=kernels)
