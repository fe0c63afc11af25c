"""mpiexec script: every rank checks its sub-communicators against the rank formula."""
import sys

from minipar.comm import Communicator, all_reduce
from minipar.parallel.grid import ProcessGrid, coordinates
import numpy as np

dp, tp, pp = (int(a) for a in sys.argv[1:4])
world = Communicator()
grid = ProcessGrid(world, dp=dp, tp=tp, pp=pp)
c = grid.coords
assert (grid.tp_comm.size, grid.dp_comm.size, grid.pp_comm.size) == (tp, dp, pp)
assert (grid.tp_comm.rank, grid.dp_comm.rank, grid.pp_comm.rank) == (c.tp, c.dp, c.pp)
for name, sub, fixed in (("tp", grid.tp_comm, ("pp", "dp")), ("dp", grid.dp_comm, ("pp", "tp")),
                         ("pp", grid.pp_comm, ("dp", "tp"))):
    members = np.zeros(world.size)
    members[world.rank] = 1
    members = all_reduce(sub, members)
    for r in np.flatnonzero(members):
        other = coordinates(int(r), dp, tp, pp)
        assert all(getattr(other, f) == getattr(c, f) for f in fixed), (name, r)
print(f"rank {world.rank} ok {grid}")
