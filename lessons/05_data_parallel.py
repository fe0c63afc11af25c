"""Lesson 05 — data parallelism: parity with one process, and one step on a timeline.

    mpiexec -n 2 python lessons/05_data_parallel.py [--backend numpy|cupy] --json FILE

Three experiments, all with minipar's ``DDPSync`` (buckets in reverse parameter
order, all-reduces started from leaf gradient hooks on a progress thread):

1. parity (float64): every replica trains on its 1/N rows of each global batch; the
   losses equal those of ONE process on the whole batch (computed here on rank 0, the
   oracle) and of one process accumulating N micro-batches (gradient accumulation);
2. the timeline of one step (float32, a larger model): forward and backward spans
   measured around the model calls, each bucket's all-reduce from ``ddp.events``;
3. overlap on vs off: the same steps with ``DDPSync(overlap=False)`` (all-reduces
   after backward), step time and exposed communication (time blocked waiting on it).

Times are ``time.perf_counter()`` after a barrier; on one host all ranks share that
clock (CLOCK_MONOTONIC), so the per-rank timelines line up.
"""
import argparse
import json
import os
import statistics
import sys
import time

try:
    import minipar  # noqa: F401
except ImportError:  # run from a checkout without installing: use the repository root
    sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

import numpy as np

from minipar import backend
from minipar.backend import to_device, sync
from minipar.comm import Communicator, abort_on_exception
from minipar.data import shard_rows
from minipar.nn import GPT, GPTConfig
from minipar.optim import AdamW
from minipar.parallel.step import Optimizer
from minipar.parallel.sync import DDPSync

LR = 3e-3


def global_batch(step, rows, cfg):
    """The global batch of ``step``: the same on every rank (a pure function of step)."""
    rng = np.random.default_rng(1000 + step)
    ids = rng.integers(0, cfg.vocab_size, (rows, cfg.seq_len + 1))
    return ids[:, :-1], ids[:, 1:]


def train_single(cfg, steps, rows, micro=1):
    """The oracle: one process, the whole global batch, ``micro`` accumulated micro-batches."""
    model = GPT(cfg, seed=0)
    opt = AdamW(model.named_parameters(), lr=LR)
    losses = []
    for step in range(steps):
        x, y = global_batch(step, rows, cfg)
        per, total = rows // micro, 0.0
        for i in range(micro):
            _, loss = model(to_device(x[i * per:(i + 1) * per]), to_device(y[i * per:(i + 1) * per]))
            (loss * (1.0 / micro)).backward()          # sum of micro-means / K = global mean
            total += loss.item() / micro
        opt.step()
        opt.zero_grad()
        losses.append(total)
    return losses


def train_ddp(comm, cfg, steps, rows, bucket_bytes):
    model = GPT(cfg, seed=0)
    ddp = DDPSync(model, comm, bucket_bytes=bucket_bytes)   # hooks on the parameters
    opt = Optimizer(ddp, lr=LR)
    losses = []
    for step in range(steps):
        x, y = global_batch(step, rows, cfg)
        x, y = shard_rows(x, comm.rank, comm.size), shard_rows(y, comm.rank, comm.size)
        _, loss = model(to_device(x), to_device(y))
        loss.backward()
        opt.step()                                      # ddp.finish() + AdamW
        opt.zero_grad()
        # the global loss is the mean of the replicas' means (equal shares)
        everyone = comm.mpi.allgather(loss.item())
        losses.append(sum(everyone) / comm.size)
    return losses, len(ddp.buckets)


def timed_steps(comm, cfg, rows, overlap, steps, bucket_bytes):
    """``steps`` training steps; per step the spans of forward, backward, the sync wait
    and every bucket's all-reduce, relative to a barrier at the start of the step."""
    model = GPT(cfg, seed=0)
    ddp = DDPSync(model, comm, bucket_bytes=bucket_bytes, overlap=overlap)
    opt = Optimizer(ddp, lr=LR)
    out = []
    for step in range(steps):
        x, y = global_batch(step, rows, cfg)
        x, y = to_device(shard_rows(x, comm.rank, comm.size)), to_device(shard_rows(y, comm.rank, comm.size))
        comm.barrier()
        t0 = time.perf_counter()
        _, loss = model(x, y)
        sync()
        t1 = time.perf_counter()
        loss.backward()
        sync()
        t2 = time.perf_counter()
        opt.step()                          # ddp.finish() (the wait), then AdamW
        sync()
        t4 = time.perf_counter()
        exposed = ddp.exposed_comm_s
        t3 = t2 + exposed                   # the wait comes first inside the step
        out.append({
            "forward": [t0 - t0, t1 - t0], "backward": [t1 - t0, t2 - t0],
            "sync_wait": [t2 - t0, t3 - t0], "optimizer": [t3 - t0, t4 - t0],
            "step_time": t4 - t0, "exposed_comm": exposed,
            "buckets": [{"index": i, "submitted": s - t0, "started": a - t0, "finished": f - t0}
                        for i, s, a, f in ddp.events],
        })
    bucket_bytes_each = [b.padded * b.dtype.itemsize for b in ddp.buckets]
    return out, bucket_bytes_each


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--backend", default="numpy", choices=["numpy", "cupy"])
    parser.add_argument("--json", required=True, help="where rank 0 writes the results")
    parser.add_argument("--steps", type=int, default=5)
    parser.add_argument("--timed-steps", type=int, default=6)
    args = parser.parse_args()
    abort_on_exception()
    backend.set_backend(args.backend)
    comm = Communicator()
    n = comm.size
    result = {"ranks": n}

    # 1. parity in float64: N replicas == one process == K accumulated micro-batches
    backend.set_default_dtype(np.float64)
    small = GPTConfig(vocab_size=64, seq_len=16, n_layer=2, d_model=32, n_head=4)
    rows = 4 * n
    ddp_losses, n_buckets = train_ddp(comm, small, args.steps, rows, bucket_bytes=16 * 1024)
    result.update(parity_ddp=ddp_losses, parity_buckets=n_buckets)
    if comm.rank == 0:
        result["parity_single"] = train_single(small, args.steps, rows)
        result["parity_accum"] = train_single(small, args.steps, rows, micro=n)

    # 2 + 3. timing in float32 with a larger model: overlap on, then off
    backend.set_default_dtype(np.float32)
    big = GPTConfig(vocab_size=256, seq_len=64, n_layer=4, d_model=128, n_head=4)
    big_rows, bucket = 4 * n, 512 * 1024
    result["timing_model"] = {"n_layer": big.n_layer, "d_model": big.d_model, "seq_len": big.seq_len,
                              "rows_per_rank": big_rows // n, "params": GPT(big).num_parameters(),
                              "bucket_bytes": bucket}
    for name, overlap in (("overlap", True), ("no_overlap", False)):
        steps, sizes = timed_steps(comm, big, big_rows, overlap, args.timed_steps, bucket)
        everyone = comm.mpi.gather(steps, root=0)
        if comm.rank == 0:
            result[name] = everyone             # [rank][step] -> spans
            result["bucket_sizes"] = sizes
    if comm.rank == 0:
        for name in ("overlap", "no_overlap"):  # median over steps after the first (warm-up)
            per_step = [max(r[s]["step_time"] for r in result[name]) for s in range(1, args.timed_steps)]
            exposed = [statistics.mean(r[s]["exposed_comm"] for r in result[name])
                       for s in range(1, args.timed_steps)]
            result[name + "_median"] = {"step_time": statistics.median(per_step),
                                        "exposed_comm": statistics.median(exposed)}
        with open(args.json, "w") as f:
            json.dump(result, f)
        print(f"rank 0 wrote {args.json}")


if __name__ == "__main__":
    main()
