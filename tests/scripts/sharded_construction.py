"""mpiexec script: sharded construction builds exactly the single process's weights, and a
rank never holds more than its share plus one full tensor while it builds them.

For each layout of the world size: build the model the way training does (placeholders,
cut, then drawn by name) and the old way (the whole plain GPT, then cut), and check on
every rank that
  - what it holds equals, bit for bit, the old way's arrays and the placement's cut of
    the single-process weights (``placement.local(full)``);
  - the largest tensor drawn is the largest parameter this rank holds a part of (one at
    a time; a middle pipeline stage never draws the embedding);
  - the Python/NumPy allocations at their peak during construction (tracemalloc) stay
    under what is still allocated at its end + two full tensors (the one drawn and its
    cut piece) + a margin: no whole model passes through a rank.
Prints one line per rank and layout: "ok <layout> held=<bytes> peak=<bytes>".
"""
import sys
import tracemalloc

import numpy as np

from minipar import backend
from minipar.comm import Communicator
from minipar.config import TrainConfig
from minipar.nn import GPT
from minipar.nn.init import InitStats
from minipar.parallel.grid import ProcessGrid
from minipar.parallel.parallelize import parallelize
from minipar.parallel.sync import Zero3Sync

LAYOUTS = {
    2: [dict(zero=3), dict(tp=2), dict(pp=2), dict(tp=2, sequence_parallel=True, zero=3)],
    4: [dict(zero=3), dict(tp=2, pp=2), dict(dp=2, tp=2, zero=3), dict(pp=4), dict(tp=4),
        dict(dp=2, pp=2, zero=1), dict(cp=2, tp=2)],
}
MARGIN = 64 * 1024          # module objects, dicts, the grid's own small arrays

world = Communicator()
backend.set_default_dtype(np.float64)
for layout in LAYOUTS[world.size]:
    config = TrainConfig(model="tiny", precision="fp64", batch_size=8, seed=3, **layout)
    config = config.resolve(world.size)
    grid = ProcessGrid(world, dp=config.dp, tp=config.tp, pp=config.pp, cp=config.cp)
    cfg = config.model_config()
    full = GPT(cfg, seed=3).state_dict()                  # the single process's weights
    largest = max(a.size for a in full.values())

    InitStats.reset()
    tracemalloc.start()
    base = tracemalloc.get_traced_memory()[0]
    sharded = parallelize(GPT(cfg, seed=3, materialize=False), config, grid)
    live, peak = (m - base for m in tracemalloc.get_traced_memory())
    tracemalloc.stop()
    drawn = InitStats.largest
    old = parallelize(GPT(cfg, seed=3), config, grid)     # whole model, then cut

    def held(parallel):
        """{name: this rank's values of it} (ZeRO-3: its range of the unit's shard)."""
        if isinstance(parallel.sync, Zero3Sync):
            out = {}
            for name, pl in parallel.placements.items():
                cut = pl.owned
                shard = parallel.sync.shards[cut.slot].master
                out[name] = backend.to_host(shard[cut.start:cut.start + cut.hi - cut.lo])
            return out
        return {n: backend.to_host(p.data) for n, p in parallel.module.named_parameters()}

    mine, theirs = held(sharded), held(old)
    assert mine.keys() == theirs.keys() == sharded.placements.keys(), layout
    for name, values in mine.items():
        pl = sharded.placements[name]
        assert np.array_equal(values, theirs[name]), (layout, name, "differs from the old way")
        assert np.array_equal(values, pl.local(full[name])), (layout, name, "!= placement cut")
        assert values.size == pl.local_size, (layout, name)
    if isinstance(sharded.sync, Zero3Sync):
        kept = sum(state.master.nbytes for state in sharded.sync.shards)
    else:
        kept = sum(v.nbytes for v in mine.values())
    total = sum(a.nbytes for a in full.values())
    largest_here = max(full[name].size for name in sharded.placements)
    assert drawn == largest_here, (layout, drawn, largest_here)   # one whole tensor at a time
    sharded_layout = config.zero == 3 or config.tp > 1 or config.pp > 1
    if sharded_layout:
        # what it keeps (weights, and the synchroniser's gradients and masks) + one full
        # tensor being drawn and its cut piece: nothing of the whole model passes through
        bound = live + 2 * largest * 8 + MARGIN
        assert peak <= bound, (layout, f"construction peaked at {peak} B > {bound} B")
        assert kept < total, (layout, kept, total)
    print(f"ok rank {world.rank} {config.layout_name()} held={kept} total={total} "
          f"live={live} peak={peak} largest={largest * 8}", flush=True)
