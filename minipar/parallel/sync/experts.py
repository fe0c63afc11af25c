"""Expert parallelism's synchroniser: two synchronisers of the same form, one per group.

Under expert parallelism (``parallel/experts.py``) a rank's parameters fall in two
sets that are replicated over different ranks:

    dense weights (attention, norms, router, shared experts, embeddings)
        the same on every data-parallel rank: reduced over ``dp_cp_comm``
    routed experts (E/ep of each MoE block)
        the same on the dp·cp/ep ranks holding those experts: reduced over ``edp_comm``,
        divided by dp·cp (every rank's tokens reach them through the all-to-all), not by
        the group's own size

``ExpertSplitSync`` holds one synchroniser of the run's form (DDP, ZeRO-1/2/3) for each
set and is the ``GradSync`` the step sees: its slots are the dense slots, then the
expert slots; its cuts are theirs (the expert slots' indices after the dense ones).
Under ZeRO-3 each set's units are sharded over its own group: a MoE block is two
units, its dense weights and its experts, gathered one inside the other
(``NestedUnits``), so backward frees and reduce-scatters each in its own group.

The global norm sums over the whole data-parallel group once (``norm_comms``), so each
element must count once there: a slot replicated over its own group (DDP: every rank of
it holds the whole gradient) weighs 1/(that group's size); a ZeRO shard, held by one
rank, weighs 1.  Experts held by different ep ranks are different elements.
"""
from __future__ import annotations

import contextlib
from dataclasses import replace

from minipar.parallel.sync.base import GradSync


class ParameterSubset:
    """A module's parameters whose names ``keep``: what one part synchronises."""

    def __init__(self, module, keep):
        self.module, self.keep = module, keep
        self.config = getattr(module, "config", None)   # the model's (ZeRO-3 reads tie_weights)

    def named_parameters(self, prefix=""):
        return ((n, p) for n, p in self.module.named_parameters(prefix) if self.keep(n))

    def parameters(self):
        return [p for _, p in self.named_parameters()]


class ExpertSplitSync(GradSync):
    """``dense`` over the data-parallel group ``comm``, ``experts`` over the ranks
    holding the same experts; see the module docstring."""

    def __init__(self, module, comm, table, dense, experts, expert_unit_of=None):
        super().__init__(module, comm, table)
        self.expert_unit_of = expert_unit_of     # ZeRO-3: unit index -> expert unit index
        self.parts = (dense, experts)
        self.slots = dense.slots + experts.slots
        self.norm_comms = (comm,)
        for part in self.parts:
            if not part.norm_comms:          # replicated over its group: count it once
                for slot in part.slots:
                    slot.norm_weight = slot.norm_weight * (1.0 / part.comm.size)

    def wrap(self, model):
        """ZeRO-3: the model run unit by unit, each MoE block's two units nested."""
        from minipar.parallel.sync.zero3 import Zero3Model
        dense, experts = self.parts
        return Zero3Model(model, NestedUnits(dense, experts, self.expert_unit_of))

    def no_sync(self):
        stack = contextlib.ExitStack()
        for part in self.parts:
            stack.enter_context(part.no_sync())
        return stack

    def finish(self):
        for part in self.parts:
            part.finish()
        self.exposed_comm_s = sum(part.exposed_comm_s for part in self.parts)
        return self.slots

    def publish(self):
        for part in self.parts:
            part.publish()

    def zero_grad(self):
        for part in self.parts:
            part.zero_grad()

    def in_flight(self):
        return [h for part in self.parts for h in part.in_flight()]

    def slot_ranges(self):
        dense, experts = self.parts
        out = dict(dense.slot_ranges())
        shift = len(dense.slots)
        out.update({n: replace(r, slot=r.slot + shift) for n, r in experts.slot_ranges().items()})
        return out

    def memory_bytes(self):
        totals = {}
        for part in self.parts:
            for key, value in part.memory_bytes().items():
                totals[key] = totals.get(key, 0) + value
        return totals

    def to_named(self, arrays):
        """{name: full host array}: the dense weights' and this rank's experts'.
        Collective over both groups."""
        dense, experts = self.parts
        cut = len(dense.slots)
        return {**dense.to_named(arrays[:cut]), **experts.to_named(arrays[cut:])}

    def from_named(self, named):
        return [a for part in self.parts for a in part.from_named(named)]


def split_units(units, is_expert):
    """ZeRO-3's units (parameter lists in forward order, ``zero3.model_units``) split in
    two: every unit's dense parameters, and the non-empty expert parts with the index of
    the unit each came from: (dense units, expert units, {unit index: expert unit index})."""
    dense, experts, expert_unit_of = [], [], {}
    for i, unit in enumerate(units):
        dense.append([p for p in unit if not is_expert(p)])
        mine = [p for p in unit if is_expert(p)]
        if mine:
            expert_unit_of[i] = len(experts)
            experts.append(mine)
    return dense, experts, expert_unit_of


class NestedUnits:
    """ZeRO-3's ``run_unit`` over the two synchronisers: unit i's dense weights gathered
    around its experts' (``Zero3Model`` calls it unit by unit)."""

    def __init__(self, dense, experts, expert_unit_of):
        self.dense, self.experts, self.expert_unit_of = dense, experts, expert_unit_of

    def run_unit(self, i, fn, x):
        j = self.expert_unit_of.get(i)
        if j is None:
            return self.dense.run_unit(i, fn, x)
        return self.dense.run_unit(i, lambda y: self.experts.run_unit(j, fn, y), x)
