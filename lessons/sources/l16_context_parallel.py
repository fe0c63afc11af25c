"""Lesson 16: the cells of lessons/16_context_parallel.ipynb (``%md`` cells are markdown).

Edit here, then run ``python lessons/make_notebooks.py``."""
from launch import LAUNCH   # the cell that defines mpirun() for the lesson's runs

NOTEBOOK = "16_context_parallel.ipynb"

CELLS = [r'''%md
# 16 · Context parallelism: ring attention and Ulysses

Every parallelism so far splits the *model* (tensor, pipeline, ZeRO) or the *batch* (data). None of
them helps when **one sequence** is too long: the activations a rank keeps for backward grow with the
number of tokens it processes, $S$, and with the $S\times S$ attention scores if they are stored.
FlashAttention (lesson 11) removes the $S^2$ term; what is left is still $\propto S$ per layer, and at
$S = 128\text{K}$ tokens that alone overflows a GPU.

**Context parallelism** (CP) splits the sequence itself over the $C$ ranks of a cp group. Everything in
a transformer except attention works token by token — embeddings, LayerNorm, the MLP, the loss — so with
$S/C$ positions per rank they need **no communication** and their activations shrink by $C$. Attention
needs every earlier key. **Ring attention** passes the K/V blocks round a ring: at each of $C$ steps a rank
attends its queries to the block it holds, merges the partial result with the online-softmax rule, and
hands the block on to its neighbour (overlapped with the compute). In backward the blocks go round again,
each carrying its dK/dV accumulator home.

The causal mask makes a plain split unfair — the rank with the last positions attends to everything —
and the **zig-zag** split fixes that. This lesson measures all three claims: memory $\propto S/C$, the
ring's exactness, and the balance. Then the second family, **Ulysses**, which turns the sequence split
into a head split with two all-to-alls, and the two measured against each other on a cluster.

minipar: `minipar/parallel/context/` (`split.py`, `ring.py`, `ulysses.py`), `python -m minipar train
--cp C [--cp-split zigzag|contiguous] [--cp-kind ring|ulysses] [--cp-ulysses U]`, on a grid dp × cp × tp × pp whose gradients are averaged over dp × cp.
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
from minipar.parallel.context import ring, split
from minipar.parallel.context.split import chunks_of, positions_of, work_units

%matplotlib inline
''' + LAUNCH, r'''%md
## 1. Run the lesson's script on two ranks

`16_context_parallel.py` runs under `mpiexec -n 2` and measures everything at once (a few seconds):

1. **exactness** — `RingAttentionCore` forward and backward (float64) against attention over the whole
   sequence on one process;
2. **memory** — the activation bytes of a small GPT (2 layers, $d = 32$, batch 2) at $S = 128 \ldots 1024$,
   read from `minipar.backend.memory` (the peak during forward + backward minus what was live before):
   one process with naive and with flash attention, and cp = 2 with ring attention;
3. **balance** — ring attention forward + backward at $S = 2048$ with both splits, every chunk-pair
   call (`ring.pair_forward` / `ring.pair_backward`) timed, so each rank reports its *busy* time apart
   from its wall time.
''', r'''
out_json = os.path.join(tempfile.mkdtemp(), "cp.json")
mpirun(2, ["16_context_parallel.py", "--backend", BACKEND, "--json", out_json, "--seq", 2048])
result = json.load(open(out_json))
for split_name, err in result["exact"].items():
    print(f"{split_name:10s} max |ring - whole sequence|: " + ", ".join(f"{k} {v:.1e}" for k, v in err.items()))
    assert max(err.values()) < 1e-12
''', r'''%md
The ring's output and all three gradients equal single-process attention to float64 rounding, for
both splits: context parallelism changes where the work is done, not what is computed.

## 2. Why long context needs it: activation memory against $S$
''', r'''
mem = result["memory"]
seqs = np.array(mem["seqs"])
naive, flash = np.array(mem["cp1_naive"]), np.array(mem["cp1_flash"])
cp2 = np.array(mem["cp2"])                       # (len(seqs), 2 ranks)
MiB = 2**20
print(f"{'S':>6} {'cp=1 naive':>11} {'cp=1 flash':>11} {'cp=2 rank 0':>12} {'rank 1':>8} {'cp2/cp1':>8}")
for s, a, b, (r0, r1) in zip(seqs, naive, flash, cp2):
    print(f"{s:6d} {a / MiB:9.2f} Mi {b / MiB:9.2f} Mi {r0 / MiB:10.2f} Mi {r1 / MiB:6.2f} Mi {max(r0, r1) / b:8.3f}")
assert (cp2[:, 0] == cp2[:, 1]).all()                              # the ranks hold the same
np.testing.assert_allclose(cp2.max(axis=1) / flash, 0.5, rtol=0.05)   # 1/C per rank
np.testing.assert_allclose(flash[1:] / flash[:-1], 2, rtol=0.05)       # flash: linear in S
assert (naive[1:] / naive[:-1] > 2.5).all()                            # naive: the S^2 scores

fig, ax = plt.subplots(figsize=(6.5, 4))
ax.loglog(seqs, naive / MiB, "o-", label="cp=1, naive attention (stores S×S scores)")
ax.loglog(seqs, flash / MiB, "s-", label="cp=1, flash attention")
ax.loglog(seqs, cp2.max(axis=1) / MiB, "^-", label="cp=2, ring attention, per rank")
ax.loglog(seqs, flash / 2 / MiB, "k:", label="cp=1 flash / C")
ax.minorticks_off(); ax.set_xticks(seqs, [str(s) for s in seqs])
ax.set_xlabel("sequence length S (tokens)"); ax.set_ylabel("activation memory per rank (MiB)")
ax.set_title("GPT 2×32, batch 2, fp32: measured by minipar.backend.memory")
ax.legend(fontsize=8); plt.show()
''', r'''%md
Three regimes, all measured:

* **naive attention** stores the softmax probabilities, $B\cdot H\cdot S^2$ per layer: the curve bends
  up (slope 2 on the log-log plot);
* **flash attention** stores only $q, k, v, o$ and the log-sum-exp: a straight line, memory $\propto S$ —
  doubling $S$ doubles it exactly;
* **ring attention at cp = 2** holds half of every activation per rank, exactly $1/C$ of the flash line.
  The ring never materialises more than one $(S/2C)\times(S/2C)$ score block at a time, and what it saves
  for backward is the same as flash's — its own $q, k, v$, the output and the log-sum-exp.

At real scale the $\propto S$ line is enormous. Llama 3 405B has 126 layers, $d$ = 16 384 and an MLP of
53 248 (3.25$d$), in bf16: even with flash attention a layer keeps about $38.5\,d$ bytes per token for
backward (its two norms' inputs and outputs, $q$ and the grouped $k, v$ at $2.5d$, the attention output,
the gate and up projections at $13d$, SiLU's output and the product at $13d$) — about 630 KB per token per
layer, **80 MB per token, ≈ 10 TB for one sequence of 128K tokens**. Full recomputation, keeping only each
layer's input ($2d$ bytes per token per layer), still leaves ≈ 0.5 TB — against 141 GB on an H200. Tensor
parallelism with sequence parallelism divides it by $t$ (lesson 07), pipeline stages by the layers each
holds, recomputation trades it for compute (lesson 10); CP is the knob that divides *all* of it by $C$ and
keeps working as $S$ grows — the Llama 3 paper's 128K stage ran tp 8 × cp 16 × pp 16.

## 3. The ring

Rank $r$ starts with its own K/V block. At step $t$ it holds the block of rank $(r - t) \bmod C$: it
starts sending that block on to $r+1$ (non-blocking), attends its queries to it, merges, and by the
time it is done the next block has arrived from $r-1$. After $C$ steps every query has seen every key.
''', r'''
C = 4
owner = np.array([[(r - t) % C for t in range(C)] for r in range(C)])
fig, ax = plt.subplots(figsize=(6.5, 3.6))
im = ax.imshow(owner, cmap=plt.get_cmap("tab10", 10), vmin=-0.5, vmax=9.5, aspect="auto")
for r in range(C):
    for t in range(C):
        a, b = chunks_of(owner[r, t], C, True)
        ax.text(t, r, f"K/V of {owner[r, t]}\nchunks {a},{b}", ha="center", va="center", fontsize=8,
                color="white")
ax.set_xticks(range(C), [f"step {t}" for t in range(C)]); ax.set_yticks(range(C), [f"rank {r}" for r in range(C)])
ax.set_xlabel("ring step t (each step: send the block to r+1, receive from r−1)")
ax.set_ylabel("rank r (its queries stay put)")
cbar = fig.colorbar(im, ax=ax, ticks=range(C), boundaries=np.arange(-0.5, C + 0.5))
cbar.set_label("rank whose K/V block is held")
ax.set_title(f"C = {C}, zig-zag split: the K/V block each rank holds at each step")
plt.tight_layout(); plt.show()
assert all(sorted(owner[r]) == list(range(C)) for r in range(C))   # every rank sees every block once
assert all(sorted(owner[:, t]) == list(range(C)) for t in range(C)) # and each block is in one place
''', r'''%md
Each column is a permutation (every block is in exactly one place) and each row too (every rank sees
every block once). The cost: each rank sends $C-1$ K/V blocks of $2\cdot B\cdot(S/C)\cdot d$ elements
each, so $2\cdot B\cdot S\cdot d\,(C-1)/C$ per layer in forward (backward sends them round again, with
their dK/dV) — a volume per rank that does *not* shrink as $C$ grows: every rank still sees all of K and V.
Per step a rank sends $\propto S/C$ and computes $\propto (S/C)^2$, so the longer the local sequence
$S/C$, the better the transfer hides behind the compute. Here is the forward of minipar's `RingAttention`:
''', r'''
print(inspect.getsource(ring.RingAttention.forward))
''', r'''%md
Backward (`RingAttention.backward`) needs only the final `(out, lse)`: like FlashAttention's backward it
rebuilds each block's probabilities as $P = e^{S - L}$, so every chunk pair gives its part of dQ, dK and
dV independently. The K/V blocks travel round once more, each with a dK/dV accumulator that the ranks add
to; after $C$ hops every accumulator is back with the rank that owns those keys.

## 4. Exercise — the online-softmax merge

A chunk pair gives, for each query row, the attention output $o_t$ over *that block's* keys and the
log-sum-exp of its scores $\ell_t = \log\sum_{j\in t} e^{s_j}$. The running result $(o, L)$ over the
blocks seen so far absorbs it with

$$L' = \log\left(e^{L} + e^{\ell_t}\right), \qquad o' = o\, e^{L - L'} + o_t\, e^{\ell_t - L'},$$

because $o$ is a softmax-weighted average whose weights over the union of key sets renormalise by exactly
those factors. It starts from $o = 0$, $L = -\infty$, and it is associative and commutative, so the order
the blocks arrive in does not matter.

Write `my_merge(out, lse, o, l)`: `out` (B, H, n, d) and `lse` (B, H, n) are the running result and must be
updated **in place** (the ring passes views of its buffers, `out[:, :, rows]`); `o`, `l` are one block's.
Careful: scores can be large — $e^{L}$ overflows long before $L$ does. It is checked against minipar's
`ring.merge` and against full causal softmax attention.
''', r'''
def full_attention(q, k, v):
    """(softmax(q kᵀ/√d + causal mask) v, log-sum-exp of each row) on one process."""
    s = q @ k.transpose(0, 1, 3, 2) / np.sqrt(q.shape[-1])
    s = np.where(np.tril(np.ones(s.shape[-2:], bool)), s, -np.inf)
    m = s.max(axis=-1, keepdims=True)
    p = np.exp(s - m)
    return (p / p.sum(axis=-1, keepdims=True)) @ v, (m + np.log(p.sum(axis=-1, keepdims=True)))[..., 0]

def check_merge(fn, blocks=4, seed=0):
    for scale in (1.0, 300.0):                     # 300: scores of ~1e3, e^L overflows float64
        rng = np.random.default_rng(seed)
        q, k, v = (rng.standard_normal((1, 2, 24, 8)) for _ in range(3))
        q = q * scale
        ref, ref_lse = full_attention(q, k, v)
        n = 24 // blocks
        mine, lib = np.zeros_like(q), np.zeros_like(q)
        mine_lse, lib_lse = np.full(q.shape[:3], -np.inf), np.full(q.shape[:3], -np.inf)
        for i in range(blocks):                    # query block i sees key blocks 0..i
            rows = slice(i * n, (i + 1) * n)
            for j in rng.permutation(i + 1):       # in any order
                cols = slice(j * n, (j + 1) * n)
                o, l = ring.pair_forward(q[:, :, rows], k[:, :, cols], v[:, :, cols], "naive", i == j)
                fn(mine[:, :, rows], mine_lse[:, :, rows], o, l)          # a view, updated in place
                ring.merge(lib[:, :, rows], lib_lse[:, :, rows], o, l)
        assert np.isfinite(mine).all() and np.isfinite(mine_lse).all(), f"overflow at scale {scale}"
        np.testing.assert_allclose(mine, lib, rtol=1e-12, atol=1e-12, err_msg="against ring.merge")
        np.testing.assert_allclose(mine_lse, lib_lse, rtol=1e-12, err_msg="lse against ring.merge")
        np.testing.assert_allclose(mine, ref, rtol=1e-10, atol=1e-12, err_msg="against full attention")
        np.testing.assert_allclose(mine_lse, ref_lse, rtol=1e-12, err_msg="lse against full attention")
    return "correct: equals ring.merge and full softmax attention, in any block order"

''', r'''%exercise merge
def my_merge(out, lse, o, l):
    raise NotImplementedError("hint: the formula above, computed so that no exponential can overflow — "
                              "what can you subtract from both exponents first? and `out` must change in place")
''', r'''
print(check_merge(my_merge))      # the solution is in lessons/solutions/16_context_parallel.py
print(inspect.getsource(ring.merge))
''', r'''%md
minipar's version uses `logaddexp`, which does the same max-subtraction inside. (ring-flash-attention and
picotron write the same update as `out - sigmoid(l - L)·(out - o)`, `L - logsigmoid(L - l)`.)

## 5. Exercise — the ring, on four ranks

Now the loop around your merge, with real messages. Write `ring_attention(comm, q, k, v)` for the
**contiguous** split: rank $r$ holds the $r$-th block of the sequence's queries, keys and values, each
(B, H, n, d); return its queries' causal attention over the whole sequence and the log-sum-exp of every
row, `(out, lse)`. At each of the $C$ steps attend to the K/V block you hold — `pair_forward(q, k, v,
"naive", diagonal)` gives one block's `(o, l)`, causally masked when `diagonal` — merge it in, and pass
the block on round the ring with `comm.sendrecv(send, dest, recv, source)`. Blocks that lie wholly in
a query block's future add nothing (skip their compute, but they still travel on), and a block that has
reached its last holder need not be sent again. The merge goes in the file too: it is your `my_merge`.

`16_yours.py` runs it on 4 ranks in float64 and compares every rank's `out` and `lse` with one process's
causal attention. When they differ it finds which key blocks your result *does* cover (it tries every
subset of the blocks the rank must see), and it counts the bytes each rank sent against $C-1$ K/V blocks.
''', r'''%exercise ring_loop
%%writefile {MINE}/ring.py
"""Your ring attention (lesson 16): run under mpiexec by 16_yours.py."""
from minipar.backend import xp
from minipar.parallel.context.ring import pair_forward


def merge(out, lse, o, l):
    """The online-softmax merge of one block's (o, l) into the running (out, lse), in place
    (your my_merge of §4)."""
    raise NotImplementedError("your my_merge of §4")


def ring_attention(comm, q, k, v):
    """Causal attention of my query block over the whole sequence; (out, lse)."""
    out, lse = xp.zeros_like(q), xp.full(q.shape[:3], -xp.inf)
    return out, lse
''', r'''
proc = mpirun(4, ["16_yours.py", "--file", f"{MINE}/ring.py", "--backend", BACKEND])
print(proc.stdout)
''', r'''%md
The library's loop (printed in §3) differs in two ways that matter for speed: the next block's transfer
is started *before* the current block is computed (non-blocking send and receive, waited for after the
compute), so the ring hides behind attention when $S/C$ is long enough; and with the zig-zag split of §6
every rank has the same work at every step.

## 6. The causal imbalance, and the zig-zag fix

Cut the sequence into $2C$ chunks. Under the causal mask query chunk $a$ attends key chunk $b$ fully if
$b < a$, on its diagonal (half of the pairs) if $b = a$, not at all if $b > a$. The **contiguous** split
gives rank $r$ chunks $2r, 2r+1$: rank 0 attends to almost nothing, the last rank to everything. The
**zig-zag** split gives rank $r$ chunks $r$ and $2C-1-r$ — an early and a late one:
''', r'''
print(inspect.getsource(split.work_units))
''', r'''%md
**Exercise — the zig-zag split.** Write `my_chunks_of(rank, cp)`: the two chunk indices (of the $2C$)
that rank `rank` holds under the zig-zag split, early one first. It is checked against `split.chunks_of`,
and the check also counts each rank's work with your split: it must be the same on every rank.
''', r'''%exercise zigzag
def my_chunks_of(rank, cp):
    raise NotImplementedError("hint: which early chunk's missing work does which late chunk make up for? "
                              "count the key chunks each query chunk attends to")
''', r'''
for cp in range(1, 7):
    for r in range(cp):
        assert tuple(my_chunks_of(r, cp)) == split.chunks_of(r, cp, True), (r, cp)
    held = sorted(c for r in range(cp) for c in my_chunks_of(r, cp))
    assert held == list(range(2 * cp)), "every chunk exactly once"
print("correct: the zig-zag chunks, each chunk once, the same work on every rank:",
      [work_units(r, 4, True) for r in range(4)])
print(inspect.getsource(split.chunks_of))
''', r'''
C = 4
fig, axes = plt.subplots(1, 3, figsize=(13, 3.8), gridspec_kw=dict(width_ratios=[1, 1, 1.2]))
for ax, zigzag in zip(axes[:2], (False, True)):
    rank_of = {c: r for r in range(C) for c in chunks_of(r, C, zigzag)}
    grid = np.full((2 * C, 2 * C), np.nan)
    for a in range(2 * C):
        for b in range(a + 1):
            grid[a, b] = rank_of[a]                # the rank holding query chunk a computes it
    im = ax.imshow(grid, cmap=plt.get_cmap("tab10", 10), vmin=-0.5, vmax=9.5)
    for a in range(2 * C):
        ax.text(a, a, "½", ha="center", va="center", color="white", fontsize=9)
    ax.set_xlabel("key chunk b"); ax.set_ylabel("query chunk a")
    ax.set_title(("zig-zag" if zigzag else "contiguous") + f" split, C = {C}")
    cbar = fig.colorbar(im, ax=ax, ticks=range(C), boundaries=np.arange(-0.5, C + 0.5), shrink=0.8)
    cbar.set_label("rank computing the pair")
x = np.arange(C)
contiguous = [work_units(r, C, False) for r in range(C)]
zigzag = [work_units(r, C, True) for r in range(C)]
axes[2].bar(x - 0.2, contiguous, 0.4, label="contiguous: 4r + 2")
axes[2].bar(x + 0.2, zigzag, 0.4, label="zig-zag: 2C")
axes[2].set_xticks(x, [f"rank {r}" for r in x]); axes[2].set_ylabel("work_units (chunk pairs, diagonal = ½)")
axes[2].set_title("attention work per rank"); axes[2].legend(fontsize=8)
plt.tight_layout(); plt.show()
print("contiguous:", contiguous, " zig-zag:", zigzag)
assert zigzag == [2.0 * C] * C and contiguous == [4.0 * r + 2 for r in range(C)]
assert sum(zigzag) == sum(contiguous)
''', r'''%md
The same total work; contiguous puts $4C-2$ units on the last rank against a mean of $2C$ — the step
waits for it, so at large $C$ the contiguous split runs at almost half speed. Zig-zag gives every rank
$2C$ (the pair of chunks sums to $2C-1$).

Now measured, at cp = 2 ($S = 2048$, 4 heads × 32, the flash kernel per chunk pair, which skips the masked
tiles of a diagonal pair). Predicted: contiguous 2 and 6 units, zig-zag 4 and 4, so the zig-zag step
should take $4/6 \approx 0.67$ of the contiguous one.
''', r'''
bal, tm = result["balance"], result["timing"]
print(f"ring attention fwd + bwd, causal, S = {tm['seq']}, {tm['heads']} heads × {tm['head_dim']}, "
      f"cp = 2, '{tm['kind']}' pairs; best of 3")
for name in ("contiguous", "zigzag"):
    ranks = bal[name]
    busy = [r["busy"] for r in ranks]
    print(f"  {name:10s} busy " + ", ".join(f"{b * 1e3:6.1f} ms" for b in busy)
          + f"   busy max/min {max(busy) / min(busy):4.2f}   wall (the step) "
          + ", ".join(f"{r['wall'] * 1e3:6.1f} ms" for r in ranks)
          + f"   units {[work_units(r, 2, name == 'zigzag') for r in range(2)]}")
step = {name: max(r["wall"] for r in bal[name]) for name in bal}
busy = {name: [r["busy"] for r in bal[name]] for name in bal}
print(f"  zig-zag step / contiguous step: {step['zigzag'] / step['contiguous']:.2f}  (predicted 4/6 = 0.67)")
# timings are shown, not asserted (they vary with the machine's load); the work counts above
# are what is asserted
print("contiguous: last rank / first rank busy", f"{busy['contiguous'][1] / busy['contiguous'][0]:.2f}",
      "  zig-zag: max / min busy", f"{max(busy['zigzag']) / min(busy['zigzag']):.2f}")

fig, axes = plt.subplots(2, 1, figsize=(10, 3.8), sharex=True)
colors = {("F", False): "#4C72B0", ("F", True): "#A1C4E8", ("B", False): "#DD8452", ("B", True): "#F2C19E"}
for ax, name in zip(axes, ("contiguous", "zigzag")):
    for r, rank in enumerate(bal[name]):
        for phase, diagonal, start, end in rank["calls"]:
            ax.barh(r, (end - start) * 1e3, left=start * 1e3, color=colors[(phase, diagonal)],
                    edgecolor="k", linewidth=0.3)
        ax.plot([rank["wall"] * 1e3] * 2, [r - 0.4, r + 0.4], "k-", lw=2)
    ax.set_yticks([0, 1], ["rank 0", "rank 1"]); ax.set_title(f"{name} split, chunks "
                                                             f"{[chunks_of(r, 2, name == 'zigzag') for r in range(2)]}",
                                                             fontsize=9)
axes[-1].set_xlabel("time since the barrier (ms); black tick: the rank's wall time; gaps: waiting")
handles = [plt.Rectangle((0, 0), 1, 1, color=c) for c in colors.values()]
fig.legend(handles, ["forward pair", "forward diagonal", "backward pair", "backward diagonal"],
           loc="upper right", fontsize=8, ncol=4)
plt.tight_layout(rect=(0, 0, 1, 0.93)); plt.show()
''', r'''%md
Each box is one chunk-pair kernel call. With the contiguous split rank 0 holds chunks 0, 1: at step 1 it
receives rank 1's block (chunks 2, 3) and has nothing to do with it — its queries come earlier — so it sits
waiting while rank 1 attends chunks 2, 3 to all four. The wall times are almost equal *anyway*: the fast
rank waits for the dK/dV accumulators to come round, so imbalance shows as idle time, never as a faster
step. Zig-zag gives both ranks one diagonal-heavy early chunk and one late chunk: the same boxes on both
rows. (On a loaded two-core machine the times are noisy; the busy ratios are the robust part.)

## 7. Training with `--cp 2`: the same run as one process

`python -m minipar train --cp 2` swaps every block's attention core for `RingAttentionCore`
(`apply_context_parallel`), feeds each rank its positions of every sequence (`model.token_positions`
picks the right position embeddings), and averages gradients over dp × cp: a rank's loss is the mean over
its positions, and the cp ranks hold equally many. A few float64 steps against one process:
''', r'''
MODEL = ["--model", "tiny", "--n-layer", "2", "--d-model", "16", "--n-head", "2", "--seq-len", "64",
         "--attention", "flash"]
COMMON = ["--precision", "fp64", "--seed", "0", "--quiet", "--eval-batches", "0", "--steps", "4",
          "--batch-size", "4"]
runs = {}
tmp = tempfile.mkdtemp()
for name, n, flags in (("one process", 1, []), ("cp=2 zig-zag", 2, ["--cp", "2"]),
                       ("cp=2 contiguous", 2, ["--cp", "2", "--cp-split", "contiguous"])):
    log = os.path.join(tmp, name.replace(" ", "_").replace("=", "") + ".json")
    mpirun(n, ["-m", "minipar", "train", *MODEL, *COMMON, "--log-json", log, *flags])
    runs[name] = step_records(log)
ref = np.array([r["loss"] for r in runs["one process"]])
for name, recs in runs.items():
    losses = np.array([r["loss"] for r in recs])
    rel = np.max(np.abs(losses - ref) / ref)
    peaks = recs[-1]["peak_mem_bytes_per_rank"]
    print(f"{name:16s} losses " + " ".join(f"{v:.15f}" for v in losses) + f"   max rel diff {rel:.1e}"
          + "   peak_mem_bytes per rank " + ", ".join(f"{p / MiB:.2f} MiB" for p in peaks))
    np.testing.assert_allclose(losses, ref, rtol=1e-12, atol=0)
''', r'''%md
The losses agree to float64 rounding ($\sim 10^{-16}$, a different summation order), and the training
log's own `peak_mem_bytes` (which includes the weights, gradients and AdamW state that CP does not split)
falls to about half on each cp rank. The test suite checks the same parity — weights and Adam moments too —
for cp 2 and 4, and for cp composed with dp, tp, pp, ZeRO-3 and recomputation
(`tests/test_context_parallel.py`).

## 8. The second family: Ulysses

The ring keeps each rank's queries and moves the keys. **DeepSpeed-Ulysses** moves the *layout*
instead. Attention is independent per head, so before it one **all-to-all** turns "my $S/U$ positions of
all $H$ heads" into "all $S$ positions of my $H/U$ heads"; attention then runs whole — any kernel, no
online-softmax merge, no mask bookkeeping — and a second all-to-all turns the output back into "my
positions, all heads" for the projection and the MLP. Backward is the same two swaps in reverse (the
gradient of an all-to-all is the inverse all-to-all). q, k and v travel in one all-to-all, so a layer
makes two forward and two backward.

An all-to-all keeps $1/U$ of a rank's block and sends the rest. Per rank, one layer, forward and
backward, with $e$ bytes a number and $H_{kv}' = \max(H_{kv}, U)$ the key/value heads that travel:

$$\text{Ulysses: } 4\,(H + H_{kv}')\,B\,\tfrac{S}{C}\,d\,e\,\tfrac{U-1}{U} \qquad
\text{ring: } (3C-2)\cdot 2\,B\,H_{kv}\,\tfrac{S}{C}\,d\,e$$

The ring's volume stays $\approx 6\,B\,H_{kv}\,S\,d\,e$ whatever $C$; Ulysses' falls as $1/C$ — but it
moves the queries and outputs too, so with few KV heads (GQA) the ring can send less. And Ulysses'
degree is capped by the heads: $U$ must divide $H$, and each rank must get whole KV heads (with fewer KV
heads than $U$ each is repeated $U/H_{kv}$ times before the swap, as verl does). The **hybrid** (USP)
runs Ulysses inside groups of $U$ ranks — a node, where all-to-all is cheap — and the ring across the
$C/U$ groups, with its zig-zag split: `--cp-kind ulysses --cp-ulysses U`. The formula is minipar's
`ulysses.bytes_per_rank`, which the test suite checks against the bytes the transport counts:
''', r'''
from minipar.parallel.context import ulysses

B_, S_, d_ = 1, 8192, 128                                  # one sequence of 8K tokens, bf16
print(f"bytes per rank for one attention layer, forward + backward, B=1, S={S_}, d={d_}, bf16, C = 8:")
print(f"{'heads':>14} {'ring':>10} {'Ulysses U=8':>12} {'hybrid U=4':>11} {'hybrid U=2':>11}")
for h, kv in ((32, 32), (32, 8), (32, 2)):
    row = [ulysses.bytes_per_rank(B_, h, kv, S_, d_, 2, 8, u) for u in (1, 8, 4, 2)]
    print(f"H={h:2d}, H_kv={kv:2d} {row[0] / 2**20:9.1f}M" + "".join(f" {b / 2**20:10.1f}M" for b in row[1:]))
mha = [ulysses.bytes_per_rank(B_, 32, 32, S_, d_, 2, 8, u) for u in (1, 8)]
gqa = [ulysses.bytes_per_rank(B_, 32, 2, S_, d_, 2, 8, u) for u in (1, 8)]
assert mha[1] < mha[0] / 3 and gqa[1] > gqa[0]     # MHA: Ulysses far less; 2 KV heads: the ring less
''', r'''%md
Bytes are not the whole price: the ring sends to one neighbour and hides each hop behind a block of
attention, while an all-to-all talks to every rank of the group at once and waits for all of it — across a
slow link between nodes it pays the slow link in full. Which wins depends on the links, the heads and the
sequence: what §10 measures and the performance model predicts.

## 9. Exercise — the sequence ↔ head swap, on four ranks

Write the two swaps with minipar's `all_to_all(comm, send, counts)`: `send`'s first `counts[0]` rows go to
rank 0, the next `counts[1]` to rank 1, …, and it returns `(received, recv_counts)` with rank 0's rows
first (a "row" may be a whole block: `send` of shape `(U, …)` with `counts = [1] * U` sends block `t` to
rank `t`). Rank $r$ holds the $r$-th contiguous block of $n$ positions.

* `sequence_to_heads(comm, x)`: `x` (B, H, n, d) → (B, H/U, U·n, d), every rank's positions of heads
  $rH/U \ldots (r+1)H/U - 1$, in rank order;
* `heads_to_sequence(comm, y)`: the inverse.

`16_yours.py` runs them on 4 ranks (8 heads, float64): each swap against the heads and
positions it must hold (naming which rank's positions of which heads landed in each block when they do
not), its bytes against $(U-1)/U$ of the block, the round trip, and attention run whole on each rank's
two heads between the swaps against one process's causal attention — beside the library's
`UlyssesAttentionCore`.
''', r'''%exercise ulysses_swap
%%writefile {MINE}/ulysses.py
"""Your Ulysses swaps (lesson 16): run under mpiexec by 16_yours.py."""
from minipar.backend import xp
from minipar.comm import all_to_all


def sequence_to_heads(comm, x):
    """(B, H, n, d), my n positions of every head -> (B, H/U, U·n, d), every rank's
    positions of my H/U heads."""
    return x


def heads_to_sequence(comm, y):
    """The inverse: (B, H/U, U·n, d) -> (B, H, n, d)."""
    return y
''', r'''
proc = mpirun(4, ["16_yours.py", "--file", f"{MINE}/ulysses.py", "--backend", BACKEND])
print(proc.stdout)
print(inspect.getsource(ulysses.UlyssesAttentionCore.forward))
''', r'''%md
The library's swap differs from yours in one way: a rank holds *two* pieces of the sequence, not one
block (`ulysses_positions`) — piece $u$ of each of its group's two zig-zag chunks — so that after the
swap a Ulysses group holds exactly what one rank of the ring holds, and the ring can run across the
groups. With $U = C$ the ring is one rank and the two pieces are the halves of the sequence.

## 10. Ring, Ulysses and the hybrid on a cluster

Lesson 20's simulated cluster: 2 nodes × 2 ranks, a 1 Gbit/s link between them, a small model
(2 layers, $d$ = 64, 4 heads) on 2,048-token sequences, cp = 4 three ways. `benchmarks/cluster_ulysses.py`
calibrates a profile on the cluster, measures each layout's step time, sets it beside the performance
model's (`perf/context.py`: two all-to-alls each way for Ulysses, the ring's hops overlapped with its
chunk pairs), and asks `plan` to rank them. Its three recorded runs:
''', r'''
RECORDED = os.path.join(ROOT, "benchmarks", "recorded", "cluster_ulysses_2026-12-07")
tables = {}
for run in ("run1", "run2", "run3"):
    text = open(os.path.join(RECORDED, run + ".txt")).read()
    print(f"--- {run}.txt\n{text}")
    tables[run] = {}
    for line in text.splitlines():
        parts = line.split()
        if parts and parts[0] in ("ring", "ulysses", "hybrid") and parts[-1].endswith("%"):
            tables[run][parts[0]] = (float(parts[-3]), float(parts[-2]))     # measured, predicted ms
    assert set(tables[run]) == {"ring", "ulysses", "hybrid"}

S_, b_, heads_, C_ = 2048, 4, 4, 4                          # the recorded runs' shape
def scores_per_rank(u):
    """Attention scores one rank computes per layer: the ring's 2R+1 chunk pairs (R = C/U), or
    (R = 1) the whole sequence, on heads/U heads."""
    ring_ = C_ // u
    if ring_ == 1:
        return b_ * heads_ // u * S_ * S_
    return b_ * heads_ // u * (2 * ring_ + 1) * (S_ // (2 * ring_)) ** 2
for name, u in (("ring", 1), ("ulysses", 4), ("hybrid", 2)):
    sent = ulysses.bytes_per_rank(b_, heads_, heads_, S_, 16, 4, C_, u)
    print(f"{name:8s} scores per rank per layer {scores_per_rank(u) / 1e6:5.1f} M, bytes sent per layer "
          f"{sent / 2**20:5.2f} MiB; measured / predicted ms: "
          + ", ".join(f"{run} {t[name][0]:.0f} / {t[name][1]:.0f}" for run, t in tables.items()))
''', r'''
import shutil

def can_build_a_cluster():
    if os.geteuid() != 0 or not shutil.which("ip") or not shutil.which("tc"):
        return False
    probe = subprocess.run(["ip", "netns", "add", "mpl16-probe"], capture_output=True)
    subprocess.run(["ip", "netns", "del", "mpl16-probe"], capture_output=True)
    return probe.returncode == 0

def cluster(*args):
    return subprocess.run([sys.executable, "-m", "minipar", "cluster", *args], capture_output=True,
                          text=True, env=ENV, cwd=ROOT, timeout=600)

if can_build_a_cluster():        # measured here too: forward + backward, 1,024 tokens, one launch
    cluster("down", "--prefix", "mpl16")
    up = cluster("up", "--prefix", "mpl16", "--nodes", "2", "--ranks-per-node", "2", "--inter-gbps", "1")
    assert up.returncode == 0, up.stderr
    try:
        out_json = os.path.join(tempfile.mkdtemp(), "families.json")
        run = cluster("run", "--prefix", "mpl16", "--", "lessons/16_context_parallel.py", "--families",
                      "--seq", "1024", "--repeats", "2", "--json", out_json, "--backend", BACKEND)
        assert run.returncode == 0, run.stderr[-2000:]
        live = json.load(open(out_json))
        print("measured here on the cluster, forward + backward of the same model at 1,024 tokens "
              "(16_context_parallel.py --families): " + ", ".join(f"{k} {v * 1e3:.0f} ms" for k, v in live.items()))
    finally:
        cluster("down", "--prefix", "mpl16")
else:
    print("no root / ip / tc here: the recorded figures above are the measurement")
''', r'''%md
Read the tables for three things. First, the measurements: the same order in all three runs, the
ring first and Ulysses last. Second, the predictions, from profiles calibrated on the cluster just
before: they are not within 15% here, because these runs shared two cores with other work (a load
average near 10, CPU time the model does not know of) and the calibrations disagree with each other
— a waiting rank's CPU share 0.22 in run 1's and 0.77 in run 2's, which turns the model's core-sharing
slowdown off and on (`perf/host.py`). A performance model
is only as good as its profile: on a quiet machine the same script tests it. Third, why the ring wins
on this CPU: with 16-dimension heads the price is set by the attention compute more than by the link: the naive kernel computes every score of a
block, masked or not, so Ulysses — the whole sequence on one head — computes $S^2$ scores per head,
where the ring skips the chunk pairs wholly in the future (its $R$ ranks compute $2R+1$ pairs each,
about half of the $4R^2$); and
Ulysses' swaps with $U = 4$ cross the 1 Gbit/s link in every round, where the hybrid's stay inside a
node and only the ring's hops cross. With a kernel that skips masked tiles, more heads, a longer
sequence or a faster link the order can change: which is why the choice is the performance model's,
not a rule — `plan` ranks the layouts by its predictions and `--layout auto` runs the first, so its
choice is as good as the profile (runs 1 and 3 picked the ring, run 2 the hybrid).

## Takeaways

- Activation memory grows $\propto S$ (flash) or $\propto S^2$ (naive); context parallelism divides it
  by $C$ — measured: exactly half per rank at cp = 2, at every $S$.
- Ring attention passes K/V blocks round the cp ranks ($C$ steps, transfers overlapped with compute) and
  merges partial results with the online-softmax rule $L' = \operatorname{logaddexp}(L, \ell)$,
  $o' = o\,e^{L-L'} + o_t\,e^{\ell-L'}$; it is exact.
- Under the causal mask a contiguous split loads the last rank with $4C-2$ units against a mean of $2C$;
  zig-zag (chunks $r$ and $2C-1-r$) evens it out — at cp = 2 the predicted work is 1 : 3 (2 and 6 units)
  against 1 : 1; §6 prints the measured busy times beside it.
- Ulysses swaps positions for heads with two all-to-alls each way: its bytes per rank fall as $1/C$ but
  it moves q and the output too, its degree is capped by the heads, and an all-to-all across a slow
  link pays it in full; the hybrid keeps the swaps inside a node and the ring across nodes.

## The names you will meet

* **Megatron-LM / Megatron-Core**: *context parallelism*, `--context-parallel-size` (`context_parallel_size`
  in `ModelParallelConfig`), the attention itself in Transformer Engine; `--cp-comm-type p2p` is this ring
  (also `a2a` — Ulysses-style all-to-all over heads —, `allgather`, and hierarchical `a2a+p2p`). It
  requires `seq_length % (2 · cp) == 0` for the same reason as minipar: two load-balancing chunks per rank.
* **Llama 3** ("The Llama 3 Herd of Models", 2024): CP for long-context training up to 128K tokens, the
  sequence cut into $2\times$CP chunks with rank $i$ holding chunks $i$ and $2\times\text{CP}-1-i$ — the
  zig-zag split — but with an **all-gather** of K and V instead of a ring, since with GQA they are small.
* **picotron** (Hugging Face's minimal 4D trainer): `cp_size`, `picotron/context_parallel/`
  (`RingAttentionFunc`, `ContextCommunicate`, `update_out_and_lse`), after **ring-flash-attention**
  (`zigzag_ring_flash_attn_func`).
* **DeepSpeed**: `DistributedAttention` (`deepspeed/sequence/layer.py`), Ulysses' two all-to-alls around
  any local attention. **verl** and **yunchang** (USP: Fang & Zhao 2024, *A Unified Sequence Parallelism
  Approach for Long Context Generative AI*): the hybrid, a Ulysses degree × a ring degree; verl repeats
  KV heads that are fewer than the degree, as minipar does, where Megatron's `a2a` refuses them.
* **PyTorch**: `torch.distributed.tensor.experimental.context_parallel` (a context manager that shards
  buffers along the sequence and rotates K/V by all-gather or all-to-all), used by TorchTitan.
* **Papers**: Liu, Zaharia & Abbeel 2023, *Ring Attention with Blockwise Transformers for Near-Infinite
  Context*; Brandon et al. 2023, *Striped Attention* (tokens dealt round-robin to the ranks, another cure
  for the causal imbalance); Jacobs et al. 2023, *DeepSpeed Ulysses* (the all-to-all alternative);
  Korthikanti et al. 2022 for activation memory per token.
''', r'''%md
## What changes on GPU nodes and at scale

With GQA, keys and values are small beside the queries, so the ring's messages are cheap next to the
$(S/C)^2$ attention compute. From the repository's **H200 profile** (data sheet × efficiency, a model),
for a Llama-3-405B-shaped layer ($h$ = 16 384, 8 K/V heads of 128) at 128K tokens:
''', r'''from minipar.perf.comm import collective_seconds
from minipar.perf.profile import load_profile

h200 = load_profile("h200")
h, kv, S = 16384, 8 * 128, 128 * 1024
for C, where in ((8, "intra"), (16, "inter")):
    n = S // C
    block = 2 * n * kv * 2                                  # K and V of one block, bf16
    send = collective_seconds(h200, "p2p", 2, block, where)
    attend = 4 * n * n * h / (h200.peak_flops["bf16"] * h200.efficiency["gemm"]) / 2   # causal: half the pairs
    print(f"cp = {C:>2} ({where}): {n} tokens per rank; a K/V block of {block / 1e6:.0f} MB takes "
          f"{send * 1e3:.2f} ms, attending to it ~ {attend * 1e3:.1f} ms")
''', r'''%md
Inside a node the transfer is some 70× shorter than the compute it hides behind; across nodes, with
fewer tokens per rank, only about 5×: the compute shrinks as $(S/C)^2$ and the block as $S/C$, so there
is a largest useful $C$ for a given $S$ and link. With K/V this small Llama 3 could even afford an
all-gather of them instead of a ring. What bites on GPUs is instead the causal
imbalance (the zig-zag split of §6), and the kernels: each block pair is one flash-attention call
(lesson 11), and its speed, not the network's, sets the step.
''']
