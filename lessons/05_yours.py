"""Lesson 05's exercise on every rank: your overlapped DDP against the library's.

    mpiexec -n 2 python lessons/05_yours.py --file MINE.py [--time STEPS]

``MINE.py`` defines ``MyDDP(model, comm, bucket_bytes)``: hooks on the parameters that
start a non-blocking all-reduce of a bucket (``all_reduce_async``, minipar's ring) the
moment its last gradient arrives and return at once, and ``finish()``, which waits for
every bucket's handle and leaves in every ``param.grad`` the mean over the ranks.

The check replaces ``all_reduce_async`` in the learner's module by a spy that calls the
real one and records when each all-reduce was started and when its handle was waited:
"after gradient k of n" (a hook registered before the learner's counts the gradients as
autograd accumulates them) or "after backward".  A blocking ``all_reduce`` called during
backward is recorded too.  Three AdamW steps of a small GPT in float64, each rank on its
half of the global batch:

- **overlap, by the order of events** (never by durations): each bucket's all-reduce is
  started once, with the whole bucket, from the hook of its last gradient — bucket 0's
  after the first gradient, while backward still has every earlier layer to compute; no
  handle is waited before backward has returned (a wait inside the hook stops backward
  exactly as a blocking all-reduce does), and every handle is waited in finish();
- **traffic**: when finish() returns each rank has sent the ring's 2(p-1)/p·S for every
  bucket of S bytes, in 2(p-1) messages each;
- **parity**: after finish() every gradient equals the library's ``DDPSync`` on the same
  ranks and data and one process's on the whole batch (relative 1e-12), and so do the
  losses after three AdamW steps.

``--time STEPS`` (the notebook runs it on the simulated cluster, 2 nodes x 1 rank): after
the check, STEPS steps of a larger float32 GPT with your class twice, alternating step by
step: as you wrote it (overlapped), and with the spy waiting for each all-reduce inside
the hook that started it (blocking; the same code otherwise).  Rank 0 prints one JSON
line: the median step time of each (the slower rank's), the buckets and their bytes.
"""
import json
import os
import sys
import time

try:
    import minipar  # noqa: F401
except ImportError:  # run from a checkout without installing: use the repository root
    sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

import numpy as np

from minipar import backend
from minipar.backend import to_device, to_host
from minipar.comm import all_reduce, all_reduce_async
from minipar.data import shard_rows
from minipar.nn import GPT, GPTConfig
from minipar.optim import AdamW
from minipar.parallel.buckets import make_buckets
from minipar.parallel.sync import DDPSync
from yours import main

CFG = GPTConfig(vocab_size=64, seq_len=16, n_layer=2, d_model=32, n_head=4)
BUCKET_BYTES, STEPS, LR = 16 * 1024, 3, 3e-3
# --time: a model whose backward is long enough to hide its all-reduces behind
TIME_CFG = GPTConfig(vocab_size=256, seq_len=64, n_layer=4, d_model=64, n_head=4)
TIME_BUCKET_BYTES, TIME_ROWS = 64 * 1024, 8
AFTER_BACKWARD = "after backward"


def global_batch(cfg, step, rows):
    ids = np.random.default_rng(1000 + step).integers(0, cfg.vocab_size, (rows, cfg.seq_len + 1))
    return ids[:, :-1], ids[:, 1:]


class Spy:
    """The learner's ``all_reduce_async`` and ``all_reduce``, watched.

    ``when()`` is the moment of an event: the number of gradients accumulated so far in
    this backward (counted by hooks registered before the learner's), or AFTER_BACKWARD
    once ``loss.backward()`` has returned.  ``blocking = True`` makes every non-blocking
    all-reduce wait inside the call that started it (the --time comparison)."""

    def __init__(self, comm, model):
        self.comm, self.blocking = comm, False
        self.arrived = 0                      # gradients accumulated in this backward
        self.arrival = {}                     # id(param) -> when its gradient arrived
        self.backward_done = False
        self.started, self.waited, self.blocked = [], [], []
        for q in model.parameters():          # first in each parameter's hook list
            q.register_hook(self._count)

    def _count(self, param):
        self.arrived += 1
        self.arrival[id(param)] = self.arrived

    def completed_at(self, buckets):
        """After how many gradients each bucket was complete in this backward (its last
        parameter's gradient), and how many gradients the backward produced."""
        return [max(self.arrival[id(q)] for q in b.params) for b in buckets], self.arrived

    def new_step(self):
        self.arrived, self.arrival, self.backward_done = 0, {}, False
        self.started, self.waited, self.blocked = [], [], []

    def when(self):
        return AFTER_BACKWARD if self.backward_done else self.arrived

    def all_reduce_async(self, comm, array, *args, **kwargs):
        number = len(self.started)
        self.started.append((self.when(), array.size, kwargs.get("algorithm", args[1] if len(args) > 1 else "auto")))
        handle = WatchedHandle(all_reduce_async(comm, array, *args, **kwargs), self, number)
        if self.blocking:
            handle.wait()
        return handle

    def all_reduce(self, comm, array, *args, **kwargs):
        if not self.backward_done:
            self.blocked.append((self.when(), array.size))
        return all_reduce(comm, array, *args, **kwargs)


class WatchedHandle:
    """A handle of the real non-blocking all-reduce; its wait() is recorded."""

    def __init__(self, handle, spy, number):
        self.handle, self.spy, self.number = handle, spy, number

    def wait(self, timeout=None):
        self.spy.waited.append((self.number, self.spy.when()))
        return self.handle.wait(timeout)

    def test(self):
        return self.handle.test()


def moment(when):
    return when if when == AFTER_BACKWARD else f"at gradient {when}"


def check_order(spy, buckets, names, done_at, n_grads, step):
    """Overlap by the order of events: every bucket started from the hook that completed
    it, nothing waited before backward returned, every handle waited in finish()."""
    sizes = [b.numel for b in buckets]
    for when, size in spy.blocked:
        which = f"bucket {sizes.index(size)}" if size in sizes else f"an array of {size} elements"
        assert False, (f"step {step}, {which}: all-reduced by the blocking all_reduce at gradient {when} of "
                       f"{n_grads}, inside backward: backward stood still until the ring was done; start "
                       "each bucket's all-reduce non-blocking and wait for it after backward")
    used, bucket_of_start = set(), {}
    for i, b in enumerate(buckets):
        S = b.numel * b.dtype.itemsize
        what = f"step {step}, bucket {i} ({names[id(b.params[0])]}, ... {len(b.params)} params, S = {S} bytes)"
        mine = [k for k, (when, size, _) in enumerate(spy.started) if size == b.numel and k not in used]
        on_time = [k for k in mine if spy.started[k][0] == done_at[i]]
        if not on_time:
            at = ", ".join(moment(spy.started[k][0]) for k in mine)
            seen = f"an all-reduce of its size was started {at}" if mine else "no all-reduce of it was started"
            assert False, (f"{what}: {seen}; its last gradient arrived at gradient {done_at[i]} of {n_grads}, "
                           f"{n_grads - done_at[i]} still to come: start it from that hook, so that "
                           "it travels while backward goes on")
        k = on_time[0]
        used.add(k)
        bucket_of_start[k] = i
        algorithm = spy.started[k][2]
        assert algorithm == "ring", f"{what}: all-reduced with algorithm={algorithm!r}; the exercise uses the ring"
    extra = [spy.started[k] for k in range(len(spy.started)) if k not in used]
    assert not extra, (f"step {step}: {len(extra)} all-reduce(s) beyond one per bucket (when, elements, "
                       f"algorithm): {extra[:3]}; each bucket travels once, whole")
    for number, when in spy.waited:
        if when != AFTER_BACKWARD:
            assert False, (f"step {step}, bucket {bucket_of_start[number]}: its all-reduce was waited at gradient {when} of {n_grads}, "
                           "inside backward: the hook blocked until the ring was done, as a blocking "
                           "all-reduce would; let the hook return at once and wait after backward")
    waited = {number for number, _ in spy.waited}
    for k in sorted(used):
        assert k in waited, (f"step {step}: the all-reduce started at gradient {spy.started[k][0]} was never "
                             "waited: finish() must wait for every handle before the gradients are read")


def check_traffic(comm, buckets, step, sent, msgs):
    p = comm.size
    S = sum(b.numel * b.dtype.itemsize for b in buckets)
    want = 2 * (p - 1) * S // p
    assert sent == want, (f"step {step}: this rank sent {sent} bytes for {len(buckets)} buckets of {S} bytes in "
                          f"all; one ring all-reduce of each sends 2(p-1)/p·S = {want}")
    assert msgs == 2 * (p - 1) * len(buckets), (
        f"step {step}: {msgs} messages; one ring all-reduce per bucket sends 2(p-1) = {2 * (p - 1)} each, "
        f"{2 * (p - 1) * len(buckets)} for {len(buckets)} buckets")


def check_grads(comm, model, references, buckets, names, step):
    bucket_of = {id(q): i for i, b in enumerate(buckets) for q in b.params}
    for k, q in enumerate(model.parameters()):
        name, i = names[id(q)], bucket_of[id(q)]
        assert q.grad is not None, f"step {step}, bucket {i}: {name} has no gradient after finish()"
        got = to_host(q.grad)
        for who, ref_model in references:
            ref = to_host(ref_model.parameters()[k].grad)
            scale = np.abs(ref).max()
            off = np.abs(got - ref).max() / scale
            how = (f": it is {comm.size}x, a sum over the ranks, not their mean"
                   if np.allclose(got, comm.size * ref, rtol=1e-9, atol=1e-12 * scale) else " relative")
            assert off <= 1e-12, (f"step {step}, bucket {i}, {name}: the gradient after finish() differs from "
                                  f"{who} by {off:.1e}{how}")


def check(comm, MyDDP, time_steps=None):
    backend.set_default_dtype(np.float64)
    p, r = comm.size, comm.rank
    model, library, oracle = GPT(CFG, seed=0), GPT(CFG, seed=0), GPT(CFG, seed=0)
    names = {id(q): n for n, q in model.named_parameters()}
    spy = Spy(comm, model)
    module = getattr(MyDDP.__init__, "__globals__", None)       # the learner's module
    assert module is not None, "MyDDP defines no __init__(self, model, comm, bucket_bytes) of its own"
    module.update(all_reduce_async=spy.all_reduce_async, all_reduce=spy.all_reduce)
    ddp, library_ddp = MyDDP(model, comm, BUCKET_BYTES), DDPSync(library, comm, bucket_bytes=BUCKET_BYTES)
    buckets = make_buckets(model.parameters(), BUCKET_BYTES)        # the library's cut
    opts = [AdamW(m.named_parameters(), lr=LR) for m in (model, library, oracle)]
    for step in range(STEPS):
        x, y = global_batch(CFG, step, 4 * p)
        mine_x, mine_y = to_device(shard_rows(x, r, p)), to_device(shard_rows(y, r, p))
        _, loss = model(mine_x, mine_y)
        comm.reset_counters()
        spy.new_step()
        loss.backward()
        spy.backward_done = True
        ddp.finish()
        sent, msgs = comm.bytes_sent, comm.msgs_sent
        done_at, n_grads = spy.completed_at(buckets)
        check_order(spy, buckets, names, done_at, n_grads, step)
        check_traffic(comm, buckets, step, sent, msgs)
        _, library_loss = library(mine_x, mine_y)
        library_loss.backward()
        library_ddp.finish()
        _, whole = oracle(to_device(x), to_device(y))
        whole.backward()
        check_grads(comm, model, [("the library's DDPSync", library), ("one process's on the whole batch", oracle)],
                    buckets, names, step)
        mine, one = sum(comm.mpi.allgather(loss.item())) / p, whole.item()
        assert abs(mine - one) <= 1e-12 * abs(one), f"step {step}: loss {mine!r}, one process {one!r}"
        for o in opts:
            o.step()
            o.zero_grad()
        if r == 0:
            print(f"step {step}: loss {mine:.15f} = one process's; gradients = DDPSync's; {len(buckets)} "
                  f"buckets, each started from its last gradient's hook (bucket 0 at gradient {done_at[0]} of "
                  f"{n_grads}), every handle waited after backward; {sent} bytes sent = 2(p-1)/p·ΣS", flush=True)
    if time_steps:
        timing(comm, MyDDP, spy, int(time_steps))


def timing(comm, MyDDP, spy, steps):
    """The median step time of your class overlapped and blocking, alternating steps."""
    backend.set_default_dtype(np.float32)
    p, r = comm.size, comm.rank
    runs = {}
    for name in ("overlapped", "blocking"):
        model = GPT(TIME_CFG, seed=0)
        runs[name] = dict(model=model, ddp=MyDDP(model, comm, TIME_BUCKET_BYTES), times=[],
                          opt=AdamW(model.named_parameters(), lr=LR))
    for step in range(steps + 1):                       # step 0 warms up
        x, y = global_batch(TIME_CFG, step, TIME_ROWS * p)
        x, y = to_device(shard_rows(x, r, p)), to_device(shard_rows(y, r, p))
        for name, run in runs.items():
            spy.blocking = name == "blocking"
            spy.new_step()
            comm.barrier()
            start = time.perf_counter()
            _, loss = run["model"](x, y)
            loss.backward()
            run["ddp"].finish()
            run["opt"].step()
            run["opt"].zero_grad()
            backend.sync()
            elapsed = comm.mpi.allreduce(time.perf_counter() - start, op=max_op())
            if step:
                run["times"].append(elapsed)
    buckets = make_buckets(runs["overlapped"]["model"].parameters(), TIME_BUCKET_BYTES)
    if r == 0:
        print(json.dumps({"overlapped_s": float(np.median(runs["overlapped"]["times"])),
                          "blocking_s": float(np.median(runs["blocking"]["times"])), "steps": steps,
                          "ranks": p, "buckets": len(buckets),
                          "bucket_bytes": [b.numel * 4 for b in buckets]}), flush=True)


def max_op():
    from mpi4py import MPI
    return MPI.MAX


if __name__ == "__main__":
    main(__doc__, check, "MyDDP", ("--time", "also time STEPS steps overlapped and blocking (optional)"))
