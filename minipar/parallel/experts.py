"""Expert parallelism: the experts of every MoE block split over the ``ep`` ranks of an
expert-parallel group, tokens sent to their experts and back by all-to-all.

Each of the ep ranks holds E/ep experts — rank q the experts [q·E/ep, (q+1)·E/ep) —
and routes its own tokens (the router is replicated, as every dense weight).  One MoE
layer on rank r, after routing (``nn/moe.py``: top-k, capacity):

    1. permute   the kept assignments (token, choice j), ordered by expert (stable):
                 their token rows are then grouped by the rank owning the expert
    2. counts    c[r][e] rows for expert e; one small all-to-all tells every owner how
                 many rows of each of its experts come from each rank (before any row)
    3. dispatch  all-to-all of the rows: rank r sends Σ_{e of q} c[r][e] rows to rank q
    4. experts   each local expert runs once on the rows of every rank for it (even on
                 zero rows, so every expert weight has a gradient each step)
    5. combine   all-to-all back, in the order the rows came; un-permute into
                 (token, choice) slots, where ``MoE`` weights and sums them

Both all-to-alls are ``AllToAll``: in backward each runs the other way with the counts
transposed (the rows' gradients go back where the rows came from).  Rank r sends
(k·T_r − dropped)·d elements each way per layer, those for its own experts as a local
copy.  Nothing computed depends on ep: a row's expert output is the same whichever
rank computes it, and the routing, balancing loss and capacity are each rank's own
sequences (``nn/moe.py``).

Gradients.  An expert's weight gradient on rank q sums over the rows of every rank of
its ep group, each row's gradient from that rank's loss (the mean over that rank's
tokens).  The single process's gradient is the mean over the dp·cp data-parallel
ranks' losses, so the ranks holding the same experts (``grid.edp_comm``, dp·cp/ep of
them) sum their gradients and divide by dp·cp, not by their own number (Megatron
scales by edp/(dp·cp) for the same reason): ``ExpertSplitSync`` (``sync/experts.py``).
"""
from __future__ import annotations

import numpy as np

from minipar.autograd import ops
from minipar.autograd.function import Function
from minipar.autograd.tensor import Tensor
from minipar.backend import to_host, xp
from minipar.comm import all_to_all


def is_expert_weight(name):
    """Whether a parameter name is a routed expert's (``blocks.{i}.mlp.experts.{j}.…``)."""
    return ".mlp.experts." in name


class AllToAll(Function):
    """rows grouped by destination -> rows grouped by source; backward the reverse."""

    @staticmethod
    def forward(ctx, rows, comm=None, counts=None):
        received, recv_counts = all_to_all(comm, rows, counts)
        ctx.comm, ctx.recv_counts = comm, recv_counts
        return received

    @staticmethod
    def backward(ctx, g):
        return all_to_all(ctx.comm, xp.ascontiguousarray(g), ctx.recv_counts)[0]


class ExpertParallelDispatch:
    """``MoE.dispatch`` for a rank of an expert-parallel group (``comm``) holding the
    experts [first, first + len(local)) of ``n_experts``; see the module docstring."""

    def __init__(self, comm, n_experts):
        self.comm, self.n_experts = comm, n_experts
        self.per_rank = n_experts // comm.size
        self.first = comm.rank * self.per_rank

    def __call__(self, moe, tokens, slot_expert, keep, k):
        """(n·k, d) rows: the expert output of each (token, choice) slot, zeros where the
        assignment was dropped.  ``slot_expert`` (n·k,) expert ids, ``keep`` (n·k,) bools."""
        ep, per, d = self.comm.size, self.per_rank, tokens.shape[1]
        kept = xp.nonzero(keep)[0]
        order = xp.argsort(slot_expert[kept], kind="stable") if xp is np else \
            xp.argsort(slot_expert[kept])
        slots = kept[order]                                            # 1. by expert
        counts = to_host(xp.bincount(slot_expert[slots], minlength=self.n_experts)).astype(np.int64)
        from_each = all_to_all(self.comm, counts.reshape(ep * per, 1), [per] * ep)[0]
        from_each = from_each.reshape(ep, per)                         # 2. [rank, local expert]
        rows = ops.getitem(tokens, slots // k)
        received = AllToAll.apply(rows, comm=self.comm,                # 3. dispatch
                                  counts=counts.reshape(ep, per).sum(axis=1).tolist())
        starts = np.concatenate([[0], np.cumsum(from_each.reshape(-1))])
        outputs, placed = [], np.empty(int(starts[-1]), dtype=np.int64)
        done = 0
        for j, expert in enumerate(moe.experts[self.first:self.first + per]):   # 4.
            mine = np.concatenate([np.arange(starts[q * per + j], starts[q * per + j + 1])
                                   for q in range(ep)]).astype(np.int64)
            outputs.append(expert(ops.getitem(received, xp.asarray(mine))))
            placed[mine] = done + np.arange(len(mine))
            done += len(mine)
        by_rank = ops.getitem(ops.concat(outputs, axis=0), xp.asarray(placed))
        back = AllToAll.apply(by_rank, comm=self.comm,                 # 5. combine
                              counts=from_each.sum(axis=1).tolist())
        where = xp.full(len(slot_expert), len(slots), dtype=np.int64)
        where[slots] = xp.arange(len(slots))
        zero = Tensor(xp.zeros((1, d), dtype=tokens.dtype))
        return ops.getitem(ops.concat([back, zero], axis=0), where)


def apply_expert_parallel(model, ep_comm):
    """Keep on this rank only its experts of every MoE block (the others become None:
    names stay global, ``blocks.3.mlp.experts.5.…``) and dispatch to the group's."""
    from minipar.nn.moe import moe_modules
    for module in moe_modules(model):
        dispatch = ExpertParallelDispatch(ep_comm, module.n_experts)
        lo, hi = dispatch.first, dispatch.first + dispatch.per_rank
        module.experts = [e if lo <= j < hi else None for j, e in enumerate(module.experts)]
        module.dispatch = dispatch
