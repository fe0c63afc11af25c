"""all_to_all under mpiexec: against NumPy, its traffic, its misuse, its watchdog report.

    comm_alltoall.py fuzz [--full] [--big ROWS]   every rank checks its rows against NumPy
    comm_alltoall.py traffic                      the counters against the formulas
    comm_alltoall.py misuse                       rank 0 prints one JSON line of outcomes
    comm_alltoall.py watchdog                     a late rank is named, with the call

Every rank can compute every rank's send buffer and counts (seeded by case and rank), so
each checks its result alone.  Counts patterns: all empty, one row each, uneven, a rank
that receives nothing from anyone, a rank that sends nothing, only rows for oneself.
Groups: the whole world, pretend nodes of 1, 2 and 3 ranks (two_level runs its two phases
where there are several nodes of equal size, the pairwise exchange otherwise), nodes
placed round-robin (rank r on node r mod m, as a cyclic launcher would: the node table
is injected, since one machine's ranks share one MPI node), and a sub-communicator.
"""
import json
import sys
import time

import numpy as np

from minipar.comm import (Communicator, abort_on_exception, all_to_all, all_to_all_async,
                          alltoall, set_hang_timeout, two_level)
from minipar.comm.hierarchical import node_layout
from minipar.comm.transport import Transport

DTYPES = [np.float16, np.float32, np.float64, np.int32, np.int64, np.bool_]
ROW_SHAPES = [(), (1,), (3,), (2, 4)]           # () is a 1-D send: width 1
OUTS = ["none", "contig", "strided"]
ALGORITHMS = ["pairwise", "two_level", "auto"]


def counts_matrix(pattern, p, seed):
    """M[s][d]: the rows rank s sends rank d."""
    rng = np.random.default_rng([seed, p])
    if pattern == "empty":
        return np.zeros((p, p), np.int64)
    if pattern == "ones":
        return np.ones((p, p), np.int64)
    if pattern == "self only":
        return np.diag(rng.integers(1, 5, size=p))
    m = rng.integers(0, 7, size=(p, p))
    if pattern == "silent receiver":                     # nobody sends rank p-1 a row
        m[:, p - 1] = 0
    elif pattern == "silent sender":                     # rank p // 2 sends nothing
        m[p // 2, :] = 0
    return m


PATTERNS = ["empty", "ones", "uneven", "silent receiver", "silent sender", "self only"]


def send_of(rank, rows, row_shape, dtype, seed):
    rng = np.random.default_rng([seed, rank, 7])
    if np.dtype(dtype).kind == "b":
        return rng.integers(0, 2, size=(rows,) + row_shape).astype(dtype)
    return rng.integers(-50, 51, size=(rows,) + row_shape).astype(dtype)


def expected(matrix, rank, row_shape, dtype, seed):
    parts = []
    for s in range(len(matrix)):
        rows = send_of(s, int(matrix[s].sum()), row_shape, dtype, seed)
        lo = int(matrix[s, :rank].sum())
        parts.append(rows[lo:lo + int(matrix[s, rank])])
    return np.concatenate(parts)


def strided_rows(rows, row_shape, dtype, strided):
    """An array of ``rows`` rows; strided: every other row of a twice-as-tall one."""
    if not strided:
        return np.empty((rows,) + row_shape, dtype)
    return np.zeros((2 * rows,) + row_shape, dtype)[::2]


def run_case(comm, case, seed):
    """One all_to_all; raises with the case on a wrong result."""
    p, r = comm.size, comm.rank
    matrix = counts_matrix(case["pattern"], p, seed)
    if "scale" in case:
        matrix = matrix * case["scale"]
    row_shape, dtype = case["row"], case["dtype"]
    data = send_of(r, int(matrix[r].sum()), row_shape, dtype, seed)
    send = data
    if case.get("strided_send"):
        send = strided_rows(data.shape[0], row_shape, dtype, True)
        send[...] = data
    want = expected(matrix, r, row_shape, dtype, seed)
    out = None if case["out"] == "none" else strided_rows(want.shape[0], row_shape, dtype,
                                                          case["out"] == "strided")
    counts = matrix[r].tolist() if seed % 2 else matrix[r]       # a list, or an int array
    if case.get("async"):
        got, recv_counts = all_to_all_async(comm, send, counts, out=out,
                                            algorithm=case["alg"]).wait(timeout=60)
    else:
        got, recv_counts = all_to_all(comm, send, counts, out=out, algorithm=case["alg"])
    if out is not None and got is not out:
        raise AssertionError(f"case {case}: the result is not out")
    if (got.shape != want.shape or got.dtype != want.dtype or not np.array_equal(got, want)
            or recv_counts != matrix[:, r].tolist()):
        raise AssertionError(f"case {case} seed {seed} rank {r}: got {got.ravel()[:8]} "
                             f"{got.dtype}{got.shape} counts {recv_counts}, want "
                             f"{want.ravel()[:8]} {want.dtype}{want.shape} counts "
                             f"{matrix[:, r].tolist()}")
    if not np.array_equal(send, data):
        raise AssertionError(f"case {case}: send was changed")


def round_robin(comm, m):
    """A communicator whose nodes are placed round-robin (rank r on node r mod m): the
    node table ``alltoall.node_table`` would build from MPI's nodes, injected."""
    q = comm.size // m
    rr = Communicator(comm.mpi, check=True, ranks_per_node=q)
    ctx = rr.context("coll")
    local = ctx.split(ctx.rank % m, ctx.rank, share_counters=True)
    cross = ctx.split(local.rank, ctx.rank % m, share_counters=True)
    nodes = [[a + m * j for j in range(q)] for a in range(m)]
    ctx.cache["all_to_all nodes", q] = (local, cross, nodes)
    return rr


def groups(world, p):
    """(name, communicator) pairs this launch runs on."""
    out = [("world", world)]
    for q in (1, 2, 3):
        if q < p:
            out.append((f"nodes of {q}", Communicator(check=True, ranks_per_node=q)))
    if p >= 4 and p % 2 == 0:
        out.append(("round-robin nodes", round_robin(world, 2)))
    if p >= 3:
        out.append(("split", world.split(world.rank % 2, key=-world.rank)))
    return out


def fuzz(world, full, big):
    """The case matrix: every (group, algorithm, pattern) with a rotating dtype, row shape
    and out; every dtype x row shape x out on the uneven pattern; async and strided sends."""
    p, n = world.size, 0
    combos = [(d, s, o) for d in DTYPES for s in ROW_SHAPES for o in OUTS]
    seed = 0
    for name, comm in groups(world, p):
        for alg in ALGORITHMS:
            for i, pattern in enumerate(PATTERNS):
                every = full or (pattern == "uneven" and name == "world") or (
                    pattern == "uneven" and alg == "two_level")
                chosen = combos if every else [combos[(7 * i + 5 * len(name)) % len(combos)],
                                               combos[(7 * i + 13) % len(combos)]]
                for k, (dtype, row, out) in enumerate(chosen):
                    seed += 1
                    run_case(comm, dict(pattern=pattern, alg=alg, dtype=dtype, row=row,
                                        out=out, strided_send=k % 5 == 0,
                                        **{"async": k % 7 == 3}), seed)
                    n += 1
        if big and name != "split":         # blocks past 1 MiB: cut in segments across nodes
            for alg in ALGORITHMS:
                seed += 1
                run_case(comm, dict(pattern="uneven", alg=alg, dtype=np.float32, row=(64,),
                                    out="none", scale=big), seed)
                n += 1
    total = world.mpi.allreduce(n)
    if world.rank == 0:
        print(f"OK {total // p} cases on {p} ranks")


def traffic(world):
    """Bytes sent and received against the formulas, on every rank."""
    p, r = world.size, world.rank
    row_shape, dtype = (5,), np.float64
    w = 5 * 8
    checked = 0
    for seed, pattern in enumerate(PATTERNS):
        matrix = counts_matrix(pattern, p, seed)
        send = send_of(r, int(matrix[r].sum()), row_shape, dtype, seed)
        for alg in ("pairwise", "auto"):       # auto on one node is the pairwise exchange
            world.reset_counters()
            all_to_all(world, send, matrix[r], algorithm=alg)
            want_sent = sum(int(matrix[r, d]) for d in range(p) if d != r) * w
            want_recv = sum(int(matrix[s, r]) for s in range(p) if s != r) * w
            messages = sum(1 for d in range(p) if d != r and matrix[r, d])
            assert world.bytes_sent == want_sent, (pattern, alg, world.bytes_sent, want_sent)
            assert world.bytes_recv == want_recv, (pattern, alg, world.bytes_recv, want_recv)
            assert world.msgs_sent == messages, (pattern, alg, world.msgs_sent, messages)
            checked += 1
        for q in (2, 3):
            if not 1 < q < p or p % q:
                continue
            nodes = Communicator(check=True, ranks_per_node=q)
            nodes.reset_counters()
            all_to_all(nodes, send, matrix[r], algorithm="two_level")
            # every rank: the bytes of its steps in the cost model
            steps = two_level.all_to_all_steps("two_level", (matrix * w).tolist(), q)
            want = sum(n for msgs, _ in steps for src, _, n in msgs if src == r)
            assert nodes.bytes_sent == want, (pattern, q, nodes.bytes_sent, want)
            # every node: what leaves it crosses its link once, all of it
            _, cross, _, _ = node_layout(nodes.context("coll"))
            across = world.mpi.allgather(cross.bytes_sent)
            for a in range(p // q):
                ranks = range(a * q, (a + 1) * q)
                leaving = sum(int(matrix[s, d]) for s in ranks for d in range(p) if d // q != a)
                assert sum(across[s] for s in ranks) == leaving * w, (pattern, q, a, across)
            checked += 1
    if p > 2:   # across (pretend) nodes a block past 1 MiB goes as 1 MiB segments
        nodes = Communicator(check=True, ranks_per_node=2)
        big = [40 if d == (r + 1) % p else 10 for d in range(p)]  # rows of 32 KiB: 1.25 MiB
        rows = np.zeros((sum(big), 1 << 15), np.uint8)            # to the next rank, 320 KiB
        nodes.reset_counters()                                    # to the others
        all_to_all(nodes, rows, big, algorithm="pairwise")
        assert nodes.msgs_sent == (p - 2) + 2, nodes.msgs_sent   # the 1.25 MiB in two
        checked += 1
    total = world.mpi.allreduce(checked)
    if r == 0:
        print(f"traffic OK on {p} ranks ({total // p} cases)")


# ---------------------------------------------------------------------------- misuse
class Messages:
    """Counts the p2p calls of every communicator (metadata included), to show that a
    refused call sent nothing."""

    calls = 0

    @classmethod
    def install(cls):
        for name in ("send", "recv", "sendrecv", "isend", "irecv"):
            original = getattr(Transport, name)

            def counted(self, *args, _original=original, **kwargs):
                cls.calls += 1
                return _original(self, *args, **kwargs)
            setattr(Transport, name, counted)


def misuse_cases(p, r):
    """name -> (fn(comm), wrong alike on every rank: also run with check mode off?)."""
    odd = r == 1
    rows = np.ones((p, 2), np.float32)
    ones = [1] * p
    frozen = np.ones((p, 2), np.float32)
    frozen.flags.writeable = False
    return {
        "width differs, one rank": (
            lambda c: all_to_all(c, np.ones((p, 3 if odd else 2), np.float32), ones), False),
        "dtype differs, one rank": (
            lambda c: all_to_all(c, rows.astype(np.float64) if odd else rows, ones), False),
        "algorithm differs, one rank": (
            lambda c: all_to_all(c, rows, ones, algorithm="two_level" if odd else "pairwise"),
            False),
        "counts too short, one rank": (lambda c: all_to_all(c, rows, ones[:-1] if odd else ones),
                                       False),
        "counts negative, one rank": (
            lambda c: all_to_all(c, rows, [2, -1] + [1] * (p - 2) if odd else ones), False),
        "counts do not add up, one rank": (
            lambda c: all_to_all(c, rows, [2] + [1] * (p - 1) if odd else ones), False),
        "counts not integers, one rank": (
            lambda c: all_to_all(c, rows, [1.0] * p if odd else ones), False),
        "async counts do not add up, one rank": (
            lambda c: all_to_all_async(c, rows, [0] * p if odd else ones).wait(timeout=60),
            False),
        "out rows wrong, one rank": (
            lambda c: all_to_all(c, rows, ones, out=np.empty((p + 2 if odd else p, 2), np.float32)),
            True),      # the counts exchange checks every rank's out on every rank
        "row size differs, one rank (no agreement)": (
            lambda c: all_to_all(c, np.ones((p, 3 if odd else 2), np.float32), ones), True),
        "counts too long": (lambda c: all_to_all(c, rows, ones + [0]), True),
        "counts not a sequence": (lambda c: all_to_all(c, rows, p), True),
        "send 0-d": (lambda c: all_to_all(c, np.float32(1), ones), True),
        "send object": (lambda c: all_to_all(c, np.array([None] * p, dtype=object), ones), True),
        "out dtype": (lambda c: all_to_all(c, rows, ones, out=np.empty((p, 2), np.float64)), True),
        "out width": (lambda c: all_to_all(c, rows, ones, out=np.empty((p, 3), np.float32)), True),
        "out read-only": (lambda c: all_to_all(c, rows, ones, out=frozen), True),
        "unknown algorithm": (lambda c: all_to_all(c, rows, ones, algorithm="bruck"), True),
    }


def outcome(fn, comm):
    """[error type, message, p2p calls made (metadata too), data messages sent]."""
    calls, data = Messages.calls, comm.msgs_sent
    try:
        fn(comm)
    except Exception as err:  # recorded, not raised: the table is the test
        return [type(err).__name__, str(err), Messages.calls - calls, comm.msgs_sent - data]
    return ["no error", "", Messages.calls - calls, comm.msgs_sent - data]


def misuse(world):
    Messages.install()
    check = world if world.check else Communicator(check=True)
    nocheck = Communicator(check=False)
    p, r = world.size, world.rank
    results = {}
    for name, (fn, everywhere) in misuse_cases(p, r).items():
        res = {"check": outcome(fn, check)}
        if everywhere:
            res["nocheck"] = outcome(fn, nocheck)
        got, _ = all_to_all(check, np.ones((p, 2)), [1] * p)   # still works after the error
        assert got.shape == (p, 2)
        res = world.mpi.gather(res, root=0)
        if r == 0:
            results[name] = {k: [rank_res[k] for rank_res in res] for k in res[0]}
    if r == 0:
        print(json.dumps(results))


# ---------------------------------------------------------------------------- watchdog
def watchdog(world):
    """Rank 0 is late, first for the whole call (its peers wait in the counts exchange),
    then inside the pairwise exchange; every other rank's watchdog reports the wait."""
    reports = []
    set_hang_timeout(0.5, on_hang=reports.append)
    comm = Communicator(world.mpi, check=False)
    rows = np.ones((comm.size, 2), np.float32)
    all_to_all(comm, rows, [1] * comm.size)                        # contexts set up
    if comm.rank == 0:
        time.sleep(2.5)
    all_to_all(comm, rows, [1] * comm.size, algorithm="pairwise")
    if comm.rank == 0:          # late for its first message of the rows
        swap, swaps = alltoall._swap, []

        def late_swap(*args):
            if not swaps:
                time.sleep(2.5)
            swaps.append(args)
            return swap(*args)
        alltoall._swap = late_swap
    all_to_all(comm, rows, [1] * comm.size, algorithm="pairwise")
    set_hang_timeout(None)
    every = world.mpi.gather(reports, root=0)
    if comm.rank == 0:
        print(json.dumps(every))


def main():
    abort_on_exception()
    world = Communicator(check=True)
    section = sys.argv[1]
    if section == "fuzz":
        big = int(sys.argv[sys.argv.index("--big") + 1]) if "--big" in sys.argv else 0
        fuzz(world, "--full" in sys.argv, big)
    elif section == "traffic":
        traffic(world)
    elif section == "misuse":
        misuse(world)
    elif section == "watchdog":
        watchdog(world)
    sys.stdout.flush()


if __name__ == "__main__":
    main()
