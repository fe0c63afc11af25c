"""Lesson 05: the cells of lessons/05_data_parallel.ipynb (``%md`` cells are markdown).

Edit here, then run ``python lessons/make_notebooks.py``."""
from launch import LAUNCH   # the cell that defines mpirun() for the lesson's runs

NOTEBOOK = "05_data_parallel.ipynb"

CELLS = [r'''%md
# 05 · Data parallelism: buckets and overlap

The simplest way to use $N$ devices: every device holds **the whole model**, takes $1/N$ of each
global batch, and the devices agree on one update. It is the outermost layer of every large
training run (PyTorch DDP, the "dp" of Megatron and DeepSpeed).

**Why averaging gradients is exact.** Let the global batch have $B = N\,b$ sequences and the loss be
their mean, $L = \frac{1}{B}\sum_{i=1}^{B}\ell_i$. Replica $r$ sees the rows $I_r$ ($|I_r| = b$) and
computes its own mean loss $L_r = \frac{1}{b}\sum_{i\in I_r}\ell_i$. Since the shares are equal,

$$L = \frac{1}{N}\sum_{r=1}^{N} L_r \quad\Longrightarrow\quad
\nabla_\theta L = \frac{1}{N}\sum_{r=1}^{N}\nabla_\theta L_r ,$$

because the gradient is linear. One **all-reduce** (sum) of the gradients followed by a division by
$N$ gives every replica the gradient of the global batch, so every replica makes the single-process
update, and the replicas never drift apart (their weights start equal: broadcast from rank 0).

**Gradient accumulation** is the same identity in time instead of space: $K$ micro-batches one
after another on one device, each loss scaled by $1/K$, their gradients summed in `.grad`:
$\nabla L = \frac1K\sum_k \nabla L_k$.

**The price** is one all-reduce of all $\Psi$ gradients per step — with a ring, $2\frac{N-1}{N}\cdot
4\Psi$ bytes sent per rank in float32 (lesson 04), whatever the batch size. Two tricks make it cheap:

* **buckets**: gradients are packed into flat buffers of ~25 MB and all-reduced per bucket. One
  message of $S$ bytes costs $\alpha + S\beta$ ($\beta$: seconds per byte, lesson 04's notation); a
  thousand tiny per-tensor all-reduces would pay the
  latency $\alpha$ a thousand times;
* **overlap**: backward produces gradients from the **last** layer to the first, so parameters are
  bucketed in **reverse** order. A leaf gradient hook counts the gradients arriving in each bucket;
  when a bucket is complete its all-reduce starts on a communication thread *while backward is still
  computing the earlier layers*. Only what is still in flight when backward ends is **exposed**:

$$T_\text{step} \approx T_\text{fwd} + T_\text{bwd} + \underbrace{\max\bigl(0,\ T_\text{comm} - T_\text{hidden}\bigr)}_{\text{exposed}} + T_\text{opt}.$$

That formula assumes the communication costs the computation nothing. §4 measures when it does.

Plan: (1) two ranks under `mpiexec` reproduce the single process and gradient accumulation in float64,
and you write the average over replicas with uneven shares; (2) the buckets of a model, and you write
the hook that launches them, then the whole DDP — hooks that start one non-blocking ring all-reduce per
bucket and return — run on two ranks, its overlap checked by the order of events, and timed against the
blocking version across a simulated network link; (3) one step of both ranks on a timeline; (4) overlap vs no overlap, on this
machine and on a slow network — and why overlap can lose here.
''', r'''
import inspect
import json
import os
import subprocess
import sys
import tempfile
import time
import types

import matplotlib.pyplot as plt
import numpy as np

from minipar import backend
from minipar.nn import GPT, GPTConfig
from minipar.parallel.buckets import make_buckets
from minipar.parallel.sync import DDPSync

%matplotlib inline
''' + LAUNCH, r'''%md
## 1. Two replicas == one process == gradient accumulation

`05_data_parallel.py` trains a small GPT for 5 AdamW steps in float64 three ways, on the same
global batches (the batch of step $k$ is a pure function of $k$):

* **DDP**, $N = 2$ ranks: `DDPSync(model, comm, bucket_bytes=16 KiB)` (small buckets, so there
  are many), each rank on its half of the rows, `Optimizer(ddp)` (sync, then AdamW);
* **one process** on the whole batch — the oracle, computed on rank 0;
* **one process, $K = 2$ accumulated micro-batches** of half the rows, each loss scaled by $1/K$.

The same script then times steps of a larger model (float32) for §3 and §4.
''', r'''
out_json = os.path.join(tempfile.mkdtemp(), "dp.json")
mpirun(2, ["05_data_parallel.py", "--backend", BACKEND, "--json", out_json])
result = json.load(open(out_json))
ddp, single, accum = (np.array(result[k]) for k in ("parity_ddp", "parity_single", "parity_accum"))
print(f"{result['parity_buckets']} buckets")
print(" step   DDP (2 ranks)       one process         accumulation (K=2)")
for s, (a, b, c) in enumerate(zip(ddp, single, accum)):
    print(f"{s:5d}   {a:.15f}   {b:.15f}   {c:.15f}")
# exact up to the order of floating-point additions: ~1e-15 relative in float64
np.testing.assert_allclose(ddp, single, rtol=1e-12, atol=0)
np.testing.assert_allclose(accum, single, rtol=1e-12, atol=0)
assert result["parity_buckets"] > 3
print("max relative difference DDP vs single:", np.max(np.abs(ddp - single) / single))
''', r'''%md
The losses agree to the last few bits: the only difference is the order in which floating-point
numbers are added (the all-reduce sums two partial gradients that one process would have summed
in one matmul). This is the contract of every parallel layout in this course: **the single-process
run is the oracle**.

**Exercise — averaging over replicas with uneven shares.** A slow replica can be given fewer rows
(load balancing, `train --balance`). Then the plain mean $\frac1N\sum_r g_r$ is *wrong*: with $n_r$ rows
on replica $r$ and $\sum_r n_r = B$, the global mean loss is $L = \sum_r \frac{n_r}{B} L_r$. Write
`replica_average(grads, rows)`: `grads[r]` is `{name: gradient of replica r's mean loss}`, `rows[r]` its
number of rows; return the gradient of the global mean loss. The check runs each replica in this process
(float64) and compares with one process on the whole batch, for equal and uneven shares.
''', r'''%exercise replica_average
def replica_average(grads, rows):
    raise NotImplementedError("hint: write the global mean loss in terms of the replicas' mean losses; "
                              "the gradient is linear in the loss")
''', r'''
backend.set_default_dtype(np.float64)
small = GPTConfig(vocab_size=64, seq_len=16, n_layer=2, d_model=32, n_head=4)
ids = np.random.default_rng(0).integers(0, small.vocab_size, (8, small.seq_len + 1))
x8, y8 = ids[:, :-1], ids[:, 1:]

def gradients(x, y):
    """{name: gradient} of the mean loss over the rows of (x, y), one process."""
    model = GPT(small, seed=0)
    _, loss = model(x, y)
    loss.backward()
    return {n: p.grad.copy() for n, p in model.named_parameters()}

whole = gradients(x8, y8)                                     # the oracle: all 8 rows at once
for rows in ([4, 4], [2, 6], [1, 3, 4]):
    edges = np.cumsum([0] + rows)
    per_replica = [gradients(x8[a:b], y8[a:b]) for a, b in zip(edges, edges[1:])]
    mine = replica_average(per_replica, rows)
    for name, g in whole.items():
        np.testing.assert_allclose(mine[name], g, rtol=1e-10, atol=1e-15, err_msg=f"{name}, rows {rows}")
    plain = {n: sum(g[n] for g in per_replica) / len(rows) for n in whole}
    off = max(np.abs(plain[n] - whole[n]).max() / np.abs(whole[n]).max() for n in whole)
    print(f"rows {rows}: yours equals one process; the plain mean is off by {off:.1e} (relative)")
''', r'''%md
DDP's all-reduce can only compute the plain mean $\frac{1}{\mathrm{dp}}\sum_r(\cdot)$ (the hook divides by
the group size, then sums). So minipar's load balancer keeps the all-reduce and changes what each replica
back-propagates: $w_r L_r$ with $w_r = \mathrm{dp}\cdot n_r / B$, so that $\frac1{\mathrm{dp}}\sum_r w_r g_r =
\sum_r \frac{n_r}{B} g_r$ — your sum. Here is the library's weight (`minipar/train/balance.py`), used to
check that identity on the same replicas:
''', r'''
from minipar.train.balance import Balancer

print(inspect.getsource(Balancer.weight.fget))
rows = [1, 3, 4]
edges = np.cumsum([0] + rows)
per_replica = [gradients(x8[a:b], y8[a:b]) for a, b in zip(edges, edges[1:])]
weights = []
for r in range(len(rows)):                       # the balancer as replica r sees it
    balancer = Balancer(types.SimpleNamespace(dp=len(rows), coords=types.SimpleNamespace(dp=r)), sum(rows))
    balancer.shares = rows
    weights.append(balancer.weight)
ddp_mean = {n: sum(w * g[n] for w, g in zip(weights, per_replica)) / len(rows) for n in whole}
for name, g in whole.items():
    np.testing.assert_allclose(ddp_mean[name], g, rtol=1e-10, atol=1e-15)
print("weights w_r =", weights, "-> (1/dp)·Σ w_r·g_r equals one process")
''', r'''%md
## 2. The buckets

`make_buckets(params, bucket_bytes)` walks the parameters **backwards** and cuts a new bucket when
the next one would overflow it (a parameter larger than a bucket gets its own). Here the model of the
timing experiment (4 blocks, $d = 128$, float32) with 512 KiB buckets. The library's code
(`minipar/parallel/buckets.py`):
''', r'''
print(inspect.getsource(make_buckets))
tm = result["timing_model"]
backend.set_default_dtype(np.float32)
cfg = GPTConfig(vocab_size=256, seq_len=tm["seq_len"], n_layer=tm["n_layer"], d_model=tm["d_model"], n_head=4)
model = GPT(cfg)
names = {id(p): n for n, p in model.named_parameters()}
buckets = make_buckets(model.parameters(), tm["bucket_bytes"])
for i, b in enumerate(buckets):
    first, last = names[id(b.params[0])], names[id(b.params[-1])]
    print(f"bucket {i}: {b.numel * 4 / 1024:6.0f} KiB, {len(b.params):2d} params, {first} ... {last}")
assert [b.padded * 4 for b in buckets] == result["bucket_sizes"]   # the script's buckets, rebuilt here
assert names[id(buckets[0].params[0])].startswith("lm_head")       # reverse order: the head first
assert names[id(buckets[-1].params[-1])].startswith("wte")         # the embeddings last
''', r'''%md
Bucket 0 (head, last block) is complete after the first few backward ops; the last bucket holds the
embeddings, whose gradient exists only when backward is over — its all-reduce can never be hidden.

**Exercise — the bucket hook.** Autograd calls a leaf's hooks each time a gradient has been accumulated
into it (`param.register_hook(fn)` → `fn(param)`). DDP registers one on every parameter. Write the class
behind it: `grad_ready(param)` counts the gradients that arrived in `param`'s bucket and calls `launch(i)`
the moment bucket `i` is complete (all its parameters have their gradient). It must work for the next
backward too. The check runs two backward passes of the float64 model of §1 (16 KiB buckets) with your
hooks and with the library's `DDPSync` (on a pretend group of 2 ranks whose "all-reduce" returns the
bucket unchanged, so nothing is sent), and compares *when* each bucket was launched: after how many
gradients, in which order.
''', r'''%exercise bucket_hook
class MyBucketHooks:
    """DDP's bookkeeping: launch(i) as soon as every parameter of bucket i has its gradient."""

    def __init__(self, buckets, launch):
        self.buckets, self.launch = buckets, launch

    def grad_ready(self, param):
        raise NotImplementedError("hint: a bucket is complete when every one of its parameters has had "
                                  "its gradient in this backward; the check compares after how many "
                                  "gradients each bucket is launched, in two backward passes")
''', r'''
backend.set_default_dtype(np.float64)

def launches(attach, steps=2):
    """[(step, gradients accumulated so far, bucket launched)] over `steps` backward passes;
    attach(model, launch) installs the hooks and returns what to call after each backward."""
    model, seen, log = GPT(small, seed=0), [0], []
    for p in model.parameters():                # registered first: fires before the others
        p.register_hook(lambda p: seen.__setitem__(0, seen[0] + 1))
    after_backward = attach(model, lambda i: log.append((step, seen[0], i)))
    for step in range(steps):
        _, loss = model(x8, y8)
        loss.backward()
        after_backward()
        for p in model.parameters():
            p.grad = None
    return log

def with_library(model, launch):
    one = types.SimpleNamespace(rank=0, size=1)            # no broadcast at construction
    ddp = DDPSync(model, one, bucket_bytes=16 * 1024,
                  comm_hook=lambda comm, flat: types.SimpleNamespace(wait=lambda: flat))
    ddp.comm = types.SimpleNamespace(rank=0, size=2)       # now the hooks launch buckets
    library_launch = ddp._launch
    def spy(i):                                            # i: the bucket's index
        launch(i)
        library_launch(i)
    ddp._launch = spy
    return ddp.finish                                      # waits, resets the counts

def with_yours(model, launch):
    hooks = MyBucketHooks(make_buckets(model.parameters(), 16 * 1024), launch)
    for p in model.parameters():
        p.register_hook(hooks.grad_ready)
    return lambda: None

library, yours = launches(with_library), launches(with_yours)
n_buckets, n_params = result["parity_buckets"], len(GPT(small).parameters())
assert sorted(i for s, _, i in library if s == 0) == list(range(n_buckets))   # each bucket once
assert yours == library, f"yours:    {yours}\nlibrary:  {library}"
print("correct: the same launches as DDPSync, step by step")
print(f"{n_params} gradients per backward; (gradients so far, bucket launched) in the first one:")
print("  ", [(seen, i) for s, seen, i in library if s == 0])
''', r'''%md
The pairs are (gradients accumulated so far, bucket launched): the first bucket leaves after a single
gradient — the head's — while backward still has almost everything to do. The order is not quite $0, 1,
2, \dots$: a block's backward reaches the MLP's `fc` bias before the MLP's `proj` weight is done, so a
later bucket can complete first; the hook does not care. Here is what you just wrote, in the library
(`minipar/parallel/sync/ddp.py`), and the default communication hook it calls (`hooks.py`):
''', r'''
from minipar.parallel.sync import allreduce_hook

print(inspect.getsource(DDPSync._grad_ready))
print(inspect.getsource(DDPSync._launch))
print(inspect.getsource(allreduce_hook))
''', r'''%md
**Exercise — your DDP, overlapped, on two ranks.** Now the whole mechanism, run by `mpiexec`: write
`MyDDP(model, comm, bucket_bytes)`. It cuts the parameters into buckets with `make_buckets` (the same cut
as the library's) and puts a hook on every parameter. When a bucket's last gradient arrives, the hook
packs the bucket's gradients into one flat buffer and *starts* its all-reduce with minipar's ring —
`all_reduce_async(comm, flat, algorithm="ring")`, which hands the collective to the communicator's progress
thread and returns a handle at once — and returns, so that backward goes on computing the earlier layers
while the bucket travels. `finish()` is called after backward: it waits for every handle
(`handle.wait()`), turns each sum into the mean, and gives every parameter its averaged gradient back;
when it returns every `param.grad` must be the mean over the ranks.

The cell below does not run your class here: `%%writefile` saves it to a file, and the next cell starts
`05_yours.py` on 2 ranks, which imports it on every rank and trains 3 AdamW steps (float64, 16 KiB
buckets) each rank on its half of the global batch, beside the library's `DDPSync` on the same ranks and
one process on the whole batch. Overlap is checked by the **order of events**, not by durations (which a
busy machine would decide): the check puts a spy in place of your `all_reduce_async` and counts the
gradients as autograd produces them, so it knows that bucket 0 — the head — was started after the first
gradient, with every other gradient still to compute, and that no handle was waited before backward
returned (a `wait()` inside the hook blocks backward exactly as a blocking all-reduce would; the check
says so). Then the bytes — the ring's $2\frac{p-1}{p}S$ per bucket — and every gradient and loss against
`DDPSync` and the single process, to $10^{-12}$. A failure names the rank, the step, the bucket and what
is wrong.
''', r'''%exercise my_ddp
%%writefile {MINE}/ddp.py
"""Your overlapped DDP (lesson 05): run under mpiexec by 05_yours.py."""
from minipar.backend import xp
from minipar.comm import all_reduce_async
from minipar.parallel.buckets import make_buckets


class MyDDP:
    """Gradients in buckets; each bucket's all-reduce started the moment its last gradient
    arrives, and waited for only after backward."""

    def __init__(self, model, comm, bucket_bytes):
        self.comm = comm
        self.buckets = make_buckets(model.parameters(), bucket_bytes)

    def finish(self):
        """After backward: wait for every bucket; then every .grad is the mean over the ranks."""
''', r'''
proc = mpirun(2, ["05_yours.py", "--file", f"{MINE}/ddp.py", "--backend", BACKEND])
print(proc.stdout)
''', r'''%md
**What it buys, across a wire.** On this machine the two ranks share memory and two cores, and moving a
bucket *is* CPU work (§4 shows what that does to overlap). Across a network card the bytes move without
the CPU. Lesson 20's simulated cluster makes such a card: two nodes (Linux network namespaces) of one rank
each, joined by a link shaped to 0.1 Gbit/s. `05_yours.py --time 4` runs your class there on a larger
model (4 blocks, $d = 64$, float32, 64 KiB buckets) twice, alternating step by step: as you wrote it, and
with the spy waiting for each all-reduce inside the hook that started it — the blocking DDP, the same
code otherwise. It needs root, `ip` and `tc`; without them the cell shows the figures recorded on this
course's machine (`benchmarks/recorded/ddp_overlap_2026-12-08/`, with the command that made them).
Timings are printed, never asserted: they depend on how busy the machine is.
''', r'''
PREFIX = f"l05p{os.getpid() % 10000}"       # the cluster's names: this kernel's own, so runs coexist


def can_build_a_cluster():
    import shutil
    if os.geteuid() != 0 or not shutil.which("ip") or not shutil.which("tc"):
        return False
    probe = subprocess.run(["ip", "netns", "add", PREFIX + "-probe"], capture_output=True)
    subprocess.run(["ip", "netns", "del", PREFIX + "-probe"], capture_output=True)
    return probe.returncode == 0


def cluster(*args):
    """python -m minipar cluster ACTION --prefix PREFIX ARGS...; timing runs leave check mode off."""
    env = {k: v for k, v in ENV.items() if k != "MINIPAR_COMM_CHECK"}
    action, *rest = map(str, args)
    proc = subprocess.run([sys.executable, "-m", "minipar", "cluster", action, "--prefix", PREFIX, *rest],
                          cwd=ROOT, env=env, capture_output=True, text=True, timeout=600)
    assert proc.returncode == 0, f"cluster {' '.join(map(str, args))}\n{proc.stdout[-3000:]}\n{proc.stderr[-3000:]}"
    return proc.stdout


GBIT = 0.1                                   # the link between the two nodes, Gbit/s
if can_build_a_cluster():
    cluster("down")
    print(cluster("up", "--nodes", 2, "--ranks-per-node", 1, "--inter-gbps", GBIT))
    try:
        out = cluster("run", "--", "lessons/05_yours.py", "--file", f"{MINE}/ddp.py", "--time", 4)
    finally:
        cluster("down")
    timed = json.loads([line for line in out.splitlines() if line.startswith("{")][-1])
    print(f"measured now, 2 nodes x 1 rank, {GBIT} Gbit/s between them:")
else:
    recorded = os.path.join(ROOT, "benchmarks", "recorded", "ddp_overlap_2026-12-08")
    timed = json.load(open(os.path.join(recorded, "timing.json")))
    GBIT = timed["inter_gbps"]
    print(f"no root / ip / tc here: the figures recorded in {os.path.relpath(recorded, ROOT)}, "
          f"{GBIT} Gbit/s between the nodes ({timed['machine']}):")
wire = sum(timed["bucket_bytes"]) / (GBIT * 1e9 / 8)
print(f"  {timed['buckets']} buckets, {sum(timed['bucket_bytes']) / 2**20:.1f} MiB of gradients: "
      f"{wire * 1e3:.0f} ms on the wire per step (a 2-rank ring sends S)")
print(f"  step time, median of {timed['steps']}: overlapped {timed['overlapped_s'] * 1e3:.0f} ms, "
      f"blocking {timed['blocking_s'] * 1e3:.0f} ms; overlapped / blocking = "
      f"{timed['overlapped_s'] / timed['blocking_s']:.2f}")
print(f"  blocking - overlapped = {(timed['blocking_s'] - timed['overlapped_s']) * 1e3:.0f} ms per step, beside "
      f"{wire * 1e3:.0f} ms on the wire: the blocking hooks sit out the wire time and the round trips of "
      f"{timed['buckets']} buckets; the overlapped ones let them pass under backward")
''', r'''%md
That is DDP: everything else in `DDPSync` is about speed (flat buffers that the gradients live in so
nothing is packed, a ring stepped from the hooks when the ranks fill the cores — §4) or about options (`no_sync` for accumulation,
half-precision buckets, compression hooks in lesson 14).

## 3. One step, drawn

Each rank timed its steps: `forward` and `backward` are measured around the model calls
(`perf_counter()` after a barrier; ranks on one host share that clock); `sync wait` is
`ddp.finish()`, the time blocked waiting for communication (the **exposed** part);
then the optimizer. The lower row of each rank is the communication thread, from `ddp.events`:
for each bucket, *queued* (thin hatched bar: submitted by the hook, waiting for the thread to finish
the buckets before it) and *all-reduce* (running; this includes waiting for the other rank to reach
the same bucket).
''', r'''
COLORS = {"forward": "#4C72B0", "backward": "#55A868", "sync_wait": "#C44E52", "optimizer": "#8172B2"}

def draw_step(ax, ranks, title):
    for r, s in enumerate(ranks):
        y = 2.4 * r
        for key, color in COLORS.items():
            a, b = s[key]
            ax.barh(y, (b - a) * 1e3, left=a * 1e3, height=0.8, color=color, edgecolor="k", lw=0.3,
                    label=key.replace("_", " ") if r == 0 else None)
        for e in s["buckets"]:
            ax.barh(y + 1.45, (e["started"] - e["submitted"]) * 1e3, left=e["submitted"] * 1e3,
                    height=0.25, color="#eee", edgecolor="#777", hatch="////", lw=0.3)
            ax.barh(y + 1, (e["finished"] - e["started"]) * 1e3, left=e["started"] * 1e3, height=0.6,
                    color="#DD8452", edgecolor="k", lw=0.3)
            if e["finished"] - e["started"] > 0.04 * s["step_time"]:
                ax.text((e["started"] + e["finished"]) / 2 * 1e3, y + 1, f"bucket {e['index']}",
                        fontsize=7, ha="center", va="center")
    ax.barh(0, 0, color="#DD8452", label="bucket all-reduce")
    ax.barh(0, 0, color="#eee", edgecolor="#777", hatch="////", label="bucket queued (thin)")
    ax.set_yticks([y for r in range(len(ranks)) for y in (2.4 * r, 2.4 * r + 1)])
    ax.set_yticklabels([f"rank {r} {w}" for r in range(len(ranks)) for w in ("compute", "comm")])
    ax.invert_yaxis(); ax.set_xlabel("ms since the step began"); ax.set_title(title)

step = -1                                      # the last timed step (the first ones warm up)
fig, axes = plt.subplots(2, 1, figsize=(11, 5.5), sharex=True)
draw_step(axes[0], [r[step] for r in result["overlap"]], "overlap: all-reduces start from gradient hooks")
draw_step(axes[1], [r[step] for r in result["no_overlap"]], "no overlap: all-reduces after backward")
axes[0].legend(loc="upper left", bbox_to_anchor=(1.0, 1.0), fontsize=8)
plt.tight_layout(); plt.show()

for r, s in enumerate(result["overlap"]):
    for st in s:   # mechanism, not timing: with overlap the first bucket is handed over inside backward
        assert min(e["submitted"] for e in st["buckets"]) < st["backward"][1], (r, st)
    s = s[step]
    inside = sum(e["submitted"] < s["backward"][1] for e in s["buckets"])
    print(f"rank {r}: {inside} of {len(s['buckets'])} buckets submitted before backward ended")
for s in result["no_overlap"]:
    for st in s:   # without overlap nothing is sent until backward is over
        assert all(e["started"] >= st["backward"][1] for e in st["buckets"])
''', r'''%md
With overlap the all-reduces of the first buckets run under backward; only the tail (the last
buckets, above all the embeddings) and any skew between the ranks remain exposed in `sync wait`.
Without overlap every bucket waits for the end of backward.

## 4. Overlap vs no overlap: exposed and total communication

Four runs of the same steps: overlap on and off, on this machine (two ranks talking through shared
memory) and on a **slow network**: the same all-reduce, but before it the progress thread sleeps
$S\beta$ for a bucket of $S$ bytes ($1/\beta$ = 50 MB/s) — time on a wire, which needs no CPU, as a real
link would. Per run (median over the steps after the first, and over the ranks):

* *total comm*: the time the communication thread spent on all-reduces (sum over buckets), split into
  what ran **under backward** (hidden) and what ran after it;
* *exposed*: the time the main thread was blocked in `ddp.finish()` — what the step paid. It can exceed
  the all-reduces themselves: it also holds the **skew**, waiting for the other rank to finish its
  backward and reach the same bucket;
* *CPU* columns: `time.thread_time()` of the thread doing the work (backward on the main thread, each
  all-reduce on the progress thread). Wall minus CPU is time the thread was **not running**: waiting
  for a core, for Python's GIL, for the other rank — or, in the sleep, for the wire.
''', r'''
RUNS = {"overlap": "overlap", "no_overlap": "no overlap",
        "slow_overlap": "slow net, overlap", "slow_no_overlap": "slow net, no overlap"}

def summary(name):
    per = []
    for rank in result[name]:
        for st in rank[1:]:                       # step 0 warms up
            b0, b1 = st["backward"]
            total = sum(e["finished"] - e["started"] for e in st["buckets"])
            under = sum(max(0.0, min(e["finished"], b1) - max(e["started"], b0)) for e in st["buckets"])
            per.append({"fwd": st["forward"][1] - st["forward"][0], "bwd": b1 - b0,
                        "bwd_cpu": st["backward_cpu"], "opt": st["optimizer"][1] - st["optimizer"][0],
                        "exposed": st["exposed_comm"], "total": total, "hidden": under,
                        "comm_cpu": sum(e["cpu"] for e in st["buckets"])})
    out = {k: float(np.median([p[k] for p in per])) for k in per[0]}
    out["step"] = result[name + "_median"]["step_time"]       # the slowest rank's step
    return out

S = {name: summary(name) for name in RUNS}
print(f"{'':22}{'step':>7}{'backward':>9}{'bwd CPU':>8}{'exposed':>8}{'total comm':>11}"
      f"{'hidden':>7}{'comm CPU':>9}   (ms)")
for name, label in RUNS.items():
    s = S[name]
    print(f"{label:22}{s['step']*1e3:7.1f}{s['bwd']*1e3:9.1f}{s['bwd_cpu']*1e3:8.1f}{s['exposed']*1e3:8.1f}"
          f"{s['total']*1e3:11.1f}{s['hidden']*1e3:7.1f}{s['comm_cpu']*1e3:9.1f}")

fig, axes = plt.subplots(1, 2, figsize=(12, 3.6))
labels, x = list(RUNS.values()), np.arange(len(RUNS))
bottom = np.zeros(len(RUNS))
for key, color, label in (("fwd", "#4C72B0", "forward"), ("bwd", "#55A868", "backward"),
                          ("exposed", "#C44E52", "exposed comm (sync wait)"), ("opt", "#8172B2", "optimizer")):
    vals = np.array([S[n][key] for n in RUNS]) * 1e3
    axes[0].bar(x, vals, bottom=bottom, color=color, label=label, width=0.6)
    bottom += vals
axes[0].set_title("one step (medians)"); axes[0].set_ylabel("ms")
hidden = np.array([S[n]["hidden"] for n in RUNS]) * 1e3
total = np.array([S[n]["total"] for n in RUNS]) * 1e3
axes[1].bar(x, hidden, color="#55A868", width=0.6, label="under backward (hidden)")
axes[1].bar(x, total - hidden, bottom=hidden, color="#DD8452", width=0.6, label="after backward")
axes[1].scatter(x, [S[n]["comm_cpu"] * 1e3 for n in RUNS], marker="_", s=900, color="k", zorder=3,
                label="CPU time of the all-reduces")
axes[1].set_title("the communication thread: total time on all-reduces"); axes[1].set_ylabel("ms")
for ax in axes:
    ax.set_xticks(x, labels, fontsize=8); ax.legend(fontsize=7, loc="upper left")
plt.tight_layout(); plt.show()

wire = sum(result["bucket_sizes"]) / result["slow_network_bytes_per_s"]
print(f"slow network: {wire * 1e3:.0f} ms on the wire per step ({len(result['bucket_sizes'])} buckets, "
      f"{sum(result['bucket_sizes']) / 2**20:.1f} MiB at {result['slow_network_bytes_per_s'] / 1e6:.0f} MB/s)")
for net in ("", "slow_"):
    on, off = S[net + "overlap"], S[net + "no_overlap"]
    where = "on a slow network" if net else "on this machine"
    print(f"{where}: overlap hid {on['hidden'] * 1e3:.0f} of {on['total'] * 1e3:.0f} ms of communication; "
          f"exposed {on['exposed'] * 1e3:.0f} ms vs {off['exposed'] * 1e3:.0f} ms without; "
          f"backward {on['bwd'] * 1e3:.0f} ms vs {off['bwd'] * 1e3:.0f} ms; "
          f"step {on['step'] / off['step']:.2f}x the no-overlap step")
for name in RUNS:                                      # facts of the mechanism, not of the timing
    assert S[name]["total"] > 0 and S[name]["hidden"] <= S[name]["total"] + 1e-9
    assert "no_overlap" not in name or S[name]["hidden"] == 0.0   # nothing runs under backward
''', r'''%md
**Why overlap can make the step slower here.** Overlap hides communication only if the
communication runs on something that would otherwise sit idle. On a GPU it partly does: across nodes
the network cards move the bytes, and NCCL's all-reduce runs on its own CUDA stream beside backward.
But inside a node NCCL's own kernel moves them by default — its threads load from one GPU's memory and
store into the peer's over NVLink, SM instructions, not the copy engines — and NCCL's kernels *are*
kernels: they occupy SMs (a few channels of thread blocks each) to drive the transfers and do the
reductions, and they compete with backward's GEMMs for
HBM bandwidth — so an overlapped all-reduce still slows the compute it hides behind, a few percent
to tens of percent (frameworks cap NCCL's channels, or leave SMs to it, for that reason). Here every
rank is one process on a machine with **two cores**, and `mpiexec -n 2` puts one rank on each: with
ranks ≥ cores there is no free core for the progress thread. Whatever the all-reduce needs the CPU for —
packing the buckets, the reductions (NumPy adds), MPI copying through shared memory, Python between two
messages of the ring (the thread needs the GIL, which backward — Python too — holds) — is taken from
backward's core. So, in the table:

* *total comm* with overlap is larger than without: the same all-reduces (compare their *comm CPU*:
  similar work), stretched because the thread keeps waiting for a core and for the GIL;
* *backward* may get longer with overlap — by about the CPU the thread took from it — and the time
  hidden is then paid inside backward instead of in `sync wait`; what it saves is at most the part of the
  all-reduce that did not need the CPU (waiting for the other rank's message);
* on a busy machine (other jobs on the same cores) wall ≫ CPU for backward too: the rank itself was
  waiting for a core. That is noise overlap cannot help with.

**When overlap pays.** When communication is mostly *waiting* — a slow or remote network: the slow-net
rows. The sleeps cost no CPU, so with overlap they pass while backward computes and the hidden part of
*total comm* grows by about the time on the wire; without overlap every bucket's wire time is exposed
after backward. The same holds on real hardware with a free core or a DMA engine per rank (GPUs, or
fewer ranks than cores). The rule: **overlap hides transfer time, not CPU time**; with ranks ≥ cores
communication is CPU time. `benchmarks/data_parallel.py` measures it on a model where compute dominates.

**Overlap without a spare core.** The lesson's hook runs each all-reduce on the progress thread, to
make its CPU time visible. minipar's DDP does not, when ranks fill the cores: its default hook starts a
*stepped* ring (`minipar/comm/stepwise.py`) — each step of the ring one non-blocking send and receive —
and DDP calls `progress()` on the rings in flight at every later gradient hook, in the main thread. A
step costs the CPU only to post two messages and to add one received chunk; the bytes move while
backward computes, and no thread waits for the GIL or a core. `python benchmarks/data_parallel.py`
measured the 2-rank step here at 0.96x the no-overlap step, with 80% of the exposed all-reduce hidden.

The mechanism — buckets in reverse order, submitted from gradient hooks during backward — is what the
asserts check, and what carries over to real hardware.

## Takeaways

- $\nabla L = \frac1N \sum_r \nabla L_r$ for equal shares: one all-reduce makes $N$ replicas take
  the single-process step — exactly, up to summation order (checked to $10^{-12}$ in float64). With
  uneven shares weight by $n_r/B$ (or the loss by $\mathrm{dp}\cdot n_r/B$). Gradient accumulation is the
  same identity over micro-batches in time.
- Communication per step is $\approx 2\cdot 4\Psi$ bytes per rank, independent of the batch: data
  parallelism scales when compute per step ($\propto$ batch) dominates it.
- Buckets amortise latency; reverse order + hooks let the all-reduce of late layers run while
  earlier layers still compute. The last bucket (embeddings) is always exposed.
- Overlap hides time on the wire, not CPU work: with a free core, a DMA engine or a slow network it
  pays; with ranks ≥ cores a communication thread competes with backward — advance the transfers from
  backward's own hooks instead (`comm/stepwise.py`).
- DDP keeps $16\Psi$ bytes of model state on every rank — lesson 06 (ZeRO) removes that redundancy.

## In PyTorch / DeepSpeed / Megatron this is …

- **PyTorch**: `torch.nn.parallel.DistributedDataParallel(model, bucket_cap_mb=25)` — the same reverse-order
  buckets and autograd hooks (the C++ `Reducer`), the all-reduce on NCCL's stream; `model.no_sync()` for
  gradient accumulation; `model.register_comm_hook(state, hook)` with
  `torch.distributed.algorithms.ddp_comm_hooks.default_hooks.allreduce_hook` as the default (minipar's
  `comm_hook=`); `gradient_as_bucket_view=True` makes `.grad` views of the bucket, as minipar's `finish()`
  does; `torch.distributed.all_reduce` for one tensor. FSDP (lesson 06) is the sharded successor.
- **DeepSpeed**: plain data parallelism is ZeRO stage 0; `"overlap_comm": true` and `"reduce_bucket_size"`
  in the `zero_optimization` config are overlap and the bucket size.
- **Megatron-Core**: `megatron.core.distributed.DistributedDataParallel` with
  `DistributedDataParallelConfig(overlap_grad_reduce=True, bucket_size=...)` (`--overlap-grad-reduce` on
  the command line); the data-parallel group is `parallel_state.get_data_parallel_group()`.
''', r'''%md
## What changes on GPU nodes and at scale

Everything above ran on CPU ranks sharing one machine's memory. On GPU nodes the mechanism is the same
— buckets, hooks, one all-reduce per bucket — and the numbers change. Below they come from the
repository's **H200 profile** (`minipar/perf/profiles/h200.json`): data-sheet peaks times one efficiency
factor each, a *model*, not a measurement. Inside a node of 8 the ring runs over NVLink/NVSwitch; across
nodes every byte goes through the InfiniBand card, about 8× slower per GPU.
''', r'''from minipar.perf.comm import collective_seconds
from minipar.perf.profile import load_profile

h200 = load_profile("h200")
S = 2 * 7e9                                        # a 7B model's bf16 gradients
backward = 4 * 7e9 * 4 * 4096 / (h200.peak_flops["bf16"] * h200.efficiency["gemm"])
print(f"H200 profile (model): backward of 4 x 4096 tokens of a 7B model ~ {backward:.2f} s per GPU")
for p, where in ((8, "intra"), (64, "inter"), (512, "inter")):
    t = collective_seconds(h200, "all_reduce", p, S, where)
    print(f"  ring all-reduce of {S / 1e9:.0f} GB over {p:>3} GPUs ({where:5}): {t:.3f} s = {t / backward:.0%} of backward")
''', r'''%md
Inside one node the all-reduce is a tenth of backward and hides easily; across nodes it is most of it
and hides only if almost every bucket is ready early — and on GPUs the all-reduce is not free while it
hides: NCCL's kernels run on the SMs and read HBM beside backward's. Hence what large runs do: the ring
inside the node and a smaller exchange across (hierarchical, lesson 04/20), larger batches per GPU (more
compute per byte), ZeRO/FSDP (lesson 06), and gradient compression (lesson 14). What *was* measured on
one H200 (docs/benchmarks.md, "GPU"): a GPT-2-small-shaped step on minipar's CuPy backend, 150 ms against
152 ms for PyTorch eager — one GPU; no multi-GPU run of this lesson has been measured.
''']
