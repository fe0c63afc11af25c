"""Lesson 21: the cells of lessons/21_experts.ipynb (``%md`` cells are markdown).

Edit here, then run ``python lessons/make_notebooks.py``."""
from launch import LAUNCH   # the cell that defines mpirun() and MINE for the exercise's runs

NOTEBOOK = "21_experts.ipynb"

CELLS = [r'''%md
# 21 · Experts: mixture of experts and expert parallelism

A dense transformer spends the same compute on every token with every weight. A **mixture of experts**
(MoE) replaces a block's MLP with $E$ MLPs — the *experts* — and a small **router** that sends each token
to $k$ of them. The parameters grow by $E$; the compute per token grows by $k$ only. Mixtral 8×7B has
8 experts and $k = 2$: about 47 B parameters, about 13 B used per token. DeepSeek-V3 has 256 routed
experts, $k = 8$, and one shared expert every token goes through: 671 B parameters, 37 B active.

That changes what parallelism must do. The experts' weights are most of the model and each token needs
only $k$ of them, so they are spread over ranks — **expert parallelism** (ep), the fifth axis next to
dp, tp, pp and cp — and the *tokens* travel to their experts and back, with an **all-to-all**: every
rank sends a different, uneven number of rows to every other rank. This lesson builds the layer's three
ideas — top-$k$ routing, the balancing loss, capacity — and then the learner's own dispatch and combine
under `mpiexec` on 4 ranks, checked against minipar's layer; then it measures the all-to-all's bytes
against ep and what the balancing loss does to a real run's expert load.

minipar: `minipar/nn/moe.py` (the layer), `minipar/parallel/experts.py` (expert parallelism),
`minipar/comm/collectives.py::all_to_all`; `python -m minipar train --arch llama --moe-experts E
--moe-top-k K [--moe-balance aux|bias|none] [--moe-capacity-factor C] [--ep N]`.
''', r'''
import inspect
import json
import os
import subprocess
import sys
import tempfile

import matplotlib.pyplot as plt
import numpy as np

from minipar.autograd import Tensor, ops
from minipar.nn import GPTConfig
from minipar.nn.layers import Dropout
from minipar.nn.llama import SwiGLU
from minipar.nn import moe as moe_module
from minipar.nn.moe import MoE, balance_loss, capacity, kept_assignments, route
from minipar.observe.runlog import step_records
from minipar.parallel import experts as experts_module

%matplotlib inline
''' + LAUNCH, r'''%md
## 1. The layer: a router, top-$k$, renormalised weights

For a token $x$ (a row of width $d$) the router is one bias-free linear map to $E$ scores and a softmax:

$$p = \mathrm{softmax}(x\,W_r) \in \mathbb{R}^E, \qquad e_1..e_k = \text{the } k \text{ largest } p_i,
\qquad w_j = \frac{p_{e_j}}{\sum_{j'} p_{e_{j'}}}, \qquad \mathrm{moe}(x) = \sum_{j=1}^{k} w_j\,
\mathrm{expert}_{e_j}(x).$$

The $k$ weights are renormalised to sum to 1 (Mixtral's rule, and GShard's for its top 2). Switch
Transformer, with $k = 1$, keeps the raw $p_{e_1}$: renormalising a single weight would make it 1 and leave
the router no gradient from the output. The top-$k$ *choice* is not differentiable, but the weights are:
the router learns through $w_j$, from how much each chosen expert's output helped. The experts here are the llama
block's SwiGLU MLPs. One layer on six tokens:
''', r'''
def small_layer(d=6, experts=8, top_k=2, balance="none", capacity_factor=0.0, seed=0):
    """A float64 MoE layer of `experts` SwiGLU experts (width 5), its weights drawn from `seed`."""
    cfg = GPTConfig(arch="llama", d_model=8, n_head=2, moe_experts=experts, moe_top_k=top_k,
                    moe_balance=balance, moe_capacity_factor=capacity_factor)
    layer = MoE(d, lambda: SwiGLU(d, 5, None, 0.02, Dropout(0.0, None)), None, cfg)
    rng = np.random.default_rng(seed)
    for _, p in layer.named_parameters():
        p.data = rng.normal(size=p.shape)
    return layer

np.set_printoptions(precision=3, suppress=True)
layer = small_layer()
x = np.random.default_rng(1).normal(size=(1, 6, 6))
probs = layer.router_probs(Tensor(x)).data[0]              # (T, E)
chosen = route(probs, 2)                                    # (T, k): largest first
top = np.take_along_axis(probs, chosen, axis=-1)
for t in range(6):
    print(f"token {t}: experts {chosen[t]}  p = {top[t]}  w = {top[t] / top[t].sum()}")
out = layer(Tensor(x)).data[0]
by_hand = [sum(top[t, j] / top[t].sum() * layer.experts[chosen[t, j]](Tensor(x[0, t:t + 1])).data[0]
               for j in range(2)) for t in range(6)]
print("largest |layer - Σ_j w_j·expert_j(x)|:", np.abs(out - np.array(by_hand)).max())
assert np.allclose(out, by_hand, rtol=1e-12, atol=1e-14)
''', r'''%md
Inside the layer the experts do not run token by token: for each expert the rows routed to it are
gathered into one matrix (`getitem`, whose backward scatter-adds), the expert runs once on them, and its
output rows are put back in (token, choice) order, where the weights combine them. That gather, run and
put-back is `MoE.dispatch` — the one piece expert parallelism replaces:
''', r'''
print(inspect.getsource(moe_module.dispatch_local))
''', r'''%md
## 2. Balancing: the Switch/GShard loss

Nothing in the router's gradient asks for balance. A router that happens to prefer an expert trains it
more, which makes it better, which makes the router prefer it more: the load collapses onto a few
experts (§6 measures it), the others are wasted parameters, and under expert parallelism the ranks
holding the popular experts do all the work while the rest wait. The **auxiliary loss** of Switch
Transformer and GShard pushes back. For one sequence of $T$ tokens with $k$ choices each:

$$f_i = \frac{\text{choices of expert } i \text{ among the sequence's } k\,T}{k\,T}, \qquad
P_i = \frac{1}{T}\sum_t p_{t,i}, \qquad \mathrm{aux} = E\sum_{i=1}^{E} f_i\,P_i .$$

$f_i$ is the share of the routing decisions (a count: no gradient); $P_i$ is the mean probability, which
does have one. $\sum_i f_i = 1$ and $\sum_i P_i = 1$; uniform routing, $f_i = P_i = 1/E$, gives aux $= 1$,
and choices and probabilities piled on one expert give up to $E/k$ (with top-$k$ an expert takes at most
one of a token's $k$ choices, $f_i \le 1/k$). Its gradient, $\partial\,\mathrm{aux}/\partial P_i = E f_i$,
lowers $P_i$ in proportion to $f_i$: the over-chosen experts lose probability. The training loss adds coef · aux per MoE layer
(`--moe-aux-coef`, default 0.01).

**Per sequence.** aux multiplies two means, so aux over a whole batch is not the mean of aux over its
parts: computed over "the tokens this rank holds", the loss would change with dp, micro-batches or cp.
minipar (like GShard's groups and Megatron's `seq_aux_loss`) computes it for each sequence and averages
over the sequences, so every layout computes the same number.

**Exercise — the balancing loss.** Write `my_balance_loss(probs, chosen, n_experts)`: `probs` a Tensor
(B, T, E) of router probabilities, `chosen` an array (B, T, k) of each token's experts; return the mean
over the B sequences of $E\sum_i f_i P_i$ as a scalar Tensor, built with `ops` so its gradient reaches
the router. It is checked against minipar's `balance_loss`, value and gradient, on sequences routed very
differently.
''', r'''
def check_balance(fn):
    rng = np.random.default_rng(0)
    B, T, E = 3, 16, 8
    skew = np.array([0.3, 2.0, 5.0])[:, None, None]            # from near uniform to peaked
    logits_data = rng.normal(size=(B, T, E)) * skew + np.linspace(0, 3, E)[None, None, ::-1] * (skew > 1)
    for k in (1, 2):
        answers = []
        for loss_fn in (fn, balance_loss):
            logits = Tensor(logits_data.copy(), requires_grad=True)
            probs = ops.softmax(logits, axis=-1)
            chosen = route(probs.data, k)
            value = loss_fn(probs, chosen, E)
            assert isinstance(value, Tensor) and value.size == 1, \
                "return a scalar Tensor (built with ops, so that backward reaches the router)"
            assert value.requires_grad, ("the loss has no gradient to give the router: P_i must be "
                                         "computed from probs with ops (f_i is the constant)")
            ops.sum(value).backward()
            answers.append((float(value.data), logits.grad))
        (mine, mine_grad), (want, want_grad) = answers
        f_batch = np.bincount(chosen.reshape(-1), minlength=E) / chosen.size
        pooled = E * float((f_batch * probs.data.mean(axis=(0, 1))).sum())
        if not np.isclose(mine, want, rtol=1e-12):
            why = ("f_i divided by T, not by the k·T choices (Σ_i f_i must be 1)" if np.isclose(mine, k * want)
                   else "the factor E is missing (uniform routing must give 1)" if np.isclose(mine, want / E)
                   else "f and P taken over the whole batch: compute them per sequence, then average"
                   if np.isclose(mine, pooled) else f"it is {mine:.6f}")
            raise AssertionError(f"k = {k}: the loss is {mine:.6f}, minipar's {want:.6f}: {why}")
        if mine_grad is None or not np.allclose(mine_grad, want_grad, rtol=1e-10, atol=1e-14):
            raise AssertionError(f"k = {k}: the value is right but the router's gradient is "
                                 f"{'missing' if mine_grad is None else 'different'}: P_i must be a Tensor "
                                 f"computed from probs, f_i a constant")
    uniform = fn(Tensor(np.full((2, 4, E), 1 / E)), np.tile(np.arange(4 * 2).reshape(4, 2) % E, (2, 1, 1)), E)
    assert np.isclose(float(uniform.data), 1.0), f"uniform routing gives {float(uniform.data)}, want 1"
    return (f"correct: equals minipar's balance_loss (value and gradient) for k = 1 and 2; "
            f"per sequence {want:.4f} here, the batch pooled would give {pooled:.4f}; uniform routing gives 1")
''', r'''%exercise balance_loss
def my_balance_loss(probs, chosen, n_experts):
    raise NotImplementedError("hint: which of f and P can carry a gradient, and which tokens does each one "
                              "count? the check's message says which normalisation it found")
''', r'''
print(check_balance(my_balance_loss))    # the solution is in lessons/solutions/21_experts.py
print(inspect.getsource(balance_loss))
''', r'''%md
How the loss reaches the router. The layer's aux value is added to the training loss as a number (the log
shows it); its *gradient* enters at the layer itself: `AttachAux` is an identity on the layer's output
whose backward also hands aux the gradient the training loss received (Megatron's
`MoEAuxLossAutoScaler` does the same). So the balancing gradient lives in the block's own graph and
survives recomputation, ZeRO-3 and pipeline stages unchanged. The alternative with no loss at all is
DeepSeek-V3's per-expert selection bias (`--moe-balance bias`): added to the scores for the top-$k$
choice only, moved by ± a small rate after each step toward the under-used experts.

## 3. Capacity

A real expert is a fixed-size kernel on a fixed-size buffer. With a **capacity factor** $C$, each expert
takes at most $\lceil C\cdot k\,T/E\rceil$ assignments of a sequence ($k\,T/E$ is its fair share) and the
rest are **dropped**: that choice contributes nothing, and the token keeps only its other experts' parts
(and the residual connection around the block). Which are dropped must not depend on the layout, so the
rule is fixed: every first choice before any second choice, then by position in the sequence. $C = 0$
(minipar's default) is dropless, as in Mixtral and DeepSeek-V3.
''', r'''
chosen = np.array([[[0, 1], [0, 2], [0, 1], [0, 3], [2, 0], [3, 0]]])      # one sequence, T = 6, k = 2
cap = capacity(1.0, 2, 6, 4)                                                 # ⌈1.0 · 2·6/4⌉ = 3
keep = kept_assignments(chosen, 4, cap)
print(f"capacity {cap} per expert;  (token, choice) → expert, kept?")
for t in range(6):
    print(f"  token {t}: " + "   ".join(f"choice {j + 1} → expert {chosen[0, t, j]} "
                                         f"{'kept' if keep[0, t, j] else 'DROPPED'}" for j in range(2)))
assert (keep[0, :, 0] == [True, True, True, False, True, True]).all()     # expert 0 full after token 2
assert (keep[0, :, 1] == [True, True, True, True, False, False]).all()    # so no second choice gets it
''', r'''%md
Expert 0 is everyone's favourite: the first choices of tokens 0–2 fill it, token 3's first choice is
dropped *before* any second choice is considered — so the second choices of tokens 4 and 5 for expert 0
are dropped too, and each of those tokens keeps only its first expert.

## 4. Expert parallelism

With ep ranks in an expert-parallel group, rank $q$ holds experts $q\cdot E/\text{ep}$ to
$(q+1)\cdot E/\text{ep} - 1$; the router and everything dense stay replicated, and each rank routes its
own tokens. One MoE layer on rank $r$, after routing:

1. **count** the rows for each expert, $c_r[e]$, and **exchange the counts**: a small all-to-all tells
   each owner how many rows of each of its experts come from each rank — before any row moves, so
   every rank can size its buffers;
2. **permute** the (token, choice) slots by expert (a sort by expert id): the rows for rank $q$'s experts are
   then contiguous, and `all_to_all(comm, rows, counts)` sends $\sum_{e \text{ of } q} c_r[e]$ rows to
   each $q$ (uneven, often 0);
3. **run** each local expert once on the rows every rank sent it;
4. **send back**: the outputs in the order the rows came, by the reverse all-to-all; **un-permute**
   them into (token, choice) order; **weight and sum**, as in one process.

Backward is the same in reverse: the gradient of an all-to-all is the all-to-all back with the counts
transposed (`AllToAll` in `minipar/parallel/experts.py`). So an expert's weight gradient on its owner
is automatically **the sum over every rank that sent it rows**, each row's gradient from its sender's
loss. That loss is the mean over the sender's tokens, and one process's gradient is the mean over all
dp·cp data ranks' — so the ranks holding the same expert (dp·cp/ep of them) sum their gradients and
divide by **dp·cp**, not by their own number (Megatron scales by edp/(dp·cp) for the same reason);
the dense weights are averaged over dp·cp as always. Rank $r$ sends, per layer and direction,
$(k\,T_r - \text{dropped} - \text{rows to itself})$ rows of $d$ numbers: under uniform routing
$k\,T\,d\,(\text{ep}-1)/\text{ep}$ numbers — a volume that grows with ep, toward $k\,T\,d$.

**Exercise — the dispatch and combine, on four ranks.** Write `moe_layer(comm, moe, x)`: the layer's
output (T, d) for this rank's tokens `x` (a Tensor), where `moe` holds only this rank's experts
(`moe.experts[e]` is None for the others) and `comm` is the expert-parallel group. Route (top-$k$ of
`moe.router_probs(x)`, the largest first), weight, count, exchange the counts, permute, send, run, send
back, un-permute, weight and sum: steps 1–4 above, 20–40 lines. Given: `all_to_all(comm, rows, counts)`
(NumPy rows; returns the rows received, grouped by source, and the receive counts) for the counts, and
`AllToAll.apply(rows, comm=comm, counts=counts)`, the same on a Tensor with the backward of the
previous paragraph, for the rows. Every local expert must run, even on zero rows, so each has a gradient.

`21_yours.py` runs it under `mpiexec -n 4` at ep 4 and ep 2 (ranks {0, 1} and {2, 3}), float64, each rank
its own 12 tokens, against the library's layer with every expert in one process: the output token by
token, the gradients of the input, the router and — summed over the ep group — every expert, and the
bytes each rank sent. A wrong output names the rank, the token and the expert whose part is wrong, and
what it is instead when it recognises it.
''', r'''%exercise dispatch
%%writefile {MINE}/experts.py
"""Your expert-parallel MoE layer (lesson 21): run under mpiexec by 21_yours.py."""
import numpy as np

from minipar.autograd import ops
from minipar.autograd.tensor import Tensor
from minipar.backend import to_host, xp
from minipar.comm import all_to_all
from minipar.parallel.experts import AllToAll    # all_to_all as an autograd op (given)


def moe_layer(comm, moe, x):
    """x (T, d): this rank's tokens -> (T, d), Σ_j w_j · expert_{e_j}(x[t]) (top-k routing).

    This rank (comm.rank of comm.size) holds experts moe.experts[first:first + per],
    per = moe.n_experts // comm.size; moe.top_k choices per token."""
    T, d = x.shape
    return Tensor(xp.zeros((T, d)))       # no expert's output yet: the check says what is missing
''', r'''
proc = mpirun(4, ["21_yours.py", "--file", f"{MINE}/experts.py", "--backend", BACKEND])
print(proc.stdout)
''', r'''%md
The library's version, `ExpertParallelDispatch`, is the same sequence of steps behind `MoE.dispatch` (routing
and the weighted sum stay in `MoE.forward`, shared with the one-process path):
''', r'''
print(inspect.getsource(experts_module.ExpertParallelDispatch.__call__))
''', r'''%md
In training, that sum over the ep group is half of an expert's gradient rule; the other half is the
synchroniser's. A rank's parameters are two sets replicated over two different groups, so
`ExpertSplitSync` runs one synchroniser of the run's form (DDP or ZeRO) for each:
''', r'''
from minipar.parallel.sync import experts as expert_sync
print("\n\n".join(expert_sync.__doc__.split("\n\n")[1:3]))
''', r'''%md
## 5. Measured: the all-to-all's bytes against ep

`21_experts.py` runs the library's layer (8 experts, top-2, $d = 64$, 256 tokens per rank, float64) on
4 ranks at ep 1, 2 and 4, one forward and backward, and counts what each rank's ep communicator sent;
it also compares the output with the one-process layer's.
''', r'''
out_json = os.path.join(tempfile.mkdtemp(), "experts.json")
mpirun(4, ["21_experts.py", "--backend", BACKEND, "--json", out_json])
measured = json.load(open(out_json))
k, T, d, item = measured["top_k"], measured["tokens"], measured["d_model"], measured["itemsize"]
eps, sent, model, row_bytes = [], [], [], []
print(f"{'ep':>3} {'bytes sent per rank (4 ranks)':>44} {'rows only':>10} {'4·k·T·d·8·(ep-1)/ep':>21} "
      f"{'max |ep - one process|':>23}")
for ranks in measured["runs"]:
    ep = ranks[0]["ep"]
    rows = [2 * (r["rows_to_others"] + r["rows_from_others"]) * d * item for r in ranks]
    eps.append(ep); sent.append([r["bytes_sent"] for r in ranks]); row_bytes.append(rows)
    model.append(4 * k * T * d * item * (ep - 1) / ep)
    print(f"{ep:3d} {str(sent[-1]):>44} {np.mean(rows):10.0f} {model[-1]:21.0f} "
          f"{max(r['max_abs_diff'] for r in ranks):23.1e}")
    assert max(r["max_abs_diff"] for r in ranks) < 1e-12                  # ep changes nothing computed
    assert all(s >= b for s, b in zip(sent[-1], rows))                     # the rows, and the small counts
    if ep > 1:
        np.testing.assert_allclose(np.mean(rows), model[-1], rtol=0.05)    # near uniform routing here
sent, row_bytes = np.array(sent), np.array(row_bytes)

fig, ax = plt.subplots(figsize=(6.5, 4))
for r in range(4):
    ax.plot(eps, sent[:, r] / 2**10, "o", color=f"C{r}", label=f"rank {r}: measured bytes_sent")
grid = np.linspace(1, 4, 50)
ax.plot(grid, 4 * k * T * d * item * (grid - 1) / grid / 2**10, "k--",
        label="uniform routing: 4·k·T·d·8·(ep−1)/ep")
ax.axhline(4 * k * T * d * item / 2**10, color="grey", lw=0.8, ls=":", label="4·k·T·d·8: every row, both ways")
ax.set_xticks(eps); ax.set_xlabel("ep (expert-parallel ranks)"); ax.set_ylabel("KiB sent per rank, one layer, fwd + bwd")
ax.set_title(f"one MoE layer: E = 8, k = {k}, T = {T} tokens/rank, d = {d}, float64")
ax.legend(fontsize=8); plt.tight_layout(); plt.show()
''', r'''%md
At ep 1 nothing moves; at ep 2 half of the rows cross, at ep 4 three quarters — each twice in forward
(there and back) and twice again in backward. The volume per rank *rises* with ep toward $4\,k\,T\,d$
numbers: expert parallelism buys memory (each rank holds $E/\text{ep}$ experts) and costs an all-to-all of
$k$ times the activations per layer, on every layer that has experts. That is why MoE models keep ep
inside a node where they can (NVLink's all-to-all is fast), and why DeepSeek-V3 routes each token to
experts on at most 4 nodes. The small excess over the rows is the counts: one integer per expert, and
each all-to-all's own exchange of its counts before the rows.

The routing here is near uniform (a random router), so every rank sends about as much as the formula.
A trained router is not: the next section measures how uneven a real run's routing gets.

## 6. Measured: the expert load with and without the balancing loss

Two runs of `minipar train` on the stdlib's bytes: the llama-tiny preset (4 blocks) with a MoE of
8 experts, top-2, in every block, 30 steps of 8 sequences × 64 tokens, once without balancing and once
with the auxiliary loss at its default coefficient 0.01. The training log records, per step and per MoE
layer, the assignments each expert took and max/mean of them (1: perfect balance; 4 here: one expert in
every token's top 2 — a token's two choices are different experts, so no expert can take more). The load is computed per sequence and summed, so it is the same under any
layout — `--ep 4` on 4 ranks gives these numbers too (`tests/test_expert_parallel.py` checks such runs
against one process); one process keeps the lesson quick.
''', r'''
runs = {}
tmp = tempfile.mkdtemp()
for mode in ("none", "aux"):
    log = os.path.join(tmp, f"{mode}.json")
    mpirun(1, ["-m", "minipar", "train", "--model", "llama-tiny", "--moe-experts", "8", "--moe-top-k", "2",
               "--moe-balance", mode, "--data", "stdlib-bytes", "--steps", "30", "--seed", "0",
               "--batch-size", "8", "--seq-len", "64",
               "--quiet", "--eval-batches", "0", "--log-json", log])
    runs[mode] = step_records(log)
layers = [e["block"] for e in runs["none"][0]["experts"]]
late = {}
for mode, recs in runs.items():
    ratio = np.array([[e["load_max_mean"] for e in r["experts"]] for r in recs])     # (steps, layers)
    late[mode] = ratio[-10:].mean(axis=0)
    print(f"--moe-balance {mode:4s}: load max/mean over the last 10 steps, per layer "
          + ", ".join(f"block {b} {v:.2f}" for b, v in zip(layers, late[mode]))
          + f";  final loss {recs[-1]['loss']:.3f}")
    for r in recs:
        assert all(sum(e["received"]) == 2 * 512 for e in r["experts"])   # k · tokens: nothing dropped

fig, axes = plt.subplots(1, 3, figsize=(14, 3.8), gridspec_kw=dict(width_ratios=[1.4, 1, 1]))
for mode, style in (("none", "-"), ("aux", "--")):
    for i, b in enumerate(layers):
        axes[0].plot([e["experts"][i]["load_max_mean"] for e in runs[mode]], style, color=f"C{i}",
                     label=f"block {b}, balance {mode}")
axes[0].axhline(1, color="grey", lw=0.8); axes[0].axhline(4, color="grey", lw=0.8, ls=":")
axes[0].set_xlabel("step"); axes[0].set_ylabel("max / mean assignments per expert")
axes[0].set_title("expert load (1 = balanced, 4 = one expert in every token's top 2)", fontsize=10); axes[0].legend(fontsize=7)
last = len(layers) - 1
for ax, mode in zip(axes[1:], ("none", "aux")):
    counts = np.array([r["experts"][last]["received"] for r in runs[mode][-10:]]).mean(axis=0)
    ax.bar(range(8), counts, color="C1" if mode == "none" else "C2")
    ax.axhline(2 * 512 / 8, color="k", ls="--", lw=0.8, label="k·T/E: the fair share")
    ax.set_xlabel("expert"); ax.set_ylabel("assignments per step")
    ax.set_title(f"block {layers[last]}, mean of the last 10 steps, balance {mode}", fontsize=9)
    ax.legend(fontsize=7)
plt.tight_layout(); plt.show()
''', r'''%md
What the two runs showed when this lesson was written (they are short; read the trend, not the third
digit): without balancing, the routers of blocks 2 and 3 collapsed within three steps to max/mean 4.0 —
one expert in every token's top 2, a second taking most of the other choices, four of the eight experts
idle — and stayed there for the whole run; block 1 came and went between 2.5 and 4. With the auxiliary
loss every block ended near 2 (the last ten steps' mean 1.9–2.2), all eight experts in use, at a final
loss within 2% of the unbalanced run's. The loss is
small — coef · aux ≈ 0.01 — yet enough, because its gradient acts where the collapse starts: on the
router's probabilities of the over-chosen experts. Under expert parallelism the collapsed run would be
slow as well as wasteful: a rank whose experts take half the assignments receives half the rows and
computes while the others wait at the next all-to-all.

## 7. The same thing elsewhere

- **Megatron-core**: `--num-experts`, `--moe-router-topk`, `--expert-model-parallel-size` (ep, carved from
  the data-parallel ranks, as here), `--moe-token-dispatcher-type alltoall`, `--moe-aux-loss-coeff`,
  `--moe-router-load-balancing-type aux_loss|seq_aux_loss|none` (seq_aux_loss: per sequence, as here),
  `--moe-expert-capacity-factor`; the expert gradients scaled by edp/(dp·cp).
- **DeepSpeed-MoE**: `deepspeed.moe.layer.MoE(hidden_size, expert, num_experts, ep_size, k,
  capacity_factor, ...)`, the GShard-style gate with its auxiliary loss.
- **torchtitan**: `expert_parallel_degree` in its parallelism settings, with a token dispatch over
  all-to-all, for its Llama 4 and DeepSeek-V3 models.
- **Papers**: GShard (top-2, capacity, the auxiliary loss over groups), Switch Transformer (top-1, the
  loss $E\sum f_i P_i$), Mixtral (top-2, renormalised weights, dropless), DeepSeek-V3 (shared experts,
  the loss-free bias, node-limited routing).
''']
