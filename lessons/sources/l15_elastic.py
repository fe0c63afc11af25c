"""Lesson 15: the cells of lessons/15_elastic.ipynb (``%md`` cells are markdown).

Edit here, then run ``python lessons/make_notebooks.py``."""
from launch import LAUNCH   # the cell that defines mpirun(), ENV and MINE for the lesson's runs

NOTEBOOK = "15_elastic.ipynb"

CELLS = [r'''%md
# 15 · Failures, elasticity and load balance

A GPU fails every few years; a job on thousands of them sees a failure every few hours. Meta's
Llama 3 run on 16 384 GPUs had 419 unexpected interruptions in 54 days — one every 3 hours. At that
scale a training job is not a program that runs, it is a program that **keeps coming back**:

1. **notice** — a rank that died (its process is gone), exited with an error, or hangs (alive, silent,
   holding every peer in the next all-reduce);
2. **stop everything** — no half-dead job, no process left behind;
3. **re-plan** — on the ranks that are left, which layout? (the survivors may not divide the batch or
   the heads any more);
4. **continue** from the newest checkpoint, ideally on *the same* loss curve.

`python -m minipar launch --np N [--min-np M] [--hosts FILE] -- train ...` is a supervisor that does
these four things. It leans on two properties: the global batch of step $k$ is a function of (seed, $k$)
alone, and a checkpoint's index names every piece it holds by parameter and global box, not by rank, so the job can continue on **any**
number of ranks and still make exactly the updates of one process. How the arrays get to disk matters at
scale: gathering them onto rank 0 and writing one file works for this course's models, not for a 70B
model, whose weights and Adam state (~1 TB) fit in no host's memory and would take one writer most of an
hour — so minipar, like PyTorch DCP and Megatron's distributed checkpoint, writes one shard per rank plus
an index of which piece of which array each holds, and cuts them again on load. Everything in this lesson goes
through the CLI (`--save`, `--save-every`, `--resume`), whichever format sits behind it.

Plan: (1) kill a rank and watch the job shrink; (2) a hang; (3) **you write** a supervisor loop that
brings a failing job back from its newest checkpoint; (4) what a failure costs — goodput and the
checkpoint interval (Young/Daly); (5) a slow rank, with and without load balancing; (6) the code.
''', r'''
import inspect
import json
import os
import signal
import subprocess
import sys
import tempfile
import time

import matplotlib.pyplot as plt
import numpy as np

from minipar.elastic import goodput, largest_world_size, model_goodput, simulate, young_daly_interval
from minipar.elastic.log import read_merged
from minipar.observe.runlog import read_log

%matplotlib inline
''' + LAUNCH + r'''
TINY = ["--model", "tiny", "--n-layer", "2", "--d-model", "16", "--n-head", "4", "--seq-len", "8",
        "--precision", "fp64", "--batch-size", "8", "--quiet", "--eval-batches", "0"]
STEPS = 12
WORK = tempfile.mkdtemp(prefix="lesson15-")

def launch_cmd(run, launch_flags, train_flags=()):
    """python -m minipar launch ... -- train ...  (minipar.elastic is the same command)"""
    return [sys.executable, "-m", "minipar.elastic", "--run-dir", run, *launch_flags, "--", "train",
            *TINY, "--steps", str(STEPS), "--save-every", "4", "--log-json", f"{run}/merged.json",
            *train_flags]

def show(out):
    print("\n".join(l for l in out.splitlines() if l.startswith("minipar launch")))

# the reference: one process, never interrupted
subprocess.run([sys.executable, "-m", "minipar", "train", *TINY, "--steps", str(STEPS),
                "--log-json", f"{WORK}/single.json"], env=ENV, check=True, timeout=120, capture_output=True)
reference = np.array([r["loss"] for r in read_log(f"{WORK}/single.json")[1]])
print("one process:", np.round(reference, 4))
''', r'''%md
## 1. Kill a rank, watch the job shrink

Four ranks, a checkpoint every 4 steps. So that this notebook can act at a known moment (a toy step lasts
10 ms; a real one seconds), rank 0 is told to pause after step 6 (`--fault 0:6:hold`: it waits for a
Ctrl-C that never comes). Meanwhile we read rank 1's process id from the **heartbeat directory** —
every rank writes `rank<R>` ("steps done, time") after each step, and its agent writes `pid<R>` — and
send it `SIGKILL`, as a crashing node would.
''', r'''
run = f"{WORK}/kill"
proc = subprocess.Popen(launch_cmd(run, ["--np", "4", "--hang-timeout", "60", "--fault", "0:6:hold"]),
                        env=ENV, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
beat = f"{run}/attempt-1/rank1"
deadline = time.time() + 120
while time.time() < deadline:                       # wait for rank 1's heartbeat to say 6 steps
    if os.path.exists(beat) and int(open(beat).read().split()[0]) >= 6:
        break
    time.sleep(0.05)
child, agent = map(int, open(f"{run}/attempt-1/pid1").read().split())
print("heartbeats:", {r: open(f"{run}/attempt-1/rank{r}").read().split() for r in range(4)})
os.kill(child, signal.SIGKILL)
print(f"killed rank 1 (pid {child})")
out, _ = proc.communicate(timeout=180)
assert proc.returncode == 0, out
show(out)
''', r'''%md
What the supervisor did: rank 1's **agent** (the small process that started it) saw it die by signal 9;
mpiexec killed the other ranks; 3 slots were left. With a global batch of 8, 4 heads and 2 layers,
3 ranks fit no layout (dp 3 ∤ 8, tp 3 ∤ 4, pp 3 ∤ 2), so the job went on with **2**, one slot idle,
from the checkpoint of step 4: steps 4 and 5 were done twice. The merged log holds every step once —
a redone step replaces its first record — and an event record:
''', r'''
header, steps, events, final = read_merged(f"{run}/merged.json")
print(json.dumps(events[0], indent=1)[:900])
losses = np.array([r["loss"] for r in steps])
np.testing.assert_allclose(losses, reference, rtol=1e-9, atol=0)
print(f"\nmax relative difference from one process: {np.max(np.abs(losses / reference - 1)):.1e}")

fig, (a, b) = plt.subplots(1, 2, figsize=(11, 3.4))
a.plot(reference, "k-", lw=3, alpha=0.3, label="one process, uninterrupted")
for k in sorted({r["attempt"] for r in steps}):
    mine = [r for r in steps if r["attempt"] == k]
    a.plot([r["step"] for r in mine], [r["loss"] for r in mine], "o-", ms=4,
           label=f"attempt {k}: {mine[0]['world_size']} ranks")
for e in events:
    a.axvline(e["resume_step"], ls=":", color="gray")
a.set_xlabel("step"); a.set_ylabel("loss"); a.legend(); a.set_title("the same curve")
b.step([r["step"] for r in steps], [r["world_size"] for r in steps], where="post")
b.set_xlabel("step"); b.set_ylabel("ranks"); b.set_title("world size"); plt.tight_layout(); plt.show()
''', r'''%md
## 2. A hang

A hung rank is worse than a dead one: its process is alive, so nothing ends by itself; its peers wait
in the next collective. Every rank's heartbeat goes silent. After `--hang-timeout` seconds of silence
the supervisor looks at the process table to name the culprit — a stopped process (state `T`), else a
rank behind the others' step, else one that uses no CPU while the others spin in MPI's busy-polling
waits — then kills every process (SIGKILL ends a stopped one too). The trainer has its own hang timeout
(lesson 04's watchdog) as a backstop; the supervisor sets it longer than its own, so it notices first.
Here rank 2 is stopped with `SIGSTOP` after step 5:
''', r'''
run = f"{WORK}/hang"
t0 = time.time()
proc = subprocess.run(launch_cmd(run, ["--np", "4", "--hang-timeout", "2", "--fault", "2:5:stop"]),
                      env=ENV, capture_output=True, text=True, timeout=180)
assert proc.returncode == 0, proc.stdout + proc.stderr
show(proc.stdout)
_, steps_h, events_h, final_h = read_merged(f"{run}/merged.json")
np.testing.assert_allclose([r["loss"] for r in steps_h], reference, rtol=1e-9, atol=0)
print(f"\n{events_h[0]['what']}: same curve again, {time.time() - t0:.1f} s in all")
''', r'''%md
## 3. Your supervisor

Strip away the agents, the hang detection and the re-planning, and a supervisor is a loop. **Exercise.**
Write `supervise(mpiexec, train_args, run_dir, save_every, max_restarts)`. `mpiexec(argv)` runs
`mpiexec -n 2 python -m minipar train ARGV` and returns its exit status. Run `train_args` until an attempt
finishes: every attempt saves a checkpoint every `save_every` steps (`--save DIR --save-every K`) and
logs its steps (`--log-json FILE`, one per attempt, under `run_dir`); after a failure the next attempt
continues from the newest checkpoint (`--resume DIR`), if there is one yet; after `max_restarts` restarts
that failed too, give up with an exception. Return the run as one curve `{step: loss}`: a step redone
after a restart appears in two logs, and the later one is the run's. Read the logs with
`minipar.observe.runlog.step_records(path)` (a list of records with `"step"` and `"loss"`); do not open the
checkpoint — its format is the library's business, the CLI is the contract.

`15_yours.py` runs yours twice. First 12 steps, checkpoints every 3, with rank 1 made to fail at step 5
and rank 0 at step 10 (`MINIPAR_INJECT_FAILURE`): three attempts, which must start at steps 0, 3 and 9
(a failure at step 5 loses steps 3 and 4: the newest checkpoint is of step 3), and a curve equal to one
uninterrupted process's, step by step. Then with `max_restarts=1` and attempts that die before their
first step — no log at all: yours must give up after the second.
''', r'''%exercise supervise
%%writefile {MINE}/supervise.py
"""Your supervisor loop (lesson 15): run by 15_yours.py, which launches the mpiexec jobs."""
import os

from minipar.observe.runlog import step_records


def supervise(mpiexec, train_args, run_dir, save_every, max_restarts):
    """Run train until an attempt finishes, from the newest checkpoint after each
    failure; return {step: loss} of the run as one curve."""
    log = os.path.join(run_dir, "attempt1.json")
    mpiexec([*train_args, "--log-json", log])
    return {r["step"]: r["loss"] for r in step_records(log)}
''', r'''
t0 = time.time()
proc = subprocess.run([sys.executable, "15_yours.py", "--file", f"{MINE}/supervise.py",
                       "--reference", f"{WORK}/single.json"], env=ENV, capture_output=True, text=True, timeout=600)
print(proc.stdout, f"({time.time() - t0:.1f} s)")
assert proc.returncode == 0, proc.stderr[-3000:]
''', r'''%md
That is `minipar launch` at its core. What the library adds is what makes it trustworthy on real
machines: an agent per rank that knows how its process ended, a heartbeat that turns a hang into a
failure (§2), the re-plan onto the survivors (§1, §5), the merged log with its events, and the goodput
accounting below.

## 4. What a failure costs: goodput

**Goodput** is the share of the wall time that made progress. A failure costs the work since the last
checkpoint (redone), the time to notice, and the restart. Checkpointing often makes the first small but
costs $C$ each time. Per second, checkpointing every $\tau$ seconds with failures every $M$ seconds (the
MTBF) and $R$ to restart wastes about

$$\text{waste}(\tau) = \frac{C}{\tau} + \frac{\tau/2 + R}{M},\qquad \frac{d\,\text{waste}}{d\tau} = 0
\;\Rightarrow\; \tau^* = \sqrt{2\,C\,M}\quad\text{(Young, 1974)}.$$

The supervisor measures $C$ (each checkpoint is timed), the steps redone and the seconds lost per failure:
''', r'''
print(goodput.format_summary(final["goodput"]))
for e in events + events_h:
    print(f"{e['what']}: {e['steps_redone']} steps redone, {e['seconds_lost']:.2f} s lost "
          f"({e['since_checkpoint_s']:.2f} s from the checkpoint to noticing)")
''', r'''%md
On the toy, a step is 10 ms and a restart seconds (Python, MPI and NumPy starting): the restart is all
of the cost. On a large job the other terms matter. Take a 7B model whose checkpoint takes $C$ = 30 s
and a cluster that fails once every 4 hours, with 10 minutes to restart:
''', r'''
C, M, R = 30.0, 4 * 3600.0, 600.0
tau_star = young_daly_interval(C, M)
taus = np.geomspace(60, 4 * 3600, 60)
fig, ax = plt.subplots(figsize=(8, 3.6))
ax.plot(taus / 60, [model_goodput(t, C, M, R) for t in taus], label=r"model $1 - C/\tau - (\tau/2 + R)/M$")
sims = taus[::6]
ax.plot(sims / 60, [simulate(t, C, M, R, work_s=300 * M, seed=1) for t in sims], "o",
        label="simulated: random (exponential) failures")
ax.axvline(tau_star / 60, ls=":", color="gray")
ax.text(tau_star / 60, 0.82, rf" $\tau^*=\sqrt{{2CM}}$ = {tau_star / 60:.0f} min")
ax.set_xscale("log"); ax.set_ylim(0.8, 1); ax.set_xlabel("checkpoint interval (minutes)")
ax.set_ylabel("goodput"); ax.legend(); plt.tight_layout(); plt.show()
print(f"tau* = {tau_star / 60:.1f} min: goodput {model_goodput(tau_star, C, M, R):.1%}; at tau*/2 "
      f"{model_goodput(tau_star / 2, C, M, R):.1%}, at 2 tau* {model_goodput(2 * tau_star, C, M, R):.1%}")
''', r'''%md
The optimum is flat: at $\tau^*$ both terms equal $x = C/\tau^* = \tau^*/2M$, and at $k\tau^*$ the waste is
$x(k + 1/k)$ — a factor of 2 either side adds $x/2$, a quarter of the checkpointing waste. So $\tau^*$ is a
good default, not a knife-edge. The first-order model is slightly pessimistic (the simulation sits a little
above it). What moves the curve is $C$ (asynchronous and in-memory checkpoints make it seconds) and $R$
(spare nodes kept warm, nothing reloaded).

**Exercise — Young's interval.** Write `my_interval(C, M)`; it is checked against the library's function,
and against the model: no interval on a fine grid does better.
''', r'''%exercise young
def my_interval(C, M):
    raise NotImplementedError("hint: the fraction lost per second, checkpoint cost plus expected rework, "
                              "as a function of tau: where is it smallest?")
''', r'''
for C_, M_ in ((30.0, 14400.0), (1.0, 86400.0), (300.0, 3600.0)):
    assert np.isclose(my_interval(C_, M_), young_daly_interval(C_, M_)), (C_, M_)
    grid = np.linspace(0.2, 5, 500) * my_interval(C_, M_)
    assert model_goodput(my_interval(C_, M_), C_, M_) >= max(model_goodput(t, C_, M_) for t in grid) - 1e-12
print("correct; the library's version:\n")
print(inspect.getsource(young_daly_interval))
''', r'''%md
**Daly's interval.** Young's $\tau^*$ is first order in $C/M$: it prices a failure at half an interval
and ignores that a failure can also strike while a checkpoint is written or lost work is redone. Take
the model `simulate` draws from — failures at exponential times, a failure losing the segment in
progress, its work and its checkpoint — and a segment of $\tau + C$ seconds, repeated until no failure
falls in it, costs on average $(M + R)\,(e^{(\tau + C)/M} - 1)$ seconds of wall time. The goodput is then
exactly

$$G(\tau) = \frac{\tau}{(M + R)\,\big(e^{(\tau + C)/M} - 1\big)},$$

and Daly (2006) expanded its optimum to higher order (`young_daly_interval(C, M, daly=True)`):

$$\tau^*_\text{Daly} = \sqrt{2CM}\left[1 + \frac13\sqrt{\frac{C}{2M}} + \frac19\,\frac{C}{2M}\right] - C
\quad\text{for } C < 2M, \qquad \tau^*_\text{Daly} = M \quad\text{for } C \ge 2M.$$

Since $C/\sqrt{2CM} = \sqrt{C/2M}$, Daly's interval is Young's times $1 - \frac23\sqrt{C/2M} + \frac19\frac{C}{2M}$:
shorter, by a share that grows with $\sqrt{C/M}$. Below, $G$'s true maximum (a fine grid), both formulas,
and `simulate` at each interval as a check on $G$:
''', r'''
def exact_goodput(tau, C, M, R=0.0):
    """tau / ((M + R)(e^((tau + C)/M) - 1)): the goodput of the model simulate() draws from."""
    return tau / ((M + R) * np.expm1((tau + C) / M))


print(f"{'C':>6} {'M':>6} {'C/M':>6} | {'interval (s): Young':>20} {'Daly':>6} {'best':>6} | "
      f"{'goodput: Young':>14} {'Daly':>6} {'best':>6} | simulated at Daly's")
for C_, M_ in ((30.0, 4 * 3600.0), (300.0, 3 * 3600.0), (300.0, 3600.0), (1800.0, 3600.0)):
    young, daly = young_daly_interval(C_, M_), young_daly_interval(C_, M_, daly=True)
    grid = np.geomspace(C_ / 10, 10 * M_, 200_001)
    best = grid[np.argmax(exact_goodput(grid, C_, M_))]
    g_young, g_daly, g_best = (exact_goodput(t, C_, M_) for t in (young, daly, best))
    simulated = simulate(daly, C_, M_, 0.0, work_s=2000 * M_, seed=1)
    print(f"{C_:6.0f} {M_:6.0f} {C_ / M_:6.3f} | {young:20.0f} {daly:6.0f} {best:6.0f} | "
          f"{g_young:14.2%} {g_daly:6.2%} {g_best:6.2%} | {simulated:.2%}")
    assert abs(simulated - g_daly) < 0.01, "simulate() and G(tau) describe the same model"
    assert abs(daly - best) < 0.01 * best, "Daly's formula lands on G's maximum"
    assert g_young < g_daly and g_best - g_daly < 1e-5, "Young's interval does a little worse"
''', r'''%md
Daly's formula lands on the exact optimum; Young's overshoots it by 2 % when the checkpoint takes
1/480 of the MTBF and by 15 % when it takes 1/12. The goodput hardly notices — the optimum is flat, as
above — until $C$ is a large share of $M$: a quarter of a point at $C = M/12$, a point and a half at
$C = M/2$.
So Young's $\sqrt{2CM}$ is the right first answer, and Daly's matters where checkpoints are slow against
the failure rate: a job that already loses a large share of its time.

## 5. The largest valid world size

After a failure the supervisor runs on the **largest** number of ranks $w \le$ the slots left for which
some layout is valid, never below `--min-np`. "Valid" is the trainer's own judgement:
`TrainConfig.resolve(w)` raises `ConfigError` for a layout that cannot run. For each $w$ it tries the
performance model's plan (lesson 13), then your layout with dp rescaled, then data parallelism alone.

**Exercise.** Write `my_largest_world(config, slots, min_np)` without the plan: for $w$ from `slots` down
to `min_np`, try `replace(config, dp=None)` (your tp/pp/cp kept), then data parallel only
(`replace(config, dp=None, tp=1, pp=1, cp=1, chunks=1, schedule=None, microbatches=None,
sequence_parallel=False)`); return the first $w$ that resolves, or None.
''', r'''
from dataclasses import replace
from minipar.config import ConfigError, TrainConfig
''', r'''%exercise largest
def my_largest_world(config, slots, min_np=1):
    raise NotImplementedError("hint: the trainer is the judge of a layout: ask it, from the largest w "
                              "down, and treat its refusal as an answer")
''', r'''
base = TrainConfig(model="tiny", n_layer=2, d_model=16, n_head=4, seq_len=8, batch_size=8)
cases = [(base, s, 1) for s in range(1, 9)] + [(base, 3, 3), (replace(base, batch_size=12), 5, 1),
         (replace(base, tp=2), 3, 1), (replace(base, tp=2, pp=2), 7, 1), (replace(base, n_head=8, tp=4), 7, 2)]
for config, slots, min_np in cases:
    want = largest_world_size(config, slots, min_np, use_plan=False)[0]
    assert my_largest_world(config, slots, min_np) == want, (config.layout_name(), slots, min_np, want)
print("correct; e.g. batch 8, 4 heads:", {s: my_largest_world(base, s) for s in range(1, 9)})
''', r'''%md
## 6. A slow rank, and load balancing

A failing rank is not the only problem: a *slow* one (thermal throttling, a noisy neighbour, a bad link)
makes every synchronous step wait for it. `MINIPAR_SLOW_RANK=1:2` makes rank 1 sleep as long again as
its forward+backward. With `--balance` each data-parallel replica gets rows of the global batch in
proportion to its measured speed, re-measured every 5 steps, and its loss weighted by $dp\cdot n_i/N$ so
that the update stays exactly that of one process (lesson 05's average, uneven shares).
''', r'''
SMALL = ["--model", "tiny", "--n-layer", "2", "--d-model", "32", "--seq-len", "32", "--batch-size", "24",
         "--steps", "30", "--precision", "fp64", "--quiet", "--eval-batches", "0"]
runs = {}
for name, extra in (("even shares", []), ("--balance", ["--balance"])):
    log = f"{WORK}/{name.strip('-').replace(' ', '_')}.json"
    mpirun(2, ["-m", "minipar", "train", *SMALL, *extra, "--log-json", log], env={"MINIPAR_SLOW_RANK": "1:2"})
    runs[name] = read_log(log)[1]
np.testing.assert_allclose([r["loss"] for r in runs["--balance"]], [r["loss"] for r in runs["even shares"]],
                           rtol=1e-9)                       # uneven shares, the same updates
even = runs["even shares"][10:]
tokens_per_rank = 24 * 32 / 2
ideal = sum(np.median([tokens_per_rank / r["per_rank"]["compute_s"][i] for r in even]) for i in range(2))
fig, (a, b) = plt.subplots(1, 2, figsize=(11, 3.4))
for name, recs in runs.items():
    a.plot([r["step_time_s"] * 1e3 for r in recs], label=name)
a.set_xlabel("step"); a.set_ylabel("step time (ms)"); a.legend(); a.set_title("rank 1 slowed 2x")
b.plot([r["batch_shares"][0] for r in runs["--balance"]], label="rank 0 (fast)")
b.plot([r["batch_shares"][1] for r in runs["--balance"]], label="rank 1 (slow)")
b.axhline(16, ls=":", color="gray", label="16:8, if time were ∝ rows"); b.set_xlabel("step"); b.set_ylabel("rows of 24"); b.legend()
b.set_title("--balance: shares of the batch"); plt.tight_layout(); plt.show()
for name, recs in runs.items():
    print(f"{name:12} {np.median([r['tokens_per_s'] for r in recs[10:]]):8,.0f} tokens/s")
print(f"{'ideal':12} {ideal:8,.0f} tokens/s (the sum of the two ranks' speeds; at most 1.5x even shares)")
''', r'''%md
Speeds 1 and ½: even shares run at the slow rank's pace, $2\cdot\tfrac12 = 1$; the ideal is
$1 + \tfrac12 = 1.5$. If a replica's time were proportional to its rows, shares 16:8 would reach it. They
settle lower for the slow rank: the new shares are $n_i' \propto n_i/t_i$, whose fixed point is **equal
times** $t_0 = t_1$, and a step also has a fixed part (Python, launching kernels, the optimizer) that the
slowed rank pays twice too — so it must get fewer rows than its "speed" says. On a shared 2-core machine
the times are noisy, so the shares wander; `benchmarks/balance.py` measures with repeats. (minipar
refuses `--balance` with pipeline parallelism: there the fix is moving *layers*.)

## 7. The code

The supervisor names a hung rank from the process table:
''', r'''
from minipar.elastic.attempt import Attempt
print(inspect.getsource(Attempt._blame_hang))
''', r'''%md
and why there is an agent per rank: MPICH's launcher kills every rank at once when one dies, and the
process id it prints is not always the one that died first. The agent is the rank's parent, so it
*knows* how its child ended:
''', r'''
from minipar.elastic import agent
print(inspect.getsource(agent.main))
''', r'''%md
## The names you will meet

- **torchrun** (`torch.distributed.run`, TorchElastic): an **elastic agent** per node starts the workers,
  watches them, and on any failure or membership change stops *all* workers and restarts them
  (`--max-restarts`); the nodes meet at a **rendezvous** (`--rdzv-backend c10d`, `--rdzv-endpoint`) that
  decides the new membership within `--nnodes MIN:MAX`. The worker restores its own checkpoint (it sees
  `TORCHELASTIC_RESTART_COUNT`) — the data order after a change of size is its problem.
- **Horovod elastic** (`hvd.elastic.run`, `hvd.elastic.State` with `commit()` / `restore()`): survivors stay
  alive and re-form the ring in process; a host discovery script says which hosts exist, failed hosts are
  **blacklisted** — minipar's `--hosts` does the same.
- **DeepSpeed**: elastic training computes the batch sizes compatible with a range of GPU counts
  (`elasticity` config), and *universal checkpointing* converts a ZeRO/TP/PP checkpoint offline for another layout —
  what minipar's sharded checkpoints do on load (each rank reads the boxes it owns).
- **Goodput** (Google's ML goodput), **Young/Daly interval**, **MTBF**; asynchronous checkpoints
  (PyTorch DCP `async_save`), in-memory checkpoints to peers (Gemini), hot spares.
- **Stragglers**: per-rank step times in the logs (lesson 13's monitor), data-parallel load balancing as
  here, and at scale simply finding and draining the slow node.
''', r'''%md
## What changes on GPU nodes and at scale

The numbers that set the checkpoint interval change by orders of magnitude. Meta reported 419
unexpected interruptions in 54 days on 16 384 H100s (the introduction): one every ~3 hours for the
job. A 405B model's weights and Adam state are ~6.5 TB; at tens of GB/s of aggregate storage bandwidth
a synchronous checkpoint takes minutes. Young's and Daly's intervals with those (published figures; the
checkpoint time is an assumption for the example), and the goodput of each in the exact model above:
''', r'''mtbf = 54 * 24 * 3600 / 419
for C in (60.0, 300.0):
    young, daly = young_daly_interval(C, mtbf), young_daly_interval(C, mtbf, daly=True)
    print(f"checkpoint {C:>4.0f} s, MTBF {mtbf / 3600:.1f} h: every {young / 60:.0f} min (Young) or "
          f"{daly / 60:.0f} min (Daly), goodput {exact_goodput(young, C, mtbf, 600.0):.1%} or "
          f"{exact_goodput(daly, C, mtbf, 600.0):.1%} (restart 10 min)")
''', r'''%md
At that scale the supervisor you wrote is the right shape but every part of it is distributed: an agent
per node instead of one `mpiexec` (torchrun's elastic agent, Slurm's requeue), a rendezvous that decides
who is still alive, checkpoints written by every rank in parallel and asynchronously (PyTorch DCP's
`async_save`, the sharded format) so that $C$ drops to seconds, hot spare nodes so that the restart does
not wait for a replacement, and health checks that drain a slow or flaky node before it fails.
''']
