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
planning a 175B model — **exercise**: the ring all-reduce's α-β time; choosing a layout: global batch,
micro-batches, memory; what changes on GPU nodes.
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
rows = []
for kw in (dict(), dict(recompute="full"), dict(recompute="selective"), dict(batch_size=8)):
    c = TrainConfig(model="tiny", steps=4, quiet=True, eval_batches=0, **{"batch_size": 4, **kw})
    run = setup(c); run.warmup = 1
    ts = []
    for s in range(4):
        t0 = time.perf_counter(); run.step(s); ts.append(time.perf_counter() - t0)
    resolved = run.config                  # the config the run resolved and ran with
    assert model_state_bytes(resolved.model_config(), resolved) == run.optimizer.memory_bytes(), kw
    rows.append((str(kw or "baseline"), np.median(ts[1:]), predict(resolved, prof).step_s))
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
2022: per layer $sbh(34 + 5as/h)$ bytes, divided by $t$ with tensor + sequence parallelism, $2sbh$
with full recomputation. Here: a 175B model's rank with $t=8$, $p=8$ and 64-way data parallelism.
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

Write `layer_bytes(s, b, h, a, t)`: the bytes one layer keeps for backward (16-bit, no
recomputation; Korthikanti et al.) when tensor parallelism splits its matmuls over $t$ ranks and
sequence parallelism splits the rest (LayerNorms, dropouts, residuals) along the sequence over the
same $t$ ranks. The check compares yours with `minipar.perf.activations.korthikanti_layer_bytes`.
''', r'''%exercise layer_bytes
def layer_bytes(s, b, h, a, t):
    """Activation bytes of one layer with tensor + sequence parallelism of degree t (16-bit)."""
    raise NotImplementedError("hint: with sequence parallelism nothing of the layer stays replicated: "
                              "the whole s·b·h·(34 + 5·a·s/h) is split over the t ranks")
''', r'''
for s, b, h, a, t in [(2048, 1, 12288, 96, 8), (1024, 4, 4096, 32, 4), (128, 8, 768, 12, 1), (4096, 1, 8192, 64, 2)]:
    mine, theirs = layer_bytes(s, b, h, a, t), act.korthikanti_layer_bytes(s, b, h, a, t, sp=True)
    assert np.isclose(mine, theirs), f"s={s} b={b} h={h} a={a} t={t}: yours {mine}, library {theirs}"
print("yours matches korthikanti_layer_bytes(sp=True); the library's, every row of Korthikanti's Table 2:")
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
    raise NotImplementedError("hint: 2(p-1) steps, each paying the latency alpha once and moving "
                              "S/p bytes at bw")
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
