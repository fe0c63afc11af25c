"""``calibrate``'s measurements on the model itself: what the op-by-op models miss.

- ``miniature_overheads``: the per-op overhead and a step's fixed cost, on a miniature of
  the model (its ops and tensors, no arithmetic to speak of);
- ``model_compute_scale``: the model's own forward and backward of one micro-batch, timed,
  over what ``compute.py`` sums for it from the GEMM, elementwise and attention curves.
  The curves time each op alone on warm buffers; a real pass adds the bias adds and
  reshapes around each GEMM, cold operands between ops, the gradient accumulation and
  the graph walk.  On the 2-core development machine with OpenBLAS's own kernels the
  small model's step ran 14-19% above the sum (one rank, one thread; GEMMs in the step
  at 180-185 GFLOP/s against 210-235 timed alone), and every layout on the simulated
  cluster 16-21% below its measured step; ``estimate.predict`` multiplies its compute
  by this ratio (timed in fp32; the other dtypes get the same factor);
- ``zero3_unit_overhead``: what a ZeRO-3 unit adds to a step over ZeRO-2, on the
  miniature, beyond the collectives the communication model prices (``comm.py``).
"""
from __future__ import annotations

import dataclasses
import statistics
import time

from minipar import backend


def median_seconds(fn, reps=5):
    """Median seconds of ``fn()`` over ``reps`` calls after one warm-up call."""
    fn()
    out = []
    for _ in range(reps):
        t0 = time.perf_counter()
        fn()
        backend.sync()
        out.append(time.perf_counter() - t0)
    return statistics.median(out)


def miniature_config(cfg):
    """The miniature of model ``cfg``: its layers (so its ops and parameter tensors) at
    d_model = 2·n_head, seq 4, vocab 16, where the arithmetic is negligible."""
    from minipar.nn import GPTConfig
    return GPTConfig(vocab_size=16, seq_len=4, n_layer=cfg.n_layer, d_model=2 * cfg.n_head,
                     n_head=cfg.n_head, tie_weights=cfg.tie_weights)


def miniature_overheads(cfg):
    """(seconds per autograd op, seconds of an optimizer step's fixed cost), measured on a
    miniature of the model: the same layers — so the same ops and parameter tensors — at
    d_model = 2·n_head, seq 4, batch 1, vocab 16, where the arithmetic is negligible and
    what is left is Python, the graph walk and the per-call cost of each NumPy call:

        per op    = (forward + backward) / (2 · ops)      ops counted as compute.py counts
        optimizer = one AdamW step over the miniature's tensors (a call per tensor)

    ``op_overhead`` (one op on one element) is the floor; a real block's ops carry more
    Python (reshapes, hooks, the engine's bookkeeping), so this is what a step pays."""
    import numpy as np
    from minipar.nn import GPT
    from minipar.optim import AdamW
    from minipar.perf.compute import OPS_EMBED, OPS_HEAD, OPS_PER_BLOCK
    model = GPT(miniature_config(cfg), seed=0)
    opt = AdamW(model.named_parameters(), lr=1e-4)
    ids = np.zeros((1, 4), dtype=np.int64)

    def forward_backward():
        _, loss = model(ids, ids)
        loss.backward()
    fb = median_seconds(forward_backward, 15)
    forward_backward()
    step = median_seconds(opt.step, 15)
    ops = cfg.n_layer * OPS_PER_BLOCK + OPS_HEAD + OPS_EMBED
    return fb / (2 * ops), step


def model_pass_seconds(cfg, rows, reps=5):
    """Median seconds of one forward + backward of model ``cfg`` (fp32, its attention) on
    a micro-batch of ``rows`` sequences, on this rank."""
    import numpy as np
    from minipar.nn import make_model
    model = make_model(cfg, seed=0)
    ids = np.random.default_rng(0).integers(0, cfg.vocab_size, (rows, cfg.seq_len))

    def forward_backward():
        _, loss = model(ids, ids)
        loss.backward()
        for p in model.parameters():
            p.grad = None
    return median_seconds(forward_backward, reps)


def model_compute_scale(prof, cfg, rows, measured):
    """``measured`` / modelled seconds of one forward + backward of model ``cfg`` on a
    micro-batch of ``rows`` sequences (``model_pass_seconds``); 1.0 where the model
    prices it at nothing.  ``prof``: the curves measured so far."""
    from minipar.perf.compute import embed_time, head_time, layer_shape, layer_time
    x = layer_shape(cfg, rows, attention=cfg.attention)
    lt = layer_time(prof, x)
    modelled = cfg.n_layer * (lt.forward + lt.backward) + sum(head_time(prof, x)) + sum(embed_time(prof, x))
    return measured / modelled if modelled > 0 else 1.0


def zero3_unit_overhead(cfg, comm):
    """Seconds a ZeRO-3 unit adds to a step over ZeRO-2 with the same buckets, measured
    on the miniature of ``miniature_overheads``: per unit, two all-gathers (forward, and
    again in backward), the weights swapped in and out, the unit's entry and exit ops,
    and the progress thread those prefetches run on (which, with every core computing,
    takes time from the compute instead of hiding behind it):

        per unit = (step_ZeRO-3 - step_ZeRO-2) / units

    Collective: each step's time is the slowest rank's median."""
    import numpy as np
    from mpi4py import MPI
    from minipar.nn import GPT
    from minipar.parallel.buckets import Bucket
    from minipar.parallel.sync.zero import ZeroSync
    from minipar.parallel.sync.zero3 import Zero3Sync, model_units
    mini = dataclasses.replace(miniature_config(cfg), tie_weights=False)   # ZeRO-3 needs untied
    ids = np.zeros((1, 4), dtype=np.int64)

    def step_seconds(stage):
        model = GPT(mini, seed=0)
        if stage == 3:
            sync = Zero3Sync(model, comm)
            run = sync.wrap(model)
        else:
            buckets = [Bucket(u, pad_to=comm.size) for u in model_units(model)]
            sync, run = ZeroSync(model, comm, stage=2, buckets=buckets), model

        def step():
            comm.mpi.Barrier()
            run(ids, ids)[1].backward()
            sync.finish()
            sync.zero_grad()
        return comm.mpi.allreduce(median_seconds(step, 15), op=MPI.MAX)
    units = cfg.n_layer + 2
    return max(step_seconds(3) - step_seconds(2), 0.0) / units
