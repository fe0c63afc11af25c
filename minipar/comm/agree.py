"""Agree before data moves: check mode, and a local error answered on every rank.

Ranks that disagree about a collective do not fail cleanly: a receive finds a longer
message than its buffer ("Message truncated") on one rank while the others wait
forever, or the bytes happen to fit and the answer is silently wrong.  And a rank that
refuses its own arguments (``checks.py``) raises alone while its peers wait for it.

Check mode (``MINIPAR_COMM_CHECK=1`` or ``Communicator(check=True)``) closes both holes.
Before any data moves, every rank contributes one descriptor of ``RECORD`` bytes,

    [ flag | count | out count | text ]   flag 0: text = "all_reduce count=100 dtype=float32 ..."
                                          flag 1: my local check failed, text = why

and the records are all-gathered in ⌈log2 p⌉ rounds of p2p messages.  All records have the
same size, so this exchange itself can never mismatch — not even between ranks that
called different collectives.  Every rank then sees the same p records and makes the
same decision, before sending a byte of data:

- a flag is set          -> CollectiveArgumentError on every rank, naming who and why;
- the texts differ       -> CollectiveMismatchError on every rank, grouping the ranks;
- all_gather only: the counts *are* the sizes (no second exchange) and every rank's
  ``out`` count is checked against their sum.

Cost: one all-gather of p·RECORD bytes, ⌈log2 p⌉·α — on one machine some tens of µs
per call (``mpiexec -n 2 python -m minipar bench comm --check-overhead`` measures it).

Without check mode nothing is exchanged.  Every rank still checks its own arguments
before its first message, so a bad argument raises on the rank that passed it — but
its peers cannot know and wait for it: run entry points under ``abort_on_exception()``
(the job then ends) and/or with a hang timeout (``watchdog.py``).  What only check mode
can catch is a *disagreement* between arguments that are each valid locally: counts,
dtypes, op, root, algorithm, all_gather's ``sizes`` lists, or ranks calling different
collectives or in a different order.
"""
from __future__ import annotations

import struct
import zlib

import numpy  # host metadata only, never data

from minipar.comm import watchdog
from minipar.comm.transport import CollectiveArgumentError, CollectiveMismatchError

CHECK_TAG = 8  # not the data tag: a stray record can never be taken for data
RECORD = 256
_HEAD = 24  # three int64: flag, count, out count


def gather_rows(comm, row):
    """All-gather one equal-length host array per rank -> (size, len(row)) array.

    Bruck's dissemination all-gather: in round k every rank sends the blocks it holds
    (its own first, then those it received) to rank r - 2^k and receives as many from
    r + 2^k, so ⌈log2 p⌉ messages instead of a ring's p-1 — these records are tiny and
    latency is all they cost.  Block i then belongs to rank r + i: rotate at the end.
    Plain p2p: the GIL is released while waiting, so a progress thread and the main
    thread can both use it (mpi4py's pickled ``allgather`` holds the GIL).  Metadata,
    not data: the traffic counters are left as they were, so they keep measuring the
    algorithms' textbook volumes.
    """
    p, r = comm.size, comm.rank
    blocks = numpy.empty((p, row.size), dtype=row.dtype)
    blocks[0] = row
    saved = comm.counters.as_dict()
    dist = 1
    while dist < p:
        cnt = min(dist, p - dist)
        comm.sendrecv(blocks[:cnt], (r - dist) % p, blocks[dist:dist + cnt], (r + dist) % p,
                      CHECK_TAG)
        dist <<= 1
    for k, v in saved.items():
        setattr(comm.counters, k, v)
    # row q <- block (q - r) mod p, which is rank q's
    return numpy.concatenate((blocks[p - r:], blocks[:p - r])) if r else blocks


def text_of(name, fields):
    """``name k=v ...``; a long value (e.g. 64 ranks' sizes) as a checksum."""
    parts = [name]
    for k, v in fields.items():
        v = v if type(v) is str else str(v)
        parts.append(f"{k}={v}" if len(v) <= 64 else f"{k}=#{zlib.crc32(v.encode()):08x}")
    return " ".join(parts)


def _record(flag, count, out_count, text):
    data = text.encode()
    if len(data) > RECORD - _HEAD:  # keep a checksum of what does not fit
        data = data[:RECORD - _HEAD - 10] + f" #{zlib.crc32(data):08x}".encode()
    raw = struct.pack("<qqq", flag, count, out_count) + data.ljust(RECORD - _HEAD, b"\0")
    return numpy.frombuffer(raw, dtype=numpy.uint8)


def _text(row):
    return bytes(row[_HEAD:]).rstrip(b"\0").decode(errors="ignore")


def _groups(items):
    """{value: [ranks]} in first-seen order."""
    groups = {}
    for r, v in enumerate(items):
        groups.setdefault(v, []).append(r)
    return groups


def _ranks(rs):
    return ("rank " if len(rs) == 1 else "ranks ") + ",".join(map(str, rs))


def refused(comm, name, err):
    """The error of a rank whose local check failed (before any message)."""
    return CollectiveArgumentError(f"rank {comm.rank}: {name}: {err}")


def agree(comm, name, fields=None, error=None, count=0, out_count=-1):
    """Check mode: agree with every rank on ``name(fields)`` before any data moves.

    ``error``: this rank's local check failure (then every rank raises).  Returns every
    rank's (count, out count) as an int64 array of shape (size, 2).
    """
    text = f"{name}: {error}" if error is not None else text_of(name, fields or {})
    rows = gather_rows(comm, _record(error is not None, count, out_count, text))
    heads = rows[:, :_HEAD].copy().view(numpy.int64)
    if heads[:, 0].any():
        reasons = _groups(_text(rows[q]) if heads[q, 0] else None for q in range(comm.size))
        lines = [f"{_ranks(rs)}: {why}" for why, rs in reasons.items() if why is not None]
        raise CollectiveArgumentError(
            "\n".join(lines) + f"\n(check mode, {comm.size} ranks: every rank raises this)")
    if (rows[:, _HEAD:] != rows[0, _HEAD:]).any():
        groups = _groups(_text(row) for row in rows)
        names = {t.partition(" ")[0] for t in groups}
        if len(names) == 1:  # the same collective: show the arguments
            title = f"{name}: ranks disagree on its arguments"
            lines = [f"  ranks {','.join(map(str, rs))}: {t.partition(' ')[2]}"
                     for t, rs in groups.items()]
        else:  # the same words on every rank, whichever collective it called
            title = "ranks called different collectives"
            lines = [f"  ranks {','.join(map(str, rs))}: called {t}" for t, rs in groups.items()]
        raise CollectiveMismatchError(f"{title} (check mode, {comm.size} ranks):\n"
                                      + "\n".join(lines))
    return heads[:, 1:]


def check(comm, name, local):
    """Run ``local() -> (fields, count, out_count, result)`` — the collective's local
    checks — and, in check mode, agree on its fields.  Returns (result, every rank's
    (count, out count) or None without check mode)."""
    agreeing = comm.check and comm.size > 1
    try:
        fields, count, out_count, result = local()
    except Exception as err:  # a local refusal: mine alone, or (check mode) everyone's
        why = err if isinstance(err, (ValueError, TypeError)) else f"{type(err).__name__}: {err}"
        if agreeing:
            try:
                with watchdog.doing(comm, f"{name} (check mode: agreeing on arguments)"):
                    agree(comm, name, error=why)
            except CollectiveArgumentError as everyone:
                raise everyone from err
        raise refused(comm, name, why) from err
    if agreeing:
        with watchdog.doing(comm, f"{name} (check mode: agreeing on arguments)"):
            return result, agree(comm, name, fields, count=count, out_count=out_count)
    return result, None
