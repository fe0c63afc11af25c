"""Lesson 08: the cells of lessons/08_pipeline.ipynb (``%md`` cells are markdown).

Edit here, then run ``python lessons/make_notebooks.py``."""
from launch import LAUNCH   # the cell that defines mpirun() for the lesson's runs

NOTEBOOK = "08_pipeline.ipynb"

CELLS = [r'''%md
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

Plan: (1) the four schedules simulated — you write the 1F1B builder and the simulator that gives the
bubble; (2) you write the executor that runs 1F1B over send/recv on three ranks, and its measured
timeline is set against the simulator's; (3) the library's two-stage pipeline traced: its measured
bubble against the simulator fed with the measured op times of each stage, then one stage made slow.
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

from minipar.observe.runlog import step_records
from minipar.parallel.pipeline import (Action, Span, bubble_fraction, build_schedule, dependencies,
                                       draw_timeline, simulate, validate)
from minipar.parallel.pipeline import schedules

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
    ax.set_xlabel("time (units of one F)")
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

A schedule is nothing but these lists. GPipe's, in `minipar/parallel/pipeline/schedules.py`:
''', r'''
print(inspect.getsource(schedules._afab))
print("rank 0:", build_schedule("afab", 2, 3)[0])
print("rank 1:", build_schedule("1f1b", 2, 3)[1])
''', r'''%md
**Exercise — the 1F1B builder.** Write `my_1f1b(pp, m)`: `{rank: [Action, ...]}` for every rank. Rank
$r$ first runs $w = \min(p - r - 1, m)$ warm-up forwards, then alternates one forward and one backward
(the forward of the next micro-batch, the backward of the oldest one in flight) until every forward has
run, then the remaining backwards. `Action("F", 3)` is the forward of micro-batch 3. The check compares
with `build_schedule("1f1b", pp, m)` for $p$ = 1 … 5 and $m$ = 1 … 9 — including $m < p$, where the
warm-up is cut short — and runs the library's validator on yours.
''', r'''%exercise build_1f1b
def my_1f1b(pp, m):
    raise NotImplementedError("hint: three phases on every rank — warm-up, steady state, cool-down; how long "
                              "is each on rank r, and what becomes of the warm-up when m < p?")
''', r'''
for pp_ in range(1, 6):
    for m_ in range(1, 10):
        mine = my_1f1b(pp_, m_)
        validate(mine, pp_, m_)                       # a schedule the engine could run
        assert mine == build_schedule("1f1b", pp_, m_), (pp_, m_, mine)
print("correct: the library's 1F1B for every p <= 5, m <= 9")
print(inspect.getsource(schedules._1f1b))
''', r'''%md
**Exercise — the simulator, and the bubble formula.** Time a schedule without running it:
`my_bubble(schedule, pp, t_f, t_b)` returns `(makespan, bubble)`. Every action starts as soon as its rank
has finished the previous action in its list *and* every action it depends on has finished
(`dependencies(rank, action, pp)` lists the `(rank, Action)` pairs: F(m) on stage $s$ needs F(m) on
$s-1$; B(m) needs F(m) here and B(m) on $s+1$); F takes `t_f`, B takes `t_b`; messages are free. The
bubble is the idle share of the ranks' time, $1 - \sum_r \text{busy}_r / (p\cdot\text{makespan})$. The
check compares with the library's `simulate` for AFAB and 1F1B with unequal $t_f$, $t_b$, and with
$\frac{p-1}{m+p-1}$, which holds whatever $t_f$ and $t_b$ are (as long as every stage has the same).
''', r'''%exercise simulate_bubble
def my_bubble(schedule, pp, t_f, t_b):
    raise NotImplementedError("hint: an action starts when its rank is free and everything it depends on has "
                              "ended; no rank can know that alone, so sweep all the ranks until every list is "
                              "done, and count each rank's busy time")
''', r'''
for kind in ("afab", "1f1b"):
    for pp_, m_ in ((2, 1), (2, 4), (3, 5), (4, 8), (5, 3)):
        sched = build_schedule(kind, pp_, m_)
        t_f, t_b = 1.0, 2.5
        makespan, bubble = my_bubble(sched, pp_, t_f, t_b)
        ref = simulate(sched, pp_, t_f=t_f, t_b=t_b)
        assert abs(makespan - ref.makespan) < 1e-9, (kind, pp_, m_, makespan, ref.makespan)
        assert abs(bubble - ref.bubble_fraction) < 1e-9, (kind, pp_, m_, bubble, ref.bubble_fraction)
        assert abs(bubble - (pp_ - 1) / (m_ + pp_ - 1)) < 1e-9
print("correct: your makespan and bubble are the simulator's, and (p-1)/(m+p-1)")
''', r'''%md
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
## 2. Your stage executor, on three ranks

A schedule is a list; a pipeline is a loop over it on every rank. **Exercise — the 1F1B executor.**
Write `run_stage(comm, stage, actions)`, which runs this rank's 1F1B list (`build_schedule("1f1b", 3,
4)[rank]`) under `mpiexec -n 3`. Stage $s$ is one layer; the check hands you a `stage` that does the
arithmetic:

* `stage.input(i)` — micro-batch $i$'s input (first stage only); `stage.shape` — the shape of what travels;
* `stage.forward(x, i)` → `(y, saved)` — `saved` is what this micro-batch's backward will need;
* `stage.loss(i, y)` → the gradient of the loss with respect to `y` (last stage only: the last forward
  hands its output to the loss, and that gradient starts the micro-batch's backward);
* `stage.backward(saved, dy, i)` → `dx` (and adds this micro-batch's share into the stage's weight
  gradient).

Activations go to rank $r+1$ and gradients to rank $r-1$ with `comm.send(array, dest)`; receive into an
`xp.empty(stage.shape)` with `comm.recv(array, source)`. The messages here are small (1 KiB), so a blocking
send returns at once (lesson 04's eager limit); the engine below uses non-blocking sends so that
nothing depends on that.

`08_yours.py` runs yours on three ranks and checks the order of what each rank ran against its list, the
micro-batches whose activations it held at once (at most $p-r$ on rank $r$ — that is 1F1B's point), every
stage's weight gradient against one process, and the time: each forward sleeps 30 ms and each backward
60 ms (on top of microseconds of arithmetic), so the run has the simulator's costs, and its measured
makespan must come within 50 % of `simulate`'s (one with a barrier before every action took 1.6× here).
''', r'''%exercise stage_executor
%%writefile {MINE}/stage.py
"""Your 1F1B stage executor (lesson 08): run under mpiexec by 08_yours.py."""
from minipar.backend import xp


def run_stage(comm, stage, actions):
    """Run this rank's F and B actions in order, passing activations forward and
    gradients backward between neighbouring stages."""
    for action in actions:
        pass
''', r'''
executor_json = os.path.join(tempfile.mkdtemp(), "executor.json")
proc = mpirun(3, ["08_yours.py", "--file", f"{MINE}/stage.py", "--json", executor_json, "--backend", BACKEND])
print(proc.stdout)
runs = json.load(open(executor_json))
measured = {r: [Span(kind, i, 0, start, end) for kind, i, start, end in spans]
            for r, spans in enumerate(runs["measured"])}
simulated = {int(r): [Span(*s) for s in spans] for r, spans in runs["simulated"].items()}
fig, axes = plt.subplots(2, 1, figsize=(10, 4), sharex=True)
draw_timeline(simulated, ax=axes[0], title="simulated (F = 0.03 s, B = 0.06 s)")
draw_timeline(measured, ax=axes[1], title="your executor, measured")
axes[1].set_xlabel("seconds"); plt.tight_layout(); plt.show()
''', r'''%md
The measured rows are the simulated ones, shifted by the few milliseconds each message and each
Python call costs: the simulator was right because the only thing that orders a rank's work is the
list and the messages it waits for. The library's engine is the same loop with what a real model
needs — non-blocking sends, several model chunks (interleaved), B split from W (zero bubble), and the
activation buffers' shapes agreed once.

## 3. A real pipeline, traced

Now the engine executes the 1F1B action lists on 2 ranks (`--pp 2`), sending activations and gradients
with non-blocking point-to-point messages. With `--trace` the last step is timed (after a barrier, so
both ranks share a time origin) and written as Chrome trace JSON — open it in
[Perfetto](https://ui.perfetto.dev). Each **F** and **B** span covers the op's *compute only*; the
blocking receive before it (waiting for the neighbour's activation or gradient) and the posting of the
send after it are spans of their own, `recv` and `send`. So the trace's bubble is exactly the idle share:

$$\text{measured bubble} = 1 - \frac{\sum_r \text{compute}_r}{p \cdot \text{wall}},$$

wall being the step from the first span's start to the last one's end. The log line of that step
(`--log-json`, read with `minipar.observe.runlog.step_records`) carries it and the **simulated** bubble: the
simulator run with the measured mean F and B times *of each stage* — the stages need not be equal (the
last one also computes the head and the loss). The library's summary (`minipar/parallel/pipeline/trace.py`):
''', r'''
from minipar.parallel.pipeline.trace import summarize

print(inspect.getsource(summarize))
''', r'''%md
The model is small but not tiny (4 layers, $d = 64$, 64 tokens, batch 16) so that each op takes
milliseconds rather than microseconds: with smaller ops, Python overhead and message latency
(which the simulator takes as zero) dominate. In float64 we also check the losses against one
process.
''', r'''
work = tempfile.mkdtemp()
MODEL = ["--n-layer", "4", "--d-model", "64", "--n-head", "4", "--seq-len", "64", "--batch-size", "16",
         "--steps", "3", "--precision", "fp64", "--seed", "0", "--data", os.path.join(ROOT, "README.md"),
         "--quiet", "--eval-batches", "0", "--backend", BACKEND]
PIPE = ["--pp", "2", "--schedule", "1f1b", "--microbatches", "4"]

def traced_run(name, env=None):
    """A traced pp=2 run: (its step records, {rank: [(kind, mb, chunk, start ms, end ms)]}, trace metadata)."""
    trace_path, log_path = os.path.join(work, f"{name}.trace.json"), os.path.join(work, f"{name}.json")
    saved = dict(ENV)
    ENV.update(env or {})
    try:
        mpirun(2, ["-m", "minipar", "train", *MODEL, *PIPE, "--trace", trace_path, "--log-json", log_path])
    finally:
        ENV.clear(); ENV.update(saved)
    trace = json.load(open(trace_path))
    timelines = {}
    for e in trace["traceEvents"]:
        if e["ph"] == "X":
            timelines.setdefault(e["tid"], []).append(
                (e["cat"], e["args"]["microbatch"], e["args"]["chunk"], e["ts"] / 1e3, (e["ts"] + e["dur"]) / 1e3))
    return step_records(log_path), timelines, trace["metadata"]

pp_log, timelines, meta = traced_run("even")
mpirun(1, ["-m", "minipar", "train", *MODEL, "--log-json", os.path.join(work, "single.json")])
single = [r["loss"] for r in step_records(os.path.join(work, "single.json"))]
np.testing.assert_allclose([r["loss"] for r in pp_log], single, rtol=1e-12)
print("pp=2 losses == single-process losses:", [round(r["loss"], 12) for r in pp_log])
''', r'''
def per_stage_sim(meta):
    """The simulator with each stage's measured mean F and B times (ms), as the summary ran it."""
    per = meta["mean_op_s_per_stage"]
    t_f = {int(r): s * 1e3 for r, s in per["F"].items()}
    t_b = {int(r): s * 1e3 for r, s in per["B"].items()}
    return simulate(build_schedule("1f1b", 2, 4), 2, t_f=t_f, t_b=t_b), t_f, t_b

PARTS = (("compute", "#4C72B0"), ("recv", "#CCB974"), ("send", "#8C8C8C"),
         ("ramp", "#f4f4f4"), ("between ops", "#C44E52"))

def breakdown(timelines):
    """Per rank, ms of the traced step's wall: compute (F, B), recv waits, sends, the ramp (before the
    rank's first span and after its last: nothing to do yet / any more) and the gaps between spans."""
    start = min(s[3] for spans in timelines.values() for s in spans)
    end = max(s[4] for spans in timelines.values() for s in spans)
    out = {}
    for r, spans in sorted(timelines.items()):
        busy = {k: sum(s[4] - s[3] for s in spans if s[0] in kinds)
                for k, kinds in (("compute", "FB"), ("recv", ("recv",)), ("send", ("send",)))}
        busy["ramp"] = (min(s[3] for s in spans) - start) + (end - max(s[4] for s in spans))
        busy["between ops"] = (end - start) - sum(busy.values())
        out[r] = busy
    return end - start, out

def show(timelines, meta, last, title):
    sim, t_f, t_b = per_stage_sim(meta)
    assert abs(sim.bubble_fraction - last["simulated_bubble"]) < 1e-9      # what the log says
    assert abs(bubble_fraction(timelines) - last["measured_bubble"]) < 1e-9
    wall, parts = breakdown(timelines)
    fig, axes = plt.subplots(3, 1, figsize=(12, 6.3), gridspec_kw={"height_ratios": [2, 2, 1.3]})
    draw_timeline(timelines, ax=axes[0], title=f"{title}: measured 1F1B, p = 2, m = 4")
    draw_timeline(sim.timelines, ax=axes[1], title="simulated with each stage's measured mean F and B")
    for ax in axes[:2]:
        ax.set_xlabel("ms since the step began")
    axes[1].set_xlim(axes[0].get_xlim())
    left = np.zeros(len(parts))
    for key, color in PARTS:
        vals = np.array([parts[r][key] for r in parts])
        axes[2].barh([f"rank {r}" for r in parts], vals, left=left, color=color, edgecolor="k", lw=0.3,
                     label=f"{key} (idle)" if key != "compute" else key)
        left += vals
    axes[2].invert_yaxis(); axes[2].set_xlabel("ms of the step's wall time")
    axes[2].legend(fontsize=7, loc="upper left", bbox_to_anchor=(1.0, 1.05))
    axes[2].set_xlim(axes[0].get_xlim()); axes[2].set_title("where each rank's wall time went")
    plt.tight_layout(); plt.show()
    compute = sum(p_["compute"] for p_ in parts.values())
    assert abs((1 - compute / (len(parts) * wall)) - last["measured_bubble"]) < 1e-6   # 1 - compute / wall
    for r, p_ in parts.items():
        print(f"rank {r}: F {t_f[r]:.1f} ms, B {t_b[r]:.1f} ms (means); of {wall:.1f} ms wall: "
              + ", ".join(f"{k} {p_[k]:.1f}" for k, _ in PARTS))
    print(f"measured bubble {last['measured_bubble']:.1%} = 1 - {compute:.1f} / (2 x {wall:.1f}); "
          f"simulated (per-stage times) {last['simulated_bubble']:.1%}; "
          f"formula (equal stages) {1 / 5:.1%}")
    return last["measured_bubble"] - last["simulated_bubble"]

gap = show(timelines, meta, pp_log[-1], "no straggler")
''', r'''%md
How to read it. In the measured timeline the thick boxes are compute; the thin bars under them are
receives (time blocked waiting for the neighbour: bubble) and sends (posting a non-blocking send:
brief). The bottom panel adds them up per rank: *compute* is what the bubble formula calls busy,
everything else is idle — receive waits, sends, the *ramp* (rank 1 has nothing to do before the first
activation arrives when it does not wait in a receive, and nothing after its last backward while rank 0
finishes) and the time *between ops* (Python bookkeeping, the final wait for the last sends). The
simulator knows only compute, so

* the **simulated** bubble is what the schedule costs with these op times: the ramp of the pipeline,
  and the waits a slower stage imposes on the other. The stages are not equal — the last one also
  computes the head and the loss, and on a shared machine one rank may simply get less of a core — so
  it differs from the formula's $(p-1)/(m+p-1)$, which assumes equal stages;
* **measured − simulated** is what the schedule does not explain: ops of one kind that do not all take
  the mean time (the first ops of a step are often slower), message latency, the Python between ops, and
  a shared machine's noise. It is printed below for this run; timings never decide a check here
  (`benchmarks/pipeline_bubble.py` repeats the run and reports the difference).

### A slow stage

`MINIPAR_SLOW_RANK=1:3` makes rank 1 compute three times slower (after each op it sleeps twice the op's
duration; `minipar/train/faults.py`). The schedule cannot hide it: rank 0 now spends much of the step waiting
in `recv`. The simulator, fed each stage's own times, predicts it — the equal-stage formula does not.
''', r'''
print(f"no straggler: measured - simulated = {gap * 100:+.1f} points")
slow_log, slow_timelines, slow_meta = traced_run("slow", {"MINIPAR_SLOW_RANK": "1:3"})
np.testing.assert_allclose([r["loss"] for r in slow_log], single, rtol=1e-12)   # slower, not different
slow_gap = show(slow_timelines, slow_meta, slow_log[-1], "rank 1 three times slower")
even, slow = pp_log[-1], slow_log[-1]
print(f"slow stage: measured - simulated = {slow_gap * 100:+.1f} points")
print(f"bubble measured {even['measured_bubble']:.1%} -> {slow['measured_bubble']:.1%}, "
      f"simulated {even['simulated_bubble']:.1%} -> {slow['simulated_bubble']:.1%}")
ops = slow_meta["mean_op_s_per_stage"]
print(f"rank 1's mean F / rank 0's: {ops['F']['1'] / ops['F']['0']:.1f}x "
      f"(it was {meta['mean_op_s_per_stage']['F']['1'] / meta['mean_op_s_per_stage']['F']['0']:.1f}x)")
''', r'''%md
With one stage three times slower, the other stage idles for most of the step whatever the schedule
does: a pipeline runs at the pace of its slowest stage. That is why the layers are split so that every stage
costs the same (the last one gets fewer blocks when it also carries the head), and why a straggler in a
pipeline is worse than in data parallelism.

## Takeaways

- A pipeline schedule is data: a list of F/B/W actions per rank that can be validated, simulated and
  drawn without running anything; the engine only executes it.
- Bubble $=\frac{p-1}{m+p-1}$ for AFAB and 1F1B; 1F1B holds $\le p$ micro-batches of activations
  instead of $m$. Interleaving divides the ramp by $v$; ZB-H1 fills it with deferred weight gradients.
- Measured, the bubble is $1 - \text{compute}/\text{wall}$: the trace's F/B spans are compute only and
  the waits are spans of their own. The simulator fed each stage's measured op times predicts it up to
  what it does not model (latency, Python between ops) — and it predicts a slow stage, which the formula
  cannot.

## In PyTorch / DeepSpeed / Megatron this is …

- **Megatron-Core**: `--pipeline-model-parallel-size p`, `--num-layers-per-virtual-pipeline-stage`
  (interleaved, $v$ chunks); the schedules in `megatron/core/pipeline_parallel/schedules.py`
  (`forward_backward_pipelining_without_interleaving` is 1F1B, `..._with_interleaving` the interleaved
  one), the point-to-point sends in `p2p_communication.py`.
- **PyTorch**: `torch.distributed.pipelining` — `pipeline(...)` / `PipelineStage` to cut the model, and
  the schedules `ScheduleGPipe` (AFAB), `Schedule1F1B`, `ScheduleInterleaved1F1B`, `ScheduleInterleavedZeroBubble`.
- **DeepSpeed**: `deepspeed.pipe.PipelineModule(layers, num_stages=p)`; its `TrainSchedule` is 1F1B as a
  list of instructions (`ForwardPass`, `BackwardPass`, `SendActivation`, `RecvGrad`, …) — the same idea as
  minipar's `Action` lists.
- **Zero bubble**: Qi et al. 2023 (ZB-H1, ZB-H2, ZB-V); in Megatron-Core / PyTorch as the zero-bubble
  schedules above.
''', r'''%md
## What changes on GPU nodes and at scale

Stages usually sit on different nodes: what travels between them is one micro-batch's activation,
$b\cdot s\cdot h$ values, over InfiniBand. From the repository's **H200 profile** (data sheet ×
efficiency, a model): for a 175B GPT ($h$ = 12288, $s$ = 2048, 96 layers over $p$ = 8 stages, $b$ = 1),
''', r'''from minipar.perf.comm import collective_seconds
from minipar.perf.profile import load_profile

h200 = load_profile("h200")
h, s, layers, stages = 12288, 2048, 96, 8
message = s * h * 2                                        # bf16 activation of one micro-batch
send = collective_seconds(h200, "p2p", 2, message, "inter")
forward = (layers // stages) * (24 * s * h * h + 4 * s * s * h) / (h200.peak_flops["bf16"] * h200.efficiency["gemm"])
print(f"one stage's forward of a micro-batch ~ {forward * 1e3:.0f} ms; its activation ({message / 1e6:.0f} MB) "
      f"crosses InfiniBand in ~ {send * 1e3:.1f} ms")
for m in (8, 32, 128):
    print(f"  m = {m:>3}: 1F1B bubble (p-1)/(m+p-1) = {(stages - 1) / (m + stages - 1):.1%}")
''', r'''%md
The send is under one percent of the stage's compute, so the simulator without messages is nearly right; what
dominates at scale is the bubble, and the global batch limits $m$: with $B$ sequences, $d$-way data
parallelism and micro-batches of $b$, $m = B/(d\,b)$, so more data parallelism means fewer
micro-batches and a larger bubble — lesson 13 weighs the two. Real stages are not equal either (the
first holds the embedding, the last the head and the loss), which is why Megatron lets you put fewer
layers on them and why the simulator takes per-stage costs.
''']
