"""Lesson 19's exercise on every rank: your RoPE under context parallelism.

    mpiexec -n 2 python lessons/19_yours.py rope --file MINE.py

``MINE.py`` defines ``my_rope(x, positions, base)``.  The sequence of 4·C·n tokens is cut
into 2C chunks; rank r holds chunks r and 2C-1-r (the zig-zag split of lesson 16), so its
tokens' true positions are two far-apart runs.  Each rank rotates its q rows with your
function at those positions; the ranks all-gather the results and put the chunks back in
order; every rank compares the whole sequence with one process rotating it at 0..N-1.
A rank that rotated its tokens at 0..n-1 instead (its local index) is named as such.
"""
import argparse
import os
import sys

try:
    import minipar  # noqa: F401
except ImportError:  # run from a checkout without installing: use the repository root
    sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

import numpy as np

from minipar.autograd import Tensor
from minipar.comm import Communicator, all_gather
from minipar.nn.rope import apply_rope, rope_angles
from minipar.parallel.context.split import positions_of
from yours import check_on_every_rank, load

B, H, D, BASE = 1, 2, 16, 10000.0


def rope_at(x, positions):
    angles = rope_angles(positions, D, BASE)
    return apply_rope(Tensor(x), np.cos(angles), np.sin(angles)).data


def check(comm, my_rope):
    cp, r = comm.size, comm.rank
    seq = 8 * cp                                          # 2·cp chunks of 4 tokens
    q = np.random.default_rng(0).standard_normal((B, H, seq, D))
    mine = np.asarray(positions_of(r, cp, seq, zigzag=True))
    out = np.asarray(my_rope(np.ascontiguousarray(q[:, :, mine]), mine, BASE), dtype=np.float64)
    want = rope_at(q[:, :, mine], mine)
    if out.shape != want.shape:
        raise AssertionError(f"my_rope returned shape {out.shape} for x of shape {q[:, :, mine].shape}")
    if not np.allclose(out, want, rtol=1e-12, atol=1e-12):
        local = rope_at(q[:, :, mine], np.arange(len(mine)))
        if np.allclose(out, local, rtol=1e-12, atol=1e-12):
            raise AssertionError(f"rotated its tokens at 0..{len(mine) - 1}, their index on this rank; "
                                 f"their true positions are {mine.tolist()}")
        token = int(np.argmax(np.abs(out - want).max(axis=(0, 1, 3))))
        raise AssertionError(f"token {token} (true position {mine[token]}) differs from minipar's RoPE")
    gathered = np.asarray(all_gather(comm, np.ascontiguousarray(np.moveaxis(out, 2, 0)))) \
        .reshape(cp * len(mine), B, H, D)
    every = np.concatenate([positions_of(s, cp, seq, zigzag=True) for s in range(cp)])
    whole = np.empty((seq, B, H, D))
    whole[every] = gathered
    assert np.allclose(np.moveaxis(whole, 0, 2), rope_at(q, np.arange(seq)), rtol=1e-12, atol=1e-12), \
        "the gathered sequence differs from one process's RoPE"
    if r == 0:
        print(f"{cp} ranks, zig-zag chunks at positions " +
              "; ".join(str(positions_of(s, cp, seq, zigzag=True).tolist()) for s in range(cp)) +
              ": every rank's rotated q equals one process's, and so does the gathered sequence", flush=True)


def main():
    p = argparse.ArgumentParser()
    p.add_argument("exercise", choices=["rope"])
    p.add_argument("--file", required=True)
    args = p.parse_args()
    comm = Communicator()
    check_on_every_rank(comm, check, load(args.file, "my_rope"))


if __name__ == "__main__":
    main()
