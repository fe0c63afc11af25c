"""A background save's copy of device state: pinned host memory, filled on a side stream.

On NumPy a background save (``--save-async``, ``train/saving.py``) writes straight from
the live arrays while the next forward and backward run, and the optimizer step waits
for the write.  On a GPU the state must first reach host memory, and a plain
``to_host`` is a synchronous copy through pageable memory: the training thread waits for
every byte, which is most of what the background save was meant to hide.  Here instead:

- the copies go into **pinned** host buffers (``cupy.cuda.alloc_pinned_memory``: memory
  the GPU's copy engine reaches by DMA, so a copy runs while the host goes on), allocated
  at the first save and reused by every later one (pinning is a system call per buffer);
- they are queued on a **side stream** that first waits for the compute stream's work so
  far (an event), so they overlap the next step's kernels instead of queueing behind them;
- ``copied`` is the event recorded after the last copy: the writer thread waits for it
  before it reads the buffers, and the optimizer step waits only for it — the snapshot is
  the state as it was, so the update need not wait for the disk.

The cost is one pinned copy of what the rank saves (its masters and Adam moments), which
a GPU node's host memory holds (torchtitan's async checkpointing stages through pinned
memory alike).
"""
from __future__ import annotations

import numpy as np


class DeviceSnapshot:
    """Pinned host copies of device arrays, queued on a stream of their own; one per run,
    its buffers reused save after save (the pieces come in the same order every time)."""

    def __init__(self):
        self.buffers = []          # [pinned host array], in the order the save asks for them
        self.stream = None
        self.used = 0

    def begin(self):
        """Start a snapshot: the copies wait for the kernels queued so far."""
        import cupy
        if self.stream is None:        # made at the first save: the rank's GPU is chosen by then
            self.stream = cupy.cuda.Stream(non_blocking=True)
        self.stream.wait_event(cupy.cuda.get_current_stream().record())
        self.used = 0

    def to_host(self, array):
        """A pinned host array that will hold ``array``'s values once ``copied`` has
        happened; the copy is queued, not waited for."""
        i, self.used = self.used, self.used + 1
        if i == len(self.buffers) or self.buffers[i].shape != array.shape or \
                self.buffers[i].dtype != array.dtype:
            buffer = _pinned(array.shape, array.dtype)
            if i == len(self.buffers):
                self.buffers.append(buffer)
            else:
                self.buffers[i] = buffer
        out = self.buffers[i]
        array.get(stream=self.stream, out=out, blocking=False)
        return out

    def finish(self):
        """The event after the last copy: ``.synchronize()`` until the snapshot is whole."""
        return self.stream.record()


def _pinned(shape, dtype):
    import cupy
    dtype = np.dtype(dtype)
    n = int(np.prod(shape, dtype=np.int64)) * dtype.itemsize
    memory = cupy.cuda.alloc_pinned_memory(max(n, 1))
    return np.ndarray(shape, dtype, buffer=memory) if n else np.empty(shape, dtype)
