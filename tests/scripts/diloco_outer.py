"""DiLoCo's outer step against a NumPy reference of Algorithm 1 (mpiexec -n 4).

Four ranks form 2 groups of 2 data-parallel replicas.  The groups' weights are given:
each "inner step" adds a seeded perturbation per group (the same on both replicas of a
group), standing for H steps of AdamW.  After every step ``DiLoCo.after_step`` runs; the
weights it leaves are compared, step by step, with NumPy running Algorithm 1 on the
same groups' weights (Nesterov as torch.optim.SGD(nesterov=True): b ← μb + Δ,
θ ← θ − η(Δ + μb)), for:

    plain      H = 5, η = 0.7, μ = 0.9, replicated inner layout (each replica sends half)
    sharded    the same, each inner rank holding its own half (ZeRO's case)
    streaming  F = 2 fragments, τ = 1, α = 0.5

and, for int8 and bf16 outer compression, error feedback's identity at every outer step:
the average applied = (1/G) Σ_g (Δ_g + e_g − e_g'), what each group meant to send minus
what it kept for later.

Prints one line per case with the largest difference; exits 1 if any exceeds 1e-12.
"""
import sys
from types import SimpleNamespace

import numpy as np

from minipar.comm import Communicator
from minipar.parallel.grid import ProcessGrid
from minipar.parallel.outer import DiLoCo, carve_groups
from minipar.parallel.placement import SlotRange
from minipar.parallel.sync.slots import Slot

SIZES = {"wte.weight": 7, "blocks.0.w": 5, "blocks.1.w": 6, "lm_head.weight": 4}
N_LAYER, STEPS = 2, 23


class GivenWeights:
    """A synchroniser stand-in: one slot per parameter, replicated over the group's
    data-parallel ranks or cut in halves between them."""

    def __init__(self, comm, replicated, initial):
        self.comm, self.replicated = comm, replicated
        self.names = list(SIZES)
        self.cuts = {}
        for name in self.names:
            n = SIZES[name]
            lo, hi = (0, n) if replicated else ((0, n // 2) if comm.rank == 0 else (n // 2, n))
            self.cuts[name] = (lo, hi)
        self.slots = [Slot(master=initial[name][slice(*self.cuts[name])].copy()) for name in self.names]

    def slot_ranges(self):
        return {name: SlotRange(i, *self.cuts[name], 0, dp_replicas=self.comm.size if self.replicated else 1)
                for i, name in enumerate(self.names)}

    def publish(self):
        pass

    def full(self, name):
        return self.slots[self.names.index(name)].master


def perturbation(group, step, name):
    rng = np.random.default_rng([group, step, list(SIZES).index(name)])
    return 0.01 * rng.standard_normal(SIZES[name])


def reference(initial, H, lr, mu, F, delay, alpha, groups=2):
    """Algorithm 1 (streaming when F > 1) in NumPy on every group's weights; yields
    each group's weights after every step."""
    from minipar.parallel.outer.diloco import fragment_of, send_step
    frag = {name: fragment_of(name, N_LAYER, F) for name in SIZES}
    theta = {n: initial[n].copy() for n in SIZES}
    buf = {n: np.zeros(SIZES[n]) for n in SIZES}
    local = [{n: initial[n].copy() for n in SIZES} for _ in range(groups)]
    pending = {}                       # fragment -> (average Δ, step to apply)

    def outer(f, average, mix):
        for n in SIZES:
            if frag[n] != f:
                continue
            if mu:
                buf[n] = mu * buf[n] + average[n]
                theta[n] = theta[n] - lr * (average[n] + mu * buf[n])
            else:
                theta[n] = theta[n] - lr * average[n]
            for g in range(groups):
                local[g][n] = mix * local[g][n] + (1 - mix) * theta[n] if mix else theta[n].copy()

    def average(f):
        return {n: sum(theta[n] - local[g][n] for g in range(groups)) / groups
                for n in SIZES if frag[n] == f}

    for step in range(STEPS):
        for g in range(groups):
            for n in SIZES:
                local[g][n] = local[g][n] + perturbation(g, step, n)
        last = step == STEPS - 1
        for f, (avg, at) in sorted(pending.items()):
            if at == step or last:
                outer(f, avg, alpha if F > 1 else 0.0)
                del pending[f]
        if last:
            for f in range(F):
                outer(f, average(f), 0.0)
        else:
            for f in range(F):
                if send_step(f, F, H) == (step + 1) % H:
                    if delay == 0:
                        outer(f, average(f), 0.0)
                    else:
                        pending[f] = (average(f), step + delay)
        yield local


def run(case, replicated, F=1, delay=0, alpha=0.5):
    world = Communicator()
    grid = ProcessGrid(world, dp=4)
    groups = carve_groups(grid, 2)
    rng = np.random.default_rng(0)
    initial = {n: rng.standard_normal(SIZES[n]) for n in SIZES}
    sync = GivenWeights(groups.inner.dp_comm, replicated, initial)
    config = SimpleNamespace(inner_steps=5, outer_lr=0.7, outer_momentum=0.9, diloco_fragments=F,
                             outer_delay=delay, outer_mixing=alpha, steps=STEPS,
                             outer_compression="none")
    outer = DiLoCo(sync, groups, config, N_LAYER)
    worst = 0.0
    expected = reference(initial, 5, 0.7, 0.9, F, delay, alpha)
    for step in range(STEPS):
        for i, n in enumerate(sync.names):
            lo, hi = sync.cuts[n]
            sync.slots[i].master += perturbation(groups.group, step, n)[lo:hi]
        outer.after_step(step, 0.0)
        want = next(expected)[groups.group]
        for n in sync.names:
            lo, hi = sync.cuts[n]
            worst = max(worst, float(np.abs(sync.full(n) - want[n][lo:hi]).max()))
    worst = world.mpi.allreduce(worst, op=__import__("mpi4py.MPI", fromlist=["MPI"]).MAX)
    if world.rank == 0:
        print(f"{case}: max |minipar - numpy| = {worst:.3g}", flush=True)
    return worst


def error_feedback(method):
    """Compressed outer steps keep what they did not send: after every outer step, the
    average applied plus the mean of the new residuals equals the mean of Δ_g + e_g (the
    pseudo-gradients and the old residuals).  Returns the largest departure and the
    bytes all ranks sent across groups at each outer step."""
    world = Communicator()
    grid = ProcessGrid(world, dp=4)
    groups = carve_groups(grid, 2)
    rng = np.random.default_rng(0)
    initial = {n: rng.standard_normal(SIZES[n]) for n in SIZES}
    sync = GivenWeights(groups.inner.dp_comm, True, initial)
    config = SimpleNamespace(inner_steps=5, outer_lr=1.0, outer_momentum=0.0, diloco_fragments=1,
                             outer_delay=0, outer_mixing=0.0, steps=STEPS,
                             outer_compression=method)
    outer = DiLoCo(sync, groups, config, N_LAYER)
    frag = outer.fragments[0]
    worst, sent = 0.0, []
    for step in range(STEPS):
        for i, n in enumerate(sync.names):
            sync.slots[i].master += perturbation(groups.group, step, n)
        if (step + 1) % 5 and step != STEPS - 1:
            outer.after_step(step, 0.0)
            continue
        theta_before = frag.theta.copy()
        old = outer.compressor.residual.get(0, np.zeros_like(frag.theta)).copy()
        delta = theta_before - outer.gather(frag)
        record = outer.after_step(step, 0.0)
        applied = theta_before - frag.theta              # lr 1, no momentum: θ − θ' = average
        new = outer.compressor.residual[0]
        expected = groups.outer.mpi.allreduce(delta + old - new) / groups.count
        worst = max(worst, float(np.abs(applied - expected).max()))
        sent.append(record["outer_bytes"])
    return worst, sent


if __name__ == "__main__":
    results = [run("plain replicated", True), run("plain sharded", False),
               run("streaming F=2 tau=1 alpha=0.5", True, F=2, delay=1)]
    for method in ("int8", "bf16"):
        worst, sent = error_feedback(method)
        worst = Communicator().mpi.allreduce(worst, op=__import__("mpi4py.MPI", fromlist=["MPI"]).MAX)
        results.append(worst)
        if Communicator().rank == 0:
            print(f"{method} error feedback: max |applied - mean(delta + e - e')| = {worst:.3g}; "
                  f"bytes per outer step {sent[0]}", flush=True)
    sys.exit(0 if max(results) <= 1e-12 else 1)
