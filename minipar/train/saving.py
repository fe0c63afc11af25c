"""Sharded checkpoints of a run: every rank writes what it owns, resumes read what they own.

Saving (``Saver.save``; collective): each rank lists its pieces — for every slot the
optimizer updates, the masters, Adam m and v as global boxes (``checkpoint/shards.py``),
replicas once — plus its gradient-compression state, and writes them to its own file;
rank 0 writes the index and commits (``checkpoint/write.py``).  Nothing is gathered but
the index's metadata.

With ``--save-async`` a background thread writes the pieces straight from the live state
while the next step's forward and backward run (they read the weights, they change
none of the saved state).  The file is planned before the thread starts
(``checkpoint.plan_pieces``), so the thread only makes system calls — ``writev`` with
O_DIRECT: the disk reads the arrays' pages, the CPU copies nothing (``rankfile.py``) —
and ``fsync``.  The optimizer step waits until every byte is written
(``before_update``), nothing else does; the commit comes later: at each step boundary
the ranks agree (one small all-reduce) whether every file is written, then commit, and
rank 0 removes the checkpoints beyond ``--keep`` in another thread (deleting a GiB
took 0.25 s).  On NumPy no copy of the state is made: a copy would cost a whole model
state of memory, and on this repository's 2-core machine copying 1 GiB into fresh memory
took ~2.8 s of page faults, longer than the step it was meant to hide behind.  On CuPy
the state must reach the host anyway: it is copied on a side stream into pinned buffers
kept from save to save (``checkpoint/device_snapshot.py``), and the optimizer step waits
for that copy only, not for the disk.  Measured (``benchmarks/checkpoint_save.py``,
gpt2 preset, one compute thread): a 0.70 s save costs the step beside it 0.06 s.  The
next save, and the end of the run, wait for it.  A failed write stops the run with one
line at that boundary, as a synchronous save does (torchtitan's async checkpointing
re-raises a failed save the same way); the previous checkpoint stays.

Loading: the run is built with zeros (``parallelize(checkpoint=...)``: nothing drawn),
then ``load_state`` reads each slot's boxes of the masters, m and v: a rank reads the
bytes it owns and nothing else, and no rank holds a whole tensor it does not own.
"""
from __future__ import annotations

import threading
from functools import partial

import numpy as np

from minipar import checkpoint
from minipar.backend import backend_name, to_device, to_host
from minipar.checkpoint.device_snapshot import DeviceSnapshot
from minipar.checkpoint.shards import owned_pieces, read_slot
from minipar.nn.moe import moe_layers
from minipar.parallel.placement import slot_segments
from minipar.train import faults
from minipar.train.errors import TrainingStopped


def local_pieces(run, host=to_host):
    """[(kind, name, global shape, global box, host array)]: everything this rank
    writes (on NumPy, views of the live state: an async save copies them).  ``host``: how
    a slot's arrays reach host memory (a background save on a GPU: ``DeviceSnapshot``)."""
    opt, table = run.optimizer, run.parallel.placements
    sync = opt.sync
    pieces = []
    for i, (slot, segments) in enumerate(zip(sync.slots, slot_segments(table, len(sync.slots)))):
        segments = [s for s in segments if table[s[0]].counted_here]
        if not segments:
            continue
        for kind, array in (("param", slot.master), ("adam_m", opt.m[i]), ("adam_v", opt.v[i])):
            flat = host(array).reshape(-1)
            pieces += owned_pieces(kind, flat, segments, table)
    if sync.comm.rank == 0 and run.grid.coords.tp == 0:   # the same on every data rank: once
        pieces += selection_bias_pieces(run.parallel.module)
    hook = sync.comm_hook
    if hasattr(hook, "state_dict"):               # error feedback differs per rank: every rank's
        for key, a in hook.state_dict().items():
            a = np.asarray(a)
            pieces.append(("hook", f"{run.grid.rank}/{key}", a.shape,
                           ((0,) * a.ndim, a.shape), a))
    if run.outer is not None:                     # DiLoCo: per-group inner state, outer state
        from minipar.parallel.outer.state import checkpoint_pieces
        pieces = checkpoint_pieces(run.outer, pieces, table)
    return pieces


def selection_bias_pieces(module):
    """The loss-free balancing bias of each MoE layer ``module`` holds (``nn/moe.py``):
    state, not a parameter, saved as kind ``moe_bias`` under the layer's name."""
    pieces = []
    for name, moe in moe_layers(module):
        if moe.selection_bias is not None:
            bias = to_host(moe.selection_bias)
            pieces.append(("moe_bias", name, bias.shape, ((0,), bias.shape), bias))
    return pieces


def checkpoint_meta(run, step):
    """The index's metadata: what a resume, ``sample`` and ``inspect`` need."""
    c, grid, opt = run.config, run.grid, run.optimizer
    meta = {"model": run.cfg.to_dict(), "step": step, "optimizer_step": opt.step_count,
            "seed": c.seed, "precision": c.precision, "config": c.to_dict(),
            "layout": {"name": c.layout_name(), "world_size": grid.world.size,
                       **c.planned_layout()},
            "data": {"seed": c.seed, "next_step": step, "batch_size": c.batch_size}}
    if run.dataset.tokenizer is not None:          # sample and resume decode with it
        meta["tokenizer"] = run.dataset.tokenizer.to_dict()
    if hasattr(opt.sync.comm_hook, "state_dict"):
        meta["compression"] = {"method": c.grad_compression, "world_size": grid.world.size,
                               "layout": c.layout_name()}
    if opt.scaler:
        meta["loss_scaler"] = opt.scaler.state_dict()
    if run.outer is not None:
        from minipar.parallel.outer.state import meta_of
        meta["diloco"] = meta_of(run.outer, c)
    return meta


class Saver:
    """The checkpoints of one run, written now or in the background (``--save-async``)."""

    def __init__(self, run):
        self.run = run
        self.comm = run.grid.world.mpi
        self.pending, self.thread = None, None
        self.written = None     # set by the writer thread once the state is in the file
        self.snapshot = None    # on a GPU: the pinned host copy background saves write from
        self.pruning = None     # rank 0: the thread removing checkpoints beyond --keep

    def save(self, step):
        """Collective.  Its memory peak is the run's "save" phase."""
        self.wait()                                  # the previous save first
        c = self.run.config
        with self.run.process_memory.phase("save"):
            try:
                pending = checkpoint.PendingSave(self.comm, c.save, step,
                                                 checkpoint_meta(self.run, step), c.keep,
                                                 prune_in_background=c.save_async,
                                                 fault=partial(faults.save_fault, step=step,
                                                               rank=self.run.grid.rank))
            except checkpoint.CheckpointWriteError as err:
                raise TrainingStopped(f"step {step}: {err}") from None
            if not c.save_async:
                pending.write(local_pieces(self.run))
                self._report(pending.commit(), step)
                return
            self.pending = pending
            if backend_name() == "cupy":     # device state: a pinned snapshot on a side stream
                self.snapshot = self.snapshot or DeviceSnapshot()
                self.snapshot.begin()
                pieces = [_copy(p) if p[0] == "hook" else p
                          for p in local_pieces(self.run, host=self.snapshot.to_host)]
                copied = self.snapshot.finish()
                self.written = _Copied(copied)     # the update waits for the copy, not the disk
                target, args = _write_snapshot, (pending, pieces, copied)
            else:
                self.written = threading.Event()
                pieces = [_copy(p) if p[0] == "hook" else p     # backward changes these: now
                          for p in local_pieces(self.run)]
                plan = checkpoint.plan_pieces(pieces)   # here: the thread only makes syscalls
                target, args = pending.write, (plan, self.written.set)
            self.thread = threading.Thread(target=target, args=args, daemon=True,
                                           name=f"checkpoint-{step}")
            self.thread.start()

    def before_update(self):
        """Before the optimizer changes the state: a background save must have written
        it (the writer thread does while forward and backward run) — on a GPU, copied it
        to its pinned snapshot."""
        if self.written is not None:
            self.written.wait()
            self.written = None

    def poll(self):
        """At a step boundary: commit the background save once every rank's file is
        written (agreed by one all-reduce), else return at once."""
        if self.pending is None:
            return
        done = int(not self.thread.is_alive())
        if self.comm.Get_size() > 1:
            from mpi4py import MPI
            done = self.comm.allreduce(done, op=MPI.MIN)
        if done:
            self._commit()

    def wait(self):
        """Finish the background save, if any (collective), and its removal of the
        checkpoints beyond ``--keep``."""
        if self.pending is not None:
            self.thread.join()
            self._commit()
        if self.pruning is not None:
            self.pruning.join()
            self.pruning = None

    def _commit(self):
        pending, self.pending, self.thread = self.pending, None, None
        failure = pending.commit()
        self.pruning = pending.pruning
        self._report(failure, pending.step)

    @staticmethod
    def _report(failure, step):
        if failure:
            raise TrainingStopped(f"step {step}: {failure}")


class _Copied:
    """``wait()`` until a device snapshot's copies are done (its event)."""

    def __init__(self, event):
        self.event = event

    def wait(self):
        self.event.synchronize()


def _write_snapshot(pending, pieces, copied):
    """The writer thread of a background save on a GPU: once the snapshot's copies have
    landed, plan the file from the pinned buffers and write it."""
    copied.synchronize()
    pending.write(checkpoint.plan_pieces(pieces))


def _copy(piece):
    kind, name, shape, box, values = piece
    return kind, name, shape, box, np.array(values, copy=True)


def save_checkpoint(run, step):
    """Collective: the checkpoint of ``step`` (see ``Saver``)."""
    run.saver.save(step)


def load_state(optimizer, parallel, ckpt, config=None, rank=0, kind_of=None):
    """Load a resumed checkpoint into a run built with zeros: each slot's masters, Adam m
    and v (the boxes this rank's slots own, read from the pieces they intersect — a
    ZeRO-3 rank reads its shard, nothing more), then ``publish`` makes the model's
    weights from the masters (ZeRO-1/2: one all-gather; mixed precision: the rounding).
    Also the loss scaler, the MoE selection biases and gradient-compression state;
    returns the step to continue from.  Compression state is per rank: it is loaded when
    the run has the checkpoint's method and layout, else started afresh (said once).
    ``kind_of(kind)``: the kind to read instead (a DiLoCo group's own inner state)."""
    meta, sync, table = ckpt.meta, optimizer.sync, parallel.placements
    for i, (slot, segments) in enumerate(zip(sync.slots, slot_segments(table, len(sync.slots)))):
        for kind, target in (("param", slot.master), ("adam_m", optimizer.m[i]),
                             ("adam_v", optimizer.v[i])):
            flat = np.zeros(target.size, dtype=to_host(target.reshape(-1)[:0]).dtype)
            read_slot(ckpt, kind_of(kind) if kind_of else kind, flat, segments, table)
            target[...] = to_device(flat).reshape(target.shape)
    sync.publish()
    optimizer.step_count = int(meta["optimizer_step"])
    hook = sync.comm_hook
    saved = meta.get("compression")
    if hasattr(hook, "load_state_dict") and config is not None:
        mine = [n for n in ckpt.names("hook") if n.split("/", 1)[0] == str(rank)]
        if saved and saved["method"] == config.grad_compression and \
                saved["layout"] == config.layout_name() and mine:
            hook.load_state_dict({n.split("/", 1)[1]: ckpt.tensor(n, "hook") for n in mine})
        elif rank == 0:
            print(f"minipar train: note: no {config.grad_compression} state for this layout in the "
                  "checkpoint; error feedback starts from zero", flush=True)
    if "loss_scaler" in meta and optimizer.scaler:
        optimizer.scaler.load_state_dict(meta["loss_scaler"])
    for name, moe in moe_layers(parallel.module):
        if moe.selection_bias is not None:
            moe.selection_bias = to_device(ckpt.tensor(name, "moe_bias"))
    return int(meta["step"])
