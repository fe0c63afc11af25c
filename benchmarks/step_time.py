"""Step time of one GPT training step (forward + backward + AdamW), minipar vs PyTorch eager.

    python benchmarks/step_time.py [--layers 4 --d-model 256 --heads 4 --seq 256 --batch 8]
                                   [--steps 10] [--threads N] [--profile] [--ablate]
    python benchmarks/step_time.py --table       # shapes (4,256,256,8) and (4,128,128,16), 1 and 2 threads each
    python benchmarks/step_time.py --device cuda [--attention flash] [--layers 12 --d-model 768 ...]
    python benchmarks/step_time.py --arch llama [--kv-heads 2] [--table]

Both run the same architecture in float32 on the CPU in the same process, with the same
thread count: pre-LayerNorm blocks, fused qkv, causal softmax attention materialising
the N×N scores (PyTorch: the same explicit matmul + mask + softmax, and separately its
fused ``scaled_dot_product_attention``), tanh-GELU MLP, untied head, AdamW (the PyTorch
model is ``torch_gpt.py``, shared with ``ddp_vs_torch.py``).  It prints
the median step time of each (steps of the three run in turn) and the ratio minipar /
PyTorch.  Without PyTorch installed,
only minipar's time is printed.  ``--profile`` shows where minipar's time goes, by op.
``--ablate`` adds two minipar rows, interleaved with the others: the NumPy ops instead of
the compiled CPU kernels (``kernels/fused_cpu.py``), and the row pool's blocks handed
to a sleeping ``ThreadPoolExecutor`` instead of the spinning pool (``autograd/spin_pool.py``;
with 2+ threads only): what each buys, measured in the same run.
``--device cuda`` runs both on the GPU (minipar on its CuPy backend, PyTorch on CUDA; each
step ends with ``loss.item()``, which waits for the device); ``--attention flash`` gives
minipar its flash kernels, to compare with PyTorch's SDPA row.
``--arch llama`` times the llama block instead (RMSNorm, rotary positions, SwiGLU of
8/3·d rounded up to 64, ``--kv-heads`` key/value heads; PyTorch: ``torch_llama.py``).
"""
from __future__ import annotations

import argparse
import os
import statistics
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


def minipar_step_fn(args):
    import numpy as np
    from minipar import backend
    from minipar.nn import GPTConfig, make_model
    from minipar.optim import AdamW
    backend.set_backend("cupy" if args.device == "cuda" else "numpy")
    llama = dict(arch="llama", n_kv_head=args.kv_heads) if args.arch == "llama" else {}
    cfg = GPTConfig(vocab_size=256, seq_len=args.seq, n_layer=args.layers, d_model=args.d_model,
                    n_head=args.heads, attention=args.attention, **llama).validate()
    model = make_model(cfg, seed=0)
    opt = AdamW(model.named_parameters(), lr=1e-4)
    rng = np.random.default_rng(0)
    x = backend.to_device(rng.integers(0, 256, (args.batch, args.seq)))
    y = backend.to_device(rng.integers(0, 256, (args.batch, args.seq)))

    def step():
        _, loss = model(x, y)
        loss.backward()
        opt.step()
        opt.zero_grad()
        return loss.item()
    return step


def ablated(step, kernels=True, spin=True):
    """The step with the CPU kernels and/or the spinning pool switched off while it runs."""
    from minipar.autograd import ops_math, rows
    from minipar.kernels import fused_cpu

    def run():
        ops_math.use_fused_kernels(fused_cpu if kernels else None, backend="numpy")
        rows.use_spin_pool(spin)
        try:
            return step()
        finally:
            ops_math.use_fused_kernels(fused_cpu, backend="numpy")
            rows.use_spin_pool(True)
    return run


def torch_step_fn(args, fused_attention):
    import torch
    torch.manual_seed(0)
    n = args.seq
    if args.arch == "llama":
        from minipar.nn import GPTConfig
        from torch_llama import build_torch_llama
        ffn = GPTConfig(d_model=args.d_model, arch="llama").ffn_width
        model = build_torch_llama(args.layers, args.d_model, args.heads, args.kv_heads, n, ffn,
                                  fused_attention, args.device)
    else:
        from torch_gpt import build_torch_gpt
        model = build_torch_gpt(args.layers, args.d_model, args.heads, n, fused_attention,
                                args.device)
    opt = torch.optim.AdamW(model.parameters(), lr=1e-4, foreach=True)
    x = torch.randint(0, 256, (args.batch, n), device=args.device)
    y = torch.randint(0, 256, (args.batch, n), device=args.device)

    def step():
        loss = model(x, y)
        loss.backward()
        opt.step()
        opt.zero_grad(set_to_none=True)
        return loss.item()
    return step


SETTLE_S = 0.05   # idle time before each timed step (see interleaved_medians)


def interleaved_medians(steps, rounds, warmup=2):
    """Median seconds per step of each step function, run in turn round after round so
    that a load change on the machine touches all of them alike.  Each timed step starts
    after ``SETTLE_S`` of idling: the previous step's pool threads spin a while after their
    last task (PyTorch's OpenMP ~300,000 spins, minipar's ~2 ms) and would otherwise take
    a core from whichever step comes next."""
    for _ in range(warmup):
        for step in steps.values():
            step()
    times = {label: [] for label in steps}
    for _ in range(rounds):
        for label, step in steps.items():
            time.sleep(SETTLE_S)
            t0 = time.perf_counter()
            step()
            times[label].append(time.perf_counter() - t0)
    return {label: statistics.median(t) for label, t in times.items()}


def main(argv=None):
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--arch", choices=("gpt2", "llama"), default="gpt2")
    p.add_argument("--kv-heads", type=int, default=None,
                   help="llama: key/value heads (default: --heads)")
    p.add_argument("--layers", type=int, default=4)
    p.add_argument("--d-model", type=int, default=256)
    p.add_argument("--heads", type=int, default=4)
    p.add_argument("--seq", type=int, default=256)
    p.add_argument("--batch", type=int, default=8)
    p.add_argument("--steps", type=int, default=10)
    p.add_argument("--threads", type=int, default=None,
                   help="threads of each (default: minipar's budget, all the cores)")
    p.add_argument("--profile", action="store_true")
    p.add_argument("--device", choices=("cpu", "cuda"), default="cpu",
                   help="cuda: minipar on CuPy, PyTorch on CUDA")
    p.add_argument("--attention", choices=("naive", "flash"), default="naive",
                   help="minipar's attention (flash needs --device cuda to use its kernels)")
    p.add_argument("--ablate", action="store_true",
                   help="also time minipar without its CPU kernels, and with a sleeping pool")
    p.add_argument("--table", action="store_true",
                   help="the table: shapes (4,256,256,8) and (4,128,128,16), 1 and 2 threads")
    args = p.parse_args(argv)
    args.kv_heads = args.kv_heads or args.heads
    if not args.table:
        compare(args)
        return
    rows = []
    for layers, d, seq, batch in ((4, 256, 256, 8), (4, 128, 128, 16)):
        for n in (1, 2):
            run = argparse.Namespace(**{**vars(args), "layers": layers, "d_model": d, "seq": seq,
                                        "batch": batch, "threads": n, "profile": False})
            rows.append(((layers, d, seq, batch), n, compare(run)))
            print()
    print("shape (layers, d, seq, batch)  threads  minipar ms  / eager  / eager+SDPA")
    for shape, n, t in rows:
        ratios = "".join(f"  {t['minipar'] / t[k]:9.2f}x" for k in t if k.startswith("PyTorch"))
        print(f"{str(shape):30s} {n:7d} {t['minipar'] * 1e3:11.1f}{ratios}")


def compare(args):
    """Time minipar and PyTorch on one shape and thread count; returns {label: seconds}."""
    from minipar.process import threads
    budget = threads.use_threads(args.threads) if args.threads else threads.current_budget()
    args.threads = budget.threads
    print(f"threads: {args.threads} each (minipar: {threads.describe_threads(budget)}; "
          f"PyTorch: torch.set_num_threads({args.threads}))")
    kind = "GPT" if args.arch == "gpt2" else f"llama ({args.kv_heads} key/value heads)"
    print(f"{kind} {args.layers} layers, d={args.d_model}, {args.heads} heads, seq {args.seq}, "
          f"batch {args.batch}, float32, fwd+bwd+AdamW, on {args.device}, minipar attention "
          f"{args.attention}; median of {args.steps} steps")
    step = minipar_step_fn(args)
    if args.profile:
        import cProfile
        import pstats
        step()
        cProfile.runctx("for _ in range(3): step()", globals(), {"step": step}, "/tmp/minipar.prof")
        pstats.Stats("/tmp/minipar.prof").sort_stats("tottime").print_stats(15)
    steps = {"minipar": step}
    if args.ablate and args.device == "cpu":
        steps["minipar, NumPy ops (no kernels)"] = ablated(minipar_step_fn(args), kernels=False)
        if args.threads > 1:
            steps["minipar, sleeping pool"] = ablated(minipar_step_fn(args), spin=False)
    try:
        import torch
    except ImportError:
        torch = None
        print("PyTorch not installed: no baseline in this run (pip install torch)")
    if torch is not None and args.device == "cuda" and not torch.cuda.is_available():
        torch = None
        print("this PyTorch has no CUDA: no baseline in this run")
    if torch is not None:
        torch.set_num_threads(args.threads)
        steps["PyTorch eager (same attention)"] = torch_step_fn(args, fused_attention=False)
        steps["PyTorch eager + SDPA"] = torch_step_fn(args, fused_attention=True)
    times = interleaved_medians(steps, args.steps)
    for label, t in times.items():
        other = "PyTorch" if label.startswith("PyTorch") else "this"
        ratio = "" if label == "minipar" else f"   minipar / {other} = {times['minipar'] / t:.2f}x"
        print(f"{label:32s} {t * 1e3:8.1f} ms/step{ratio}")
    return times


if __name__ == "__main__":
    main()
