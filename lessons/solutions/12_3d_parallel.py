"""Solutions of lesson 12's exercises (put into the notebook's exercise cells by the tests)."""

SOLUTIONS = {
    "my_coordinates": r'''
def my_coordinates(rank, dp, tp, pp):
    """(dp_rank, tp_rank, pp_rank) of `rank` in a dp × tp × pp grid numbered tp-fastest."""
    return (rank // tp) % dp, rank % tp, rank // (dp * tp)
''',
    "group_members": r'''
def group_members(rank, dp, tp, pp, kind):
    """World ranks of `rank`'s `kind` group ("tp", "dp" or "pp"), ordered by rank within the group."""
    d, t, p = my_coordinates(rank, dp, tp, pp)
    rank_of = lambda d, t, p: p * dp * tp + d * tp + t         # the numbering above
    if kind == "tp":
        return [rank_of(d, i, p) for i in range(tp)]
    if kind == "dp":
        return [rank_of(i, t, p) for i in range(dp)]
    if kind == "pp":
        return [rank_of(d, t, i) for i in range(pp)]
    raise ValueError(kind)
''',
    "capstone_step": r'''
%%writefile {MINE}/step3d.py
"""Your 3D training step (lesson 12): your pieces composed over the grid; run under
mpiexec by 12_yours.py."""
from minipar.backend import xp
from minipar.comm import all_reduce

from ddp import MyDDP            # lesson 05
from stage import run_stage      # lesson 08


def wire(grid, module, bucket_bytes):
    """Your DDP over the ranks that hold the same weights and see other data: dp x cp."""
    return MyDDP(module, grid.dp_cp_comm, bucket_bytes)


def gradients_3d(grid, ddp, stage, actions, held, sequence_parallel):
    """Forward and backward of one step; then every held .grad is this rank's piece of
    the gradient of the global batch's mean loss."""
    run_stage(grid.pp_comm, stage, actions)       # the micro-batches through the stages
    ddp.finish()                                  # the mean over dp x cp
    if sequence_parallel and grid.tp > 1:         # a replicated weight saw only my tokens
        partial = [h.param for h in held if h.replicated_over_tp]
        flat = xp.concatenate([p.grad.reshape(-1) for p in partial])
        all_reduce(grid.tp_comm, flat)            # the sum of the tp ranks' parts
        start = 0
        for p in partial:
            p.grad = flat[start:start + p.grad.size].reshape(p.grad.shape)
            start += p.grad.size


def norm_and_overflow(grid, held):
    """(||g|| of the whole model, whether any rank's gradient holds inf or NaN), agreed by
    every rank in one all-reduce."""
    squares, bad = 0.0, 0.0
    for h in held:
        g = h.param.grad.astype(xp.float64)
        weight = 1.0 / grid.tp if h.replicated_over_tp else 1.0   # each element once over tp
        squares += weight * float((g * g).sum())
        bad = max(bad, float(not xp.isfinite(g).all()))
    copies = grid.dp * grid.cp                    # the replicas hold the same gradient
    total = all_reduce(grid.world, xp.array([squares / copies, bad]))
    return float(total[0]) ** 0.5, bool(total[1] > 0)
''',
}
