"""Hang timeout: a rank that waits on a peer longer than S seconds ends the job, naming
who waited for whom.

    minipar.comm.set_hang_timeout(20.0)          # every communicator of this process
    Communicator(..., hang_timeout=20.0)         # or one (its contexts and splits inherit it)
    MINIPAR_HANG_TIMEOUT=20 mpiexec ...          # or from the environment

Default: off (None).  When a wait on a peer lasts longer than S, the waiting rank prints

    rank 1: all_reduce (ring) waited 20.0 s for rank 0; ending the job (hang timeout 20 s)

to stderr and calls ``MPI.COMM_WORLD.Abort(1)``, so the launcher kills every rank and
exits non-zero.  Ranks are ``MPI.COMM_WORLD`` ranks; the call is the collective and its
algorithm (or ``send``/``recv``/``wait`` for plain transfers).

How it works, and why a thread: the transport keeps MPI's own blocking calls (fast, and
MPICH makes progress inside them) and, only while a timeout is set, writes a record —
(start time, timeout, communicator, peer, what) — into a table keyed by thread before
each wait and removes it after.  A daemon *watchdog thread* wakes every ~timeout/4 and
looks for a record older than its timeout.  mpi4py releases the GIL inside every MPI
call minipar makes while waiting (no pickled ``allreduce``/``allgather`` anywhere in
``comm``), so the waiter never blocks the watchdog; and since the watchdog sleeps between
looks, it burns no core.  Cost with a timeout set: a clock read and two dict operations
per message (well under a microsecond); without one, an attribute test.

A record older than S says "this rank has waited S seconds for that peer".  The peer may
itself be stuck waiting on a third rank: each stuck rank reports its own wait, and the
first report ends the job.  ``on_hang(message)`` replaces the abort (e.g. to log first).
"""
from __future__ import annotations

import os
import sys
import threading
import time


def _positive(seconds):
    if not float(seconds) > 0:
        raise ValueError(f"hang timeout must be a positive number of seconds, not {seconds!r}")
    return float(seconds)


def _from_env():
    value = float(os.environ.get("MINIPAR_HANG_TIMEOUT", "0") or 0)
    return value if value > 0 else None


_state = {"timeout": _from_env(), "on_hang": None, "thread": None, "shortest": 60.0}
_waits = {}  # thread id -> [t0, timeout, communicator, peer, what, outer record]
_doing = threading.local()  # .what: the collective this thread is running, for reports
_wake = threading.Event()


def set_hang_timeout(seconds, on_hang=None) -> None:
    """Process-wide hang timeout in seconds (None: off) for every communicator that does
    not set its own; ``on_hang(message)`` runs instead of printing and aborting."""
    _state["timeout"] = None if seconds is None else _positive(seconds)
    _state["on_hang"] = on_hang
    if seconds is not None:
        _ensure_thread(_state["timeout"])


def get_hang_timeout():
    """The process-wide hang timeout (None: off)."""
    return _state["timeout"]


def register(own=None):
    """A new communicator's own timeout (validated; None: use the process-wide one);
    starts the watchdog thread if any timeout is on."""
    if own is not None:
        own = _positive(own)
    if own is not None or _state["timeout"] is not None:
        _ensure_thread(own or _state["timeout"])
    return own


class _Doing:
    """``with doing(ctx, "all_reduce (ring)"):`` names the waits inside for reports."""

    __slots__ = ("what", "saved")

    def __init__(self, what):
        self.what = what

    def __enter__(self):
        self.saved = getattr(_doing, "what", None)
        _doing.what = self.what

    def __exit__(self, *exc):
        _doing.what = self.saved


class _Nothing:
    def __enter__(self):
        return None

    def __exit__(self, *exc):
        return False


_NOTHING = _Nothing()


def doing(comm, what):
    """Label this thread's waits with ``what`` while a hang timeout is on (else a no-op)."""
    return _Doing(what) if comm.hang_timeout is not None else _NOTHING


def watched(comm, peer, kind, call, *args):
    """Run the blocking MPI call ``call(*args)`` with a record the watchdog can see."""
    rec = begin(comm, peer, kind)
    try:
        return call(*args)
    finally:
        end(rec)


def begin(comm, peer, kind):
    """Record that this thread starts waiting on ``peer`` of ``comm`` (None: on all its
    ranks, e.g. a communicator being created); returns the record for ``end``.  Records
    nest (a calibration region around its messages): ``end`` restores the outer one."""
    tid = threading.get_ident()
    rec = [time.perf_counter(), comm.hang_timeout, comm, peer,
           getattr(_doing, "what", None) or kind, _waits.get(tid)]
    _waits[tid] = rec
    return rec


def end(rec):
    tid = threading.get_ident()
    if rec[5] is None:
        _waits.pop(tid, None)
    else:
        _waits[tid] = rec[5]


def _world_rank(comm, rank):
    """``rank`` of ``comm`` as a COMM_WORLD rank (for a message a user can act on)."""
    from mpi4py import MPI
    try:
        return MPI.Group.Translate_ranks(comm.mpi.Get_group(), [rank],
                                         MPI.COMM_WORLD.Get_group())[0]
    except Exception:  # a report must never fail on its way out
        return rank


def _peers(comm, peer):
    if peer is None:
        return f"the other {comm.size - 1} ranks of its communicator"
    peers = peer if isinstance(peer, (list, tuple)) else [peer]
    names = sorted({_world_rank(comm, q) for q in peers})
    return ("rank " if len(names) == 1 else "ranks ") + ",".join(map(str, names))


def message(rec, now=None):
    """The report for a wait record, e.g. ``rank 1: all_reduce (ring) waited 20.0 s for rank 0``."""
    from mpi4py import MPI
    t0, timeout, comm, peer, what = rec[:5]
    waited = (time.perf_counter() if now is None else now) - t0
    return (f"rank {MPI.COMM_WORLD.Get_rank()}: {what} waited {waited:.1f} s for "
            f"{_peers(comm, peer)}; ending the job (hang timeout {timeout:g} s)")


def _report(text):
    if _state["on_hang"] is not None:
        _state["on_hang"](text)
        return
    sys.stdout.flush()
    os.write(2, (text + "\n").encode())  # unbuffered: nothing may sit in a buffer at the abort
    time.sleep(0.5)  # let the launcher forward it before it kills the job
    from mpi4py import MPI
    MPI.COMM_WORLD.Abort(1)


def _watch():
    while True:  # look 4 times per (shortest) timeout: a report comes at most S/4 late
        _wake.wait(min(1.0, max(0.01, _state["shortest"] / 4)))
        _wake.clear()
        now = time.perf_counter()
        for tid, rec in list(_waits.items()):
            if now - rec[0] > rec[1]:
                text = message(rec, now)
                rec[0] = float("inf")  # report each stuck wait once
                _report(text)


def _ensure_thread(timeout):
    if timeout < _state["shortest"]:
        _state["shortest"] = timeout
        _wake.set()  # look again at the shorter interval now
    if _state["thread"] is None:
        _state["thread"] = threading.Thread(target=_watch, name="minipar-watchdog", daemon=True)
        _state["thread"].start()
