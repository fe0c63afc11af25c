"""Lesson 05's exercise on every rank: your bucketed all-reduce against one process.

    mpiexec -n 2 python lessons/05_yours.py --file MINE.py

``MINE.py`` defines ``MyDDP(model, comm, bucket_bytes)``: hooks on the parameters that
all-reduce a bucket (minipar's ring, blocking) the moment its last gradient arrives,
and ``finish()``, after which every ``param.grad`` is the mean over the ranks.  Three
AdamW steps of a small GPT in float64, each rank on its half of the global batch:

- **traffic**, per bucket: what each rank sent while the hooks of that bucket's
  gradients ran (a spy hook, registered after yours, reads the byte counter), averaged
  over ranks, must be the ring's 2(p-1)/p·S for the bucket's S bytes, in 2(p-1)
  messages (one all-reduce of the whole bucket), and nothing may be left for finish();
- **parity**: after finish() every gradient equals one process's on the whole batch
  (relative 1e-10), and so do the losses after three AdamW steps.
"""
import os
import sys

try:
    import minipar  # noqa: F401
except ImportError:  # run from a checkout without installing: use the repository root
    sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

import numpy as np

from minipar import backend
from minipar.backend import to_device, to_host
from minipar.data import shard_rows
from minipar.nn import GPT, GPTConfig
from minipar.optim import AdamW
from minipar.parallel.buckets import make_buckets
from yours import main

CFG = GPTConfig(vocab_size=64, seq_len=16, n_layer=2, d_model=32, n_head=4)
BUCKET_BYTES, STEPS, LR = 16 * 1024, 3, 3e-3


def global_batch(step, rows):
    ids = np.random.default_rng(1000 + step).integers(0, CFG.vocab_size, (rows, CFG.seq_len + 1))
    return ids[:, :-1], ids[:, 1:]


def traffic_spy(comm, model, buckets):
    """Hooks registered after the learner's: bytes and messages sent since the previous
    hook are charged to the bucket of the gradient that just arrived."""
    bucket_of = {id(q): i for i, b in enumerate(buckets) for q in b.params}
    spy = {"sent": [0] * len(buckets), "msgs": [0] * len(buckets), "seen": (0, 0)}

    def charge(param):
        i, (b0, m0) = bucket_of[id(param)], spy["seen"]
        spy["sent"][i] += comm.bytes_sent - b0
        spy["msgs"][i] += comm.msgs_sent - m0
        spy["seen"] = (comm.bytes_sent, comm.msgs_sent)
    for q in model.parameters():
        q.register_hook(charge)
    return spy


def check_traffic(comm, spy, buckets, names, step, late):
    p = comm.size
    assert late == 0, (f"step {step}: {late} bytes were sent in finish(), after backward: launch each "
                       "bucket's all-reduce from the hook that completes it")
    sent = comm.mpi.allreduce(np.array(spy["sent"], dtype=np.int64)) / p
    for i, b in enumerate(buckets):
        S = b.numel * b.dtype.itemsize
        first = names[id(b.params[0])]
        assert sent[i] == 2 * (p - 1) / p * S, (
            f"step {step}, bucket {i} ({first}, ... {len(b.params)} params, S = {S} bytes): the ranks "
            f"sent {sent[i]:.0f} bytes each on average, the ring moves 2(p-1)/p·S = {2 * (p - 1) / p * S:.0f}")
        assert spy["msgs"][i] == 2 * (p - 1), (
            f"step {step}, bucket {i} ({first}, ...): {spy['msgs'][i]} messages, one ring all-reduce of the "
            f"whole bucket sends 2(p-1) = {2 * (p - 1)}")


def check_grads(comm, model, oracle, buckets, names, step):
    bucket_of = {id(q): i for i, b in enumerate(buckets) for q in b.params}
    for q, want in zip(model.parameters(), oracle.parameters()):
        name, i = names[id(q)], bucket_of[id(q)]
        assert q.grad is not None, f"step {step}, bucket {i}: {name} has no gradient after finish()"
        got, ref = to_host(q.grad), to_host(want.grad)
        scale = np.abs(ref).max()
        off = np.abs(got - ref).max() / scale
        if np.allclose(got, comm.size * ref, rtol=1e-9, atol=1e-12 * scale):
            off = f"{off:.1e}: it is {comm.size}x one process's, a sum over the ranks, not their mean"
        else:
            off = f"{off:.1e} relative"
        assert np.abs(got - ref).max() <= 1e-10 * scale, (
            f"step {step}, bucket {i}, {name}: the gradient after finish() differs from one process's "
            f"on the whole batch by {off}")


def check(comm, MyDDP):
    backend.set_default_dtype(np.float64)
    p, r = comm.size, comm.rank
    model, oracle = GPT(CFG, seed=0), GPT(CFG, seed=0)
    names = {id(q): n for n, q in model.named_parameters()}
    ddp = MyDDP(model, comm, BUCKET_BYTES)
    buckets = make_buckets(model.parameters(), BUCKET_BYTES)        # the library's cut
    spy = traffic_spy(comm, model, buckets)
    opt, opt_one = AdamW(model.named_parameters(), lr=LR), AdamW(oracle.named_parameters(), lr=LR)
    for step in range(STEPS):
        x, y = global_batch(step, 4 * p)
        _, loss = model(to_device(shard_rows(x, r, p)), to_device(shard_rows(y, r, p)))
        comm.reset_counters()
        spy.update(sent=[0] * len(buckets), msgs=[0] * len(buckets), seen=(0, 0))
        loss.backward()
        before = comm.bytes_sent
        ddp.finish()
        check_traffic(comm, spy, buckets, names, step, comm.bytes_sent - before)
        _, whole = oracle(to_device(x), to_device(y))
        whole.backward()
        check_grads(comm, model, oracle, buckets, names, step)
        mine, one = sum(comm.mpi.allgather(loss.item())) / p, whole.item()
        assert abs(mine - one) <= 1e-12 * abs(one), f"step {step}: loss {mine!r}, one process {one!r}"
        for o in (opt, opt_one):
            o.step()
            o.zero_grad()
        if r == 0:
            print(f"step {step}: loss {mine:.15f} = one process's; {len(buckets)} buckets, each "
                  f"all-reduced from its last gradient's hook with 2(p-1)/p·S bytes", flush=True)


if __name__ == "__main__":
    main(__doc__, check, "MyDDP")
