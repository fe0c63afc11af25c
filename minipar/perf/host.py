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

The rates: on such a host ``calibrate`` times the compute on every rank at once, so an op
shorter than a time slice costs what a rank gets from a core it shares (its caches and
switches shared too); longer ones (a GEMM of ~1 GFLOP on the 2-core machine) come out
sliced, up to R/C times slower, which this bound then counts twice.  Timing the compute on
one rank alone instead put the bound 20-38% below the simulated cluster's measured steps
(one trial, the machine shared): sharing a core costs more than splitting its time.

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


def host_id():
    """What tells machines apart, and not a machine's network namespaces: the running
    kernel's boot id (the simulated cluster's nodes are namespaces of one kernel)."""
    try:
        with open("/proc/sys/kernel/random/boot_id") as f:
            return f.read().strip()
    except OSError:
        return os.uname().nodename


def ranks_on_host(mpi_comm):
    """Ranks of ``mpi_comm`` (an mpi4py communicator; every rank calls) on this host."""
    return mpi_comm.allgather(host_id()).count(host_id())


def nodes_per_host(comm, ranks_per_node):
    """Nodes of ``ranks_per_node`` ranks whose ranks share this host's cores: 1 on a real
    cluster, every node on the simulated one (``cluster/netns.py``: one machine)."""
    return max(ranks_on_host(comm.mpi) // max(ranks_per_node, 1), 1)

