"""Lesson 19's exercise on every rank: RoPE and grouped-query attention under context parallelism.

    mpiexec -n 2 python lessons/19_yours.py --file MINE.py

``MINE.py`` defines ``my_cp_attention(comm, q, k, v, positions, base)``.  A sequence of
N = 4·2·cp tokens is cut into 2·cp chunks of 4; rank r holds chunks r and 2·cp-1-r (the
zig-zag split of lesson 16), so its q (B, H, n, d) and k, v (B, H_kv, n, d) rows sit at
the true positions ``positions[r]`` — two far-apart runs — while ``positions[s]`` gives
every rank's.  Your function returns the causal attention output of the rank's queries
over the whole sequence, (B, H, n, d).  In float64 it checks, on every rank:

- **parity**: the output equals minipar's one-process llama attention on the same data
  (``RotaryEmbedding`` on q and k at 0..N-1, then ``AttentionCore``, which reads each KV
  head in place), relative 1e-10; if not, the first token (by true position) and query
  head that differ, its KV head, and which usual mistake the output matches, if one does;
- **traffic**: the rank received the other ranks' K and V of H_kv heads, exactly
  (cp-1)·2·B·H_kv·n·d·8 bytes, not the G = H/H_kv times larger volume of repeated heads;
  and no ``np.repeat`` / ``np.tile`` made a copy of K or V.
"""
import contextlib
import os
import sys

try:
    import minipar  # noqa: F401
except ImportError:  # run from a checkout without installing: use the repository root
    sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

import numpy as np

from minipar import backend
from minipar.autograd import Tensor
from minipar.nn.attention import AttentionCore
from minipar.nn.rope import RotaryEmbedding, apply_rope, rope_angles
from minipar.parallel.context.split import positions_of
from yours import main

B, H, H_KV, D, CHUNK, BASE = 1, 6, 2, 16, 4, 10000.0
G = H // H_KV


def minipar_attention(q, k, v):
    """What minipar's llama attention does between its projections, in one process."""
    rope = RotaryEmbedding(D, BASE)
    return AttentionCore("naive")(rope(Tensor(q)), rope(Tensor(k)), Tensor(v)).data


def variant(q, k, v, table, r, rotate="true", mask="true", kv_head="group", keys="all"):
    """Rank r's output with one choice changed (the usual mistakes, to name the learner's);
    q, k, v are the whole sequence in rank order, rows r·n..(r+1)·n - 1 rank r's."""
    n = table.shape[1]
    if rotate != "none":
        angles = rope_angles(table.ravel() if rotate == "true" else np.tile(np.arange(n), len(table)), D, BASE)
        q, k = (apply_rope(Tensor(x), np.cos(angles), np.sin(angles)).data for x in (q, k))
    q_at, k_at = table[r], table.ravel()
    cols = np.arange(len(k_at)) if keys == "all" else np.arange(r * n, (r + 1) * n)
    heads = np.arange(H) // G if kv_head == "group" else np.arange(H) % H_KV
    scores = q[:, :, r * n:(r + 1) * n] @ k[:, heads][:, :, cols].swapaxes(-1, -2) / np.sqrt(D)
    visible = {"true": k_at[cols][None, :] <= q_at[:, None], "none": np.ones((n, len(cols)), bool),
               "index": cols[None, :] <= np.arange(r * n, (r + 1) * n)[:, None]}[mask]
    scores = np.where(visible, scores, -np.inf)
    p = np.exp(scores - scores.max(axis=-1, keepdims=True))
    return (p / p.sum(axis=-1, keepdims=True)) @ v[:, heads][:, :, cols]


MISTAKES = [
    ("q and k are not rotated at all", dict(rotate="none")),
    ("q and k are rotated at their row on each rank (0..n-1), not at their true positions", dict(rotate="local")),
    ("query head h reads KV head h % H_kv instead of h // G", dict(kv_head="interleaved")),
    ("the mask compares rows of the gathered K in rank order, not true positions", dict(mask="index")),
    ("there is no causal mask", dict(mask="none")),
    ("the queries see only this rank's own keys", dict(keys="own")),
]


@contextlib.contextmanager
def no_repeated_kv(kv_size):
    """np.repeat / np.tile of an array as large as K or V fails: read each KV head in place."""
    saved = {"repeat": np.repeat, "tile": np.tile}

    def refusing(name):
        def call(a, *args, **kwargs):
            if np.size(a) >= kv_size:
                raise AssertionError(f"np.{name} of an array of {np.size(a)} numbers (K or V here holds "
                                     f"{kv_size}): read each KV head in place instead of copying it per query head")
            return saved[name](a, *args, **kwargs)
        return call

    np.repeat, np.tile = refusing("repeat"), refusing("tile")
    try:
        yield
    finally:
        np.repeat, np.tile = saved["repeat"], saved["tile"]


def first_difference(got, want):
    """(row, head) where got and want first differ: the first row (a zig-zag rank's rows are in
    true-position order), then the first query head."""
    bad = ~np.isclose(got, want, rtol=1e-10, atol=1e-12).all(axis=(0, 3))       # (H, n)
    heads, rows = np.nonzero(bad)
    return rows.min(), heads[rows == rows.min()].min()


def check_parity(out, want, q, k, v, table, r):
    if out.shape != want.shape:
        raise AssertionError(f"returned shape {out.shape}; the rank's queries give (B, H, n, d) = {want.shape}")
    if np.allclose(out, want, rtol=1e-10, atol=1e-12):
        return
    row, head = first_difference(out, want)
    in_rank_order = [x[:, :, table.ravel()] for x in (q, k, v)]          # the sequence as a gather lays it out
    named = [what for what, choice in MISTAKES
             if np.allclose(out, variant(*in_rank_order, table, r, **choice), rtol=1e-10, atol=1e-12)]
    cause = (f"it matches attention where {' — or where '.join(named)}" if named else
             "it matches none of the usual mistakes (rotation at local rows, head h % H_kv, mask by row, "
             "no mask, own keys only)")
    raise AssertionError(f"the token at true position {table[r][row]} (row {row} here), query head {head} "
                         f"(reads KV head {head // G}): differs from minipar's one-process llama attention by "
                         f"{np.abs(out - want)[:, head, row].max():.1e}; {cause}")


def check_traffic(received, cp, n):
    volume = (cp - 1) * 2 * B * H_KV * n * D * 8
    if received != volume:
        repeated = (" — the K/V of all H query heads: send the H_kv heads, repeat nothing"
                    if received == G * volume else "")
        raise AssertionError(f"received {received} bytes{repeated}; the other ranks' K and V of H_kv = {H_KV} heads "
                             f"are (cp-1)·2·B·H_kv·n·d·8 = {volume} bytes")
    return volume


def check(comm, my_cp_attention):
    backend.set_default_dtype(np.float64)
    cp, r = comm.size, comm.rank
    seq = 2 * cp * CHUNK
    rng = np.random.default_rng(0)
    q, k, v = rng.standard_normal((B, H, seq, D)), *rng.standard_normal((2, B, H_KV, seq, D))
    table = np.stack([positions_of(s, cp, seq, zigzag=True) for s in range(cp)])     # (cp, n)
    mine = table[r]
    comm.reset_counters()
    with no_repeated_kv(B * H_KV * len(mine) * D):
        out = my_cp_attention(comm, *(np.ascontiguousarray(x[:, :, mine]) for x in (q, k, v)), table.copy(), BASE)
    received = comm.bytes_recv
    check_parity(np.asarray(out, dtype=np.float64), minipar_attention(q, k, v)[:, :, mine], q, k, v, table, r)
    volume = check_traffic(received, cp, len(mine))
    if r == 0:
        print(f"{cp} ranks, zig-zag positions {'; '.join(str(row.tolist()) for row in table)}: every rank's output "
              f"equals minipar's one-process llama attention (RoPE, H = {H} query heads on H_kv = {H_KV}), and each "
              f"rank received {volume} bytes of K/V, 1/{G} of what repeated heads would move", flush=True)


if __name__ == "__main__":
    main(__doc__, check, "my_cp_attention")
