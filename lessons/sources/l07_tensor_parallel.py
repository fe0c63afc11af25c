"""Lesson 07: the cells of lessons/07_tensor_parallel.ipynb (``%md`` cells are markdown).

Edit here, then run ``python lessons/make_notebooks.py``."""
from launch import LAUNCH   # the cell that defines mpirun() for the lesson's runs

NOTEBOOK = "07_tensor_parallel.ipynb"

CELLS = [r'''%md
# 07 · Tensor (and sequence) parallelism

Data parallelism copies the whole model to every device. When one layer's weights, or its
activations, no longer fit — or one device is simply too slow for one layer — we split **each
matrix multiplication** across $t$ devices instead: *tensor parallelism* (Megatron-LM,
Shoeybi et al. 2019). Every rank holds $1/t$ of every weight matrix and does $1/t$ of the
FLOPs; the price is communication **inside every layer**, so the $t$ ranks of a group sit on
one node (fast links).

Plan: (1) the two ways to split a matmul and the two communication operators $f$ and $g$ — you
write $f$ and $g$ as autograd functions and run them on two ranks, and you split an MLP by columns
and rows; (2) which slice of each GPT weight a rank owns, drawn from the real slicing code;
(3) the vocabulary-parallel cross-entropy, which never gathers the logits;
(4) two ranks under `mpiexec`: exact parity with the single process and the measured
communication per layer against $8\,b\,s\,h\,(t-1)/t$; (5) sequence parallelism — you write its two
region boundaries and the vocabulary-parallel loss, and run them on two ranks.
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
from matplotlib.colors import ListedColormap

from minipar import backend
from minipar.autograd import Tensor, ops
from minipar.comm import chunk_bounds
from minipar.parallel.tensor import Shard

%matplotlib inline
''' + LAUNCH + r'''
WORK = tempfile.mkdtemp()          # files the lesson's runs read and write
''', r'''%md
## 1. Splitting a matmul: column parallel, row parallel, $f$ and $g$

The MLP of a block is $Z = \mathrm{GELU}(XA)\,B$ with $A$ of shape $(h, 4h)$ and $B$ of shape $(4h, h)$.

* **Column parallel** $A = [A_1 \,|\, \dots \,|\, A_t]$: rank $r$ computes $Y_r = \mathrm{GELU}(XA_r)$,
  its own $4h/t$ features. GELU is elementwise, so no message is needed — but every rank needs
  the whole $X$.
* **Row parallel** $B = [B_1; \dots; B_t]$: rank $r$ computes the partial product $Y_r B_r$ from the
  slice it already has, and $Z = \sum_r Y_r B_r$ is one **all-reduce**. The bias is added once, after it.

Communication happens at two boundaries, written as autograd functions whose backward is the
*transpose* of their forward:

| operator | forward | backward |
|---|---|---|
| $f$ = `copy_to_tp_region` | identity | all-reduce |
| $g$ = `reduce_from_tp_region` | all-reduce | identity |

$f$'s backward is an all-reduce because $\partial L/\partial X = \sum_r \partial L/\partial Y_r\,A_r^\top$
sums over ranks. Attention is the same pattern with **heads**: the $q,k,v$ projection is column
parallel (rank $r$ keeps $h_{\text{heads}}/t$ whole heads, which attend independently), the output
projection row parallel. One block = 2 $f$ + 2 $g$.
''', r'''
def box(ax, x, y, text, color="#dde", w=1.5, h=0.6):
    ax.add_patch(plt.Rectangle((x - w / 2, y - h / 2), w, h, fc=color, ec="k"))
    ax.text(x, y, text, ha="center", va="center", fontsize=10)

def arrow(ax, x0, y0, x1, y1):
    ax.annotate("", (x1, y1), (x0, y0), arrowprops=dict(arrowstyle="->", lw=1.2))

fig, ax = plt.subplots(figsize=(11, 3.4))
colors = ["#8dd3c7", "#fdb462"]
box(ax, 0, 1, "X\n(replicated)", "#eee")
box(ax, 1.8, 1, "f", "#f88", w=0.6)
for r, y in enumerate((1.8, 0.2)):
    box(ax, 3.6, y, f"GELU(X·A{r + 1})", colors[r], w=1.9)
    box(ax, 6.0, y, f"Y{r + 1}·B{r + 1}", colors[r])
    arrow(ax, 2.1, 1, 2.65, y); arrow(ax, 4.55, y, 5.25, y); arrow(ax, 6.75, y, 7.7, 1)
box(ax, 8.0, 1, "g", "#f88", w=0.6)
box(ax, 9.8, 1, "Z = Σ Yr·Br + b\n(replicated)", "#eee", w=2.0)
arrow(ax, 0.75, 1, 1.5, 1); arrow(ax, 8.3, 1, 8.8, 1)
ax.text(1.8, 0.6, "fwd: identity\nbwd: all-reduce", ha="center", va="top", fontsize=8)
ax.text(8.0, 0.6, "fwd: all-reduce\nbwd: identity", ha="center", va="top", fontsize=8)
ax.text(3.6, 2.4, "rank 0", color="#2a9d8f"); ax.text(3.6, -0.45, "rank 1", color="#e76f51")
ax.set_xlim(-1, 11); ax.set_ylim(-0.7, 2.7); ax.axis("off")
ax.set_title("Megatron MLP on t = 2 ranks: one f and one g per sub-layer")
plt.show()
''', r'''%md
In minipar these are two named autograd `Function`s (`minipar/parallel/tensor/regions.py`), and the
parallel linear layers are nothing but $f$ (or $g$) around an ordinary `ops.linear` on the slice
(`layers.py`):
''', r'''
from minipar.parallel.tensor import (ColumnParallelLinear, CopyToTensorParallelRegion,
                                     ReduceFromTensorParallelRegion, RowParallelLinear)

print(inspect.getsource(ColumnParallelLinear.forward))
print(inspect.getsource(RowParallelLinear.forward))
''', r'''%md
**Exercise — Megatron's $f$ and $g$.** Write them yourself as autograd functions: a `Function` has
`forward(ctx, x, comm=None)` (keep what backward needs on `ctx`) and `backward(ctx, g)` returning the
gradient of the input. For the all-reduce use `all_reduce(comm, array)` from `minipar.comm` (a sum over
the ranks, **in place** on `array` — and the array autograd hands you must not be modified: an upstream
gradient can be shared by several branches). The cell writes your code to a file; the check runs it on
two ranks (`07_yours.py`): each of your functions alone first — its forward output, its input gradient
and the bytes it sends each way against the all-reduce's $2(t-1)/t \cdot S$ or nothing — then in a
column → row parallel MLP against the same MLP made of minipar's `ColumnParallelLinear` /
`RowParallelLinear` (output, input gradient, weight gradients). A wrong answer is one line naming the
rank and what your result is instead (this rank's own input, the sum, ...).
''', r'''%exercise megatron_f_g
%%writefile {MINE}/my_regions.py
from minipar.autograd.function import Function
from minipar.comm import all_reduce


class MyCopyToTP(Function):
    """f, before a column-parallel layer: identity forward, all-reduce backward."""

    @staticmethod
    def forward(ctx, x, comm=None):
        raise NotImplementedError("hint: every rank already holds the whole X and a column-parallel layer "
                                  "only reads it; backward will need to know the group")

    @staticmethod
    def backward(ctx, g):
        raise NotImplementedError("hint: X fed every rank's slice A_r, so dL/dX has a part from every "
                                  "rank: Σ_r dL/dY_r·A_rᵀ; the array autograd hands you is not yours to change")


class MyReduceFromTP(Function):
    """g, after a row-parallel layer: all-reduce forward, identity backward."""

    @staticmethod
    def forward(ctx, x, comm=None):
        raise NotImplementedError("hint: each rank holds one partial product Y_r·B_r of the same Z; "
                                  "the array autograd hands you is not yours to change")

    @staticmethod
    def backward(ctx, g):
        raise NotImplementedError("hint: how much does a sum move when one of its terms moves?")
''', r'''
proc = mpirun(2, ["07_yours.py", "--backend", BACKEND, "--file", os.path.join(MINE, "my_regions.py")])
print(proc.stdout)
''', r'''%md
minipar's two, for comparison (`all_reduce_copy` sums into a new array, leaving its input as it was):
''', r'''
from minipar.parallel.tensor.regions import all_reduce_copy

print(inspect.getsource(CopyToTensorParallelRegion))
print(inspect.getsource(ReduceFromTensorParallelRegion))
print(inspect.getsource(all_reduce_copy))
''', r'''%md
$f$ sends nothing in forward and one all-reduce of $b\,s\,h$ elements in backward; $g$ the other way
round — so the two directions of the MLP move the same bytes, as the run shows.

**Exercise — the column / row split of an MLP.** Now the arithmetic without messages, $t$ ranks
simulated in one process (float64). Write `split_mlp(fc_w, fc_b, proj_w, rank, t)`: rank `rank`'s
slices — the columns of `fc_w` $(h, 4h)$ and the matching entries of `fc_b`, the rows of `proj_w`
$(4h, h)$ — cut by the array_split rule (`chunk_bounds(n, t)`: parts differ by at most one). And
`partial_mlp(x, fc_w_r, fc_b_r, proj_w_r)`: this rank's $\mathrm{GELU}(x A_r + a_r)\,B_r$, before $g$ sums
the ranks (use `gelu` below: GPT-2's tanh GELU, as `ops.gelu` computes it). The check compares your
slices with the library's `Shard` and $\sum_r$ partial + proj bias with the plain `MLP`, for $t$ = 1 … 5.
''', r'''
def gelu(a):
    """GPT-2's tanh GELU on an array (minipar's ops.gelu, without the graph)."""
    return ops.gelu(Tensor(a)).data
''', r'''%exercise mlp_split
def split_mlp(fc_w, fc_b, proj_w, rank, t):
    raise NotImplementedError("hint: a hidden unit of the MLP is one column of fc (and its bias) and one "
                              "row of proj: a rank keeps whole hidden units, in the lesson's cut")

def partial_mlp(x, fc_w_r, fc_b_r, proj_w_r):
    raise NotImplementedError("hint: up to proj, a rank's hidden units need nothing from the other ranks; "
                              "a bias added by every rank would be counted t times in the sum")
''', r'''
from minipar.nn.layers import MLP, Dropout

backend.set_default_dtype(np.float64)
h_mlp = 8
mlp = MLP(h_mlp, np.random.default_rng(0), 0.02, Dropout(0.0, np.random.default_rng(1)))
x_mlp = np.random.default_rng(2).normal(size=(3, 5, h_mlp))
full = mlp(Tensor(x_mlp)).data
for t_sim in range(1, 6):                       # 4h = 32: t = 3 and 5 give uneven slices
    total = 0
    for r in range(t_sim):
        A_r, a_r, B_r = split_mlp(mlp.fc.weight.data, mlp.fc.bias.data, mlp.proj.weight.data, r, t_sim)
        np.testing.assert_array_equal(A_r, Shard(1).local(mlp.fc.weight.data, r, t_sim))   # column parallel
        np.testing.assert_array_equal(a_r, Shard(0).local(mlp.fc.bias.data, r, t_sim))
        np.testing.assert_array_equal(B_r, Shard(0).local(mlp.proj.weight.data, r, t_sim))  # row parallel
        total = total + partial_mlp(x_mlp, A_r, a_r, B_r)          # g: the all-reduce, by hand
    np.testing.assert_allclose(total + mlp.proj.bias.data, full, rtol=1e-12, atol=1e-15)
print("correct: the slices are minipar's, and Σ_r partial + bias = the plain MLP for t = 1 … 5")
''', r'''%md
## 2. Who owns which slice

`to_tensor_parallel(GPT(cfg, seed), grid)` builds the plain GPT of the same seed on every rank
and keeps **slices** of its weights, so the parallel model *is* the single-process model, only
distributed. Each parallel layer declares how its parameters are cut (`Shard(axis, groups)`):

* `attn.qkv` $(h, 3h)$ — columns, **per third**: the columns are $[q\,|\,k\,|\,v]$, each head-major, so
  rank $r$ keeps the $q$, $k$ and $v$ columns of *its* heads (`groups=3`);
* `attn.proj`, `mlp.proj` — rows (row parallel); `mlp.fc` — columns;
* `wte` $(V, h)$ — vocabulary rows; `lm_head` $(h, V)$ — vocabulary columns;
* LayerNorms, `wpe` and the row-parallel biases — replicated.

The picture below is computed by the real slicing code: each entry is coloured by the rank
whose slice contains it (tiny sizes: $h=8$, 4 heads, $V=11$, $t=2$ — $V$ need not divide by $t$:
the vocabulary is split 6 + 5, the array_split rule, no padding).
''', r'''
h, V, t = 8, 11, 2
mats = [("attn.qkv (h, 3h)", (h, 3 * h), Shard(1, 3)), ("attn.proj (h, h)", (h, h), Shard(0)),
        ("mlp.fc (h, 4h)", (h, 4 * h), Shard(1)), ("mlp.proj (4h, h)", (4 * h, h), Shard(0)),
        ("wte (V, h)", (V, h), Shard(0)), ("lm_head (h, V)", (h, V), Shard(1))]

def owner_map(shape, spec):
    """Which rank's slice holds each entry: slice an index array like a weight."""
    index = np.arange(np.prod(shape)).reshape(shape)
    owner = np.empty(np.prod(shape), dtype=int)
    for r in range(t):
        owner[spec.local(index, r, t).ravel()] = r
    return owner.reshape(shape)

fig, axes = plt.subplots(1, len(mats), figsize=(15, 3.4),
                         gridspec_kw={"width_ratios": [s[1] for _, s, _ in mats]})
cmap = ListedColormap(["#8dd3c7", "#fdb462"])
for ax, (name, shape, spec) in zip(axes, mats):
    owners = owner_map(shape, spec)
    assert sorted(np.unique(owners)) == list(range(t)) and owners.size == np.prod(shape)
    im = ax.imshow(owners, cmap=cmap, vmin=-0.5, vmax=t - 0.5)
    ax.set_title(name, fontsize=9)
    ax.set_xlabel("column", fontsize=7); ax.set_ylabel("row", fontsize=7)
    ax.tick_params(labelsize=6)
for x in (h - 0.5, 2 * h - 0.5):
    axes[0].axvline(x, color="k", lw=2)          # q | k | v
cbar = fig.colorbar(im, ax=axes, ticks=range(t), fraction=0.02, pad=0.01)
cbar.set_label("rank holding the entry"); cbar.set_ticklabels([f"rank {r}" for r in range(t)])
fig.suptitle("weights are (in, out): a row is an input feature, a column an output feature "
             "(wte: a row per token id)", fontsize=9)
plt.show()
print("qkv columns of rank 1:", Shard(1, 3).local(np.arange(3 * h)[None], 1, t)[0])
print("vocabulary rows per rank:", np.diff(chunk_bounds(V, t)))
''', r'''%md
## 3. Cross-entropy without gathering the logits

The head is column parallel over the vocabulary: rank $r$ has logits $z_r$ for its $V/t$ ids.
Gathering $b \cdot s \cdot V$ logits (GPT-2: $V$ = 50 257) would be the largest message of the step.
Instead each row needs three numbers, combined with all-reduces:

$$m = \max_r \max_j z_r[j], \qquad S = \sum_r \sum_j e^{z_r[j]-m}, \qquad z_y = \sum_r z_r[y]\,[y \in r],
\qquad \text{loss} = m + \log S - z_y.$$

The backward is local: $\partial L/\partial z_r = e^{z_r - m}/S - \text{onehot}_r(y)$ — only the owner of $y$
subtracts 1. Simulated here with NumPy on 3 "ranks" and an uneven vocabulary:
''', r'''
rng = np.random.default_rng(0)
logits, y = rng.normal(size=(5, 11)) * 3, rng.integers(0, 11, 5)
b = chunk_bounds(11, 3)
shards = [logits[:, b[r]:b[r + 1]] for r in range(3)]
m = np.max([z.max(axis=1) for z in shards], axis=0)                        # all-reduce max
S = np.sum([np.exp(z - m[:, None]).sum(axis=1) for z in shards], axis=0)   # all-reduce sum
zy = np.sum([np.where((y >= b[r]) & (y < b[r + 1]),
                      z[np.arange(5), np.clip(y - b[r], 0, z.shape[1] - 1)], 0)
             for r, z in enumerate(shards)], axis=0)                        # all-reduce sum
loss_tp = np.mean(m + np.log(S) - zy)
full = logits - logits.max(axis=1, keepdims=True)
loss_full = np.mean(np.log(np.exp(full).sum(axis=1)) - full[np.arange(5), y])
print(f"vocab-parallel {loss_tp:.15f}\nsingle process {loss_full:.15f}")
assert abs(loss_tp - loss_full) < 1e-12
''', r'''%md
minipar's version is `VocabParallelCrossEntropy` (`minipar/parallel/tensor/cross_entropy.py`): the same
three all-reduces over the tp group, and the local backward.

## 4. Two ranks: parity and the communication volume

`07_tensor_parallel.py` runs one transformer block plain and tensor-parallel (float64, $t$ = the
number of ranks), compares output, input gradient and every parameter gradient, compares a whole
GPT's loss, and reads the communicator's traffic counters around the forward of the attention,
the forward of the MLP, and the backward. The textbook volume per rank per block: 4 all-reduces
(2 $f$ in backward, 2 $g$ in forward) of $S = b\,s\,h$ elements, each $2(t-1)/t \cdot S$ on a ring:

$$V_{\text{block}} = 8\, b\, s\, h\, \frac{t-1}{t}\ \text{elements}.$$
''', r'''
out_json = os.path.join(WORK, "tp.json")
proc = mpirun(2, ["07_tensor_parallel.py", "--backend", BACKEND, "--json", out_json])
print(proc.stdout)
result = json.load(open(out_json))
''', r'''
rows = result["rows"]
fig, ax = plt.subplots(figsize=(7, 3.5))
names = [r["layout"] for r in rows]
bottom = np.zeros(len(rows))
for key, color in (("fwd_attn", "#8dd3c7"), ("fwd_mlp", "#80b1d3"), ("bwd", "#fdb462")):
    vals = np.array([r[key] for r in rows]) / 1024
    ax.bar(names, vals, bottom=bottom, color=color, label=key.replace("_", " "))
    bottom += vals
ax.axhline(rows[0]["formula"] / 1024, color="k", ls="--", label="8·b·s·h·(t-1)/t · 8 B")
ax.set_ylabel("KiB sent per rank, one block")
ax.legend(loc="upper left", bbox_to_anchor=(1.01, 1))
ax.set_title(f"b={result['b']} s={result['s']} h={result['h']}, t={result['t']}, float64")
plt.show()
for r in rows:
    print(f"{r['layout']:9}: measured/formula = {r['total'] / r['formula']:.3f}, "
          f"block parity {r['block_rel_err']:.1e}, GPT loss parity {r['gpt_loss_rel_err']:.1e}")
    assert r["total"] == r["formula"] and r["block_rel_err"] < 1e-11 and r["gpt_loss_rel_err"] < 1e-11
    assert r["fwd_attn"] + r["fwd_mlp"] == r["bwd"]     # each g in forward matched by an f in backward
''', r'''%md
Forward and backward cost the same (each all-reduce of $g$ in forward is matched by one of $f$ in
backward). The volume does not shrink with $t$ — it *grows* towards $8bsh$ — while the compute per
rank shrinks as $1/t$: this is why tensor parallelism stays inside a node (NVLink), and data or
pipeline parallelism go between nodes.

## 5. Sequence parallelism

Between the $g$ of one sub-layer and the $f$ of the next, every rank computes the **same**
LayerNorm, dropout and residual add on the full $b\cdot s\cdot h$ activation — wasted compute and,
above all, activation memory that does not shrink with $t$. Since an all-reduce *is* a
reduce-scatter followed by an all-gather, Korthikanti et al. (2022) split it:

| region boundary | tensor parallel | + sequence parallel |
|---|---|---|
| before a column-parallel layer | $f$: identity / all-reduce | all-gather along $s$ / reduce-scatter |
| after a row-parallel layer | $g$: all-reduce / identity | reduce-scatter along $s$ / all-gather |

Between them each rank holds $s/t$ tokens: LayerNorm and dropout run on $1/t$ of the sequence, the
bytes moved are the same (the table in §4 shows it: both rows equal the formula). Two consequences
the code handles: LayerNorm, position-embedding and row-bias gradients are now **partial sums** over
each rank's tokens — the one optimizer step sums them over the tp group once per step
(`minipar.parallel.step.sum_partial_over_tp`, for the elements whose placement says `tp_partial_grad`) —
and dropout draws the full mask from the shared generator and keeps its own tokens, so masks match the
single process exactly (`SequenceParallelDropout`).
''', r'''%md
**Exercise — sequence parallelism's two regions and the vocab-parallel loss, on two ranks.** Write the
two boundaries of the table as autograd functions, and the loss of §3 as one, in a file the check runs
under `mpiexec` (`07_yours.py`, 2 ranks, float64):

- `MyGatherFromSequence`: forward, this rank's $s/t$ tokens $(b, s/t, h)$ → every rank's, in rank order,
  $(b, s, h)$ (an all-gather along the sequence, axis 1); backward, the transpose: the gradient
  $(b, s, h)$ summed over the ranks, this rank's $s/t$ tokens (a reduce-scatter).
- `MyReduceScatterToSequence`: forward, this rank's partial sum $(b, s, h)$ → the sum over the ranks at
  this rank's tokens, $(b, s/t, h)$; backward, its transpose.
- `MyVocabParallelCrossEntropy`: forward(`logits` $(b, s, V/t)$ holding the vocabulary ids from
  `vocab_start` on, `targets` $(b, s)$) → the mean loss over the $b \cdot s$ rows, one number, the same on
  every rank; backward → the gradient of this rank's logits (and `None` for the targets), with no message.

From `minipar.comm`: `all_gather(comm, shard, sizes=[...])` concatenates every rank's *flattened* shard in
rank order (give it the sizes: the parts are equal, so no message is needed to learn them);
`reduce_scatter(comm, array)` sums over the ranks and returns this rank's chunk of the *flattened* sum;
`all_reduce(comm, array, op="sum" or "max")` works in place. The check runs each region alone (its forward
output and input gradient, and the bytes it sends each way against $(t-1)/t \cdot S$), then both around
minipar's column- and row-parallel arithmetic against minipar's sequence-parallel MLP, then your loss on a
vocabulary of 11 split 6 + 5: loss and gradient against one process's `cross_entropy` of the whole
logits (1e-12), and the bytes against minipar's (three numbers per row).
''', r'''%exercise sequence_parallel
%%writefile {MINE}/my_sequence_parallel.py
from minipar.autograd.function import Function
from minipar.backend import xp
from minipar.comm import all_gather, all_reduce, reduce_scatter


class MyGatherFromSequence(Function):
    """Before a column-parallel layer: all-gather the tokens forward, reduce-scatter backward."""

    @staticmethod
    def forward(ctx, x, comm=None):
        raise NotImplementedError("hint: the collectives join and cut flat arrays; a rank's tokens are "
                                  "one contiguous slab only when the sequence is the leading axis")

    @staticmethod
    def backward(ctx, g):
        raise NotImplementedError("hint: every rank's slice of the layer read all the tokens, so a token's "
                                  "gradient has a part from every rank, and it belongs to one rank")


class MyReduceScatterToSequence(Function):
    """After a row-parallel layer: reduce-scatter the tokens forward, all-gather backward."""

    @staticmethod
    def forward(ctx, x, comm=None):
        raise NotImplementedError("hint: g's all-reduce, cut in half: only the first half, and the rest "
                                  "waits for the next layer")

    @staticmethod
    def backward(ctx, g):
        raise NotImplementedError("hint: the forward kept a share of a sum: which collective is its transpose?")


class MyVocabParallelCrossEntropy(Function):
    """Mean cross-entropy of logits (b, s, V/t) holding the ids from vocab_start on; targets (b, s)."""

    @staticmethod
    def forward(ctx, logits, targets, comm=None, vocab_start=0):
        raise NotImplementedError("hint: log Σ_j exp(z_j) over the whole vocabulary needs each rank's max "
                                  "and sum; z_y lives on one rank only (§3)")

    @staticmethod
    def backward(ctx, g):
        raise NotImplementedError("hint: d(log Σ exp z)/dz is the softmax and d(-z_y)/dz the one-hot: "
                                  "both restricted to this rank's columns")
''', r'''
proc = mpirun(2, ["07_yours.py", "--backend", BACKEND, "--file", os.path.join(MINE, "my_sequence_parallel.py")])
print(proc.stdout)
''', r'''%md
minipar's regions (`gather_along` and `reduce_scatter_along` in `regions.py` do the axis moves) and its
loss are `GatherFromSequenceRegion`, `ReduceScatterToSequenceRegion` and `VocabParallelCrossEntropy`.

Activation memory per layer (bytes, 16-bit activations, $a$ heads) by Korthikanti et al.'s formulas
(their Table 2, `minipar.perf.activations.korthikanti_layer_bytes`) — computed, not measured here:
''', r'''
from minipar.perf.activations import korthikanti_layer_bytes

s, b, h, a = 2048, 1, 12288, 96          # GPT-3 175B layer
ts = np.array([1, 2, 4, 8])
tp_only = s * b * h * (10 + 24 / ts + 5 * a * s / (h * ts))
tp_sp = s * b * h * (34 / ts + 5 * a * s / (h * ts))
np.testing.assert_allclose(tp_only, [korthikanti_layer_bytes(s, b, h, a, t) for t in ts])
np.testing.assert_allclose(tp_sp, [korthikanti_layer_bytes(s, b, h, a, t, sp=True) for t in ts])
plt.figure(figsize=(6, 3.2))
plt.plot(ts, tp_only / 2**30, "o-", label="tensor parallel")
plt.plot(ts, tp_sp / 2**30, "s-", label="tensor + sequence parallel")
plt.xlabel("tensor-parallel ranks t"); plt.ylabel("GiB per layer per rank"); plt.xticks(ts); plt.legend()
plt.title("activation memory of one GPT-3 layer (s=2048, b=1)")
plt.show()
print("at t=8: {:.2f} GiB -> {:.2f} GiB".format(tp_only[-1] / 2**30, tp_sp[-1] / 2**30))
''', r'''%md
## Summary

* A column-parallel layer needs its input on every rank ($f$), a row-parallel layer sums partial
  products ($g$); pairing them (column then row) costs one all-reduce per sub-layer in each direction.
* Heads split across ranks; $q,k,v$ are sliced per third and per head; the vocabulary is split
  for both the embedding (masked lookup + all-reduce) and the loss (three numbers per row).
* Slicing one initialisation makes the parallel model *the same model*: float64 parity with the
  single process to ~1e-15.
* Per block and rank: $8\,b\,s\,h\,(t-1)/t$ elements, with or without sequence parallelism — counted.

In training (`mpiexec -n 4 python -m minipar train --tp 2 --sequence-parallel --precision fp64`),
`parallelize(model, config, grid)` swaps the layers (`TensorParallelGPT`), and the one optimizer step
(`minipar.parallel.step.Optimizer`) does the rest: `sync.finish()` averages over the data-parallel group,
`sum_partial_over_tp` sums the sequence-parallel partial gradients, the global norm counts a weight
replicated on the $t$ ranks once (`Placement.norm_weight` = $1/t$, summed over tp), AdamW updates the
local slices; checkpoints record each slice as a box of the plain GPT's tensor (by name), loadable by any layout.

## What changes on GPU nodes and at scale

- Tensor parallelism all-reduces activations twice per layer in forward and twice in backward, on the
  critical path. Inside an H100 node NVLink gives 450 GB/s per GPU per direction; across nodes
  InfiniBand gives 50 GB/s (the repository's H100 profile, spec sheet): 9× less, which is why tp stays
  within the 8 GPUs of a node. Runs set Megatron's `--tensor-model-parallel-size` to 8 or less by that
  convention, not because Megatron refuses more: where NVLink spans more GPUs (a 72-GPU NVL72 rack),
  tp can span them too.
- Sequence parallelism keeps the same bytes but turns each all-reduce into a reduce-scatter and an
  all-gather, and cuts the LayerNorm/dropout activations by t — it matters most at long sequences.

## In PyTorch / DeepSpeed / Megatron this is …

- **Megatron-Core**: `tensor_parallel.ColumnParallelLinear` / `RowParallelLinear` (`gather_output`,
  `input_is_parallel`), `VocabParallelEmbedding`, `vocab_parallel_cross_entropy`; $f$ and $g$ are
  `copy_to_tensor_model_parallel_region` and `reduce_from_tensor_model_parallel_region`, sequence
  parallelism's `gather_from_sequence_parallel_region` / `reduce_scatter_to_sequence_parallel_region`
  (`megatron/core/tensor_parallel/mappings.py`); `--tensor-model-parallel-size`, `--sequence-parallel`.
- **PyTorch**: DTensor's `torch.distributed.tensor.parallel` — `parallelize_module(module, mesh, plan)`
  with `ColwiseParallel()`, `RowwiseParallel()` and `SequenceParallel()`, on a `DeviceMesh`.
- **DeepSpeed**: tensor parallelism comes from Megatron (Megatron-DeepSpeed) or `deepspeed.init_inference`'s
  automatic tensor parallelism (`tensor_parallel={"tp_size": t}`); Ulysses is its sequence parallelism
  over heads (lesson 16's relative).
''']
