"""Fused elementwise CUDA kernels vs the array-code path on CuPy vs PyTorch.

    python benchmarks/fused_ops.py [--dtypes float32,float16] [--tokens 8192] [--repeats 30]

LayerNorm (tokens × 768), tanh GELU (tokens × 3072) and the causal attention softmax
(tokens/1024 × 12 heads × 1024 × 1024): GPT-2-small shapes.  Each op runs through minipar's
autograd ops, forward alone and forward + backward, three ways in one run on the same inputs:

    fused   the kernels of minipar/kernels/fused_cuda.py (what the CuPy backend runs)
    arrays  the same ops' array code on CuPy (the fused kernels unregistered for the run)
    torch   F.layer_norm, F.gelu(approximate="tanh"), softmax of scale·S masked by
            masked_fill — when PyTorch with CUDA is installed

and prints milliseconds per call, the ratios arrays/fused and torch/fused (above 1: the
fused kernel is faster), and the fused forward's effective bandwidth: the bytes it must
move (inputs read once, outputs and saved tensors written once) over its time.
Refuses to run without CuPy and a GPU.
"""
from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # run from a checkout without installing

import numpy as np  # noqa: E402

from minipar import backend  # noqa: E402
from minipar.autograd import Tensor, ops  # noqa: E402

D_MODEL, HEADS, SEQ = 768, 12, 1024
SCALE = 0.125


def seconds_per_call(fn, repeats):
    import cupy
    fn()  # warm-up: compilation, memory pool
    cupy.cuda.Device().synchronize()
    start = time.perf_counter()
    for _ in range(repeats):
        fn()
    cupy.cuda.Device().synchronize()  # every stream, PyTorch's included
    return (time.perf_counter() - start) / repeats


def cases(tokens):
    """(name, minipar op, input shapes, torch op maker, fused forward bytes per storage byte and per fp32)."""
    batch = max(1, tokens // SEQ)

    def torch_layer_norm(F):
        return lambda x, w, b: F.layer_norm(x, (D_MODEL,), w, b, 1e-5)

    def torch_gelu(F):
        return lambda x: F.gelu(x, approximate="tanh")

    def torch_softmax(F):
        import torch
        hidden = torch.ones(SEQ, SEQ, dtype=torch.bool, device="cuda").triu(1)
        return lambda s: torch.softmax((s * SCALE).masked_fill(hidden, float("-inf")), dim=-1)

    # bytes moved by the fused forward, as (storage-sized values, fp32 values) per element
    return [("layernorm", lambda x, w, b: ops.layer_norm(x, w, b, 1e-5),
             [(tokens, D_MODEL), (D_MODEL,), (D_MODEL,)], torch_layer_norm, (2, 1)),   # x, y | x̂
            ("gelu", ops.gelu, [(tokens, 4 * D_MODEL)], torch_gelu, (3, 0)),          # x, y, t
            ("softmax", lambda s: ops.attention_softmax(s, SCALE, True),
             [(batch, HEADS, SEQ, SEQ)], torch_softmax, (2, 0))]                        # S, P


def minipar_runners(op, arrays, grad):
    """forward(), forward_backward() of the minipar op on these device arrays."""
    def forward():
        return op(*[Tensor(a) for a in arrays])

    def forward_backward():
        tensors = [Tensor(a, requires_grad=True) for a in arrays]
        op(*tensors).backward(grad)

    return forward, forward_backward


def torch_runners(make, arrays, grad):
    """The PyTorch equivalents, or None when PyTorch with CUDA is missing."""
    try:
        import torch
        import torch.nn.functional as F
    except Exception as err:  # not installed, or installed without a usable CUDA build
        print(f"  (PyTorch unavailable, no torch column: {type(err).__name__}: {err})"[:160])
        return None
    if not torch.cuda.is_available():
        print("  (PyTorch has no CUDA here, no torch column)")
        return None
    op = make(F)
    try:
        inputs = [torch.as_tensor(a, device="cuda") for a in arrays]
        tgrad = torch.as_tensor(grad, device="cuda")
    except Exception as err:  # a dtype PyTorch cannot take from CuPy
        print(f"  (no torch column for {arrays[0].dtype}: {type(err).__name__}: {err})"[:160])
        return None

    def forward():
        with torch.no_grad():
            return op(*inputs)

    def forward_backward():
        leaves = [t.detach().requires_grad_(True) for t in inputs]
        op(*leaves).backward(tgrad)

    return forward, forward_backward


def run(args):
    import cupy
    from minipar.autograd import ops_math
    from minipar.kernels import fused_cuda
    backend.set_backend("cupy")
    props = cupy.cuda.runtime.getDeviceProperties(0)
    print(f"fused elementwise ops on {props['name'].decode()}, cupy {cupy.__version__}, "
          f"{args.tokens} tokens, {args.repeats} repeats")
    header = (f"{'op':<10}{'dtype':<10}{'pass':<8}{'fused ms':>10}{'arrays ms':>11}{'torch ms':>10}"
              f"{'arrays/fused':>14}{'torch/fused':>13}{'fused GB/s':>12}")
    rng = np.random.default_rng(0)
    for dtype_name in args.dtypes.split(","):
        if dtype_name == "bfloat16" and not hasattr(cupy, "bfloat16"):
            print("  (this CuPy has no bfloat16: skipped)")
            continue
        dtype = cupy.bfloat16 if dtype_name == "bfloat16" else np.dtype(dtype_name)
        print(header)
        for name, op, shapes, torch_make, (storage_values, fp32_values) in cases(args.tokens):
            arrays = [cupy.asarray(rng.standard_normal(s), dtype=cupy.float32).astype(dtype) for s in shapes]
            grad = cupy.asarray(rng.standard_normal(shapes[0]), dtype=cupy.float32).astype(dtype)
            times = {}
            for variant in ("fused", "arrays"):
                ops_math.use_fused_kernels(fused_cuda if variant == "fused" else None)
                try:
                    times[variant] = [seconds_per_call(f, args.repeats) for f in minipar_runners(op, arrays, grad)]
                finally:
                    ops_math.use_fused_kernels(fused_cuda)
            runners = torch_runners(torch_make, arrays, grad)
            times["torch"] = [seconds_per_call(f, args.repeats) for f in runners] if runners else [None, None]
            elements = arrays[0].size
            moved = elements * (storage_values * arrays[0].itemsize + fp32_values * 4)
            for i, pass_name in enumerate(("fwd", "fwd+bwd")):
                fused, arrays_t, torch_t = times["fused"][i], times["arrays"][i], times["torch"][i]
                torch_ms = f"{torch_t * 1e3:10.3f}" if torch_t else f"{'-':>10}"
                torch_ratio = f"{torch_t / fused:13.2f}" if torch_t else f"{'-':>13}"
                bandwidth = f"{moved / fused / 1e9:12.0f}" if i == 0 else f"{'':>12}"
                print(f"{name:<10}{dtype_name:<10}{pass_name:<8}{fused * 1e3:10.3f}{arrays_t * 1e3:11.3f}"
                      f"{torch_ms}{arrays_t / fused:14.2f}{torch_ratio}{bandwidth}")
            del arrays, grad
            cupy.get_default_memory_pool().free_all_blocks()


def parse_args(argv):
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--dtypes", default="float32,float16,bfloat16",
                        help="comma-separated storage dtypes (bfloat16 where CuPy has it)")
    parser.add_argument("--tokens", type=int, default=8192, help="rows of LayerNorm/GELU; softmax batch = tokens/1024")
    parser.add_argument("--repeats", type=int, default=30)
    return parser.parse_args(argv)


def main(argv=None):
    args = parse_args(argv)
    if not backend.cupy_available():
        print("fused_ops: needs CuPy and a CUDA GPU (pip install 'minipar[gpu]'); the kernels' CPU checks "
              "are tests/test_fused_emulated.py", file=sys.stderr)
        return 2
    run(args)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
