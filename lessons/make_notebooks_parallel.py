"""Build lessons 05, 06, 08 and 12 as notebooks without outputs:
``python lessons/make_notebooks_parallel.py``.

Like ``make_notebooks.py``: the lessons are plain Python strings here (ordinary diffs in
review) and the ``.ipynb`` files are generated from them and executed by
``tests/test_lessons.py``.  A cell that starts with ``%md`` is markdown, every other
cell is code.
"""
from __future__ import annotations

import os

import nbformat
from make_notebooks import build   # the same cell format and stable ids as lessons 01-03

HERE = os.path.dirname(os.path.abspath(__file__))


# The code every lesson uses to launch ranks: mpiexec from lessons/, minipar importable.
LAUNCH = r'''
ROOT = os.path.abspath("..")
ENV = dict(os.environ, OMP_NUM_THREADS="1", OPENBLAS_NUM_THREADS="1",
           PYTHONPATH=ROOT + os.pathsep + os.environ.get("PYTHONPATH", ""))
BACKEND = os.environ.get("MINIPAR_BACKEND", "numpy")   # "cupy" on GPU nodes

def mpirun(n, args, timeout=300):
    """mpiexec -n N python ARGS..., from lessons/; fails loudly with the ranks' output."""
    cmd = ["mpiexec", "-n", str(n), sys.executable, *map(str, args)]
    t0 = time.perf_counter()
    proc = subprocess.run(cmd, capture_output=True, text=True, timeout=timeout, env=ENV)
    assert proc.returncode == 0, f"{' '.join(cmd)}\n{proc.stdout[-3000:]}\n{proc.stderr[-3000:]}"
    print(f"$ mpiexec -n {n} python {' '.join(map(str, args))}   ({time.perf_counter() - t0:.1f} s)")
    return proc
'''

# --------------------------------------------------------------------------- 05
L05 = [r'''%md
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

* **DDP**, $N = 2$ ranks: `DataParallel(model, comm, bucket_bytes=16 KiB)` (small buckets, so there
  are many), each rank on its half of the rows, `DataParallelAdamW` (sync, then AdamW);
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
`finish_gradient_sync()`, the time blocked waiting for communication (the **exposed** part);
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
time blocked in `finish_gradient_sync()`, mean over ranks). *Comm busy* is the time the
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

# --------------------------------------------------------------------------- 06
L06 = [r'''%md
# 06 · ZeRO: sharding what data parallelism replicates

Data parallelism (lesson 05) keeps on each of $N$ ranks the same $\Psi$ parameters, their
gradients and the optimizer state. With AdamW in float32 that is, per parameter, 4 bytes of weight,
4 of gradient and 8 of state ($m$ and $v$): **16Ψ bytes on every rank** — a 7.5B model needs 120 GB
before a single activation, and adding ranks does not help.

ZeRO (Rajbhandari et al., 2020) notices that every rank only *needs* all of it at particular
moments, and shards the rest: rank $r$ owns $1/N$ of every flat buffer.

| stage | sharded | bytes per rank, fp32 AdamW | mixed precision (2 + 2 + 12) |
|---|---|---|---|
| 0 (DDP) | nothing | $4\Psi + 4\Psi + 8\Psi = 16\Psi$ | $16\Psi$ |
| 1 | optimizer state | $4\Psi + 4\Psi + 8\Psi/N = 8\Psi + 8\Psi/N$ | $4\Psi + 12\Psi/N$ |
| 2 | + gradients | $4\Psi + (4\Psi + 8\Psi)/N = 4\Psi + 12\Psi/N$ | $2\Psi + 14\Psi/N$ |
| 3 | + parameters | $(4\Psi + 4\Psi + 8\Psi)/N = 16\Psi/N$ | $16\Psi/N$ |

How each stage works in minipar:

* **stage 1** — after backward each bucket's gradient is **reduce-scattered** (rank $r$ receives the
  sum of its shard only); rank $r$ runs AdamW on its shard of the weights with its shard of $m, v$;
  the updated shards are **all-gathered** back into the full weights. Reduce-scatter + all-gather move
  exactly the bytes of one all-reduce ($2\frac{N-1}{N}\Psi$ elements): stage 1 is free in communication.
* **stage 2** — the reduce-scatter of a bucket starts from the gradient hooks as soon as the bucket
  is complete, and the full gradients are freed: a rank keeps only its shard of the gradients.
* **stage 3** — the weights are sharded too. Each *unit* (embeddings, each block, the head) is
  all-gathered just before its forward, freed after, gathered again for its backward (the next unit
  prefetched), and its gradients reduce-scattered when its backward ends: $1.5\times$ the
  communication of DDP.

Every buffer is padded to a multiple of $N$ elements so all shards have equal size; Ψ in the
sharded terms is therefore the **padded** Ψ (at most $N-1$ extra elements per bucket).
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
## 1. Four ranks, each stage

`06_zero.py` builds the same GPT ($d = 30$, so the LayerNorm and bias sizes are not multiples of 4 and
padding shows) under each stage's optimizer on $N = 4$ ranks: stage 0 is `DataParallel` +
`DataParallelAdamW`, stages 1–2 `ZeroOptimizer(stage=…)` with 8 KiB buckets, stage 3 `ZeroStage3` (one
bucket per unit). After one float32 step it reads every rank's `memory_bytes()` — the bytes the rank
holds for parameters, gradients and optimizer states. Then it trains 5 float64 steps per stage.
''', r'''
out_json = os.path.join(tempfile.mkdtemp(), "zero.json")
mpirun(4, ["06_zero.py", "--backend", BACKEND, "--json", out_json])
result = json.load(open(out_json))
N, psi = result["ranks"], result["psi"]
print(f"N = {N} ranks, Ψ = {psi:,} parameters")
''', r'''%md
## 2. Measured memory against the formulas
''', r'''
def formula(stage, psi, n, padded=None):
    """(params, grads, optimizer) bytes per rank, fp32 AdamW; sharded terms use the padded Ψ,
    and so do ZeRO-1/2's parameters, which live in padded flat buckets (one storage per
    bucket, the shard a view of it)."""
    padded = psi if padded is None else padded
    full, shard, flat = 4 * psi, 4 * padded // n, 4 * padded
    return {0: (full, full, 2 * full), 1: (flat, full, 2 * shard),
            2: (flat, shard, 2 * shard), 3: (shard, shard, 2 * shard)}[stage]

paper = {0: lambda p, n: 16 * p, 1: lambda p, n: 8 * p + 8 * p / n,
         2: lambda p, n: 4 * p + 12 * p / n, 3: lambda p, n: 16 * p / n}
labels = {0: "16Ψ", 1: "8Ψ+8Ψ/N", 2: "4Ψ+12Ψ/N", 3: "16Ψ/N"}
print(f"{'stage':6} {'params':>8} {'grads':>8} {'optim':>8} {'total':>8} {'formula':>10} {'':10} {'padding':>8}")
measured = {}
for stage in range(4):
    m = result[f"memory{stage}"]
    per_rank = [(d["params"], d["grads"], d["optimizer"]) for d in m["per_rank"]]
    assert len(set(per_rank)) == 1, per_rank                   # every rank holds the same
    measured[stage] = per_rank[0]
    padded = m["psi_padded"]
    assert 0 <= padded - psi < N * (m["buckets"] or 1)         # < N elements per bucket
    assert per_rank[0] == formula(stage, psi, N, padded)       # exact, counting the padding
    total, f = sum(per_rank[0]), paper[stage](psi, N)
    assert 0 <= total - f <= 16 * (padded - psi)               # the paper's formula up to padding
    print(f"{stage:6d} {per_rank[0][0]:8,} {per_rank[0][1]:8,} {per_rank[0][2]:8,} {total:8,} "
          f"{f:10,.0f} {labels[stage]:10} {padded - psi:6d} el")

fig, ax = plt.subplots(figsize=(7, 3.8))
x = np.arange(4)
bottom = np.zeros(4)
for i, (part, color) in enumerate((("params", "#4C72B0"), ("grads", "#55A868"), ("optimizer (m, v)", "#C44E52"))):
    vals = np.array([measured[s][i] for s in range(4)]) / 1024
    ax.bar(x, vals, bottom=bottom, color=color, label=part, width=0.6)
    bottom += vals
ax.scatter(x, [paper[s](psi, N) / 1024 for s in range(4)], marker="_", s=1500, color="k",
           zorder=3, label="formula")
ax.set_xticks(x, [f"stage {s}\n{labels[s]}" for s in range(4)])
ax.set_ylabel("KiB per rank"); ax.set_title(f"model state per rank, fp32 AdamW, Ψ = {psi:,}, N = {N}")
ax.legend(loc="upper right", fontsize=8); plt.show()
''', r'''%md
Measured bytes equal the formulas exactly once Ψ in the sharded terms is the padded Ψ (every
bucket rounded up to a multiple of $N$ — a handful of elements here, nothing for a real model).

## 3. What it means at scale

The paper's example (its Figure 1): Ψ = 7.5B parameters, mixed precision (fp16 weights and gradients,
fp32 master weights + $m$ + $v$: $K = 12$), $N = 64$ data-parallel ranks:
''', r'''
P, n = 7.5e9, 64
mixed = {0: 16 * P, 1: 4 * P + 12 * P / n, 2: 2 * P + 14 * P / n, 3: 16 * P / n}
for stage, b in mixed.items():
    print(f"stage {stage}: {b / 1e9:6.1f} GB per rank")
assert [round(mixed[s] / 1e9, 1) for s in range(4)] == [120.0, 31.4, 16.6, 1.9]   # the paper's figures

ns = np.arange(1, 129)
fig, ax = plt.subplots(figsize=(6, 3.5))
for stage, f in ((0, lambda n: 16 * P + 0 * n), (1, lambda n: 4 * P + 12 * P / n),
                 (2, lambda n: 2 * P + 14 * P / n), (3, lambda n: 16 * P / n)):
    ax.plot(ns, f(ns) / 1e9, label=f"stage {stage}")
ax.axhline(80, color="gray", ls=":", label="80 GB GPU")
ax.set_xscale("log", base=2); ax.set_yscale("log"); ax.set_xlabel("data-parallel ranks N")
ax.set_ylabel("GB per rank (model state)"); ax.set_title("7.5B parameters, mixed-precision AdamW")
ax.legend(fontsize=8); plt.show()
''', r'''%md
Stages 1 and 2 flatten out at $4\Psi$ and $2\Psi$ — the replicated weights (and gradients) remain;
only stage 3 keeps falling as $1/N$, at the price of gathering the weights twice per step.

## 4. Same losses as stage 0 and as one process

Sharding changes *where* the numbers live, not *what* is computed: the AdamW update is elementwise,
so applying it shard by shard is the same update; the gradient-clipping norm is
$\|g\|^2 = \sum_r \|g_r\|^2$ over the shards (one tiny all-reduce).
''', r'''
single = np.array(result["losses_single"])
losses = {s: np.array(result[f"losses{s}"]) for s in range(4)}
for s in range(4):
    print(f"stage {s}: " + " ".join(f"{v:.13f}" for v in losses[s]))
print(f"1 proc : " + " ".join(f"{v:.13f}" for v in single))
for s in range(1, 4):
    np.testing.assert_allclose(losses[s], losses[0], rtol=1e-12, atol=0)
np.testing.assert_allclose(losses[0], single, rtol=1e-12, atol=0)

fig, ax = plt.subplots(figsize=(6, 3))
for s in range(4):
    ax.semilogy(np.abs(losses[s] - single) / single + 1e-17, "o-", label=f"stage {s}")
ax.set_xlabel("step"); ax.set_ylabel("|loss − single| / single"); ax.set_ylim(1e-17, 1e-10)
ax.set_title("float64: differences at the rounding level"); ax.legend(fontsize=8); plt.show()
''', r'''%md
## Takeaways

- fp32 AdamW holds $16\Psi$ bytes of model state per rank; ZeRO-1/2/3 cut it to $8\Psi + 8\Psi/N$,
  $4\Psi + 12\Psi/N$ and $16\Psi/N$ — measured here byte for byte (plus padding to a multiple of $N$).
- Stages 1–2 cost no more communication than DDP (reduce-scatter + all-gather = all-reduce);
  stage 3 adds one all-gather of the weights per pass ($1.5\times$).
- The update is the same: all stages reproduce the single process to $10^{-12}$ in float64.
''']

# --------------------------------------------------------------------------- 08
L08 = [r'''%md
# 08 · Pipeline parallelism and its schedules

Split the model **by layers** into $p$ stages, one per rank: stage $s$ receives activations from
$s-1$, sends its output to $s+1$, and in backward the gradients flow the other way. Each rank holds
$1/p$ of the weights and only point-to-point messages of one activation cross between stages — cheap
enough to go between nodes.

The catch: stage $s$ cannot start before stage $s-1$ has produced something. Cutting the batch into
$m$ **micro-batches** lets the stages work on different micro-batches at once; what remains idle is
the **bubble**. With forward time $t_f$ and backward $t_b$ per micro-batch and stage, the fill and the
drain cost $(p-1)(t_f+t_b)$ out of a makespan of $(m+p-1)(t_f+t_b)$:

$$\text{bubble} = \frac{p-1}{m+p-1}.$$

A schedule is just a list of actions per rank — `F(m)`, `B(m)`, `W(m)` — so it can be checked,
timed and drawn without MPI (`build_schedule`, `validate`, `simulate`, `draw_timeline`):

| schedule | idea | bubble (uniform op times) | activations in flight |
|---|---|---|---|
| AFAB (GPipe) | all forwards, then all backwards | $\frac{p-1}{m+p-1}$ | $m$ |
| 1F1B | after $p-s-1$ warm-up forwards, alternate one F, one B | $\frac{p-1}{m+p-1}$ | $\le p$ |
| interleaved 1F1B | $v$ model chunks per rank, stages round-robin | $\frac{p-1}{v\,m+p-1}$ | $\approx p$ (chunks of $1/v$) |
| ZB-H1 | split backward into B (input grad) and W (weight grad); W fills the bubbles | $\frac{p-1}{3m+p-1}$ ($t_f=t_b=t_w$) | $\le p$ |

1F1B has AFAB's bubble but frees each micro-batch's activations as early as possible; interleaving
shrinks the fill/drain by $v$ at the cost of $v\times$ more messages; ZB-H1 exploits that only the
input gradient B is on the critical path between stages — the weight gradient W can wait.
''', r'''
import json
import os
import subprocess
import sys
import tempfile
import time

import matplotlib.pyplot as plt
import numpy as np

from minipar.parallel.pipeline import build_schedule, draw_timeline, simulate, validate

%matplotlib inline
''' + LAUNCH, r'''%md
## 1. The four schedules, simulated

$p = 4$ stages, $m = 8$ micro-batches, $v = 2$ chunks for interleaved. Every op costs 1 unit: F = 1,
the full backward = B + W = 2 (ZB-H1 runs B and W as separate ops of 1 each), so all four do the same
work and differ only in order.
''', r'''
p, m, v = 4, 8, 2
formulas = {"afab": (p - 1) / (m + p - 1), "1f1b": (p - 1) / (m + p - 1),
            "interleaved": (p - 1) / (v * m + p - 1), "zb-h1": (p - 1) / (3 * m + p - 1)}
sims = {}
fig, axes = plt.subplots(4, 1, figsize=(12, 9), sharex=True)
for ax, kind in zip(axes, formulas):
    chunks = v if kind == "interleaved" else 1
    schedule = build_schedule(kind, p, m, chunks)
    validate(schedule, p, m, chunks)        # every F before its B, B before W, no deadlock, counts
    sims[kind] = simulate(schedule, p, chunks, t_f=1.0, t_b=1.0, t_w=1.0)
    draw_timeline(sims[kind].timelines, ax=ax, title=kind)
plt.tight_layout(); plt.show()

print(f"{'schedule':12} {'makespan':>9} {'bubble (sim)':>13} {'formula':>9} {'peak in flight':>15}")
for kind, sim in sims.items():
    peak = max(sim.peak_activations.values())
    print(f"{kind:12} {sim.makespan:9.1f} {sim.bubble_fraction:13.3f} {formulas[kind]:9.3f} {peak:15.1f}")
    assert abs(sim.bubble_fraction - formulas[kind]) < 1e-9
assert max(sims["afab"].peak_in_flight.values()) == m       # AFAB holds every micro-batch
assert max(sims["1f1b"].peak_in_flight.values()) <= p       # 1F1B at most p
''', r'''%md
The numbers in the boxes are micro-batches; lighter boxes in the interleaved row are the second
model chunk. AFAB and 1F1B have the same makespan — 1F1B wins on memory (rank 0 holds 4
micro-batches of activations instead of 8) — interleaving shortens the ramps, and ZB-H1 pushes
W into the places where 1F1B waits.

The bubble shrinks with more micro-batches — but for a fixed global batch, more micro-batches
means smaller ones, and small matmuls run less efficiently:
''', r'''
ms, points = np.arange(1, 33), np.arange(4, 33, 4)
fig, ax = plt.subplots(figsize=(6, 3.2))
for kind, chunks, style in (("1f1b", 1, "o"), ("interleaved", 2, "s"), ("zb-h1", 1, "^")):
    sim = [simulate(build_schedule(kind, p, int(mm), chunks), p, chunks, t_w=1.0).bubble_fraction
           for mm in points]
    ax.plot(points, sim, style, label=f"{kind} (simulated)")
ax.plot(ms, (p - 1) / (ms + p - 1), "k-", lw=1, label="(p-1)/(m+p-1)")
ax.plot(ms, (p - 1) / (2 * ms + p - 1), "k--", lw=1, label="(p-1)/(2m+p-1)")
ax.plot(ms, (p - 1) / (3 * ms + p - 1), "k:", lw=1, label="(p-1)/(3m+p-1)")
ax.set_xlabel("micro-batches m"); ax.set_ylabel("bubble"); ax.set_title(f"p = {p}")
ax.legend(fontsize=7); plt.show()
''', r'''%md
## 2. A real pipeline, traced

Now the engine executes the 1F1B action lists on 2 ranks (`--pp 2`), sending activations and gradients
with non-blocking point-to-point messages. With `--trace` every F, B, send and recv of the last step
is timed (after a barrier, so both ranks share a time origin) and written as Chrome trace JSON — open
it in [Perfetto](https://ui.perfetto.dev). The log line of that step carries the **measured** bubble
(idle share of the ranks' time: $1 - \sum_r \text{busy}_r / (p \cdot \text{makespan})$) and the
**simulated** one: the simulator run with the measured mean F and B times.

The model is small but not tiny (4 layers, $d = 64$, 64 tokens, batch 16) so that each op takes
milliseconds rather than microseconds: with smaller ops, Python overhead and message latency
(which the simulator takes as zero) dominate. In float64 we also check the losses against one
process.
''', r'''
work = tempfile.mkdtemp()
MODEL = ["--n-layer", "4", "--d-model", "64", "--n-head", "4", "--seq-len", "64", "--batch-size", "16",
         "--steps", "3", "--precision", "fp64", "--seed", "0", "--data", os.path.join(ROOT, "README.md"),
         "--quiet", "--eval-batches", "0", "--backend", BACKEND]
trace_path, log_path = os.path.join(work, "trace.json"), os.path.join(work, "pp.json")
mpirun(2, ["-m", "minipar", "train", *MODEL, "--pp", "2", "--schedule", "1f1b", "--microbatches", "4",
           "--trace", trace_path, "--log-json", log_path])
pp_log = [json.loads(line) for line in open(log_path)]
last = pp_log[-1]
mpirun(1, ["-m", "minipar", "train", *MODEL, "--log-json", os.path.join(work, "single.json")])
single = [json.loads(line)["loss"] for line in open(os.path.join(work, "single.json"))]
np.testing.assert_allclose([r["loss"] for r in pp_log], single, rtol=1e-12)
print("pp=2 losses == single-process losses:", [round(r["loss"], 12) for r in pp_log])
''', r'''
from minipar.parallel.pipeline import bubble_fraction

trace = json.load(open(trace_path))
timelines = {}
for e in trace["traceEvents"]:
    if e["ph"] == "X":
        a = e["args"]
        timelines.setdefault(e["tid"], []).append(
            (e["cat"], a["microbatch"], a["chunk"], e["ts"] / 1e3, (e["ts"] + e["dur"]) / 1e3))
fig, axes = plt.subplots(2, 1, figsize=(12, 4.2))
draw_timeline(timelines, ax=axes[0], title="measured 1F1B, p = 2, m = 4 (ms)")
ops = trace["metadata"]["mean_op_s"]
sim = simulate(build_schedule("1f1b", 2, 4), 2, t_f=ops["F"] * 1e3, t_b=ops["B"] * 1e3)
draw_timeline(sim.timelines, ax=axes[1], title="simulated with the measured mean F, B times (ms)")
axes[1].set_xlim(axes[0].get_xlim())
plt.tight_layout(); plt.show()

measured, simulated = last["measured_bubble"], last["simulated_bubble"]
print(f"mean F {ops['F'] * 1e3:.2f} ms, mean B {ops['B'] * 1e3:.2f} ms")
print(f"measured bubble  {measured:.1%}   (from the trace: {bubble_fraction(timelines):.1%})")
print(f"simulated bubble {simulated:.1%}   formula (p-1)/(m+p-1) = {1 / 5:.1%}")
assert abs(bubble_fraction(timelines) - measured) < 1e-9
# timings never decide a check here (the machine may be shared); benchmarks/pipeline_bubble.py
# repeats this run and reports how close the two are
verdict = "within" if abs(measured - simulated) <= 0.10 else "NOT within"
print(f"measured is {verdict} 10 points of the simulator's prediction on this run")
''', r'''%md
The thin bars are receives (time blocked waiting for a neighbour's message, part of the
bubble) and sends (posting a non-blocking send: brief). On a quiet machine the
measured bubble is close to the simulator's, and both near $(p-1)/(m+p-1)$ = 20%; what differs is
real: ops of the same kind do not all take the same time (the last stage also computes the head and
the loss), messages take time, and the machine is shared.

## Takeaways

- A pipeline schedule is data: a list of F/B/W actions per rank that can be validated, simulated and
  drawn without running anything; the engine only executes it.
- Bubble $=\frac{p-1}{m+p-1}$ for AFAB and 1F1B; 1F1B holds $\le p$ micro-batches of activations
  instead of $m$. Interleaving divides the ramp by $v$; ZB-H1 fills it with deferred weight gradients.
- A traced run shows the bubble for real and matches the simulator fed with measured op times.
''']

# --------------------------------------------------------------------------- 12
L12 = [r'''%md
# 12 · 3D parallelism: putting it together

Each kind of parallelism splits a different thing and has a different price:

| | splits | communication | where it goes |
|---|---|---|---|
| tensor (tp, lesson 07) | every matmul | 4 all-reduces of $b\,s\,h$ per layer | inside a node |
| pipeline (pp, lesson 08) | the layers | one activation per micro-batch, point to point; the bubble | across nodes |
| data (dp, lessons 05–06) | the batch | one all-reduce (or reduce-scatter + all-gather) of the gradients per step | outermost |

`ProcessGrid(comm, dp=, tp=, pp=)` arranges $dp\cdot tp\cdot pp$ ranks with tensor parallelism fastest:

$$\text{rank} = pp_\text{rank}\cdot(dp\cdot tp) + dp_\text{rank}\cdot tp + tp_\text{rank}$$

so the ranks of one tp group are adjacent (one node), the replicas of a stage come next, and the
pipeline stages are farthest apart. Each rank belongs to one tp group, one dp group and one pp group
(sub-communicators). Because `--batch-size` is the **global** batch, every layout sees the same data
and makes the same update as one process.
''', r'''
import json
import os
import subprocess
import sys
import tempfile
import time

import matplotlib.pyplot as plt
import numpy as np

from minipar.parallel.grid import coordinates

%matplotlib inline
''' + LAUNCH, r'''
dp, tp, pp = 2, 2, 2
fig, ax = plt.subplots(figsize=(8, 3))
for rank in range(dp * tp * pp):
    c = coordinates(rank, dp, tp, pp)
    x, y = c.pp * 3.2 + c.tp * 1.3, c.dp * 1.2
    ax.add_patch(plt.Rectangle((x, y), 1.1, 0.9, fc=["#8dd3c7", "#fdb462"][c.pp], ec="k"))
    ax.text(x + 0.55, y + 0.45, f"rank {rank}\ndp{c.dp} tp{c.tp} pp{c.pp}", ha="center", va="center", fontsize=8)
for s in range(pp):
    ax.text(s * 3.2 + 1.2, 2.6, f"stage {s}: layers {2 * s}-{2 * s + 1}", ha="center")
ax.set_xlim(-0.2, 6.0); ax.set_ylim(-0.2, 2.9); ax.axis("off")
ax.set_title("dp2 × tp2 × pp2: tp pairs side by side, replicas stacked, stages left → right")
plt.show()
assert [coordinates(r, dp, tp, pp).tp for r in (0, 1)] == [0, 1]   # tp fastest
assert coordinates(4, dp, tp, pp).pp == 1                           # pp slowest
''', r'''%md
## 1. One model, five layouts

The same tiny GPT (4 layers, $d = 16$, 4 heads, 8 tokens, global batch 8) for 6 AdamW steps in
float64 under each layout, through the command line — exactly what one would launch on a cluster
(`--backend cupy` there):

```
mpiexec -n 8 python -m minipar train --dp 2 --tp 2 --pp 2 --schedule 1f1b --microbatches 4 \
        --precision fp64 --steps 6 --log-json log.json --trace trace.json
```

The pipeline layouts run 1F1B with 4 micro-batches and write a trace of their last step.
''', r'''
work = tempfile.mkdtemp()
MODEL = ["--n-layer", "4", "--d-model", "16", "--n-head", "4", "--seq-len", "8", "--batch-size", "8",
         "--steps", "6", "--precision", "fp64", "--seed", "0", "--data", os.path.join(ROOT, "README.md"),
         "--quiet", "--eval-batches", "0", "--backend", BACKEND]
PIPE = ["--schedule", "1f1b", "--microbatches", "4"]
LAYOUTS = {"1": (1, []), "dp4": (4, ["--dp", "4"]), "tp2×dp2": (4, ["--tp", "2", "--dp", "2"]),
           "pp2×dp2": (4, ["--pp", "2", "--dp", "2", *PIPE]),
           "dp2×tp2×pp2": (8, ["--dp", "2", "--tp", "2", "--pp", "2", *PIPE])}
logs, traces = {}, {}
for name, (n, flags) in LAYOUTS.items():
    tag = name.replace("×", "x")
    log, trace = os.path.join(work, tag + ".json"), os.path.join(work, tag + ".trace.json")
    extra = ["--trace", trace] if "--pp" in flags else []
    mpirun(n, ["-m", "minipar", "train", *MODEL, *flags, *extra, "--log-json", log], timeout=300)
    logs[name] = [json.loads(line) for line in open(log)]
    traces[name] = json.load(open(trace)) if extra else None
''', r'''
fig, ax = plt.subplots(figsize=(6, 3.5))
base = np.array([r["loss"] for r in logs["1"]])
for (name, log), style in zip(logs.items(), ["-", "--", "-.", ":", (0, (1, 3))]):
    losses = np.array([r["loss"] for r in log])
    ax.plot(losses, linestyle=style, lw=4 if name == "1" else 2, alpha=0.5 if name == "1" else 1, label=name)
    err = np.max(np.abs(losses - base) / base)
    print(f"{name:12} losses {np.round(losses, 10)}  max rel. diff vs 1 rank {err:.1e}")
    np.testing.assert_allclose(losses, base, rtol=1e-10, atol=0)
ax.set_xlabel("step"); ax.set_ylabel("loss"); ax.set_title("five layouts, one loss curve (float64)")
ax.legend(fontsize=8); plt.show()
''', r'''%md
The curves lie on top of each other: every layout computes the single-process step, up to the order
of floating-point sums.

## 2. Where the time goes

For each layout, the mean over steps 1–5 (step 0 warms up) of:

* **communication** — `comm_time_s` of the log: time blocked waiting for the data-parallel gradient
  sync, plus the loss all-reduce;
* **bubble** — for the pipeline layouts, the measured bubble fraction of the traced step times the
  pipeline's makespan in that trace: rank-time spent idle or waiting for activations;
* **compute** — the rest of the step time. Note that the tensor-parallel all-reduces happen *inside*
  forward and backward and are not timed separately by the log, so for the tp layouts they are part
  of this bar.

On 2 CPU cores with up to 8 ranks this is a picture of overheads, not of speed-up: the model is tiny
and the ranks take turns on the cores. On a cluster the same command and the same split show where a
layout loses its time.
''', r'''
rows = []
for name, log in logs.items():
    steps = log[1:]
    step = np.mean([r["step_time_s"] for r in steps])
    comm = np.mean([r["comm_time_s"] for r in steps])
    bubble = 0.0
    if traces[name] is not None:
        ev = [e for e in traces[name]["traceEvents"] if e["ph"] == "X"]
        makespan = (max(e["ts"] + e["dur"] for e in ev) - min(e["ts"] for e in ev)) / 1e6
        bubble = log[-1]["measured_bubble"] * makespan
    rows.append((name, max(step - comm - bubble, 0.0), comm, bubble, step))
print(f"{'layout':12} {'step ms':>8} {'compute':>8} {'comm':>8} {'bubble':>8}")
for name, c, m, b, s in rows:
    print(f"{name:12} {s * 1e3:8.1f} {c * 1e3:8.1f} {m * 1e3:8.1f} {b * 1e3:8.1f}")

fig, ax = plt.subplots(figsize=(7, 3.5))
names = [r[0] for r in rows]
bottom = np.zeros(len(rows))
for i, (part, color) in enumerate((("compute", "#55A868"), ("communication", "#C44E52"), ("bubble", "#BBBBBB")), 1):
    vals = np.array([r[i] for r in rows]) * 1e3
    ax.bar(names, vals, bottom=bottom, color=color, label=part)
    bottom += vals
ax.set_ylabel("ms per step (mean of steps 1-5)"); ax.legend(fontsize=8)
ax.set_title("per-step time split (tiny model, 2 shared CPU cores)"); plt.show()
for name, _, _, b, _ in rows:
    assert (b > 0) == ("pp" in name)            # only pipelines have a bubble
    assert all(r["comm_time_s"] >= 0 for r in logs[name])
''', r'''%md
## Takeaways

- One `ProcessGrid` composes the three: tp innermost (adjacent ranks), dp across replicas, pp
  across stages; every rank holds one tp, one dp and one pp sub-communicator.
- With `--batch-size` the global batch, every layout reproduces the single process: the five loss
  curves coincide to $10^{-10}$ in float64.
- Choosing a layout is choosing which cost to pay: tp's per-layer all-reduces (fast links only),
  pp's bubble (more micro-batches, interleaving, ZB-H1), dp's gradient all-reduce (overlap, ZeRO
  for the memory). The log's `comm_time_s` and the pipeline trace show which one dominates.
''']


NOTEBOOKS = {"05_data_parallel.ipynb": L05, "06_zero.ipynb": L06, "08_pipeline.ipynb": L08,
             "12_3d_parallel.ipynb": L12}


def main():
    for name, cells in NOTEBOOKS.items():
        path = os.path.join(HERE, name)
        nbformat.write(build(cells), path)
        print("wrote", os.path.relpath(path))


if __name__ == "__main__":
    main()
