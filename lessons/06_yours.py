"""Lesson 06's exercise on every rank: your ZeRO-3 step against one process.

    mpiexec -n 4 python lessons/06_yours.py --file MINE.py

``MINE.py`` defines ``zero3_step(comm, shards, shape, x, target)`` for a stack of layers
h_{i+1} = tanh(h_i · W_i) with loss = mean over rows of ½‖h_L − target‖².  Rank r keeps
only ``shards[i]``, chunk r of layer i's flattened weight; it must gather a layer's full
weight just before using it and drop it just after, in forward and again in backward,
and return its loss and its shard of every layer's gradient of the *global* batch loss.

The check replaces ``all_gather`` in the learner's module by a spy that calls the real
one and watches the array it returns (a weak reference: CPython frees an array the
moment nothing refers to it).  Three SGD steps in float64, each rank on its rows:

- **memory**: at every gather, the full weights still alive, plus the new one, must be
  one layer's: peak live parameter bytes = one layer's full weight + this rank's shards;
- **traffic**: 2L all-gathers (each layer in forward and in backward) and the bytes of
  ZeRO-3, 3(p-1)/p·Ψ per rank (two all-gathers and one reduce-scatter of Ψ bytes);
- **parity**: the loss and every gradient shard equal one process's on the whole batch.
"""
import os
import sys
import weakref

try:
    import minipar  # noqa: F401
except ImportError:  # run from a checkout without installing: use the repository root
    sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

import numpy as np

from minipar import backend
from minipar.backend import to_device, to_host
from minipar.comm import all_gather, chunk_bounds
from yours import main, tanh_stack

D, LAYERS, ROWS, STEPS, LR = 64, 4, 4, 3, 0.5


class GatherSpy:
    """all_gather, watched: how many full weights are alive when a new one is made."""

    def __init__(self, comm, shards):
        self.comm, self.live, self.calls, self.peak = comm, {}, 0, 0
        self.shard_bytes = sum(s.nbytes for s in shards)

    def __call__(self, comm, shard, *args, **kwargs):
        full = all_gather(comm, shard, *args, **kwargs)
        self.calls += 1
        alive = sum(self.live.values())
        one = full.nbytes
        assert alive == 0, (
            f"all-gather number {self.calls} ({'forward' if self.calls <= LAYERS else 'backward'}): "
            f"{alive // one} full weight(s) from earlier gathers are still alive ({alive} bytes) beside "
            f"the new one ({one} bytes); ZeRO-3 holds one layer's full weight at a time, so peak live "
            f"parameter bytes should be {one} + the shards {self.shard_bytes}, here "
            f"{alive + one + self.shard_bytes}")
        key = id(full)
        self.live[key] = one
        weakref.finalize(full, self.live.pop, key, None)
        self.peak = max(self.peak, alive + one + self.shard_bytes)
        return full


def check(comm, zero3_step):
    backend.set_default_dtype(np.float64)
    p, r = comm.size, comm.rank
    rng = np.random.default_rng(0)
    weights = [rng.normal(0, 1 / np.sqrt(D), (D, D)) for _ in range(LAYERS)]
    b = chunk_bounds(D * D, p)
    shards = [to_device(W.reshape(-1)[b[r]:b[r + 1]].copy()) for W in weights]
    spy = GatherSpy(comm, shards)
    zero3_step.__globals__["all_gather"] = spy      # the learner's calls now go through the spy
    for step in range(STEPS):
        x, target = rng.normal(size=(ROWS * p, D)), rng.normal(size=(ROWS * p, D))
        rows = slice(r * ROWS, (r + 1) * ROWS)
        comm.reset_counters()
        spy.calls = 0
        loss, grads = zero3_step(comm, shards, (D, D), to_device(x[rows]), to_device(target[rows]))
        sent = comm.bytes_sent
        want_loss, want = tanh_stack(weights, x, target)
        assert spy.calls == 2 * LAYERS, (
            f"step {step}: {spy.calls} all-gathers for {LAYERS} layers; ZeRO-3 gathers every layer twice, "
            "once in forward and once again in backward")
        psi = LAYERS * D * D * 8
        assert sent == 3 * (p - 1) * psi // p or p == 1, (
            f"step {step}: this rank sent {sent} bytes; ZeRO-3 sends 3(p-1)/p·Ψ = {3 * (p - 1) * psi // p} "
            f"(Ψ = {psi} bytes: all-gather in forward, again in backward, reduce-scatter of the gradients)")
        total = sum(comm.mpi.allgather(float(loss))) / p
        assert abs(total - want_loss) <= 1e-12 * want_loss, \
            f"step {step}: the mean of the ranks' losses is {total!r}, one process's {want_loss!r}"
        for i, (g, full) in enumerate(zip(grads, want)):
            ref, g = full.reshape(-1)[b[r]:b[r + 1]], to_host(g).reshape(-1)
            assert g.shape == ref.shape, (f"step {step}, layer {i}: your gradient shard has {g.size} elements, "
                                          f"rank {r}'s chunk of the layer has {ref.size}")
            err = np.abs(g - ref).max() / np.abs(ref).max()
            how = f" ({p}x: the sum over ranks, not the mean)" if np.allclose(g, p * ref, rtol=1e-9) else ""
            assert err <= 1e-10, (f"step {step}, layer {i}: your gradient shard differs from chunk {r} of "
                                  f"one process's gradient by {err:.1e} relative{how}")
        for i, (W, g) in enumerate(zip(weights, want)):     # SGD, on the shards and on the oracle
            W -= LR * g
            shards[i] -= LR * to_device(grads[i]).reshape(-1)
        if r == 0:
            print(f"step {step}: loss {total:.15f} = one process's; {spy.calls} all-gathers, "
                  f"{sent} bytes sent = 3(p-1)/p·Ψ; peak live parameter bytes {spy.peak} = one layer "
                  f"{D * D * 8} + the shards {spy.shard_bytes}", flush=True)


if __name__ == "__main__":
    main(__doc__, check, "zero3_step")
