"""Solutions of lesson 21's exercises (the test suite runs the notebook with them)."""

SOLUTIONS = {
    "balance_loss": r'''
def my_balance_loss(probs, chosen, n_experts):
    """Per sequence E·Σ_i f_i·P_i, averaged over the sequences."""
    b, t, k = chosen.shape
    counts = np.stack([np.bincount(c.reshape(-1), minlength=n_experts) for c in chosen])   # (B, E)
    f = Tensor(counts / (k * t))                        # the share of the k·T choices: no gradient
    P = ops.mean(probs, axis=1)                         # (B, E) the mean probability: a Tensor
    per_sequence = ops.sum(ops.mul(P, f), axis=-1)      # (B,)
    return ops.mul(ops.mean(per_sequence), float(n_experts))
''',
    "dispatch": r'''
%%writefile {MINE}/experts.py
"""Your expert-parallel MoE layer (lesson 21): run under mpiexec by 21_yours.py."""
import numpy as np

from minipar.autograd import ops
from minipar.backend import to_host, xp
from minipar.comm import all_to_all
from minipar.parallel.experts import AllToAll    # all_to_all as an autograd op (given)


def moe_layer(comm, moe, x):
    """x (T, d): this rank's tokens -> (T, d), Σ_j w_j · expert_{e_j}(x[t]) (top-k routing)."""
    T, d = x.shape
    E, k, ep = moe.n_experts, moe.top_k, comm.size
    per = E // ep                                                  # experts per rank
    first = comm.rank * per                                        # mine: first .. first+per-1
    probs = moe.router_probs(x)                                    # (T, E), a Tensor
    chosen = xp.argsort(-probs.data, axis=-1)[:, :k]               # route: top-k, largest first
    top = ops.getitem(probs, (xp.arange(T)[:, None], chosen))
    weights = ops.div(top, ops.sum(top, axis=-1, keepdims=True))   # renormalised, Σ_j w = 1
    slot_expert = chosen.reshape(-1)                               # slot t·k + j -> its expert
    slots = xp.argsort(slot_expert)                                # permute: slots by expert
    counts = np.bincount(to_host(slot_expert), minlength=E)        # rows for each expert
    from_each = all_to_all(comm, counts.reshape(E, 1), [per] * ep)[0].reshape(ep, per)
    received = AllToAll.apply(ops.getitem(x, slots // k), comm=comm,
                              counts=counts.reshape(ep, per).sum(axis=1).tolist())
    starts = np.concatenate([[0], np.cumsum(from_each.reshape(-1))])   # (rank, expert) blocks
    outputs, rows_of = [], []
    for j in range(per):                                           # each of my experts, once
        rows = np.concatenate([np.arange(starts[q * per + j], starts[q * per + j + 1])
                               for q in range(ep)]).astype(np.int64)
        outputs.append(moe.experts[first + j](ops.getitem(received, xp.asarray(rows))))
        rows_of.append(rows)
    by_expert = ops.concat(outputs, axis=0)                        # grouped by my expert
    back_in_order = np.argsort(np.concatenate(rows_of))            # -> grouped by source rank
    by_rank = ops.getitem(by_expert, xp.asarray(back_in_order))
    back = AllToAll.apply(by_rank, comm=comm, counts=from_each.sum(axis=1).tolist())
    per_slot = ops.getitem(back, xp.argsort(slots))                # un-permute: slot order
    per_slot = ops.reshape(per_slot, (T, k, d))
    return ops.sum(ops.mul(per_slot, ops.reshape(weights, (T, k, 1))), axis=1)
''',
}
