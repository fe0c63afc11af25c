"""Helpers shared by the emulated flash-attention tests: one forward + backward through
``flash_cuda``'s launch code, and the float64 reference of the same."""
import numpy as np

from minipar.kernels import flash_cuda
from minipar.kernels.flash_reference import flash_backward_reference, flash_forward_reference


def reference(q, k, v, grad_out, causal):
    """(out, lse, dq, dk, dv) in float64, from the (already rounded) inputs."""
    q, k, v, grad_out = (a.astype(np.float64) for a in (q, k, v, grad_out))
    out, lse = flash_forward_reference(q, k, v, causal)
    return (out, lse) + flash_backward_reference(q, k, v, out, lse, grad_out, causal)


def run(q, k, v, grad_out, causal, kernels):
    """(out, lse, dq, dk, dv) from the kernels ``kernels`` launches."""
    out, lse = flash_cuda.forward(q, k, v, causal, kernels=kernels)
    return (out, lse) + flash_cuda.backward(q, k, v, out, lse, grad_out, causal, kernels=kernels)
