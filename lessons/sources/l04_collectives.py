"""Lesson 04: the cells of lessons/04_collectives.ipynb (``%md`` cells are markdown).

Edit here, then run ``python lessons/make_notebooks.py``."""
from launch import LAUNCH   # the cell that defines mpirun() for the lesson's runs

NOTEBOOK = "04_collectives.ipynb"

CELLS = [r'''%md
# 04 · SPMD and collectives: ring, tree, recursive doubling, hierarchical

Every distributed training run is **one program started $p$ times**. The copies differ only in a
number, their **rank** $r \in \{0, \dots, p-1\}$, and they cooperate by sending each other messages.
Data parallelism then needs one operation above all: **all-reduce** — every rank holds a gradient
buffer of $S$ bytes and every rank must end with the sum over all $p$ ranks. NCCL and MPI do it for
you; here we build it from nothing but point-to-point `send` / `recv` of contiguous buffers
(`minipar/comm/transport.py`), count its bytes, and time it against MPI's own `Allreduce` and against
the α-β-γ cost model.

Plan: (1) what `mpiexec` starts — ranks, send and receive, and a **deadlock** (and how to avoid it:
**you write** a deadlock-free ring shift); (2) the ring all-reduce — **you write** its
reduce-scatter; (3) tree, recursive doubling, Rabenseifner, hierarchical, checked and counted — **you write**
recursive doubling for any number of ranks;
(4) the cost model — **you write** the ring's formula, then we calibrate the constants and see how
far the predictions are from the measurements, and why.

Everything runs on CPU ranks of this machine through `lessons/04_collectives.py` (subcommands
`hello`, `deadlock`, `exercise`, `algorithms`, `model`); `--backend cupy` puts the buffers on GPUs.
Solutions: `lessons/solutions/04_collectives.py`.
''', r'''
import inspect
import json
import os
import statistics
import subprocess
import sys
import tempfile
import textwrap
import time

import matplotlib.pyplot as plt
import numpy as np

%matplotlib inline
OUT = tempfile.mkdtemp(prefix="minipar_l04_")
''' + LAUNCH + r'''
def save_exercise(fn):
    """Write your function to a file that the lesson script imports on every rank."""
    path = os.path.join(OUT, fn.__name__ + ".py")
    with open(path, "w") as f:
        f.write("import numpy as np\nfrom minipar.backend import xp\nfrom minipar.comm import chunk_bounds\n\n")
        f.write(textwrap.dedent(inspect.getsource(fn)))
    return path
''', r'''%md
## 1. SPMD: one program, $p$ ranks

`mpiexec -n 4 python 04_collectives.py hello` starts **four processes running the same file**
(Single Program, Multiple Data). MPI gives each its rank and the world size; everything else —
which rank sends, which receives, which part of the data is whose — the program derives from those
two numbers. Below, every rank prints a line (in whatever order the four processes get there: their
output streams are merged by `mpiexec`); then rank 0 sends four floats to rank 1 while ranks 2 and 3
skip that `if`.
''', r'''
proc = mpirun(4, ["04_collectives.py", "hello", "--backend", BACKEND])
print(proc.stdout)
ranks = sorted(int(line.split()[1]) for line in proc.stdout.replace("rank", "\nrank").splitlines()
               if line.startswith("rank") and " of 4" in line)
assert ranks == [0, 1, 2, 3], proc.stdout                       # four processes, ranks 0..3
assert "rank 1 received [0.0, 10.0, 20.0, 30.0] from rank 0" in proc.stdout
''', r'''%md
`send` and `recv` are minipar's thin layer over MPI's blocking `Send` / `Recv`: the array travels as
raw bytes (MPI never needs its dtype, so float16 and bfloat16 go like anything else), and the
traffic counters that the rest of this lesson checks are updated here:
''', r'''
from minipar.comm import Communicator

print(inspect.getsource(Communicator.send))
''', r'''%md
### A deadlock

Two ranks swap buffers: each first sends its buffer to the other, then receives. For small messages
that works: MPI copies a small message into a buffer and `Send` returns at once (the **eager**
protocol). A large message is not buffered: `Send` waits until the receiver has posted the matching
`Recv` (**rendezvous**), so that the bytes can be copied once, straight into the receiver's array.
Both ranks are then inside `Send`, each waiting for the other to reach `Recv` — forever.

`deadlock` doubles the size from 1 KiB until that happens. It runs with minipar's **hang timeout**
(`Communicator(hang_timeout=2)`, or `MINIPAR_HANG_TIMEOUT=2`): a watchdog thread notices a wait on a
peer that lasts more than 2 s and ends the job, naming the call and the peer — a hung job becomes an
error message. (The subprocess timeout is only a second guard.)
''', r'''
proc = mpirun(2, ["04_collectives.py", "deadlock", "--hang-timeout", "2", "--backend", BACKEND],
              timeout=120, check=False)                  # meant to fail: the status is checked below
print(proc.stdout)
watchdog = [line for line in proc.stderr.splitlines() if "waited" in line]
print("\n".join(watchdog))
completed = [int(line.split()[0]) for line in proc.stdout.splitlines() if line.endswith("completed")]
assert proc.returncode != 0 and watchdog, proc.stderr[-2000:]   # it hung, and the watchdog said so
assert all("send waited" in line for line in watchdog)          # both ranks were stuck in send
eager_limit = max(completed, default=0)
print(f"largest message that two blocking sends survived here: {eager_limit} bytes; "
      f"{2 * eager_limit} bytes deadlocked")
''', r'''%md
The largest size that worked is this MPI's eager limit *on this machine* — another MPI, another
transport (shared memory, InfiniBand) or an environment variable moves it. A program that relies on
it works in the test and hangs in production. Three correct ways out:

* **order the calls** so that every send meets a receive: even ranks send first, odd ranks receive
  first;
* **`sendrecv`** (MPI's `Sendrecv`): one call that posts both, the library orders them;
* **non-blocking** `isend` + `irecv`, then wait for both (what minipar's pipelined `exchange_reduce`
  does).

**Exercise.** Write `ring_shift(comm, send, recv)` with the blocking `comm.send(buf, dest)` and
`comm.recv(buf, source)` only: every rank sends `send` to its right neighbour $(r+1) \bmod p$ and
receives its left neighbour's $(r-1) \bmod p$ into `recv`. It is checked on a ring of **3** ranks
(odd: rank 2 and rank 0 are both even and neighbours) with 4 MiB messages, far above the eager
limit, against MPI's `Sendrecv`; a deadlocking version is stopped by the hang timeout after 10 s.
''', r'''%exercise ring_shift
def ring_shift(comm, send, recv):
    """Send `send` to rank (r+1) % p, receive from rank (r-1) % p into `recv`; blocking calls only."""
    raise NotImplementedError("hint: above the eager limit a send returns only once its receive is posted; "
                              "order the calls so that no cycle of ranks can all be sending at once — "
                              "on a ring of odd length too")
''', r'''
proc = mpirun(3, ["04_collectives.py", "exercise", "--file", save_exercise(ring_shift),
                  "--name", "ring_shift", "--backend", BACKEND])
print(proc.stdout)
''', r'''%md
Why does the ordering work even on an odd ring? Odd ranks receive first, so every chain of waits
ends at an odd rank, which takes the message it waits for; no cycle of ranks all waiting on sends can
form. It is serialised, though: rank 2's send to rank 0 waits until rank 0 has finished its own send.
`sendrecv` lets MPI run both directions at once, which is why every collective below uses it.

## 2. The ring all-reduce

Cut the buffer into $p$ chunks (minipar uses `numpy.array_split` boundaries, so any size works:
the first $S \bmod p$ chunks are one element longer). In step $s = 0, \dots, p-2$ of the
**reduce-scatter**, rank $r$ sends chunk $(r-s-1) \bmod p$ to its right neighbour and adds the chunk
$(r-s-2) \bmod p$ arriving from its left into its own copy. After $p-1$ steps rank $r$ owns chunk
$r$, fully reduced. The **all-gather** passes the finished chunks around the ring the same way,
without adding. Every link carries one chunk per step, all links at once: that is why the ring is
bandwidth-optimal — each rank sends $2\frac{p-1}{p}S$ bytes, whatever $p$.
''', r'''
from minipar.comm import chunk_bounds, chunk_sizes

n, p = 10, 4
print("chunk sizes of", n, "elements over", p, "ranks:", chunk_sizes(n, p), " bounds:", chunk_bounds(n, p))
assert chunk_sizes(n, p) == [len(c) for c in np.array_split(np.arange(n), p)]
for r in range(p):
    steps = [((r - s - 1) % p, (r - s - 2) % p) for s in range(p - 1)]
    print(f"rank {r}: reduce-scatter (send chunk, receive + add chunk) per step: {steps}")
''', r'''%md
**Exercise.** Write `ring_reduce_scatter(comm, buf)`, in place on the 1-D array `buf`: afterwards
chunk $r$ of rank $r$ (`buf[b[r]:b[r+1]]`, `b = chunk_bounds(buf.size, p)`) is the sum of chunk $r$
over all ranks. Use `comm.sendrecv(send, dest, recv, source)` for each step, receiving into a
scratch array (`np`, `xp` and `chunk_bounds` are imported for you). It is run on 3 ranks at three
sizes — 10 elements (uneven chunks), 1000, $2^{18}$ — and compared with minipar's
`ring_reduce_scatter`, including the bytes each rank sent.
''', r'''%exercise ring_reduce_scatter
def ring_reduce_scatter(comm, buf):
    """In place: afterwards chunk comm.rank of buf holds that chunk summed over all ranks."""
    raise NotImplementedError("hint: p - 1 steps, one chunk out to the right and one in from the left each; "
                              "the schedule printed above says which — and chunk r must end complete on rank r")
''', r'''
proc = mpirun(3, ["04_collectives.py", "exercise", "--file", save_exercise(ring_reduce_scatter),
                  "--name", "ring_reduce_scatter", "--backend", BACKEND])
print(proc.stdout)
''', r'''%md
minipar's version (`minipar/comm/ring.py`) computes the same schedule once, as slice bounds per step,
and hands each step to `exchange_reduce`, which cuts chunks above 1 MiB into segments so that one
segment is being added while the next is in flight:
''', r'''
from minipar.comm import ring

print(inspect.getsource(ring._steps))
print(inspect.getsource(ring.ring_reduce_scatter))
''', r'''%md
## 3. Tree, recursive doubling, Rabenseifner, hierarchical

* **Binomial tree**: in round $k$, every rank that already has the data sends it to the rank
  $2^k$ further; $\lceil\log_2 p\rceil$ rounds reach everyone. Reduce is the same tree run upwards.
* **Recursive doubling**: in step $k$ rank $i$ swaps its *whole* buffer with rank $i \oplus 2^k$ and
  adds: $\log_2 p$ messages — the fewest possible — but $S\log_2 p$ bytes.
* **Rabenseifner**: the same partners, but in the first half each swap exchanges *half* of the
  current window (recursive halving reduce-scatter), then the halves are gathered back in
  reverse order: the ring's bytes in $2\log_2 p$ steps.
* Non-powers of two: the first $2(p-p')$ ranks fold pairwise onto $p' = 2^{\lfloor\log_2 p\rfloor}$
  ranks before, and unfold after: two extra messages of $S$ per folded pair, one in and one back out.
* **Hierarchical**: reduce-scatter inside each node (fast links), all-reduce only the $S/q$ shard
  across nodes (slow links), all-gather inside the node. On one machine we pretend
  nodes with `ranks_per_node`.

`algorithms` runs every one on 4 ranks, checks the result against NumPy on every rank (each rank
can recompute every other rank's input) and compares the traffic counters with the textbook
volumes. It runs in **check mode** (`Communicator(check=True)`, or `MINIPAR_COMM_CHECK=1`): before
each collective the ranks agree on a small descriptor of its arguments, so a rank that passes
another size raises an error on every rank instead of hanging.
''', r'''
rows_file = os.path.join(OUT, "algorithms.json")
proc = mpirun(4, ["04_collectives.py", "algorithms", "--sizes", "4K,64K", "--ranks-per-node", "2",
                  "--json", rows_file, "--backend", BACKEND])
print(proc.stdout)
rows = json.load(open(rows_file))
assert all(r["correct"] for r in rows), "an algorithm disagrees with NumPy"
for r in rows:
    assert abs(r["bytes_per_rank"] - r["textbook"]) <= 16, r   # exact up to uneven chunks
print("every algorithm matches NumPy on every rank and moves exactly the textbook bytes")
''', r'''%md
**Exercise.** Write `recursive_doubling(comm, buf)`: an all-reduce (sum) in place on the 1-D
array `buf`, for **any** number of ranks $p$, in three phases. Let $p'$ be the largest power of two
$\le p$ and $e = p - p'$ the number of extra ranks.

1. **Fold-in.** The first $2e$ ranks pair up, $(0, 1), (2, 3), \dots$: the even rank of a pair
   sends its whole buffer to the odd one, which adds it to its own, and sits out the rounds.
2. **Rounds.** The $p'$ ranks left are renumbered $0, \dots, p'-1$ in rank order (an odd rank $r$
   of a pair becomes $r/2$ rounded down, a rank $r \ge 2e$ becomes $r - e$). In round
   $k = 0, 1, \dots, \log_2 p' - 1$, new rank $i$ swaps its whole buffer with new rank
   $i \oplus 2^k$ (`^` in Python) — translated back to the communicator's rank — and adds what it
   received. After round $k$ every rank holds the sum over a group of $2^{k+1}$ new ranks.
3. **Fold-out.** The odd rank of each pair sends the result back to its even partner.

Each rank sends $S\log_2 p'$ bytes, the odd ranks of pairs $S$ more and the extras only $S$: on
average $(p'\log_2 p'\,S + 2(p - p')S)/p$, the `recursive dbl.` row of the table above. Use
`comm.send`, `comm.recv` and `comm.sendrecv`, receiving into a scratch array (`np`, `xp` are
imported). The check runs on **3** ranks (one pair folds) and on **4** (no fold) at four sizes — 1001
elements, 1, 0 and $2^{18}$ (1 MiB, above the eager limit) — and compares every message as it
leaves (its partner and byte count) with the schedule above, the result with NumPy's sum on every
rank, and the bytes each rank sent with minipar's `recursive_doubling_all_reduce` and the formula.
''', r'''%exercise recursive_doubling
def recursive_doubling(comm, buf):
    """In place: every rank ends with buf summed over all ranks, for any number of ranks."""
    raise NotImplementedError("hint: a rank's role follows from r, p and p' alone; the rounds talk "
                              "in the new numbering, the messages go to communicator ranks; in a "
                              "swap both partners send at once, and each must also receive")
''', r'''
for p in (3, 4):
    proc = mpirun(p, ["04_collectives.py", "exercise", "--file", save_exercise(recursive_doubling),
                      "--name", "recursive_doubling", "--backend", BACKEND])
    print(proc.stdout)
''', r'''%md
At $p = 4$ no rank folds and every rank sends $2S$; at $p = 3$ rank 1 does the work of two (it sends
$2S$, the others $S$ each): the fold makes the ranks' traffic unequal, and the pair's two extra
messages come on top of the $\log_2 p'$ rounds. minipar's version computes the roles once per
communicator and pipelines each swap in segments (`exchange_reduce`); it also always puts the lower
rank's operand first, so that both partners of a swap compute bitwise the same sum:
''', r'''
from minipar.comm import doubling

print(inspect.getsource(doubling._layout))
print(inspect.getsource(doubling.recursive_doubling_all_reduce))
''', r'''%md
## 4. The α-β-γ cost model

A message of $n$ bytes costs $\alpha + n\beta$ (latency + bytes/bandwidth); reducing $n$ bytes
costs $n\gamma$. For $p$ ranks and $S$ bytes:

| algorithm | time | bytes sent per rank |
|---|---|---|
| ring (reduce-scatter + all-gather) | $2(p-1)\alpha + 2\frac{p-1}{p}S\beta + \frac{p-1}{p}S\gamma$ | $2\frac{p-1}{p}S$ |
| recursive doubling | $\log_2 p\,(\alpha + S\beta + S\gamma)$ | $S\log_2 p$ |
| Rabenseifner (halving RS + doubling AG) | $2\log_2 p\,\alpha + 2\frac{p-1}{p}S\beta + \frac{p-1}{p}S\gamma$ | $2\frac{p-1}{p}S$ |
| tree (binomial reduce + broadcast) | $2\lceil\log_2 p\rceil(\alpha + S\beta) + \lceil\log_2 p\rceil S\gamma$ | $2\frac{p-1}{p}S$ on average, $S\log_2 p$ at the root |
| hierarchical ($m$ nodes of $q$) | ring RS($q$) + all-reduce($m$, $S/q$) + ring AG($q$) | $2\frac{q-1}{q}S + 2\frac{m-1}{m}\frac{S}{q}$ |

Small buffers are latency-bound (fewest messages wins: recursive doubling, tree); large buffers
are bandwidth-bound (ring and Rabenseifner send the optimal $2\frac{p-1}{p}S$ per rank: *nearly*
independent of $p$ — $S$ at $p = 2$, $1.5S$ at 4, approaching $2S$ — while their latency term grows
with $p$).

**Exercise.** Write `ring_time(p, S, alpha, beta, gamma)`, the first row of the table. It is
checked against `cost_model.predict("ring", ...)` for constants that do not depend on size, for
$p$ from 2 to 8 and chunks up to 1 MiB (larger ones are cut into segments, one α each).
''', r'''%exercise ring_time
def ring_time(p, S, alpha, beta, gamma):
    """Seconds of a ring all-reduce of S bytes over p ranks, by the alpha-beta-gamma model."""
    raise NotImplementedError("hint: count the ring's steps, the bytes each step sends, and which steps "
                              "also add what they received")
''', r'''
from minipar.comm import cost_model

for p in range(2, 9):
    for S in (8, 4096, 1 << 20, p << 20):
        for a, b, g in [(5e-6, 1e-10, 4e-11), (2e-5, 1e-9, 3e-10)]:
            lib = cost_model.predict("ring", p, S, cost_model.CostParams(a, b, g))
            assert np.isclose(ring_time(p, S, a, b, g), lib, rtol=1e-12), (p, S, ring_time(p, S, a, b, g), lib)
print("ring_time == cost_model.predict('ring', ...) for p = 2..8 and S up to p MiB")
''', r'''%md
minipar's model is that formula with two refinements, both found by measuring (`comm/cost_params.py`):
β and γ depend on whether a step's piece fits in cache (`beta_of`, `gamma_of`: a step of a large
all-reduce streams its data through DRAM), and a chunk beyond 1 MiB is pipelined in segments, one α
each:
''', r'''
print(inspect.getsource(cost_model.beta_of))
print(inspect.getsource(cost_model._ring))
''', r'''%md
### Calibrated constants, predicted against measured

The constants come from an **explicit, collective** call. Without it, `cost_model.params(comm)`
never communicates: it returns what `use` set, else `MINIPAR_COMM_ALPHA/BETA/GAMMA` from the
environment (all three), else a profile file named by `MINIPAR_COMM_PROFILE`, else `DEFAULTS`
(measured once on a 2-core machine). The `model` subcommand does, on 2 ranks:

```python
from minipar.perf.calibrate_links import calibrate
ctx = comm.context("coll")          # the collectives' own communicator
c = calibrate(ctx)                  # α from an 8-byte step, β from exchanges of 256 KiB and 8 MiB,
                                    # γ from sums on 64 KiB and 8 MiB, γ_shared inside an exchange
cost_model.use(ctx, c)              # "auto" now chooses by these
```

(three times, in fact, keeping the median of each constant — the spread is printed below), 
then times every algorithm, MPI's own `Allreduce`, and one bare `comm.sendrecv` (one message each
way: the model's unit, $\alpha + S\beta$) from 1 KiB to 4 MiB — in turns, round after round, each from
a freshly written buffer, the slowest rank's time, the median over rounds — and writes each time
beside `cost_model.predict(algorithm, 2, S, c)`.
''', r'''
model_file = os.path.join(OUT, "model.json")
proc = mpirun(2, ["04_collectives.py", "model", "--json", model_file, "--backend", BACKEND])
print(proc.stdout)
run = json.load(open(model_file))
c = cost_model.CostParams.from_dict(run["params"])
cals = [cost_model.CostParams.from_dict(d) for d in run["calibrations"]]
spread = lambda f: f"{min(f(x) for x in cals):.3g} to {max(f(x) for x in cals):.3g}"
print(f"{len(cals)} calibrations a second apart: α {spread(lambda x: x.alpha * 1e6)} µs, "
      f"1/β {spread(lambda x: 1 / x.beta / 1e9)} GB/s, 1/β_large {spread(lambda x: 1 / x.beta_large / 1e9)} GB/s, "
      f"1/γ_shared {spread(lambda x: 1 / x.gamma_shared / 1e9)} GB/s\n")
by = {(r["algorithm"], r["size"]): r for r in run["rows"]}
sizes = sorted({r["size"] for r in run["rows"]})
algs = [a for a in ("ring", "recursive_doubling", "rabenseifner", "tree") if (a, sizes[0]) in by]

label = {"ring": "ring", "recursive_doubling": "rec. doubling", "rabenseifner": "Rabenseifner", "tree": "tree"}
print(f"{'size':>8} " + " ".join(f"{label[a]:>24}" for a in algs) + f"{'MPI':>10}")
print(f"{'':>8} " + " ".join(f"{'measured/model µs':>24}" for a in algs) + f"{'µs':>10}")
for S in sizes:
    cells = [f"{by[a, S]['time_s'] * 1e6:9.1f} /{by[a, S]['predicted_s'] * 1e6:8.1f} ({by[a, S]['time_s'] / by[a, S]['predicted_s']:4.1f}x)"
             for a in algs]
    mpi = by.get(("mpi", S))
    print(f"{S:>8} " + " ".join(f"{x:>24}" for x in cells) + (f"{mpi['time_s'] * 1e6:10.1f}" if mpi else ""))
assert all(r["time_s"] > 0 and (r["predicted_s"] or 0) >= 0 for r in run["rows"])
if ("exchange", sizes[0]) in by:
    print("\none bare exchange (comm.sendrecv), measured / α + S·β:  " + ",  ".join(
        f"{S >> 10} KiB {by['exchange', S]['time_s'] * 1e6:.1f} / {by['exchange', S]['predicted_s'] * 1e6:.1f} µs"
        for S in sizes))
''', r'''
ratio = {k: r["time_s"] / r["predicted_s"] for k, r in by.items() if k[0] in algs}
small = [v for (a, S), v in ratio.items() if S <= 16 << 10]
large = [v for (a, S), v in ratio.items() if S >= 256 << 10]
worst = max(ratio, key=lambda k: abs(np.log(ratio[k])))
print(f"measured / predicted, median: {statistics.median(small):.2f}x up to 16 KiB, "
      f"{statistics.median(large):.2f}x from 256 KiB; worst {ratio[worst]:.2f}x ({worst[0]}, {worst[1]} bytes)")
within2 = sum(0.5 <= v <= 2 for v in ratio.values())
print(f"within a factor 2 of the prediction: {within2} of {len(ratio)} points")

# at p = 2 the ring and Rabenseifner send the very same messages: one reduce step and one gather
# step of S/2 each. The model gives them the same time; what separates them is this machine's noise.
same = [by["ring", S]["time_s"] / by["rabenseifner", S]["time_s"] for S in sizes]
assert all(np.isclose(by["ring", S]["predicted_s"], by["rabenseifner", S]["predicted_s"]) for S in sizes)
print(f"ring / Rabenseifner, identical messages: measured ratio from {min(same):.2f} to {max(same):.2f}")

# at p = 2 recursive doubling is one exchange and one add: what it takes beyond a bare exchange is the
# collective's own per-call work (argument checks, the cached plan, the add) that no α counts
S0 = sizes[0]
if ("exchange", S0) in by:
    t_ex, t_rd = by["exchange", S0]["time_s"], by["recursive_doubling", S0]["time_s"]
    print(f"at {S0} bytes: a bare exchange {t_ex * 1e6:.1f} µs (model α + Sβ: "
          f"{by['exchange', S0]['predicted_s'] * 1e6:.1f} µs); recursive doubling, that exchange + an add: "
          f"{t_rd * 1e6:.1f} µs, so {(t_rd - t_ex) * 1e6:+.1f} µs of per-call work")
if ("mpi", S0) in by:
    print(f"MPI's own Allreduce of {S0} bytes: {by['mpi', S0]['time_s'] * 1e6:.1f} µs")
rd = [f"{S >> 10} KiB {ratio['recursive_doubling', S]:.2f}x" for S in sizes if S >= 64 << 10]
print("recursive doubling, measured / predicted from 64 KiB:", ", ".join(rd))
busbw = lambda a, S: S / by[a, S]["time_s"] * 2 * (run["nprocs"] - 1) / run["nprocs"] / 1e9
if {1 << 20, 4 << 20} <= set(sizes):
    print(f"ring bus bandwidth: {busbw('ring', 1 << 20):.2f} GB/s at 1 MiB, {busbw('ring', 4 << 20):.2f} GB/s at 4 MiB")
for S in sizes:
    pick = by[algs[0], S]["model_choice"]
    best = min(algs, key=lambda a: by[a, S]["time_s"])
    print(f"{S:>8} bytes: model's choice {pick:<19} measured fastest {best:<19} "
          f"(the choice took {by[pick, S]['time_s'] / by[best, S]['time_s']:.2f}x the fastest)")
''', r'''
fig, (ax1, ax2) = plt.subplots(1, 2, figsize=(11, 4))
for i, a in enumerate(algs + ["mpi", "exchange"]):
    if (a, sizes[0]) not in by:
        continue
    t = np.array([by[a, S]["time_s"] for S in sizes])
    busbw = np.array(sizes) / t * (2 * (run["nprocs"] - 1) / run["nprocs"]) / 1e9
    style = dict(color="black", lw=2.5) if a == "mpi" else dict(color=f"C{i}", lw=1.2)
    if a != "exchange":
        ax1.plot(sizes, busbw, "o-", label=a, **style)
    if a != "mpi":
        ax2.loglog([by[a, S]["predicted_s"] * 1e6 for S in sizes], t * 1e6, "o", label=a, color=f"C{i}")
lo = min(min(r["time_s"], r["predicted_s"] or 1) for r in run["rows"]) * 1e6 / 2
hi = max(r["time_s"] for r in run["rows"]) * 1e6 * 2
ax2.loglog([lo, hi], [lo, hi], "k--", lw=0.8, label="measured = model")
ax2.fill_between([lo, hi], [lo / 2, hi / 2], [lo * 2, hi * 2], color="gray", alpha=0.15, label="within 2x")
ax1.set(xscale="log", xlabel="buffer size S (bytes)", ylabel="busbw = S/t · 2(p-1)/p (GB/s)",
        title=f"all-reduce bus bandwidth, {run['nprocs']} ranks")
ax2.set(xlabel="α-β-γ model (µs)", ylabel="measured (µs)", title="measured against the calibrated model")
ax1.legend(fontsize=8); ax2.legend(fontsize=8); ax1.grid(alpha=0.3); ax2.grid(alpha=0.3)
fig.tight_layout()
plt.show()
''', r'''%md
### How far off, and why

These are this run's numbers; rerun the cells and they move. What they show, and why:

* **The constants themselves move.** The calibrations taken a second apart (their spread is printed
  above the table) do not agree with each other: two ranks share a 2-core machine with other
  programs, and a blocking wait costs a scheduler time slice whenever the partner is not running.
  The calibration takes medians for that reason, but the load changes between the calibration and
  the timing. The ring and Rabenseifner make *identical* messages at $p = 2$, so their measured ratio
  is a direct reading of the noise during the timing: no model of the algorithms can do better than
  that.
* **A collective is more than its messages.** The calibrated α is one exchange-and-add step; an
  `all_reduce` call adds its own layer on top — argument checks, dispatching the algorithm, looking
  up the cached plan — once per call, not per message, and the model has no term for it. At $p = 2$
  recursive doubling is one exchange and one add, so its time minus a bare exchange's (printed)
  measures that layer plus the add. For small buffers, whose predictions are a count of α's, it is
  a visible share of the time.
* **One size stands for many.** β and γ switch from their in-cache to their out-of-cache values at
  one size (`cache_bytes`, 1 MiB), where a real machine has L2 and L3 and a gradual transition; and
  γ_shared, the cost of summing into the buffer the partner has just read, is measured at 64 KiB
  only and used at every size (see the recursive-doubling ratios printed from 64 KiB). The cache is
  visible in the left plot: the bus bandwidth falls from 1 MiB to 4 MiB (printed), where the data
  and the scratch buffers no longer fit.

So here the model is good for what `auto` uses it for — **ranking** algorithms: the fewest messages
for small buffers, the fewest bytes for large ones (the printed "the choice took …× the fastest"
says what a wrong pick cost in this run) — and only roughly for absolute times. On dedicated
hardware, calibrate there (`python -m minipar calibrate` saves the constants as a profile;
`python -m minipar bench comm --max-size 64M` prints this comparison for every size) rather than
trusting numbers from a busy laptop.

### What `auto` chooses

With the constants of this run, the model's winner changes with size and rank count (for $p > 2$
this is an extrapolation: the constants were measured between 2 ranks):
''', r'''
for p in (2, 4, 8, 64):
    picks = {S: cost_model.choose(p, S, c) for S in (1 << 10, 1 << 16, 1 << 20, 1 << 26)}
    print(f"p={p:3d}: " + ", ".join(f"{S >> 10:>6} KiB -> {a}" for S, a in picks.items()))
assert cost_model.choose(64, 1 << 10, c) in ("recursive_doubling", "tree")   # latency-bound: log p messages
assert cost_model.choose(64, 1 << 26, c) in ("ring", "rabenseifner")         # bandwidth-bound: 2(p-1)/p·S
''', r'''%md
## 5. Overlap: non-blocking collectives

`all_reduce_async(comm, buf)` hands the work to a per-communicator progress thread (MPI is
initialised with `MPI_THREAD_MULTIPLE`) and returns a handle with `wait()` / `test()`. mpi4py
releases the GIL in MPI calls and NumPy in large ufuncs, so the reduction proceeds while backward
keeps computing — lesson 05 builds gradient bucketing on it.

**Try it.** (1) `mpiexec -n 8 python 04_collectives.py algorithms` and explain the recursive-doubling
bytes at $p = 8$. (2) Run `python -m minipar bench comm` under `MINIPAR_COMM_ALPHA=5e-6
MINIPAR_COMM_BETA=1e-9 MINIPAR_COMM_GAMMA=1e-10` (a slow network) — or in Python,
`cost_model.choose(p, S, CostParams(...))` — and see where `auto` switches. (3) Make one rank pass a
different size under `MINIPAR_COMM_CHECK=1` and read the error.

## In PyTorch / NCCL / DeepSpeed / Megatron this is …

| here | there |
|---|---|
| `mpiexec -n 4 python script.py`, `comm.rank`, `comm.size` | `torchrun --nproc-per-node 4 script.py`; `torch.distributed.init_process_group("nccl")`, `dist.get_rank()`, `dist.get_world_size()` (`RANK`, `WORLD_SIZE`, `LOCAL_RANK` in the environment) |
| `comm.send` / `recv` / `sendrecv`, `isend` / `irecv` | `dist.send` / `dist.recv`, `dist.isend` / `dist.irecv`, `dist.batch_isend_irecv` (how pipeline stages exchange activations) |
| `all_reduce`, `reduce_scatter`, `all_gather`, `broadcast` | `dist.all_reduce(t, op=ReduceOp.SUM)`, `dist.reduce_scatter_tensor`, `dist.all_gather_into_tensor`, `dist.broadcast`; `async_op=True` returns a `Work` with `wait()` — your `all_reduce_async` |
| ring / tree / `auto` by the cost model | NCCL's algorithms: `Ring`, `Tree`, `NVLS`, `CollNet` (forced with `NCCL_ALGO`), chosen by NCCL's own latency-bandwidth tuning model; `NCCL_DEBUG=INFO` prints what it picked. NCCL's `Tree` is not minipar's `tree`: it is a **double binary tree** (two complementary trees, each carrying half the data, so every rank's links are used) and it is **pipelined** — the buffer is cut into chunks that stream up the tree (reduced) and back down (broadcast), so its time is ~$2\log_2 p\cdot\alpha + 2S\beta$ against minipar's unpipelined binomial $2\lceil\log_2 p\rceil(\alpha + S\beta)$. The bandwidth term is the ring's, $2\frac{p-1}{p}S\beta \approx 2S\beta$ (NCCL's tuning model gives its tree all-reduce half the bus bandwidth); what the tree gains is latency, about $2\log_2 p$ message latencies (in NCCL's model, the log of the number of nodes) instead of the ring's $2(p-1)$ |
| `python -m minipar bench comm` (algbw, busbw) | nccl-tests' `all_reduce_perf -b 1K -e 64M -f 4`, which reports the same algbw and busbw |
| hang timeout (`MINIPAR_HANG_TIMEOUT`) | `init_process_group(timeout=...)` with the NCCL watchdog (`TORCH_NCCL_ASYNC_ERROR_HANDLING`), which aborts a collective that waits too long |
| check mode (`MINIPAR_COMM_CHECK=1`) | `TORCH_DISTRIBUTED_DEBUG=DETAIL`, which checks that all ranks call the same collective with the same shapes |
| `Communicator.split` | `dist.new_group(ranks)`; Megatron's `parallel_state` builds its data/tensor/pipeline groups that way, DeepSpeed wraps the same calls as `deepspeed.comm` |
''', r'''%md
## What changes on GPU nodes and at scale

The algorithms are the same; the constants are not. Priced with the repository's **H200 profile**
(`minipar/perf/profiles/h200.json`: data-sheet NVLink and InfiniBand figures times one efficiency
factor each — a model, not a measurement; γ assumed as three HBM passes per reduced byte), the cost
model of §4 picks differently inside a node of 8 GPUs and across 64 nodes:
''', r'''from minipar.comm.cost_model import CostParams, predict as predict_allreduce
from minipar.perf.profile import load_profile

h200 = load_profile("h200")
gamma = 3 / (h200.mem_bw * h200.efficiency["memory"])
algorithms = ("ring", "tree", "recursive_doubling", "rabenseifner")
print(f"{'':>14}{'bytes':>7}" + "".join(f"{a:>20}" for a in algorithms) + "   (ms)")
for where, p in (("intra", 8), ("inter", 64)):
    alpha, bw = h200.link(where)
    c = CostParams(alpha=alpha, beta=1 / bw, gamma=gamma)
    for S in (1 << 16, 1 << 24, 1 << 30):
        times = [predict_allreduce(a, p, S, c) * 1e3 for a in algorithms]
        size = {1 << 16: "64 KiB", 1 << 24: "16 MiB", 1 << 30: "1 GiB"}[S]
        print(f"{where + f', p = {p}':>14}{size:>7}" + "".join(f"{t:20.3f}" for t in times))
''', r'''%md
Small messages across many nodes are latency-bound: the ring's $2(p-1)\alpha$ is 126 α at $p$ = 64, so a
log-depth algorithm wins by an order of magnitude; large ones are bandwidth-bound and the ring (or
Rabenseifner) wins at any $p$. NCCL makes the same choice with its own tuning model, between its ring
and its *pipelined* double binary tree (and, where the switches can add, NVLS/SHARP reductions in the
network); the reduction runs in kernels on the GPU's SMs, at HBM speed, beside the model's own kernels.
Across nodes, hierarchical algorithms (§3, lesson 20) keep most bytes on NVLink.
''']
