"""Lesson 12: the cells of lessons/12_3d_parallel.ipynb (``%md`` cells are markdown).

Edit here, then run ``python lessons/make_notebooks.py``."""
from launch import LAUNCH   # the cell that defines mpirun() for the lesson's runs

NOTEBOOK = "12_3d_parallel.ipynb"

CELLS = [r'''%md
# 12 · 3D parallelism: your pieces, one training step

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
against `ProcessGrid`'s own splits; (2) the capstone — **exercise**: your DDP, tensor and sequence
parallelism, 1F1B executor and ring attention composed into one training step on 8 ranks, with the
gradient rules only a composed step has, against the library's losses; (3) one model trained under
three layouts, one loss curve; (4) where each layout's time goes, from the training log, and the
pipeline's bubble from its trace.
''', r'''
import importlib
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
## 2. The capstone: your pieces, one 3D training step

From lesson 05 to 16 you wrote each mechanism alone, and each was checked alone. Now they run together:
one training step on 8 ranks, composed of **your** pieces, that must reproduce the library's training
of the same layout to $10^{-9}$ in float64, step after step.

Every `%%writefile {MINE}/…` cell of the course saved your code into one folder, `MINE` (below): it
outlives the notebooks, so this lesson finds what the earlier ones wrote. The capstone takes from it:

| piece | file | lesson | how it enters the step |
|---|---|---|---|
| DDP: buckets all-reduced from the gradient hooks | `ddp.py` (`MyDDP`) | 05 | you build it (`wire`) and finish it |
| f and g; sequence parallelism's all-gather and reduce-scatter; the vocabulary-parallel loss | `my_regions.py`, `my_sequence_parallel.py` | 07 | the check puts them into the library's tp layers and loss |
| the 1F1B stage executor | `stage.py` (`run_stage`) | 08 | you run it on this rank's stage |
| ring attention | `ring.py` (`ring_attention`) | 16 | the check makes it every attention core's forward (its backward is the library's, from your output and log-sum-exp) |

Lesson 06's ZeRO does not enter: its pieces are a one-process ZeRO-1 and a ZeRO-3 step, and the
library refuses ZeRO-3 with a pipeline (its units are the whole model's layers, gathered on every
rank); data parallelism here is your DDP.

### The rules only a composed step has

Each piece alone was right. Put together, four facts decide whether the gradient and its norm are
those of one process on the whole batch:

1. **Average over dp × cp.** The ranks that hold the same weights and see different data are the
   replicas (dp) *and* the context-parallel ranks (cp): a cp rank's loss is the mean over its
   positions, and the global mean is the mean of the dp·cp ranks' means (every rank holds as many
   tokens). Their group is `grid.dp_cp_comm` (with cp = 1, `grid.dp_comm`).
2. **Sum the sequence-parallel parts over tp.** With sequence parallelism the layer norms, the
   positions' table and the biases after a row-parallel layer run on this tp rank's $s/t$ tokens
   only: every tp rank holds the whole weight, but a gradient from its own tokens, and the weight's
   gradient is their sum, $dW = \sum_r dW_r$. Without sequence parallelism the same weights see every
   token on every tp rank: their gradient is already whole, and a sum would make it $t$ times too large.
3. **Count every element once in the norm.** $\lVert g\rVert^2$ of the whole model is a sum over
   what every rank holds, but a weight replicated on the $t$ tp ranks is held $t$ times (weight
   $w = 1/t$), and the dp·cp replicas hold the same gradient (divide by the copies, dp·cp); tp slices
   and pipeline stages hold different elements (summed). So one all-reduce over every rank of
   $\sum w\,g^2 / (dp\cdot cp)$ gives $\lVert g\rVert^2$ (squares in float64).
4. **Fold the found-inf flag into that all-reduce.** Under fp16 a step is skipped when any gradient
   anywhere holds inf or NaN, and the ranks must agree, or their weights part ways. Flags are $\ge 0$,
   so their sum is their "any": the all-reduce carries $[\sum w\,g^2/(dp\cdot cp),\ \text{flag}]$, one
   collective for both.

After your norm the check does what the library's optimizer does next: clips to 0.05 when
$\lVert g\rVert$ is larger, and takes the AdamW step.
''', r'''%md
### Exercise 3 — the 3D step

Write three functions in `step3d.py`:

- `wire(grid, module, bucket_bytes)`: once per run, your `MyDDP` over the group of rule 1; return it.
- `gradients_3d(grid, ddp, stage, actions, held, sequence_parallel)`: one step's forward and backward
  — the micro-batches through your 1F1B executor over the pipeline's group (`stage` is this rank's
  stage of the model in lesson 08's interface, `actions` its 1F1B list), your DDP's finish, and
  rule 2. Afterwards every `h.param.grad` of `held` is this rank's piece of the gradient of the
  global batch's mean loss.
- `norm_and_overflow(grid, held)`: rules 3 and 4; returns `(norm, overflow)`, the same on every rank.

`grid` is a `ProcessGrid(comm, dp=, tp=, pp=, cp=)`: its sizes `grid.dp`, `grid.tp`, `grid.pp`,
`grid.cp` and its groups `grid.tp_comm`, `grid.cp_comm`, `grid.dp_comm`, `grid.dp_cp_comm`,
`grid.pp_comm` and `grid.world` (every rank). `held` lists this rank's parameters: `h.name` (its name in
the whole model), `h.param` (`h.param.grad`) and `h.replicated_over_tp` (True when every tp rank holds
all of it; False for a tp slice).

The next cell starts `12_yours.py` on 8 ranks, for two layouts of a tiny GPT (2 blocks, $d = 16$, 4
heads, 16 tokens; 8 sequences in 4 micro-batches; 3 AdamW steps in float64):

- **dp2 × tp2 × pp2**: your DDP over the replicas, your f and g in every block, your executor;
- **cp2 × tp2 × pp2** with sequence parallelism: your ring attention over the cp pair, your DDP over
  it too, your all-gather and reduce-scatter of the sequence in place of f and g.

In both, the loss is your vocabulary-parallel cross-entropy.

Beside yours, on the same ranks, the library's training step of the same layout (`parallelize`,
`build_optimizer`, `train_step`: what `minipar train` runs) and one process on the whole batch.
Every step it checks that your stage ran every micro-batch, every gradient against one process's
(its tp piece, $10^{-10}$), your norm against one process's, and the step's loss against the
library's ($10^{-9}$; from the second step on it carries your earlier updates); rank 0 prints both. Then, on its own, the found-inf rule in fp16:
your norm of the gradients cast to fp16, and one rank's inf, which every rank must see, through no
more messages than one all-reduce of two numbers sends. A failure names the rank, the layout and
step, the parameter and the rule whose absence would explain it.

Your DDP is a piece that knows no pipeline: it starts a bucket's all-reduce whenever the bucket's last
gradient arrives — with 4 micro-batches, 4 times a step. The gradient is still the mean, but the bytes
are 4 times the library's, whose synchroniser stays quiet (`no_sync`) until the last micro-batch: each
step's line ends with both counts, what rank 0 sent over dp × cp.
''', r'''%exercise capstone_step
%%writefile {MINE}/step3d.py
"""Your 3D training step (lesson 12): your pieces composed over the grid; run under
mpiexec by 12_yours.py."""
from minipar.backend import xp
from minipar.comm import all_reduce

from ddp import MyDDP            # lesson 05
from stage import run_stage      # lesson 08


def wire(grid, module, bucket_bytes):
    """Once per run: your DDP over the ranks that hold the same weights and see different
    data (rule 1); returns it."""
    return None


def gradients_3d(grid, ddp, stage, actions, held, sequence_parallel):
    """One step's forward and backward: the micro-batches through your executor over the
    pipeline, your DDP's finish, rule 2; then every held .grad is this rank's piece of the
    gradient of the global batch's mean loss."""


def norm_and_overflow(grid, held):
    """(||g|| of the whole model, whether any rank's gradient holds inf or NaN), the same
    on every rank, from one all-reduce (rules 3 and 4)."""
    return 0.0, False
''', r'''
capstone = importlib.import_module("12_yours")      # lessons/12_yours.py: the check
print(f"your course folder: {MINE}")
missing = capstone.missing_piece(MINE)              # a piece an earlier lesson writes
assert missing is None, missing
proc = mpirun(8, ["12_yours.py", "--file", f"{MINE}/step3d.py", "--backend", BACKEND], timeout=600)
print(proc.stdout)
''', r'''%md
Your losses are the library's, and the library's are one process's: the composition is exact. The
library writes the same rules once, in its optimizer step (`minipar/parallel/step.py`) and its global
norm (`minipar/parallel/norm.py`) — rule 2, and rules 3 and 4 in one all-reduce:
''', r'''
from minipar.parallel.norm import GlobalNorm
from minipar.parallel.step import sum_partial_over_tp
print(inspect.getsource(sum_partial_over_tp))
print(inspect.getsource(GlobalNorm.summed_with_flag))
''', r'''%md
## 3. One model, three layouts

The same tiny GPT (4 layers, $d = 16$, 4 heads, 8 tokens, global batch 8) for 6 AdamW steps in
float64 under each layout, through the command line — exactly what one would launch on a cluster
(`--backend cupy` there):

```
mpiexec -n 8 python -m minipar train --dp 2 --tp 2 --pp 2 --schedule 1f1b --microbatches 4 \
        --precision fp64 --steps 6 --log-json log.json --trace trace.json
```

One process, data parallelism alone, and the 3D layout (dp2 × tp2 × pp2, what your capstone composed).
The pipeline layout runs 1F1B with 4 micro-batches and writes a trace of its last step. The log
starts with a `{"header": ...}` line and ends with a `{"final": ...}` one; `step_records(path)`
returns the step records in between.
''', r'''
work = tempfile.mkdtemp()
MODEL = ["--n-layer", "4", "--d-model", "16", "--n-head", "4", "--seq-len", "8", "--batch-size", "8",
         "--steps", "6", "--precision", "fp64", "--seed", "0", "--data", os.path.join(ROOT, "README.md"),
         "--quiet", "--eval-batches", "0", "--backend", BACKEND]
PIPE = ["--schedule", "1f1b", "--microbatches", "4"]
LAYOUTS = {"1": (1, []), "dp4": (4, ["--dp", "4"]),
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
for (name, log), style in zip(logs.items(), ["-", "--", ":"]):
    losses = np.array([r["loss"] for r in log])
    ax.plot(losses, linestyle=style, lw=4 if name == "1" else 2, alpha=0.5 if name == "1" else 1, label=name)
    err = np.max(np.abs(losses - base) / base)
    print(f"{name:12} losses {np.round(losses, 10)}  max rel. diff vs 1 rank {err:.1e}")
    np.testing.assert_allclose(losses, base, rtol=1e-10, atol=0)
ax.set_xlabel("step"); ax.set_ylabel("loss"); ax.set_title("three layouts, one loss curve (float64)")
ax.legend(fontsize=8); plt.show()
''', r'''%md
The curves lie on top of each other: every layout computes the single-process step, up to the order
of floating-point sums.

## 4. Where the time goes

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
The 3D layout's communication bar contains its tensor-parallel all-reduces: 2 in forward and 2 in
backward per layer, each blocking both ranks of the pair until the slower one arrives.

### The pipeline's bubble, from its trace

The trace of the last step holds, per stage (of the first replica and first tp rank), its spans:
**F** and **B** cover the stage's own forward and backward only — under tp that includes its
tp all-reduces, which are part of computing the stage's layers — and the receives and sends are
spans of their own. So the bubble is measured as the share of rank-time not spent in F or B:

$$\text{bubble} = 1 - \frac{\sum_\text{stages} \text{busy}}{pp \cdot \text{makespan}},$$

and the simulator of lesson 08, fed each stage's measured mean F and B times, predicts it for the
same schedule. Here the 3D layout's trace, redrawn from the JSON, the bubble recomputed from its
spans (it must be the log's `measured_bubble`) and set beside the simulated one:
''', r'''
fig, ax = plt.subplots(figsize=(10, 2.4))
for name in [n for n in LAYOUTS if traces[n] is not None]:
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
keeps the second. On this machine the second fails: 8 ranks share 2 cores, so a stage that has
work is often not running at all — its F or B span stretches when it is preempted, and its
neighbour meanwhile sits in a receive — and the measured bubble comes out above the simulated one by
however much the scheduler interfered in this run. On devices of their own the two agree within a
few points (minipar's tests check it with one deliberately slowed stage at m = 4 and 8).

## Takeaways

- One `ProcessGrid` composes the three: tp innermost (adjacent ranks), dp across replicas, pp
  across stages; every rank holds one tp, one dp and one pp sub-communicator, each one
  `comm.split(colour = the fixed coordinates, key = the varying one)`.
- Composed, the pieces need four rules no piece has alone: the gradient averaged over dp × cp (one
  group, `dp_cp_comm`); a replicated weight's sequence-parallel parts summed over tp; every element
  counted once in the norm ($w = 1/t$ over tp, divided by the dp·cp copies); and the fp16 found-inf
  flag in the norm's one all-reduce over every rank. With them, your DDP, tensor and sequence
  parallelism, executor and ring attention reproduce the library's losses exactly.
- With `--batch-size` the global batch, every layout reproduces the single process: the three loss
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
