"""One GPU per rank: which device this rank computes on.

A node's GPUs belong to its shared-memory domain (MPI's ``COMM_TYPE_SHARED``: a host of
the launcher, one network namespace of ``minipar cluster``), so the ranks of a node
share them out by their rank among that node's ranks:

    device = local_rank % devices        (devices: the GPUs this process sees,
                                          CUDA_VISIBLE_DEVICES respected)

Eight ranks on an eight-GPU node take GPUs 0..7.  More ranks than GPUs would put two
processes on one card (each with its own CUDA context and memory pool, fighting for
the memory the memory check counted once): refused unless the run asks for it
(``share_gpus``), as a lesson on a one-GPU machine does.  Where a launcher gives every
rank its own card through ``CUDA_VISIBLE_DEVICES`` each rank sees one device, numbered 0,
and the cards' PCI bus ids tell that they differ: two ranks share a GPU when they sit on
the same node and on the same bus id (the same index where the bus id is unknown).

``choose_device(comm, share)`` is collective: the node split, then one small gather of
every rank's placement (its host, node, GPU and bus id), which every rank checks alike,
so a refusal is the same error on every rank (the command line: one line from rank 0,
exit 2), and the run's header prints the map (``observe/monitor_text.py``).  It must run
before the first array is made on the device: the first allocation creates a CUDA
context on the current device, GPU 0 unless one was chosen.  On NumPy it does nothing
and sends nothing.
"""
from __future__ import annotations

import socket
from dataclasses import asdict, dataclass
from typing import Optional

from minipar import backend


@dataclass(frozen=True)
class Placement:
    """Where one rank computes."""
    rank: int                 # in the world
    host: str
    node: int                 # the world rank of the node's first rank: names the node
    local_rank: int           # among the node's ranks
    ranks_on_node: int
    devices: int              # GPUs this rank sees
    device: int               # the one it uses, numbered as it sees them
    bus_id: Optional[str]     # which physical card that is (None: unknown)

    def card(self):
        """What identifies the physical GPU within the node."""
        return self.bus_id or f"GPU {self.device}"


def device_for(local_rank: int, devices: int) -> int:
    """The GPU a node's ``local_rank``-th rank takes: ``local_rank % devices``."""
    return local_rank % devices


def shared_cards(placements):
    """{node: (ranks on it, GPUs they land on)} for each node where two ranks share a GPU."""
    nodes = {}
    for p in placements:
        nodes.setdefault(p.node, []).append(p)
    shared = {}
    for node, ranks in nodes.items():
        cards = {p.card() for p in ranks}
        if len(cards) < len(ranks):
            shared[node] = (len(ranks), len(cards))
    return shared


def node_label(placements, node):
    """The host of ``node``, and its number among the nodes where two share a host name
    (the simulated cluster's namespaces do)."""
    by_node = {p.node: p.host for p in placements}
    host = by_node[node]
    same = sorted(n for n, h in by_node.items() if h == host)
    return host if len(same) == 1 else f"{host}#{same.index(node)}"


def check_placements(placements, share: bool) -> None:
    """Refuse (ValueError) a node whose ranks outnumber its GPUs, unless ``share``."""
    shared = shared_cards(placements)
    if shared and not share:
        node = min(shared)
        ranks, cards = shared[node]
        raise ValueError(f"node {node_label(placements, node)} has {ranks} ranks and "
                          f"{cards} GPU{'s' if cards != 1 else ''}: pass `share_gpus` to let "
                          f"ranks share a GPU, or start at most {cards} rank"
                          f"{'s' if cards != 1 else ''} per node")


def choose_device(comm, share: bool = False):
    """Select this rank's GPU (``backend.use_device``) and return every rank's
    ``Placement``, in world order; None on NumPy.  COLLECTIVE over ``comm`` (an mpi4py
    communicator or minipar's ``Communicator``): the node split and one gather.  Raises
    ValueError on every rank alike where a node has more ranks than GPUs and not
    ``share``."""
    if backend.backend_name() != "cupy":
        return None
    from mpi4py import MPI
    world = getattr(comm, "mpi", comm)
    node = world.Split_type(MPI.COMM_TYPE_SHARED)
    try:
        local_rank, ranks_on_node = node.Get_rank(), node.Get_size()
        # the node's name: the world rank of its first rank (group arithmetic, no message)
        first = MPI.Group.Translate_ranks(node.Get_group(), [0], world.Get_group())[0]
    finally:
        node.Free()
    devices = backend.device_count()
    if devices < 1:
        raise ValueError("backend cupy sees no GPU (CUDA_VISIBLE_DEVICES hides them all?)")
    device = device_for(local_rank, devices)
    backend.use_device(device)          # before any array: the CUDA context goes here
    mine = Placement(world.Get_rank(), socket.gethostname(), first, local_rank, ranks_on_node,
                     devices, device, backend.device_bus_id(device))
    placements = [Placement(**p) for p in world.allgather(asdict(mine))]   # once, a few bytes
    check_placements(placements, share)
    return placements
