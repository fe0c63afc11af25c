"""mpiexec script: DataParallel and ZeRO mechanics that the CLI parity runs can't see.

- parameters are broadcast from rank 0 (ranks are seeded differently on purpose);
- small buckets make several buckets, and with overlap the first all-reduce is
  started while backward is still producing gradients;
- ZeRO's per-rank memory equals the paper's formulas up to padding;
- ZeRO-2/3 keep no full gradient buffer once a reduce-scatter is done (its result is a
  shard that owns its memory), and ZeRO-3 gathers every unit into, and accumulates its
  gradients in, its buffers made once (``Zero3Sync.gathered`` / ``staging``).
"""
import json
import sys

import numpy as np

from minipar import backend
from minipar.comm import Communicator
from minipar.nn import GPT, GPTConfig
from minipar.parallel.step import Optimizer
from minipar.parallel.sync import DDPSync, Zero3Sync, ZeroSync

backend.set_default_dtype(np.float64)
comm = Communicator()
cfg = GPTConfig(vocab_size=32, seq_len=8, n_layer=2, d_model=16, n_head=2)
report = {}

# 1. broadcast from rank 0, despite per-rank seeds
model = GPT(cfg, seed=100 + comm.rank)
ddp = DDPSync(model, comm, bucket_bytes=4096)
reference = GPT(cfg, seed=100)
report["broadcast_ok"] = all(np.array_equal(p.data, q.data)
                             for p, q in zip(model.parameters(), reference.parameters()))
report["buckets"] = len(ddp.buckets)

# 2. overlap: record when buckets launch relative to the last gradient hook
events = []
for p in model.parameters():
    p.register_hook(lambda t: events.append("grad"))
original = ddp._launch
ddp._launch = lambda b: (events.append("launch"), original(b))
ids = np.random.default_rng(comm.rank).integers(0, 32, (2, 8))
model(ids, ids)[1].backward()
ddp.finish()
last_grad = max(i for i, e in enumerate(events) if e == "grad")
report["launched_before_backward_ended"] = events.index("launch") < last_grad

# 3. memory per stage for fp32 AdamW
backend.set_default_dtype(np.float32)
psi = GPT(cfg).num_parameters()
for stage in (0, 1, 2, 3):
    m = GPT(cfg, seed=0)
    if stage == 0:
        sync = DDPSync(m, comm)
    elif stage == 3:
        sync = Zero3Sync(m, comm)
    else:
        sync = ZeroSync(m, comm, stage=stage, bucket_bytes=4096)
    opt = Optimizer(sync)
    report[f"mem{stage}"] = opt.memory_bytes()
    if stage:   # Ψ counted with each bucket's padding to a multiple of N
        report[f"psi_padded{stage}"] = sum(b.padded for b in sync.buckets)
report["psi"] = psi

# 4. what outlives a reduce-scatter, and where ZeRO-3's full-size arrays live
for stage in (2, 3):
    m = GPT(cfg, seed=0)
    sync = Zero3Sync(m, comm) if stage == 3 else ZeroSync(m, comm, stage=2, bucket_bytes=4096)
    model = sync.wrap(m) if stage == 3 else m
    in_buffers = []
    if stage == 3:
        release = sync.release_unit

        def checked_release(i, release=release, sync=sync):
            b = sync.buckets[i]
            grads = [p.grad for p in b.params if p.grad is not None]
            full = sync.full[i]
            in_buffers.append(full is not None and full.base is sync.gathered.arrays[i % 2]
                              and len(grads) > 0
                              and all(g.base is sync.staging.arrays[i % 2] for g in grads))
            release(i)
        sync.release_unit = checked_release
    model(ids, ids)[1].backward()
    results = [h.wait() for state in sync.shards for h in state.pending]
    report[f"shards_own_memory{stage}"] = len(results) > 0 and all(
        r.base is None and r.size == b.shard_size for b, state in zip(sync.buckets, sync.shards)
        for r in (h.wait() for h in state.pending))
    if stage == 3:                 # the blocks and the head (the embeddings: in finish)
        report["zero3_units_in_buffers"] = len(in_buffers) == len(sync.buckets) - 1 and all(in_buffers)
    sync.finish()
if comm.rank == 0:
    print("REPORT " + json.dumps(report))
sys.stdout.flush()
