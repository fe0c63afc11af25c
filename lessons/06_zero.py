"""Lesson 06 — ZeRO stages 0-3: per-rank memory against the paper's formulas, and parity.

    mpiexec -n 4 python lessons/06_zero.py [--backend numpy|cupy] --json FILE

For each stage the same model is wrapped by the optimizer of that stage:

    0  DDPSync + replicated AdamW               16Ψ
    1  ZeroSync(stage=1): m, v sharded          8Ψ + 8Ψ/N
    2  ZeroSync(stage=2): + gradients           4Ψ + 12Ψ/N
    3  Zero3Sync: + parameters                  16Ψ/N

1. memory (float32 AdamW: 4 bytes per parameter, 4 per gradient, 8 for m and v):
   ``memory_bytes()`` of every rank after one step, and the padded Ψ each stage shards
   (every bucket is rounded up to a multiple of N elements so the shards are equal);
2. traffic (float32): the bytes every rank sends in one step, read from the
   communicator's counters around forward, backward and the optimizer step (the
   asynchronous collectives of a phase are waited for before its count is read; the
   one-number all-reduce of the global gradient norm is counted on its own):

       DDP (ring all-reduce)            2·(N-1)/N·Ψ elements
       ZeRO-1/2 (reduce-scatter + all-gather)   the same
       ZeRO-3 (all-gather in forward, again in backward, reduce-scatter)   3·(N-1)/N·Ψ

3. parity (float64): AdamW steps per stage on the same global batches (a learnable
   pattern, so the loss falls); the losses of every stage equal stage 0's and the single
   process's (computed on rank 0).
"""
import argparse
import json
import os
import sys

try:
    import minipar  # noqa: F401
except ImportError:  # run from a checkout without installing: use the repository root
    sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

import numpy as np

from minipar import backend
from minipar.backend import to_device
from minipar.comm import Communicator, abort_on_exception
from minipar.data import shard_rows
from minipar.nn import GPT, GPTConfig
from minipar.optim import AdamW
from minipar.parallel.step import Optimizer
from minipar.parallel.sync import DDPSync, Zero3Sync, ZeroSync

LR = 1e-2


def make_optimizer(stage, model, comm, bucket_bytes):
    """(the model to call, the optimizer): the one optimizer step over a synchroniser.
    DDP's all-reduce is the ring, so its bytes are the textbook 2(N-1)/N·S."""
    if stage == 0:
        return model, Optimizer(DDPSync(model, comm, bucket_bytes=bucket_bytes, algorithm="ring"),
                                lr=LR)
    if stage == 3:                      # one bucket per unit (embeddings, each block, head)
        sync = Zero3Sync(model, comm)
        return sync.wrap(model), Optimizer(sync, lr=LR)    # runs unit by unit
    return model, Optimizer(ZeroSync(model, comm, stage=stage, bucket_bytes=bucket_bytes), lr=LR)


def global_batch(step, rows, cfg):
    """Rows counting up from a random start in random strides 1-3 (mod the vocabulary):
    a pattern the model learns within a few steps, so the loss curves fall."""
    rng = np.random.default_rng(1000 + step)
    start = rng.integers(0, cfg.vocab_size, (rows, 1))
    stride = rng.integers(1, 4, (rows, 1))
    ids = (start + stride * np.arange(cfg.seq_len + 1)) % cfg.vocab_size
    return ids[:, :-1], ids[:, 1:]


def traffic(comm, cfg, stage, rows, bucket_bytes):
    """Bytes this rank sends in one step: forward, backward, the optimizer step, and of
    that step the global-norm all-reduce (one float64)."""
    model, opt = make_optimizer(stage, GPT(cfg, seed=0), comm, bucket_bytes)
    x, y = global_batch(0, rows, cfg)
    x, y = shard_rows(x, comm.rank, comm.size), shard_rows(y, comm.rank, comm.size)
    out = {}
    comm.barrier()
    comm.reset_counters()
    _, loss = model(to_device(x), to_device(y))
    for h in opt.sync.in_flight():
        h.wait()
    out["forward"] = comm.bytes_sent
    comm.reset_counters()
    loss.backward()
    for h in opt.sync.in_flight():      # the phase's collectives, complete (not consumed)
        h.wait()
    out["backward"] = comm.bytes_sent
    comm.reset_counters()
    opt.step()
    out["step"] = comm.bytes_sent
    comm.reset_counters()
    opt.norm.total(0.0)                 # the norm's all-reduce alone (ZeRO: over dp)
    out["norm"] = comm.bytes_sent
    out["step"] -= out["norm"]
    return out


def train(comm, cfg, stage, steps, rows, bucket_bytes):
    """Losses of ``steps`` steps and the optimizer (to read its memory)."""
    model, opt = make_optimizer(stage, GPT(cfg, seed=0), comm, bucket_bytes)
    losses = []
    for step in range(steps):
        x, y = global_batch(step, rows, cfg)
        x, y = shard_rows(x, comm.rank, comm.size), shard_rows(y, comm.rank, comm.size)
        _, loss = model(to_device(x), to_device(y))
        loss.backward()
        opt.step()
        opt.zero_grad()
        losses.append(sum(comm.mpi.allgather(loss.item())) / comm.size)
    return losses, opt


def train_single(cfg, steps, rows):
    model = GPT(cfg, seed=0)
    opt = AdamW(model.named_parameters(), lr=LR)
    losses = []
    for step in range(steps):
        x, y = global_batch(step, rows, cfg)
        _, loss = model(to_device(x), to_device(y))
        loss.backward()
        opt.step()
        opt.zero_grad()
        losses.append(loss.item())
    return losses


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--backend", default="numpy", choices=["numpy", "cupy"])
    parser.add_argument("--json", required=True, help="where rank 0 writes the results")
    parser.add_argument("--steps", type=int, default=12)
    args = parser.parse_args()
    abort_on_exception()
    backend.set_backend(args.backend)
    comm = Communicator()
    cfg = GPTConfig(vocab_size=64, seq_len=16, n_layer=2, d_model=30, n_head=3)  # 30: padding shows
    rows, bucket_bytes = 2 * comm.size, 8 * 1024       # small buckets: several, each padded
    result = {"ranks": comm.size, "config": cfg.to_dict(), "psi": GPT(cfg).num_parameters()}

    # 1. memory, float32 AdamW
    backend.set_default_dtype(np.float32)
    for stage in range(4):
        _, opt = train(comm, cfg, stage, 1, rows, bucket_bytes)
        mem = comm.mpi.gather(opt.memory_bytes(), root=0)
        padded = sum(b.padded for b in opt.sync.buckets) if stage else result["psi"]
        result[f"memory{stage}"] = {"per_rank": mem, "psi_padded": padded,
                                    "buckets": len(opt.sync.buckets) if stage else None}

    # 2. traffic, float32
    for stage in range(4):
        result[f"traffic{stage}"] = comm.mpi.gather(traffic(comm, cfg, stage, rows, bucket_bytes),
                                                    root=0)

    # 3. parity, float64
    backend.set_default_dtype(np.float64)
    for stage in range(4):
        result[f"losses{stage}"], _ = train(comm, cfg, stage, args.steps, rows, bucket_bytes)
    if comm.rank == 0:
        result["losses_single"] = train_single(cfg, args.steps, rows)
        with open(args.json, "w") as f:
            json.dump(result, f)
        print(f"rank 0 wrote {args.json}")


if __name__ == "__main__":
    main()
