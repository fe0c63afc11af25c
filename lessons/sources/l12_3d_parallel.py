"""Lesson 12: the cells of lessons/12_3d_parallel.ipynb (``%md`` cells are markdown).

Edit here, then run ``python lessons/make_notebooks.py``."""
from launch import LAUNCH   # the cell that defines mpirun() for the lesson's runs

NOTEBOOK = "12_3d_parallel.ipynb"

CELLS = [r'''%md
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
from minipar.monitor import step_records

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
    logs[name] = step_records(log)
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
