"""Lesson 20: the cells of lessons/20_cluster.ipynb (``%md`` cells are markdown).

Edit here, then run ``python lessons/make_notebooks.py``."""
from launch import LAUNCH   # the cell that defines mpirun() and MINE for the exercise's runs

NOTEBOOK = "20_cluster.ipynb"

CELLS = [r'''%md
# 20 · A cluster on one machine: two kinds of links

A real cluster has two kinds of links. Inside a node, GPUs talk over NVLink (~450 GB/s per
direction on an H100) or, for CPU ranks, shared memory; between nodes every byte goes through a
network card (InfiniBand at 50 GB/s, often less). Everything lessons 04–13 said about topology —
hierarchical all-reduce, "keep tensor parallelism inside a node", overlapping the gradients'
all-reduce with backward — is about that difference, and on a laptop none of it can be seen: every
rank shares memory, and a "transfer" is two processes copying bytes themselves.

Linux can build the difference. A **network namespace** is a private copy of the network stack:
its own interfaces, addresses and routes. `python -m minipar cluster up` makes one namespace per
*node*, joins each to a bridge with a virtual Ethernet pair, and caps every byte that leaves a node
with a **token bucket** (`tc ... tbf rate 1gbit`). MPI's launcher starts each node's ranks inside its
namespace through a small stand-in for `ssh`; inside a node MPI keeps shared memory, between nodes
its bytes cross the capped link. Nothing in minipar's training code knows.

Plan: (1) the model first — a collective as **steps of messages**, each priced by the link it crosses;
**you write** the price of a step and the hierarchical all-reduce's steps; (2) **you write** the
hierarchical all-reduce itself, over real messages, on 4 ranks in 2 "nodes"; (3) bring a cluster up and
measure ring, tree, hierarchical and yours across it against your model; (4) overlap, where there is a
wire; (5) a node lost. Parts 3–5 need root and iproute2 (`ip`, `tc`); without them they say so and skip.
Solutions: `lessons/solutions/20_cluster.py`.
''', r'''
import inspect
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time

import matplotlib.pyplot as plt
import numpy as np

from minipar.comm import two_level
from minipar.comm.cost_model import CostParams
from minipar.observe.runlog import step_records

%matplotlib inline
''' + LAUNCH + r'''
# the cluster's commands below time collectives: no check mode (the ENV above turns it on)
ENV = {name: value for name, value in ENV.items() if name != "MINIPAR_COMM_CHECK"}
WORK = tempfile.mkdtemp(prefix="minipar_l20_")
PREFIX = "mpl20"


def minipar(*args, timeout=600):
    """python -m minipar ARGS..., failing loudly with its output."""
    proc = subprocess.run([sys.executable, "-m", "minipar", *map(str, args)], cwd=ROOT, env=ENV,
                          capture_output=True, text=True, timeout=timeout)
    assert proc.returncode == 0, f"minipar {' '.join(map(str, args))}\n{proc.stdout[-3000:]}\n{proc.stderr[-3000:]}"
    return proc


def can_build_a_cluster():
    import shutil
    if os.geteuid() != 0 or not shutil.which("ip") or not shutil.which("tc"):
        return False
    probe = subprocess.run(["ip", "netns", "add", PREFIX + "-probe"], capture_output=True)
    subprocess.run(["ip", "netns", "del", PREFIX + "-probe"], capture_output=True)
    return probe.returncode == 0


CLUSTER = can_build_a_cluster()
print("a cluster can be built here" if CLUSTER else "no root / ip / tc: parts 3-5 will be skipped")
''', r'''%md
## 1. A collective as steps of messages

Lesson 04's cost model gave each algorithm a formula: a ring all-reduce of $S$ bytes over $p$ ranks
costs $2(p-1)\,\alpha + 2\frac{p-1}{p} S\beta$ (plus the reductions). One $\alpha$ and one $\beta$:
one kind of link. With two kinds the formula depends on *which* messages cross nodes, and how many
share a node's one network card at the same moment. So write the algorithm down as **data** —
the steps it takes, each a list of messages `(src, dst, nbytes)` that run at once — and price
every step:

$$t_\text{step} = \max\Big(\max_\text{messages}\big(\alpha_\text{link} + n\,\beta_\text{link}\big),\;
\max_\text{nodes}\big(\alpha_\text{out} + \textstyle\sum n_\text{out of (into) the node}\cdot\beta_\text{out}\big)\Big)$$

A message inside a node costs $\alpha + n\beta$; between nodes $\alpha_\text{out} + n\beta_\text{out}$; and
every message that leaves (or enters) a node in that step shares the node's link, so the node's
total crosses at $\beta_\text{out}$. Nodes hold $q$ consecutive ranks: node$(r) = r // q$. Here is a
ring over 4 ranks, as the library writes it:
''', r'''
print(inspect.getsource(two_level.ring_steps))
steps = two_level.ring_steps([0, 1, 2, 3], 1024.0)
print(len(steps), "steps; the first:", steps[0])
''', r'''%md
**Exercise — the price of a step.** Write `my_step_seconds(messages, q, inside, between)`:
`inside` and `between` are `(alpha, beta)` pairs; return the step's time by the formula above (no
reductions here). It is checked against the library's `two_level.step_seconds` on random steps.
''', r'''%exercise step_seconds
def my_step_seconds(messages, q, inside, between):
    raise NotImplementedError("hint: two maxima — over the messages, each at its own link's price, and "
                              "over the nodes' links, each carrying all that leaves (or enters) it")
''', r'''
def library_price(messages, q, inside, between):
    c = CostParams(alpha=inside[0], beta=inside[1], gamma=0.0,
                   alpha_inter=between[0], beta_inter=between[1], ranks_per_node=q)
    return two_level.step_seconds(messages, 0.0, q, c)


rng = np.random.default_rng(0)
inside, between = (2e-5, 5e-10), (1e-4, 8e-9)
for trial in range(200):
    p, q = int(rng.integers(2, 9)), int(rng.integers(1, 5))
    messages = [(int(rng.integers(p)), int(rng.integers(p)), float(rng.integers(1, 1 << 19)))
                for _ in range(int(rng.integers(1, 6)))]
    got, want = my_step_seconds(messages, q, inside, between), library_price(messages, q, inside, between)
    assert np.isclose(got, want, rtol=1e-12), (messages, q, got, want)
print("correct; the library's version (it also cuts big messages into pipeline segments):\n")
print(inspect.getsource(two_level.step_seconds))
''', r'''%md
**Exercise — the hierarchical all-reduce's steps.** Nodes of $q$ ranks: (1) every node runs a ring
*reduce-scatter* among its own ranks (the first half of `ring_steps`), so local rank $j$ holds shard
$j$ of its node's sum; (2) for each $j$, the ranks with local index $j$ — one per node — all-reduce
shard $j$ ($S/q$ bytes) across the nodes, all $q$ such rings at once; (3) every node runs a ring
*all-gather* (the second half). Groups that run side by side are merged step by step with
`two_level.at_once(list_of_step_lists)`. Write `my_hierarchical_steps(ranks, S, q)` for nodes of equal
size; it is checked by the bytes every rank sends and by the predicted time.
''', r'''%exercise hierarchical
def my_hierarchical_steps(ranks, S, q):
    raise NotImplementedError("hint: three phases, as in the text; which ranks form each ring, and how "
                              "many bytes does each one carry?")
''', r'''
slow = CostParams(alpha=2e-5, beta=5e-10, gamma=0.0, alpha_inter=1e-4, beta_inter=8e-9, ranks_per_node=2)
for p, q in ((4, 2), (6, 2), (6, 3), (8, 4), (8, 2)):
    for S in (4096.0, float(1 << 22)):
        mine = my_hierarchical_steps(list(range(p)), S, q)
        lib = two_level.hierarchical_steps(list(range(p)), S, q)
        sent = lambda steps: [sum(n for m, _ in steps for s, _, n in m if s == r) for r in range(p)]
        assert np.allclose(sent(mine), sent(lib)), (p, q, sent(mine), sent(lib))
        t = lambda steps: sum(two_level.step_seconds(m, r, q, slow) for m, r in steps)
        assert np.isclose(t(mine), t(lib), rtol=1e-12), (p, q, S)
print("correct. Predicted on 2 nodes x 2 ranks, 1 GB/s inside, 0.125 GB/s between:")
model = CostParams(alpha=2e-5, beta=1e-9, gamma=1e-10, alpha_inter=1e-4, beta_inter=8e-9, ranks_per_node=2)
sizes = [1 << k for k in range(10, 27, 2)]
for algorithm in ("ring", "tree", "hierarchical"):
    print(f"{algorithm:>13}", " ".join(f"{two_level.predict(algorithm, 4, S, model, 2) * 1e3:8.2f}" for S in sizes), "ms")
''', r'''%md
The ring crosses the wire once per step per node: $2(p-1)$ steps of $S/p$ each through a node's card.
The hierarchical all-reduce sends only $S/q$ per rank across, but all $q$ ranks of a node at once — the
same card. On $m$ nodes that is $2\frac{m-1}{m}S$ through each card against the ring's $2\frac{p-1}{p}S$:
less when the nodes are few, and far fewer latencies across the wire. NCCL does the same (rings within
and across nodes, or a tree across nodes) and so does Megatron when it keeps tensor parallelism inside
a node: the bytes that must cross, cross once.

## 2. The hierarchical all-reduce, over real messages

**Exercise — your hierarchical all-reduce.** The steps above are data; now the algorithm itself, on four
processes. Write `my_hierarchical_all_reduce(comm, x, q)`: sum the 1-D float64 array `x` over every rank
of `comm`, in place, where a node holds $q$ consecutive ranks — rank $r$ is local rank $r \bmod q$ of
node $r // q$. Use minipar's communicator as lesson 04 did: `comm.rank`, `comm.size`, and
`comm.sendrecv(send, dest, recv, source)`, which sends one contiguous array to `dest` while it receives
another from `source` (no deadlock when every rank of a ring does it at once). `chunk_bounds(n, parts)`
is the library's cut of $n$ elements into parts: part $i$ is `[b[i], b[i+1])`, sizes differing by at
most one, some empty when $n$ < parts.

Things to decide before you type:

- A ring needs only "who is on my right, who is on my left", and those can come from *any* list of
  ranks, not only `0..p-1`. Which list is your node? Which list holds the ranks whose shard is yours?
- Phase 1 is lesson 04's reduce-scatter and phase 3 its all-gather, on the first list; phase 2 is a
  whole all-reduce of one shard on the second. Written once for a list, the ring serves all three.
- A slice of an array is a view: what you reduce into `x[lo:hi]` lands in `x`.
- Only the shard you own after phase 1 may cross to another node.

`20_yours.py` runs your file under `mpiexec -n 4` (2 nodes × 2 ranks) and checks on every rank, for
arrays of 1000, 0, 1, 3, 7, 1001 and 4099 elements and nodes of 2, 1 and 4 ranks: the result equals
NumPy's sum of every rank's array; the bytes the rank sent to ranks **off its node** (it wraps the
communicator's `send`, `isend` and `sendrecv` to count them, by destination) equal what
`two_level.hierarchical_steps` — the steps you wrote above — says, $\frac{S}{q}\cdot\frac{2(m-1)}{m}$
on $m$ nodes; and a node sends fewer bytes across than the flat ring would. When the sums are wrong it
says which phase left which shard wrong.
''', r'''%exercise hierarchical_all_reduce
%%writefile {MINE}/hierarchical.py
"""Your hierarchical all-reduce over real messages (lesson 20): run under mpiexec by 20_yours.py."""
from minipar.backend import xp
from minipar.comm.chunks import chunk_bounds


def my_hierarchical_all_reduce(comm, x, q):
    """Sum the 1-D array x over every rank of comm, in place; nodes of q consecutive ranks."""
    # 1. reduce-scatter among the ranks of my node
    # 2. all-reduce my shard among the ranks that own the same shard, one on every node
    # 3. all-gather among the ranks of my node
    return x
''', r'''
proc = mpirun(4, ["20_yours.py", "--file", f"{MINE}/hierarchical.py", "--backend", BACKEND])
print(proc.stdout)
''', r'''%md
The library's version is `minipar/comm/hierarchical.py`: the same three phases, with the two groups
built once as communicators of their own (`comm.split`, cached) and lesson 04's ring functions run on
them; when the nodes differ in size the shards cannot line up, and it falls back to a tree to each
node's first rank. What those bytes cost when the link between the nodes is a real one is next.

## 3. A cluster, and the model against it

Two nodes of two ranks, 1 Gbit/s between them. `cluster run -- bench comm` runs lesson 04's benchmark on
the four ranks: it calibrates α and β inside a node (ranks 0 and 1) *and across* (ranks 0 and 2), times
every algorithm against MPICH's own Allreduce, and prints the two-level model's prediction.
''', r'''
bench, BIG = {}, 1 << 23                                 # BIG: the size your all-reduce is timed at
if CLUSTER:
    minipar("cluster", "down", "--prefix", PREFIX)
    print(minipar("cluster", "up", "--prefix", PREFIX, "--nodes", 2, "--ranks-per-node", 2,
                  "--inter-gbps", 1).stdout)
    try:
        out = f"{WORK}/bench.json"
        minipar("cluster", "run", "--prefix", PREFIX, "--", "bench", "comm", "--min-size", "64K",
                "--max-size", "4M", "--budget", "0.3", "--algorithms", "ring,tree,hierarchical", "--json", out)
        run = minipar("cluster", "run", "--prefix", PREFIX, "--", "lessons/20_yours.py", "--file",
                      f"{MINE}/hierarchical.py", "--time", BIG)     # yours, across the wire (next cells)
        yours = json.loads([line for line in run.stdout.splitlines() if line.startswith("{")][-1])
        status = minipar("cluster", "status", "--prefix", PREFIX).stdout
        print(status)                                     # the link's byte counters: they moved
    finally:
        minipar("cluster", "down", "--prefix", PREFIX)
    bench = json.load(open(out))
    cp = bench["cost_params"]
    print(f"calibrated: inside α {cp['alpha'] * 1e6:.0f} µs; between α {cp['alpha_inter'] * 1e6:.0f} µs, "
          f"{1 / cp['beta_inter'] / 1e6:.0f} MB/s")
else:
    print("skipped: needs root, ip and tc")
''', r'''
if bench:
    c = CostParams.from_dict(bench["cost_params"])
    fig, ax = plt.subplots(figsize=(7, 3.6))
    for algorithm, colour in (("mpi", "k"), ("ring", "C0"), ("tree", "C1"), ("hierarchical", "C2")):
        rows = [r for r in bench["rows"] if r["algorithm"] == algorithm]
        ax.loglog([r["size"] for r in rows], [r["time_s"] for r in rows], "o-", color=colour, label=algorithm)
        if algorithm != "mpi":
            mine = [sum(my_step_seconds(m, 2, (c.alpha, c.beta), (c.alpha_inter, c.beta_inter))
                        for m, _ in two_level.steps_of(algorithm, 4, r["size"], 2)) for r in rows]
            ax.loglog([r["size"] for r in rows], mine, "--", color=colour)
    ax.set_xlabel("bytes"); ax.set_ylabel("seconds"); ax.legend()
    ax.set_title("measured (o) and your two-level model (--), 2 nodes x 2 ranks, 1 Gbit/s")
    plt.show()
''', r'''%md
And your all-reduce of §2, on the same cluster: 8 MiB of float64 (the median of 3 runs, the slowest
rank's time), beside what your steps of §1 priced by your `my_step_seconds` predict with the constants
just calibrated, and beside the library's hierarchical all-reduce and its flat ring measured in the same
run. Your model leaves out the reductions and the pipelining into 1 MiB segments, and its β across was
calibrated a minute ago on a machine that may have been busier or quieter than now, so do not expect the
milliseconds to agree; what it must get right is the order and roughly the ratio — across a slow link,
the bytes that cross decide. (Run once on a busy 2-core machine: yours 90 ms measured against 176
predicted, the flat ring 107 against 210 — the calibration saw 60 MB/s on the 125 MB/s link — and yours
over the ring 0.83 measured, 0.84 predicted.)
''', r'''
if bench:
    inside, between = (c.alpha, c.beta), (c.alpha_inter, c.beta_inter)
    S, ranks = float(yours["bytes"]), [0, 1, 2, 3]
    model = {name: sum(my_step_seconds(m, 2, inside, between) for m, _ in steps) * 1e3
             for name, steps in (("yours", my_hierarchical_steps(ranks, S, 2)),
                                 ("ring", two_level.ring_steps(ranks, S)))}
    ms = {name: seconds * 1e3 for name, seconds in yours.items() if name.endswith("_s")}
    print(f"{S / 2**20:.0f} MiB over 2 nodes x 2 ranks, 1 Gbit/s between them (ms):")
    print(f"  yours (hierarchical)   measured {ms['yours_s']:7.1f}   your model {model['yours']:7.1f}")
    print(f"  library hierarchical   measured {ms['hierarchical_s']:7.1f}")
    print(f"  library flat ring      measured {ms['ring_s']:7.1f}   your model {model['ring']:7.1f}")
    print(f"  yours / flat ring: measured {yours['yours_s'] / yours['ring_s']:.2f}, "
          f"your model {model['yours'] / model['ring']:.2f}")
else:
    print("skipped: needs root, ip and tc (your all-reduce ran on 4 local ranks in section 2)")
''', r'''%md
## 4. Overlap, where there is a wire

Lesson 05 found that overlapping the gradients' all-reduce with backward barely paid on one machine:
over shared memory the "transfer" is the ranks' own copying, so moving it into backward moves work,
it does not hide it. Across a network card, bytes in flight cost no core. Two nodes of one rank each,
with buckets of 0.5 MiB: the small model's whole gradient (3.6 MB) fits in one 25 MiB bucket (PyTorch
DDP's default size), which is ready only when backward ends — nothing left to hide behind. (A `train`
run given no `--bucket-mb` asks the performance model for the size; on this cluster it picks 2 MiB.) On this machine, quiet, the
overlapped step took 0.84 of the other (`benchmarks/cluster_links.py`); on a busy machine it varies.
''', r'''
if CLUSTER:
    minipar("cluster", "up", "--prefix", PREFIX, "--nodes", 2, "--ranks-per-node", 1, "--inter-gbps", 1)
    steps = {}
    try:
        for name, extra in (("overlap", []), ("no overlap", ["--no-overlap"])):
            log = f"{WORK}/{name.replace(' ', '_')}.json"
            minipar("cluster", "run", "--prefix", PREFIX, "--", "train", "--model", "small", "--steps", 5,
                    "--batch-size", 16, "--eval-batches", 0, "--quiet", "--dp", 2, "--bucket-mb", 0.5,
                    *extra, "--log-json", log)
            records = step_records(log)[1:]                 # step 0: warm-up
            steps[name] = statistics.median(r["step_time_s"] for r in records)
    finally:
        minipar("cluster", "down", "--prefix", PREFIX)
    print({k: f"{v * 1e3:.0f} ms" for k, v in steps.items()},
          f"overlap / no overlap = {steps['overlap'] / steps['no overlap']:.2f}")
''', r'''%md
## 5. A node lost

`cluster fail-node 1` kills every process in node 1's namespace with SIGKILL and removes the namespace:
a power cut. Nothing is reported — the ranks that died cannot say so — so `launch` (lesson 15) sees a
failure that names no rank, asks the launcher which hosts still run a command, drops the dead node,
and continues on the survivors from the last checkpoint. `tests/test_cluster.py` runs it: node 1 of 2
lost at step 10 of 30, the run ends on node 0 with exactly the single process's fp64 losses.

    python -m minipar cluster up --nodes 2 --ranks-per-node 1 --inter-gbps 1
    python -m minipar cluster run -- launch --np 2 --hang-timeout 20 -- train --precision fp64 \
        --save-every 5 --save ckpt --hang-timeout 15 ...
    python -m minipar cluster fail-node 1          # while it trains
    python -m minipar cluster status               # node 0 only; `cluster down` removes the rest

## What changes on real nodes

- The launcher's `ssh` is real, and so is the card: InfiniBand or RoCE with RDMA, so a transfer needs
  no CPU at all (GPUDirect: not even a copy through host memory). UCX picks those transports; here
  only TCP reaches across a veth.
- Latency: a token bucket caps bandwidth but adds no delay (this kernel has no `netem`), so α across
  the simulated link is the software's alone. On InfiniBand a switch hop adds ~0.1–0.2 µs; a small
  message from one node's memory to another's takes ~1–5 µs end to end (software, cards, switches,
  cable).
- Topologies are deeper than two levels (NVLink, PCIe switch, NIC, leaf and spine switches); NCCL reads
  them (`NCCL_TOPO_FILE`) and builds rings and trees to match. The step model above extends to any
  number of link classes: each message at its link's price, each shared link at its total.
- Names you will meet: NCCL's `NCCL_ALGO=Ring|Tree` and `NCCL_CROSS_NIC`, Megatron's
  `--tensor-model-parallel-size` kept ≤ GPUs per node, PyTorch's `DeviceMesh` with an intra- and
  an inter-node dimension (HSDP), DeepSpeed's ZeRO++ — hpZ (a copy of the weights sharded inside each
  node, so backward's all-gathers stay on the node's links) and qgZ (the gradients' reduce-scatter done
  hierarchically, inside the node first, quantised to int4 on the wire).
''']
