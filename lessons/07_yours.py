"""Lesson 07's exercises on every rank: your region boundaries and your vocab-parallel loss, against minipar's.

    mpiexec -n 2 python lessons/07_yours.py --file MINE.py

The file says which exercise it holds:

- **f and g** (``MyCopyToTP``, ``MyReduceFromTP``: Megatron's copy-to and reduce-from the
  tensor-parallel region);
- **sequence parallelism and the vocab-parallel loss** (``MyGatherFromSequence``: all-gather
  along the sequence before a column-parallel layer, reduce-scatter in backward;
  ``MyReduceScatterToSequence``: reduce-scatter along the sequence after a row-parallel
  layer, all-gather in backward; ``MyVocabParallelCrossEntropy``: the mean cross-entropy of
  logits split over the vocabulary, never gathered).

Every region is first run on its own (float64, t = the number of ranks, each rank its own
data): its forward output and its input gradient against what the collective must give,
and the bytes this rank sent in each direction against the ring's volume — (t-1)/t·S for
an all-gather or a reduce-scatter of S bytes, 2(t-1)/t·S for an all-reduce, none for an
identity.  A wrong result is named: this rank's own input, the sum over the ranks, another
rank's tokens.  Then the regions go into a Megatron MLP, column- then row-parallel (with
sequence parallelism: its input and output hold this rank's s/t tokens), beside the same
MLP of minipar's ``ColumnParallelLinear`` / ``RowParallelLinear``: output, input gradient
and weight gradients to 1e-12.  The loss: a (b, s, V) batch of logits with V = 11 split
unevenly over the ranks, loss and gradient of your shard against minipar's
``vocab_parallel_cross_entropy`` and one process's ``ops.cross_entropy`` on the whole
logits (1e-12), and the bytes against minipar's: three numbers per row, all-reduced.
"""
import os
import sys
from dataclasses import dataclass
from typing import Callable

try:
    import minipar  # noqa: F401
except ImportError:  # run from a checkout without installing: use the repository root
    sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

import numpy as np

from minipar import backend
from minipar.autograd import Tensor, ops
from minipar.backend import to_device, to_host
from minipar.comm import all_reduce, chunk_bounds
from minipar.nn import Block, GPTConfig
from minipar.nn.module import Parameter
from minipar.parallel.tensor import check_tensor_parallel, parallel_mlp
from minipar.parallel.tensor.cross_entropy import vocab_parallel_cross_entropy
from yours import main

B, S_PER_RANK, H, HEADS, VOCAB = 2, 4, 16, 4, 11
ITEM = 8                                   # float64


def rank_array(seed, rank, shape):
    """Rank ``rank``'s input of a probe: every rank can draw every rank's (to name a result)."""
    return np.random.default_rng(1000 * seed + rank).normal(size=shape)


def close(got, want):
    return got.shape == want.shape and np.allclose(got, want, rtol=1e-12, atol=1e-12 * np.abs(want).max())


def returned(tensor):
    """The array a Function's forward returned, None if it returned None."""
    data = tensor.data
    return None if data is None or getattr(data, "dtype", None) == object else to_host(data)


def default_all_reduce_bytes(comm, counts):
    """What this rank sends for an all-reduce of float64 arrays of ``counts`` elements by
    ``all_reduce``'s default algorithm: on 2 ranks the ring's count, on more the choice of
    the cost model (minipar's regions name the ring, whose sum is the same bit for bit on
    every rank)."""
    comm.reset_counters()
    for n in counts:
        all_reduce(comm, to_device(np.zeros(n)))
    return comm.bytes_sent


def raised(err):
    return f"your code raised {type(err).__name__}: {err}"


def differs(got, want, candidates):
    """Why ``got`` is not ``want``: its shape, or which candidate (a name, an array) it equals."""
    if got is None:
        return "it is None (return the array)"
    got = to_host(got)
    if got.shape != want.shape:
        return f"its shape is {got.shape}, want {want.shape}"
    for name, value in candidates:
        if value.shape == got.shape and close(got, value):
            return f"it is {name}"
    return f"it differs by {np.abs(got - want).max():.1e} and is none of: " + "; ".join(n for n, _ in candidates)


@dataclass
class Region:
    """What a region must do, for the probe: ``forward(arrays, r)`` and ``backward(arrays, r)``
    give rank r's result from every rank's inputs (upstream gradients), ``fwd_bytes`` and
    ``bwd_bytes`` what each direction sends (the ring's count, then any other accepted: an
    all-reduce by ``all_reduce``'s default algorithm), ``fwd_words`` and ``bwd_words`` say it, and
    ``candidates(arrays, r, what)`` lists the plausible wrong results by name."""
    name: str
    cls: type
    in_shape: tuple
    out_shape: tuple
    forward: Callable
    backward: Callable
    fwd_bytes: tuple
    bwd_bytes: tuple
    fwd_words: str
    bwd_words: str
    candidates: Callable


def probe(comm, region, seed):
    """Run ``region.cls.apply`` on this rank's input and upstream gradient; AssertionError
    naming what differs (the forward output, the input gradient, the bytes of either).
    Returns the bytes sent in forward and in backward."""
    p, r = comm.size, comm.rank
    xs = [rank_array(seed, q, region.in_shape) for q in range(p)]
    ups = [rank_array(seed + 1, q, region.out_shape) for q in range(p)]
    x = Tensor(to_device(xs[r].copy()), requires_grad=True)
    where = f"{region.name}, forward ({region.fwd_words})"
    comm.reset_counters()
    try:
        y = region.cls.apply(x, comm=comm)
    except NotImplementedError as err:
        raise AssertionError(f"{where}: {raised(err)}")
    sent = comm.bytes_sent
    want = region.forward(xs, r)
    got = returned(y)
    if got is None or not close(got, want):
        what = differs(got, want, region.candidates(xs, r, "input"))
        raise AssertionError(f"{where}: {what}; sent {sent} bytes, {region.fwd_bytes[0]} wanted")
    assert sent in region.fwd_bytes, f"{where}: right result, but sent {sent} bytes; {region.fwd_bytes[0]} wanted"
    forward_sent = sent
    where = f"{region.name}, backward ({region.bwd_words})"
    upstream = to_device(ups[r].copy())
    comm.reset_counters()
    try:
        y.backward(upstream)
    except NotImplementedError as err:
        raise AssertionError(f"{where}: {raised(err)}")
    sent = comm.bytes_sent
    want = region.backward(ups, r)
    got = None if x.grad is None else to_host(x.grad)
    if got is None or not close(got, want):
        what = differs(got, want, region.candidates(ups, r, "upstream gradient"))
        raise AssertionError(f"{where}: the input gradient: {what}; sent {sent} bytes, {region.bwd_bytes[0]} wanted")
    assert np.array_equal(to_host(upstream), ups[r]), (
        f"{where}: the gradient handed to your backward was changed in place; autograd may share "
        "it with another branch of the graph: write the result into a new array")
    assert sent in region.bwd_bytes, f"{where}: right result, but sent {sent} bytes; {region.bwd_bytes[0]} wanted"
    return forward_sent, sent


def sequence_candidates(arrays, r, p, s, what):
    """Plausible wrong results of a sequence region: one rank's tokens, a sum at the wrong
    tokens, the whole sum (an all-reduce), the concatenation in the wrong order."""
    out = [(f"rank {q}'s {what} unchanged", arrays[q]) for q in range(p)]
    if arrays[0].shape[1] == p * s:                 # the whole sequence: cut at the wrong tokens
        cut = lambda a, k: a[:, k * s:(k + 1) * s]  # noqa: E731
        out += [(f"rank {q}'s own {what} at the tokens of rank {k}, not summed over the ranks", cut(arrays[q], k))
                for q in range(p) for k in range(p)]
        out += [(f"the sum over the ranks at the tokens of rank {k}", cut(sum(arrays), k)) for k in range(p)]
        out += [("the sum over the ranks of the whole sequence (an all-reduce)", sum(arrays))]
    else:                                           # this rank's tokens: gathered in the wrong order
        out += [("the ranks' tokens concatenated in reverse rank order", np.concatenate(arrays[::-1], axis=1))]
    return out + [("zero", np.zeros_like(arrays[r]))]


def tp_candidates(arrays, r, p, what):
    return [(f"this rank's own {what}, not summed over the ranks", arrays[r]),
            (f"the sum over the ranks ({p} ranks)", sum(arrays)),
            (f"{p} times this rank's own {what}", p * arrays[r]), ("zero", np.zeros_like(arrays[r]))]


def megatron_mlp(comm, x, upstream, lib, build):
    """(output, input gradient, [weight gradients]) of ``build(x, A, a, B, b)``, a Megatron MLP
    on copies of the library's slices, and of the library's MLP itself."""
    weights = [Parameter(w.data.copy()) for w in (lib.fc.weight, lib.fc.bias, lib.proj.weight, lib.proj.bias)]
    out = []
    for forward in (lambda t: build(t, *weights), lib):
        xt = Tensor(x, requires_grad=True)
        y = forward(xt)
        y.backward(upstream)
        out.append((y.data, xt.grad))
    mine = [w.grad for w in weights[:3]]
    theirs = [lib.fc.weight.grad, lib.fc.bias.grad, lib.proj.weight.grad]
    return out, mine, theirs


def check_mlp(comm, cfg, x, upstream, sp, build, yours):
    """Your regions around minipar's column- and row-parallel arithmetic, against minipar's MLP."""
    lib = parallel_mlp(Block(cfg, np.random.default_rng(0), np.random.default_rng(1)).mlp, comm, sp)
    (mine, theirs), wmine, wtheirs = megatron_mlp(comm, to_device(x), to_device(upstream), lib, build)
    for what, got, want in (("output", mine[0], theirs[0]), ("input gradient", mine[1], theirs[1]),
                            ("fc weight gradient", wmine[0], wtheirs[0]), ("fc bias gradient", wmine[1], wtheirs[1]),
                            ("proj weight gradient", wmine[2], wtheirs[2])):
        got, want = (None if got is None else to_host(got)), to_host(want)
        assert got is not None and close(got, want), (
            f"{yours} pass on their own, but in a Megatron MLP the {what} differs from minipar's MLP "
            + ("(it is None)" if got is None else f"by {np.abs(got - want).max():.1e}"))


def check_f_g(comm, MyCopyToTP):
    """Megatron's f and g (the module docstring)."""
    MyReduceFromTP = MyCopyToTP.forward.__globals__.get("MyReduceFromTP")
    assert MyReduceFromTP is not None, "the file defines MyCopyToTP but no MyReduceFromTP"
    backend.set_default_dtype(np.float64)
    p = comm.size
    cfg = GPTConfig(vocab_size=VOCAB, seq_len=S_PER_RANK * p, n_layer=1, d_model=H, n_head=HEADS)
    check_tensor_parallel(cfg, p)
    shape = (B, S_PER_RANK * p, H)
    S = int(np.prod(shape)) * ITEM
    all_reduce_bytes = 2 * (p - 1) * S // p
    summed = (all_reduce_bytes, default_all_reduce_bytes(comm, [int(np.prod(shape))]))
    own = lambda a, r: a[r]  # noqa: E731
    total = lambda a, r: sum(a)  # noqa: E731
    cands = lambda a, r, what: tp_candidates(a, r, p, what)  # noqa: E731
    f = Region("f (into the tensor-parallel region)", MyCopyToTP, shape, shape, own, total, (0,),
               summed, "identity, no message", f"all-reduce: the sum over the {p} ranks", cands)
    g = Region("g (out of the tensor-parallel region)", MyReduceFromTP, shape, shape, total, own,
               summed, (0,), f"all-reduce: the sum over the {p} ranks", "identity, no message", cands)
    f_sent, g_sent = probe(comm, f, seed=1)[1], probe(comm, g, seed=2)[0]
    x, up = rank_array(3, 0, shape), rank_array(4, 0, shape)       # the same input on every rank

    def build(t, A, a, Bw, b):
        hidden = ops.gelu(ops.linear(MyCopyToTP.apply(t, comm=comm), A, a))
        return MyReduceFromTP.apply(ops.linear(hidden, Bw), comm=comm) + b
    check_mlp(comm, cfg, x, up, False, build, "your f and g")
    if comm.rank == 0:
        print(f"{p} ranks, (b, s, h) = {shape} float64, S = {S} bytes: f sends nothing forward and "
              f"all-reduces backward ({f_sent} bytes), g the other way round ({g_sent} bytes; the ring's "
              f"2(t-1)/t·S = {all_reduce_bytes}); in a Megatron MLP the output and every gradient equal "
              "minipar's", flush=True)


def check_sequence_parallel(comm, MyGatherFromSequence):
    """Sequence parallelism's two regions and the vocab-parallel cross-entropy (the module docstring)."""
    names = MyGatherFromSequence.forward.__globals__
    missing = [n for n in ("MyReduceScatterToSequence", "MyVocabParallelCrossEntropy") if n not in names]
    assert not missing, f"the file defines MyGatherFromSequence but not {' nor '.join(missing)}"
    MyReduceScatterToSequence = names["MyReduceScatterToSequence"]
    backend.set_default_dtype(np.float64)
    p, s = comm.size, S_PER_RANK
    cfg = GPTConfig(vocab_size=VOCAB, seq_len=s * p, n_layer=1, d_model=H, n_head=HEADS)
    check_tensor_parallel(cfg, p, sequence_parallel=True)
    part, whole = (B, s, H), (B, s * p, H)
    moved = (p - 1) * int(np.prod(part)) * ITEM           # (t-1)/t·S of the whole sequence
    gathered = lambda a, r: np.concatenate(a, axis=1)  # noqa: E731
    scattered = lambda a, r: sum(a)[:, r * s:(r + 1) * s]  # noqa: E731
    cands = lambda a, r, what: sequence_candidates(a, r, p, s, what)  # noqa: E731
    S = int(np.prod(whole)) * ITEM
    gather = Region("the all-gather before a column-parallel layer", MyGatherFromSequence, part, whole,
                    gathered, scattered, (moved,), (moved,),
                    f"every rank's {s} tokens along the sequence, in rank order: an all-gather of S = {S} bytes",
                    f"the sum over the ranks of the gradient, this rank's {s} tokens: a reduce-scatter", cands)
    scatter = Region("the reduce-scatter after a row-parallel layer", MyReduceScatterToSequence, whole, part,
                     scattered, gathered, (moved,), (moved,),
                     f"the sum over the ranks, this rank's {s} tokens: a reduce-scatter of S = {S} bytes",
                     "every rank's gradient of its tokens along the sequence: an all-gather", cands)
    probe(comm, gather, seed=5)
    probe(comm, scatter, seed=7)
    x, up = rank_array(9, comm.rank, part), rank_array(10, comm.rank, part)   # this rank's tokens

    def build(t, A, a, Bw, b):
        hidden = ops.gelu(ops.linear(MyGatherFromSequence.apply(t, comm=comm), A, a))
        return MyReduceScatterToSequence.apply(ops.linear(hidden, Bw), comm=comm) + b
    check_mlp(comm, cfg, x, up, True, build, "your two regions")
    loss_bytes, minipars = check_vocab_loss(comm, names["MyVocabParallelCrossEntropy"], p)
    if comm.rank == 0:
        print(f"{p} ranks, (b, s, h) = {whole} float64, S = {S} bytes: each region sent {moved} bytes = "
              f"(t-1)/t·S in forward and in backward; in a sequence-parallel MLP the output and every gradient "
              f"equal minipar's. The vocab-parallel loss equals one process's on the whole logits, and so does "
              f"its gradient, with {loss_bytes} bytes sent (minipar's: {minipars})", flush=True)


def check_vocab_loss(comm, MyVocabParallelCrossEntropy, p):
    """Loss, gradient and bytes of the learner's cross-entropy on this rank's vocabulary shard."""
    r = comm.rank
    rng = np.random.default_rng(11)
    logits = 3 * rng.normal(size=(B, S_PER_RANK * p, VOCAB))
    targets = rng.integers(0, VOCAB, (B, S_PER_RANK * p))
    lo, hi = chunk_bounds(VOCAB, p)[r:r + 2]
    shard = np.ascontiguousarray(logits[..., lo:hi])
    where = f"the vocab-parallel cross-entropy (this rank holds vocabulary ids {lo}..{hi - 1} of {VOCAB})"
    rows = targets.size
    by_default = {default_all_reduce_bytes(comm, [rows, 2 * rows]), default_all_reduce_bytes(comm, [rows] * 3)}
    results = {}
    for who, fn in (("minipar's", lambda z: vocab_parallel_cross_entropy(z, to_device(targets), comm, lo)),
                    ("yours", lambda z: MyVocabParallelCrossEntropy.apply(z, to_device(targets), comm=comm,
                                                                          vocab_start=lo))):
        z = Tensor(to_device(shard.copy()), requires_grad=True)
        comm.reset_counters()
        try:
            loss = fn(z)
            sent = comm.bytes_sent
            loss.backward()
        except NotImplementedError as err:
            raise AssertionError(f"{where}: {raised(err)}")
        results[who] = (loss, z.grad, sent, comm.bytes_sent - sent)
    one = Tensor(to_device(logits), requires_grad=True)
    whole = ops.cross_entropy(one, to_device(targets))
    whole.backward()
    want_loss, want_grad = float(whole.item()), to_host(one.grad)[..., lo:hi]
    loss, grad, fwd, bwd = results["yours"]
    lib_fwd, lib_bwd = results["minipar's"][2:]
    got = returned(loss)
    assert got is not None and got.size == 1, f"{where}: the forward returned {loss.data!r}, want the mean loss"
    got = float(got.reshape(-1)[0])
    assert abs(got - want_loss) <= 1e-12 * abs(want_loss), (
        f"{where}: loss {got!r}, one process's on the whole logits {want_loss!r}; sent {fwd} bytes, "
        f"minipar's {lib_fwd}")
    gathering = (p - 1) * logits.nbytes // p
    assert fwd in {lib_fwd} | by_default, (
        f"{where}: right loss, but sent {fwd} bytes in forward; minipar's sends {lib_fwd}: three numbers per "
        f"row (the max, the sum of exponentials, the target's logit), {rows} rows, all-reduced"
        + (f" (gathering the logits moves (t-1)/t·b·s·V·8 = {gathering})" if fwd > lib_fwd else ""))
    one_hot = (np.eye(VOCAB)[targets] / targets.size)[..., lo:hi]          # with the mean's 1/rows
    shard_softmax = to_host(ops.softmax(Tensor(to_device(shard)), -1).data) / targets.size
    got_grad = None if grad is None else to_host(grad)
    assert got_grad is not None and close(got_grad, want_grad), (
        f"{where}: the gradient of this rank's logits: " + differs(got_grad, want_grad, [
            ("softmax - one-hot without the 1/rows of the mean", want_grad * targets.size),
            ("the softmax alone (no one-hot subtracted)", want_grad + one_hot),
            ("the softmax of this rank's shard alone, minus the one-hot", shard_softmax - one_hot)]))
    assert bwd == lib_bwd == 0, (
        f"{where}: the backward sent {bwd} bytes; softmax - one-hot on the local shard needs no message")
    return fwd, lib_fwd


def exercise_of(argv):
    """Which exercise the --file holds: f and g if it defines MyCopyToTP, else sequence parallelism."""
    path = argv[argv.index("--file") + 1] if "--file" in argv[:-1] else None
    if path and os.path.exists(path) and "class MyCopyToTP" in open(path).read():
        return "f_g"
    return "sequence"


if __name__ == "__main__":
    if exercise_of(sys.argv) == "f_g":
        main(__doc__, check_f_g, "MyCopyToTP")
    else:
        main(__doc__, check_sequence_parallel, "MyGatherFromSequence")
