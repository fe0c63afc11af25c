"""Step time of one GPT training step (forward + backward + AdamW), minipar vs PyTorch eager.

    python benchmarks/step_time.py [--layers 4 --d-model 256 --heads 4 --seq 256 --batch 8]
                                   [--steps 10] [--threads N] [--profile]

Both run the same architecture in float32 on the CPU in the same process, with the same
thread count: pre-LayerNorm blocks, fused qkv, causal softmax attention materialising
the N×N scores (PyTorch: the same explicit matmul + mask + softmax, and separately its
fused ``scaled_dot_product_attention``), tanh-GELU MLP, untied head, AdamW (the PyTorch
model is ``torch_gpt.py``, shared with ``ddp_vs_torch.py``).  It prints
the median step time of each (steps of the three run in turn) and the ratio minipar /
PyTorch.  Without PyTorch installed,
only minipar's time is printed.  ``--profile`` shows where minipar's time goes, by op.
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
    from minipar.nn import GPT, GPTConfig
    from minipar.optim import AdamW
    cfg = GPTConfig(vocab_size=256, seq_len=args.seq, n_layer=args.layers, d_model=args.d_model,
                    n_head=args.heads)
    model = GPT(cfg, seed=0)
    opt = AdamW(model.named_parameters(), lr=1e-4)
    rng = np.random.default_rng(0)
    x = rng.integers(0, 256, (args.batch, args.seq))
    y = rng.integers(0, 256, (args.batch, args.seq))

    def step():
        _, loss = model(x, y)
        loss.backward()
        opt.step()
        opt.zero_grad()
        return loss.item()
    return step


def torch_step_fn(args, fused_attention):
    import torch
    from torch_gpt import build_torch_gpt
    torch.manual_seed(0)
    n = args.seq
    model = build_torch_gpt(args.layers, args.d_model, args.heads, n, fused_attention)
    opt = torch.optim.AdamW(model.parameters(), lr=1e-4, foreach=True)
    x = torch.randint(0, 256, (args.batch, n))
    y = torch.randint(0, 256, (args.batch, n))

    def step():
        loss = model(x, y)
        loss.backward()
        opt.step()
        opt.zero_grad(set_to_none=True)
        return loss.item()
    return step


def interleaved_medians(steps, rounds, warmup=2):
    """Median seconds per step of each step function, run in turn round after round so
    that a load change on the machine touches all of them alike."""
    for _ in range(warmup):
        for step in steps.values():
            step()
    times = {label: [] for label in steps}
    for _ in range(rounds):
        for label, step in steps.items():
            t0 = time.perf_counter()
            step()
            times[label].append(time.perf_counter() - t0)
    return {label: statistics.median(t) for label, t in times.items()}


def main(argv=None):
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--layers", type=int, default=4)
    p.add_argument("--d-model", type=int, default=256)
    p.add_argument("--heads", type=int, default=4)
    p.add_argument("--seq", type=int, default=256)
    p.add_argument("--batch", type=int, default=8)
    p.add_argument("--steps", type=int, default=10)
    p.add_argument("--threads", type=int, default=None, help="BLAS / torch threads")
    p.add_argument("--profile", action="store_true")
    args = p.parse_args(argv)
    if args.threads:
        try:
            from threadpoolctl import threadpool_limits
            threadpool_limits(args.threads)
        except ImportError:
            print("(threadpoolctl not installed: set OMP_NUM_THREADS to fix numpy's threads)")
    print(f"GPT {args.layers} layers, d={args.d_model}, {args.heads} heads, seq {args.seq}, "
          f"batch {args.batch}, float32, fwd+bwd+AdamW; median of {args.steps} steps")
    step = minipar_step_fn(args)
    if args.profile:
        import cProfile
        import pstats
        step()
        cProfile.runctx("for _ in range(3): step()", globals(), {"step": step}, "/tmp/minipar.prof")
        pstats.Stats("/tmp/minipar.prof").sort_stats("tottime").print_stats(15)
    steps = {"minipar": step}
    try:
        import torch
        if args.threads:
            torch.set_num_threads(args.threads)
        steps["PyTorch eager (same attention)"] = torch_step_fn(args, fused_attention=False)
        steps["PyTorch eager + SDPA"] = torch_step_fn(args, fused_attention=True)
    except ImportError:
        print("PyTorch not installed: no baseline in this run (pip install torch)")
    times = interleaved_medians(steps, args.steps)
    for label, t in times.items():
        ratio = "" if label == "minipar" else f"   minipar / PyTorch = {times['minipar'] / t:.2f}x"
        print(f"{label:32s} {t * 1e3:8.1f} ms/step{ratio}")

if __name__ == "__main__":
    main()
