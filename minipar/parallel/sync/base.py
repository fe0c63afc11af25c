"""The synchroniser contract: what every gradient synchroniser is, as a base class.

Data parallelism in any of its forms (DDP, ZeRO-1/2/3) is one object between backward
and the optimizer step.  The step, the checkpoint, the log and the memory model see only
this interface, so a new form (or a new axis that shards the same parameters) is one more
subclass, never a new ``hasattr`` in the code that uses it:

    sync.no_sync()          a context: accumulate gradients locally (gradient accumulation)
    sync.finish()           wait for communication; -> the Slots this rank updates
    sync.publish()          the model's weights from the updated masters
    sync.zero_grad()        drop this step's gradients
    sync.placements()       {name: Placement}: every cut of every parameter, the
                            synchroniser's own (which slot elements, held by how many
                            data-parallel ranks) added to the cuts it was given (tp, stage)
    sync.stats()            SyncStats: the communication the step waited for, the bytes
                            held, the comm hook's counters
    sync.in_flight()        the non-blocking collectives started and not yet waited for
                            (to measure a phase's traffic: wait for them, read the counter)

and a few facts as attributes: ``slots`` (the Slots, made once), ``norm_comms`` (groups over
which the slots are disjoint parts, summed in the global norm), ``comm_hook`` (what DDP runs
on a full bucket; None where there is none), ``flat_grads()`` (every master gradient in one
buffer, or None).  ``to_named``/``from_named`` turn per-slot arrays into {name: full array}
and back (layout-free optimizer state; collective).

The base class enforces the contract: a subclass that leaves out one of the abstract
methods cannot be built (``TypeError`` at construction, naming the method).
"""
from __future__ import annotations

import abc
from dataclasses import dataclass, field, replace

from minipar.optim import decays
from minipar.parallel.placement import Placement, SlotRange
from minipar.parallel.sync.slots import bucket_mask


@dataclass(frozen=True)
class SyncStats:
    """What a synchroniser reports after a step."""
    exposed_comm_s: float             # time the step waited for communication
    memory: dict                      # {"params", "grads", "optimizer"} bytes held here
    comm: dict = field(default_factory=dict)   # the comm hook's counters (compression)


class GradSync(abc.ABC):
    """Base of DDPSync, ZeroSync and Zero3Sync; see the module docstring."""

    norm_comms = ()          # every replica holds every gradient: nothing to sum over dp
    comm_hook = None         # DDP's hook on a full bucket (compression replaces it)

    def __init__(self, module, comm, table=None, mean_over=None):
        """``table``: {name: Placement} with the cuts made before this synchroniser (tp,
        pipeline stage); None: every parameter whole on this rank.  ``mean_over``: the
        ranks whose mean gradient the step wants, ``comm.size`` unless another group's
        ranks contribute to these gradients too (expert parallelism: ``sync/experts.py``)."""
        self.module, self.comm = module, comm
        self.mean_over = mean_over or comm.size
        named = [(n, p) for n, p in module.named_parameters() if p.requires_grad]
        self.names = {id(p): n for n, p in named}       # id(param) -> global name
        self.params = [p for _, p in named]
        self.table = table if table is not None else {
            n: Placement(n, tuple(p.shape)) for n, p in named}
        self.exposed_comm_s = 0.0

    # ------------------------------------------------------------ the contract
    @abc.abstractmethod
    def no_sync(self):
        """A context manager: backward inside it accumulates without communicating."""

    @abc.abstractmethod
    def finish(self):
        """Complete this step's communication; returns ``self.slots`` with their grads."""

    @abc.abstractmethod
    def publish(self):
        """Make the model's weights from the (updated) masters."""

    @abc.abstractmethod
    def zero_grad(self):
        """Drop the gradients of this step."""

    @abc.abstractmethod
    def slot_ranges(self):
        """{name: SlotRange} of the parameters whose elements this rank's slots hold."""

    @abc.abstractmethod
    def memory_bytes(self):
        """{"params", "grads", "optimizer"}: bytes this rank holds (masters count as the
        optimizer's, as in the ZeRO paper; the step adds its m and v)."""

    @abc.abstractmethod
    def to_named(self, arrays):
        """{name: full host array} from per-slot ``arrays`` (masters, m, v).  Collective."""

    @abc.abstractmethod
    def from_named(self, named):
        """Per-slot arrays from {name: full array}: the inverse of ``to_named``."""

    @abc.abstractmethod
    def in_flight(self):
        """The handles of this synchroniser's collectives still running (each has ``wait()``)."""

    # ------------------------------------------------------------ shared by every form
    def placements(self):
        """{name: Placement}: the cuts this synchroniser was given, and its own."""
        return {name: replace(self.table[name], owned=cut)
                for name, cut in self.slot_ranges().items()}

    def stats(self):
        comm = self.comm_hook.pop_stats() if hasattr(self.comm_hook, "pop_stats") else {}
        return SyncStats(self.exposed_comm_s, self.memory_bytes(), comm)

    def flat_grads(self):
        """(buffer, ends, norm weights): every master gradient in one device array, for the
        optimizer step's one-launch unscale, check and norm; None where there is none."""
        return None

    def slot_facts(self, bucket, dtype, lo=0, hi=None):
        """(decay, norm weight, tp-partial) of elements [lo, hi) of ``bucket``, read from
        the placements: a scalar where every parameter there agrees, else a per-element
        mask (``slots.Slot``)."""
        hi = bucket.padded if hi is None else hi
        inside = [self.table[self.names[id(p)]] for p, _, _ in bucket.ranges(lo, hi)]
        def mask(value_of, kind=dtype):
            return bucket_mask(bucket, self.names, value_of, kind, lo, hi)
        decay = mask(lambda n, p: 1.0 if decays(n, p) else 0.0)
        weights = {pl.norm_weight for pl in inside}
        norm = weights.pop() if len(weights) == 1 else mask(lambda n, p: self.table[n].norm_weight)
        partial = False                   # a bool mask only where some parameter is partial
        if any(pl.tp_partial_grad for pl in inside):
            partial = mask(lambda n, p: self.table[n].tp_partial_grad, bool)
        return decay, norm, partial
