"""Whether a communicator's ranks sit on more than one node.

A node is what MPI calls a shared-memory domain (``MPI.COMM_TYPE_SHARED``: the
launcher's hosts, one network namespace of ``minipar cluster``), or, where the
communicator pretends (``ranks_per_node``, so one machine can teach the hierarchical
all-reduce), q consecutive ranks.  The answer is found collectively on first use (a
buffer-based MPI split, never a pickled collective: see ``hierarchical.py``) and kept
in the communicator's cache, so every later call is a dictionary lookup.
"""
from __future__ import annotations

from mpi4py import MPI


def remember(comm, spans: bool):
    """Record the answer where it is known without asking (``hierarchical.node_layout``
    knows its node and cross communicators': one node, and one rank per node)."""
    comm.cache["spans_nodes", comm.ranks_per_node] = spans


def spans_nodes(comm) -> bool:
    """Collective on its first call for ``comm``: True if its ranks are on two nodes or more."""
    key = ("spans_nodes", comm.ranks_per_node)
    if key not in comm.cache:
        if comm.ranks_per_node:
            comm.cache[key] = comm.size > comm.ranks_per_node
        else:
            shared = comm._setup(comm.mpi.Split_type, MPI.COMM_TYPE_SHARED, comm.rank)
            comm.cache[key] = shared.Get_size() < comm.size
            shared.Free()
    return comm.cache[key]
