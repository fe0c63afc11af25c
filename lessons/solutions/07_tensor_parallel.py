"""Solutions of lesson 07's exercises (the test suite runs the notebook with them)."""

SOLUTIONS = {
    "megatron_f_g": r'''
%%writefile {WORK}/my_regions.py
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
}
