"""Solutions of lesson 07's exercises (the test suite runs the notebook with them)."""

SOLUTIONS = {
    "megatron_f_g": r'''
%%writefile {MINE}/my_regions.py
from minipar.autograd.function import Function
from minipar.comm import all_reduce


class MyCopyToTP(Function):
    """f: identity forward, all-reduce backward."""

    @staticmethod
    def forward(ctx, x, comm=None):
        ctx.comm = comm
        return x

    @staticmethod
    def backward(ctx, g):
        return all_reduce(ctx.comm, g.copy())     # a copy: g may be shared upstream


class MyReduceFromTP(Function):
    """g: all-reduce forward, identity backward."""

    @staticmethod
    def forward(ctx, x, comm=None):
        return all_reduce(comm, x.copy())

    @staticmethod
    def backward(ctx, g):
        return g
''',
    "mlp_split": r'''
def split_mlp(fc_w, fc_b, proj_w, rank, t):
    lo, hi = chunk_bounds(fc_w.shape[1], t)[rank:rank + 2]
    return fc_w[:, lo:hi], fc_b[lo:hi], proj_w[lo:hi, :]

def partial_mlp(x, fc_w_r, fc_b_r, proj_w_r):
    return gelu(x @ fc_w_r + fc_b_r) @ proj_w_r
''',
    "sequence_parallel": r'''
%%writefile {MINE}/my_sequence_parallel.py
from minipar.autograd.function import Function
from minipar.backend import xp
from minipar.comm import all_gather, all_reduce, reduce_scatter


def gather_tokens(comm, x):
    """Every rank's x (b, s/t, h) side by side along the sequence, rank order: (b, s, h)."""
    first = xp.ascontiguousarray(xp.moveaxis(x, 1, 0))         # tokens first: a rank's part is one slab
    full = all_gather(comm, first, sizes=[first.size] * comm.size)
    full = full.reshape((first.shape[0] * comm.size,) + first.shape[1:])
    return xp.ascontiguousarray(xp.moveaxis(full, 0, 1))


def scatter_tokens(comm, x):
    """The sum over the ranks of x (b, s, h), this rank's s/t tokens: (b, s/t, h)."""
    first = xp.ascontiguousarray(xp.moveaxis(x, 1, 0))
    mine = reduce_scatter(comm, first)
    mine = mine.reshape((first.shape[0] // comm.size,) + first.shape[1:])
    return xp.ascontiguousarray(xp.moveaxis(mine, 0, 1))


class MyGatherFromSequence(Function):
    """Into a column-parallel layer: all-gather the tokens forward, reduce-scatter backward."""

    @staticmethod
    def forward(ctx, x, comm=None):
        ctx.comm = comm
        return gather_tokens(comm, x)

    @staticmethod
    def backward(ctx, g):
        return scatter_tokens(ctx.comm, g)


class MyReduceScatterToSequence(Function):
    """Out of a row-parallel layer: reduce-scatter the tokens forward, all-gather backward."""

    @staticmethod
    def forward(ctx, x, comm=None):
        ctx.comm = comm
        return scatter_tokens(comm, x)

    @staticmethod
    def backward(ctx, g):
        return gather_tokens(ctx.comm, g)


class MyVocabParallelCrossEntropy(Function):
    """Mean cross-entropy of logits (b, s, V/t) holding vocabulary ids vocab_start...; targets (b, s)."""

    @staticmethod
    def forward(ctx, logits, targets, comm=None, vocab_start=0):
        z = logits.reshape(-1, logits.shape[-1])
        local = targets.reshape(-1) - vocab_start
        mine = (local >= 0) & (local < z.shape[1])        # the rows whose target this rank holds
        rows, safe = xp.arange(z.shape[0]), xp.where(mine, local, 0)
        m = all_reduce(comm, z.max(axis=1), op="max")
        e = xp.exp(z - m[:, None])
        sum_e, z_y = all_reduce(comm, xp.stack([e.sum(axis=1), xp.where(mine, z[rows, safe], 0)]))
        ctx.save_for_backward(e / sum_e[:, None])
        ctx.rows, ctx.targets, ctx.shape = rows[mine], safe[mine], logits.shape
        return xp.mean(m + xp.log(sum_e) - z_y)

    @staticmethod
    def backward(ctx, g):
        (grad,) = ctx.saved                               # softmax of my columns
        grad[ctx.rows, ctx.targets] -= 1                  # minus one-hot, where the target is mine
        return (grad * (g / grad.shape[0])).reshape(ctx.shape), None
''',
}
