"""Load balancing for data parallelism: each replica's share of the global batch in
proportion to its measured speed, with the update unchanged.

A synchronous step lasts as long as its slowest replica.  If replica i takes n_i of the
N rows (Σ n_i = N) and its loss L_i is the mean over its rows, the global-batch loss is

    L = Σ_i (n_i / N) · L_i

and DDP's average of the replicas' gradients, (1/dp)·Σ_i g_i, equals ∇L when replica i
back-propagates w_i·L_i with w_i = dp·n_i/N.  So the shares may change freely: the
update stays that of the single process on the whole batch.

Every ``every`` steps the ranks all-gather their forward+backward seconds; a replica's
time is its slowest member's (tp, cp and pp peers share its rows), its speed n_i / t_i,
and the new shares are N·speed_i/Σ speed rounded (largest remainders) to multiples of the
gradient-accumulation count, at least one micro-batch each.  Every rank computes them
from the same gathered numbers, so all agree without another message.

``MINIPAR_SLOW_RANK="R:F"`` (``minipar/train/faults.py``) makes world rank R sleep (F-1)× its
compute after every forward/backward: a documented way to show a straggler.
"""
from __future__ import annotations

import numpy as np


def even_shares(rows, dp):
    return [rows // dp] * dp


def proportional_shares(rows, speeds, quantum=1):
    """Integers, multiples of ``quantum``, at least ``quantum`` each, summing to ``rows``,
    in proportion to ``speeds`` (largest remainders)."""
    units, n = rows // quantum, len(speeds)
    speeds = np.asarray(speeds, dtype=np.float64)
    ideal = units * speeds / speeds.sum()
    base = np.maximum(np.floor(ideal).astype(int), 1)
    while base.sum() > units:                       # the floor of 1 each overshot: take back
        base[np.argmax(base - ideal)] -= 1
    for i in np.argsort(-(ideal - base))[: units - base.sum()]:
        base[i] += 1
    return [int(b) * quantum for b in base]


class Balancer:
    def __init__(self, grid, batch_size, grad_accum=1, enabled=False, every=5):
        self.grid, self.rows, self.quantum = grid, batch_size, grad_accum
        self.enabled, self.every = enabled, every
        self.shares = even_shares(batch_size, grid.dp)
        self.times = []

    def my_rows(self, x):
        """This replica's rows of the global batch under the current shares."""
        i = self.grid.coords.dp
        start = sum(self.shares[:i])
        return x[start:start + self.shares[i]]

    @property
    def weight(self):
        """w_i = dp·n_i/N: the factor on this replica's loss that keeps the update exact."""
        return self.grid.dp * self.shares[self.grid.coords.dp] / self.rows

    def record(self, step, compute_s):
        """After each step: remember this rank's forward+backward time; every ``every``
        steps, agree on new shares (collective over the world)."""
        if not self.enabled or self.grid.dp == 1:
            return
        self.times.append(compute_s)
        if (step + 1) % self.every:
            return
        mine = np.array([float(np.mean(self.times)), self.grid.coords.dp], dtype=np.float64)
        self.times = []
        everyone = np.array(self.grid.world.mpi.allgather(mine))
        per_replica = np.zeros(self.grid.dp)
        for t, d in everyone:
            per_replica[int(d)] = max(per_replica[int(d)], t)
        speeds = np.array(self.shares) / np.maximum(per_replica, 1e-9)
        self.shares = proportional_shares(self.rows, speeds, self.quantum)
