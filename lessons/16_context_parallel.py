"""Lesson 16 — context parallelism: ring attention on C = 2 ranks, measured.

    mpiexec -n 2 python lessons/16_context_parallel.py [--backend numpy|cupy] --json FILE

1. exact: ``RingAttentionCore`` forward and backward over a causal sequence split across
   the ranks (float64, both splits) against attention over the whole sequence on one
   process: the output and dQ, dK, dV of every position, gathered on rank 0;
2. memory: the activation bytes (``minipar.backend.memory``: peak during forward +
   backward minus what was live before it) of a small GPT at several sequence lengths,
   on one process (rank 0 alone; naive and flash attention) and with cp = 2 (ring);
3. balance: ring attention forward + backward at cp = 2 with the contiguous and the
   zig-zag split.  Every call of ``pair_forward`` / ``pair_backward`` (the chunk-pair work)
   is timed, so each rank reports its BUSY time (attention compute) apart from its wall
   time (busy + waiting for the neighbour), and the intervals for a timeline.

    mpiexec -n 4 python lessons/16_context_parallel.py --families --json FILE [--seq 1024]

instead times a small GPT's forward + backward (2 layers, d_model 64, 4 heads, 4 sequences,
naive attention) under cp = 4 three ways, in one launch: the ring, Ulysses, and the hybrid
(Ulysses in pairs, the ring across); the median of ``--repeats`` after a warm-up, the
slowest rank's.  Lesson 16 runs it on the simulated cluster (2 nodes x 2 ranks).
"""
import argparse
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
from minipar.autograd import Tensor
from minipar.backend import to_device, to_host
from minipar.comm import Communicator, abort_on_exception
from minipar.nn import GPT, GPTConfig
from minipar.nn.attention import attention_core
from minipar.parallel.context import RingAttentionCore, apply_context_parallel, positions_of
from minipar.parallel.context import ring


def qkv(seq, heads, head_dim, dtype, seed=0):
    """q, k, v and an upstream gradient over the whole sequence (the same on every rank)."""
    rng = np.random.default_rng(seed)
    return [rng.standard_normal((1, heads, seq, head_dim)).astype(dtype) for _ in range(4)]


# ---------------------------------------------------------------- 1. exact
def exactness(comm, seq=32, heads=2, head_dim=8):
    """Largest |ring - whole| of out, dq, dk, dv for each split (rank 0; None elsewhere)."""
    full = qkv(seq, heads, head_dim, np.float64)
    errors = {}
    ref = None
    if comm.rank == 0:
        q, k, v = (Tensor(to_device(a), requires_grad=True) for a in full[:3])
        out = attention_core(q, k, v, "naive")
        out.backward(to_device(full[3]))
        ref = [to_host(t) for t in (out.data, q.grad, k.grad, v.grad)]
    for split in ("contiguous", "zigzag"):
        pos = positions_of(comm.rank, comm.size, seq, split == "zigzag")
        q, k, v = (Tensor(to_device(np.ascontiguousarray(a[:, :, pos])), requires_grad=True)
                   for a in full[:3])
        out = RingAttentionCore(comm, "naive", split == "zigzag")(q, k, v)
        out.backward(to_device(np.ascontiguousarray(full[3][:, :, pos])))
        mine = [to_host(t) for t in (out.data, q.grad, k.grad, v.grad)]
        parts = comm.mpi.gather((pos, mine), root=0)
        if comm.rank == 0:
            err = {}
            for n, name in enumerate(("out", "dq", "dk", "dv")):
                got = np.empty_like(ref[n])
                for p, arrays in parts:
                    got[:, :, p] = arrays[n]          # every position back in its place
                err[name] = float(np.abs(got - ref[n]).max())
            errors[split] = err
    return errors if comm.rank == 0 else None


# ---------------------------------------------------------------- 2. memory
def activation_bytes(model, x, y):
    """Peak bytes during forward + backward above what was live before it (a second,
    warm step, so the gradients already exist and only activations are counted)."""
    for _ in range(2):
        for p in model.parameters():
            if p.grad is not None:
                p.grad[...] = 0
        backend.memory.reset_peak()
        before = backend.memory.live
        _, loss = model(x, y)
        loss.backward()
        del loss
    return int(backend.memory.peak - before)


def memory(comm, seqs, layers=2, d_model=32, heads=2, batch=2):
    """{"cp1_naive": [...], "cp1_flash": [...], "cp2": [[rank0, rank1], ...]} over seqs."""
    result = {"seqs": list(seqs), "cp1_naive": [], "cp1_flash": [], "cp2": []}
    for seq in seqs:
        ids = np.random.default_rng(seq).integers(0, 256, (batch, seq + 1))
        x, y = ids[:, :-1], ids[:, 1:]
        if comm.rank == 0:                              # one process, the whole sequence
            for kind in ("naive", "flash"):
                cfg = GPTConfig(seq_len=seq, n_layer=layers, d_model=d_model, n_head=heads,
                                attention=kind)
                result[f"cp1_{kind}"].append(activation_bytes(GPT(cfg, seed=0), to_device(x),
                                                              to_device(y)))
        comm.barrier()
        cfg = GPTConfig(seq_len=seq, n_layer=layers, d_model=d_model, n_head=heads, attention="flash")
        model = apply_context_parallel(GPT(cfg, seed=0), comm, zigzag=True)
        pos = model.token_positions                     # this rank's S/C positions
        mine = activation_bytes(model, to_device(np.ascontiguousarray(x[:, pos])),
                                to_device(np.ascontiguousarray(y[:, pos])))
        result["cp2"].append(comm.mpi.allgather(mine))
    return result


# ---------------------------------------------------------------- 3. balance
class PairTimer:
    """Wraps ring.pair_forward / pair_backward: the time and kind of every call."""

    def __init__(self):
        self.calls, self.t0 = [], 0.0
        self._fwd, self._bwd = ring.pair_forward, ring.pair_backward

    def _timed(self, fn, phase):
        def wrapper(*args, **kwargs):
            t = time.perf_counter()
            result = fn(*args, **kwargs)
            backend.sync()
            diagonal = args[4] if phase == "F" else args[7]
            self.calls.append((phase, bool(diagonal), t - self.t0, time.perf_counter() - self.t0))
            return result
        return wrapper

    def __enter__(self):
        ring.pair_forward = self._timed(self._fwd, "F")
        ring.pair_backward = self._timed(self._bwd, "B")
        return self

    def __exit__(self, *exc):
        ring.pair_forward, ring.pair_backward = self._fwd, self._bwd


def balance(comm, seq, heads, head_dim, kind, repeats):
    """Per split: every rank's wall and busy seconds (best of ``repeats``) and the call
    intervals of its best repeat."""
    full = qkv(seq, heads, head_dim, np.float32)
    result = {}
    for split in ("contiguous", "zigzag"):
        pos = positions_of(comm.rank, comm.size, seq, split == "zigzag")
        core = RingAttentionCore(comm, kind, split == "zigzag")
        best = None
        for _ in range(repeats):
            q, k, v = (Tensor(to_device(np.ascontiguousarray(a[:, :, pos])), requires_grad=True)
                       for a in full[:3])
            grad = to_device(np.ascontiguousarray(full[3][:, :, pos]))
            with PairTimer() as timer:
                comm.barrier()
                timer.t0 = t0 = time.perf_counter()
                out = core(q, k, v)
                out.backward(grad)
                backend.sync()
                wall = time.perf_counter() - t0
            busy = sum(end - start for _, _, start, end in timer.calls)
            if best is None or wall < best["wall"]:
                best = {"wall": wall, "busy": busy, "calls": timer.calls}
        result[split] = comm.mpi.gather(best, root=0)
    return result


# ---------------------------------------------------------------- families on 4 ranks
FAMILIES = {"ring": ("ring", None), "ulysses": ("ulysses", None), "hybrid U=2": ("ulysses", 2)}


def families(comm, seq, repeats, batch=4):
    """{family: seconds of one forward + backward} (the slowest rank's median)."""
    ids = np.random.default_rng(0).integers(0, 256, (batch, seq + 1))
    cfg = GPTConfig(seq_len=seq, n_layer=2, d_model=64, n_head=4, attention="naive")
    seconds = {}
    for name, (kind, ulysses) in FAMILIES.items():
        model = apply_context_parallel(GPT(cfg, seed=0), comm, True, kind, ulysses)
        pos = model.token_positions
        x, y = (to_device(np.ascontiguousarray(a[:, pos])) for a in (ids[:, :-1], ids[:, 1:]))
        times = []
        for _ in range(repeats + 1):                  # the first is a warm-up
            comm.barrier()
            t0 = time.perf_counter()
            _, loss = model(x, y)
            loss.backward()
            backend.sync()
            times.append(time.perf_counter() - t0)
        seconds[name] = max(comm.mpi.allgather(float(np.median(times[1:]))))
    return seconds


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--backend", default="numpy", choices=["numpy", "cupy"])
    parser.add_argument("--json", required=True, help="where rank 0 writes the results")
    parser.add_argument("--seqs", default="128,256,512,1024", help="sequence lengths for memory")
    parser.add_argument("--seq", type=int, default=1024, help="sequence length for the timing")
    parser.add_argument("--heads", type=int, default=4)
    parser.add_argument("--head-dim", type=int, default=32)
    parser.add_argument("--kind", default="flash", choices=["naive", "flash"],
                        help="the chunk-pair kernel in the timing")
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--families", action="store_true",
                        help="time the ring, Ulysses and the hybrid on 4 ranks instead")
    args = parser.parse_args()
    abort_on_exception()
    backend.set_backend(args.backend)
    comm = Communicator()
    if args.families:
        assert comm.size == 4, "--families runs on 4 ranks (mpiexec -n 4)"
        backend.set_default_dtype(np.float32)
        seconds = families(comm, args.seq, args.repeats)
        if comm.rank == 0:
            with open(args.json, "w") as f:
                json.dump(seconds, f)
        return
    assert comm.size == 2, "this lesson's script runs on 2 ranks (mpiexec -n 2)"

    backend.set_default_dtype(np.float64)
    result = {"ranks": comm.size, "exact": exactness(comm)}
    backend.set_default_dtype(np.float32)
    result["memory"] = memory(comm, [int(s) for s in args.seqs.split(",")])
    result["balance"] = balance(comm, args.seq, args.heads, args.head_dim, args.kind, args.repeats)
    result["timing"] = {"seq": args.seq, "heads": args.heads, "head_dim": args.head_dim,
                        "kind": args.kind}
    if comm.rank == 0:
        with open(args.json, "w") as f:
            json.dump(result, f)
        print(f"rank 0 wrote {args.json}")


if __name__ == "__main__":
    main()
