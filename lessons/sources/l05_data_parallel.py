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
  message of $S$ bytes costs $\alpha + S/\beta$; a thousand tiny per-tensor all-reduces would pay the
  latency $\alpha$ a thousand times;
* **overlap**: backward produces gradients from the **last** layer to the first, so parameters are
  bucketed in **reverse** order. A leaf gradient hook counts the gradients arriving in each bucket;
  when a bucket is complete its all-reduce starts on a communication thread *while backward is still
  computing the earlier layers*. Only what is still in flight when backward ends is **exposed**:

$$T_\text{step} \approx T_\text{fwd} + T_\text{bwd} + \underbrace{\max\bigl(0,\ T_\text{comm} - T_\text{hidden}\bigr)}_{\text{exposed}} + T_\text{opt}.$$

Plan: (1) two ranks under `mpiexec` reproduce the single process and gradient accumulation in float64;
(2) the buckets of a model; (3) one step of both ranks on a timeline; (4) overlap vs no overlap.
''', r'''
import json
import os
import subprocess
import sys
import tempfile
import time

import matplotlib.pyplot as plt
import numpy as np

%matplotlib inline
''' + LAUNCH, r'''%md
## 1. Two replicas == one process == gradient accumulation

`05_data_parallel.py` trains a small GPT for 5 AdamW steps in float64 three ways, on the same
global batches (the batch of step $k$ is a pure function of $k$):

* **DDP**, $N = 2$ ranks: `DDPSync(model, comm, bucket_bytes=16 KiB)` (small buckets, so there
  are many), each rank on its half of the rows, `Optimizer(ddp)` (sync, then AdamW);
* **one process** on the whole batch — the oracle, computed on rank 0;
* **one process, $K = 2$ accumulated micro-batches** of half the rows, each loss scaled by $1/K$.

The same script then measures one step of a larger model (float32) for the timeline of §3.
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

## 2. The buckets

`make_buckets(params, bucket_bytes)` walks the parameters **backwards** and cuts a new bucket when
the next one would overflow it (a parameter larger than a bucket gets its own). Here the model of the
timing experiment (4 blocks, $d = 128$, float32) with 512 KiB buckets:
''', r'''
from minipar import backend
from minipar.nn import GPT, GPTConfig
from minipar.parallel.buckets import make_buckets

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

## 3. One step, drawn

Each rank timed its step: `forward` and `backward` are measured around the model calls
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
        assert st["buckets"][0]["submitted"] < st["backward"][1], (r, st)
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

## 4. Overlap vs no overlap

Median over the timed steps after the first (the slowest rank's step time; exposed communication =
time blocked in `ddp.finish()`, mean over ranks). *Comm busy* is the time the
communication thread spent on all-reduces (summed over buckets).
''', r'''
rows = []
for name in ("overlap", "no_overlap"):
    med = result[name + "_median"]
    busy = np.median([sum(e["finished"] - e["started"] for e in st["buckets"])
                      for r in result[name] for st in r[1:]])
    rows.append((name, med["step_time"], med["exposed_comm"], busy))
print(f"{'':12} {'step ms':>8} {'exposed comm ms':>16} {'comm busy ms':>13}")
for name, t, e, b in rows:
    print(f"{name:12} {t * 1e3:8.1f} {e * 1e3:16.1f} {b * 1e3:13.1f}")
print(f"step time overlap / no overlap: {rows[0][1] / rows[1][1]:.2f}")

fig, ax = plt.subplots(figsize=(6, 3))
ax.bar([r[0] for r in rows], [(r[1] - r[2]) * 1e3 for r in rows], color="#55A868", label="compute")
ax.bar([r[0] for r in rows], [r[2] * 1e3 for r in rows], bottom=[(r[1] - r[2]) * 1e3 for r in rows],
       color="#C44E52", label="exposed comm")
ax.set_ylabel("ms per step (median)"); ax.legend(); plt.show()
''', r'''%md
**Reading the numbers on this machine.** Compare *comm busy* with and without overlap: the very
same all-reduces take several times longer when they run under backward. The communication thread
is Python: between two messages of the ring it needs the GIL, and backward — minipar's autograd
engine is Python too — holds it, handing it over only every `sys.getswitchinterval()` (5 ms) or
inside long NumPy calls. So an all-reduce that takes a fraction of a millisecond alone stretches
over many milliseconds, and most buckets finish only after backward. On top of that the two ranks
share two busy CPU cores (the thread's copies and reductions compete with backward for the core),
and part of each all-reduce is just *waiting for the other rank* to finish the same bucket — skew
that no overlap can hide. The figures above may therefore show little gain, or even a loss;
`benchmarks/data_parallel.py` measures it on a model where compute dominates.

In PyTorch's DDP on GPUs none of this is in the way: the all-reduce is NCCL kernels on their own
CUDA stream and links, no Python thread and no GIL involved, so hiding it under backward is nearly
free — which is why every production DDP overlaps. The mechanism — buckets in reverse order, submitted from gradient hooks during
backward — is what the asserts check, and what carries over to real hardware.

## Takeaways

- $\nabla L = \frac1N \sum_r \nabla L_r$ for equal shares: one all-reduce makes $N$ replicas take
  the single-process step — exactly, up to summation order (checked to $10^{-12}$ in float64).
  Gradient accumulation is the same identity over micro-batches in time.
- Communication per step is $\approx 2\cdot 4\Psi$ bytes per rank, independent of the batch: data
  parallelism scales when compute per step ($\propto$ batch) dominates it.
- Buckets amortise latency; reverse order + hooks let the all-reduce of late layers run while
  earlier layers still compute. The last bucket (embeddings) is always exposed.
- DDP keeps $16\Psi$ bytes of model state on every rank — lesson 06 (ZeRO) removes that redundancy.
''']
