"""Lesson 08's exercise on every rank: your 1F1B stage executor, timed against the simulator.

    mpiexec -n 3 python lessons/08_yours.py --file MINE.py [--json FILE]

``MINE.py`` defines ``run_stage(comm, stage, actions)``: run this rank's list of 1F1B
actions, receiving activations from the previous stage and gradients from the next with
``comm.recv``, sending them on with ``comm.send``.  Stage s is one layer
h ← tanh(h·W_s); the last stage's loss per micro-batch is ½‖h − t‖²/rows, averaged over
the m micro-batches.  The check's ``Stage`` does the arithmetic and times it: every
forward sleeps T_F and every backward T_B on top of the (tiny) compute, so the run has
the simulator's costs.  It checks:

- **order**: the F and B this rank ran are its 1F1B list, in order;
- **memory**: the activations kept for backward (``saved``, watched by weak reference)
  never cover more micro-batches than 1F1B's p − r on rank r;
- **parity**: every stage's weight gradient and the mean loss equal one process's on
  the whole batch (float64, relative 1e-10);
- **timeline**: the measured makespan is within 50 % of ``simulate``'s for the same
  schedule and costs (messages and Python are not free, so a little above; a machine
  shared with other work adds more).  An executor that waits where the schedule lets it
  work — a barrier before every action, say — took 1.6x the simulated time here.

``--json``: rank 0 writes the measured spans and the simulated ones, for drawing.
"""
import json
import os
import sys
import time
import weakref

try:
    import minipar  # noqa: F401
except ImportError:  # run from a checkout without installing: use the repository root
    sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

import numpy as np

from minipar import backend
from minipar.backend import to_device, to_host, xp
from minipar.parallel.pipeline import build_schedule, simulate
from yours import main, tanh_stack

D, ROWS, MICRO, T_F, T_B = 32, 4, 4, 0.03, 0.06


def batch():
    rng = np.random.default_rng(7)
    return rng.normal(size=(MICRO, ROWS, D)), rng.normal(size=(MICRO, ROWS, D))


class Saved:
    """What a stage keeps of one micro-batch's forward for its backward."""

    def __init__(self, x, y):
        self.x, self.y = x, y


class Stage:
    """One layer h ← tanh(h·W) of the pipeline, timed, with its stash watched."""

    def __init__(self, comm, W):
        self.rank, self.p = comm.rank, comm.size
        self.first, self.last, self.shape = self.rank == 0, self.rank == self.p - 1, (ROWS, D)
        self.W, self.dW = to_device(W), xp.zeros_like(to_device(W))
        self.inputs, self.targets = batch()
        self.spans, self.losses, self.live, self.peak = [], {}, 0, 0
        self.t0 = time.perf_counter()

    def input(self, i):
        assert self.first, f"stage.input() is the first stage's; this is stage {self.rank}"
        return to_device(self.inputs[i])

    def forward(self, x, i):
        start = time.perf_counter()
        y = xp.tanh(x @ self.W)
        saved = Saved(x, y)
        self.live += 1
        self.peak = max(self.peak, self.live)
        weakref.finalize(saved, self._dropped)
        time.sleep(T_F)
        self.spans.append(("F", i, start - self.t0, time.perf_counter() - self.t0))
        return y, saved

    def _dropped(self):
        self.live -= 1

    def loss(self, i, y):
        assert self.last, f"stage.loss() is the last stage's; this is stage {self.rank}"
        diff = y - to_device(self.targets[i])
        self.losses[i] = 0.5 * float(xp.sum(diff * diff)) / ROWS / MICRO
        return diff / ROWS / MICRO

    def backward(self, saved, dy, i):
        start = time.perf_counter()
        dz = dy * (1 - saved.y * saved.y)
        self.dW += saved.x.T @ dz
        time.sleep(T_B)
        self.spans.append(("B", i, start - self.t0, time.perf_counter() - self.t0))
        return dz @ self.W.T


def one_process(weights):
    """The oracle: all layers in one process, the whole batch; (loss, [dL/dW_s])."""
    xs, ts = batch()
    return tanh_stack(weights, xs.reshape(-1, D), ts.reshape(-1, D))


def check(comm, run_stage, json_path):
    backend.set_default_dtype(np.float64)
    p, r = comm.size, comm.rank
    weights = [np.random.default_rng(s).normal(0, 1 / np.sqrt(D), (D, D)) for s in range(p)]
    schedule = build_schedule("1f1b", p, MICRO)
    stage = Stage(comm, weights[r])
    comm.barrier()
    stage.t0 = time.perf_counter()
    run_stage(comm, stage, list(schedule[r]))
    comm.barrier()
    ran = [f"{k}{i}" for k, i, _, _ in stage.spans]
    want = [repr(a) for a in schedule[r]]
    assert ran == want, f"ran {' '.join(ran) or 'nothing'}; this rank's 1F1B list is {' '.join(want)}"
    assert stage.peak <= min(p - r, MICRO), (
        f"kept the activations of {stage.peak} micro-batches at once; 1F1B keeps at most "
        f"p - r = {min(p - r, MICRO)} on rank {r}: a micro-batch's can go once its backward has run")
    want_loss, grads = one_process(weights)
    err = np.abs(to_host(stage.dW) - grads[r]).max() / np.abs(grads[r]).max()
    assert err <= 1e-10, (f"stage {r}'s weight gradient, summed over the micro-batches, differs "
                          f"from one process's by {err:.1e} relative")
    if stage.last:
        loss = sum(stage.losses.values())
        assert abs(loss - want_loss) <= 1e-12 * want_loss, f"loss {loss!r}, one process {want_loss!r}"
    spans = comm.mpi.gather(stage.spans, root=0)
    if r == 0:
        sim = simulate(schedule, p, t_f=T_F, t_b=T_B)
        start = min(s[2] for rank in spans for s in rank)
        measured = max(s[3] for rank in spans for s in rank) - start
        busy = sum(s[3] - s[2] for rank in spans for s in rank)
        assert measured <= 1.5 * sim.makespan, (
            f"the pipeline took {measured * 1e3:.0f} ms, the simulator says {sim.makespan * 1e3:.0f} ms for this "
            f"schedule: some rank waited where the schedule lets it work — per rank, the spans were "
            + "; ".join(f"rank {k}: " + " ".join(f"{kind}{i}@{(a - start) * 1e3:.0f}" for kind, i, a, _ in s)
                        for k, s in enumerate(spans)))
        print(f"order, memory and gradients as the library's; makespan {measured * 1e3:.0f} ms measured, "
              f"{sim.makespan * 1e3:.0f} ms simulated; bubble {1 - busy / (p * measured):.3f} measured, "
              f"{sim.bubble_fraction:.3f} simulated = (p-1)/(m+p-1)", flush=True)
        if json_path:
            with open(json_path, "w") as f:
                json.dump({"measured": spans, "simulated": {k: [list(s) for s in v]
                                                            for k, v in sim.timelines.items()}}, f)


if __name__ == "__main__":
    main(__doc__, check, "run_stage",
         ("--json", "rank 0 writes the measured and simulated timelines here (optional)"))
