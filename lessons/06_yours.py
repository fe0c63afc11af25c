"""Lesson 06's exercise on every rank: your ZeRO-3 step, with prefetch, against one process.

    mpiexec -n 4 python lessons/06_yours.py --file MINE.py

``MINE.py`` defines ``zero3_step(comm, shards, shape, x, target)`` for a stack of layers
h_{i+1} = tanh(h_i · W_i) with loss = mean over rows of ½‖h_L − target‖².  Rank r keeps
only ``shards[i]``, chunk r of layer i's flattened weight.  It gathers a layer's full
weight with the non-blocking ``all_gather_async`` one layer ahead — while layer i
computes, the gather of the next layer (i+1 in forward, i-1 in backward) is in flight —
drops each full weight after its layer, and returns its loss and its shard of every
layer's gradient of the *global* batch loss.

The check replaces ``all_gather_async`` (and ``all_gather``) in the learner's module by a
spy that calls the real one and records the events of a step in order: a gather issued
(which layer, forward or backward), its handle waited, the layer's first use of the
weight it returned (its compute: the first matmul with it), and the moment the weight
is freed (a weak reference: CPython frees an array the moment nothing refers to it).
The check runs on NumPy whatever ``--backend`` says: it sees the compute through a
NumPy array subclass.  Three SGD steps in float64, each rank on its rows:

- **prefetch, by the order of events**: in forward the gather of layer i+1 is issued
  before layer i's compute begins, in backward the gather of layer i-1 before layer i's;
- **memory**: at every issue, full weights alive or in flight, the new one included,
  are at most 2 (the layer computing and the next);
- **traffic**: 2L gathers, every one non-blocking, and the bytes of ZeRO-3,
  3(p-1)/p·Ψ per rank (two all-gathers and one reduce-scatter of Ψ bytes);
- **parity**: the loss and every gradient shard equal one process's on the whole batch
  (relative 1e-12).
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
from minipar.comm import all_gather, all_gather_async, chunk_bounds
from yours import main, tanh_stack

D, LAYERS, ROWS, STEPS, LR = 64, 4, 4, 3, 0.5
PRODUCTS = {np.dot, np.einsum, np.tensordot, np.inner, np.vdot}   # besides @ (np.matmul)


class Watched(np.ndarray):
    """A gathered weight: its first use in a matmul is its layer's compute.  Whatever it
    computes comes back as a plain array (only the weight itself is watched)."""

    def __array_ufunc__(self, ufunc, method, *inputs, **kwargs):
        if ufunc is np.matmul:
            for a in inputs:
                if isinstance(a, Watched) and a.spy_note is not None:
                    a.spy_note()
        plain = [a.view(np.ndarray) if isinstance(a, Watched) else a for a in inputs]
        if "out" in kwargs:
            kwargs["out"] = tuple(a.view(np.ndarray) if isinstance(a, Watched) else a for a in kwargs["out"])
        return getattr(ufunc, method)(*plain, **kwargs)

    def __array_function__(self, func, types, args, kwargs):
        if func in PRODUCTS and self.spy_note is not None:
            self.spy_note()
        return super().__array_function__(func, types, args, kwargs)

    def __array_finalize__(self, obj):
        self.spy_note = getattr(obj, "spy_note", None)       # views (reshape, .T) report too


class GatherSpy:
    """all_gather_async, watched: the events of one step, and the full weights alive."""

    def __init__(self, shards):
        self.shards = shards
        self.shard_bytes = sum(s.nbytes for s in shards)
        self.new_step(0)

    def new_step(self, step):
        self.step = step
        self.events = []            # (what, layer, phase): issue, wait, compute, blocking
        self.alive = {}             # gather number -> layer, for the weights returned and not freed
        self.in_flight = {}         # gather number -> layer, issued and not yet waited
        self.peak = 0

    def phase(self):
        """The phase of the gather about to be recorded: forward for the first LAYERS, backward after."""
        return "forward" if sum(e[0] in ("issue", "blocking") for e in self.events) < LAYERS else "backward"

    def layer_of(self, shard):
        for i, s in enumerate(self.shards):
            if shard is s or (shard.shape == s.shape and np.array_equal(to_host(shard), to_host(s))):
                return i
        return None

    def all_gather_async(self, comm, shard, *args, **kwargs):
        number, layer, phase = len(self.events), self.layer_of(shard), self.phase()
        self.events.append(("issue", layer, phase))
        held = {**self.alive, **self.in_flight}
        assert len(held) + 1 <= 2, (
            f"step {self.step}, {phase}, gather of layer {layer}: {len(held) + 1} layers' full weights alive or in flight "
            f"(layers {', '.join(map(str, sorted(held.values())))} and {layer}); prefetch holds at most 2, "
            f"the layer computing and the next: free a weight when its layer is done")
        self.in_flight[number] = layer
        self.peak = max(self.peak, len(held) + 1)
        return WatchedHandle(all_gather_async(comm, shard, *args, **kwargs), self, number, layer, phase)

    def all_gather(self, comm, shard, *args, **kwargs):
        self.events.append(("blocking", self.layer_of(shard), self.phase()))
        return all_gather(comm, shard, *args, **kwargs)


class WatchedHandle:
    """The real gather's handle; wait() hands back the weight as a Watched array that owns
    its memory (so every view of it keeps it alive, and its death is the weight freed)."""

    def __init__(self, handle, spy, number, layer, phase):
        self.handle, self.spy, self.number, self.layer, self.phase = handle, spy, number, layer, phase
        self.full = None

    def wait(self, timeout=None):
        if self.full is None:
            result = self.handle.wait(timeout)
            self.handle = None                      # the spy's copy is the only full weight
            self.full = watched = np.ndarray.__new__(Watched, result.shape, result.dtype)
            watched[...] = result
            spy, number, layer, phase = self.spy, self.number, self.layer, self.phase
            spy.events.append(("wait", layer, phase))
            spy.in_flight.pop(number, None)
            spy.alive[number] = layer
            used = []

            def note():
                if not used:
                    used.append(True)
                    spy.events.append(("compute", layer, phase))
            watched.spy_note = note
            weakref.finalize(watched, spy.alive.pop, number, None)
        full, self.full = self.full, None           # the caller holds it now, not this handle
        return full

    def test(self):
        return self.handle is None or self.handle.test()


def check_events(spy, step):
    """2L non-blocking gathers, and each layer's next gather issued before its compute."""
    events = spy.events
    blocking = [(layer, phase) for what, layer, phase in events if what == "blocking"]
    if blocking:
        layer, phase = blocking[0]
        assert False, (f"step {step}, {phase}, layer {layer}: gathered with the blocking all_gather; nothing "
                       f"else runs while it moves: issue it with all_gather_async a layer ahead")
    issues = [(layer, phase) for what, layer, phase in events if what == "issue"]
    assert len(issues) == 2 * LAYERS, (
        f"step {step}: {len(issues)} all-gathers for {LAYERS} layers; ZeRO-3 gathers every layer twice, "
        "once in forward and once again in backward")
    for phase, order in (("forward", range(LAYERS)), ("backward", reversed(range(LAYERS)))):
        order = list(order)
        got = [layer for layer, ph in issues if ph == phase]
        assert got == order, (f"step {step}, {phase}: the gathers were issued for layers {got}; {phase} "
                              f"uses them in the order {order}")
        position = {(what, layer, ph): k for k, (what, layer, ph) in enumerate(events)}
        for layer, following in zip(order, order[1:]):
            computed = position.get(("compute", layer, phase))
            assert computed is not None, (f"step {step}, {phase}, layer {layer}: its gathered weight was never "
                                          "used in a matmul (the check sees the compute there)")
            issued = position[("issue", following, phase)]
            assert issued < computed, (
                f"step {step}, {phase}, layer {layer}: its compute began before the gather of layer {following} "
                f"was issued, so nothing travelled while it computed: layer {following}'s gather must be in "
                f"flight while layer {layer} computes")


def check(comm, zero3_step):
    backend.set_backend("numpy")                     # the spy watches NumPy arrays
    backend.set_default_dtype(np.float64)
    p, r = comm.size, comm.rank
    rng = np.random.default_rng(0)
    weights = [rng.normal(0, 1 / np.sqrt(D), (D, D)) for _ in range(LAYERS)]
    b = chunk_bounds(D * D, p)
    shards = [to_device(W.reshape(-1)[b[r]:b[r + 1]].copy()) for W in weights]
    spy = GatherSpy(shards)
    zero3_step.__globals__.update(all_gather_async=spy.all_gather_async, all_gather=spy.all_gather)
    for step in range(STEPS):
        x, target = rng.normal(size=(ROWS * p, D)), rng.normal(size=(ROWS * p, D))
        rows = slice(r * ROWS, (r + 1) * ROWS)
        comm.reset_counters()
        spy.new_step(step)
        loss, grads = zero3_step(comm, shards, (D, D), to_device(x[rows]), to_device(target[rows]))
        sent = comm.bytes_sent
        want_loss, want = tanh_stack(weights, x, target)
        check_events(spy, step)
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
            assert err <= 1e-12, (f"step {step}, layer {i}: your gradient shard differs from chunk {r} of "
                                  f"one process's gradient by {err:.1e} relative{how}")
        for i, (W, g) in enumerate(zip(weights, want)):     # SGD, on the shards and on the oracle
            W -= LR * g
            shards[i] -= LR * to_device(grads[i]).reshape(-1)
        if r == 0:
            print(f"step {step}: loss {total:.15f} = one process's; {2 * LAYERS} non-blocking all-gathers, each "
                  f"layer's next one issued before its compute; at most {spy.peak} full weights alive or in "
                  f"flight ({spy.peak * D * D * 8} bytes + the shards {spy.shard_bytes}); {sent} bytes sent "
                  f"= 3(p-1)/p·Ψ", flush=True)


if __name__ == "__main__":
    main(__doc__, check, "zero3_step")
