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

| stage | sharded | bytes per rank, fp32 AdamW | mixed precision (2 + 2 + 12) |
|---|---|---|---|
| 0 (DDP) | nothing | $4\Psi + 4\Psi + 8\Psi = 16\Psi$ | $16\Psi$ |
| 1 | optimizer state | $4\Psi + 4\Psi + 8\Psi/N = 8\Psi + 8\Psi/N$ | $4\Psi + 12\Psi/N$ |
| 2 | + gradients | $4\Psi + (4\Psi + 8\Psi)/N = 4\Psi + 12\Psi/N$ | $2\Psi + 14\Psi/N$ |
| 3 | + parameters | $(4\Psi + 4\Psi + 8\Psi)/N = 16\Psi/N$ | $16\Psi/N$ |

How each stage works in minipar:

* **stage 1** — after backward each bucket's gradient is **reduce-scattered** (rank $r$ receives the
  sum of its shard only); rank $r$ runs AdamW on its shard of the weights with its shard of $m, v$;
  the updated shards are **all-gathered** back into the full weights. Reduce-scatter + all-gather move
  exactly the bytes of one all-reduce ($2\frac{N-1}{N}\Psi$ elements): stage 1 is free in communication.
* **stage 2** — the reduce-scatter of a bucket starts from the gradient hooks as soon as the bucket
  is complete, and the full gradients are freed: a rank keeps only its shard of the gradients.
* **stage 3** — the weights are sharded too. Each *unit* (embeddings, each block, the head) is
  all-gathered just before its forward, freed after, gathered again for its backward (the next unit
  prefetched), and its gradients reduce-scattered when its backward ends: $1.5\times$ the
  communication of DDP.

Every buffer is padded to a multiple of $N$ elements so all shards have equal size; Ψ in the
sharded terms is therefore the **padded** Ψ (at most $N-1$ extra elements per bucket).
''', r'''
import json
import os
import subprocess
import sys
import tempfile
import time

import matplotlib.pyplot as plt
import numpy as np

%matplotlib inline
''' + LAUNCH, r'''%md
## 1. Four ranks, each stage

`06_zero.py` builds the same GPT ($d = 30$, so the LayerNorm and bias sizes are not multiples of 4 and
padding shows) under each stage's optimizer on $N = 4$ ranks: stage 0 is `DDPSync` under
the one optimizer step (`parallel.step.Optimizer`), stages 1–2 `ZeroSync(stage=…)` with 8 KiB buckets, stage 3 `Zero3Sync` (one
bucket per unit). After one float32 step it reads every rank's `memory_bytes()` — the bytes the rank
holds for parameters, gradients and optimizer states. Then it trains 5 float64 steps per stage.
''', r'''
out_json = os.path.join(tempfile.mkdtemp(), "zero.json")
mpirun(4, ["06_zero.py", "--backend", BACKEND, "--json", out_json])
result = json.load(open(out_json))
N, psi = result["ranks"], result["psi"]
print(f"N = {N} ranks, Ψ = {psi:,} parameters")
''', r'''%md
## 2. Measured memory against the formulas
''', r'''
def formula(stage, psi, n, padded=None):
    """(params, grads, optimizer) bytes per rank, fp32 AdamW; sharded terms use the padded Ψ,
    and so do ZeRO-1/2's parameters, which live in padded flat buckets (one storage per
    bucket, the shard a view of it)."""
    padded = psi if padded is None else padded
    full, shard, flat = 4 * psi, 4 * padded // n, 4 * padded
    return {0: (full, full, 2 * full), 1: (flat, full, 2 * shard),
            2: (flat, shard, 2 * shard), 3: (shard, shard, 2 * shard)}[stage]

paper = {0: lambda p, n: 16 * p, 1: lambda p, n: 8 * p + 8 * p / n,
         2: lambda p, n: 4 * p + 12 * p / n, 3: lambda p, n: 16 * p / n}
labels = {0: "16Ψ", 1: "8Ψ+8Ψ/N", 2: "4Ψ+12Ψ/N", 3: "16Ψ/N"}
print(f"{'stage':6} {'params':>8} {'grads':>8} {'optim':>8} {'total':>8} {'formula':>10} {'':10} {'padding':>8}")
measured = {}
for stage in range(4):
    m = result[f"memory{stage}"]
    per_rank = [(d["params"], d["grads"], d["optimizer"]) for d in m["per_rank"]]
    assert len(set(per_rank)) == 1, per_rank                   # every rank holds the same
    measured[stage] = per_rank[0]
    padded = m["psi_padded"]
    assert 0 <= padded - psi < N * (m["buckets"] or 1)         # < N elements per bucket
    assert per_rank[0] == formula(stage, psi, N, padded)       # exact, counting the padding
    total, f = sum(per_rank[0]), paper[stage](psi, N)
    assert 0 <= total - f <= 16 * (padded - psi)               # the paper's formula up to padding
    print(f"{stage:6d} {per_rank[0][0]:8,} {per_rank[0][1]:8,} {per_rank[0][2]:8,} {total:8,} "
          f"{f:10,.0f} {labels[stage]:10} {padded - psi:6d} el")

fig, ax = plt.subplots(figsize=(7, 3.8))
x = np.arange(4)
bottom = np.zeros(4)
for i, (part, color) in enumerate((("params", "#4C72B0"), ("grads", "#55A868"), ("optimizer (m, v)", "#C44E52"))):
    vals = np.array([measured[s][i] for s in range(4)]) / 1024
    ax.bar(x, vals, bottom=bottom, color=color, label=part, width=0.6)
    bottom += vals
ax.scatter(x, [paper[s](psi, N) / 1024 for s in range(4)], marker="_", s=1500, color="k",
           zorder=3, label="formula")
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

## 4. Same losses as stage 0 and as one process

Sharding changes *where* the numbers live, not *what* is computed: the AdamW update is elementwise,
so applying it shard by shard is the same update; the gradient-clipping norm is
$\|g\|^2 = \sum_r \|g_r\|^2$ over the shards (one tiny all-reduce).
''', r'''
single = np.array(result["losses_single"])
losses = {s: np.array(result[f"losses{s}"]) for s in range(4)}
for s in range(4):
    print(f"stage {s}: " + " ".join(f"{v:.13f}" for v in losses[s]))
print(f"1 proc : " + " ".join(f"{v:.13f}" for v in single))
for s in range(1, 4):
    np.testing.assert_allclose(losses[s], losses[0], rtol=1e-12, atol=0)
np.testing.assert_allclose(losses[0], single, rtol=1e-12, atol=0)

fig, ax = plt.subplots(figsize=(6, 3))
for s in range(4):
    ax.semilogy(np.abs(losses[s] - single) / single + 1e-17, "o-", label=f"stage {s}")
ax.set_xlabel("step"); ax.set_ylabel("|loss − single| / single"); ax.set_ylim(1e-17, 1e-10)
ax.set_title("float64: differences at the rounding level"); ax.legend(fontsize=8); plt.show()
''', r'''%md
## Takeaways

- fp32 AdamW holds $16\Psi$ bytes of model state per rank; ZeRO-1/2/3 cut it to $8\Psi + 8\Psi/N$,
  $4\Psi + 12\Psi/N$ and $16\Psi/N$ — measured here byte for byte (plus padding to a multiple of $N$).
- Stages 1–2 cost no more communication than DDP (reduce-scatter + all-gather = all-reduce);
  stage 3 adds one all-gather of the weights per pass ($1.5\times$).
- The update is the same: all stages reproduce the single process to $10^{-12}$ in float64.
''']
