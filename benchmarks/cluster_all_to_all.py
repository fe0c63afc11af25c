"""The all-to-all on a simulated cluster: the two-level exchange against the flat
(pairwise) one — bytes over the link, time, and the cost model's price.  Needs root, ip
and tc (``minipar/cluster``).

    sudo python benchmarks/cluster_all_to_all.py [--inter-gbps 1] [--size 4M] [--calls 10]

2 nodes x 2 ranks.  First ``bench comm --collective all_to_all`` times pairwise,
two_level and auto against MPI's own ``Alltoallv`` from 64 KiB to 16 MiB per rank and
prints the cost model's prediction beside each (the bench calibrates the links first).
Then, for each algorithm, ``--calls`` all-to-alls of ``--size`` bytes per rank run alone
while the host reads the nodes' veth counters: the bytes that crossed the link per call,
against the volume both algorithms must move, 2 nodes × 2 ranks × S·(2/4) bytes out of
each node per call (every row for the other node crosses once: two-level regroups the
rows inside the node first, so it sends fewer, larger messages, not fewer bytes).
"""
from __future__ import annotations

import argparse
import json
import os
import sys
import tempfile

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

from cluster_links import Cluster   # noqa: E402

SIZES = ("64K", "256K", "1M", "4M", "16M")


def rank_side(algorithm, size, calls):
    """On each rank: ``calls`` all-to-alls of ``size`` bytes (the host reads the link's
    counters around the whole job: the launch's own traffic is in them, a few kB)."""
    import numpy as np
    from minipar.comm import Communicator, all_to_all, chunk_sizes
    comm = Communicator()
    send = np.ones(size // 4, dtype=np.float32)
    counts = chunk_sizes(send.size, comm.size)
    for _ in range(calls):
        all_to_all(comm, send, counts, algorithm=algorithm)
    comm.mpi.Barrier()


def parse_size(text):
    units = {"K": 2 ** 10, "M": 2 ** 20}
    return int(float(text[:-1]) * units[text[-1]]) if text[-1] in units else int(text)


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--inter-gbps", type=float, default=1.0)
    ap.add_argument("--size", default="4M")
    ap.add_argument("--calls", type=int, default=10)
    ap.add_argument("--rank-side", nargs=3, metavar=("ALGORITHM", "BYTES", "CALLS"))
    a = ap.parse_args()
    if a.rank_side:
        return rank_side(a.rank_side[0], int(a.rank_side[1]), int(a.rank_side[2]))
    from minipar.cluster.netns import link_bytes
    from minipar.cluster.topology import ClusterSpec
    size = parse_size(a.size)
    out = os.path.join(tempfile.mkdtemp(), "bench.json")
    with Cluster(2, 2, a.inter_gbps) as c:
        c.run("bench", "comm", "--collective", "all_to_all", "--algorithms", "pairwise,two_level,auto",
              "--min-size", SIZES[0], "--max-size", SIZES[-1], "--json", out)
        spec = ClusterSpec.load(c.prefix)
        crossed = {}
        for algorithm in ("pairwise", "two_level"):
            before = link_bytes(spec)
            c.run(os.path.abspath(__file__), "--rank-side", algorithm, size, a.calls)
            after = link_bytes(spec)
            crossed[algorithm] = sum(after[n]["out_of"] - before[n]["out_of"] for n in after) / a.calls
    with open(out) as f:
        data = json.load(f)
    print(f"## all-to-all, 2 nodes x 2 ranks, {a.inter_gbps:g} Gbit/s between them")
    print(f"{'bytes/rank':>10} {'algorithm':<22} {'ms':>9} {'model ms':>9} {'model/meas':>10} "
          f"{'vs MPI':>7}")
    for r in data["rows"]:
        if r["algorithm"].startswith("mpi"):
            continue
        pred = r["predicted_s"]
        name = r["algorithm"] if r["algorithm"] != "auto" else f"auto({r['chosen']})"
        print(f"{r['size']:>10} {name:<22} {r['time_s'] * 1e3:9.2f} "
              f"{(pred or float('nan')) * 1e3:9.2f} {pred / r['time_s'] if pred else float('nan'):10.2f} "
              f"{r['vs_mpi']:7.2f}")
    volume = 2 * 2 * size * 2 / 4
    print(f"\nbytes over the link per all-to-all of {size} bytes per rank (veth counters over "
          f"the job, launch and headers included; the rows' volume {volume:.0f}):")
    for algorithm, b in crossed.items():
        print(f"  {algorithm:<10} {b:12.0f}  ({b / volume:.3f} of the volume)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
