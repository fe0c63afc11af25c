"""mpiexec script: every tensor-parallel layer against its plain layer, float64.

    mpiexec -n T python tests/scripts/tp_layers.py

Each rank builds the plain layer and full inputs from the same seed, runs the reference
forward/backward itself, then the parallel layer on its slice, and compares outputs,
input gradients and parameter gradients (sliced by the layer's ``shards``) at rel 1e-12.
Shapes scale with T (heads 2T, d_model 6T, seq 2T, vocab 7T+1: uneven vocab slices).
Also asserts the traffic counters of one block: 2 f + 2 g of B·N·d elements.
"""
import copy
import sys

import numpy as np

from minipar import backend
backend.set_default_dtype(np.float64)

from minipar.autograd import Tensor, ops  # noqa: E402
from minipar.comm import Communicator, abort_on_exception, all_reduce  # noqa: E402
from minipar.nn import (Block, CausalSelfAttention, Dropout, Embedding, GPTConfig,  # noqa: E402
                        Linear, MLP)
from minipar.parallel.tensor import (ColumnParallelLinear, RowParallelLinear,  # noqa: E402
                                     VocabParallelEmbedding, parallel_attention, parallel_mlp,
                                     shard_table, vocab_parallel_cross_entropy)
from minipar.parallel.tensor.regions import split_along  # noqa: E402
from minipar.comm import chunk_bounds  # noqa: E402

abort_on_exception()
comm = Communicator()
t, rank = comm.size, comm.rank
B, N, D, HEADS, V = 2, 2 * t, 6 * t, 2 * t, 7 * t + 1
TOL = 1e-12
results = []


def close(name, got, want):
    got, want = np.asarray(got), np.asarray(want)
    assert got.shape == want.shape, f"{name}: shape {got.shape} != {want.shape}"
    err = np.abs(got - want).max() / max(np.abs(want).max(), 1e-300)
    assert err <= TOL, f"{name}: relative error {err:.2e} > {TOL}"
    results.append(name)


def seq(a):
    return split_along(comm, a, 1)


def run(module, x, upstream):
    """Forward, loss = Σ y·G with G = upstream(y.shape), backward; returns (y, x.grad, G)."""
    module.zero_grad()
    xt = Tensor(x, requires_grad=True)
    y = module(xt)
    g = upstream(y.shape)
    ops.sum(y * g).backward()
    return y.data, xt.grad, g


def check_module(name, plain, make_parallel, x, sp, split_in=None, split_out=None):
    """Parity of one module; split_in/split_out cut the full input/output for my rank."""
    par = make_parallel(copy.deepcopy(plain))
    y, gx, G = run(plain, x, lambda shape: np.random.default_rng(7).normal(size=shape))
    cut_in = split_in or (seq if sp else (lambda a: a))
    cut_out = split_out or (seq if sp else (lambda a: a))
    yp, gxp, _ = run(par, cut_in(x), lambda shape: cut_out(G))
    close(f"{name} forward", yp, cut_out(y))
    close(f"{name} input grad", gxp, cut_in(gx))
    specs = shard_table(par)
    want = dict(plain.named_parameters())
    for pname, p in par.named_parameters():
        g = p.grad
        if pname not in specs and sp:   # replicated + sequence parallel: partial sums
            g = all_reduce(comm, g.copy())
        ref = want[pname].grad
        close(f"{name} d{pname}", g, ref if pname not in specs else specs[pname].local(ref, rank, t))


rng = np.random.default_rng(0)
gen = np.random.default_rng(1)
x = rng.normal(size=(B, N, D))
wide = rng.normal(size=(B, N, 4 * D))
last = lambda a: split_along(comm, a, a.ndim - 1)  # noqa: E731

for sp in (False, True):
    tag = "sp " if sp else ""
    col = Linear(D, 4 * D + 1, rng)       # 4D+1 outputs: uneven column slices
    col.bias.data[...] = rng.normal(size=col.bias.shape)
    check_module(tag + "column", col, lambda m: ColumnParallelLinear.from_linear(m, comm, sp), x,
                 sp, split_out=(lambda a: last(a)))
    row = Linear(4 * D, D, rng)
    row.bias.data[...] = rng.normal(size=row.bias.shape)
    check_module(tag + "row", row, lambda m: RowParallelLinear.from_linear(m, comm, sp), wide, sp,
                 split_in=lambda a: last(a))
    mlp = MLP(D, rng, 0.02, Dropout(0.0, gen))
    check_module(tag + "mlp", mlp, lambda m: parallel_mlp(m, comm, sp), x, sp)
    attn = CausalSelfAttention(D, HEADS, rng, 0.02, Dropout(0.0, gen))
    check_module(tag + "attention", attn, lambda m: parallel_attention(m, comm, sp), x, sp)
    cfg = GPTConfig(vocab_size=V, seq_len=N, n_layer=2, d_model=D, n_head=HEADS, dropout=0.1)

    def tp_block(b):
        parallel_attention(b.attn, comm, sp)
        parallel_mlp(b.mlp, comm, sp)
        return b
    block = Block(cfg, rng, np.random.default_rng(5))
    # the parallel copy's dropout generator is deep-copied in the same state: same masks
    check_module(tag + "block with dropout", block, tp_block, x, sp)

    ids = rng.integers(0, V, size=(B, N))
    emb = Embedding(V, D, rng)
    ref = emb(ids)
    G = rng.normal(size=ref.shape)
    ops.sum(ref * G).backward()
    pe = VocabParallelEmbedding.from_embedding(copy.deepcopy(emb), comm, sp)
    pe.weight.grad = None
    y = pe(ids)
    ops.sum(y * (seq(G) if sp else G)).backward()
    close(tag + "embedding forward", y.data, seq(ref.data) if sp else ref.data)
    close(tag + "embedding dW", pe.weight.grad, pe.shards["weight"].local(emb.weight.grad, rank, t))

# cross-entropy over uneven vocabulary slices, with ignored rows
logits = rng.normal(size=(B, N, V)) * 3
targets = rng.integers(0, V, size=(B, N))
targets[0, 0] = -100
lt = Tensor(logits, requires_grad=True)
loss = ops.cross_entropy(lt, targets)
loss.backward()
lp = Tensor(last(logits), requires_grad=True)
start = chunk_bounds(V, t)[rank]
comm.reset_counters()
ploss = vocab_parallel_cross_entropy(lp, targets, comm, start)
ce_traffic = (comm.bytes_sent, comm.msgs_sent)
comm.reset_counters()
(ploss * 1.7).backward()
# never the logits: all-reduce(max) of B·N numbers + all-reduce(sum) of 2·B·N (ring, B·N = 4t);
# the backward is local
assert ce_traffic == (2 * (t - 1) * (4 + 8) * 8, 4 * (t - 1)), ce_traffic
assert comm.bytes_sent == 0
results.append(f"cross-entropy traffic = {ce_traffic[0]} B, independent of V")
close("cross-entropy loss", ploss.data, loss.data)
close("cross-entropy dlogits", lp.grad, last(lt.grad) * 1.7)

# traffic: one block = 2 f + 2 g over S = B·N·D float64 elements (ring)
S = B * N * D * 8
for sp in (False, True):
    cfg = GPTConfig(vocab_size=V, seq_len=N, n_layer=2, d_model=D, n_head=HEADS)
    blk = Block(cfg, np.random.default_rng(3), np.random.default_rng(4))
    parallel_attention(blk.attn, comm, sp)
    parallel_mlp(blk.mlp, comm, sp)
    xin = Tensor(seq(x) if sp else x, requires_grad=True)
    comm.reset_counters()
    out = blk(xin)
    fwd = (comm.bytes_sent, comm.msgs_sent)
    comm.reset_counters()
    out.backward(np.ones(out.shape))
    bwd = (comm.bytes_sent, comm.msgs_sent)
    # all-reduce = reduce-scatter + all-gather: each (t-1)/t·S bytes in t-1 messages
    expect = (4 * (t - 1) * S // t, 4 * (t - 1))
    assert fwd == expect and bwd == expect, (sp, fwd, bwd, expect)
    results.append(f"{'sp ' if sp else ''}block traffic fwd+bwd = 8(t-1)/t·S = {fwd[0] + bwd[0]} B")

comm_total = all_reduce(comm, np.array([len(results)], dtype=np.int64))
if rank == 0:
    print("\n".join(r for r in results if "traffic" in r))
    print(f"tp={t}: {len(results)} checks ok on every rank ({int(comm_total[0])} in all)")
sys.stdout.flush()
