"""``python -m minipar bench attention``: flash kernels vs naive attention vs PyTorch.

Throughput counts the useful matrix-product work, as the FlashAttention papers do:

    forward  = 4·B·H·N²·d FLOPs (Q Kᵀ and P V, 2 FLOPs per multiply-add)
    backward = 2.5 × forward (five N×N×d products instead of two)
    causal   = half of each

On a GPU (CuPy): fp16, head dim 64 and 128, N = 1k..8k with B·N = 16k tokens and
H·d = 2048, causal and not; every shape runs the flash kernels, naive CuPy attention (``dense``:
the full N×N matrix through cuBLAS) and, when PyTorch is installed,
``scaled_dot_product_attention`` restricted to its flash backend — same inputs, same
run — and prints the ratios.  Peak memory is the extra device memory one forward +
backward needs beyond its inputs.  ``--kv-group G`` runs grouped-query attention (K/V with
H/G heads): the flash kernels read them in place, SDPA gets ``enable_gqa``, and the naive
column repeats K/V to H heads first, as code without GQA support must.  Without a GPU it runs a small, clearly labelled NumPy
comparison instead: the tiled reference vs dense attention (time and peak memory).
"""
from __future__ import annotations

import time
import tracemalloc

from minipar.cli_checks import CommandError, OneLineParser, at_least
from minipar import backend
from minipar.kernels.dense import dense_attention_backward, dense_attention_forward

FLASH, NAIVE, TORCH = "flash", "naive", "torch-flash"


def attention_flops(batch, heads, n, head_dim, causal):
    forward = 4 * batch * heads * n * n * head_dim / (2 if causal else 1)
    return forward, 2.5 * forward


def seconds_per_call(fn, repeats, sync):
    fn()  # warm-up (and compilation)
    sync()
    start = time.perf_counter()
    for _ in range(repeats):
        fn()
    sync()
    return (time.perf_counter() - start) / repeats


# ------------------------------------------------------------------------------ GPU
def _device_sync():
    import cupy
    cupy.cuda.Device().synchronize()  # every stream, PyTorch's included


def _cupy_extra_bytes(run):
    """Device bytes the pool had to grow by for one forward + backward (≈ its peak)."""
    import cupy
    pool = cupy.get_default_memory_pool()
    pool.free_all_blocks()
    before = pool.total_bytes()
    run()
    _device_sync()
    return pool.total_bytes() - before


def _torch_runner(q, k, v, grad_out, causal, grouped=False):
    """SDPA forced onto its flash backend; None when PyTorch (or the backend) is missing."""
    try:
        import torch
        import torch.nn.functional as F
    except Exception as err:  # not installed, or installed without a usable CUDA build
        print(f"      (PyTorch unavailable, no SDPA column: {type(err).__name__}: {err})"[:160])
        return None
    if not torch.cuda.is_available():
        print("      (PyTorch has no CUDA here, no SDPA column)")
        return None
    try:
        from torch.nn.attention import SDPBackend, sdpa_kernel
        flash_only = lambda: sdpa_kernel([SDPBackend.FLASH_ATTENTION])  # noqa: E731
    except ImportError:  # PyTorch < 2.3
        flash_only = lambda: torch.backends.cuda.sdp_kernel(  # noqa: E731
            enable_flash=True, enable_math=False, enable_mem_efficient=False)
    tq, tk, tv, tg = (torch.as_tensor(a, device="cuda") for a in (q, k, v, grad_out))
    for t in (tq, tk, tv):
        t.requires_grad_(True)

    def forward():
        with flash_only():
            if grouped:  # PyTorch >= 2.5
                return F.scaled_dot_product_attention(tq, tk, tv, is_causal=causal, enable_gqa=True)
            return F.scaled_dot_product_attention(tq, tk, tv, is_causal=causal)

    def backward(out):
        return torch.autograd.grad(out, (tq, tk, tv), tg, retain_graph=True)

    def extra_bytes():
        torch.cuda.synchronize()
        base = torch.cuda.memory_allocated()
        torch.cuda.reset_peak_memory_stats()
        backward(forward())
        torch.cuda.synchronize()
        return torch.cuda.max_memory_allocated() - base

    return forward, backward, extra_bytes


def run_gpu(args):
    import cupy
    from minipar.kernels import flash_cuda
    backend.set_backend("cupy")
    print(f"# attention benchmark on {cupy.cuda.runtime.getDeviceProperties(0)['name'].decode()}: "
          f"fp16, B·N = {args.tokens}, H·d = {args.width}, {args.repeats} repeats, "
          f"{args.kv_group} query heads per KV head")
    header = (f"{'d':>4} {'N':>5} {'causal':>6} {'impl':>12} {'fwd ms':>8} {'fwd TF/s':>9} "
              f"{'bwd ms':>8} {'bwd TF/s':>9} {'peak MiB':>9}")
    rng = cupy.random.default_rng(0)
    rows = []
    for head_dim in args.head_dims:
        print(header)
        for n in args.sizes:
            batch, heads = max(1, args.tokens // n), args.width // head_dim
            q, grad_out = (rng.standard_normal((batch, heads, n, head_dim), dtype=cupy.float32)
                           .astype(cupy.float16) for _ in range(2))
            k, v = (rng.standard_normal((batch, heads // args.kv_group, n, head_dim), dtype=cupy.float32)
                    .astype(cupy.float16) for _ in range(2))
            k_rep, v_rep = (cupy.repeat(a, args.kv_group, axis=1) for a in (k, v))  # naive needs H heads
            for causal in args.causal:
                fwd_flops, bwd_flops = attention_flops(batch, heads, n, head_dim, causal)
                results = {}
                out, lse = flash_cuda.forward(q, k, v, causal)
                results[FLASH] = (
                    seconds_per_call(lambda: flash_cuda.forward(q, k, v, causal), args.repeats, _device_sync),
                    seconds_per_call(lambda: flash_cuda.backward(q, k, v, out, lse, grad_out, causal),
                                     args.repeats, _device_sync),
                    _cupy_extra_bytes(lambda: flash_cuda.backward(
                        q, k, v, *flash_cuda.forward(q, k, v, causal), grad_out, causal)))
                try:
                    dense_forward = lambda: dense_attention_forward(q, k_rep, v_rep, causal)  # noqa: E731
                    probs = dense_forward()[1]
                    dense_backward = lambda p: dense_attention_backward(q, k_rep, v_rep, p, grad_out)  # noqa: E731
                    results[NAIVE] = (
                        seconds_per_call(dense_forward, args.repeats, _device_sync),
                        seconds_per_call(lambda: dense_backward(probs), args.repeats, _device_sync),
                        _cupy_extra_bytes(lambda: dense_backward(dense_forward()[1])))
                    probs = None  # free the N×N matrix before the next implementation
                except cupy.cuda.memory.OutOfMemoryError:
                    results[NAIVE] = None
                cupy.get_default_memory_pool().free_all_blocks()
                try:  # SDPA may refuse a shape or GPU: the other columns still count
                    runner = _torch_runner(q, k, v, grad_out, causal, args.kv_group > 1)
                    if runner is not None:
                        t_forward, t_backward, t_bytes = runner
                        t_out = t_forward()
                        diff = float(cupy.abs(cupy.asarray(t_out.detach()).astype(cupy.float32)
                                              - out.astype(cupy.float32)).max())
                        results[TORCH] = (seconds_per_call(t_forward, args.repeats, _device_sync),
                                          seconds_per_call(lambda: t_backward(t_out), args.repeats,
                                                           _device_sync),
                                          t_bytes())
                        t_out = None
                except (RuntimeError, TypeError) as err:  # TypeError: no enable_gqa before 2.5
                    print(f"      (PyTorch SDPA flash failed here: {type(err).__name__}: {str(err)[:150]})")
                    results.pop(TORCH, None)
                    t_out = None
                    import torch
                    torch.cuda.empty_cache()  # what the failed call held must not starve the next shape
                for impl, result in results.items():
                    if result is None:
                        print(f"{head_dim:>4} {n:>5} {str(causal):>6} {impl:>12}   out of memory")
                        continue
                    fwd_s, bwd_s, extra = result
                    print(f"{head_dim:>4} {n:>5} {str(causal):>6} {impl:>12} {fwd_s * 1e3:8.3f} "
                          f"{fwd_flops / fwd_s / 1e12:9.1f} {bwd_s * 1e3:8.3f} {bwd_flops / bwd_s / 1e12:9.1f} "
                          f"{extra / 2**20:9.1f}")
                    rows.append(dict(d=head_dim, n=n, causal=causal, impl=impl, fwd_s=fwd_s, bwd_s=bwd_s,
                                     peak_bytes=extra))
                ratios = [f"flash/naive fwd {results[NAIVE][0] / results[FLASH][0]:.2f}x "
                          f"bwd {results[NAIVE][1] / results[FLASH][1]:.2f}x" if results.get(NAIVE) else ""]
                if TORCH in results:
                    ratios.append(f"flash vs torch: fwd {results[TORCH][0] / results[FLASH][0]:.2f}x "
                                  f"bwd {results[TORCH][1] / results[FLASH][1]:.2f}x (target >= 0.9x / 0.8x), "
                                  f"max|out - torch out| {diff:.1e}")
                print("      " + "; ".join(r for r in ratios if r))
    return rows


# ------------------------------------------------------------------------------ CPU
def run_cpu(args):
    from minipar.kernels.flash_reference import flash_backward_reference, flash_forward_reference
    xp = backend.xp
    print("# CPU / NumPy only (no CuPy GPU found): the tiled flash *reference* vs dense attention,")
    print("# float32, B=1 H=4 d=64 — an illustration of time and memory, not the GPU benchmark.")
    print(f"{'N':>5} {'causal':>6} {'impl':>6} {'fwd ms':>8} {'bwd ms':>8} {'GFLOP/s':>8} {'peak MiB':>9}")
    rng = xp.random.default_rng(0)
    rows = []
    for n in args.cpu_sizes:
        q, k, v, grad_out = (rng.standard_normal((1, 4, n, 64)).astype(xp.float32) for _ in range(4))
        for causal in args.causal:
            fwd_flops, bwd_flops = attention_flops(1, 4, n, 64, causal)
            out, lse = flash_forward_reference(q, k, v, causal)
            _, probs = dense_attention_forward(q, k, v, causal)
            impls = {
                "flash": (lambda: flash_forward_reference(q, k, v, causal),
                          lambda: flash_backward_reference(q, k, v, out, lse, grad_out, causal)),
                "dense": (lambda: dense_attention_forward(q, k, v, causal),
                          lambda: dense_attention_backward(q, k, v, probs, grad_out)),
            }
            for impl, (forward, backward) in impls.items():
                fwd_s = seconds_per_call(forward, args.cpu_repeats, lambda: None)
                bwd_s = seconds_per_call(backward, args.cpu_repeats, lambda: None)
                tracemalloc.start()
                forward()
                peak = tracemalloc.get_traced_memory()[1]
                tracemalloc.stop()
                gflops = (fwd_flops + bwd_flops) / (fwd_s + bwd_s) / 1e9
                print(f"{n:>5} {str(causal):>6} {impl:>6} {fwd_s * 1e3:8.1f} {bwd_s * 1e3:8.1f} "
                      f"{gflops:8.2f} {peak / 2**20:9.2f}")
                rows.append(dict(n=n, causal=causal, impl=impl, fwd_s=fwd_s, bwd_s=bwd_s, peak_bytes=peak))
    return rows


def int_list(text):
    """"1024,2048" -> [1024, 2048]"""
    return [int(x) for x in text.split(",")]


def parse_args(argv):
    ints = int_list
    parser = OneLineParser(prog="minipar bench attention", description=__doc__.split("\n\n")[0])
    parser.add_argument("--sizes", type=ints, default=[1024, 2048, 4096, 8192], help="sequence lengths (GPU)")
    parser.add_argument("--head-dims", type=ints, default=[64, 128])
    parser.add_argument("--tokens", type=int, default=16384, help="B·N, fixed across sizes")
    parser.add_argument("--width", type=int, default=2048, help="H·d, fixed across head dims")
    parser.add_argument("--causal", choices=["both", "yes", "no"], default="both")
    parser.add_argument("--kv-group", type=int, default=1,
                        help="query heads per K/V head (grouped-query attention; 1: multi-head; GPU run)")
    parser.add_argument("--repeats", type=int, default=10)
    parser.add_argument("--cpu-sizes", type=ints, default=[256, 512, 1024], help="sequence lengths (CPU)")
    parser.add_argument("--cpu-repeats", type=int, default=2)
    parser.add_argument("--cpu", action="store_true", help="run the NumPy comparison even if a GPU is present")
    args = parser.parse_args(argv)
    check_attention_flags(args)
    args.causal = {"both": [False, True], "yes": [True], "no": [False]}[args.causal]
    return args


DENSE_CPU_ARRAYS = 3    # dense attention on CPU holds scores, probabilities and their gradient


def check_attention_flags(args):
    """CommandError in one line before any kernel runs: a length, count or width below 1,
    a head dimension that does not divide --width, a CPU length whose dense N×N arrays
    (B=1, H=4, float32) this process's memory cannot hold."""
    from minipar.observe.resources import memory_budget_bytes
    for flag in ("sizes", "head_dims", "cpu_sizes"):
        for value in getattr(args, flag):
            at_least("--" + flag.replace("_", "-"), value, 1)
    for flag in ("tokens", "width", "repeats", "cpu_repeats", "kv_group"):
        at_least("--" + flag.replace("_", "-"), getattr(args, flag), 1)
    for d in args.head_dims:
        if args.width % d:
            raise CommandError(f"--head-dims {d} does not divide --width {args.width} (H·d)")
        if (args.width // d) % args.kv_group:
            raise CommandError(f"--kv-group {args.kv_group} does not divide the {args.width // d} heads "
                               f"of --head-dims {d}")
    budget, n = memory_budget_bytes(), max(args.cpu_sizes)
    need = DENSE_CPU_ARRAYS * 4 * n * n * 4
    if budget and need > budget:
        raise CommandError(f"--cpu-sizes {n}: dense attention needs about {need / 2 ** 30:.1f} GiB "
                           f"(3 arrays of 4 x {n} x {n} float32); this process may use "
                           f"{budget / 2 ** 30:.1f} GiB")


def main(argv=None):
    args = parse_args(argv)
    if backend.cupy_available() and not args.cpu:
        return run_gpu(args)
    previous = backend.backend_name()
    backend.set_backend("numpy")
    try:
        return run_cpu(args)
    finally:
        backend.set_backend(previous)
