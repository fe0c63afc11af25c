"""Lesson 06: the cells of lessons/06_zero.ipynb (``%md`` cells are markdown).

Edit here, then run ``python lessons/make_notebooks.py``."""
from launch import LAUNCH   # the cell that defines mpirun() for the lesson's runs

NOTEBOOK = "06_zero.ipynb"

CELLS = [r'''%md
# 06 · ZeRO: sharding what data parallelism replicates

Data parallelism (lesson 05) keeps on each of $N$ ranks the same $\Psi$ parameters, their
gradients and the optimizer state. With AdamW in float32 that is, per parameter, 4 bytes of weight,
4 of gradient and 8 of state ($m$ and $v$): **16Ψ bytes on every rank** — a 7.5B model needs 120 GB
before a single activation, and adding ranks does not help.

ZeRO (Rajbhandari et al., 2020) notices that every rank only *needs* all of it at particular
moments, and shards the rest: rank $r$ owns $1/N$ of every flat buffer.

| stage | sharded | bytes per rank, fp32 AdamW | mixed precision (2 + 2 + 12) | sent per rank per step |
|---|---|---|---|---|
| 0 (DDP) | nothing | $4\Psi + 4\Psi + 8\Psi = 16\Psi$ | $16\Psi$ | $2\frac{N-1}{N}\Psi$ (all-reduce) |
| 1 | optimizer state | $4\Psi + 4\Psi + 8\Psi/N = 8\Psi + 8\Psi/N$ | $4\Psi + 12\Psi/N$ | $2\frac{N-1}{N}\Psi$ |
| 2 | + gradients | $4\Psi + (4\Psi + 8\Psi)/N = 4\Psi + 12\Psi/N$ | $2\Psi + 14\Psi/N$ | $2\frac{N-1}{N}\Psi$ |
| 3 | + parameters | $(4\Psi + 4\Psi + 8\Psi)/N = 16\Psi/N$ | $16\Psi/N$ | $3\frac{N-1}{N}\Psi$ |

(the last column in elements; times 4 bytes in float32.) How each stage works in minipar:

* **stage 1** — after backward each bucket's gradient is **reduce-scattered** (rank $r$ receives the
  sum of its shard only); rank $r$ runs AdamW on its shard of the weights with its shard of $m, v$;
  the updated shards are **all-gathered** back into the full weights. A ring reduce-scatter and a ring
  all-gather move $\frac{N-1}{N}\Psi$ elements each — together exactly one all-reduce: stage 1 costs
  no extra **bytes**. It is not free in **time**: DDP starts its all-reduces from the gradient hooks
  and hides them behind backward, while here the reduce-scatter runs after backward and the
  all-gather after the optimizer step, both exposed (stage 2 moves the reduce-scatter back into
  backward; the all-gather stays exposed, or is overlapped with the next forward by prefetching).
* **stage 2** — the reduce-scatter of a bucket starts from the gradient hooks as soon as the bucket
  is complete, and the full gradients are freed: a rank keeps only its shard of the gradients.
* **stage 3** — the weights are sharded too. Each *unit* (embeddings, each block, the head) is
  all-gathered just before its forward, freed after, gathered again for its backward (the next unit
  prefetched), and its gradients reduce-scattered when its backward ends: two all-gathers and one
  reduce-scatter, $3\frac{N-1}{N}\Psi$ — $1.5\times$ the communication of DDP. §5 counts the bytes.

Every buffer is padded to a multiple of $N$ elements so all shards have equal size; Ψ in the
sharded terms is therefore the **padded** Ψ (at most $N-1$ extra elements per bucket).
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

from minipar.parallel.sync import ZeroSync, Zero3Sync

%matplotlib inline
''' + LAUNCH, r'''%md
## 1. Four ranks, each stage

`06_zero.py` builds the same GPT ($d = 30$, so the LayerNorm and bias sizes are not multiples of 4 and
padding shows) under each stage on $N = 4$ ranks: stage 0 is `DDPSync` under the one optimizer step
(`parallel.step.Optimizer`), stages 1–2 `ZeroSync(stage=…)` with 8 KiB buckets, stage 3 `Zero3Sync`
(one bucket per unit). It reads every rank's `memory_bytes()` after one float32 step — the bytes the rank
holds for parameters, gradients and optimizer states — and the communicator's byte counters around the
forward, the backward and the optimizer step of another. Then it trains 12 float64 steps per stage.
''', r'''
out_json = os.path.join(tempfile.mkdtemp(), "zero.json")
mpirun(4, ["06_zero.py", "--backend", BACKEND, "--json", out_json])
result = json.load(open(out_json))
N, psi = result["ranks"], result["psi"]
print(f"N = {N} ranks, Ψ = {psi:,} parameters")
''', r'''%md
## 2. Measured memory against the formulas

**Exercise — the memory of each stage.** Write `state_bytes(stage, psi, n, padded)`: the bytes one of
`n` ranks holds for (parameters, gradients, optimizer state) under fp32 AdamW, where `psi` is the model's
parameter count and `padded` the same count after every bucket was rounded up to a multiple of `n`. Two
details of minipar's layout matter: a shard is $1/n$ of the **padded** buffers; and ZeRO-1/2 keep the
full weights in those padded flat buckets (each parameter a view of its bucket), so their parameters
count the padding too — full gradients and DDP's weights are the parameters themselves. The check
compares with what every rank measured, byte for byte, and with minipar's planner
(`minipar.perf.memory.model_state_bytes`).
''', r'''%exercise zero_memory
def state_bytes(stage, psi, n, padded):
    raise NotImplementedError("hint: the table above, one row per stage — but with the two details of "
                              "minipar's layout: which of the three counts the padding, and which does not?")
''', r'''
from minipar.config import TrainConfig
from minipar.nn import GPTConfig
from minipar.perf.memory import model_state_bytes

cfg = GPTConfig(**result["config"])
measured = {}
for stage in range(4):
    m = result[f"memory{stage}"]
    per_rank = [(d["params"], d["grads"], d["optimizer"]) for d in m["per_rank"]]
    assert len(set(per_rank)) == 1, per_rank                   # every rank holds the same
    measured[stage] = per_rank[0]
    padded = m["psi_padded"]
    assert 0 <= padded - psi < N * (m["buckets"] or 1)         # < N elements per bucket
    buckets = {} if stage == 3 else {"bucket_mb": 8 / 1024}    # the script's 8 KiB buckets
    plan = model_state_bytes(cfg, TrainConfig(zero=stage, batch_size=2 * N, **buckets).resolve(N))
    assert (plan["params"], plan["grads"], plan["optimizer"]) == per_rank[0], (stage, plan)
    yours = tuple(state_bytes(stage, psi, N, padded))
    assert yours == per_rank[0], f"stage {stage}: yours {yours}, measured {per_rank[0]}"
print("correct: your formula = every rank's memory_bytes() = the planner's, at every stage")
''', r'''
paper = {0: lambda p, n: 16 * p, 1: lambda p, n: 8 * p + 8 * p / n,
         2: lambda p, n: 4 * p + 12 * p / n, 3: lambda p, n: 16 * p / n}
labels = {0: "16Ψ", 1: "8Ψ+8Ψ/N", 2: "4Ψ+12Ψ/N", 3: "16Ψ/N"}
print(f"{'stage':6} {'params':>8} {'grads':>8} {'optim':>8} {'total':>8} {'paper':>10} {'':10} {'padding':>8}")
for stage in range(4):
    padded = result[f"memory{stage}"]["psi_padded"]
    total, f = sum(measured[stage]), paper[stage](psi, N)
    assert 0 <= total - f <= 16 * (padded - psi)               # the paper's formula up to padding
    p, g, o = measured[stage]
    print(f"{stage:6d} {p:8,} {g:8,} {o:8,} {total:8,} {f:10,.0f} {labels[stage]:10} {padded - psi:6d} el")

fig, ax = plt.subplots(figsize=(7, 3.8))
x = np.arange(4)
bottom = np.zeros(4)
for i, (part, color) in enumerate((("params", "#4C72B0"), ("grads", "#55A868"), ("optimizer (m, v)", "#C44E52"))):
    vals = np.array([measured[s][i] for s in range(4)]) / 1024
    ax.bar(x, vals, bottom=bottom, color=color, label=part, width=0.6)
    bottom += vals
ax.scatter(x, [paper[s](psi, N) / 1024 for s in range(4)], marker="_", s=1500, color="k",
           zorder=3, label="paper's formula")
ax.set_xticks(x, [f"stage {s}\n{labels[s]}" for s in range(4)])
ax.set_ylabel("KiB per rank"); ax.set_title(f"model state per rank, fp32 AdamW, Ψ = {psi:,}, N = {N}")
ax.legend(loc="upper right", fontsize=8); plt.show()
''', r'''%md
Measured bytes equal the formulas exactly once Ψ in the sharded terms is the padded Ψ (every
bucket rounded up to a multiple of $N$ — a handful of elements here, nothing for a real model).

## 3. What it means at scale

The paper's example (its Figure 1): Ψ = 7.5B parameters, mixed precision (fp16 weights and gradients,
fp32 master weights + $m$ + $v$: $K = 12$), $N = 64$ data-parallel ranks:
''', r'''
P, n = 7.5e9, 64
mixed = {0: 16 * P, 1: 4 * P + 12 * P / n, 2: 2 * P + 14 * P / n, 3: 16 * P / n}
for stage, b in mixed.items():
    print(f"stage {stage}: {b / 1e9:6.1f} GB per rank")
assert [round(mixed[s] / 1e9, 1) for s in range(4)] == [120.0, 31.4, 16.6, 1.9]   # the paper's figures

ns = np.arange(1, 129)
fig, ax = plt.subplots(figsize=(6, 3.5))
for stage, f in ((0, lambda n: 16 * P + 0 * n), (1, lambda n: 4 * P + 12 * P / n),
                 (2, lambda n: 2 * P + 14 * P / n), (3, lambda n: 16 * P / n)):
    ax.plot(ns, f(ns) / 1e9, label=f"stage {stage}")
ax.axhline(80, color="gray", ls=":", label="80 GB GPU")
ax.set_xscale("log", base=2); ax.set_yscale("log"); ax.set_xlabel("data-parallel ranks N")
ax.set_ylabel("GB per rank (model state)"); ax.set_title("7.5B parameters, mixed-precision AdamW")
ax.legend(fontsize=8); plt.show()
''', r'''%md
Stages 1 and 2 flatten out at $4\Psi$ and $2\Psi$ — the replicated weights (and gradients) remain;
only stage 3 keeps falling as $1/N$, at the price of gathering the weights twice per step.

## 4. The ZeRO-1 step

Here is the library's stage 1 and 2 (`minipar/parallel/sync/zero.py`): `_reduce_scatter` averages a
bucket's gradients and keeps this rank's shard, `finish` hands the optimizer step one `Slot` per bucket
(this rank's shard of the weights, its shard of the averaged gradient), and after AdamW has updated the
slots in place, `publish` all-gathers the shards back into the flat buckets the parameters are views of:
''', r'''
print(inspect.getsource(ZeroSync._reduce_scatter))
print(inspect.getsource(ZeroSync.finish))
print(inspect.getsource(ZeroSync.publish))
''', r'''%md
**Exercise — one ZeRO-1 step, $N$ ranks simulated in one process.** `weights` is one flat bucket (its
length a multiple of $N$) that every rank holds; `grads[r]` is rank $r$'s full gradient (of its share of
the batch); `m[r]`, `v[r]` are rank $r$'s AdamW moments **for its shard only**. Do what the ranks do —
reduce-scatter (rank $r$ gets the *mean* over ranks of chunk $r$), AdamW on rank $r$'s shard with
`adamw_update(shard, grad, m[r], v[r], step, lr)` (in place; from `minipar.optim`), all-gather — and
return the full weights each rank holds afterwards. The check runs three steps against plain data
parallelism: AdamW on the whole mean gradient with whole moments.
''', r'''%exercise zero1_step
from minipar.optim import adamw_update

def zero1_step(weights, grads, m, v, step, lr):
    raise NotImplementedError("hint: three phases, as the ranks do them — what does rank r receive from "
                              "the reduce-scatter, which part of the weights does its AdamW touch, and what "
                              "does the all-gather give every rank back?")
''', r'''
rng = np.random.default_rng(0)
N_sim, L = 4, 4 * 7
reference = rng.normal(size=L)                  # plain data parallelism: one full AdamW
ref_m, ref_v = np.zeros(L), np.zeros(L)
held = [reference.copy() for _ in range(N_sim)]    # the full weights as each rank holds them
m_shards, v_shards = [np.zeros(L // N_sim) for _ in range(N_sim)], [np.zeros(L // N_sim) for _ in range(N_sim)]
for step in range(1, 4):
    grads = [rng.normal(size=L) for _ in range(N_sim)]
    adamw_update(reference, np.mean(grads, axis=0), ref_m, ref_v, step, lr=0.01)
    held = zero1_step(held[0].copy(), grads, m_shards, v_shards, step, 0.01)
    assert len(held) == N_sim
    for r in range(N_sim):
        np.testing.assert_allclose(held[r], reference, rtol=1e-12, atol=1e-15, err_msg=f"rank {r}, step {step}")
    np.testing.assert_allclose(np.concatenate(m_shards), ref_m, rtol=1e-12, err_msg="m: each rank's shard")
    np.testing.assert_allclose(np.concatenate(v_shards), ref_v, rtol=1e-12, err_msg="v: each rank's shard")
print(f"correct: {N_sim} ranks, each with 1/{N_sim} of m and v, make the data-parallel update")
''', r'''%md
AdamW is elementwise, so updating shard by shard *is* the full update; the one thing that is not
elementwise — the gradient-clipping norm — is $\|g\|^2 = \sum_r \|g_r\|^2$ over the shards (one
all-reduce of one number, `parallel/norm.py`).

ZeRO-3 runs the same step on the shards, but never all-gathers after it: each unit is gathered when it is
needed, in forward and again in backward (`minipar/parallel/sync/zero3.py`):
''', r'''
print(inspect.getsource(Zero3Sync.run_unit))
print(inspect.getsource(Zero3Sync.release_unit))
''', r'''%md
**Exercise — ZeRO-3's gather, prefetch and free, on four ranks.** The library needs autograd boundaries
to know when backward reaches a unit; strip that away and the mechanism is short. A stack of layers
$h_{i+1} = \tanh(h_i W_i)$, $W_i$ of shape `shape`, loss $= \frac{1}{B}\sum_\text{rows} \frac12\|h_L - t\|^2$.
Rank $r$ keeps only `shards[i]`: chunk $r$ of $W_i$ flattened (`chunk_bounds` order, what `all_gather`
concatenates and `reduce_scatter` hands back). Write `zero3_step(comm, shards, shape, x, target)`: forward
and backward by hand over this rank's rows, returning its loss and, per layer, **its shard of the
gradient of the global-batch loss**.

Gathering a layer just before using it leaves the compute idle while its weight travels. So gather
**one layer ahead**, with the non-blocking `all_gather_async(comm, shard)`: it hands the gather to the
communicator's progress thread and returns a handle at once; `handle.wait()` returns the full flat
weight. While layer $i$ computes, the gather of the next layer — $i+1$ in forward, $i-1$ in backward — is
already in flight; and a layer's full weight is dropped as soon as the layer is done, so that at most
**two** full weights exist at any moment: the one computing and the next.

The check (`06_yours.py`, 4 ranks, float64, three SGD steps) puts a spy in place of your
`all_gather_async` and records the events of each step in order: a gather issued, its handle waited, the
first matmul with the weight it returned (the layer's compute), the weight freed (Python frees an array
the moment nothing refers to it: a name still bound to it keeps it). It checks the **order** — layer
$i+1$'s gather issued before layer $i$'s compute (in backward, $i-1$'s) — and refuses a gather that would
make three full weights alive or in flight; then the gathers and the bytes — ZeRO-3's $3\frac{p-1}{p}\Psi$
— and the loss and every gradient shard against one process on the whole batch, to $10^{-12}$.
''', r'''%exercise zero3_step
%%writefile {MINE}/zero3.py
"""Your ZeRO-3 step with prefetch (lesson 06): run under mpiexec by 06_yours.py."""
from minipar.backend import xp
from minipar.comm import all_gather_async, reduce_scatter


def zero3_step(comm, shards, shape, x, target):
    """Forward and backward of h <- tanh(h @ W_i), the next layer's gather in flight while a
    layer computes, at most two full weights held; returns (my rows' loss, my shard of each
    layer's gradient of the global mean loss)."""
    loss, grads = 0.0, [xp.zeros_like(s) for s in shards]
    return loss, grads
''', r'''
proc = mpirun(4, ["06_yours.py", "--file", f"{MINE}/zero3.py", "--backend", BACKEND])
print(proc.stdout)
''', r'''%md
Peak parameter memory is two layers' full weights plus the shards — $\Psi/N$ plus two units — at the
price of two all-gathers per step instead of one, each hidden behind the compute of the layer before it
when the compute is the longer of the two. The library does the same with its units (one transformer
block each), and learns *when* backward reaches a unit from the autograd graph itself instead of a
hand-written loop.

## 5. Communication: bytes counted

Every rank counted the bytes it sent (`comm.bytes_sent`, reset before each phase; the asynchronous
collectives of a phase waited for before its count is read). The global-norm all-reduce of one float64
is counted on its own: it is the same few bytes for every ZeRO stage, and DDP needs none (every replica
holds every gradient).
''', r'''
PHASES = (("forward", "#4C72B0"), ("backward", "#55A868"), ("step", "#8172B2"))
ITEM = 4                                                        # float32
sent = {s: {ph: np.mean([t[ph] for t in result[f"traffic{s}"]]) for ph, _ in PHASES + (("norm", ""),)}
        for s in range(4)}
padded = {s: result[f"memory{s}"]["psi_padded"] for s in range(4)}
ring = lambda elements: (N - 1) / N * elements * ITEM           # one ring pass over `elements`
expected = {0: 2 * ring(psi), 1: 2 * ring(padded[1]), 2: 2 * ring(padded[2]), 3: 3 * ring(padded[3])}
print(f"{'stage':6}{'forward':>10}{'backward':>10}{'step':>10}{'norm':>6}{'total':>10}{'formula':>10}{'÷ DDP':>7}")
for s in range(4):
    total = sum(sent[s][ph] for ph, _ in PHASES)
    print(f"{s:6d}{sent[s]['forward']:10,.0f}{sent[s]['backward']:10,.0f}{sent[s]['step']:10,.0f}"
          f"{sent[s]['norm']:6.0f}{total:10,.0f}{expected[s]:10,.0f}{total / sum(sent[0].values()):7.3f}")
    assert total == expected[s], (s, total, expected[s])        # exact: ring volumes, padded Ψ
assert sent[0]["norm"] == 0 and all(sent[s]["norm"] < 64 for s in (1, 2, 3))
assert sent[3]["forward"] == ring(padded[3])                    # ZeRO-3: one all-gather in forward
ratio = sum(sent[3][ph] for ph, _ in PHASES) / sum(sent[0][ph] for ph, _ in PHASES)
print(f"ZeRO-3 sends {ratio:.4f}x what DDP sends (3/2 up to the padding: {padded[3] / psi:.5f})")

fig, ax = plt.subplots(figsize=(7, 3.6))
bottom = np.zeros(4)
for ph, color in PHASES:
    vals = np.array([sent[s][ph] for s in range(4)]) / 1024
    ax.bar(np.arange(4), vals, bottom=bottom, color=color, width=0.6, label=ph)
    bottom += vals
ax.axhline(2 * ring(psi) / 1024, color="k", ls="--", lw=1, label="2·(N-1)/N·4Ψ bytes (one all-reduce)")
ax.axhline(3 * ring(psi) / 1024, color="k", ls=":", lw=1, label="3·(N-1)/N·4Ψ bytes")
ax.set_xticks(range(4), ["stage 0 (DDP)", "stage 1", "stage 2", "stage 3"])
ax.set_ylabel("KiB sent per rank, one step"); ax.set_ylim(0, 3.6 * ring(psi) / 1024)
ax.set_title(f"bytes counted by the communicator, N = {N}, float32")
ax.legend(fontsize=8, loc="upper left"); plt.show()
''', r'''%md
Where the bytes go: DDP all-reduces during backward; ZeRO-1 reduce-scatters after backward and
all-gathers after the update (both in the step); ZeRO-2 moves the reduce-scatters into backward (the
hooks); ZeRO-3 all-gathers every unit in forward, again in backward (plus the reduce-scatters), and its
step still reduce-scatters the embeddings — token ids need no gradient, so no backward op marks the end of
that unit, and `finish` releases it. Forward + backward + step = $3\frac{N-1}{N}\Psi$ elements: $1.5\times$
DDP, measured to the byte.

## 6. Same losses as stage 0 and as one process

Sharding changes *where* the numbers live, not *what* is computed. Twelve float64 steps per stage on a
learnable pattern (each row counts up in a stride of 1–3), so the loss falls:
''', r'''
single = np.array(result["losses_single"])
losses = {s: np.array(result[f"losses{s}"]) for s in range(4)}
for s in range(4):
    np.testing.assert_allclose(losses[s], single, rtol=1e-12, atol=0)
assert single[-1] < single[0] - 0.5                        # it learns
ulps = {s: np.abs(losses[s] - single) / np.spacing(single) for s in range(4)}
steps = np.arange(len(single))

fig, axes = plt.subplots(1, 2, figsize=(12, 3.6))
axes[0].plot(steps, single, color="#bbb", lw=6, label="one process")
for s, (marker, size) in enumerate((("o", 9), ("s", 7), ("^", 5), ("x", 5))):
    axes[0].plot(steps, losses[s], marker=marker, ms=size, lw=1, mfc="none" if s < 3 else None,
                 label=f"stage {s} ({N} ranks)")
axes[0].set_xlabel("step"); axes[0].set_ylabel("loss (float64)")
axes[0].set_title("the curves lie on top of each other"); axes[0].legend(fontsize=8)
width = 0.2
for s in range(4):
    axes[1].bar(steps + (s - 1.5) * width, ulps[s], width, label=f"stage {s}")
axes[1].set_xlabel("step"); axes[1].set_ylabel("|loss − one process| in ulps")
axes[1].set_ylim(0, max(4, 1.2 * max(u.max() for u in ulps.values())))
axes[1].set_title("difference in units of the last place (0 = bit-identical)"); axes[1].legend(fontsize=8)
plt.tight_layout(); plt.show()
for s in range(4):
    same = int((ulps[s] == 0).sum())
    print(f"stage {s}: {same} of {len(single)} losses bit-identical to one process, at most {ulps[s].max():.0f} ulp off")
''', r'''%md
Differences of a few units in the last place come only from the order of additions (the ranks sum
partial gradients that one process sums inside one matmul; a ring reduces in a rank-dependent order).
AdamW applied shard by shard is the same update.

## Takeaways

- fp32 AdamW holds $16\Psi$ bytes of model state per rank; ZeRO-1/2/3 cut it to $8\Psi + 8\Psi/N$,
  $4\Psi + 12\Psi/N$ and $16\Psi/N$ — measured here byte for byte (plus padding to a multiple of $N$).
- Stages 1–2 cost no more communication than DDP (reduce-scatter + all-gather = all-reduce);
  stage 3 gathers the weights twice, $3\frac{N-1}{N}\Psi$ against $2\frac{N-1}{N}\Psi$: $1.5\times$ —
  counted by the communicators.
- The update is the same: all stages reproduce the single process to $10^{-12}$ in float64.

## In PyTorch / DeepSpeed / Megatron this is …

- **DeepSpeed**: `"zero_optimization": {"stage": 1 | 2 | 3}` in the config — the paper's own
  implementation; `"overlap_comm"`, `"reduce_bucket_size"`, `"allgather_bucket_size"` (stages 1–2),
  `"stage3_prefetch_bucket_size"`, `"stage3_param_persistence_threshold"` (small parameters stay
  unsharded) for stage 3; `zero.Init()` builds a model already sharded; ZeRO-Offload / ZeRO-Infinity
  move the shards to CPU or NVMe.
- **PyTorch**: `torch.distributed.optim.ZeroRedundancyOptimizer` is stage 1; FSDP —
  `torch.distributed.fsdp.FullyShardedDataParallel` with `ShardingStrategy.SHARD_GRAD_OP` (stage 2) or
  `FULL_SHARD` (stage 3), units from an `auto_wrap_policy` (per transformer block, as minipar's units),
  `backward_prefetch`; FSDP2's `fully_shard(module)`.
- **Megatron-Core**: the distributed optimizer, `--use-distributed-optimizer`
  (`DistributedOptimizer`): stage 1 over the data-parallel group, reduce-scatter of the gradient
  buckets and all-gather of the updated parameters, overlapped with `--overlap-grad-reduce` /
  `--overlap-param-gather`.
''', r'''%md
## What changes on GPU nodes and at scale

From the repository's **H200 profile** (data sheet × efficiency: a model, not a measurement): 141 GB of
HBM per GPU, NVLink inside a node of 8, InfiniBand between nodes.
''', r'''from minipar.perf.comm import collective_seconds
from minipar.perf.profile import load_profile

h200 = load_profile("h200")
hbm = h200.mem_per_rank_bytes
print(f"16 bytes per parameter: at most {hbm / 16 / 1e9:.1f} B parameters fit one H200 as DDP (no activations)")
for N in (8, 64, 512):
    print(f"  ZeRO-3 over {N:>3} GPUs: a 70B model's 16Ψ/N = {16 * 70e9 / N / 1e9:6.1f} GB per GPU")
for N, where in ((8, "intra"), (64, "inter")):
    gather = collective_seconds(h200, "all_gather", N, 2 * 70e9, where)
    print(f"  one all-gather of 70B bf16 weights over {N} GPUs ({where}): {gather:.2f} s; ZeRO-3 does two "
          f"and a reduce-scatter per step")
''', r'''%md
Memory is why ZeRO-3 exists at scale: a 70B model's state fits no single GPU, and sharding it 64 ways
leaves room for activations. Time is its price: every step moves $3\Psi$ through each GPU's card,
seconds that must hide behind forward and backward unit by unit. Sharding flat over every GPU of many
nodes is common (FSDP's `FULL_SHARD`, ZeRO-3) when each GPU's compute per unit is long enough to hide
its gather; where it is not, runs keep the gathers inside a node — PyTorch's HSDP shards inside a
node and replicates across, DeepSpeed's ZeRO++ hpZ keeps a second copy of the weights sharded inside
each node for backward's gathers. Megatron's distributed optimizer shards only the optimizer state
(stage 1), over the whole data-parallel group, across nodes. All of them prefetch the next unit's
gather while the current one computes, as your exercise does.
''']
