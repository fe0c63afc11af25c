"""mpiexec script: Ulysses (and hybrid Ulysses × ring) attention against one process and by its bytes.

    mpiexec -n C python tests/scripts/ulysses_attention.py

Every rank draws the same full q (B, H, S, d), k and v (B, Hkv, S, d) and output
gradient, and computes the single-process oracle itself (dense float64 attention on
K/V repeated to H heads, dK and dV folded back over each group).  For every Ulysses
degree U dividing C (U = C: pure Ulysses; U < C: the hybrid, the ring across the C/U
groups), Hkv in (H, 2, 1) and naive and flash attention, it runs ``UlyssesAttentionCore``
on its own positions and compares its slice of the output and of dQ, dK, dV (relative to
the largest entry; the worst rank's error printed by rank 0 as ``parity ...``; the
script fails above 1e-12).  U = 1 is the ring itself, through the same code.

Bytes: rank 0 prints each case's bytes sent (the most of any rank, counted by the
transport on the cp communicator, which the Ulysses and ring groups add to) beside the
formula of ``ulysses.py`` (``bytes_per_rank``, which the performance model prices) as
``bytes ...``; the script fails unless they are equal.
"""
import sys

import numpy as np
from mpi4py import MPI

from minipar.autograd import Tensor
from minipar.comm import Communicator, abort_on_exception
from minipar.kernels.dense import dense_attention_backward, dense_attention_forward
from minipar.parallel.context import UlyssesAttentionCore, ulysses_groups, ulysses_positions
from minipar.parallel.context.ulysses import bytes_per_rank

abort_on_exception()
comm = Communicator()
C, rank = comm.size, comm.rank
B, H, S, D = 2, 8, 8 * C, 4
ITEM = 8                                                # float64
TOL = 1e-12


def oracle(q, k, v, grad_out):
    """(out, dq, dk, dv): dense attention on explicitly repeated K/V, gradients folded back."""
    group = q.shape[1] // k.shape[1]
    k_rep, v_rep = np.repeat(k, group, axis=1), np.repeat(v, group, axis=1)
    out, probs = dense_attention_forward(q, k_rep, v_rep, True)
    dq, dk, dv = dense_attention_backward(q, k_rep, v_rep, probs, grad_out)
    fold = lambda g: g.reshape(B, k.shape[1], group, S, D).sum(axis=2)  # noqa: E731
    return out, dq, fold(dk), fold(dv)


def formula_bytes(ulysses, kv_heads):
    """ulysses.py's bytes per rank, forward and backward of one attention layer."""
    return bytes_per_rank(B, H, kv_heads, S, D, ITEM, C, ulysses)


def worst_over_ranks(x):
    return comm.mpi.allreduce(x, op=MPI.MAX)


failures = []
degrees = [u for u in range(1, C + 1) if C % u == 0]
groups = {u: ulysses_groups(comm, u) for u in degrees}           # collective: all ranks alike
for kv_heads in (H, 2, 1):
    rng = np.random.default_rng(kv_heads)
    full = [rng.standard_normal(shape) for shape in
            ((B, H, S, D), (B, kv_heads, S, D), (B, kv_heads, S, D), (B, H, S, D))]
    want = oracle(*full)
    for ulysses in degrees:
        for kind in ("naive", "flash"):
            positions = ulysses_positions(rank, C, ulysses, S)
            q, k, v, grad_out = (np.ascontiguousarray(a[:, :, positions]) for a in full)
            tensors = [Tensor(a, requires_grad=True) for a in (q, k, v)]
            comm.reset_counters()
            out = UlyssesAttentionCore(*groups[ulysses], kind)(*tensors)
            out.backward(grad_out)
            sent = worst_over_ranks(comm.bytes_sent)
            got = (out.data,) + tuple(t.grad for t in tensors)
            error = max(np.abs(g - w[:, :, positions]).max() / np.abs(w).max()
                        for g, w in zip(got, want))
            error = worst_over_ranks(error)
            label = f"cp={C} U={ulysses} Hkv={kv_heads} kind={kind}"
            if rank == 0:
                print(f"parity {label} max_rel={error:.2e}", flush=True)
                print(f"bytes {label} counted={sent} formula={formula_bytes(ulysses, kv_heads)}",
                      flush=True)
            if not error <= TOL:
                failures.append(f"parity {label}")
            if sent != formula_bytes(ulysses, kv_heads):
                failures.append(f"bytes {label}")
if failures:
    print(f"rank {rank} FAILED: {failures}", flush=True)
    sys.exit(1)
