"""Lesson 12: the cells of lessons/12_3d_parallel.ipynb (``%md`` cells are markdown).

Edit here, then run ``python lessons/make_notebooks.py``."""
from launch import LAUNCH   # the cell that defines mpirun() for the lesson's runs

NOTEBOOK = "12_3d_parallel.ipynb"

CELLS = [r'''%md
# 12 · 3D parallelism: putting it together

Each kind of parallelism splits a different thing and has a different price:

| | splits | communication | where it goes |
|---|---|---|---|
| tensor (tp, lesson 07) | every matmul | 4 all-reduces of $b\,s\,h$ per layer, blocking, on the critical path | inside a node |
| pipeline (pp, lesson 08) | the layers | one activation per micro-batch, point to point; the bubble | across nodes |
| data (dp, lessons 05–06) | the batch | one all-reduce (or reduce-scatter + all-gather) of the gradients per step, overlapped with backward | outermost |

`ProcessGrid(comm, dp=, tp=, pp=)` arranges $dp\cdot tp\cdot pp$ ranks with tensor parallelism fastest:

$$\text{rank} = pp_\text{rank}\cdot(dp\cdot tp) + dp_\text{rank}\cdot tp + tp_\text{rank}$$

so the ranks of one tp group are adjacent (one node), the replicas of a stage come next, and the
pipeline stages are farthest apart. Each rank belongs to one tp group, one dp group and one pp group
(sub-communicators). Because `--batch-size` is the **global** batch, every layout sees the same data
and makes the same update as one process. (Context parallelism, lesson 16, adds a fourth axis between
tp and dp; with `cp = 1` it disappears from every formula here.)

Plan: (1) the grid — **exercises**: a rank's coordinates, and the members of its groups, checked
against `ProcessGrid`'s own splits; (2) one model trained under five layouts, one loss curve;
(3) where each layout's time goes, from the training log, and the pipeline's bubble from its trace.
''', r'''
import inspect
import json
import os
import subprocess
import sys
import tempfile
import time

import matplotlib.pyplot as plt
import numpy as np

from minipar.parallel.grid import ProcessGrid, coordinates
from minipar.parallel.pipeline.draw import draw_timeline
from minipar.parallel.pipeline.timeline import Span, bubble_fraction
from minipar.observe.runlog import step_records

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
## 1. The grid

### Exercise 1 — a rank's coordinates

Write `my_coordinates(rank, dp, tp, pp)` returning `(dp_rank, tp_rank, pp_rank)`: invert the
numbering above (tp changes fastest, pp slowest). The check runs every rank of several grids —
odd sizes and degenerate axes included — against `minipar.parallel.grid.coordinates`.
''', r'''%exercise my_coordinates
def my_coordinates(rank, dp, tp, pp):
    """(dp_rank, tp_rank, pp_rank) of `rank` in a dp × tp × pp grid numbered tp-fastest."""
    raise NotImplementedError("hint: the tp rank is the remainder of rank by tp; divide out tp and "
                              "the dp rank is the next remainder (by dp); what is left is the pp rank")
''', r'''
GRIDS = [(2, 2, 2), (1, 4, 2), (3, 1, 2), (2, 3, 1), (1, 1, 5), (3, 2, 2)]
for dp_, tp_, pp_ in GRIDS:
    for rank in range(dp_ * tp_ * pp_):
        c = coordinates(rank, dp_, tp_, pp_)
        mine = tuple(my_coordinates(rank, dp_, tp_, pp_))
        assert mine == (c.dp, c.tp, c.pp), f"dp{dp_} tp{tp_} pp{pp_}, rank {rank}: yours {mine}, library {c}"
print(f"your coordinates match minipar's for every rank of {len(GRIDS)} grids")
''', r'''%md
### Exercise 2 — the groups a rank belongs to

A rank's **tp group** is the ranks with its dp and pp coordinates (they split each matmul), its
**dp group** the ranks with its tp and pp coordinates (the replicas of its shard: they average
gradients), its **pp group** the ranks with its dp and tp coordinates (the stages its activations
flow through). Write `group_members(rank, dp, tp, pp, kind)` for `kind` in `"tp"`, `"dp"`, `"pp"`:
the world ranks of that group, **in the order of their rank inside the group** (the tp rank, dp rank
or stage).

How does the library build them? `ProcessGrid` calls `comm.split(color, key)` (MPI's
`Comm_Split`) once per kind: ranks passing the same colour land in one sub-communicator, numbered by
key. The check needs no MPI: a stand-in communicator records each rank's `(color, key)`, a
`ProcessGrid` is built for every rank of the grid — one process simulating all of them — and the
groups follow from the recorded colours and keys.
''', r'''%exercise group_members
def group_members(rank, dp, tp, pp, kind):
    """World ranks of `rank`'s `kind` group ("tp", "dp" or "pp"), ordered by rank within the group."""
    raise NotImplementedError("hint: the members are the ranks whose coordinates equal yours on the two "
                              "other axes; list them by the coordinate of this axis (my_coordinates or "
                              "the rank formula above)")
''', r'''
class RecordingComm:
    """One rank's communicator, as far as ProcessGrid needs it: split() records, sends nothing."""

    def __init__(self, rank, size):
        self.rank, self.size = rank, size

    def split(self, color, key):
        return color, key


def library_groups(dp, tp, pp, kind):
    """{rank: its `kind` group in group order}, from ProcessGrid's own splits of every rank."""
    n = dp * tp * pp
    split = {r: getattr(ProcessGrid(RecordingComm(r, n), dp=dp, tp=tp, pp=pp), f"{kind}_comm")
             for r in range(n)}
    groups = {}
    for r, (color, key) in split.items():
        groups.setdefault(color, []).append((key, r))       # MPI: same colour, ordered by key, rank
    return {r: [m for _, m in sorted(groups[split[r][0]])] for r in range(n)}


for dp_, tp_, pp_ in GRIDS:
    for kind in ("tp", "dp", "pp"):
        want = library_groups(dp_, tp_, pp_, kind)
        for rank, members in want.items():
            mine = list(group_members(rank, dp_, tp_, pp_, kind))
            assert mine == members, f"dp{dp_} tp{tp_} pp{pp_}, rank {rank}, {kind}: yours {mine}, ProcessGrid {members}"
print("your groups match ProcessGrid's splits; in dp2 × tp2 × pp2, rank 5 is in")
for kind in ("tp", "dp", "pp"):
    print(f"  its {kind} group {group_members(5, 2, 2, 2, kind)}")
''', r'''%md
The library's side (`minipar/parallel/grid.py`): the coordinates, and one split per kind whose colour
is the coordinates that stay fixed and whose key is the one that varies:
''', r'''
print(inspect.getsource(coordinates))
init = inspect.getsource(ProcessGrid.__init__).splitlines()
print("\n".join(line for line in init if "split" in line or "coordinates" in line))
''', r'''%md
## 2. One model, five layouts

The same tiny GPT (4 layers, $d = 16$, 4 heads, 8 tokens, global batch 8) for 6 AdamW steps in
float64 under each layout, through the command line — exactly what one would launch on a cluster
(`--backend cupy` there):

```
mpiexec -n 8 python -m minipar train --dp 2 --tp 2 --pp 2 --schedule 1f1b --microbatches 4 \
        --precision fp64 --steps 6 --log-json log.json --trace trace.json
```

The pipeline layouts run 1F1B with 4 micro-batches and write a trace of their last step. The log
starts with a `{"header": ...}` line and ends with a `{"final": ...}` one; `step_records(path)`
returns the step records in between.
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

## 3. Where the time goes

Every rank times its own step and the log keeps each rank's split (`per_rank`), which adds up to
the step:

* **communication** — `comm_time_s`: the time this rank was *blocked* in a collective: the
  data-parallel gradient sync that backward did not hide, the loss all-reduce, and — for the tp
  layouts — the **tensor-parallel all-reduces**. Those run inside forward and backward, but nothing
  computes while they wait: they are communication on the critical path, and every one is timed
  (`timed` in `minipar/parallel/tensor/regions.py` adds its seconds to the tp communicator's
  `blocking_comm_s`, which the training loop reads before and after the step);
* **pipeline wait** — `pipeline_wait_s`: time spent receiving activations or gradients from the
  neighbouring stage and draining the last sends — where the bubble shows up in the log;
* **optimizer** — `optimizer_s`: the AdamW step (minus its own communication);
* **compute** — `compute_s`, what is left: forward and backward arithmetic.

The lines of the training loop (`minipar/train/loop.py`) that make `comm_time_s`:
''', r'''
from minipar.train.loop import TrainingRun
print("\n".join(line for line in inspect.getsource(TrainingRun.step).splitlines()
                if "tp_before" in line or "tp_comm =" in line or "comm = " in line or "comm_wait_s" in line))
''', r'''%md
Below: for each layout the mean over steps 1–5 (step 0 warms up) and over its ranks. On 2 CPU cores
with up to 8 ranks this is a picture of overheads, not of speed-up: the model is tiny and the ranks
take turns on the cores, so a rank blocked in a collective is mostly waiting for its partner to get
a core at all. On a cluster the same command and the same split show where a layout loses its time.
''', r'''
PARTS = (("compute_s", "compute", "#55A868"), ("comm_time_s", "communication (dp sync, loss, tp)", "#C44E52"),
         ("pipeline_wait_s", "pipeline wait", "#BBBBBB"), ("optimizer_s", "optimizer", "#8172B2"))
rows = {}
for name, log in logs.items():
    steps = log[1:]
    split = {key: np.mean([np.mean(r["per_rank"][key]) for r in steps]) for key, _, _ in PARTS}
    split["step"] = np.mean([np.mean(r["per_rank"]["step_time_s"]) for r in steps])
    rows[name] = split
    total = sum(split[key] for key, _, _ in PARTS)
    assert np.isclose(total, split["step"], rtol=0.02), (name, total, split["step"])   # the parts add up
print(f"{'layout':12} {'step ms':>8} {'compute':>8} {'comm':>8} {'pp wait':>8} {'optim':>8}")
for name, r in rows.items():
    print(f"{name:12} {r['step'] * 1e3:8.1f} " + " ".join(f"{r[k] * 1e3:8.1f}" for k, _, _ in PARTS))

fig, ax = plt.subplots(figsize=(7.5, 3.5))
bottom = np.zeros(len(rows))
for key, label, color in PARTS:
    vals = np.array([r[key] for r in rows.values()]) * 1e3
    ax.bar(list(rows), vals, bottom=bottom, color=color, label=label)
    bottom += vals
ax.set_xlabel("layout"); ax.set_ylabel("ms per step (mean of steps 1-5, over ranks)")
ax.legend(fontsize=8); ax.set_title("per-step time split (tiny model, 2 shared CPU cores)"); plt.show()
for name, r in rows.items():
    assert (r["pipeline_wait_s"] > 0) == ("pp" in name)            # only pipelines wait on stages
    assert r["comm_time_s"] > 0
sent = {name: sum(r["dp_bytes_sent"] for r in log) for name, log in logs.items()}
assert sent["1"] == 0 and sent["dp4"] > 0       # one process's "communication" is its loss's read
''', r'''%md
The tp layout's communication bar contains its tensor-parallel all-reduces: 2 in forward and 2 in
backward per layer, each blocking both ranks of the pair until the slower one arrives.

### The pipeline's bubble, from its trace

The trace of the last step holds, per stage (of the first replica and first tp rank), its spans:
**F** and **B** cover the stage's own forward and backward only — in the tp layout that includes its
tp all-reduces, which are part of computing the stage's layers — and the receives and sends are
spans of their own. So the bubble is measured as the share of rank-time not spent in F or B:

$$\text{bubble} = 1 - \frac{\sum_\text{stages} \text{busy}}{pp \cdot \text{makespan}},$$

and the simulator of lesson 08, fed each stage's measured mean F and B times, predicts it for the
same schedule. Here both pipeline layouts' traces, redrawn from the JSON, the bubble recomputed from
their spans (it must be the log's `measured_bubble`) and set beside the simulated one:
''', r'''
fig, axes = plt.subplots(2, 1, figsize=(10, 4.2))
for ax, name in zip(axes, [n for n in LAYOUTS if traces[n] is not None]):
    timelines = {}
    for e in traces[name]["traceEvents"]:
        if e["ph"] == "X":
            timelines.setdefault(e["tid"], []).append(Span(e["cat"], e["args"]["microbatch"], e["args"]["chunk"],
                                                           e["ts"] / 1e3, (e["ts"] + e["dur"]) / 1e3))
    last = logs[name][-1]
    mine = bubble_fraction(timelines)
    assert abs(mine - last["measured_bubble"]) < 1e-6, (mine, last["measured_bubble"])
    assert last["measured_bubble"] > 0
    print(f"{name:12} bubble: measured {last['measured_bubble']:.1%} (recomputed from the spans {mine:.1%}), "
          f"simulated {last['simulated_bubble']:.1%} ({100 * (mine - last['simulated_bubble']):+.0f} points); "
          f"ideal 1F1B (p-1)/(m+p-1) = {1 / (4 + 1):.1%}")
    draw_timeline(timelines, ax=ax, title=f"{name}, last step, 1F1B, m = 4")
    ax.set_xlabel("ms since the step's barrier"); ax.set_ylabel("stage")
plt.tight_layout(); plt.show()
''', r'''%md
The white gaps are the bubble; the thin bars under the rows are receives (waiting for a neighbour)
and sends. With equal stages and every stage running whenever it has work, the 1F1B bubble is
$(p-1)/(m+p-1) = 1/5$ for $p = 2$, $m = 4$. The simulator drops the first assumption — it is fed
each stage's measured mean F and B times (the last stage also runs the head and the loss) — but
keeps the second. On this machine the second fails: 4 or 8 ranks share 2 cores, so a stage that has
work is often not running at all — its F or B span stretches when it is preempted, and its
neighbour meanwhile sits in a receive — and the measured bubble comes out above the simulated one by
however much the scheduler interfered in this run. On devices of their own the two agree within a
few points (minipar's tests check it with one deliberately slowed stage at m = 4 and 8).

## Takeaways

- One `ProcessGrid` composes the three: tp innermost (adjacent ranks), dp across replicas, pp
  across stages; every rank holds one tp, one dp and one pp sub-communicator, each one
  `comm.split(colour = the fixed coordinates, key = the varying one)`.
- With `--batch-size` the global batch, every layout reproduces the single process: the five loss
  curves coincide to $10^{-10}$ in float64.
- Choosing a layout is choosing which cost to pay: tp's per-layer all-reduces (blocking, on the
  critical path: fast links only), pp's bubble (more micro-batches, interleaving, ZB-H1), dp's
  gradient all-reduce (overlap, ZeRO for the memory). The log's per-rank `comm_time_s`,
  `pipeline_wait_s` and `compute_s`, and the pipeline trace, show which one dominates.

''', r'''%md
## What changes on GPU nodes and at scale

- The grid maps onto the machine: tp inside a node (NVLink, 300 GB/s per GPU on an A100 node, 450 on
  H100), pp and dp across nodes (InfiniBand 25 and 50 GB/s per GPU) — the repository's spec-sheet
  profiles. `python -m minipar plan --ranks 1024 --nodes 128 --profile a100` ranks every layout with
  these numbers; lesson 13 plans a 175B model that way.
- At scale dp is often hybrid-sharded (ZeRO-3/FSDP inside a node, replicas across), and cp joins the grid
  for long sequences (lesson 16).

## In PyTorch / DeepSpeed / Megatron this is …

- **Megatron-LM**: `--tensor-model-parallel-size`, `--pipeline-model-parallel-size` (data
  parallelism is what is left of the world), `--num-layers-per-virtual-pipeline-stage`;
  `megatron.core.parallel_state.initialize_model_parallel` builds the groups — tp innermost, as
  here — and `get_tensor_model_parallel_group()`, `get_data_parallel_group()`,
  `get_pipeline_model_parallel_group()` return them.
- **PyTorch**: `torch.distributed.device_mesh.init_device_mesh("cuda", (pp, dp, tp),
  mesh_dim_names=("pp", "dp", "tp"))`, then `mesh["tp"].get_group()`; tensor parallelism with
  `torch.distributed.tensor.parallel.parallelize_module`, pipelines with `torch.distributed.pipelining`,
  FSDP2's `fully_shard` over the dp dimension — the TorchTitan recipe.
- **DeepSpeed**: `deepspeed.pipe.PipelineModule` with a `PipeModelDataParallelTopology` (its
  `get_coord(rank)` is our `coordinates`), ZeRO over the data-parallel group, Megatron-DeepSpeed
  for the tensor-parallel layers.
- `torch.profiler` / Nsight Systems traces, opened in Perfetto like `--trace`'s JSON.
''']
