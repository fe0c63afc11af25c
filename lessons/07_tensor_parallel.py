"""Lesson 07 · tensor (and sequence) parallelism — the mpiexec script the notebook runs.

    mpiexec -n 2 python lessons/07_tensor_parallel.py [--backend numpy|cupy] [--json FILE]

With t = the number of ranks, in float64:

1. parity — one transformer block, plain vs tensor-parallel (heads and MLP columns split
   over t ranks), with and without sequence parallelism: output, input gradient and every
   parameter gradient against the single-process block; and a whole GPT's loss
   (vocab-parallel embedding and cross-entropy) against the single-process loss.
2. traffic — bytes each rank sends per block, counted by the communicator, split into
   forward attention, forward MLP and backward, against the textbook volume

       forward + backward of one block = 8·b·s·h·(t-1)/t elements per rank

   (2 f + 2 g, each an all-reduce of b·s·h elements = 2(t-1)/t·b·s·h on a ring; with
   sequence parallelism each all-reduce becomes a reduce-scatter + an all-gather, same bytes).

The lesson's exercises (f and g; sequence parallelism's regions and the vocab-parallel
loss) run in ``07_yours.py``.
"""
import argparse
import copy
import json
import os
import sys

import numpy as np

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

from minipar import backend  # noqa: E402
from minipar.autograd import Tensor, ops  # noqa: E402
from minipar.comm import Communicator, abort_on_exception, all_reduce  # noqa: E402
from minipar.nn import GPT, Block, GPTConfig  # noqa: E402
from minipar.parallel.tensor import (check_tensor_parallel, parallel_attention,  # noqa: E402
                                     parallel_mlp, shard_table, to_tensor_parallel)
from minipar.parallel.tensor.regions import split_along  # noqa: E402


def rel_err(got, want):
    got, want = backend.to_host(got), backend.to_host(want)
    return float(np.abs(got - want).max() / max(np.abs(want).max(), 1e-300))


def block_run(comm, cfg, x, upstream, sp):
    """Plain and tp block on the same weights: (worst relative error, traffic in bytes)."""
    plain = Block(cfg, np.random.default_rng(0), np.random.default_rng(1))
    par = copy.deepcopy(plain)
    parallel_attention(par.attn, comm, sp)
    parallel_mlp(par.mlp, comm, sp)

    xt = Tensor(x, requires_grad=True)
    y = plain(xt)
    ops.sum(y * upstream).backward()

    cut = (lambda a: split_along(comm, a, 1)) if sp else (lambda a: a)
    xp_ = Tensor(cut(x), requires_grad=True)
    comm.reset_counters()
    h = xp_ + par.attn(par.ln_1(xp_))
    fwd_attn = comm.bytes_sent
    yp = h + par.mlp(par.ln_2(h))
    fwd_mlp = comm.bytes_sent - fwd_attn
    comm.reset_counters()
    ops.sum(yp * cut(upstream)).backward()
    bwd = comm.bytes_sent

    errs = [rel_err(yp.data, cut(y.data)), rel_err(xp_.grad, cut(xt.grad))]
    specs, want = shard_table(par), dict(plain.named_parameters())
    for name, p in par.named_parameters():
        g = p.grad
        if name not in specs and sp:      # replicated under sequence parallelism: partial sums
            g = all_reduce(comm, g.copy())
        ref = want[name].grad
        errs.append(rel_err(g, ref if name not in specs else specs[name].local(ref, comm.rank, comm.size)))
    return max(errs), fwd_attn, fwd_mlp, bwd


def gpt_loss_err(comm, cfg, sp):
    ids = np.random.default_rng(2).integers(0, cfg.vocab_size, (2, cfg.seq_len))
    plain = GPT(cfg, seed=0)
    tp_model = to_tensor_parallel(plain, comm, sequence_parallel=sp)
    ids = backend.to_device(ids)
    return rel_err(tp_model(ids, ids)[1].data, plain(ids, ids)[1].data)


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--backend", default="numpy", choices=["numpy", "cupy"])
    parser.add_argument("--batch", type=int, default=4)
    parser.add_argument("--seq", type=int, default=32)
    parser.add_argument("--d-model", type=int, default=64)
    parser.add_argument("--heads", type=int, default=4)
    parser.add_argument("--json", help="rank 0 writes the results here")
    args = parser.parse_args()
    abort_on_exception()
    backend.set_backend(args.backend)
    backend.set_default_dtype(np.float64)
    comm = Communicator()
    t = comm.size
    b, s, h = args.batch, args.seq, args.d_model
    cfg = GPTConfig(vocab_size=256, seq_len=s, n_layer=2, d_model=h, n_head=args.heads)
    check_tensor_parallel(cfg, t, sequence_parallel=True)     # before any message

    rng = np.random.default_rng(42)
    x = backend.to_device(rng.normal(size=(b, s, h)))
    upstream = backend.to_device(rng.normal(size=(b, s, h)))
    itemsize = 8
    formula = 8 * b * s * h * (t - 1) / t * itemsize
    rows = []
    for sp in (False, True):
        err, fa, fm, bw = block_run(comm, cfg, x, upstream, sp)
        rows.append({"layout": f"tp={t}" + (" +sp" if sp else ""), "sequence_parallel": sp,
                     "fwd_attn": fa, "fwd_mlp": fm, "bwd": bw, "total": fa + fm + bw,
                     "formula": formula, "block_rel_err": err,
                     "gpt_loss_rel_err": gpt_loss_err(comm, cfg, sp)})
    if comm.rank == 0:
        print(f"one block, b={b} s={s} h={h}, t={t} ranks, float64 ({args.backend}); "
              f"bytes sent per rank")
        print(f"{'layout':10} {'fwd attn':>9} {'fwd mlp':>9} {'backward':>9} {'total':>9} "
              f"{'8bsh(t-1)/t':>12} {'ratio':>6} {'block err':>10} {'loss err':>9}")
        for r in rows:
            print(f"{r['layout']:10} {r['fwd_attn']:9d} {r['fwd_mlp']:9d} {r['bwd']:9d} "
                  f"{r['total']:9d} {r['formula']:12.0f} {r['total'] / r['formula']:6.3f} "
                  f"{r['block_rel_err']:10.1e} {r['gpt_loss_rel_err']:9.1e}")
        if args.json:
            with open(args.json, "w") as f:
                json.dump({"t": t, "b": b, "s": s, "h": h, "itemsize": itemsize, "rows": rows}, f,
                          indent=1)
    worst = max(max(r["block_rel_err"], r["gpt_loss_rel_err"]) for r in rows)
    if worst > 1e-11:
        raise SystemExit(f"parity failed: relative error {worst:.1e}")


if __name__ == "__main__":
    main()
