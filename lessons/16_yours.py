"""Lesson 16's exercise on every rank: your ring attention against one process's attention.

    mpiexec -n 4 python lessons/16_yours.py --file MINE.py

``MINE.py`` defines ``ring_attention(comm, q, k, v)``: rank r holds the r-th contiguous
block of the sequence's queries, keys and values, each (B, H, n, d); it returns the
causal attention output of its queries over the whole sequence and the log-sum-exp of
every row, ``(out (B, H, n, d), lse (B, H, n))``, having passed the K/V blocks around the
ring and merged each block's result with the online softmax.  In float64 it checks:

- **parity**: ``out`` and ``lse`` equal one process's causal attention, rows of rank r
  (relative 1e-10); if not, which key blocks the result *does* cover: each rank tries
  every subset of the blocks 0..r it must see (2^(r+1) of them) and names the one that
  matches, or says none does (a wrong mask or merge);
- **traffic**: every rank sent C - 1 K/V blocks, (C-1)·(k.nbytes + v.nbytes) bytes.
"""
import itertools
import math
import os
import sys

try:
    import minipar  # noqa: F401
except ImportError:  # run from a checkout without installing: use the repository root
    sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

import numpy as np

from minipar import backend
from minipar.backend import to_device, to_host
from yours import main

B, H, N, D = 1, 2, 8, 16           # N query rows per rank


def attention_over(q, k, v, rank, blocks):
    """One process's causal attention of rank's query rows over the key blocks ``blocks``
    only: (out, lse); an empty set gives out 0 and lse -inf."""
    if not blocks:
        return np.zeros_like(q[:, :, :N]), np.full(q.shape[:2] + (N,), -np.inf)
    rows = np.arange(rank * N, (rank + 1) * N)
    cols = np.concatenate([np.arange(j * N, (j + 1) * N) for j in blocks])
    s = q[:, :, rows] @ k[:, :, cols].transpose(0, 1, 3, 2) / math.sqrt(D)
    s = np.where(cols[None, :] <= rows[:, None], s, -np.inf)
    m = s.max(axis=-1, keepdims=True)
    p = np.exp(s - m)
    return (p / p.sum(axis=-1, keepdims=True)) @ v[:, :, cols], (m + np.log(p.sum(axis=-1, keepdims=True)))[..., 0]


def close(a, b):
    return a.shape == b.shape and np.allclose(a, b, rtol=1e-10, atol=1e-12)


def check(comm, ring_attention):
    backend.set_default_dtype(np.float64)
    p, r = comm.size, comm.rank
    rng = np.random.default_rng(0)
    q, k, v = (rng.standard_normal((B, H, p * N, D)) for _ in range(3))
    mine = slice(r * N, (r + 1) * N)
    comm.reset_counters()
    out, lse = ring_attention(comm, *(to_device(np.ascontiguousarray(x[:, :, mine])) for x in (q, k, v)))
    sent = comm.bytes_sent
    out, lse = to_host(out), to_host(lse)
    want_out, want_lse = attention_over(q, k, v, r, list(range(r + 1)))
    if not (close(out, want_out) and close(lse, want_lse)):
        seen = [list(s) for n in range(r + 1) for s in itertools.combinations(range(r + 1), n)
                if all(map(close, (out, lse), attention_over(q, k, v, r, list(s))))]
        covers = ("it matches attention over no subset of those blocks: look at the mask or the merge"
                  if not seen else "it covers no key block at all (out 0, lse -inf)" if not seen[0]
                  else f"it is attention over key blocks {seen[0]} only")
        raise AssertionError(f"the output of query block {r} (must see key blocks 0..{r}) differs from one "
                             f"process's causal attention by {np.abs(out - want_out).max():.1e}; {covers}")
    block = 2 * N * B * H * D * 8
    assert sent == (p - 1) * block, (
        f"sent {sent} bytes = {sent / block:g} K/V blocks of {block} bytes; the ring passes each block on "
        f"C - 1 = {p - 1} times (the last one received is not sent again)")
    if r == 0:
        print(f"{p} ranks: every query block's output and log-sum-exp equal one process's causal attention; "
              f"each rank sent C-1 = {p - 1} K/V blocks ({sent} bytes)", flush=True)


if __name__ == "__main__":
    main(__doc__, check, "ring_attention")
