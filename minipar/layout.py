"""Check a training command's layout and numerics before any message is sent.

Every rank runs the same checks on the same arguments, so a bad configuration
stops all of them with the same message, and none is left waiting for a peer.
The message says what to change.  Combinations that are not supported are refused
here, by name, instead of being silently ignored.
"""
from __future__ import annotations

from dataclasses import dataclass

from minipar.backend import backend_name
from minipar.nn import config_from_preset


class LayoutError(SystemExit):
    """A configuration that cannot run; the message says what to change."""

    def __init__(self, message):
        super().__init__(f"minipar train: {message}")


@dataclass(frozen=True)
class Layout:
    rank: int
    world_size: int
    dp: int
    tp: int
    pp: int
    chunks: int
    microbatches: int


def world():
    """(rank, size) of MPI.COMM_WORLD; (0, 1) when run without mpiexec."""
    from mpi4py import MPI
    return MPI.COMM_WORLD.Get_rank(), MPI.COMM_WORLD.Get_size()


def model_config(args):
    return config_from_preset(args.model, n_layer=args.n_layer, d_model=args.d_model,
                              n_head=args.n_head, seq_len=args.seq_len, dropout=args.dropout,
                              tie_weights=args.tie_weights, attention=args.attention)


def _check_pipeline(args, cfg, dp):
    pp, chunks = args.pp, args.chunks
    m = args.microbatches if args.microbatches is not None else (2 * pp if pp > 1 else 1)
    if pp == 1 and chunks == 1:
        if args.microbatches not in (None, 1) or args.trace:
            raise LayoutError("--microbatches and --trace belong to pipeline parallelism; "
                              "add --pp P (P >= 2) or leave them out")
        return 1
    if chunks > 1 and args.schedule != "interleaved":
        raise LayoutError(f"--chunks {chunks} needs --schedule interleaved")
    if args.schedule == "interleaved" and chunks < 2:
        raise LayoutError("--schedule interleaved needs --chunks V with V >= 2")
    if args.schedule == "interleaved" and m % pp:
        raise LayoutError(f"--schedule interleaved needs --microbatches divisible by --pp {pp}, "
                          f"got {m}")
    if m < 1:
        raise LayoutError("--microbatches must be >= 1")
    if cfg.n_layer % (pp * chunks):
        raise LayoutError(f"--n-layer {cfg.n_layer} is not divisible by pp·chunks = {pp}·{chunks}")
    if cfg.tie_weights:
        raise LayoutError("--tie-weights with pipeline parallelism is not supported; drop it")
    if args.grad_accum != 1:
        raise LayoutError("with --pp, micro-batches do the accumulation: use --microbatches "
                          "instead of --grad-accum")
    if args.zero == 3:
        raise LayoutError("--zero 3 with --pp is not supported (ZeRO-3 gathers whole-model "
                          "units); use --zero 1 or 2 with pipeline parallelism")
    if args.batch_size % (dp * m):
        raise LayoutError(f"--batch-size {args.batch_size} must be divisible by "
                          f"dp·microbatches = {dp}·{m}")
    return m


def _check_tensor(args, cfg):
    if args.sequence_parallel and args.tp == 1:
        raise LayoutError("--sequence-parallel needs --tp T with T >= 2")
    if args.tp == 1:
        return
    from minipar.parallel.tensor import check_tensor_parallel
    try:
        check_tensor_parallel(cfg, args.tp, args.sequence_parallel)
    except ValueError as err:
        raise LayoutError(str(err)) from None
    if args.zero >= 2 and args.sequence_parallel:
        raise LayoutError(f"--zero {args.zero} with --sequence-parallel is not supported "
                          "(replicated LayerNorm gradients must be summed over tp before they "
                          "are sharded); use --zero 1")


def _check_flags_have_effect(args, pipeline):
    """A flag that would change nothing under this layout is refused, not ignored; then
    the defaults that depend on the layout are filled in."""
    if args.schedule is not None and not pipeline:
        raise LayoutError("--schedule belongs to pipeline parallelism; add --pp P or leave it out")
    if args.zero > 0 and (args.comm_algorithm != "auto" or args.no_overlap):
        raise LayoutError("--comm-algorithm and --no-overlap set data parallelism's all-reduce "
                          "(--zero 0); ZeRO reduce-scatters (ring) from the gradient hooks")
    if args.zero == 3 and args.bucket_mb is not None:
        raise LayoutError("--bucket-mb does not apply to --zero 3, whose units are the layers")
    if args.initial_loss_scale is not None and args.precision != "fp16":
        raise LayoutError("--initial-loss-scale needs --precision fp16 (the only one scaled)")
    if args.save_every and not args.save:
        raise LayoutError("--save-every needs --save DIR")
    args.schedule = args.schedule or "1f1b"
    args.bucket_mb = 25.0 if args.bucket_mb is None else args.bucket_mb
    args.initial_loss_scale = args.initial_loss_scale or 2.0 ** 16
    args.eval_batches = 4 if args.eval_batches is None else args.eval_batches


def validate_layout(args, rank_and_size=None) -> Layout:
    rank, size = rank_and_size or world()
    for name in ("tp", "pp", "chunks", "steps", "batch_size", "grad_accum"):
        if getattr(args, name) < 1:
            raise LayoutError(f"--{name.replace('_', '-')} must be >= 1")
    if args.dp is not None and args.dp < 1:
        raise LayoutError("--dp must be >= 1")
    dp = args.dp if args.dp is not None else size // (args.tp * args.pp)
    if dp < 1 or dp * args.tp * args.pp != size:
        raise LayoutError(f"world size {size} != dp·tp·pp = {dp}·{args.tp}·{args.pp}; "
                          f"launch mpiexec -n {max(dp, 1) * args.tp * args.pp} or change the layout")
    try:
        cfg = model_config(args)
    except ValueError as err:
        raise LayoutError(str(err)) from None
    _check_flags_have_effect(args, pipeline=args.pp > 1 or args.chunks > 1)
    if args.recompute != "none" and cfg.dropout > 0 and backend_name() == "cupy":
        raise LayoutError("--recompute with dropout on CuPy is not supported: replaying the "
                          "dropout masks needs the generator's state, which CuPy does not expose")
    m = _check_pipeline(args, cfg, dp)
    _check_tensor(args, cfg)
    if args.batch_size % (dp * args.grad_accum):
        raise LayoutError(f"--batch-size {args.batch_size} must be divisible by "
                          f"dp·grad-accum = {dp}·{args.grad_accum}")
    if args.resume:
        import os
        from minipar.checkpoint import FILENAME
        if not os.path.isfile(os.path.join(args.resume, FILENAME)):
            raise LayoutError(f"--resume {args.resume}: no checkpoint there")
    return Layout(rank=rank, world_size=size, dp=dp, tp=args.tp, pp=args.pp,
                  chunks=args.chunks, microbatches=m)
