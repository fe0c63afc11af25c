"""Fake-only: ``cupy.cuda.nccl``'s point-to-point calls, carried by MPI between the ranks.

Enough of NCCL for minipar's algorithms to run through it on a CPU: ``get_unique_id``,
``NcclCommunicator(ndev, uid, rank)`` with ``send``/``recv`` (queued on a stream, here run
at once: the fake's null stream), ``groupStart``/``groupEnd`` (the calls between them are
issued together, so a ring's send-then-receive does not deadlock), ``allReduce`` (the
baseline), ``get_version``.  As NCCL: messages between two ranks match in the order they
were posted (no tags), and two ranks on one GPU are refused at ``NcclCommunicator``
(the fake GPUs' bus ids, ``MINIPAR_FAKE_CUPY_DEVICES``, compared per host).

Each communicator's traffic goes over ``MPI.COMM_WORLD`` with a tag of its own, from
the uid (its creator's world rank and serial number), far above the tags minipar uses.
"""
import ctypes
import itertools
import socket

import numpy

NCCL_INT8, NCCL_UINT8, NCCL_INT32, NCCL_UINT32, NCCL_INT64, NCCL_UINT64 = 0, 1, 2, 3, 4, 5
NCCL_FLOAT16, NCCL_FLOAT32, NCCL_FLOAT64 = 6, 7, 8
NCCL_SUM = 0
_DTYPES = {NCCL_INT8: numpy.int8, NCCL_UINT8: numpy.uint8, NCCL_INT32: numpy.int32,
           NCCL_UINT32: numpy.uint32, NCCL_INT64: numpy.int64, NCCL_UINT64: numpy.uint64,
           NCCL_FLOAT16: numpy.float16, NCCL_FLOAT32: numpy.float32, NCCL_FLOAT64: numpy.float64}
_serial = itertools.count()
_group = []        # calls noted between groupStart and groupEnd
_depth = [0]
issued = [0]       # send/recv calls carried, for a test to see NCCL was used


class NcclError(RuntimeError):
    pass


def get_version():
    return 22305   # fake: as NCCL 2.23.5


def _world():
    return _mpi().COMM_WORLD


def get_unique_id():
    return (_world().Get_rank(), next(_serial))


def _memory(ptr, nbytes):
    if nbytes == 0:
        return numpy.empty(0, numpy.uint8)
    return numpy.ctypeslib.as_array((ctypes.c_uint8 * nbytes).from_address(ptr))


class NcclCommunicator:
    def __init__(self, ndev, commId, rank):
        import cupy
        world = _world()
        creator, serial = commId
        self.tag = 1_000_000 + (creator * 4096 + serial) % 1_000_000
        me = (world.Get_rank(), socket.gethostname(), cupy.cuda.Device().pci_bus_id)
        if rank == 0:
            table = [me] + [None] * (ndev - 1)
            for _ in range(ndev - 1):
                r, info = world.recv(source=_mpi().ANY_SOURCE, tag=self.tag)
                table[r] = info
            gpus = [(host, bus) for _, host, bus in table]
            for r in range(1, ndev):
                world.send(table, dest=table[r][0], tag=self.tag)
        else:
            world.send((rank, me), dest=creator, tag=self.tag)
            table = world.recv(source=creator, tag=self.tag)
            gpus = [(host, bus) for _, host, bus in table]
        if len(set(gpus)) < len(gpus):
            raise NcclError("ncclInvalidUsage: Duplicate GPU detected: two ranks of one "
                            "communicator on the same device")
        self.world_rank = [w for w, _, _ in table]
        self.rank_id, self.size = rank, ndev

    def _call(self, call):
        if _depth[0]:
            _group.append((self, call))
        else:
            _issue([(self, call)])

    def send(self, sendbuf, count, datatype, peer, stream):
        nbytes = count * numpy.dtype(_DTYPES[datatype]).itemsize
        self._call(("send", _memory(sendbuf, nbytes), peer))

    def recv(self, recvbuf, count, datatype, peer, stream):
        nbytes = count * numpy.dtype(_DTYPES[datatype]).itemsize
        self._call(("recv", _memory(recvbuf, nbytes), peer))

    def allReduce(self, sendbuf, recvbuf, count, datatype, op, stream):
        """Sum over the ranks (every rank sends its buffer to every other, adds in rank order)."""
        if op != NCCL_SUM:
            raise NcclError("fake nccl: only NCCL_SUM is modelled")
        dtype = _DTYPES[datatype]
        mine = _memory(sendbuf, count * numpy.dtype(dtype).itemsize).view(dtype).copy()
        theirs = {r: numpy.empty(count, dtype) for r in range(self.size) if r != self.rank_id}
        calls = [(self, ("send", mine.view(numpy.uint8), r)) for r in theirs]
        calls += [(self, ("recv", theirs[r].view(numpy.uint8), r)) for r in theirs]
        _issue(calls)
        total = sum((theirs.get(r, mine) for r in range(self.size)), numpy.zeros(count, dtype))
        _memory(recvbuf, total.nbytes)[...] = total.view(numpy.uint8)

    def destroy(self):
        pass


def _issue(calls):
    issued[0] += len(calls)
    world, reqs = _world(), []
    for comm, (kind, memory, peer) in calls:
        post = world.Isend if kind == "send" else world.Irecv
        reqs.append(post([memory, _mpi().BYTE], comm.world_rank[peer], comm.tag))
    _mpi().Request.Waitall(reqs)


def _mpi():
    from mpi4py import MPI
    return MPI


def groupStart():
    _depth[0] += 1


def groupEnd():
    _depth[0] -= 1
    if _depth[0] == 0 and _group:
        calls = list(_group)
        _group.clear()
        _issue(calls)
