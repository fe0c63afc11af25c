"""Check a training command's layout and numerics before any message is sent.

Every rank runs the same checks on the same arguments, so a bad configuration
stops all of them with the same message, and none is left waiting for a peer.
The message says what to change.  Features not built yet are refused here, by
name, instead of being silently ignored.
"""
from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class Layout:
    rank: int
    world_size: int
    dp: int
    tp: int
    pp: int


# flag -> (is it set to something not built yet?, what to say)
NOT_BUILT = {
    "--tp": (lambda a: a.tp != 1, "tensor parallelism"),
    "--sequence-parallel": (lambda a: a.sequence_parallel, "sequence parallelism"),
    "--pp": (lambda a: a.pp != 1, "pipeline parallelism"),
    "--chunks": (lambda a: a.chunks != 1, "interleaved pipeline chunks"),
    "--microbatches": (lambda a: a.microbatches is not None, "pipeline micro-batches"),
    "--precision": (lambda a: a.precision in ("fp16", "bf16"), "fp16/bf16 mixed precision"),
    "--recompute": (lambda a: a.recompute != "none", "activation recomputation"),
    "--trace": (lambda a: a.trace is not None, "pipeline traces"),
}


def world():
    """(rank, size) of MPI.COMM_WORLD; (0, 1) when run without mpiexec."""
    from mpi4py import MPI
    return MPI.COMM_WORLD.Get_rank(), MPI.COMM_WORLD.Get_size()


def validate_layout(args, rank_and_size=None) -> Layout:
    rank, size = rank_and_size or world()
    for flag, (is_set, feature) in NOT_BUILT.items():
        if is_set(args):
            raise SystemExit(f"minipar train: {flag}: {feature} is not built yet in this "
                             "version of minipar; leave the flag out")
    dp = args.dp if args.dp is not None else size // (args.tp * args.pp)
    if dp * args.tp * args.pp != size:
        raise SystemExit(f"minipar train: world size {size} != dp·tp·pp = {dp}·{args.tp}·{args.pp}; "
                         f"launch mpiexec -n {dp * args.tp * args.pp} or change the layout")
    for name in ("steps", "batch_size", "grad_accum"):
        if getattr(args, name) < 1:
            raise SystemExit(f"minipar train: --{name.replace('_', '-')} must be >= 1")
    if args.batch_size % (dp * args.grad_accum):
        raise SystemExit(f"minipar train: --batch-size {args.batch_size} must be divisible by "
                         f"dp·grad-accum = {dp}·{args.grad_accum}")
    return Layout(rank=rank, world_size=size, dp=dp, tp=args.tp, pp=args.pp)
