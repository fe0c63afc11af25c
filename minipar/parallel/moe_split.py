"""A mixture of experts whose sequences are split over ranks (context parallelism, and
the tp ranks under sequence parallelism).

The MoE layer's statistics are per sequence (``nn/moe.py``): the balancing loss
multiplies two means over the sequence's T tokens, and the capacity drop takes the
assignments of the whole sequence in the order (choice, position).  When each of C
ranks holds T/C positions of every sequence, no rank sees a whole sequence, so:

    chosen   the (B, T/C, k) expert choices of each rank are all-gathered and laid back
             at their positions: every rank has the sequence's (B, T, k) choices (ints,
             k·T·B of them per layer), so the counts f_i and the drop order are the
             single process's exactly, and each rank keeps its own positions' verdicts
    P_i      (1/T) Σ_t p[t, i]: each rank sums its positions, the sum is all-reduced
             (forward: the sum over ranks; backward: identity, each rank's probabilities
             get dL/dP_i / T for its own positions — ``ReduceFromTensorParallelRegion``)

Every rank then computes the same aux loss value, and the loss a rank reports (averaged
over the data-parallel ranks, dp × cp) carries it once.  Its gradient does not: the
gradients are averaged over dp × cp, and each cp rank's router sees only its own
positions' share of d aux/dθ, so the mean would hold 1/C of it.  The aux gradient is
therefore seeded C times on each cp rank (``aux_grad_scale``).  Sequence parallelism's
tp ranks hold T/tp positions each the same way, but sum their router gradients (a
weight replicated over tp under sequence parallelism, ``Placement.tp_partial_grad``):
no scale for them.
"""
from __future__ import annotations

import numpy as np

from minipar.backend import to_host, xp
from minipar.comm import all_gather, chunk_bounds
from minipar.parallel.tensor.regions import ReduceFromTensorParallelRegion


class SequenceSplit:
    """The positions each rank of ``comm`` holds of every sequence; made once (a
    collective: the ranks exchange their positions).  ``aux_grad_scale``: how many of
    the ranks average their gradients (the cp ranks; tp ranks sum theirs)."""

    def __init__(self, comm, my_positions, aux_grad_scale):
        self.comm = comm
        mine = np.asarray(to_host(my_positions), dtype=np.int64)
        every = to_host(all_gather(comm, xp.asarray(mine), sizes=[mine.size] * comm.size))
        self.positions = np.asarray(every, dtype=np.int64).reshape(comm.size, mine.size)
        self.seq_len = self.positions.size
        self.aux_grad_scale = aux_grad_scale

    def gather(self, local):
        """(B, T/C, k) of this rank's positions -> (B, T, k) of the whole sequences."""
        b, _, k = local.shape
        parts = all_gather(self.comm, xp.ascontiguousarray(local).reshape(-1),
                           sizes=[local.size] * self.comm.size)
        parts = parts.reshape(self.comm.size, b, -1, k)
        whole = xp.empty((b, self.seq_len, k), dtype=local.dtype)
        for r in range(self.comm.size):
            whole[:, xp.asarray(self.positions[r])] = parts[r]
        return whole

    def mine(self, whole):
        """This rank's positions of a (B, T, ...) array."""
        return whole[:, xp.asarray(self.positions[self.comm.rank])]

    def sum(self, tensor):
        """Σ over the ranks of a Tensor (forward), its gradient passed through (backward)."""
        return ReduceFromTensorParallelRegion.apply(tensor, comm=self.comm)


def split_moe_sequences(model, grid, cp_positions, seq_len, sequence_parallel):
    """Give every MoE layer of ``model`` the split of its sequences: over the cp ranks
    (``cp_positions``, this rank's), and under sequence parallelism over the tp ranks too
    (each the contiguous ``chunk_bounds`` part of its cp positions, as ``embed`` cuts
    them).  A collective over those ranks; nothing where no sequence is split."""
    from minipar.nn.moe import moe_modules
    layers = moe_modules(model)
    tp = grid.tp if sequence_parallel else 1
    if not layers or grid.cp * tp == 1:
        return
    positions = np.arange(seq_len) if cp_positions is None else to_host(cp_positions)
    comm = grid.cp_comm
    if tp > 1:
        bounds = chunk_bounds(len(positions), tp)
        t = grid.coords.tp
        positions = positions[bounds[t]:bounds[t + 1]]
        comm = grid.tp_comm if grid.cp == 1 else grid.world.split(
            color=grid.coords.pp * grid.dp + grid.coords.dp, key=grid.coords.cp * tp + t)
    split = SequenceSplit(comm, positions, aux_grad_scale=grid.cp)
    for layer in layers:
        layer.sequence_split = split
