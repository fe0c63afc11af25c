"""The llama block's CPU kernels against their array code (and PyTorch), op by op.

    python benchmarks/llama_ops_cpu.py [--rows 2048] [--d-model 256] [--heads 4] [--kv-heads 2]
                                       [--threads 1,2] [--repeats 20]

RMSNorm (rows × d), the rotary embedding of q (heads()' transposed view of a (rows, d)
projection, as the model hands it over) and SwiGLU's silu(gate)·up (rows × 8/3·d rounded up
to 64: the benchmark model's shapes), each forward + backward through minipar's autograd
ops, three ways in one run on the same inputs, calls interleaved round by round so that
a load change on the machine touches all alike (`step_time.interleaved_medians`: each after
``SETTLE_S`` of idling):

    fused   the numba kernels of minipar/kernels/fused_cpu_llama.py (what the step runs)
    arrays  the same ops' array code (the kernels unregistered for the call)
    torch   torch.nn.RMSNorm, HF's rotate_half rope, F.silu(gate)·up — when installed

It prints the median milliseconds per call and the ratios arrays/fused and torch/fused
(above 1: the fused kernel is faster).
"""
from __future__ import annotations

import argparse
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # run from a checkout without installing

import numpy as np  # noqa: E402

from minipar.process import threads  # noqa: E402
from minipar.autograd import Tensor, ops, ops_math  # noqa: E402
from minipar.nn import GPTConfig  # noqa: E402
from minipar.nn.rope import rope_angles  # noqa: E402
from minipar.kernels import fused_cpu  # noqa: E402
from step_time import interleaved_medians  # noqa: E402  (benchmarks/, this script's folder)


def cases(rows, d, heads, rng):
    """(name, minipar op, input arrays, torch op maker)."""
    f32 = np.float32
    dh, seq = d // heads, 256
    width = GPTConfig(d_model=d, arch="llama").ffn_width
    angles = rope_angles(np.arange(seq), dh, 10000.0)
    cos, sin = np.cos(angles).astype(f32), np.sin(angles).astype(f32)
    batch = rows // seq

    def rope(x):       # (rows, d) -> rotated (batch, heads, seq, dh) on heads()' view
        return ops.rotary(ops.transpose(ops.reshape(x, (batch, seq, heads, dh)), (0, 2, 1, 3)),
                          Tensor(cos), Tensor(sin))

    def torch_rms(torch):
        norm = torch.nn.RMSNorm(d, eps=1e-5)
        return lambda x, w: norm(x)

    def torch_rope(torch):
        c, s = torch.as_tensor(cos), torch.as_tensor(sin)

        def apply(x):
            q = x.view(batch, seq, heads, dh).transpose(1, 2)
            a, b = q.chunk(2, dim=-1)
            return q * c + torch.cat([-b, a], dim=-1) * s
        return apply

    def torch_swiglu(torch):
        return lambda gate, up: torch.nn.functional.silu(gate) * up

    normal = lambda *shape: rng.standard_normal(shape).astype(f32)  # noqa: E731
    return [("rmsnorm", ops.rms_norm, [normal(rows, d), normal(d)], torch_rms),
            ("rotary", rope, [normal(rows, d)], torch_rope),
            ("swiglu", ops.swiglu, [normal(rows, width), normal(rows, width)], torch_swiglu)]


def minipar_call(op, arrays, kernels):
    def run():
        ops_math.use_fused_kernels(fused_cpu if kernels else None, backend="numpy")
        try:
            tensors = [Tensor(a, requires_grad=True) for a in arrays]
            out = op(*tensors)
            out.backward(np.ones(out.shape, np.float32))
        finally:
            ops_math.use_fused_kernels(fused_cpu, backend="numpy")
    return run


def torch_call(make, arrays):
    try:
        import torch
    except ImportError:
        return None
    op = make(torch)
    tensors = [torch.as_tensor(a) for a in arrays]

    def run():
        leaves = [t.detach().requires_grad_(True) for t in tensors]
        out = op(*leaves)
        out.backward(torch.ones_like(out))
    return run


def main(argv=None):
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--rows", type=int, default=2048, help="tokens (batch · 256)")
    p.add_argument("--d-model", type=int, default=256)
    p.add_argument("--heads", type=int, default=4)
    p.add_argument("--threads", default="1,2")
    p.add_argument("--repeats", type=int, default=20)
    args = p.parse_args(argv)
    rng = np.random.default_rng(0)
    print(f"{'op':<9}{'threads':>8}{'fused ms':>10}{'arrays ms':>11}{'torch ms':>10}"
          f"{'arrays/fused':>14}{'torch/fused':>13}   (forward + backward, float32)")
    for n in (int(t) for t in args.threads.split(",")):
        threads.use_threads(n)
        try:
            import torch
            torch.set_num_threads(n)
        except ImportError:
            pass
        for name, op, arrays, torch_make in cases(args.rows, args.d_model, args.heads, rng):
            calls = {"fused": minipar_call(op, arrays, True), "arrays": minipar_call(op, arrays, False)}
            if (t := torch_call(torch_make, arrays)) is not None:
                calls["torch"] = t
            ms = {k: v * 1e3 for k, v in interleaved_medians(calls, args.repeats, warmup=1).items()}
            torch_ms = f"{ms['torch']:10.3f}" if "torch" in ms else f"{'-':>10}"
            torch_ratio = f"{ms['torch'] / ms['fused']:13.2f}" if "torch" in ms else f"{'-':>13}"
            print(f"{name:<9}{n:>8}{ms['fused']:10.3f}{ms['arrays']:11.3f}{torch_ms}"
                  f"{ms['arrays'] / ms['fused']:14.2f}{torch_ratio}")


if __name__ == "__main__":
    main()
