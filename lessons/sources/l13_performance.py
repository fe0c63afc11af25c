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
''', r'''
import os
import time
import numpy as np
import matplotlib.pyplot as plt
from minipar.config import TrainConfig
from minipar.nn import GPT
from minipar.perf.estimate import flops_per_token, predict
from minipar.perf.profile import load_profile

cfg = TrainConfig(model="small").model_config()
print("parameters", GPT(cfg).num_parameters(), " FLOPs/token", flops_per_token(cfg))
''', r'''%md
## This machine's roofline, measured

`python -m minipar.perf.calibrate` times GEMMs at the model's own shapes, elementwise work, the
attention core, AdamW and the per-op overhead. A GEMM of $m\times k$ by $k\times n$ does $2mnk$
FLOPs on $e(mk+kn+mn)$ bytes; below the ridge point (FLOPs/byte = peak / bandwidth) it is memory
bound. Here we calibrate a small profile (a few seconds).
''', r'''
from minipar.perf.calibrate import calibrate
prof = calibrate(TrainConfig(model="tiny").model_config(), micro_rows=(1, 4), dtypes=("fp32",))
flops, secs = np.array(prof.gemm_curve["fp32"]).T
plt.loglog(flops, flops / secs / 1e9, "o-", label="GEMM, measured")
plt.xlabel("FLOPs per GEMM"); plt.ylabel("GFLOP/s"); plt.legend(); plt.title("GEMM rate against size")
plt.show()
print(f"per-op overhead {prof.op_overhead_s * 1e6:.1f} µs, elementwise {prof.mem_bw / 1e9:.2f} GB/s")
''', r'''%md
## Predicted against measured

`estimate.predict(config, profile)` adds up one layer's roofline (×layers, forward, backward,
recomputation), the tensor-parallel collectives, the pipeline's makespan from the schedule
simulator (lesson 08), the exposed data-parallel communication and the optimizer. Here: one
process, a few layouts, measured for a few steps.
''', r'''
from minipar.train import setup
rows = []
for kw in (dict(), dict(recompute="full"), dict(recompute="selective"), dict(batch_size=8)):
    c = TrainConfig(model="tiny", steps=4, quiet=True, eval_batches=0, **{"batch_size": 4, **kw})
    run = setup(c); run.warmup = 1
    ts = []
    for s in range(4):
        t0 = time.perf_counter(); run.step(s); ts.append(time.perf_counter() - t0)
    rows.append((str(kw or "baseline"), np.median(ts[1:]), predict(c.resolve(1), prof).step_s))
names, meas, pred = zip(*rows)
x = np.arange(len(rows))
plt.bar(x - 0.2, np.array(meas) * 1e3, 0.4, label="measured")
plt.bar(x + 0.2, np.array(pred) * 1e3, 0.4, label="predicted")
plt.xticks(x, names, rotation=20); plt.ylabel("ms per step"); plt.legend(); plt.show()
for n, m, p in rows:
    print(f"{n:<28} measured {m * 1e3:7.1f} ms  predicted {p * 1e3:7.1f} ms")
''', r'''%md
## Memory per rank: ZeRO stages and recomputation

Model state (`perf/memory.py`) is exact — it reproduces `Optimizer.memory_bytes()` byte for byte.
Activations follow Korthikanti et al. 2022: per layer $sbh(34 + 5as/h)$ bytes, divided by $t$
with tensor + sequence parallelism, $2sbh$ with full recomputation. Here: a 175B model's rank
with $t=8$, $p=8$ and 64-way data parallelism.
''', r'''
from minipar.perf.models import with_vocab
from minipar.perf.memory import model_state_bytes
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
plt.ylabel("GiB per rank"); plt.legend(); plt.xticks(rotation=20); plt.show()
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
## Exercises

**1.** Write the activation memory of one layer with tensor and sequence parallelism (16-bit,
Korthikanti et al.), `layer_bytes(s, b, h, a, t)`. **2.** Write the time of a ring all-reduce of
`S` bytes over `p` ranks with latency `alpha` and bandwidth `bw`. Each is checked against the
library's function; the solutions are in the cell below the exercise (run it to check yours).
''', r'''
def layer_bytes(s, b, h, a, t):
    raise NotImplementedError          # your formula here


def ring_all_reduce_s(p, S, alpha, bw):
    raise NotImplementedError          # your formula here
''', r'''
# Solutions (replace yours, or compare): checked against minipar.perf
def layer_bytes(s, b, h, a, t):
    return s * b * h / t * (34 + 5 * a * s / h)


def ring_all_reduce_s(p, S, alpha, bw):
    return 2 * (p - 1) * alpha + 2 * (p - 1) / p * S / bw


from minipar.perf import comm as pcomm
from minipar.perf.profile import Profile
assert np.isclose(layer_bytes(2048, 1, 12288, 96, 8),
                  act.korthikanti_layer_bytes(2048, 1, 12288, 96, 8, sp=True))
link = Profile("x", links={"intra": {"alpha": 5e-6, "bw": 2e11}})
assert np.isclose(ring_all_reduce_s(8, 2 ** 28, 5e-6, 2e11),
                  pcomm.collective_seconds(link, "all_reduce", 8, 2 ** 28))
print("both match the library")
''', r'''%md
## The names you will meet

- **MFU / HFU** (PaLM, Megatron): model FLOPs utilisation counts $6N+12Lhs$ per token; hardware
  FLOPs utilisation also counts recomputation.
- **DeepSpeed autotuner**, `deepspeed --autotuning`: tries ZeRO stages and micro-batch sizes; its
  memory estimator is `estimate_zero3_model_states_mem_needs_all_live`.
- **Megatron-LM** `--recompute-granularity selective|full`, `--sequence-parallel`,
  `--num-layers-per-virtual-pipeline-stage` — the layouts `plan` ranks.
- **Calculon**, **Galvatron**, **Alpa**: analytical and search-based planners for the same question.
- PyTorch: `torch.cuda.max_memory_allocated` (what `backend.memory.peak` stands in for),
  `torch.profiler` for the measured side.
''']
