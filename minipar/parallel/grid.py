"""ProcessGrid: the dp × cp × tp × pp arrangement of ranks and its sub-communicators.

Ranks are numbered with tensor parallelism fastest, then context, data, pipeline:

    rank = pp_rank · (dp · cp · tp) + dp_rank · (cp · tp) + cp_rank · tp + tp_rank

so the tp ranks of one stage are adjacent (one node, where the heavy per-layer
all-reduces belong), the context-parallel ring next (K/V blocks every layer), the
replicas of a stage after that, and pipeline stages are farthest apart (they only
exchange activations).  Each rank belongs to one group of each kind:

- ``tp_comm``: same (pp, dp, cp) — tensor-parallel all-reduces;
- ``cp_comm``: same (pp, dp, tp) — the ring of ring attention;
- ``dp_comm``: same (pp, cp, tp) — the replicas;
- ``dp_cp_comm``: same (pp, tp) — gradient all-reduce / ZeRO: a cp rank's gradient is
  its positions' share, so gradients are averaged over dp × cp as one group (with
  cp = 1 it is ``dp_comm``);
- ``pp_comm``: same (dp, cp, tp) — activations between stages (rank i = stage i);
- ``ep_comm`` and ``edp_comm``, cut from ``dp_cp_comm`` (expert parallelism, as
  Megatron carves it from the data-parallel ranks): the member j of ``dp_cp_comm``
  is member j mod ep of the ep group j div ep, which holds one copy of every expert
  (E/ep each) and exchanges tokens by all-to-all; ``edp_comm`` joins the ranks
  holding the same experts (member j div ep of group j mod ep), over which their
  gradients are reduced.  With ep = 1 there is no ``ep_comm`` (None) and ``edp_comm``
  is ``dp_cp_comm``.

The grid is an explicit object passed around, never a global, so a test can build
several.  ``check_grid_sizes`` validates before any communicator is created.
"""
from __future__ import annotations

from dataclasses import dataclass


def check_grid_sizes(world_size, dp, tp, pp, cp=1, ep=1):
    """Raise ValueError (saying what to change) unless world_size == dp·cp·tp·pp and ep
    divides dp·cp."""
    for name, value in (("dp", dp), ("tp", tp), ("pp", pp), ("cp", cp), ("ep", ep)):
        if not isinstance(value, int) or value < 1:
            raise ValueError(f"`{name}` must be a positive integer, got {value!r}")
    n = dp * cp * tp * pp
    if n != world_size:
        raise ValueError(f"world size {world_size} != dp·cp·tp·pp = {dp}·{cp}·{tp}·{pp} = {n}; "
                         f"launch mpiexec -n {n} or change `dp`/`cp`/`tp`/`pp`")
    if (dp * cp) % ep:
        raise ValueError(f"`ep` {ep} must divide the data-parallel ranks dp·cp = {dp}·{cp}, "
                         f"from which the expert-parallel groups are carved")


@dataclass(frozen=True)
class Coordinates:
    dp: int
    tp: int
    pp: int
    cp: int = 0


def coordinates(rank, dp, tp, pp, cp=1) -> Coordinates:
    return Coordinates(dp=(rank // (cp * tp)) % dp, tp=rank % tp, pp=rank // (dp * cp * tp),
                       cp=(rank // tp) % cp)


def rank_of(coords: Coordinates, dp, tp, pp, cp=1) -> int:
    return ((coords.pp * dp + coords.dp) * cp + coords.cp) * tp + coords.tp


class ProcessGrid:
    def __init__(self, comm, dp=1, tp=1, pp=1, cp=1, ep=1):
        """``comm``: a minipar.comm.Communicator spanning the dp·cp·tp·pp ranks."""
        check_grid_sizes(comm.size, dp, tp, pp, cp, ep)
        self.world = comm
        self.dp, self.tp, self.pp, self.cp, self.ep = dp, tp, pp, cp, ep
        self.rank = comm.rank
        self.coords = coordinates(comm.rank, dp, tp, pp, cp)
        c = self.coords
        # one split per group kind; colour = the coordinates that stay fixed
        self.tp_comm = comm.split(color=(c.pp * dp + c.dp) * cp + c.cp, key=c.tp)
        self.cp_comm = comm.split(color=(c.pp * dp + c.dp) * tp + c.tp, key=c.cp)
        self.dp_comm = comm.split(color=(c.pp * cp + c.cp) * tp + c.tp, key=c.dp)
        self.dp_cp_comm = (self.dp_comm if cp == 1 else
                           comm.split(color=c.pp * tp + c.tp, key=c.dp * cp + c.cp))
        self.pp_comm = comm.split(color=(c.dp * cp + c.cp) * tp + c.tp, key=c.pp)
        self.ep_comm, self.edp_comm = None, self.dp_cp_comm
        if ep > 1:
            j = self.dp_cp_comm.rank
            self.ep_comm = self.dp_cp_comm.split(color=j // ep, key=j % ep)
            self.edp_comm = self.dp_cp_comm.split(color=j % ep, key=j // ep)

    @property
    def is_last_stage(self):
        return self.coords.pp == self.pp - 1

    def __repr__(self):
        c = self.coords
        return (f"ProcessGrid(rank={self.rank}, dp={c.dp}/{self.dp}, cp={c.cp}/{self.cp}, "
                f"tp={c.tp}/{self.tp}, pp={c.pp}/{self.pp})")
