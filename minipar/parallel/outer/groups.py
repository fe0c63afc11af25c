"""The DiLoCo groups: G groups carved from the data-parallel ranks, and the communicator
that joins the groups.

With dp data-parallel replicas and G groups, group g holds replicas
[g·dp/G, (g+1)·dp/G): ranks are numbered with dp slower than cp and tp, so a group is a
block of neighbouring ranks — on a cluster launched node by node, one group per node when
G is the number of nodes.  Inside its group a rank keeps its tp, cp and pp place and
takes the in-group replica index d mod dp/G:

    group(d) = d // (dp/G)         inner replica(d) = d mod (dp/G)

``carve_groups(grid, G)`` returns

    inner   a copy of the ProcessGrid whose data-parallel sizes, coordinate and
            communicators (``dp``, ``coords.dp``, ``dp_comm``, ``dp_cp_comm``) are the
            group's: everything built from it (the synchroniser, the batch shares, the
            loss) stays inside the group; ``world`` stays the whole job (checkpoints,
            the log)
    outer   the ranks at the same place in every group (same tp, cp, pp and inner
            replica), ordered by group: the only communicator that crosses groups
    members every rank of this rank's group (sums that must not cross the link)
    group   this rank's group index g

The grid itself is not changed: the groups are splits of its communicators.
"""
from __future__ import annotations

import copy
from dataclasses import dataclass, replace
from typing import Any


@dataclass
class Groups:
    inner: Any        # the group's ProcessGrid (data parallelism inside the group)
    outer: Any        # Communicator across the groups (one rank per group)
    members: Any      # Communicator over every rank of this group
    group: int        # this rank's group
    count: int        # G


def carve_groups(grid, count):
    """Split ``grid``'s data-parallel ranks into ``count`` groups (collective over the
    world).  ``count`` must divide ``grid.dp`` (``config.rules`` refuses it before)."""
    if count < 1 or grid.dp % count:
        raise ValueError(f"groups {count} must divide the data-parallel size {grid.dp}")
    per = grid.dp // count
    c = grid.coords
    group, local = divmod(c.dp, per)
    inner = copy.copy(grid)
    inner.dp = per
    inner.coords = replace(c, dp=local)
    inner.dp_comm = grid.dp_comm.split(color=group, key=local)
    inner.dp_cp_comm = (inner.dp_comm if grid.cp == 1 else
                        grid.dp_cp_comm.split(color=group, key=local * grid.cp + c.cp))
    if getattr(grid, "ep", 1) == 1 and hasattr(grid, "edp_comm"):
        inner.edp_comm = inner.dp_cp_comm       # experts' replicas: the group's too
    # the same place in every group: (pp, inner replica, cp, tp) numbered as the grid does
    place = ((c.pp * per + local) * grid.cp + c.cp) * grid.tp + c.tp
    outer = grid.world.split(color=place, key=group)
    members = grid.world.split(color=group, key=grid.rank)
    return Groups(inner=inner, outer=outer, members=members, group=group, count=count)
