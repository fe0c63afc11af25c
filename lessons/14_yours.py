"""Lesson 14's DiLoCo exercise on every rank: your outer step against minipar's.

    mpiexec -n 2 python lessons/14_yours.py --file MINE.py

``MINE.py`` defines ``MyDiLoCo(model, optimizer, comm, inner_steps, lr, momentum)`` with
``step()``, called after every inner AdamW step: every ``inner_steps`` calls it takes the
outer step.  Each of the 2 ranks is a group (``comm`` joins the groups): a small GPT in
float64, 3 outer steps of H = 4 inner steps, each group on its own half of every batch.
At every outer step the check runs minipar's ``parallel.outer.DiLoCo`` on the same
weights (the group's before your step, the global ones you started from) and compares:

- **weights**: after your step every parameter equals the library's (relative 1e-12),
  and is the same on both groups;
- **inner state kept**: AdamW's m, v and step count are what they were before the outer
  step (the next inner step continues them);
- **traffic**: the bytes each rank sent during your step are one all-reduce of the
  model's pseudo-gradient over the groups, 2(G-1)/G·S (minipar's ring or any algorithm
  that sends as much), and nothing between outer steps.
"""
import os
import sys
from types import SimpleNamespace

try:
    import minipar  # noqa: F401
except ImportError:  # run from a checkout without installing: use the repository root
    sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

import numpy as np

from minipar import backend
from minipar.backend import to_device, to_host
from minipar.nn import GPT, GPTConfig
from minipar.optim import AdamW
from minipar.parallel.outer import DiLoCo
from minipar.parallel.outer.groups import Groups
from minipar.parallel.placement import SlotRange
from minipar.parallel.sync.slots import Slot
from yours import main

CFG = GPTConfig(vocab_size=64, seq_len=16, n_layer=2, d_model=32, n_head=4)
H, OUTER_STEPS, LR, OUTER_LR, MU = 4, 3, 3e-3, 0.7, 0.9


def batch(step, group, rows=4):
    """Group ``group``'s rows of step ``step``: each group trains on its own data."""
    ids = np.random.default_rng([step, group]).integers(0, CFG.vocab_size, (rows, CFG.seq_len + 1))
    return ids[:, :-1], ids[:, 1:]


class LibraryWeights:
    """The library's DiLoCo over a copy of the model's weights: one slot per parameter."""

    def __init__(self, comm, named):
        self.comm = SimpleNamespace(size=1, rank=0)         # one rank per group
        self.names = [n for n, _ in named]
        self.slots = [Slot(master=to_device(to_host(p.data).reshape(-1).copy())) for _, p in named]

    def slot_ranges(self):
        return {n: SlotRange(i, 0, s.master.size, 0) for i, (n, s) in enumerate(zip(self.names, self.slots))}

    def publish(self):
        pass


def check(comm, MyDiLoCo):
    backend.set_default_dtype(np.float64)
    g = comm.rank
    model = GPT(CFG, seed=0)
    named = list(model.named_parameters())
    opt = AdamW(named, lr=LR)
    mine = MyDiLoCo(model, opt, comm, H, OUTER_LR, MU)
    library = LibraryWeights(comm, named)
    config = SimpleNamespace(inner_steps=H, outer_lr=OUTER_LR, outer_momentum=MU, diloco_fragments=1,
                             outer_delay=0, outer_mixing=0.0, steps=H * OUTER_STEPS + 1,
                             outer_compression="none")
    ours = DiLoCo(library, Groups(inner=None, outer=comm, members=comm, group=g, count=comm.size),
                  config, CFG.n_layer)
    S = sum(to_host(p.data).nbytes for _, p in named)
    for step in range(H * OUTER_STEPS):
        x, y = batch(step, g)
        _, loss = model(to_device(x), to_device(y))
        loss.backward()
        opt.step()
        opt.zero_grad()
        inner_state = {n: (to_host(s["m"]).copy(), to_host(s["v"]).copy())
                       for n, s in opt.state.items()}
        count = opt.step_count
        for slot, (_, p) in zip(library.slots, named):       # the group's weights, now
            slot.master[...] = p.data.reshape(-1)
        before = comm.bytes_sent
        mine.step()
        sent = comm.bytes_sent - before
        outer = (step + 1) % H == 0
        if not outer:
            assert sent == 0, (f"inner step {step}: your step() sent {sent} bytes; only every "
                               f"{H}th call (the outer step) may send anything")
            continue
        t = (step + 1) // H
        ours.after_step(step, 0.0)                           # the library's outer step
        for (name, p), slot in zip(named, library.slots):
            got, want = to_host(p.data).reshape(-1), to_host(slot.master)
            scale = np.abs(want).max()
            assert np.abs(got - want).max() <= 1e-12 * scale, (
                f"outer step {t}, {name}: your weights differ from the library's by "
                f"{np.abs(got - want).max() / scale:.1e} relative (pseudo-gradient θ_global − θ_group, "
                "averaged over the groups, Nesterov: b ← μb + Δ, θ ← θ − lr·(Δ + μb); then the model "
                "takes θ)")
            other = comm.mpi.bcast(got, root=0)
            assert np.array_equal(got, other), f"outer step {t}, {name}: the groups' weights differ"
        for name, (m0, v0) in inner_state.items():
            m, v = to_host(opt.state[name]["m"]), to_host(opt.state[name]["v"])
            assert np.array_equal(m, m0) and np.array_equal(v, v0), (
                f"outer step {t}, {name}: AdamW's m or v changed in the outer step; keep the "
                "inner optimizer's state (DiLoCo's groups continue it)")
        assert opt.step_count == count, f"outer step {t}: AdamW's step count changed"
        ring = 2 * (comm.size - 1) / comm.size * S
        assert sent >= ring * 0.999 and sent <= ring * 1.001 + 64, (
            f"outer step {t}: each rank sent {sent} bytes; one all-reduce of the pseudo-gradient "
            f"(S = {S} bytes over {comm.size} groups) sends 2(G-1)/G·S = {ring:.0f}")
        if g == 0:
            print(f"outer step {t}: weights = the library's, AdamW's state kept, "
                  f"{sent} bytes sent = 2(G-1)/G·S", flush=True)


if __name__ == "__main__":
    main(__doc__, check, "MyDiLoCo")
