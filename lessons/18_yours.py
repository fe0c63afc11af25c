"""Lesson 18's exercise on every rank: your window sampler under data parallelism.

    mpiexec -n 2 python lessons/18_yours.py --file MINE.py --data DIR

``MINE.py`` defines ``my_batch(shards, seed, step, batch_size, seq_len)``.  Each rank maps
the tokenized dataset DIR's training shards, runs your sampler for steps 0..9, keeps its
rows of the global batch (rank r of p: rows r·B/p .. (r+1)·B/p - 1) and checks them
against the same rows of minipar's ``TokenDataset.batch``; then the ranks all-gather their
rows and check, on every rank, that together they are the whole global batch.  No message
about the data is needed to agree on it: the batch is a function of (seed, step).
"""
import argparse
import os
import sys

try:
    import minipar  # noqa: F401
except ImportError:  # run from a checkout without installing: use the repository root
    sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

import numpy as np

from minipar.comm import Communicator, all_gather
from minipar.data.shards import map_tokens
from minipar.data.tokens import TokenDataset
from yours import check_on_every_rank, load

SEED, BATCH, SEQ = 7, 8, 32


def check(comm, my_batch, directory):
    p, r = comm.size, comm.rank
    dataset = TokenDataset(directory, SEQ)
    shards = [map_tokens(path, n) for path, n in zip(dataset.train.paths, dataset.train.counts)]
    rows = slice(r * BATCH // p, (r + 1) * BATCH // p)
    for step in range(10):
        x, y = (np.asarray(a) for a in my_batch(shards, SEED, step, BATCH, SEQ))
        want_x, want_y = dataset.batch(SEED, step, BATCH)
        if x.shape != want_x.shape:
            raise AssertionError(f"step {step}: your batch has shape {x.shape}, expected {want_x.shape}")
        mine_x, mine_y = x[rows], y[rows]
        for i in range(mine_x.shape[0]):
            if not (np.array_equal(mine_x[i], want_x[rows][i]) and np.array_equal(mine_y[i], want_y[rows][i])):
                j = int(np.argmax((mine_x[i] != want_x[rows][i]) | (mine_y[i] != want_y[rows][i])))
                raise AssertionError(f"step {step}, my row {i} (global window {rows.start + i}): token {j} "
                                     f"differs, yours {mine_x[i][j]}, minipar's {want_x[rows][i][j]}")
        together = np.asarray(all_gather(comm, np.ascontiguousarray(mine_x))).reshape(want_x.shape)
        assert np.array_equal(together, want_x), f"step {step}: the gathered rows are not the global batch"
    if r == 0:
        print(f"{p} ranks, 10 steps of {BATCH} windows across {len(shards)} shards: each rank's rows of your "
              f"batch equal minipar's, and the ranks' rows together are the global batch", flush=True)


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--file", required=True)
    ap.add_argument("--data", required=True)
    args = ap.parse_args()
    comm = Communicator()
    check_on_every_rank(comm, check, load(args.file, "my_batch"), args.data)


if __name__ == "__main__":
    main()
