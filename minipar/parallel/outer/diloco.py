"""DiLoCo's outer step, and its streaming form.

DiLoCo (Douillard et al., 2023), Algorithm 1, for G groups (here: groups of
data-parallel ranks, each with any inner layout):

    θ⁽⁰⁾ the initial weights, on every group
    for outer step t = 1 … T:
        for each group g (in parallel):
            θ_g ← θ⁽ᵗ⁻¹⁾
            H inner steps of AdamW on the group's own data      (the inner state is kept
                                                                 from one outer step to
                                                                 the next)
            Δ_g ← θ⁽ᵗ⁻¹⁾ − θ_g                                  the pseudo-gradient
        Δ ← (1/G) Σ_g Δ_g                                       one all-reduce across groups
        θ⁽ᵗ⁾ ← OuterOpt(θ⁽ᵗ⁻¹⁾, Δ)

with OuterOpt SGD with Nesterov momentum μ and rate η, exactly as
``torch.optim.SGD(nesterov=True)`` computes it (no dampening, no weight decay):

    b ← μ·b + Δ            (b starts at 0, so the first b is Δ)
    θ ← θ − η·(Δ + μ·b)

At η = 1, μ = 0 the outer step is θ ← θ_avg: one group is then the plain run.

**Streaming DiLoCo** (Douillard et al., 2025) cuts the model into F fragments (here:
consecutive blocks; the embeddings join the first fragment, the final norm and head the
last).  Fragment f is sent after inner steps s with (s − (f+1)·H/F) mod H = 0 — the last
fragment at multiples of H, like plain DiLoCo — so at most one fragment is in flight and
the bytes per step are spread out.  Its all-reduce runs on the communicator's progress
thread while τ more inner steps run (``outer_delay``); then the outer step is taken for
that fragment and the late global weights are mixed into the group's, which moved on
meanwhile (``outer_mixing`` α):

    θ_g,f ← α·θ_g,f + (1 − α)·θ_f⁽ᵗ⁾

The last step of a run synchronises every fragment at once (no delay, no mixing), so a
run ends with one model.

**Compression** (``outer_compression``): the pseudo-gradient is sent as fp16/bf16 or
int8 with a scale per 256 elements (``parallel/sync/compression``), all-gathered and
summed in group order in full precision, with error feedback: a rank sends C(Δ + e) and keeps
e ← Δ + e − C(Δ + e), so what is not sent now is sent later.

**Where the state lives.**  The outer state — θ⁽ᵗ⁻¹⁾ and b — is kept for the elements
this rank's optimizer updates (its slots: ``GradSync.slot_ranges``).  Where the inner
layout replicates them (DDP: every inner replica holds every element), the r-th of the
p replicas keeps and sends only the r-th of p chunks, then the group all-gathers the new
weights: each element crosses the slow link once per place, not p times.  Under ZeRO each
rank already holds its own shard.  Every operation is elementwise and the sum over groups
is in group order, so the result does not depend on the inner layout.
"""
from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Any

import numpy as np

from minipar import backend
from minipar.backend import to_host, xp
from minipar.comm import all_gather, all_reduce, chunk_bounds, chunk_sizes
from minipar.comm.nonblocking import submit


def nesterov_step(theta, delta, momentum_buffer, lr, momentum):
    """One step of SGD with Nesterov momentum, in place, as PyTorch computes it:
    b ← μ·b + Δ;  θ ← θ − η·(Δ + μ·b)."""
    if momentum:
        momentum_buffer *= momentum
        momentum_buffer += delta
        theta -= lr * (delta + momentum * momentum_buffer)
    else:
        theta -= lr * delta


def fragment_of(name, n_layer, fragments):
    """The fragment of a parameter: block i -> ⌊i·F/L⌋; the embeddings join the first
    fragment, everything after the blocks (final norm, head) the last."""
    found = re.match(r"blocks\.(\d+)\.", name)
    if found:
        return int(found.group(1)) * fragments // n_layer
    return 0 if name.split(".")[0] in ("wte", "wpe") else fragments - 1


def send_step(fragment, fragments, inner_steps):
    """The inner step count s (1-based, mod H) after which ``fragment`` is sent."""
    return (fragment + 1) * inner_steps // fragments % inner_steps


@dataclass
class Fragment:
    """The elements of one fragment this rank holds, and its outer state."""
    index: int
    entries: list                 # (slot, start, length): slot elements [start, start+length)
    size: int                     # their count
    lo: int                       # this rank's chunk [lo, hi) of them (replicated inner layout)
    hi: int
    theta: Any = None             # θ⁽ᵗ⁻¹⁾ of the chunk: the global weights
    momentum: Any = None          # the outer Nesterov buffer b of the chunk
    in_flight: Any = None         # (handle, step to apply at) while its all-reduce runs


class DiLoCo:
    """The outer loop of a run over ``groups`` (``carve_groups``): ``after_step(step)``
    after each inner optimizer step takes the outer steps that are due.

    ``sync``: the group's gradient synchroniser (its slots hold the weights this rank
    updates); ``config``: the run's config (its Outer section and ``n_layer``)."""

    def __init__(self, sync, groups, config, n_layer):
        self.sync, self.groups = sync, groups
        self.outer = groups.outer
        self.H = config.inner_steps
        self.lr, self.mu = config.outer_lr, config.outer_momentum
        self.F = config.diloco_fragments
        self.delay = config.outer_delay if self.F > 1 else 0
        self.mixing = config.outer_mixing if self.F > 1 else 0.0
        self.last_step = config.steps - 1
        self.compressor = make_compressor(config.outer_compression)
        self.counted = self.outer.bytes_sent     # bytes across groups already reported
        ranges = sync.slot_ranges()
        self.replicated = any(r.dp_replicas > 1 for r in ranges.values())
        self.replicas = sync.comm.size if self.replicated else 1
        self.replica = sync.comm.rank if self.replicated else 0
        per_fragment = [[] for _ in range(self.F)]
        for name, r in ranges.items():
            if r.hi > r.lo:
                per_fragment[fragment_of(name, n_layer, self.F)].append((r.slot, r.start, r.hi - r.lo))
        self.fragments = []
        for f, entries in enumerate(per_fragment):
            entries.sort()
            size = sum(n for _, _, n in entries)
            b = chunk_bounds(size, self.replicas)
            frag = Fragment(f, entries, size, b[self.replica], b[self.replica + 1])
            frag.theta = self.gather(frag)
            frag.momentum = xp.zeros_like(frag.theta)
            self.fragments.append(frag)

    # ------------------------------------------------------------ the weights
    def gather(self, frag):
        """This rank's chunk of the fragment's current (group) weights, a new array."""
        slots = self.sync.slots
        parts = [slots[i].master[s:s + n] for i, s, n in frag.entries]
        if not parts:
            return xp.zeros(0, dtype=self.sync.slots[0].master.dtype)
        return xp.concatenate(parts)[frag.lo:frag.hi].copy()

    def scatter(self, frag, chunk):
        """Write the new weights of this rank's chunk into the slots (replicated: the
        group all-gathers every replica's chunk first), then publish them."""
        if self.replicated:
            chunk = all_gather(self.sync.comm, chunk, sizes=chunk_sizes(frag.size, self.replicas))
        offset = 0
        for i, s, n in frag.entries:
            self.sync.slots[i].master[s:s + n] = chunk[offset:offset + n]
            offset += n

    # ------------------------------------------------------------ the outer step
    def due(self, step):
        """The fragments to send after inner step ``step`` (0-based)."""
        s = (step + 1) % self.H
        return [f for f in self.fragments if send_step(f.index, self.F, self.H) == s]

    def after_step(self, step, group_loss):
        """Take the outer steps due after inner step ``step`` (0-based): apply what lands
        now, send what is due; at the run's last step, everything synchronously.
        ``group_loss``: this group's loss of the step.  Returns the log's fields:

            outer_step   whether an outer step was applied (to any fragment)
            fragments    the fragments applied (streaming)
            group_loss, loss_global   this group's loss and the mean over groups
            outer_bytes  bytes every rank sent to other groups since the last outer
                         step (its all-reduces, and the previous step's sum of the loss)

        The global mean and the byte count ride one all-reduce across the groups and
        one inside each group, at outer steps only."""
        applied = []
        for frag in self.fragments:
            if frag.in_flight is not None and (frag.in_flight[1] == step or step == self.last_step):
                self._apply(frag, frag.in_flight[0].wait(), mix=self.mixing)
                applied.append(frag.index)
        if step == self.last_step:
            for frag in self.fragments:
                self._apply(frag, self._reduce(frag), mix=0.0)
            applied = [f.index for f in self.fragments]
        else:
            for frag in self.due(step):
                if self.delay == 0:
                    self._apply(frag, self._reduce(frag), mix=0.0)
                    applied.append(frag.index)
                else:
                    frag.in_flight = (self._reduce(frag, wait=False), step + self.delay)
        if not applied:
            return {"outer_step": False}
        self.sync.publish()
        total_loss, sent = self._sum_over_groups(group_loss)
        return {"outer_step": True, "fragments": sorted(set(applied)), "group_loss": group_loss,
                "loss_global": total_loss / self.groups.count, "outer_bytes": sent}

    def _sum_over_groups(self, group_loss):
        """(Σ_g loss_g, bytes all ranks sent across groups since the last call): the loss
        and this rank's count summed over the groups (across the link), then the counts
        summed over the places of a group (inside it)."""
        now = self.outer.bytes_sent
        mine, self.counted = now - self.counted, now   # this sum's own bytes: the next count
        value = backend.to_device(np.array([group_loss, mine], dtype=np.float64))
        summed = to_host(all_reduce(self.outer, value))
        total = to_host(all_reduce(self.groups.members, backend.to_device(summed[1:].copy())))
        return float(summed[0]), int(total[0])

    def _reduce(self, frag, wait=True):
        """(1/G) Σ_g Δ_g of this rank's chunk of ``frag``: Δ = θ⁽ᵗ⁻¹⁾ − θ_g, averaged
        over the groups (compressed, with error feedback, when asked)."""
        delta = frag.theta - self.gather(frag)
        handle = submit(self.outer, self.compressor, delta, frag.index)
        return handle.wait() if wait else handle

    def _apply(self, frag, average, mix):
        """The outer Nesterov step on θ with the averaged pseudo-gradient, then the
        group's weights ← θ (mixed: α·current + (1−α)·θ)."""
        nesterov_step(frag.theta, average, frag.momentum, self.lr, self.mu)
        new = frag.theta if not mix else mix * self.gather(frag) + (1.0 - mix) * frag.theta
        self.scatter(frag, new)
        frag.in_flight = None

    # ------------------------------------------------------------ checkpoints
    def slot_momentum(self):
        """Per slot, a host array shaped like it holding the outer momentum b at its
        elements (0 elsewhere), as the optimizer's m and v are: the checkpoint cuts it into
        the same global boxes.  Collective over the group's data-parallel ranks where
        they each keep a chunk (a replicated inner layout)."""
        slots = self.sync.slots
        out = [np.zeros(s.master.size, dtype=to_host(s.master.reshape(-1)[:0]).dtype) for s in slots]
        for frag in self.fragments:
            whole = frag.momentum
            if self.replicated:
                whole = all_gather(self.sync.comm, whole, sizes=chunk_sizes(frag.size, self.replicas))
            whole, offset = to_host(whole), 0
            for i, s, n in frag.entries:
                out[i][s:s + n] = whole[offset:offset + n]
                offset += n
        return out

    def load_slot_momentum(self, arrays):
        """The inverse of ``slot_momentum``: this rank's chunk of b from slot-shaped
        arrays (θ is the weights the run resumed with: a checkpoint is written at an
        outer step, where they are the global weights)."""
        for frag in self.fragments:
            if not frag.entries:
                continue
            whole = np.concatenate([arrays[i][s:s + n] for i, s, n in frag.entries])
            frag.momentum[...] = backend.to_device(whole[frag.lo:frag.hi])
            frag.theta = self.gather(frag)

    def memory_bytes(self):
        """The outer state held here: θ and b of every fragment's chunk."""
        return sum(f.theta.nbytes + f.momentum.nbytes for f in self.fragments)


# ------------------------------------------------------------ what crosses the link
class _Dense:
    """The plain average: all-reduce of Δ, then / G."""
    name = "none"

    def __call__(self, ctx, delta, index):
        total = all_reduce(ctx, delta) if delta.size else delta
        total *= 1.0 / ctx.size
        return total


class _Cast:
    """Δ + e rounded to half and all-gathered; every rank sums the groups' halves in group
    order in full precision (a sum in half would round again, beyond what e keeps);
    e keeps what the rounding lost."""

    def __init__(self, name):
        self.name = name
        self.dtype = backend.dtype_of(name)
        self.residual = {}

    def __call__(self, ctx, delta, index):
        x = delta + self.residual.get(index, 0.0)
        half = x.astype(self.dtype)
        self.residual[index] = x - half.astype(x.dtype)
        if not x.size:
            return x
        everyone = all_gather(ctx, half, sizes=[x.size] * ctx.size)
        total = xp.zeros_like(x)
        for r in range(ctx.size):
            total += everyone[r * x.size:(r + 1) * x.size].astype(x.dtype)
        total *= 1.0 / ctx.size
        return total


class _Int8:
    """Δ + e as int8 with a float32 scale per 256 elements, all-gathered and summed in
    group order (``compression.Int8Hook``, which keeps e per fragment)."""
    name = "int8"

    def __init__(self):
        from minipar.parallel.sync.compression import Int8Hook
        self.hook = Int8Hook(chunk=256, error_feedback=True)

    @property
    def residual(self):
        return self.hook.residual

    def __call__(self, ctx, delta, index):
        if not delta.size:
            return delta
        return self.hook.reduce(ctx, delta, index)


def make_compressor(name):
    """What sends a fragment's pseudo-gradient: ``fn(ctx, delta, fragment) -> average``."""
    if name == "none":
        return _Dense()
    if name in ("fp16", "bf16"):
        return _Cast(name)
    if name == "int8":
        return _Int8()
    raise ValueError(f"unknown outer compression {name!r}; choose none, fp16, bf16 or int8")
