"""ProcessGrid: the dp × tp × pp arrangement of ranks and its sub-communicators.

Ranks are numbered with tensor parallelism fastest, then data, then pipeline:

    rank = pp_rank · (dp · tp) + dp_rank · tp + tp_rank

so the tp ranks of one stage are adjacent (one node, where the heavy per-layer
all-reduces belong), the replicas of a stage come next, and pipeline stages are
farthest apart (they only exchange activations).  Each rank belongs to one group
of each kind:

- ``tp_comm``: same (pp, dp) — tensor-parallel all-reduces;
- ``dp_comm``: same (pp, tp) — gradient all-reduce / ZeRO;
- ``pp_comm``: same (dp, tp) — activations between stages (rank i = stage i).

The grid is an explicit object passed around, never a global, so a test can build
several.  ``check_grid_sizes`` validates before any communicator is created.
"""
from __future__ import annotations

from dataclasses import dataclass


def check_grid_sizes(world_size, dp, tp, pp):
    """Raise ValueError (saying what to change) unless world_size == dp·tp·pp."""
    for name, value in (("dp", dp), ("tp", tp), ("pp", pp)):
        if not isinstance(value, int) or value < 1:
            raise ValueError(f"{name} must be a positive integer, got {value!r}")
    if dp * tp * pp != world_size:
        raise ValueError(f"world size {world_size} != dp·tp·pp = {dp}·{tp}·{pp} = {dp * tp * pp}; "
                         f"launch mpiexec -n {dp * tp * pp} or change --dp/--tp/--pp")


@dataclass(frozen=True)
class Coordinates:
    dp: int
    tp: int
    pp: int


def coordinates(rank, dp, tp, pp) -> Coordinates:
    return Coordinates(dp=(rank // tp) % dp, tp=rank % tp, pp=rank // (dp * tp))


def rank_of(coords: Coordinates, dp, tp, pp) -> int:
    return coords.pp * dp * tp + coords.dp * tp + coords.tp


class ProcessGrid:
    def __init__(self, comm, dp=1, tp=1, pp=1):
        """``comm``: a minipar.comm.Communicator spanning the dp·tp·pp ranks."""
        check_grid_sizes(comm.size, dp, tp, pp)
        self.world = comm
        self.dp, self.tp, self.pp = dp, tp, pp
        self.rank = comm.rank
        self.coords = coordinates(comm.rank, dp, tp, pp)
        c = self.coords
        # one split per group kind; colour = the coordinates that stay fixed
        self.tp_comm = comm.split(color=c.pp * dp + c.dp, key=c.tp)
        self.dp_comm = comm.split(color=c.pp * tp + c.tp, key=c.dp)
        self.pp_comm = comm.split(color=c.dp * tp + c.tp, key=c.pp)

    @property
    def is_first_stage(self):
        return self.coords.pp == 0

    @property
    def is_last_stage(self):
        return self.coords.pp == self.pp - 1

    def __repr__(self):
        c = self.coords
        return (f"ProcessGrid(rank={self.rank}, dp={c.dp}/{self.dp}, tp={c.tp}/{self.tp}, "
                f"pp={c.pp}/{self.pp})")
