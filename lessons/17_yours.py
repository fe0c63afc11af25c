"""Lesson 17's exercise on every rank: your reshard read, on a real sharded checkpoint.

    mpiexec -n 2 python lessons/17_yours.py --file MINE.py --checkpoint DIR

``MINE.py`` defines ``my_intersect(a, b)`` and ``my_read(pieces, want)`` (boxes are
``(offsets, lengths)``).  DIR was written under another layout (the notebook saves it
under dp2 ZeRO-3: each rank's file holds flat ranges of the tensors, recorded in the index
as boxes).  Each rank here plays one rank of a tensor-parallel layout: for every
parameter it wants the r-th slice of the last axis and reads it with your ``my_read``
from the saved pieces — memory-mapped views of the rank files, so only the bytes of the
overlaps are touched.  Checked: every slice equals the library's ``Checkpoint.read`` of
the same box, and over the ranks every element of every tensor is read exactly once
(one all-reduce of the counts: nothing gathered, nothing read twice).
"""
import os
import sys

try:
    import minipar  # noqa: F401
except ImportError:  # run from a checkout without installing: use the repository root
    sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

import numpy as np

from minipar.checkpoint import open_checkpoint
from minipar.comm import all_reduce
from yours import main


def my_slice(shape, rank, size):
    """The box of the r-th of ``size`` slices of the last axis (np.array_split's rule)."""
    n = shape[-1]
    lo, hi = rank * n // size, (rank + 1) * n // size
    return (0,) * (len(shape) - 1) + (lo,), tuple(shape[:-1]) + (hi - lo,)


def check(comm, my_read, directory):
    ckpt = open_checkpoint(directory)
    read = 0
    for name in ckpt.names("param"):
        entry, dtype = ckpt.entry("param", name), ckpt.dtype("param", name)
        pieces = [((tuple(p["box"][0]), tuple(p["box"][1])), ckpt.piece_values(p, dtype))
                  for p in entry["pieces"]]
        want = my_slice(ckpt.shape("param", name), comm.rank, comm.size)
        got = np.asarray(my_read(pieces, want))
        expected = ckpt.read("param", name, want)
        if got.shape != expected.shape or not np.array_equal(got, expected):
            raise AssertionError(f"{name}: the box at offsets {want[0]}, lengths {want[1]} read from "
                                 f"{len(pieces)} saved pieces differs from the library's read")
        read += got.size
    counts = np.asarray(all_reduce(comm, np.array([read], dtype=np.float64)))
    total = sum(int(np.prod(ckpt.shape("param", n))) for n in ckpt.names("param"))
    assert int(counts[0]) == total, f"the ranks read {int(counts[0])} elements, the tensors hold {total}"
    if comm.rank == 0:
        files = {p["file"] for n in ckpt.names("param") for p in ckpt.entry("param", n)["pieces"]}
        print(f"{len(ckpt.names('param'))} tensors saved in {len(files)} rank files under "
              f"{ckpt.meta.get('layout', {}).get('name', '?')}, read as {comm.size} slices of the last axis "
              f"with your my_read: every slice equals the library's, and the {comm.size} ranks read "
              f"{total:,} elements, each once", flush=True)


if __name__ == "__main__":
    main(__doc__, check, "my_read", ("--checkpoint", "a dp2 ZeRO-3 checkpoint directory"))
