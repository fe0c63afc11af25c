"""The command line's side of ``TrainConfig``: flags in, flags in the error messages.

``validate_layout(args)`` builds the frozen ``TrainConfig`` from the parsed flags and
resolves it for this world size (every check, before any message is sent).  The
library speaks of its fields as `n_head`; here they become the flags a user typed
(--n-head), and the error is raised as ``LayoutError`` — a ``SystemExit`` with one line.
"""
from __future__ import annotations

from minipar.cli_checks import as_flags  # noqa: F401  (the library's `names` as --flags)
from minipar.config import ConfigError, TrainConfig


class LayoutError(SystemExit):
    """A configuration that cannot run; the message says what to change."""

    def __init__(self, message):
        super().__init__(f"minipar train: {message}")


def world():
    """(rank, size) of MPI.COMM_WORLD; (0, 1) when run without mpiexec."""
    from mpi4py import MPI
    return MPI.COMM_WORLD.Get_rank(), MPI.COMM_WORLD.Get_size()


LAYOUT_FLAGS = ("dp", "cp", "tp", "pp", "chunks", "schedule", "microbatches", "zero",
                "grad_accum", "sequence_parallel", "recompute")


def _auto(config, size, rank):
    """``--layout auto``: the performance model's fastest layout for ``size`` ranks (the
    plan printed first, on rank 0).  Layout flags given with it would be overridden: refused."""
    default = TrainConfig()
    given = [f for f in LAYOUT_FLAGS if getattr(config, f) != getattr(default, f)]
    if given:
        raise ConfigError(f"`layout` auto chooses the layout itself; drop `{given[0]}`")
    from minipar.perf.plan import auto_layout
    chosen, text = auto_layout(config, size)
    if rank == 0:
        print(text, flush=True)
        print(f"--layout auto: running {chosen.layout_name()}", flush=True)
    return chosen


def validate_layout(args, rank_and_size=None) -> TrainConfig:
    """The resolved TrainConfig of parsed flags ``args``, or LayoutError (in flags)."""
    rank, size = rank_and_size or world()
    try:
        config = TrainConfig.from_namespace(args)
        if getattr(args, "layout", "manual") == "auto":
            config = _auto(config, size, rank)
        return config.resolve(size)
    except ConfigError as err:
        raise LayoutError(as_flags(err)) from None
