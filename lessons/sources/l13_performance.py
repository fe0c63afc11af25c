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

Plan: FLOPs per token — **exercise**: from a config; this machine's roofline; predicted against
measured step times; memory per rank — **exercise**: a layer's activations with tensor and
sequence parallelism; planning a 175B model — **exercise**: the ring all-reduce's α-β time.
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
    resolved = c.resolve(1)
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
''']
