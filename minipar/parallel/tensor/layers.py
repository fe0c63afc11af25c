"""Tensor-parallel layers: column/row parallel linear, vocab-parallel embedding,
sequence-parallel dropout, and converters that swap them into a plain MLP / attention.

Megatron's MLP on t ranks (A split by columns, B by rows; X replicated):

    X ──f──> X·A_r ──GELU──> Y_r ──> Y_r·B_r ──g──> Σ_r Y_r·B_r + b ──> dropout
             (column)                 (row)

GELU is elementwise, so it needs no message between the two GEMMs; f and g are the
only communication (see ``regions.py``).  Attention is the same pattern with heads:
qkv is column-parallel (rank r computes the q, k, v of heads r·h/t … (r+1)·h/t − 1,
which attend independently), proj is row-parallel.

With sequence parallelism, f becomes an all-gather of the tokens and g a reduce-scatter:
the LayerNorm and dropout between blocks run on s/t tokens per rank.

Each parallel layer lists how its parameters are cut in ``shards`` (used to slice a
plain layer's weights, to gather checkpoints and to count norms); weights are made by
slicing the plain layer of the same initialisation, so results match it exactly.
"""
from __future__ import annotations

from minipar.backend import to_device, xp
from minipar.autograd import ops
from minipar.comm import chunk_bounds
from minipar.nn.init import is_placeholder, placeholder
from minipar.nn.module import Module, Parameter
from minipar.parallel.tensor.regions import (copy_to_tp_region, gather_from_sequence_region,
                                             reduce_from_tp_region,
                                             reduce_scatter_to_sequence_region, split_along)
from minipar.parallel.tensor.sharding import Shard


def _slice(param, spec, comm):
    """My piece of ``param``; of a placeholder (a weight not drawn yet, ``nn/init.py``)
    a placeholder of my piece's shape: nothing is allocated until it is drawn."""
    if is_placeholder(param.data):
        shape = spec.piece_shape(param.shape, comm.rank, comm.size)
        return Parameter(placeholder(shape, param.dtype))
    return Parameter(spec.local(param.data, comm.rank, comm.size))


class ColumnParallelLinear(Module):
    """y_r = x·A_r + b_r, with A (in, out) split by columns: rank r makes out/t features.

    The input is replicated (passed through f) or, with ``sequence_parallel``, a sequence
    shard (all-gathered first); the output stays split by features.  ``groups`` cuts [q | k | v]-style weights per block, ``replicas`` holds each part on
    that many ranks (see ``sharding.Shard``).  ``entered``: the input has already been
    through f / the all-gather (``TensorParallelInput``), shared by sibling layers.
    """

    def __init__(self, weight, bias, comm, sequence_parallel=False, groups=1, replicas=1,
                 entered=False):
        self.weight = weight
        self.bias = bias
        self.comm, self.sequence_parallel, self.entered = comm, sequence_parallel, entered
        self.shards = {"weight": Shard(1, groups, replicas), "bias": Shard(0, groups, replicas)}

    @classmethod
    def from_linear(cls, linear, comm, sequence_parallel=False, groups=1, replicas=1,
                    entered=False):
        w = _slice(linear.weight, Shard(1, groups, replicas), comm)
        b = None if linear.bias is None else _slice(linear.bias, Shard(0, groups, replicas), comm)
        return cls(w, b, comm, sequence_parallel, groups, replicas, entered)

    def forward(self, x):
        if not self.entered:
            x = TensorParallelInput.enter(x, self.comm, self.sequence_parallel)
        return ops.linear(x, self.weight, self.bias)


class TensorParallelInput(Module):
    """f (replicated input) or the all-gather of the sequence (sequence parallelism):
    what a column-parallel layer does to its input first.  As a module of its own, one
    of them can feed several column-parallel layers (llama's q, k, v; gate and up)."""

    def __init__(self, comm, sequence_parallel=False):
        self.comm, self.sequence_parallel = comm, sequence_parallel

    @staticmethod
    def enter(x, comm, sequence_parallel):
        if sequence_parallel:
            return gather_from_sequence_region(x, comm)
        return copy_to_tp_region(x, comm)

    def forward(self, x):
        return self.enter(x, self.comm, self.sequence_parallel)


class RowParallelLinear(Module):
    """z = Σ_r x_r·B_r + b, with B (in, out) split by rows; x_r is already split (the
    output of a column-parallel layer).  The partial products are all-reduced (g), or
    reduce-scattered along the sequence with ``sequence_parallel``; the bias is added
    once, after the reduction (adding it on every rank would count it t times).
    """

    def __init__(self, weight, bias, comm, sequence_parallel=False):
        self.weight = weight
        self.bias = bias
        self.comm, self.sequence_parallel = comm, sequence_parallel
        self.shards = {"weight": Shard(0)}

    @classmethod
    def from_linear(cls, linear, comm, sequence_parallel=False):
        bias = linear.bias
        if bias is not None and not is_placeholder(bias.data):
            bias = Parameter(bias.data.copy())
        return cls(_slice(linear.weight, Shard(0), comm), bias, comm, sequence_parallel)

    def forward(self, x):
        y = ops.linear(x, self.weight)
        if self.sequence_parallel:
            y = reduce_scatter_to_sequence_region(y, self.comm)
        else:
            y = reduce_from_tp_region(y, self.comm)
        return y if self.bias is None else y + self.bias


class VocabParallelEmbedding(Module):
    """Rank r owns rows [start_r, end_r) of the (V, h) table (``chunk_bounds(V, t)``).

    Ids outside my range look up row 0 and are masked to zero, so after the sum over
    ranks (g, or a reduce-scatter along the sequence) every position holds exactly the
    row of its owner:  y = Σ_r mask_r(ids) · W_r[ids - start_r].
    """

    def __init__(self, weight, vocab_start, comm, sequence_parallel=False):
        self.weight = weight
        self.vocab_start = vocab_start
        self.comm, self.sequence_parallel = comm, sequence_parallel
        self.shards = {"weight": Shard(0)}

    @classmethod
    def from_embedding(cls, embedding, comm, sequence_parallel=False):
        start = chunk_bounds(embedding.weight.shape[0], comm.size)[comm.rank]
        return cls(_slice(embedding.weight, Shard(0), comm), start, comm, sequence_parallel)

    def forward(self, ids):
        local = to_device(ops.raw(ids)) - self.vocab_start
        inside = (local >= 0) & (local < self.weight.shape[0])
        y = ops.embedding(self.weight, xp.where(inside, local, 0))
        y = y * inside[..., None].astype(self.weight.dtype)
        if self.sequence_parallel:
            return reduce_scatter_to_sequence_region(y, self.comm)
        return reduce_from_tp_region(y, self.comm)


class SequenceParallelDropout(Module):
    """Dropout on a sequence shard that matches the single-process masks exactly: every
    rank draws the *full* mask from the shared generator (same state on every tp rank)
    and keeps its own tokens.  Costs t× the random numbers; buys bit-exact parity."""

    def __init__(self, p, generator, comm, axis=1):
        self.p, self.generator, self.comm, self.axis = p, generator, comm, axis

    @classmethod
    def from_dropout(cls, dropout, comm):
        return cls(dropout.p, dropout.generator, comm)

    def forward(self, x):
        if not self.training or self.p == 0.0:
            return x
        full = list(x.shape)
        full[self.axis] *= self.comm.size
        keep = split_along(self.comm, self.generator.random(tuple(full)) >= self.p, self.axis)
        return x * (keep * (1.0 / (1.0 - self.p))).astype(x.dtype)


def parallel_mlp(mlp, comm, sequence_parallel=False):
    """Swap a plain MLP's layers, in place: fc column-parallel (4h/t features per rank),
    proj row-parallel.  Returns the same module."""
    mlp.fc = ColumnParallelLinear.from_linear(mlp.fc, comm, sequence_parallel)
    mlp.proj = RowParallelLinear.from_linear(mlp.proj, comm, sequence_parallel)
    if sequence_parallel:
        mlp.drop = SequenceParallelDropout.from_dropout(mlp.drop, comm)
    return mlp


def parallel_attention(attn, comm, sequence_parallel=False):
    """Swap a plain CausalSelfAttention's layers, in place: each rank keeps n_head/t heads
    (qkv column-parallel, sliced per q/k/v third), proj row-parallel."""
    attn.qkv = ColumnParallelLinear.from_linear(attn.qkv, comm, sequence_parallel, groups=3)
    attn.proj = RowParallelLinear.from_linear(attn.proj, comm, sequence_parallel)
    attn.n_head //= comm.size
    if sequence_parallel:
        attn.drop = SequenceParallelDropout.from_dropout(attn.drop, comm)
    return attn
