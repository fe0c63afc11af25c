"""How far the emulated CUDA flash kernels are from the float64 reference, shape by shape.

    python -m minipar.kernels.emulator.accuracy --dtype bfloat16 1,2,1,40,70,64 1,1,1,256,256,128

Each shape is ``B,H,Hkv,Nq,Nk,d`` (Hkv < H: grouped-query).  Unit-normal inputs are drawn,
rounded to ``--dtype``, and run forward and backward through ``flash_cuda``'s launch code
with the kernels emulated on the CPU (``EmulatedKernels``), then through
``flash_reference`` in float64 from the same rounded inputs.  Printed per shape, causal
and not: the largest error of out, dQ, dK, dV over the largest value of the reference (at
least 1: the measure tests/test_flash_emulated.py bounds), and of the log-sum-exp L.
Slow: a 256 × 256, d = 128 shape takes minutes.
"""
from __future__ import annotations

import argparse

import numpy as np

from minipar.kernels import flash_cuda
from minipar.kernels.emulator import EmulatedKernels
from minipar.kernels.flash_reference import flash_backward_reference, flash_forward_reference


def relative_error(got, want):
    """max |got - want| / max(max |want|, 1)."""
    return float(np.abs(got.astype(np.float64) - want).max() / max(1.0, float(np.abs(want).max())))


def errors(dtype, batch, heads, kv_heads, n_queries, n_keys, head_dim, causal, seed=0):
    """{"out", "dq", "dk", "dv", "lse"}: the emulated kernels' errors (see the module doc)."""
    rng = np.random.default_rng(seed)
    q_shape, kv_shape = (batch, heads, n_queries, head_dim), (batch, kv_heads, n_keys, head_dim)
    q, k, v, grad_out = (rng.standard_normal(s).astype(dtype) for s in (q_shape, kv_shape, kv_shape, q_shape))
    kernels = EmulatedKernels()
    out, lse = flash_cuda.forward(q, k, v, causal, kernels=kernels)
    grads = flash_cuda.backward(q, k, v, out, lse, grad_out, causal, kernels=kernels)
    q64, k64, v64, g64 = (a.astype(np.float64) for a in (q, k, v, grad_out))
    want_out, want_lse = flash_forward_reference(q64, k64, v64, causal)
    want_grads = flash_backward_reference(q64, k64, v64, want_out, want_lse, g64, causal)
    found = {"out": relative_error(out, want_out)}
    found.update((name, relative_error(g, w)) for name, g, w in zip(("dq", "dk", "dv"), grads, want_grads))
    seen = np.isfinite(want_lse)
    found["lse"] = float(np.abs(lse[seen] - want_lse[seen]).max()) if seen.any() else 0.0
    return found


def main(argv=None):
    parser = argparse.ArgumentParser(prog="python -m minipar.kernels.emulator.accuracy",
                                     description=__doc__.split("\n")[0])
    parser.add_argument("--dtype", default="bfloat16", choices=sorted(flash_cuda.KINDS),
                        help="the inputs' dtype (default %(default)s)")
    parser.add_argument("shapes", nargs="+", metavar="B,H,Hkv,Nq,Nk,d")
    args = parser.parse_args(argv)
    if args.dtype == "bfloat16":
        import ml_dtypes  # noqa: F401  (registers the dtype with NumPy)
    for text in args.shapes:
        shape = tuple(int(n) for n in text.split(",") if n.strip().isdigit())
        if len(shape) != 6 or 0 in shape or shape[1] % shape[2]:
            parser.error(f"a shape is six positive numbers B,H,Hkv,Nq,Nk,d with Hkv dividing H, got {text!r}")
        if not flash_cuda.supports(np.dtype(args.dtype), shape[-1]):
            parser.error(flash_cuda.missing_kernel(np.dtype(args.dtype), shape[-1]))
        for causal in (False, True):
            found = errors(args.dtype, *shape, causal)
            print(f"{args.dtype} {text:>18} {'causal' if causal else 'full  '}  "
                  + "  ".join(f"{name} {value:.2e}" for name, value in found.items()), flush=True)


if __name__ == "__main__":
    main()
