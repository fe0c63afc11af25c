"""Collectives written by hand over MPI point-to-point messages.

Exported:

- ``Communicator(mpi_comm=None, *, check=None, cuda_aware=None, transport=None,
  ranks_per_node=None, hang_timeout=None)`` — rank, size, ``split(color, key)``, buffer-based
  ``send/recv/sendrecv/isend/irecv/wait/waitall`` (the transport) and ``barrier()``,
  counters ``bytes_sent, bytes_recv, msgs_sent, msgs_recv`` and ``reset_counters()``.
- errors: ``CollectiveArgumentError`` (a ValueError: a bad argument on some rank — in
  check mode, ``MINIPAR_COMM_CHECK=1``, raised on every rank) and
  ``CollectiveMismatchError`` (check mode: ranks disagree).
- ``set_hang_timeout(seconds, on_hang=None)`` / ``get_hang_timeout()``: a rank that
  waits on a peer longer than that ends the job, naming itself, the call and the peer
  (also ``Communicator(hang_timeout=S)`` or ``MINIPAR_HANG_TIMEOUT=S``; default off).
- collectives: ``all_reduce(comm, array, op="sum", algorithm="auto", out=None)``,
  ``reduce_scatter(comm, array, op="sum", out=None, inplace=False)``,
  ``all_gather(comm, shard, sizes=None, out=None)``,
  ``broadcast(comm, array, root=0, algorithm="auto")``,
  ``reduce(comm, array, root=0, op="sum", out=None, algorithm="auto")``, ``barrier(comm)``,
  ``all_to_all(comm, send, counts, out=None, algorithm="auto") -> (received, recv_counts)``
  (all-to-all-v: rows grouped by destination in, by source out; counts exchanged first).
  All-reduce algorithms: ``ALL_REDUCE_ALGORITHMS`` = ring, recursive_doubling,
  rabenseifner, tree, hierarchical (plus "auto", by the cost model); all-to-all:
  ``ALL_TO_ALL_ALGORITHMS`` = pairwise, two_level (plus "auto").
- non-blocking: ``all_reduce_async``, ``reduce_scatter_async``, ``all_gather_async``,
  ``broadcast_async``, ``reduce_async``, ``all_to_all_async`` -> ``Handle`` with
  ``wait()`` / ``test()``.
- ``chunk_bounds(n, p)`` / ``chunk_sizes(n, p)``: the array_split chunking rule.
- ``abort_on_exception()``: an uncaught exception on any rank aborts the job.
- ``cost_model``: ``predict``, ``predict_all_to_all``, ``choose``, ``use``, ``params`` (its ``CostParams`` in
  ``cost_params.py``; measured by ``perf/calibrate_links.py``).

The modules, in layers, lowest first: each imports only from the layers before it
(``tests/test_imports.py`` checks that the files form a DAG).

    helpers       counters, watchdog (hang timeout), checks (local argument checks),
                  chunks (the array_split rule, pipeline segments), nodes, abort,
                  cost_params (the model's constants)
    transport     p2p on contiguous arrays, contexts, counters  (``Transport``); how a
                  device array travels: cuda_aware (asks MPI), device_paths (pageable,
                  cuda-aware, ``auto``), staging (pinned, chunked, side streams), nccl_path
    exchange      pipelined send/receive/reduce;  agree (check mode's descriptor exchange)
    cost model    two_level (steps priced by the link they cross), cost_model (α-β-γ,
                  ``choose``): arithmetic only, no messages
    algorithms    ring, doubling (recursive doubling, Rabenseifner), tree (binomial),
                  hierarchical;  algorithms (the all-reduce registry, ``auto``);
                  alltoall (pairwise exchange, two-level, its ``auto``)
    collectives   the API above
    on top        nonblocking (progress thread), stepwise (a ring the caller advances),
                  communicator (``Communicator``: the transport plus ``barrier()``)

``bench`` (``python -m minipar bench comm``; ``--check-overhead`` measures check mode's
cost per call) is a command on top of all of them and of ``perf``'s calibration.
"""
from minipar.comm import cost_model
from minipar.comm.abort import abort_on_exception
from minipar.comm.chunks import chunk_bounds, chunk_sizes
from minipar.comm.collectives import (ALL_REDUCE_ALGORITHMS, ALL_TO_ALL_ALGORITHMS, all_gather,
                                      all_reduce, all_to_all, barrier, broadcast, reduce,
                                      reduce_scatter)
from minipar.comm.communicator import Communicator
from minipar.comm.nonblocking import (Handle, all_gather_async, all_reduce_async,
                                      all_to_all_async, broadcast_async, reduce_async,
                                      reduce_scatter_async)
from minipar.comm.transport import CollectiveArgumentError, CollectiveMismatchError
from minipar.comm.watchdog import get_hang_timeout, set_hang_timeout

__all__ = [
    "Communicator", "CollectiveMismatchError", "CollectiveArgumentError", "abort_on_exception",
    "cost_model", "set_hang_timeout", "get_hang_timeout",
    "all_reduce", "reduce_scatter", "all_gather", "broadcast", "reduce", "barrier",
    "all_to_all", "ALL_REDUCE_ALGORITHMS", "ALL_TO_ALL_ALGORITHMS", "chunk_bounds", "chunk_sizes",
    "Handle", "all_reduce_async", "reduce_scatter_async", "all_gather_async",
    "broadcast_async", "reduce_async", "all_to_all_async",
]
