"""The command line's side of ``TrainConfig``: flags in, flags in the error messages.

``validate_layout(args)`` builds the frozen ``TrainConfig`` from the parsed flags and
resolves it for this world size (every check, before any message is sent).  The
library speaks of its fields as `n_head`; here they become the flags a user typed
(--n-head), and the error is raised as ``LayoutError`` — a ``SystemExit`` with one line.
"""
from __future__ import annotations

import re

from minipar.config import ConfigError, TrainConfig


class LayoutError(SystemExit):
    """A configuration that cannot run; the message says what to change."""

    def __init__(self, message):
        super().__init__(f"minipar train: {message}")


def as_flags(message):
    """`field_name` -> --field-name, in a library message."""
    return re.sub(r"`([a-z0-9_]+)`", lambda m: "--" + m.group(1).replace("_", "-"), str(message))


def world():
    """(rank, size) of MPI.COMM_WORLD; (0, 1) when run without mpiexec."""
    from mpi4py import MPI
    return MPI.COMM_WORLD.Get_rank(), MPI.COMM_WORLD.Get_size()


def validate_layout(args, rank_and_size=None) -> TrainConfig:
    """The resolved TrainConfig of parsed flags ``args``, or LayoutError (in flags)."""
    _, size = rank_and_size or world()
    try:
        return TrainConfig.from_namespace(args).resolve(size)
    except ConfigError as err:
        raise LayoutError(as_flags(err)) from None
