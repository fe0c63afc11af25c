"""The communicator users hold: the p2p transport plus ``barrier()``.

    comm = Communicator()                  # MPI.COMM_WORLD; or Communicator(mpi_comm, ...)
    comm.rank, comm.size, comm.split(color, key), comm.sendrecv(...), comm.barrier()

``Communicator`` is ``transport.Transport`` (rank/size, ``split``, buffer-based p2p,
traffic counters, check mode, hang timeout: the same constructor) with the one
collective MPI's communicators offer as a method.  ``barrier()`` is the dissemination
barrier of ``collectives.barrier`` — agreed on in check mode, watched under a hang
timeout — so the class is assembled here, above the collectives: the transport below
them imports none of them.  The splits and contexts of a ``Communicator`` are
Communicators too (``Transport._like`` builds its own class).
"""
from __future__ import annotations

from minipar.comm.collectives import barrier
from minipar.comm.transport import Transport


class Communicator(Transport):
    """rank/size, ``split``, buffer-based p2p, traffic counters and ``barrier()`` over an
    MPI communicator."""

    def barrier(self):
        """Dissemination barrier on zero-byte messages (``collectives.barrier``)."""
        barrier(self)
