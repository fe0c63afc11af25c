"""mpiexec script: ``grid_check.py DP TP PP [CP]`` — every rank checks its coordinates
and each of its sub-communicators (which ranks, in which order) against
``tests/grid_groups.expected_groups``, an enumeration written out from the documented
numbering, not the library's formula."""
import sys

import numpy as np

from minipar.comm import Communicator, all_reduce
from minipar.parallel.grid import ProcessGrid
from tests.grid_groups import expected_groups

dp, tp, pp = (int(a) for a in sys.argv[1:4])
cp = int(sys.argv[4]) if len(sys.argv) > 4 else 1
world = Communicator()
grid = ProcessGrid(world, dp=dp, tp=tp, pp=pp, cp=cp)
coords, groups = expected_groups(dp, cp, tp, pp)[world.rank]
c = grid.coords
assert (c.dp, c.cp, c.tp, c.pp) == coords, (world.rank, c, coords)
for kind, members in groups.items():
    sub = getattr(grid, f"{kind}_comm")
    # 1 + each member's rank in the sub-communicator, at its world rank; 0 elsewhere
    place = np.zeros(world.size)
    place[world.rank] = sub.rank + 1
    place = all_reduce(sub, place)
    found = sorted(np.flatnonzero(place).tolist(), key=lambda r: place[r])
    assert sub.size == len(members) and found == members, (kind, world.rank, found, members)
print(f"rank {world.rank} ok {grid}")
