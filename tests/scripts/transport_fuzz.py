"""The collectives' fuzz (``comm_correctness.py``) on device arrays, through the transport
``$MINIPAR_TRANSPORT`` names, on the fake CuPy of ``tests/fake_cupy``.

Every collective the fuzz calls is wrapped: its NumPy arguments go to the device, the call
runs on device arrays (so every message goes through the transport's device path), and
what the device arrays hold afterwards is copied back into the NumPy ones, which the fuzz
then checks against NumPy as it always does.  A transport that loses, reorders or
delivers stale bytes fails a check (the job aborts naming the case).

Then one rank's counters are compared with the pageable path's for the same collectives
(``--counters``): every transport must count the same bytes and messages.
Prints "transport fuzz OK <transport> 1 counter check, <k> NCCL calls" on rank 0.
"""
import argparse
import os
import sys

import numpy as np

from mpi4py import MPI

from minipar.backend import device_count, set_backend, to_device, use_device, xp

set_backend("cupy")
use_device(MPI.COMM_WORLD.Get_rank() % device_count())   # a GPU per rank, as NCCL wants

from tests.scripts import comm_correctness as fuzz  # noqa: E402  (after the backend)

from minipar.comm import Communicator, abort_on_exception, all_reduce  # noqa: E402

WRAPPED = ("all_reduce", "reduce_scatter", "all_gather", "broadcast", "reduce")


def on_device(collective):
    """``collective`` run on device twins of its NumPy arguments, results brought back."""
    def call(comm, *args, **kwargs):
        twins = {}

        def down(a):
            if isinstance(a, np.ndarray):
                twins[id(a)] = (a, to_device(a))
                return twins[id(a)][1]
            return a
        kwargs = {k: v if k == "sizes" else down(v) for k, v in kwargs.items()}  # sizes: host
        result = collective(comm, *map(down, args), **kwargs)
        for host, device in twins.values():
            host[...] = device.get()
        for host, device in twins.values():
            if result is device:
                return host
        return result.get() if result is not None and not isinstance(result, np.ndarray) \
            else result
    return call


def counters_match(transport_name):
    """The same all-reduces on a pageable and on a ``transport_name`` communicator:
    the counters must agree exactly."""
    totals = {}
    for name in ("pageable", transport_name):
        comm = Communicator(transport=name)
        for n in (0, 1, 1000, 70_000):   # 70 000 float64: 560 kB, many chunks
            x = xp.ones(n)
            for alg in ("ring", "recursive_doubling", "tree"):
                all_reduce(comm, x, algorithm=alg)
        totals[name] = (comm.bytes_sent, comm.bytes_recv, comm.msgs_sent, comm.msgs_recv)
    if totals["pageable"] != totals[transport_name]:
        raise AssertionError(f"rank {comm.rank}: counters (bytes sent, received, messages sent, "
                             f"received) {transport_name} {totals[transport_name]} != pageable "
                             f"{totals['pageable']}")
    return 1


def main(argv=None):
    ap = argparse.ArgumentParser()
    ap.add_argument("--big", type=int, default=0)
    ap.add_argument("--sections", default="all_reduce,others,split,hier")
    ap.add_argument("--quick", action="store_true", help="three all-reduce algorithms and the "
                    "other collectives on a few sizes, instead of the fuzz's sections")
    args = ap.parse_args(argv)
    abort_on_exception()
    for name in WRAPPED:
        setattr(fuzz, name, on_device(getattr(fuzz, name)))
    transport = os.environ.get("MINIPAR_TRANSPORT", "auto")
    world = Communicator(check=True)
    if world.transport != transport and transport != "auto":
        raise AssertionError(f"asked for {transport}, got {world.transport}")
    if args.quick:
        p = world.size
        fuzz.check_all_reduce(world, [1, p + 1, 1031], args.big, ("ring", "recursive_doubling",
                                                                   "tree"), full_sizes=(p + 1,))
        fuzz.check_others(world, [p + 1, 31])
    else:
        fuzz.main(["--lite", "--sections", args.sections] + (["--big", str(args.big)] if args.big else []))
    n = counters_match(world.transport)
    import cupy
    carried = cupy.cuda.nccl.issued[0]   # the fake NCCL's send/recv calls
    if world.rank == 0:
        print(f"transport fuzz OK {world.transport} {n} counter check, {carried} NCCL calls")
    sys.stdout.flush()


if __name__ == "__main__":
    main()
