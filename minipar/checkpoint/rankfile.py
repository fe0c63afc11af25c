"""One rank's checkpoint file, written straight from the arrays to the disk (O_DIRECT).

A plain ``write`` copies every byte into the kernel's page cache first: the kernel
must find a free page for each 4 KiB, and the disk gets the bytes later.  On a virtual
machine that hands freed memory back to its host (Linux "free page reporting", this
repository's 2-core machine), each fresh page costs a fault in the host: writing the
gpt2 preset's 1 GiB took 3–13 s of kernel time that way, and 0.8 s with ``O_DIRECT``,
which has the disk read the arrays' own pages (DMA) and needs no page cache at all —
so a background save costs the training thread's memory and cores nothing, and the
checkpoint does not fill the page cache on any machine.  DeepSpeed's fast checkpoint
writer makes the same choice.

O_DIRECT's rule: every buffer's address, length and file offset are multiples of the
disk's block (``BLOCK`` = 4096 covers every disk's 512 or 4096).  An array's bytes
start wherever the allocator put them, so ``plan_pieces`` gives each piece a file
offset congruent to its address modulo BLOCK,

    offset = end + (address - end) mod BLOCK        (the first such offset >= end),

and then the piece's whole blocks are written from the array itself; only the partial
blocks at its two ends (a few KiB per piece) are copied into bounce blocks, together
with the neighbouring piece's end and zeros between.  Offsets are therefore multiples
of the dtype's size, not of 64; ``np.memmap`` reads any offset.

Where the file system refuses O_DIRECT (tmpfs, or an operating system without it) the
same plan is written through the page cache.
"""
from __future__ import annotations

import errno
import mmap
import os

import numpy as np

BLOCK = 4096


def plan_pieces(pieces):
    """Lay out ``pieces`` — (kind, name, global shape, global box, host array) — in one
    file.  Returns (records, buffers): the index's records {kind, name, shape, dtype,
    box: [offsets, lengths], offset}, and the buffers that are the file one after
    another, each BLOCK-aligned in memory and a multiple of BLOCK long.  The arrays'
    whole blocks are views, not copies.  Made before a background write starts: the
    thread then only makes system calls, and the arrays must not change until
    ``written``."""
    pieces = [(kind, name, shape, box, np.ascontiguousarray(values).reshape(-1))
              for kind, name, shape, box, values in pieces]
    bounce = _Bounce(2 * len(pieces) + 1)       # at most two partial blocks per piece
    records, end = [], 0
    for kind, name, shape, box, values in pieces:
        address = values.__array_interface__["data"][0]
        start = end + (address - end) % BLOCK if values.nbytes else \
            -(-end // values.itemsize) * values.itemsize      # an empty piece
        bounce.place(start, values.view(np.uint8))
        records.append({"kind": kind, "name": name, "shape": list(shape),
                        "dtype": values.dtype.str, "box": [list(box[0]), list(box[1])],
                        "offset": start})
        end = start + values.nbytes
    return records, bounce.finish()


class _Bounce:
    """The file's buffers in order: views of whole blocks of the arrays, and bounce
    blocks (one zeroed, page-aligned pool) for the blocks pieces share or fill partly."""

    def __init__(self, blocks):
        self.pool = np.frombuffer(mmap.mmap(-1, max(blocks, 1) * BLOCK), np.uint8)
        self.used, self.buffers = 0, []
        self.partial, self.partial_block = None, -1   # the bounce block being filled

    def place(self, offset, data):
        """Put ``data`` (bytes whose address is congruent to ``offset``) at ``offset``."""
        while data.size:
            block, within = divmod(offset, BLOCK)
            if within == 0 and data.size >= BLOCK:     # whole blocks: the array itself
                self._flush()
                whole = data.size // BLOCK * BLOCK
                self.buffers.append(memoryview(data[:whole]))
                offset, data = offset + whole, data[whole:]
                continue
            if block != self.partial_block:
                self._flush()
                self.partial = self.pool[self.used * BLOCK:(self.used + 1) * BLOCK]
                self.partial_block, self.used = block, self.used + 1
            take = min(BLOCK - within, data.size)
            self.partial[within:within + take] = data[:take]
            offset, data = offset + take, data[take:]

    def _flush(self):
        if self.partial is not None:
            self.buffers.append(memoryview(self.partial))
            self.partial = None

    def finish(self):
        self._flush()
        return self.buffers


def write_planned(path, plan, fault=lambda where: None, written=None):
    """Write a plan (``plan_pieces``) into ``path``, O_DIRECT where the file system
    allows, else through the page cache: one ``os.writev`` per IOV_MAX buffers, half
    the buffers, then the rest (tests die in between); ``written()`` once every byte is
    written, before the fsync: from then on the arrays may change.  Returns the
    records."""
    records, buffers = plan
    half = len(buffers) // 2
    fd, direct = _open(path)
    try:
        try:
            write_all(fd, buffers[:half])
        except OSError as err:                 # a file system that takes the flag but
            if not direct or err.errno != errno.EINVAL:   # not these buffers
                raise
            os.close(fd)
            fd, direct = _open(path, direct=False)
            write_all(fd, buffers[:half])
        fault("file")                          # tests: die half way through
        write_all(fd, buffers[half:])
        if written is not None:
            written()
        os.fsync(fd)
    finally:
        os.close(fd)
    return records


def _open(path, direct=True):
    """(fd, whether O_DIRECT): a new file for writing, O_DIRECT if it can be had."""
    flags = os.O_WRONLY | os.O_CREAT | os.O_TRUNC
    if direct and hasattr(os, "O_DIRECT"):
        try:
            return os.open(path, flags | os.O_DIRECT, 0o644), True
        except OSError as err:
            if err.errno != errno.EINVAL:
                raise
    return os.open(path, flags, 0o644), False


def write_all(fd, buffers):
    """Write ``buffers`` one after another at ``fd``'s position, IOV_MAX at a time; a
    short write goes on where it stopped."""
    views = [memoryview(b).cast("B") for b in buffers if len(b)]
    limit = getattr(os, "IOV_MAX", 1024)   # POSIX; Linux: 1024
    while views:
        n = os.writev(fd, views[:limit])
        while views and n >= views[0].nbytes:
            n -= views[0].nbytes
            views.pop(0)
        if n:
            views[0] = views[0][n:]
