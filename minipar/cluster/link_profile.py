"""What the performance model is told about a simulated cluster: this machine's profile,
with the link the cluster shapes.

A run decides some things from the performance model before it starts (the gradient
bucket size: ``perf/bucket_size.py``; the layout under ``--layout auto``).  Inside a
namespace nothing says that the ranks of another node sit behind a 1 Gbit/s token
bucket, and the shipped profile knows only this machine's shared memory, where a bucket's
all-reduce costs next to nothing.  The cluster knows its own link, so ``cluster up``
writes it down once:

    the base profile       ``$MINIPAR_PROFILE`` if set, else the shipped ``cpu`` one
    links["inter"]         bw = the tc rate per direction (inter_gbps · 10⁹ / 8 bytes/s),
                           α = the intra link's (veth and the bridge add no latency of
                           note; the token bucket adds none)
    ranks_per_node         the cluster's
    nodes_per_host         the node count: every namespace shares this machine's cores

and ``cluster run`` hands its path to the ranks as ``MINIPAR_PROFILE`` unless the user
gave one (a profile measured on the cluster with ``cluster run -- calibrate`` is better:
curves instead of α and β).
"""
from __future__ import annotations

import json
import os

from minipar.perf.profile import load_profile


def link_profile_path(spec):
    return os.path.join(spec.state_dir, "profile.json")


def write_link_profile(spec, base=None):
    """Write the cluster's profile into its state folder; returns the path."""
    prof = load_profile(base or os.environ.get("MINIPAR_PROFILE") or "cpu")
    data = prof.to_dict()
    intra = data["links"].get("intra") or {"alpha": 1e-5}
    data["links"] = dict(data["links"], inter={"alpha": intra["alpha"],
                                               "bw": spec.inter_gbps * 1e9 / 8})
    data.update(name=f"{prof.name} + cluster {spec.prefix}",
                ranks_per_node=spec.ranks_per_node, nodes_per_host=spec.nodes,
                description=f"{prof.description} — on a simulated cluster of {spec.nodes} "
                            f"nodes x {spec.ranks_per_node} ranks, {spec.inter_gbps:g} Gbit/s "
                            f"between nodes (the link as shaped; not measured)")
    path = link_profile_path(spec)
    tmp = path + ".tmp"
    with open(tmp, "w") as f:
        json.dump(data, f, indent=1)
    os.replace(tmp, path)
    return path
