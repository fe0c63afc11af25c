"""A cluster on one machine: nodes as network namespaces, a shaped link between them.

On a laptop every rank shares memory, so the two kinds of links a real cluster has — fast
inside a node (NVLink, shared memory), slow between nodes (a network card) — cannot be
seen.  Linux gives each *network namespace* its own interfaces and addresses; a veth pair
joins each one to a bridge, and ``tc``'s token-bucket filter caps the rate of every byte
that leaves a node.  MPI's launcher starts each node's ranks inside its namespace through
a small ssh stand-in (``wrapper``), so

    inside a node     ranks that share a namespace: MPI's shared-memory path, unshaped
    between nodes     TCP over the veth, through the bridge, at the shaped rate (tbf)

Nothing in the training code knows the cluster is simulated: MPI's node detection
(``Split_type(COMM_TYPE_SHARED)``) sees the launcher's hosts, and bytes between nodes
really cross a wire (its counters prove it).  The kernel here has tbf but no netem, so
bandwidth can be shaped and added latency cannot.

    topology.py   ClusterSpec: nodes, ranks per node, the link's rate, every name and address
    netns.py      up / down / status with ``ip`` and ``tc``; everything carries one prefix
    launch.py     the mpiexec command that places ranks on the nodes
    cli.py        python -m minipar cluster up | down | status | run -- CMD
"""
from minipar.cluster.topology import ClusterError, ClusterSpec  # noqa: F401
