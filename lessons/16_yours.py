"""Lesson 16's exercises on every rank: your ring attention, or your Ulysses swaps, against one process.

    mpiexec -n 4 python lessons/16_yours.py --file MINE.py

The file says which: ``MINE.py`` defines ``ring_attention(comm, q, k, v)``, or the swaps
(below).  ``ring_attention``: rank r holds the r-th contiguous
block of the sequence's queries, keys and values, each (B, H, n, d); it returns the
causal attention output of its queries over the whole sequence and the log-sum-exp of
every row, ``(out (B, H, n, d), lse (B, H, n))``, having passed the K/V blocks around the
ring and merged each block's result with the online softmax.  In float64 it checks:

- **parity**: ``out`` and ``lse`` equal one process's causal attention, rows of rank r
  (relative 1e-10); if not, which key blocks the result *does* cover: each rank tries
  every subset of the blocks 0..r it must see (2^(r+1) of them) and names the one that
  matches, or says none does (a wrong mask or merge);
- **traffic**: every rank sent C - 1 K/V blocks, (C-1)·(k.nbytes + v.nbytes) bytes.

The swaps: ``sequence_to_heads(comm, x)`` and ``heads_to_sequence(comm, y)``, the
all-to-all swaps of Ulysses: rank r holds the r-th contiguous block of positions of every
head, x (B, H, n, d); ``sequence_to_heads`` returns all U·n positions of its H/U heads
(heads r·H/U .. (r+1)·H/U - 1), (B, H/U, U·n, d), and ``heads_to_sequence`` undoes it.
In float64 it checks each swap's result (which rank's positions or which heads landed
where, when they differ), its bytes — one all-to-all sends (U-1)/U of the block — and
then attention run whole on each rank's heads between the two swaps against one
process's causal attention, beside the library's ``UlyssesAttentionCore``.
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


HEADS = 8                          # the Ulysses exercise: 8 heads, so 4 ranks take 2 each


def _which_block(got, x_all, r, p, n):
    """What the learner's sequence_to_heads put in each position block: 'rank s, heads a..b'."""
    share = HEADS // p
    found = []
    for t in range(p):
        block = got[:, :, t * n:(t + 1) * n]
        names = [f"rank {s}'s positions of heads {g * share}..{(g + 1) * share - 1}"
                 for s in range(p) for g in range(p)
                 if block.shape == x_all[:, g * share:(g + 1) * share, s * n:(s + 1) * n].shape
                 and close(block, x_all[:, g * share:(g + 1) * share, s * n:(s + 1) * n])]
        found.append(f"rows {t * n}..{(t + 1) * n - 1} hold " + (names[0] if names else "none of them"))
    return "; ".join(found)


def check_ulysses(comm, sequence_to_heads):
    """The swaps, their bytes, and attention between them (the module docstring)."""
    from minipar.nn.attention import attention_core
    from minipar.autograd import Tensor
    from minipar.parallel.context import UlyssesAttentionCore, ulysses_groups, ulysses_positions
    heads_to_sequence = sequence_to_heads.__globals__.get("heads_to_sequence")
    if heads_to_sequence is None:
        raise AssertionError("the file defines sequence_to_heads but no heads_to_sequence")
    backend.set_default_dtype(np.float64)
    p, r = comm.size, comm.rank
    share = HEADS // p
    rng = np.random.default_rng(1)
    q, k, v = (rng.standard_normal((B, HEADS, p * N, D)) for _ in range(3))
    mine = slice(r * N, (r + 1) * N)
    local = [np.ascontiguousarray(x[:, :, mine]) for x in (q, k, v)]
    want = q[:, r * share:(r + 1) * share]
    comm.reset_counters()
    got = to_host(sequence_to_heads(comm, to_device(local[0])))
    sent = comm.bytes_sent
    swap_bytes = (p - 1) * local[0].nbytes // p
    if got.shape != want.shape:
        raise AssertionError(f"sequence_to_heads gave shape {got.shape}, want {want.shape}: all {p * N} "
                             f"positions of this rank's {share} heads ({r * share}..{(r + 1) * share - 1}); "
                             f"sent {sent} bytes, one all-to-all sends (U-1)/U of the block = {swap_bytes}")
    if not close(got, want):
        raise AssertionError(f"sequence_to_heads: want every rank's positions of heads {r * share}.."
                             f"{(r + 1) * share - 1} in rank order; {_which_block(got, q, r, p, N)}")
    if sent != swap_bytes:
        raise AssertionError(f"sequence_to_heads sent {sent} bytes; one all-to-all keeps 1/U of the "
                             f"block and sends the rest, (U-1)/U·{local[0].nbytes} = {swap_bytes}")
    comm.reset_counters()
    back = to_host(heads_to_sequence(comm, to_device(got)))
    if back.shape != local[0].shape or not close(back, local[0]):
        raise AssertionError(f"heads_to_sequence(sequence_to_heads(x)) is not x: shape {back.shape}, want "
                             f"{local[0].shape} (this rank's {N} positions of all {HEADS} heads)")
    if comm.bytes_sent != swap_bytes:
        raise AssertionError(f"heads_to_sequence sent {comm.bytes_sent} bytes, want {swap_bytes}")
    # attention whole on my heads, between the two swaps, against one process
    swapped = [sequence_to_heads(comm, to_device(x)) for x in local]
    out = to_host(heads_to_sequence(comm, attention_core(*(Tensor(x) for x in swapped), "naive").data))
    oracle = attention_core(*(Tensor(to_device(x)) for x in (q, k, v)), "naive").data
    oracle = to_host(oracle)
    if not close(out, oracle[:, :, mine]):
        raise AssertionError(f"the swaps are right but attention between them differs from one process's "
                             f"by {np.abs(out - oracle[:, :, mine]).max():.1e}")
    positions = ulysses_positions(r, p, p, p * N)         # the library's own cut: two pieces a rank
    library = UlyssesAttentionCore(*ulysses_groups(comm, p), "naive")(
        *(Tensor(to_device(np.ascontiguousarray(x[:, :, positions]))) for x in (q, k, v)))
    library_error = np.abs(to_host(library.data) - oracle[:, :, positions]).max()
    if r == 0:
        print(f"{p} ranks, {HEADS} heads: your swaps move each rank's {N} positions of all heads to all "
              f"{p * N} positions of {share} heads and back, {swap_bytes} bytes each ((U-1)/U of the "
              f"block); attention between them equals one process's causal attention (max error "
              f"{np.abs(out - oracle[:, :, mine]).max():.1e}), as the library's UlyssesAttentionCore does "
              f"({library_error:.1e})", flush=True)


def exercise_of(argv):
    """Which exercise the --file holds: the Ulysses swaps if it defines sequence_to_heads,
    else the ring."""
    path = argv[argv.index("--file") + 1] if "--file" in argv[:-1] else None
    if path and os.path.exists(path) and "def sequence_to_heads" in open(path).read():
        return "ulysses"
    return "ring"


if __name__ == "__main__":
    if exercise_of(sys.argv) == "ulysses":
        main(__doc__, check_ulysses, "sequence_to_heads")
    else:
        main(__doc__, check, "ring_attention")
