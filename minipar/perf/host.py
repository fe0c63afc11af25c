"""Ranks that share a host's cores: a step cannot be shorter than their work over the cores.

``estimate.predict`` follows one rank's critical path at the profile's compute rates, as
if the rank ran whenever its work is ready.  That holds while every rank has a core.
Where R ranks share C < R cores — a CPU machine running more ranks than cores, or the
simulated cluster (``minipar/cluster``: network namespaces of one machine, every node's
ranks on the same cores) — the cores must also run every other rank's work, and a rank's
idle time (a pipeline bubble, a wait on the wire) is not lost: another rank computes on
its core.  So

    step >= Σ_{r on the host} busy_r / C                       (the shared-core bound)
    busy_r = compute_r + optimizer + step overhead + sent_r / B

    compute_r   rank r's forwards and backwards of its micro-batches (its stage's layers,
                the first stage's embeddings, the last stage's head), collectives excluded
    sent_r      bytes rank r's collectives and pipeline sends move out of it: on a CPU
                the ranks move bytes themselves, and a transfer keeps the cores at both
                ends busy at B, the intra-node link's bandwidth, while the bytes that come
                in arrive (waiting for bytes on a wire is not work: a rank blocked on a
                receive gives its core to the others)

and the prediction is max(critical path, shared-core bound), where R > C.  R = ranks per
node × the profile's ``nodes_per_host`` (nodes whose ranks share one host's
``cores_per_node`` cores; 1 on a real cluster), at most the world size.  Where C >= R
each rank has a core and its critical path already holds its work: nothing changes there,
nor on a GPU (a spec profile: its ranks have their own devices).

A waiting rank that spins.  MPI's progress engine (MPICH over UCX, and minipar's
transport, which waits in it) polls: a rank blocked on a receive keeps its core busy, so
it gives nothing to the others.  Measured on the simulated cluster (2 nodes x 2 ranks on
2 cores): a rank in a 2 s receive used 2.03 s of CPU, and a small model's forward and
backward took 17.8 ms where the other two ranks slept, 35.7 ms where they spun in a
receive and 37-39 ms where they computed.  ``calibrate`` measures it (``wait_cpu_share``:
CPU seconds per second of a rank waiting in a receive).  Where waits spin, every rank is
runnable all step, the scheduler gives each C/R of a core, and every compute second on
the critical path takes R/C seconds, times what sharing costs beyond splitting the time
(``compute_slowdown``, ``sharing_excess``).  The rates are then timed on one rank with
the others asleep (a core to itself): timed on every rank at once they had landed
anywhere between a core's and half of one (GEMMs of 110 and of 225 GFLOP/s in two
profiles of the same cluster).  The bound above stays for hosts whose waits sleep (a
rank blocked on a wire gives its core to the others).

Every rank is counted with the mean stage's work (the pipeline's stages differ by the
embeddings and the head only); its bytes, per micro-batch of b·s·h activations A:

    tensor parallel   4 all-reduces a layer + 2 at the edges (per stage, 2/pp), each
                      2(t-1)/t · A out (sequence parallel: the same bytes)
    pipeline          2(p-1)/p sends of A a micro-batch (activations on, gradients back)
    data parallel     2(d-1)/d · G out for the gradients G (all-reduce; ZeRO-1/2's
                      reduce-scatter + all-gather), 3(d-1)/d · G per micro-batch for ZeRO-3
"""
from __future__ import annotations

import os
import time

import numpy as np

from minipar.process.threads import host_id


def ranks_sharing_cores(prof, ranks_per_node, world):
    """Ranks whose work the host's ``prof.cores_per_node`` cores run (R above)."""
    return min(max(int(ranks_per_node), 1) * max(prof.nodes_per_host, 1), world)


def sent_bytes(config, layers, act_bytes, grad_bytes):
    """Bytes one rank's transfers move out of it in one step (sent_r above).
    ``layers``: the rank's layers; ``act_bytes``: one micro-batch's b·s·h activations;
    ``grad_bytes``: the rank's gradients (ZeRO-3: its units' weights)."""
    m = config.microbatches if config.pipelined else config.grad_accum
    tp, pp, dp = config.tp, config.pp, config.dp
    out = 0.0
    if tp > 1:
        out += m * (4 * layers + 2 / pp) * 2 * (tp - 1) / tp * act_bytes
    if pp > 1:
        out += m * 2 * (pp - 1) / pp * act_bytes / (tp if config.sequence_parallel else 1)
    if dp > 1:
        out += (3 * m if config.zero == 3 else 2) * (dp - 1) / dp * grad_bytes
    return out


def shared_core_bound(prof, ranks_per_node, world, busy_s, sent):
    """Seconds the host's cores need for the work of the ranks sharing them: R ranks of
    ``busy_s`` seconds of their own work and ``sent`` bytes out each, over
    ``prof.cores_per_node`` cores.  0 where each rank has a core (the critical path
    already holds its work) or the profile knows no core count (spec)."""
    ranks = ranks_sharing_cores(prof, ranks_per_node, world)
    if prof.kind == "spec" or not prof.cores_per_node or ranks <= prof.cores_per_node:
        return 0.0
    _, copy_bw = prof.link("intra")
    return ranks * (busy_s + sent / copy_bw) / prof.cores_per_node


def compute_slowdown(prof, ranks_per_node, world):
    """R/C · excess, the factor on every compute second where R ranks share C < R cores
    and waiting ranks spin (``prof.wait_cpu_share`` >= 0.5); 1 otherwise.  excess: what
    sharing a core costs beyond splitting its time (caches refilled after each switch),
    measured by ``calibrate`` (``sharing_excess``; 1.0 if not)."""
    ranks = ranks_sharing_cores(prof, ranks_per_node, world)
    if (prof.kind == "spec" or prof.wait_cpu_share < 0.5 or not prof.cores_per_node
            or ranks <= prof.cores_per_node):
        return 1.0
    return ranks / prof.cores_per_node * prof.efficiency.get("core_sharing_excess", 1.0)


def sharing_excess(mpi_comm, cores, fn, alone_s):
    """(seconds of ``fn()`` with every rank of this host running it at once) / ``alone_s``
    (rank 0 running it alone: ``on_rank0_alone``) / (R/C): 1 where sharing a core costs
    only its time; every rank calls.  On the simulated cluster (4 ranks, 2 cores) a small
    model's forward + backward took 17.8 ms with a core to itself and 37-39 ms shared
    (1.05-1.1); calibrations read 0.99-1.14."""
    mpi_comm.Barrier()
    shared = mpi_comm.allreduce(fn()) / mpi_comm.size
    return shared / alone_s / (ranks_on_host(mpi_comm) / max(cores, 1))


def wait_cpu_share(mpi_comm, wait_s=0.1):
    """CPU seconds per second of rank 0 while it waits in a receive that rank 1 answers
    after sleeping ``wait_s`` (every rank calls; 0 on one rank): about 1 where MPI polls,
    about 0 where a waiting rank sleeps.  The other ranks sleep meanwhile: spinning in a
    barrier, two of them took a third of the 2-core machine from rank 0 (0.6)."""
    share = 0.0
    one = np.zeros(1)
    mpi_comm.Barrier()
    if mpi_comm.rank == 1:
        time.sleep(wait_s)
        mpi_comm.Send(one, dest=0, tag=77)
    elif mpi_comm.rank == 0 and mpi_comm.size > 1:
        t0, c0 = time.perf_counter(), time.process_time()
        mpi_comm.Recv(one, source=1, tag=77)
        share = (time.process_time() - c0) / (time.perf_counter() - t0)
    sleeping_barrier(mpi_comm)
    return mpi_comm.bcast(share, root=0)


def oversubscribed(mpi_comm, cores):
    """Whether this host runs more of ``mpi_comm``'s ranks than it has ``cores``."""
    return ranks_on_host(mpi_comm) > max(cores, 1)


def sleeping_barrier(mpi_comm, poll_s=0.002):
    """A barrier whose waiting ranks sleep between polls, leaving their cores to the
    ranks still working (``Barrier`` itself spins)."""
    req = mpi_comm.Ibarrier()
    while not req.Test():
        time.sleep(poll_s)


def on_rank0_alone(mpi_comm, fn):
    """``fn()`` run by rank 0 while the other ranks sleep (a core to itself), its result
    returned on every rank (every rank calls)."""
    mine = fn() if mpi_comm.rank == 0 else None
    sleeping_barrier(mpi_comm)
    return mpi_comm.bcast(mine, root=0)


def ranks_on_host(mpi_comm):
    """Ranks of ``mpi_comm`` (an mpi4py communicator; every rank calls) on this host."""
    return mpi_comm.allgather(host_id()).count(host_id())


def nodes_per_host(comm, ranks_per_node):
    """Nodes of ``ranks_per_node`` ranks whose ranks share this host's cores: 1 on a real
    cluster, every node on the simulated one (``cluster/netns.py``: one machine)."""
    return max(ranks_on_host(comm.mpi) // max(ranks_per_node, 1), 1)

