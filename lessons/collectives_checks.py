"""Lesson 04's exercise checks: each runs the learner's function on every rank and
compares it with NumPy and with the textbook's bytes.

    check_ring_shift(comm, fn)            fn(comm, send, recv) against MPI's Sendrecv
    check_ring_reduce_scatter(comm, fn)   each rank's reduced chunk against NumPy's sum
    check_recursive_doubling(comm, fn)    every message checked as it leaves (step,
                                          partner, bytes); the result against NumPy's sum
    textbook_bytes(algorithm, p, S, q)    average bytes sent per rank of an all-reduce
    rank_data(rank, n)                    a rank's test vector (small integers: exact sums)

``lessons/04_collectives.py exercise --file MINE.py --name NAME`` runs them under
mpiexec; they are here so that the lesson's script stays about the lesson.
"""
import importlib.util
import itertools
import math

import numpy as np  # the reference and the data generator run on the host

from minipar.backend import to_device, to_host, xp
from minipar.comm import all_reduce, chunk_bounds
from minipar.comm.chunks import pow2_floor
from minipar.comm.ring import ring_reduce_scatter


def say(comm, *args):
    """Print on rank 0 only (every rank runs this program)."""
    if comm.rank == 0:
        print(*args, flush=True)


def load(path, name):
    """The function ``name`` of the learner's file ``path``."""
    spec = importlib.util.spec_from_file_location("mine", path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return getattr(module, name)


def check_ring_shift(comm, fn):
    """fn(comm, send, recv): send to the right neighbour, receive from the left, with
    blocking send/recv only — compared with MPI's Sendrecv, above the eager limit too."""
    p, r = comm.size, comm.rank
    for n in (16, 1 << 20):
        send = to_device(np.full(n, r, dtype=np.float32))
        mine, ref = to_device(np.zeros(n, np.float32)), to_device(np.zeros(n, np.float32))
        fn(comm, send, mine)
        comm.sendrecv(send, (r + 1) % p, ref, (r - 1) % p)
        assert np.array_equal(to_host(mine), to_host(ref)), \
            f"rank {r}: got {to_host(mine)[:3]}... from the left, expected {to_host(ref)[:3]}..."
        say(comm, f"{4 * n} bytes around a ring of {p}: every rank received its left "
                  "neighbour's buffer, no deadlock")


def check_ring_reduce_scatter(comm, fn):
    """fn(comm, buf): in place; afterwards chunk r (array_split bounds) of rank r is the
    sum over ranks — compared with minipar's ring_reduce_scatter and its traffic."""
    p, r = comm.size, comm.rank
    for n in (10, 1000, 1 << 18):
        data = [np.random.default_rng(k).integers(-50, 50, size=n).astype(np.float32)
                for k in range(p)]
        want = np.sum(data, axis=0)
        lo, hi = chunk_bounds(n, p)[r], chunk_bounds(n, p)[r + 1]
        mine, ref = to_device(data[r].copy()), to_device(data[r].copy())
        comm.reset_counters()
        fn(comm, mine)
        sent_mine = comm.bytes_sent
        comm.reset_counters()
        ring_reduce_scatter(comm, ref, xp.add)
        sent_lib = comm.bytes_sent
        assert np.array_equal(to_host(mine)[lo:hi], want[lo:hi]), \
            f"rank {r}, n={n}: chunk {r} is not the sum over ranks"
        assert np.array_equal(to_host(mine)[lo:hi], to_host(ref)[lo:hi])
        assert sent_mine == sent_lib, f"rank {r}: you sent {sent_mine} bytes, minipar {sent_lib}"
        total = comm.mpi.allreduce(sent_mine)
        say(comm, f"n={n:>6}: chunk r of rank r is the sum on all {p} ranks; bytes sent per rank "
                  f"{total / p:.0f} = (p-1)/p·S = {(p - 1) / p * 4 * n:.0f} (up to uneven chunks)")


def doubling_sends(p, r, S):
    """[(step, partner, bytes)]: the messages rank r sends in recursive doubling over p ranks.

    The first 2·rem ranks (rem = p - p') pair up; the even one sends its buffer to the odd one
    (fold-in) and gets the sum back at the end (fold-out).  The others, renumbered 0..p'-1 in
    rank order, swap buffers in round k with the new rank XOR 2^k."""
    p2 = pow2_floor(p)
    rem = p - p2
    if r < 2 * rem and r % 2 == 0:
        return [("the fold-in", r + 1, S)]
    new = r // 2 if r < 2 * rem else r - rem
    sends = []
    for k in range(p2.bit_length() - 1):
        other = new ^ (1 << k)
        real = 2 * other + 1 if other < rem else other + rem
        sends.append((f"round {k} (new rank {new} XOR {1 << k} = new rank {other})", real, S))
    return sends + ([("the fold-out", r - 1, S)] if r < 2 * rem else [])


class _CheckedComm:
    """The communicator, as the learner's function sees it: every call passes through, and
    each message sent is compared, as it leaves, with the next one the algorithm sends."""

    def __init__(self, comm, expected, where):
        self._comm, self.expected, self.where, self.sent = comm, expected, where, 0

    def __getattr__(self, name):
        return getattr(self._comm, name)

    def _check(self, dest, nbytes):
        if self.sent == len(self.expected):
            step = self.expected[-1][0] if self.expected else "the start"
            raise AssertionError(f"{self.where}: after {step}, sent {nbytes} more bytes to rank "
                                 f"{dest}; that step was this rank's last message")
        step, partner, want = self.expected[self.sent]
        assert (dest, nbytes) == (partner, want), \
            f"{self.where}: {step}: sent {nbytes} bytes to rank {dest}; expected {want} bytes to rank {partner}"
        self.sent += 1

    def send(self, buf, dest, tag=0):
        self._check(dest, buf.nbytes)
        return self._comm.send(buf, dest, tag)

    def isend(self, buf, dest, tag=0):
        self._check(dest, buf.nbytes)
        return self._comm.isend(buf, dest, tag)

    def sendrecv(self, sendbuf, dest, recvbuf, source, tag=0):
        self._check(dest, sendbuf.nbytes)
        return self._comm.sendrecv(sendbuf, dest, recvbuf, source, tag)


def check_recursive_doubling(comm, fn):
    """fn(comm, buf): in place, afterwards buf is the sum over ranks on every rank — each
    message checked against the textbook schedule as it is sent, the result against NumPy,
    the bytes against the textbook volume."""
    p, r = comm.size, comm.rank
    for n in (1001, 1, 0, 1 << 18):
        data = [rank_data(k, n) for k in range(p)]
        want, S = np.sum(data, axis=0), 4 * n
        where = f"n = {n} float32 (S = {S} bytes), p = {p} (p' = {pow2_floor(p)})"
        mine, ref = to_device(data[r].copy()), to_device(data[r].copy())
        checked = _CheckedComm(comm, doubling_sends(p, r, S), where)
        comm.reset_counters()
        try:
            fn(checked, mine)
        except NotImplementedError as err:
            hint = f" (your function raised NotImplementedError: {err})"
        else:
            hint = ""
        sent = comm.bytes_sent
        if checked.sent < len(checked.expected) and S > 0:
            step, partner, nbytes = checked.expected[checked.sent]
            raise AssertionError(f"{where}: {step}: sent nothing; expected {nbytes} bytes to rank "
                                 f"{partner}{hint}")
        got = to_host(mine)
        if not np.array_equal(got, want):
            held = [ks for m in range(1, p + 1) for ks in itertools.combinations(range(p), m)
                    if np.array_equal(got, np.sum([data[k] for k in ks], axis=0))]
            what = f"the sum of ranks {list(held[0])} only" if held else "not a sum of ranks' inputs"
            raise AssertionError(f"{where}: the result is {what}, not the sum over all {p} ranks{hint}")
        comm.reset_counters()
        all_reduce(comm, ref, algorithm="recursive_doubling")
        assert comm.bytes_sent == sent, f"{where}: you sent {sent} bytes, minipar {comm.bytes_sent}"
        per_rank = comm.mpi.allgather(sent)
        textbook = textbook_bytes("recursive_doubling", p, S, 1)
        assert abs(sum(per_rank) / p - textbook) < 1e-6 * S + 1e-9, \
            f"{where}: the ranks sent {per_rank} bytes, on average not the textbook {textbook:.0f}"
        say(comm, f"n={n:>6}: the sum on all {p} ranks; bytes sent per rank {per_rank}, average "
                  f"{sum(per_rank) / p:.0f} = (p'·log2 p'·S + 2(p-p')·S)/p = {textbook:.0f}")


EXERCISES = {"ring_shift": check_ring_shift, "ring_reduce_scatter": check_ring_reduce_scatter,
             "recursive_doubling": check_recursive_doubling}




def textbook_bytes(algorithm, p, S, q):
    """Average bytes sent per rank for an all-reduce of S bytes over p ranks."""
    if p == 1:
        return 0.0
    p2, rem = pow2_floor(p), p - pow2_floor(p)
    if algorithm == "ring":
        return 2 * (p - 1) / p * S
    if algorithm == "recursive_doubling":
        return (p2 * math.log2(p2) * S + 2 * rem * S) / p
    if algorithm == "rabenseifner":
        return (2 * (p2 - 1) * S + 2 * rem * S) / p
    if algorithm == "tree":
        return 2 * (p - 1) * S / p
    if algorithm.startswith("hierarchical"):
        m = p // q
        return 2 * (q - 1) / q * S + 2 * (m - 1) / m * S / q
    raise ValueError(algorithm)


def rank_data(rank, n):
    return np.random.default_rng(rank).integers(-50, 50, size=n).astype(np.float32)
