"""Paths a command reads and writes, checked before any work: one line when they cannot be.

A run that trains for an hour and then cannot open its ``--log-json`` — or a report
that draws every figure and then finds ``--out`` read-only — has wasted the work.  So
every command probes its outputs first:

    probe_output_file(path, need_bytes)    the file can be created (or appended to)
    probe_output_dir(path, need_bytes)     the folder exists or can be made, and a file
                                           can be written in it
    require_input_file(path)               the file exists, is a file, and can be read

A probe changes nothing it finds and touches no path it is given: it writes and removes a
file of its own process's name beside it (so every rank of a job may probe the same path at
once).  ``need_bytes`` (when the
size of what will be written is known) is compared with the free space of the
file system.  Each raises ``PathError`` — a ValueError whose message is one line
without the path, so a command can say ``--out DIR: <message>`` in its own words.
"""
from __future__ import annotations

import os
import shutil


class PathError(ValueError):
    """A path a command cannot use; the message says why, in one line."""


def _why(err):
    return err.strerror or str(err)


def _room(directory, need_bytes, what):
    if not need_bytes:
        return
    free = shutil.disk_usage(directory).free
    if free < need_bytes:
        raise PathError(f"only {free / 2 ** 20:.1f} MiB free there; {what} needs about "
                        f"{need_bytes / 2 ** 20:.1f} MiB")


def probe_output_dir(directory, need_bytes=0, what="the output"):
    """``directory`` exists (made if missing) and takes a file; ``need_bytes`` fit."""
    directory = os.fspath(directory)
    if os.path.exists(directory) and not os.path.isdir(directory):
        raise PathError("exists and is not a directory")
    probe = os.path.join(directory, f".minipar-probe-{os.getpid()}")
    try:
        os.makedirs(directory, exist_ok=True)
        with open(probe, "wb") as f:
            f.write(b"probe")
        os.remove(probe)
    except OSError as err:
        raise PathError(f"cannot write there: {_why(err)}") from None
    _room(directory, need_bytes, what)


def probe_output_file(path, need_bytes=0, what="the output"):
    """``path`` can be written: its folder exists, it is not a folder, and an existing file
    is writable, or the folder takes a new file.  Safe when every rank of a job probes the
    same path at once: the probe never touches ``path`` itself (a rank that created and
    removed it under another rank's feet made that rank refuse, alone, and the others
    wait for it), it writes a file of this process's own name beside it."""
    path = os.fspath(path)
    if not path:
        raise PathError("is empty; give a file name")
    if os.path.isdir(path):
        raise PathError("is a directory; give a file name")
    parent = os.path.dirname(os.path.abspath(path))
    if not os.path.isdir(parent):
        raise PathError(f"its folder {parent} does not exist")
    try:
        if os.path.exists(path):
            if not os.access(path, os.W_OK):
                raise PermissionError(13, "Permission denied")
        else:
            probe = os.path.join(parent, f".{os.path.basename(path)}.probe-{os.getpid()}")
            os.close(os.open(probe, os.O_CREAT | os.O_EXCL | os.O_WRONLY, 0o600))
            os.remove(probe)
    except OSError as err:
        raise PathError(f"cannot write there: {_why(err)}") from None
    _room(parent, need_bytes, what)


def require_input_file(path):
    """``path`` is a readable file (not a folder, not missing)."""
    path = os.fspath(path)
    if not os.path.exists(path):
        raise PathError("no such file")
    if os.path.isdir(path):
        raise PathError("is a directory, not a file")
    try:
        with open(path, "rb") as f:
            f.read(1)
    except OSError as err:
        raise PathError(f"cannot be read: {_why(err)}") from None
