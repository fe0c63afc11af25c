"""Writing a sharded checkpoint: every rank its own file, rank 0 the index, one commit.

    PendingSave(comm, DIR, step, meta)   collective: rank 0 makes DIR/step-N.tmp-<id>/
                                         (and removes crashed saves' temporaries); every
                                         rank learns its name (one bcast)
    .write(pieces)                       local, no messages (so it may run in a thread):
                                         this rank's pieces into rank-RRRRR.bin
                                         (O_DIRECT: ``rankfile.py``), fsynced; records
                                         (kind, name, shape, dtype, box, offset) only
    .commit()                            collective: gather the records and errors (the
                                         metadata, never an array) to rank 0; if every
                                         rank succeeded rank 0 writes index.json, renames
                                         the directory to step-N and replaces DIR/latest,
                                         then prunes to ``keep``; the outcome is bcast,
                                         so every rank stops alike or goes on alike

PyTorch DCP and Megatron's dist-ckpt do the same in spirit: local writes, a global
metadata file written last by a coordinator, and a checkpoint that exists only once
its metadata does.
"""
from __future__ import annotations

import json
import os
import shutil
import threading
import time

import numpy as np

from minipar.checkpoint import layout
from minipar.checkpoint.rankfile import plan_pieces, write_all, write_planned


class CheckpointWriteError(OSError):
    """The checkpoint could not be written; the previous one (if any) is intact."""


def _pad(offset):
    return -(-offset // layout.ALIGN) * layout.ALIGN


def write_pieces(path, pieces, fault=lambda where: None, written=None):
    """A list: ``write_planned(plan_pieces(pieces))`` (``rankfile.py``: O_DIRECT).  A
    generator (``consolidate``) is written as it comes, through the page cache, one
    tensor in memory at a time, each at a 64-byte aligned offset.  Returns the records."""
    if hasattr(pieces, "__len__"):
        return write_planned(path, plan_pieces(pieces), fault, written)
    records, offset = [], 0
    with open(path, "wb", buffering=0) as f:
        for i, (kind, name, shape, box, values) in enumerate(pieces):
            values = np.ascontiguousarray(values).reshape(-1)
            start = _pad(offset)
            write_all(f.fileno(), [bytes(start - offset), values])
            records.append({"kind": kind, "name": name, "shape": list(shape),
                            "dtype": values.dtype.str, "box": [list(box[0]), list(box[1])],
                            "offset": start})
            offset = start + values.nbytes
            if i == 0:
                fault("file")
        if not records:
            fault("file")
        if written is not None:
            written()
        os.fsync(f.fileno())
    return records


def build_index(meta, reports):
    """The index: meta, every file's size, and per tensor its pieces.  ``reports``: per
    rank (file, records).  A box written twice (a tied weight held by two pipeline
    stages) is recorded once."""
    tensors, files = {}, {}
    for file, records, nbytes in reports:
        files[file] = nbytes
        for r in records:
            key = f"{r['kind']}/{r['name']}"
            t = tensors.setdefault(key, {"kind": r["kind"], "name": r["name"], "shape": r["shape"],
                                         "dtype": r["dtype"], "pieces": []})
            if all(p["box"] != r["box"] for p in t["pieces"]):
                t["pieces"].append({"file": file, "offset": r["offset"], "box": r["box"]})
    return {"format": layout.FORMAT, "meta": meta, "files": files,
            "tensors": dict(sorted(tensors.items()))}


class PendingSave:
    """One checkpoint being written (see the module docstring).  ``comm``: an mpi4py
    communicator over every rank that writes (None: one process).  ``fault(where)``: a
    hook called at each point of the save a test may disturb — "file" (half way through
    this rank's file), "report" (written, before agreeing), and on rank 0 "commit"
    (before the rename) and "latest" (renamed, ``latest`` not yet replaced); a run
    passes the faults its environment asks for (``train/faults.py``), None: no hook."""

    def __init__(self, comm, directory, step, meta, keep=0, prune_in_background=False,
                 fault=None):
        self.comm, self.directory, self.step = comm, str(directory), int(step)
        self._fault = fault or (lambda where: None)
        self.meta, self.keep = dict(meta, step=self.step), keep
        self.pruning = None     # rank 0's thread removing old checkpoints (async saves)
        self.prune_in_background = prune_in_background
        self.rank = comm.Get_rank() if comm is not None else 0
        self.records, self.error, self.nbytes, self.seconds = [], None, 0, 0.0
        name = None
        if self.rank == 0:
            layout.remove_temporaries(self.directory)
            name = f"{layout.step_name(step)}.tmp-{os.getpid()}-{time.time_ns()}"
            try:
                os.makedirs(os.path.join(self.directory, name))
            except OSError as err:
                name = f"!{err.strerror or err}"
        if comm is not None and comm.Get_size() > 1:
            name = comm.bcast(name, root=0)
        if name.startswith("!"):
            raise CheckpointWriteError(f"could not write the checkpoint to {self.directory}: "
                                       f"{name[1:]}; the previous checkpoint is unchanged")
        self.tmp = os.path.join(self.directory, name)

    def write(self, pieces, written=None):
        """This rank's file (no messages; safe in a background thread).  ``pieces``: a
        list, a generator, or a plan (``plan_pieces``, made before the thread starts).
        ``written()``: called once the bytes are written (before the fsync), or on
        failure."""
        t0 = time.perf_counter()
        file = layout.rank_file(self.rank)
        try:
            path = os.path.join(self.tmp, file)
            if isinstance(pieces, tuple):       # a plan
                self.records = write_planned(path, pieces, self._fault, written)
            else:
                self.records = write_pieces(path, pieces, self._fault, written)
            self.nbytes = os.path.getsize(os.path.join(self.tmp, file))
        except OSError as err:
            self.error = f"rank {self.rank}: {err.strerror or err}"
        except Exception as err:           # in a thread nobody else would see it
            self.error = f"rank {self.rank}: {type(err).__name__}: {err}"
        finally:
            if written is not None:
                written()
        self.seconds = time.perf_counter() - t0

    def commit(self):
        """Collective: agree, index, rename, latest, prune.  Returns None or the one line
        that says why there is no new checkpoint (the previous one stays)."""
        self._fault("report")
        mine = (layout.rank_file(self.rank), self.records, self.nbytes, self.error)
        many = self.comm is not None and self.comm.Get_size() > 1
        reports = self.comm.gather(mine, root=0) if many else [mine]
        failure = None
        if self.rank == 0:
            failure = self._finish(reports)
        if many:
            failure = self.comm.bcast(failure, root=0)
        return failure

    def _finish(self, reports):
        errors = [e for *_, e in reports if e]
        if not errors:
            try:
                index = build_index(self.meta, [(f, r, n) for f, r, n, _ in reports])
                layout.write_atomic(os.path.join(self.tmp, layout.INDEX),
                                    json.dumps(index, indent=1, sort_keys=True))
                self._fault("commit")
                name = layout.free_step_name(self.directory, self.step)
                os.rename(self.tmp, os.path.join(self.directory, name))
                layout.fsync_directory(self.directory)
                self._fault("latest")
                layout.write_atomic(os.path.join(self.directory, layout.LATEST), name + "\n")
                if self.prune_in_background:    # removing a GiB: 0.25 s the steps need not wait
                    self.pruning = threading.Thread(target=layout.prune, daemon=True,
                                                    args=(self.directory, self.keep))
                    self.pruning.start()
                else:
                    layout.prune(self.directory, self.keep)
                return None
            except OSError as err:
                errors = [f"{err.strerror or err}"]
        shutil.rmtree(self.tmp, ignore_errors=True)
        return (f"could not write the checkpoint to {self.directory}: {errors[0]}; "
                "the previous checkpoint is unchanged")


def save(comm, directory, step, meta, pieces, keep=0):
    """A whole synchronous save (collective); returns None or the failure's one line."""
    pending = PendingSave(comm, directory, step, meta, keep)
    pending.write(pieces)
    return pending.commit()
