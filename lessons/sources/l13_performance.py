"""Lesson 13: the cells of lessons/13_performance.ipynb (``%md`` cells are markdown).

Edit here, then run ``python lessons/make_notebooks.py``."""

NOTEBOOK = "13_performance.ipynb"

CELLS = [r'''%md
# 13 · Where the time goes: FLOPs, MFU, the performance model, planning

Before launching a run on a thousand GPUs, everyone asks the same questions: which layout, how
long per step, will it fit? `minipar.perf` answers them with a model — a few formulas fed by a
*hardware profile* — and `minipar plan` ranks every layout `train` accepts.

**FLOPs per token.** A matmul with a weight of $N_w$ elements costs $2N_w$ FLOPs per token forward
and $4N_w$ backward, so the weights cost $6N$ per token; attention adds $QK^\top$ and $PV$,
$12\,L\,h\,s$ per token in all:

$$\text{FLOPs/token} = 6N + 12\,L\,h\,s \qquad \text{MFU} = \frac{\text{FLOPs/token}\cdot\text{tokens/s}}{\text{ranks}\cdot\text{peak}}$$

Plan: FLOPs per token — **exercise**: from a config; this machine's roofline; one real step
profiled; predicted against measured step times; memory per rank — **exercise**: a layer's
activations with tensor and sequence parallelism; the model against Megatron's published times;
planning a 175B model — **exercise**: the ring all-reduce's α-β time — **exercise**: a layout's step
time, term by term (compute, exposed communication, the bubble), against the model and a measured run;
choosing a layout: global batch, micro-batches, memory; what changes on GPU nodes.
''', r'''
import inspect
import os
import time
import numpy as np
import matplotlib.pyplot as plt
from minipar.config import TrainConfig
from minipar.nn import GPT, GPTConfig
from minipar.perf.estimate import flops_per_token, predict
from minipar.perf.profile import load_profile

%matplotlib inline
cfg = TrainConfig(model="small").model_config()
model = GPT(cfg)
print("parameters", model.num_parameters(), " FLOPs/token", flops_per_token(cfg))
assert flops_per_token(cfg) == model.flops_per_token()   # the model counts its own parameters
''', r'''%md
### Exercise 1 — FLOPs per token from the configuration

Write `my_flops_per_token(n_layer, d_model, vocab_size, seq_len, tie_weights)`. $N$ is the number
of parameters that take part in a matmul or an elementwise op per token — not the embeddings'
*lookups*: picking row $x_t$ of a table costs no FLOPs (and its backward is a scatter-add, not a
GEMM). Count them from minipar's GPT: per block the qkv projection ($h \times 3h$ and a bias), the
output projection ($h\times h$, bias), the MLP ($h \times 4h$, bias; $4h \times h$, bias) and two
LayerNorms (a weight and a bias each); then the head's $V \times h$ matmul — once, whether its weight
is its own or tied to the token embedding's table — and the final LayerNorm. Counting an untied
token embedding as a matmul too (a common slip) adds $6Vh$ per token: for GPT-2 small, $V$ = 50 257,
that overstates its FLOPs, and so its MFU, by about a quarter. The check compares yours with `minipar.perf.estimate.flops_per_token` and with what
each model counts from its own parameters, over several shapes.
''', r'''%exercise my_flops_per_token
def my_flops_per_token(n_layer, d_model, vocab_size, seq_len, tie_weights=False):
    """Training FLOPs per token, 6N + 12·L·h·s, with N counted from the shapes (see above)."""
    raise NotImplementedError("hint: count a block's weights, biases and LayerNorm parameters from the "
                              "list above; of the vocabulary matrices only one takes part in a matmul")
''', r'''
shapes = [dict(n_layer=4, d_model=128, n_head=4, seq_len=128), dict(n_layer=2, d_model=64, n_head=2, seq_len=32),
          dict(n_layer=3, d_model=48, n_head=3, seq_len=16, tie_weights=True),
          dict(n_layer=96, d_model=12288, n_head=96, seq_len=2048, vocab_size=51200)]
for shape in shapes:
    c = GPTConfig(**shape)
    mine = my_flops_per_token(c.n_layer, c.d_model, c.vocab_size, c.seq_len, c.tie_weights)
    assert mine == flops_per_token(c), f"{shape}: yours {mine}, minipar.perf {flops_per_token(c)}"
    if c.n_layer < 10:                                   # small enough to build
        assert mine == GPT(c).flops_per_token(), shape
print(f"yours matches minipar.perf; GPT-3 175B: {my_flops_per_token(96, 12288, 51200, 2048) / 1e9:.0f} GFLOPs per token")
''', r'''%md
## This machine's roofline, measured

A kernel that does $F$ FLOPs while moving $Q$ bytes to and from memory has **arithmetic intensity**
$I = F/Q$. It cannot run faster than the machine computes (the flat **compute roof**, $P$ FLOP/s), nor
faster than memory feeds it (the slanted **memory roof**, $I\cdot B$ for a bandwidth of $B$ bytes/s):

$$\text{attainable FLOP/s} = \min(P,\; I \cdot B), \qquad \text{ridge point } I^* = P / B.$$

A GEMM of $m\times k$ by $k\times n$ does $2mnk$ FLOPs on $e(mk+kn+mn)$ bytes ($e$ bytes per number):
square ones have $I \approx 2n/(3e)$, far right of the ridge; a matrix-*vector* product ($m = 1$) has
$I < 1/2$ in fp32 and sits on the memory roof. Elementwise ops are worse: `x + y` does 1 FLOP per 12
bytes. Below, both roofs of this machine are measured — $P$ from a large GEMM, $B$ from a large `add` —
and each kernel is placed by its intensity.
''', r'''
def best_time(fn, reps=7):
    """The fastest of a few calls: a roof is the best the machine does (others share its cores)."""
    fn()
    times = []
    for _ in range(reps):
        t0 = time.perf_counter()
        fn()
        times.append(time.perf_counter() - t0)
    return min(times)


def intensity_of_gemm(m, n, k, e=4):
    return 2 * m * n * k / (e * (m * k + k * n + m * n))


kernels = []                                          # (name, intensity FLOP/byte, FLOP/s)
for m, n, k in [(1, 4096, 4096), (4, 4096, 4096), (16, 4096, 4096),     # 64 MiB of weights: from DRAM
                (64, 1024, 1024), (256, 1024, 1024), (1024, 1024, 1024), (128, 3 * 128, 128), (2048, 512, 512)]:
    a, w = np.ones((m, k), np.float32), np.ones((k, n), np.float32)
    kernels.append((f"GEMM {m}x{k}·{k}x{n}", intensity_of_gemm(m, n, k), 2 * m * n * k / best_time(lambda: a @ w)))
x, y, out = (np.ones(1 << 23, np.float32) for _ in range(3))  # 32 MiB each: beyond the caches
t_add = best_time(lambda: np.add(x, y, out=out))
# the memory roof: the best streaming rate of three kernels (a read-only sum usually wins:
# a write first reads its cache line, so x + y really moves 16 bytes per element, not 12)
bandwidth = max(4 * x.size / best_time(lambda: x.sum(), 15), 8 * x.size / best_time(lambda: np.copyto(out, x), 15),
                12 * x.size / t_add)
kernels.append(("x + y", 1 / 12, x.size / t_add))
peak = max(f for name, _, f in kernels if name.startswith("GEMM"))
ridge = peak / bandwidth
I = np.logspace(-2, 3, 200)
plt.figure(figsize=(7, 4))
plt.loglog(I, np.minimum(peak, I * bandwidth) / 1e9, "k-", label=f"roofs: {peak / 1e9:.0f} GFLOP/s, {bandwidth / 1e9:.1f} GB/s")
for name, i, f in kernels:
    plt.loglog(i, f / 1e9, "o", label=name)
plt.axvline(ridge, color="grey", ls=":")
plt.xlabel("arithmetic intensity (FLOP/byte)"); plt.ylabel("GFLOP/s"); plt.legend(fontsize=7)
plt.title(f"this machine's roofline (fp32, one process); ridge at {ridge:.1f} FLOP/byte"); plt.show()
for name, i, f in kernels:
    bound = "memory" if i < ridge else "compute"
    print(f"{name:<24} I = {i:7.2f}  {f / 1e9:7.2f} GFLOP/s = {f / min(peak, i * bandwidth):4.0%} of its {bound} roof")
assert abs(intensity_of_gemm(1024, 1024, 1024) - 2 * 1024 / 12) < 1e-9    # square: 2n/(3e)

from minipar.perf.calibrate import calibrate          # the profile the performance model uses below
prof = calibrate(TrainConfig(model="tiny").model_config(), micro_rows=(1, 4), dtypes=("fp32",))
print(f"calibrated for the model: per-op overhead {prof.op_overhead_s * 1e6:.1f} µs, "
      f"elementwise {prof.mem_bw / 1e9:.2f} GB/s, best GEMM {prof.peak_flops['fp32'] / 1e9:.1f} GFLOP/s")
''', r'''%md
Read the plot from left to right. Elementwise ops sit under the memory roof at a tiny fraction of
the peak, so what they cost is their bytes: an op written as several NumPy passes (GELU's tanh
formula is about eight) moves its array through memory once per pass, which is why LayerNorm, GELU
and the softmax are one compiled pass each in minipar (and one kernel each in fused GPU code). Thin GEMMs (a few rows: a small micro-batch, or decoding one token) are memory bound
too; only GEMMs with enough rows reach the compute roof, and how close they get is the GEMM's own
efficiency (blocking, threads, per-call cost). (On a machine shared with other work a point can land
above its roof: the roofs are the best of a few calls, each kernel's rate too, measured moments apart.) A GPU's ridge is far further right — an H100 computes
~990 dense bf16 TFLOP/s on ~3.35 TB/s of HBM, a ridge near 300 FLOP/byte (spec-sheet figures) — so
more of a model's ops are memory bound there than here.
''', r'''%md
## One real step, profiled

Where does a step's time go? `python -m minipar profile` sets a run up exactly as `train` does, then
profiles a few steps: every autograd op is timed (exclusive of the ops nested inside it) and counted
in FLOPs and bytes, and so placed against the two roofs; the step is cut into **forward**, **backward**,
the **optimizer** (clipping, AdamW, zeroing), the **communication** the step waited for, and the
**Python overhead** — a phase's time minus the time inside its ops: building the graph, wrapping
arrays, the backward walk, the hooks. Here the tiny model, one process, batch 4:
''', r'''
import json
import subprocess
import sys
import tempfile

profile_json = os.path.join(tempfile.mkdtemp(), "profile.json")
env = dict(os.environ, PYTHONPATH=os.path.abspath("..") + os.pathsep + os.environ.get("PYTHONPATH", ""))
proc = subprocess.run([sys.executable, "-m", "minipar", "profile", "--model", "tiny", "--batch-size", "4",
                       "--steps", "2", "--top", "8", "--json", profile_json],
                      capture_output=True, text=True, timeout=600, env=env, cwd="..")
assert proc.returncode == 0, proc.stderr[-3000:]
print(proc.stdout)
rep = json.load(open(profile_json))
fig, (a, b) = plt.subplots(1, 2, figsize=(12, 3.4), gridspec_kw=dict(width_ratios=[1, 2]))
left = 0.0
for i, (phase, row) in enumerate(rep["phases"].items()):
    for part, value, hatch in (("ops", row["ops_s"], ""), ("Python", row["overhead_s"], "//")):
        if value > 0:
            a.barh(0, value * 1e3, left=left, hatch=hatch, color=f"C{i}", label=f"{phase} ({part})")
            left += value * 1e3
a.set_yticks([]); a.set_xlabel("ms per step"); a.set_title("the step by phase")
a.legend(fontsize=7, loc="upper center", bbox_to_anchor=(0.5, -0.3), ncol=2)
top = rep["ops"][:8]
names = [f"{o['op']} ({o['kind']})" for o in top]
b.barh(names, [o["s"] * 1e3 for o in top], label="measured")
b.barh(names, [o["roofline_s"] * 1e3 for o in top], label="roofline: the least time for its FLOPs and bytes")
b.invert_yaxis(); b.set_xlabel("ms per step"); b.legend(fontsize=7); plt.tight_layout(); plt.show()
''', r'''%md
Read it with the roofline in mind. Each op's bar against its roofline bar is how far it is from what
this machine could do for those FLOPs and bytes; on a busy 2-core machine the gap is wide, and it says
where the time *could* go, not where it will. Three things to look for in any profile, here and on a
GPU: which ops dominate (the GEMMs — `Linear`, `MatMul` — once the model is large enough; at this tiny
size the elementwise ops and the softmax weigh as much), how large the Python overhead is beside the
ops (it grows with the number of ops, not their size: on a GPU with small layers it is most of the
step — the H200 measurement of docs/benchmarks.md found minipar's Python costing 2× PyTorch's at 4 layers of
$d$ = 256), and whether communication shows up at all (with one process it cannot; with `--dp 2` it is
lesson 05's exposed all-reduce).

## Predicted against measured

`estimate.predict(config, profile)` adds up one layer's roofline (×layers, forward, backward,
recomputation), the tensor-parallel collectives, the pipeline's makespan from the schedule
simulator (lesson 08), the exposed data-parallel communication and the optimizer. Here: one
process, a few layouts, measured for a few steps (the median of the steps after the first). The
model state it predicts is exact: the prediction's bytes of parameters, gradients and optimizer state
must equal what the built optimizer holds (`Optimizer.memory_bytes()`).
''', r'''
from minipar.train import setup
from minipar.perf.memory import model_state_bytes
rows, measured_configs = [], []
for kw in (dict(), dict(recompute="full"), dict(recompute="selective"), dict(batch_size=8)):
    c = TrainConfig(model="tiny", steps=4, quiet=True, eval_batches=0, **{"batch_size": 4, **kw})
    run = setup(c); run.warmup = 1
    ts = []
    for s in range(4):
        t0 = time.perf_counter(); run.step(s); ts.append(time.perf_counter() - t0)
    resolved = run.config                  # the config the run resolved and ran with
    assert model_state_bytes(resolved.model_config(), resolved) == run.optimizer.memory_bytes(), kw
    rows.append((str(kw or "baseline"), np.median(ts[1:]), predict(resolved, prof).step_s))
    measured_configs.append(resolved)
names, meas, pred = zip(*rows)
x = np.arange(len(rows))
plt.bar(x - 0.2, np.array(meas) * 1e3, 0.4, label="measured")
plt.bar(x + 0.2, np.array(pred) * 1e3, 0.4, label="predicted")
plt.xticks(x, names, rotation=20); plt.ylabel("ms per step"); plt.legend()
plt.title("one process, tiny model"); plt.show()
for n, m, p in rows:
    print(f"{n:<28} measured {m * 1e3:7.1f} ms  predicted {p * 1e3:7.1f} ms  (predicted / measured {p / m:.2f})")
print("model-state bytes: predicted = held by the optimizer, in all four")
''', r'''%md
The ratios say how far off the predicted step times are in this run. The profile was calibrated
a few seconds before the steps were timed; on a shared machine other processes' load moves both,
so a ratio far from 1 here is as likely the machine changing between the two as the model missing a
cost. `benchmarks/plan_accuracy.py` separates them: it trains 17 layouts on 1–2 ranks, each
three times in separate jobs, calibrates before every job, and predicts with the median of the
calibrations — so the calibration sees the same slow and fast spells of the machine as the steps.

## Memory per rank: ZeRO stages and recomputation

Model state (`perf/memory.py`) is exact — as just checked. Activations follow Korthikanti et al.
2022: per layer $sbh(34 + 5as/h)$ bytes on one rank without parallelism (exercise 2 cuts them with
tensor and sequence parallelism), $2sbh$ with full recomputation. Here: a 175B model's rank with $t=8$, $p=8$ and 64-way data parallelism.
''', r'''
from minipar.perf.models import with_vocab
from minipar.perf import activations as act
big = with_vocab(TrainConfig(model="gpt2", n_layer=96, d_model=12288, n_head=96, seq_len=2048,
                             precision="bf16", batch_size=512, tp=8, pp=8, microbatches=8), 51200)
labels, parts = [], []
for zero in (0, 1, 2, 3):
    if zero == 3:
        continue                                   # ZeRO-3 with pp is refused by train
    c = big.__class__(**{**big.to_dict(), "zero": zero}).resolve(4096)
    m = model_state_bytes(c.model_config(), c)
    labels.append(f"ZeRO-{zero}"); parts.append([m["params"], m["grads"], m["optimizer"]])
for rc in ("none", "selective", "full"):
    layer = act.korthikanti_layer_bytes(2048, 1, 12288, 96, 8, True, rc)
    labels.append(f"act {rc}"); parts.append([0, 0, 0, layer * 12 * 8])
parts = [p + [0] * (4 - len(p)) for p in parts]
bottom = np.zeros(len(parts))
for i, name in enumerate(("params", "grads", "optimizer", "activations (8 in flight)")):
    vals = np.array([p[i] for p in parts]) / 2 ** 30
    plt.bar(labels, vals, bottom=bottom, label=name); bottom += vals
plt.ylabel("GiB per rank"); plt.legend(); plt.xticks(rotation=20)
plt.title("175B, t = 8, p = 8, d = 64: one rank"); plt.show()
states = [sum(p[:3]) for p in parts[:3]]
assert states[0] > states[1] > states[2]           # each ZeRO stage shards one more part
''', r'''%md
### Exercise 2 — a layer's activations with tensor and sequence parallelism

Write `layer_bytes(s, b, h, a, t, sp)`: the bytes one layer keeps for backward on one rank (16-bit
values, 1-byte dropout masks, no recomputation; Korthikanti et al.), with tensor parallelism of degree
$t$ and, if `sp`, sequence parallelism over the same $t$ ranks. What one layer keeps, for $s$ tokens
of $b$ sequences, hidden size $h$, $a$ heads:

| where | tensor kept | bytes |
|---|---|---|
| attention | input of the QKV projection (LayerNorm's output) | $2sbh$ |
| | $Q$ and $K$, for $QK^\top$ | $4sbh$ |
| | softmax output; its dropout mask; the dropout's output, for $PV$ | $2as^2b + as^2b + 2as^2b$ |
| | $V$, for $PV$ | $2sbh$ |
| | input of the output projection | $2sbh$ |
| | dropout mask after the projection | $sbh$ |
| MLP | input of the first linear (LayerNorm's output) | $2sbh$ |
| | GELU's input and output | $8sbh + 8sbh$ |
| | dropout mask after the second linear | $sbh$ |
| LayerNorms | the inputs of both | $4sbh$ |

Tensor parallelism (lesson 07) cuts what lies *between* a column-parallel linear and the row-parallel
one after it — the heads, the MLP's $4h$ columns — over the $t$ ranks; what lies outside those regions
(the LayerNorms, the inputs of the first linears, the dropouts after the second) stays whole on every
rank. Sequence parallelism cuts exactly those along the sequence. The check compares yours with
`minipar.perf.activations.korthikanti_layer_bytes` (Table 2 of the paper), with and without `sp`.
''', r'''%exercise layer_bytes
def layer_bytes(s, b, h, a, t, sp):
    """Activation bytes one rank keeps of one layer, tensor parallelism of degree t (and, if sp,
    sequence parallelism over the same t ranks), 16-bit."""
    raise NotImplementedError("hint: sort the table's rows into the two kinds the paragraph below it "
                              "names, and sum each kind")
''', r'''
for s, b, h, a, t in [(2048, 1, 12288, 96, 8), (1024, 4, 4096, 32, 4), (128, 8, 768, 12, 1), (4096, 1, 8192, 64, 2)]:
    for sp in (False, True):
        mine, theirs = layer_bytes(s, b, h, a, t, sp), act.korthikanti_layer_bytes(s, b, h, a, t, sp=sp)
        assert np.isclose(mine, theirs, rtol=1e-12), \
            f"s={s} b={b} h={h} a={a} t={t} sp={sp}: yours {mine:.6g} bytes, korthikanti_layer_bytes {theirs:.6g}"
print("yours matches korthikanti_layer_bytes, with and without sp; the library's, every row of Korthikanti's Table 2:")
print(inspect.getsource(act.korthikanti_layer_bytes))
''', r'''%md
## The model against published times

A performance model earns trust by predicting runs it was not fitted to. Korthikanti et al. 2022
(Table 5) published Megatron's step times for 22B–1T GPT models on A100s, with full recomputation and
with sequence parallelism + selective recomputation, in their layouts. The A100 profile's efficiency
factors were fixed once (`minipar/perf/profiles/a100.json` says which and why); nothing below is fitted
per run (`benchmarks/plan_published.py` prints the same table):
''', r'''
from minipar.perf.models import KORTHIKANTI, korthikanti_config
a100 = load_profile("a100")
errors = []
print(f"{'model':<6}{'recompute':<11}{'GPUs':>5}{'paper s':>9}{'model s':>9}{'error':>8}{'bubble':>8}")
for name, row in KORTHIKANTI.items():
    for recompute, published in (("full", row[8]), ("selective", row[9])):
        config, world = korthikanti_config(name, recompute)
        p = predict(config, a100)
        errors.append((p.step_s - published) / published)
        print(f"{name:<6}{recompute:<11}{world:>5}{published:9.2f}{p.step_s:9.2f}{errors[-1]:+8.1%}{p.bubble:8.1%}")
print(f"mean |error| {np.mean(np.abs(errors)):.1%}, max {np.max(np.abs(errors)):.1%} "
      "(Calculon, an analytical model, reports 3.65 % mean on the same runs)")
''', r'''%md
## Planning a 175B model on 1024 GPUs

`plan` enumerates dp·tp·pp, chunks, schedule, micro-batches, ZeRO stage, sequence parallelism and
recomputation, checks each with `TrainConfig.resolve` (so it refuses what `train` refuses), drops
what does not fit in 80 GB and ranks the rest (here with the A100 profile's spec-sheet numbers).
''', r'''
from minipar.perf.plan import plan, format_plan
base = with_vocab(TrainConfig(model="gpt2", n_layer=96, d_model=12288, n_head=96, seq_len=2048,
                              precision="bf16", batch_size=1024), 51200)
print(format_plan(plan(base, 1024, "a100", nodes=128), 1024, top=5))
''', r'''%md
### Exercise 3 — the ring all-reduce, in α and β

The plan prices every collective with the α-β model of lesson 04: a message of $S$ bytes over a
link costs $\alpha + S\beta$, with $\beta = 1/B$ the seconds per byte of a link of bandwidth $B$
(lesson 04's notation; profiles store $B$ as `bw`). Write `ring_all_reduce_s(p, S, alpha, bw)`: the time of a ring all-reduce
of `S` bytes over `p` ranks — a reduce-scatter followed by an all-gather, each $p-1$ steps, each step
sending one $S/p$ chunk to the neighbour. The check compares yours with
`minipar.perf.comm.collective_seconds` on a profile whose link has that α and bandwidth.
''', r'''%exercise ring_all_reduce_s
def ring_all_reduce_s(p, S, alpha, bw):
    """Seconds of a ring all-reduce of S bytes over p ranks (latency alpha, bandwidth bw bytes/s)."""
    raise NotImplementedError("hint: count the steps of the two phases, and what one step costs: "
                              "each is a message of the α-β model")
''', r'''
from minipar.perf import comm as pcomm
from minipar.perf.profile import Profile
link = Profile("x", links={"intra": {"alpha": 5e-6, "bw": 2e11}})
for p, S in [(8, 2 ** 28), (2, 2 ** 10), (3, 10 ** 6), (64, 2 ** 30)]:
    mine, theirs = ring_all_reduce_s(p, S, 5e-6, 2e11), pcomm.collective_seconds(link, "all_reduce", p, S)
    assert np.isclose(mine, theirs), f"p={p}, S={S}: yours {mine}, library {theirs}"
print("yours matches collective_seconds; the library's:")
print(inspect.getsource(pcomm.collective_seconds))
''', r'''%md
### Exercise 4 — a layout's step time, term by term

`predict` is long because it prices everything; its skeleton is short, and it answers "how long per
step?" for any layout. Write `my_step_time(config, prof)` for a resolved config on dp × tp × pp
ranks, returning its terms in a dict:

- **Compute, from FLOPs**, at the profile's GEMM rate `prof.peak(dtype) · prof.efficiency["gemm"]`.
  One micro-batch holds $b = B/(\text{dp}\cdot m)$ sequences ($m$: `microbatches` with a pipeline,
  `grad_accum` without). One layer's forward on one tp rank is the weights' GEMMs, $24\,bsh^2/t$ FLOPs,
  and the attention core (scores and $PV$), $4\,bs^2h/t$. Backward is two passes of the same size:
  **B**, the input gradients — the weights' GEMMs once more and the core twice (it has no weights:
  both its gradients are input gradients) — and **W**, the weights' gradients, the weights' GEMMs once
  more (lesson 08's zero-bubble schedules move W around). Recomputation (lesson 10) adds forward work to
  B: the core for `selective`, the whole layer for `full` — its tp collectives included. The last stage,
  whose pace the pipeline follows, also runs the head: $2\,bsh\lceil V/t\rceil$ FLOPs forward, twice
  that in B.
- **Tensor parallelism**: per layer 2 all-reduces of the micro-batch's activations ($bsh\cdot e$
  bytes, $e$ per number) in forward and 2 in backward (with sequence parallelism an all-gather and a
  reduce-scatter each: the same time). They sit between the layer's GEMMs: all exposed.
- **The pipeline**: the stage's times per micro-batch $t_f, t_b, t_w$, and $t_\text{comm}$, one
  activation ($bsh\cdot e$, divided by $t$ with sequence parallelism) sent to the next stage. 1F1B takes
  $(m + p - 1)(t_f + t_b + t_w) + 2(p-1)\,t_\text{comm}$: in the steady state a send hides behind the
  next micro-batch, only the fill and the drain wait for them. The bubble is
  $1 - m(t_f + t_b + t_w)/\text{pipeline}$, lesson 08's $(p-1)/(m+p-1)$ when sends are free.
- **Data parallelism**: the rank's gradients, all-reduced over dp ranks bucket by bucket —
  `gradient_buckets(config)` gives their bytes in the order backward completes them. With
  `config.overlap`, bucket $i$ of $n$ is ready at $(i+1)/n$ of the last micro-batch's backward
  $t_b + t_w$, and starts once it is ready and the bucket before it is done; without, every bucket
  waits for the backward's end. Exposed is what runs past the backward's end.
- **The step**: the pipeline plus the exposed data-parallel time.

Every collective is `pcomm.collective_seconds(prof, kind, p, nbytes, where)` (exercise 3's ring;
`"p2p"` a send between two ranks), with `where = pcomm.placement(p, stride, prof.ranks_per_node)`:
ranks are numbered tp fastest, then dp, then pp, so a tp group's ranks are 1 apart, a dp group's $t$,
neighbouring stages $\text{dp}\cdot t$ — inside a node or across nodes.

The check runs five layouts, 1.3B to 175B parameters, on an *A100 that only computes* — the a100
profile's peak, GEMM efficiency and links, with memory-bound work free — and compares each term with
`predict`'s breakdown: $t_w$ and $t_\text{comm}$ to $10^{-9}$; $t_f$, $t_b$ and the exposed
data-parallel time to 2 % (yours leaves out the few small tp collectives of the embeddings, the head
and the loss); the pipeline and the step to 3 %, the bubble to 0.03 (`predict` times the schedule
with lesson 08's simulator, in which a send also delays the steady state, or — past 200 actions — with
the closed form on stage-time ratios rounded to two digits).
''', r'''
import math
from minipar.parallel.buckets import bucket_bytes
from minipar.perf import memory as pmem
from minipar.perf.profile import DTYPE_BYTES


def gradient_buckets(config):
    """Bytes of each gradient bucket the last stage's rank all-reduces over data parallelism, in the
    order backward completes them (``perf.memory.rank_buckets``, as ``predict`` counts them)."""
    item = 2 if config.precision in ("fp16", "bf16") else DTYPE_BYTES[config.precision]
    return [n * item for n, _ in pmem.rank_buckets(
        config.model_config(), bucket_bytes(config), config.precision, config.dp,
        tp=config.tp, pp=config.pp, chunks=config.chunks, pp_rank=config.pp - 1)]


compute_only = Profile("a100, compute only", kind="spec", peak_flops=dict(a100.peak_flops),
                       efficiency={k: a100.efficiency[k] for k in ("gemm", "intra", "inter")},
                       mem_bw=math.inf, links=a100.links, ranks_per_node=a100.ranks_per_node)
''', r'''%exercise my_step_time
def my_step_time(config, prof):
    """The step of resolved ``config`` on profile ``prof``, term by term (see above): a dict of
    t_f, t_b, t_w, t_comm (one micro-batch on the last stage, seconds), pipeline_s, bubble,
    dp_exposed_s and step_s."""
    raise NotImplementedError("hint: build it in the order of the list above — a layer, the stage, the "
                              "pipeline, the buckets — and let the check name the first term that differs")
''', r'''
def gpt(n_layer, d_model, n_head, **kw):
    return with_vocab(TrainConfig(model="gpt2", n_layer=n_layer, d_model=d_model, n_head=n_head,
                                  seq_len=2048, precision="bf16", **kw), 51200)

layouts = {
    "dp 8, 2 accumulated": gpt(24, 2048, 16, batch_size=64, grad_accum=2, bucket_mb=100).resolve(8),
    "dp 4 × tp 8, no overlap": gpt(24, 4096, 32, batch_size=16, tp=8, overlap=False, bucket_mb=200).resolve(32),
    "dp 4 × pp 2, selective": gpt(24, 2048, 16, batch_size=64, pp=2, microbatches=8, recompute="selective",
                                  bucket_mb=25).resolve(8),
    "dp 4 × tp 4 (sp) × pp 4, full": gpt(48, 8192, 64, batch_size=128, tp=4, pp=4, microbatches=16,
                                         sequence_parallel=True, recompute="full", bucket_mb=100).resolve(64),
    "175B: dp 2 × tp 8 × pp 8": gpt(96, 12288, 96, batch_size=64, tp=8, pp=8, microbatches=32,
                                    bucket_mb=100).resolve(128),
}
TOLERANCE = dict(t_w=1e-9, t_comm=1e-9, t_f=0.02, t_b=0.02, dp_exposed_s=0.02, pipeline_s=0.03, step_s=0.03)
print(f"{'layout (yours, seconds)':<31}{'t_f':>7}{'t_b':>7}{'t_w':>7}{'bubble':>8}{'dp exp.':>8}{'step':>8}"
      f"{'predict':>8}{'full a100':>10}")
for name, config in layouts.items():
    mine, model = my_step_time(config, compute_only), predict(config, compute_only, memory=False)
    theirs = dict(model.breakdown, step_s=model.step_s)
    for term, tolerance in TOLERANCE.items():
        error = abs(mine[term] - theirs[term]) / theirs[term] if theirs[term] else abs(mine[term])
        allowed = f"{tolerance:.0%}" if tolerance >= 0.01 else f"{tolerance:.0e}"
        assert error <= tolerance, (f"{name}: {term} is {mine[term]:.6g} s, predict's {theirs[term]:.6g} s "
                                    f"(off by {error:.2%}, allowed {allowed})")
    assert abs(mine["bubble"] - model.bubble) <= 0.03, \
        f"{name}: bubble {mine['bubble']:.3f}, predict's {model.bubble:.3f} (allowed ±0.03)"
    print(f"{name:<31}{mine['t_f']:7.3f}{mine['t_b']:7.3f}{mine['t_w']:7.3f}{mine['bubble']:8.1%}"
          f"{mine['dp_exposed_s']:8.3f}{mine['step_s']:8.2f}{model.step_s:8.2f}"
          f"{predict(config, a100, memory=False).step_s:10.2f}")
print("your step model is predict's, term by term, on five layouts")
''', r'''%md
The last column prices the same layouts on the full a100 profile: memory-bound work (LayerNorms,
GELU, the softmax, the residuals), small GEMMs' lower efficiency and the per-kernel overhead are what
yours leaves out: from an eighth to a half more here — why a FLOPs-only estimate of a step
is a floor.

Now yours beside the one-process runs measured above, on the profile calibrated on this machine
(printed, not checked: the measured times move with the machine's load):
''', r'''
print(f"{'run':<28}{'measured ms':>12}{'predict ms':>11}{'yours ms':>9}")
for (name, measured, predicted), config in zip(rows, measured_configs):
    print(f"{name:<28}{measured * 1e3:12.1f}{predicted * 1e3:11.1f}{my_step_time(config, prof)['step_s'] * 1e3:9.1f}")
''', r'''%md
On this CPU yours is far below both: at the tiny model's size a step is mostly what FLOPs do not
count — each autograd op's Python and the elementwise passes (the profile's per-op overhead and
elementwise curves, which `predict` adds). On a GPU at scale, FLOPs and the exposed communication are
most of the step, and a model of this size is what planners such as Calculon start from.
''',
 r'''%md
## Choosing a layout

`plan` ranks layouts by predicted step time; three questions decide what it may choose from, in this
order.

**1. The global batch, against the critical batch size.** McCandlish et al. (2018, *An Empirical Model of
Large-Batch Training*) found that the optimizer steps $S$ and training examples $E$ needed to reach a given
loss trade off as $(S/S_\min - 1)(E/E_\min - 1) = 1$, with the **critical batch size**
$B_\text{crit} = E_\min/S_\min$. Well below it, doubling the batch halves the steps — data parallelism
scales perfectly; well above, it buys almost no steps and wastes examples. $B_\text{crit}$ grows as the
loss falls, which is why GPT-3 ramped its batch from 32K to 3.2M tokens and Llama 3 405B went from 4M
to 16M tokens during training. The global batch caps data parallelism: $\text{dp} \le B/b$ for
micro-batches of $b$ sequences.
''', r'''
ratio = np.logspace(-2, 2, 100)                         # B / B_crit
plt.figure(figsize=(6, 3.2))
plt.loglog(ratio, 1 + 1 / ratio, label="steps / fewest steps")
plt.loglog(ratio, 1 + ratio, label="examples / fewest examples")
plt.axvline(1, color="grey", ls=":"); plt.xlabel("global batch / critical batch")
plt.title("McCandlish et al.: (S/S_min - 1)(E/E_min - 1) = 1"); plt.legend(); plt.show()
''', r'''%md
**2. Micro-batches, against the bubble.** With the global batch $B$ fixed, $B = \text{dp}\cdot m\cdot b$:
more data parallelism leaves each pipeline fewer micro-batches and a larger bubble
$\frac{p-1}{m+p-1}$ (lesson 08), and larger micro-batches (fatter GEMMs) do the same. The model, for
the 175B GPT with Megatron's $B$ = 1536, $t$ = 8, $p$ = 8, on the A100 profile (a model, not a
measurement; its times are within 15 % of the published ones above):
''', r'''
def gpt175(**kw):
    return with_vocab(TrainConfig(model="gpt2", n_layer=96, d_model=12288, n_head=96, seq_len=2048,
                                  precision="bf16", batch_size=1536, tp=8, pp=8, sequence_parallel=True,
                                  **{"recompute": "selective", **kw}), 51200)

print(f"{'b':>2}{'dp':>4}{'GPUs':>6}{'m':>5}{'step s':>8}{'bubble':>8}{'MFU':>7}")
for b in (1, 2):
    for dp in (2, 4, 8, 16):
        m = 1536 // (dp * b)
        p = predict(gpt175(microbatches=m).resolve(dp * 64), a100)
        print(f"{b:>2}{dp:>4}{dp * 64:>6}{m:>5}{p.step_s:8.2f}{p.bubble:8.1%}{p.mfu:7.1%}")
''', r'''%md
Each doubling of dp halves the step but the bubble grows, and MFU — the share of the GPUs' peak that
does model work — falls: the last GPUs bought are the least used. Micro-batches of 2 sequences make
fatter GEMMs, which pays a little while $m$ is large and costs once it is small: they halve $m$.
(Interleaved and zero-bubble schedules, lesson 08, push the bubble back down.)

**3. Memory per rank, against ZeRO and recomputation.** Once the layout is set, what remains is to fit:
choose the cheapest way to bring the largest rank under the GPU's memory. The same 175B on 1024 A100s
of 80 GB:
''', r'''
print(f"{'ZeRO':>4} {'recompute':<10}{'GiB/rank':>9}{'state':>7}{'activ.':>7}{'step s':>8}  fits 80 GB")
for zero in (0, 1):
    for recompute in ("none", "selective", "full"):
        p = predict(gpt175(microbatches=96, zero=zero, recompute=recompute).resolve(1024), a100)
        state = sum(p.model_state_bytes.values())
        print(f"{zero:>4} {recompute:<10}{p.mem_bytes / 2**30:9.1f}{state / 2**30:7.1f}"
              f"{p.activation_bytes / 2**30:7.1f}{p.step_s:8.2f}  {'yes' if p.mem_bytes < 80e9 else 'no'}")
''', r'''%md
Selective recomputation (only attention's scores) makes it fit at almost no cost; full recomputation
also fits but costs a third more time; ZeRO-1 shards the optimizer state over dp and frees the most.
Megatron's own choice for this model was sequence parallelism + selective recomputation — the row the
model finds cheapest.

## In PyTorch / DeepSpeed / Megatron this is …

- **MFU / HFU** (PaLM, Megatron): model FLOPs utilisation counts $6N+12Lhs$ per token; hardware
  FLOPs utilisation also counts recomputation.
- **DeepSpeed autotuner**, `deepspeed --autotuning`: tries ZeRO stages and micro-batch sizes; its
  memory estimator is `estimate_zero3_model_states_mem_needs_all_live`.
- **Megatron-LM** `--recompute-granularity selective|full`, `--sequence-parallel`,
  `--num-layers-per-virtual-pipeline-stage` — the layouts `plan` ranks.
- **Calculon**, **Galvatron**, **Alpa**: analytical and search-based planners for the same question.
- PyTorch: `torch.cuda.max_memory_allocated` (what `backend.memory.peak` stands in for),
  `torch.profiler` for the measured side, `torch.utils.flop_counter.FlopCounterMode` to count a
  model's FLOPs by running it.
''', r'''%md
## What changes on GPU nodes and at scale

The same 175B layout priced with the A100, H100 and H200 profiles in the repository (data-sheet
peaks × one efficiency factor each: a model, not measurements):
''', r'''
config = gpt175(microbatches=96).resolve(1024)
for name in ("a100", "h100", "h200"):
    gpu = load_profile(name)
    p = predict(config, gpu)
    print(f"{name}: step {p.step_s:6.2f} s, MFU {p.mfu:.1%}, exposed communication {p.exposed_comm_s:5.2f} s "
          f"({p.comm_share:.0%} of the step), "
          f"{p.mem_bytes / 2**30:.0f} of {gpu.mem_per_rank_bytes / 1e9:.0f} GB per GPU")
''', r'''%md
Faster GPUs shorten the compute, not the wires, so the share of the step spent communicating grows from
one generation to the next — the reason newer systems raise NVLink domains past one node (NVL72) and
overlap more. The one measurement of this repository on a GPU (docs/benchmarks.md, "GPU") is a single
H200: a GPT-2-small-shaped step of minipar on CuPy took 150 ms against PyTorch eager's 152 ms; at small
layers minipar's Python, not the GPU, set the pace — the profile's "Python overhead" row, on a GPU.
''']
