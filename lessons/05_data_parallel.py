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
   after backward), step time and exposed communication (time blocked waiting on it),
   on this machine's shared memory and on a "slow network": the same all-reduce after a
   sleep of bytes/β on the progress thread (time on a wire: it costs no CPU).

Times are ``time.perf_counter()`` after a barrier; on one host all ranks share that
clock (CLOCK_MONOTONIC), so the per-rank timelines line up.  CPU times are
``time.thread_time()`` of the thread that did the work (backward on the main thread,
each all-reduce on the progress thread): wall minus CPU is time that thread waited —
for a core, for the GIL, or (a sleep) for the wire.
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
from minipar.comm import Communicator, abort_on_exception, all_reduce
from minipar.comm.nonblocking import submit
from minipar.data import shard_rows
from minipar.nn import GPT, GPTConfig
from minipar.optim import AdamW
from minipar.parallel.step import Optimizer
from minipar.parallel.sync import DDPSync

LR = 3e-3
SLOW_NETWORK_BYTES_PER_S = 50e6      # the pretend link of experiment 3: 50 MB/s


def timed_allreduce_hook(cpu_log, bytes_per_s=None):
    """DDP's default hook (g/n, then a non-blocking all-reduce on the progress thread),
    recording each all-reduce's CPU seconds on that thread; with ``bytes_per_s`` every
    bucket first "travels" for nbytes/bytes_per_s — a sleep, which uses no CPU."""
    def run(ctx, flat):
        cpu0 = time.thread_time()
        if bytes_per_s:
            time.sleep(flat.nbytes / bytes_per_s)
        out = all_reduce(ctx, flat)
        cpu_log.append(time.thread_time() - cpu0)
        return out

    def hook(comm, flat):
        flat *= 1.0 / comm.size
        return submit(comm, run, flat)
    return hook


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


def timed_steps(comm, cfg, rows, overlap, steps, bucket_bytes, bytes_per_s=None):
    """``steps`` training steps; per step the spans of forward, backward, the sync wait
    and every bucket's all-reduce (with its CPU seconds), relative to a barrier at the
    start of the step, and backward's CPU seconds on the main thread."""
    model = GPT(cfg, seed=0)
    cpu_log = []
    ddp = DDPSync(model, comm, bucket_bytes=bucket_bytes, overlap=overlap,
                  comm_hook=timed_allreduce_hook(cpu_log, bytes_per_s))
    opt = Optimizer(ddp, lr=LR)
    out = []
    for step in range(steps):
        x, y = global_batch(step, rows, cfg)
        x, y = to_device(shard_rows(x, comm.rank, comm.size)), to_device(shard_rows(y, comm.rank, comm.size))
        cpu_log.clear()
        comm.barrier()
        t0 = time.perf_counter()
        _, loss = model(x, y)
        sync()
        t1 = time.perf_counter()
        cpu1 = time.thread_time()
        loss.backward()
        sync()
        t2 = time.perf_counter()
        backward_cpu = time.thread_time() - cpu1
        opt.step()                          # ddp.finish() (the wait), then AdamW
        sync()
        t4 = time.perf_counter()
        exposed = ddp.exposed_comm_s
        t3 = t2 + exposed                   # the wait comes first inside the step
        out.append({
            "forward": [t0 - t0, t1 - t0], "backward": [t1 - t0, t2 - t0],
            "sync_wait": [t2 - t0, t3 - t0], "optimizer": [t3 - t0, t4 - t0],
            "step_time": t4 - t0, "exposed_comm": exposed, "backward_cpu": backward_cpu,
            # the progress thread runs the buckets in submission order: cpu_log[k] is the
            # k-th submitted bucket's
            "buckets": [{"index": i, "submitted": s - t0, "started": a - t0, "finished": f - t0,
                         "cpu": cpu}
                        for (i, s, a, f), cpu in zip(sorted(ddp.events, key=lambda e: e[1]),
                                                     cpu_log)],
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
    result["slow_network_bytes_per_s"] = SLOW_NETWORK_BYTES_PER_S
    runs = (("overlap", True, None), ("no_overlap", False, None),
            ("slow_overlap", True, SLOW_NETWORK_BYTES_PER_S),
            ("slow_no_overlap", False, SLOW_NETWORK_BYTES_PER_S))
    for name, overlap, bytes_per_s in runs:
        steps, sizes = timed_steps(comm, big, big_rows, overlap, args.timed_steps, bucket,
                                   bytes_per_s)
        everyone = comm.mpi.gather(steps, root=0)
        if comm.rank == 0:
            result[name] = everyone             # [rank][step] -> spans
            result["bucket_sizes"] = sizes
    if comm.rank == 0:
        for name, _, _ in runs:                 # median over steps after the first (warm-up)
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
