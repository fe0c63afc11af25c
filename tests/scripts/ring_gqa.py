"""mpiexec script: ring attention with grouped-query K/V, against one process and by its bytes.

    mpiexec -n C python tests/scripts/ring_gqa.py

Every rank draws the same full q (B, H, S, d), k and v (B, Hkv, S, d) and output gradient,
and computes the single-process oracle itself: dense float64 attention on K/V repeated to
H heads, with the repeated heads' dK, dV summed back over each group.  Then it runs ring
attention on its own positions (zig-zag and contiguous splits, naive and flash pair
kernels) and compares its slice of the output and of dQ, dK, dV (rel. to the largest
entry, all ranks' worst printed by rank 0 as ``parity ...``; the script fails above 1e-12).

Bytes: one forward + backward sends, per rank, C-1 hops of the (K, V) block forward,
C-1 again backward and C hops of its (dK, dV) accumulator — each block 2·B·Hkv·(S/C)·d
float64 numbers: ``bytes = (3C - 2) · 2·B·Hkv·(S/C)·d·8``.  Rank 0 prints the counted and
the formula's bytes for every Hkv as ``bytes ...`` (the script fails unless they are equal).
"""
import sys

import numpy as np

from minipar.autograd import Tensor
from minipar.comm import Communicator, abort_on_exception
from minipar.kernels.dense import dense_attention_backward, dense_attention_forward
from minipar.parallel.context import RingAttentionCore, positions_of

abort_on_exception()
comm = Communicator()
C, rank = comm.size, comm.rank
B, H, S, D = 2, 8, 8 * C, 8
TOL = 1e-12


def oracle(q, k, v, grad_out):
    """(out, dq, dk, dv): dense attention on explicitly repeated K/V, gradients folded back."""
    group = q.shape[1] // k.shape[1]
    k_rep, v_rep = np.repeat(k, group, axis=1), np.repeat(v, group, axis=1)
    out, probs = dense_attention_forward(q, k_rep, v_rep, True)
    dq, dk, dv = dense_attention_backward(q, k_rep, v_rep, probs, grad_out)
    fold = lambda g: g.reshape(B, k.shape[1], group, S, D).sum(axis=2)
    return out, dq, fold(dk), fold(dv)


def ring_step(full, kind, zigzag):
    """(out, dq, dk, dv) of this rank's positions, and the bytes it sent doing them."""
    positions = positions_of(rank, C, S, zigzag)
    q, k, v, grad_out = (np.ascontiguousarray(a[:, :, positions]) for a in full)
    tensors = [Tensor(a, requires_grad=True) for a in (q, k, v)]
    comm.reset_counters()
    out = RingAttentionCore(comm, kind, zigzag)(*tensors)
    out.backward(grad_out)
    sent = comm.bytes_sent
    return (out.data,) + tuple(t.grad for t in tensors), positions, sent


def worst_over_ranks(x):
    return comm.mpi.allreduce(x, op=__import__("mpi4py").MPI.MAX)


failures = []
bytes_by_kv_heads = {}
for kv_heads in (8, 2, 1):
    rng = np.random.default_rng(kv_heads)
    full = [rng.standard_normal(shape) for shape in
            ((B, H, S, D), (B, kv_heads, S, D), (B, kv_heads, S, D), (B, H, S, D))]
    want = oracle(*full)
    for kind in ("naive", "flash"):
        for zigzag in (True, False):
            got, positions, sent = ring_step(full, kind, zigzag)
            error = max(np.abs(g - w[:, :, positions]).max() / np.abs(w).max() for g, w in zip(got, want))
            assert all(g.shape == w[:, :, positions].shape for g, w in zip(got, want))
            error = worst_over_ranks(error)
            label = f"parity Hkv={kv_heads} kind={kind} split={'zigzag' if zigzag else 'contiguous'}"
            if rank == 0:
                print(f"{label} max_rel={error:.2e}", flush=True)
            if not error <= TOL:
                failures.append(label)
            bytes_by_kv_heads.setdefault(kv_heads, set()).add(worst_over_ranks(sent))

for kv_heads, counted in bytes_by_kv_heads.items():
    formula = (3 * C - 2) * 2 * B * kv_heads * (S // C) * D * 8
    if rank == 0:
        print(f"bytes cp={C} H={H} Hkv={kv_heads} counted={sorted(counted)} formula={formula}", flush=True)
    if counted != {formula}:
        failures.append(f"bytes Hkv={kv_heads}")
if failures:
    print(f"rank {rank} FAILED: {failures}", flush=True)
    sys.exit(1)
