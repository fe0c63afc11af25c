"""Gradient synchronisers: how replicas agree on a gradient, as interchangeable objects.

Every layout's data-parallel part is one of

    DDPSync     all-reduce of gradient buckets, overlapped with backward (dp = 1: nothing
                to agree on, the same object over one rank)
    ZeroSync    ZeRO-1 / ZeRO-2: reduce-scatter into shards, each rank updates its shard
    Zero3Sync   ZeRO-3: the parameters are sharded too, gathered per unit
    ExpertSplitSync  expert parallelism: one of the above for the dense weights (over dp·cp)
                and one for the experts (over the ranks holding the same experts)

and all of them are a ``GradSync`` (``base.py``), the one contract the optimizer step,
the checkpoint and the log see:

    sync = DDPSync(module, dp_comm, table, ...)      hooks registered on the parameters
    loss.backward()                                  hooks start communication (overlap)
    with sync.no_sync(): ...                         accumulate locally (gradient accumulation)
    slots = sync.finish()                            wait; -> the Slots this rank updates:
                                                     (master, grad averaged over dp, decay mask,
                                                      norm weight, tp-partial mask)
    ... the one optimizer step updates slot.master in place (``parallel.step``) ...
    sync.publish()                                   the model's weights from the masters
    sync.zero_grad()
    sync.placements()                                {name: Placement}: every cut, its own added
    sync.stats()                                     exposed communication, bytes held, counters

A Slot's master is fp32 under mixed precision (fp16/bf16 model weights are a rounded copy
that ``publish`` refreshes), else the weight itself.  Gradient compression plugs in as
``DDPSync(comm_hook=...)``: a hook takes a bucket's flat gradient and returns a handle
whose ``wait()`` gives the averaged gradient (``hooks.allreduce_hook`` is the default).
"""
from minipar.parallel.sync.base import GradSync, SyncStats
from minipar.parallel.sync.slots import Slot, broadcast_parameters
from minipar.parallel.sync.hooks import allreduce_hook
from minipar.parallel.sync.ddp import DDPSync
from minipar.parallel.sync.zero import ZeroSync
from minipar.parallel.sync.zero3 import Zero3Sync
from minipar.parallel.sync.experts import ExpertSplitSync

__all__ = ["GradSync", "SyncStats", "Slot", "broadcast_parameters", "allreduce_hook", "DDPSync",
           "ZeroSync", "Zero3Sync", "ExpertSplitSync"]
