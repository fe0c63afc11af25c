"""Lesson 14: the cells of lessons/14_compression.ipynb (``%md`` cells are markdown).

Edit here, then run ``python lessons/make_notebooks.py``."""
from launch import LAUNCH   # the cell that defines mpirun() for the lesson's runs

NOTEBOOK = "14_compression.ipynb"

CELLS = [r'''%md
# 14 · Gradient compression and error feedback

Data parallelism (lesson 05) sends every gradient every step: with a ring all-reduce each rank
sends $2\frac{n-1}{n}\cdot 4\Psi$ bytes for $\Psi$ fp32 parameters, whatever the batch size. For a
1.3 B-parameter model that is ~10 GB per rank per step — 8 s on 10 Gb/s Ethernet, 0.4 s on 200 Gb/s
InfiniBand. When the network is the bottleneck, send **less**: every replica must still end the
step with the same averaged gradient, but it may be an *approximation* of it.

| method | what travels (bucket of $L$ elements, $n$ ranks) | bytes per rank | vs fp32 all-reduce |
|---|---|---|---|
| none | $g/n$, all-reduced | $2\frac{n-1}{n}4L$ | 1 |
| fp16 / bf16 | $\mathrm{half}(g/n)$, all-reduced | $2\frac{n-1}{n}2L$ | 1/2 |
| int8 | int8 values + one fp32 scale per $C=256$, **all-gathered** | $(n-1)(L + 4L/C)$ | $\frac{n}{8}(1+\frac4C)$ |
| top-k | the $k=\rho L$ largest (index, value) pairs, all-gathered | $(n-1)\,8k$ | $n\rho$ |
| PowerSGD | $P$ ($a\times r$) and $Q$ ($b\times r$) per $a\times b$ matrix, all-reduced | $2\frac{n-1}{n}4(a+b)r$ | $\frac{(a+b)r}{ab}$ |

Why all-gather for int8 and top-k? Each rank's int8 values have *its own* scales and each rank's
top-k has *its own* index set: they cannot be added on the way like floats in a ring. PowerSGD is
linear — $\sum_r M_r Q = (\sum_r M_r) Q$ — so its small matrices *can* be all-reduced.

**Error feedback.** Rounding to int8 or dropping 99 % of the coordinates is biased: what is not sent
would be lost. Each rank keeps it instead, in a residual $e$ (one per parameter element):

$$x_t = g_t + e_t,\qquad \text{send } C(x_t),\qquad e_{t+1} = x_t - C(x_t).$$

Summing over steps telescopes: $\sum_{t<T} C(x_t) + e_T = \sum_{t<T} g_t$ — **exactly**. The
updates applied trail the true gradients by the residual only, and for a compressor that keeps a
fraction of $x$ ($\|x - C(x)\|^2 \le (1-\delta)\|x\|^2$, top-k: $\delta \ge k/L$) the residual stays
bounded, so nothing is lost, only delayed.

In minipar every method is a **DDP comm hook** (`minipar/parallel/sync/compression/`): DDP packs a
bucket, calls `hook(comm, flat)` on its progress thread, and takes the averaged gradient from
`handle.wait()`. Plan: (1) error feedback on one process, which you write; (2) one run of every method on 2 ranks,
bytes counted by the transport against the formulas, and the residuals; (3) the loss curves;
(4) when compression pays; (5) the code; a second exercise; (6) across a slow link, DiLoCo:
send fewer times instead of fewer bytes, and a third exercise, the outer step on 2 groups.
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

%matplotlib inline
''' + LAUNCH, r'''%md
## 1. Why error feedback works

The compressor is *top-k*: of a gradient $x$ keep the $k$ entries of largest $|x_i|$, send them as
(index, value) pairs, drop the rest — or, with error feedback, keep the rest as the residual.

**Exercise 1 — top-k with error feedback.** Write `my_topk_with_feedback(grad, residual, k)`
returning `(indices, values, new_residual)`: correct the gradient with the residual, keep the `k`
entries of largest magnitude, and keep everything else as the new residual. The cell after it
checks it against minipar's `topk_with_feedback` (the solution is in
`lessons/solutions/14_compression.py`). Then a toy, on one process, with the library's version:
gradients with a small consistent part (the signal, the same every step) under large noise,
compressed by top-1 % with and without a residual. We track what matters for the sum of updates,
$\|\sum_t g_t - \sum_t C(\cdot)_t\|$ — the gradient mass that never arrived.
''', r'''
from minipar.parallel.sync.compression.int8 import dequantise, quantise
from minipar.parallel.sync.compression.topk import topk_with_feedback

def check_topk(fn):
    rng = np.random.default_rng(1)
    g, e = rng.standard_normal(1000), rng.standard_normal(1000) * 0.1
    idx, vals, left = fn(g, e, 37)
    ref_idx, ref_vals, ref_left = topk_with_feedback(g, e, 37)
    assert sorted(np.asarray(idx).tolist()) == sorted(ref_idx.tolist()), "not the k largest |g + e|"
    np.testing.assert_array_equal(np.asarray(vals)[np.argsort(idx)], ref_vals[np.argsort(ref_idx)])
    np.testing.assert_array_equal(left, ref_left)
    sent = np.zeros(1000); sent[idx] = vals
    np.testing.assert_allclose(sent + left, g + e, rtol=0, atol=1e-15)    # nothing lost
    return "correct"

def check_quantise(fn):
    x = np.random.default_rng(2).standard_normal(1000) * np.repeat([1e-3, 1.0, 30.0, 0.0], 250)
    q, scale = fn(x, 64)
    ref_q, ref_scale = quantise(x, 64)
    assert q.dtype == np.int8 and q.shape == (1000,) and scale.shape == ref_scale.shape
    np.testing.assert_array_equal(scale, ref_scale)
    np.testing.assert_array_equal(q, ref_q)
    err = np.abs(dequantise(q, scale, 64, x.dtype) - x) / np.repeat(np.maximum(scale, 1e-30), 64)[:1000]
    print(f"largest error / scale: {err.max():.3f} (<= 0.5)")
    return "correct"
''', r'''%exercise topk_feedback
def my_topk_with_feedback(grad, residual, k):
    raise NotImplementedError("hint: x = grad + residual; the k largest |x| are "
                              "np.argpartition(np.abs(x), x.size - k)[x.size - k:]; "
                              "the new residual is x with those entries set to 0")
''', r'''
print(check_topk(my_topk_with_feedback))
''', r'''
rng = np.random.default_rng(0)
L, k, T = 10_000, 100, 300
signal = rng.standard_normal(L) * 0.05
total_g, sent_ef, sent_plain, e = np.zeros(L), np.zeros(L), np.zeros(L), np.zeros(L)
lost_ef, lost_plain, res = [], [], []
for t in range(T):
    g = signal + rng.standard_normal(L)
    total_g += g
    idx, vals, e = topk_with_feedback(g, e, k)          # with memory
    sent_ef[idx] += vals
    idx0, vals0, _ = topk_with_feedback(g, 0 * g, k)    # without: the rest is dropped
    sent_plain[idx0] += vals0
    lost_ef.append(np.linalg.norm(total_g - sent_ef)); lost_plain.append(np.linalg.norm(total_g - sent_plain))
    res.append(np.linalg.norm(e))
np.testing.assert_allclose(sent_ef + e, total_g, rtol=1e-12, atol=1e-9)   # the invariant, exactly
print(f"after {T} steps: lost mass {lost_plain[-1]:.0f} without error feedback, "
      f"{lost_ef[-1]:.0f} with (= the residual norm {res[-1]:.0f})")
print(f"signal recovered (cosine of the summed updates with the signal): without "
      f"{sent_plain @ signal / np.linalg.norm(sent_plain) / np.linalg.norm(signal):.2f}, with "
      f"{sent_ef @ signal / np.linalg.norm(sent_ef) / np.linalg.norm(signal):.2f}")

fig, ax = plt.subplots(figsize=(6, 3.2))
ax.plot(lost_plain, label="top-k, no error feedback"); ax.plot(lost_ef, label="top-k + error feedback")
ax.set_xlabel("step"); ax.set_ylabel(r"$\|\sum g - \sum C\|$"); ax.legend()
ax.set_title("gradient mass not yet applied"); plt.tight_layout(); plt.show()
''', r'''%md
Without memory the lost mass grows like $\sqrt{t}$ (the noise) *and* like $t$ (the signal that is
never large enough to be picked); with memory it is the residual, which saturates: a coordinate's
residual grows until it is among the $k$ largest, then it is sent and reset.

''', r'''%md
## 2. Every method on the same model, and the bytes they send

`14_compression.py` trains a 2-layer GPT ($d=64$) on real text (the standard library's source) on
2 ranks, 60 AdamW steps, once per method — same initial weights, same batches — by building
`DDPSync(model, comm, comm_hook=make_hook(method, ...))` and calling `hook.bind(ddp)` so a stateful
hook can recognise its buckets. Per step it records what rank 0's transport counted
(`comm.bytes_sent`) and what the method's formula predicts (`hook.expected_wire_bytes`).
''', r'''
out_json = os.path.join(tempfile.mkdtemp(), "compression.json")
mpirun(2, ["14_compression.py", "--backend", BACKEND, "--json", out_json])
result = json.load(open(out_json))
runs = result["runs"]
print(f"{result['params']:,} parameters, {result['ranks']} ranks; this machine: "
      f"alpha = {result['alpha'] * 1e6:.0f} us, {1 / result['beta'] / 1e9:.1f} GB/s")
base = runs["none"]["bytes"][-1]
print(f"\n{'method':28} {'counted B/step':>15} {'formula':>10} {'ratio':>7}")
for label, run in runs.items():
    print(f"{label:28} {run['bytes'][-1]:15,d} {run['formula'][-1]:10,d} {base / run['bytes'][-1]:6.1f}x")
    assert run["bytes"] == run["formula"], label     # every step, counted == formula
''', r'''
fig, ax = plt.subplots(figsize=(7, 3))
labels = list(runs)
ax.barh(labels, [runs[k]["bytes"][-1] for k in labels], color="tab:blue")
ax.set_xscale("log"); ax.invert_yaxis()
ax.set_xlabel("bytes sent per rank per step (counted by the transport)")
ax.set_title("the same gradients, six ways"); plt.tight_layout(); plt.show()
''', r'''%md
PowerSGD sends the full all-reduce in its first 5 steps (**warm-up**: early gradients change fast
and are far from low rank), then two all-reduces of $(a+b)r$ numbers per matrix; its biases and
LayerNorm gains (1-D) travel uncompressed in the first message. The ratios grow with the model:
at $d = 64$ a $64\times 256$ MLP weight at $r=2$ shrinks 26×, at $d=1024$ ($1024\times4096$, $r=4$) 205×.

The residual norm $\|e\|$ of the error-feedback runs, step by step:
''', r'''fig, ax = plt.subplots(figsize=(6, 3.2))
for label, run in runs.items():
    if max(run["residual"]) > 0:
        ax.plot(run["residual"], label=label)
ax.set_xlabel("step"); ax.set_ylabel(r"$\|e\|$ on rank 0"); ax.legend()
ax.set_title("the GPT runs: the residual norm stays bounded"); plt.tight_layout(); plt.show()
''', r'''%md
## 3. The loss curves

Same weights, same batches: the curves differ only by what the hooks did to the gradients.
''', r'''
fig, ax = plt.subplots(figsize=(8, 3.5))
smooth = lambda a, w=5: np.convolve(a, np.ones(w) / w, mode="valid")   # noqa: E731
for label, run in runs.items():
    ax.plot(smooth(np.array(run["loss"])), label=label)
ax.set_xlabel("step"); ax.set_ylabel("train loss (5-step mean)"); ax.legend(); ax.set_ylim(top=4)
ax.set_title("2 ranks, 60 steps"); plt.tight_layout(); plt.show()
v0 = runs["none"]["val_loss"]
for label, run in runs.items():
    print(f"{label:28} val loss {run['val_loss']:.4f} ({run['val_loss'] / v0 - 1:+.2%})")
    assert run["val_loss"] < 1.2 * v0, label           # every method learns
''', r'''%md
fp16 and int8 are indistinguishable from uncompressed; top-k 1 % and PowerSGD lag. Sixty steps is
the steepest part of training, where a gradient delayed by the residual costs most, and AdamW
divides whatever arrives by its running RMS, so a coordinate's accumulated residual, sent late,
moves the weight about as far as one fresh gradient would. That is also why top-k with and without
error feedback end close here: the memory's benefit is the lost mass of §2, which shows over long
runs. Real systems therefore start compression after **uncompressed warm-up steps**
(`start_powerSGD_iter` in PyTorch, `freeze_step` in 1-bit Adam, DGC's warm-up).
`benchmarks/compression.py` (d = 256, 200 steps, 50 warm-up steps) measured val loss against
uncompressed: int8 +0.03 % at 3.9× fewer bytes, PowerSGD rank 4 +2.5 % at 38×, top-k 1 % +3.8 % at
50×; without a warm-up top-k ended +13 %, and PowerSGD with 10 warm-up steps +4 %.

## 4. When does compression pay?

Compression trades bytes for work: quantising, selecting the top-k, two matrix products and a QR
per matrix. With the α-β model (lesson 04) a step without overlap costs

$$T_m(\beta) = C_m + k_m\,\alpha + W_m\,\beta,$$

$W_m$ the bytes and $k_m$ the messages of method $m$, $C_m$ its compute (forward, backward, optimizer
and its own encode/decode), which we read off the measured step: $C_m = T_m^{\text{here}} - k_m\alpha_{\text{here}} -
W_m\beta_{\text{here}}$. Below the **break-even bandwidth** $1/\beta^* = (W_{\text{none}} - W_m)/(C_m - C_{\text{none}})$
method $m$ wins.
''', r'''
a_here, b_here = result["alpha"], result["beta"]
skip = 6                                                         # after PowerSGD's warm-up
bandwidth = np.logspace(7, 11.5, 200)                            # bytes/s: 80 Mb/s .. 2.5 Tb/s
fig, ax = plt.subplots(figsize=(8, 3.8))
C = {}
for label, run in runs.items():
    W, T = run["bytes"][-1], float(np.median(run["time"][skip:]))
    C[label] = T - W * b_here                                    # messages: 2-4 per bucket, ~0
    ax.plot(bandwidth * 8, C[label] + W / bandwidth, label=label)
for name, bw in (("10 GbE", 10e9 / 8), ("200 Gb IB", 200e9 / 8), ("this machine", 1 / b_here)):
    ax.axvline(bw * 8, color="gray", ls=":")
    ax.text(bw * 8, ax.get_ylim()[0] * 1.05, " " + name, rotation=90, va="bottom", fontsize=8)
ax.set_xscale("log"); ax.set_yscale("log"); ax.legend(fontsize=8)
ax.set_xlabel("network bandwidth (bit/s)"); ax.set_ylabel("modelled step time (s)")
ax.set_title("compression pays to the left of each crossing"); plt.tight_layout(); plt.show()
W0 = runs["none"]["bytes"][-1]
for label, run in runs.items():
    if label != "none":
        extra = C[label] - C["none"]
        be = "always" if extra <= 0 else f"{(W0 - run['bytes'][-1]) / extra * 8 / 1e9:.3f} Gb/s"
        print(f"{label:28} extra work {extra * 1e3:+6.1f} ms/step, pays below {be}")
''', r'''%md
On this tiny CPU model the step is dominated by compute and Python overhead, so compression pays
only on slow networks. (fp16's extra work is NumPy converting gradients too small for fp16's normal
range, a slow path on CPUs — see `cast.py`; bf16, with fp32's range, does not pay it.) The same formula explains the field's experience: the break-even is
(bytes saved) / (extra work), and on GPUs the compute shrinks ~100× while the bytes do not —
PowerSGD and 1-bit Adam were built for 10–25 Gb/s Ethernet clusters; on NVLink/InfiniBand
plain fp32/bf16 all-reduces usually win.

## 5. The code

Each hook is one function that runs on the progress thread (so it overlaps backward like the
default all-reduce). top-k:
''', r'''
from minipar.parallel.sync.compression import TopKHook, PowerSGDHook
print(inspect.getsource(TopKHook.reduce))
''', r'''%md
PowerSGD — all-reduce the Ps (with the 1-D tensors), orthonormalise, $Q_r = M_r^\top P$, all-reduce
the Qs, keep the averaged Q as the next warm start and $M_r - P Q_r^\top$ as the residual:
''', r'''
print(inspect.getsource(PowerSGDHook.reduce))
''', r'''%md
## Exercise 2 — int8 with a scale per chunk

Write `my_quantise(x, chunk)` returning `(q, scale)`: `q` int8 of `x.size` elements, one float32
`scale` per chunk of `chunk` elements (the last may be short) with $s_c = \max_{i\in c}|x_i|/127$ and
$q_i = \mathrm{round}(x_i/s_c)$ (0 for an all-zero chunk). Checked against minipar's `quantise`.
''', r'''%exercise quantise
def my_quantise(x, chunk):
    raise NotImplementedError("hint: pad x with zeros to a multiple of chunk, reshape(-1, chunk), "
                              "scale = (abs max per row / 127) as float32, q = rint(rows / scale) "
                              "as int8 (divide by 1 where the scale is 0)")
''', r'''
print(check_quantise(my_quantise))
''', r'''%md
## 6. Across a slow link: DiLoCo

Compression sends fewer bytes *per step*. When the link is slower still (two buildings, two
clouds), send *fewer times*. **DiLoCo** (Douillard et al., 2023) splits the data-parallel ranks into
$G$ groups; each group trains **alone** for $H$ inner steps of AdamW on its own data (any layout
inside: dp, ZeRO, tp, pp), then the groups exchange once. Algorithm 1, for outer step $t$:

$$\Delta_g = \theta^{(t-1)} - \theta_g \qquad\text{the pseudo-gradient: where group } g \text{ went, reversed}$$
$$\Delta = \tfrac1G \textstyle\sum_g \Delta_g \qquad\text{one all-reduce across the groups}$$
$$b \leftarrow \mu b + \Delta,\qquad \theta^{(t)} = \theta^{(t-1)} - \eta\,(\Delta + \mu b) \qquad\text{SGD with Nesterov momentum, as PyTorch computes it}$$

and every group continues from $\theta^{(t)}$ **with its own AdamW state kept**. The paper's outer
optimizer: $\eta = 0.7$, $\mu = 0.9$. At $\eta = 1$, $\mu = 0$ with one group the outer step is the
identity: the plain run (minipar's tests check it to $10^{-9}$). $H$ times fewer bytes cross the
slow link; the price is loss per token, because the groups drift apart between outer steps.
*Streaming* DiLoCo (2025) cuts the model into $F$ fragments synced at staggered steps, each
exchange hidden behind the $\tau$ inner steps after it, and sends int8 with error feedback: §1's
residual, now on the pseudo-gradient.

In minipar: `train --outer diloco --diloco-groups G --inner-steps H` (`minipar/parallel/outer/`),
`--diloco-fragments F --outer-compression int8` for the streaming form. On the simulated cluster
(2 nodes × 2 ranks, 100 Mbit/s between them, `llama-small`, 60 steps of equal tokens, then each
DiLoCo run for as many steps as fit in DDP's wall time; one run each on a shared 2-core machine;
`benchmarks/recorded/cluster_diloco_2026-12-07/`):

| run | wall s | MB across the link | val bits/byte | at DDP's 76 s: steps, val bits/byte |
|---|---|---|---|---|
| DDP | 76.3 | 1387 | 2.426 | 60, 2.426 |
| DiLoCo H=10 | 30.9 | 92 | 2.557 | 148, 2.404 |
| DiLoCo H=50 | 20.4 | 31 | 2.608 | 224, 2.236 |
| streaming F=4, int8 | 21.4 | 8 | 2.767 | 214, 2.274 |

DDP learns the most per token; DiLoCo learns more per *second* and per *byte*: in DDP's wall time
it takes 2.5–3.7× the steps and ends lower. Where the link is the bottleneck that is what counts
(`minipar plan --diloco G` prices it for a cluster profile).

The library's outer step, for one fragment:
''', r'''
from minipar.parallel.outer.diloco import DiLoCo, nesterov_step
print(inspect.getsource(nesterov_step))
print(inspect.getsource(DiLoCo._apply))
''', r'''%md
## Exercise 3: the outer step, on 2 groups

Write `MyDiLoCo(model, optimizer, comm, inner_steps, lr, momentum)`: it remembers the global
weights $\theta^{(t-1)}$ (a copy of each `p.data`) and a momentum buffer per parameter; `step()` is
called after every inner AdamW step, and every `inner_steps`-th call takes the outer step: the
pseudo-gradient, its mean over the groups with minipar's `all_reduce(comm, ...)` (`comm` joins the
groups: one rank each here), the Nesterov update, and the model's weights set to the new
$\theta^{(t)}$, leaving the optimizer alone.

`14_yours.py` runs it on 2 ranks, each a group training on its own half of every batch (float64,
$H = 4$, 3 outer steps), and at every outer step runs minipar's `DiLoCo` on the same weights: your
weights must equal the library's, AdamW's m, v and step count must be untouched, and the bytes each
rank sent must be one all-reduce of the model, $2\frac{G-1}{G}S$, with nothing between outer steps.
''', r'''%exercise my_diloco
%%writefile {MINE}/diloco.py
"""Your DiLoCo outer step (lesson 14): run under mpiexec by 14_yours.py."""
from minipar.comm import all_reduce


class MyDiLoCo:
    """Every ``inner_steps`` calls of ``step()``: the outer step of DiLoCo's Algorithm 1."""

    def __init__(self, model, optimizer, comm, inner_steps, lr=0.7, momentum=0.9):
        self.params = list(model.named_parameters())
        self.comm, self.H, self.lr, self.mu = comm, inner_steps, lr, momentum
        self.calls = 0

    def step(self):
        """After an inner optimizer step; every H-th call, the outer step."""
        self.calls += 1
''', r'''
proc = mpirun(2, ["14_yours.py", "--file", f"{MINE}/diloco.py", "--backend", BACKEND])
print(proc.stdout)
''', r'''%md
## What changes on GPU nodes and at scale

- Compression pays where bytes are slow: across nodes. A ring all-reduce of 1.4 GB of fp32 gradients
  (350M parameters) moves 2.8 GB through each GPU's link; at the H100 profile's 50 GB/s of InfiniBand
  per GPU that is ~56 ms, at 450 GB/s of NVLink ~6 ms (spec-sheet figures, α ignored). int8 cuts
  the bytes 4×, PowerSGD far more, each at a cost in compute and, without error feedback, in accuracy.
- In practice bf16 gradients (2×) and hierarchical all-reduce (lesson 20) come first; PowerSGD is a
  PyTorch DDP comm hook, 1-bit Adam/LAMB a DeepSpeed optimizer.

## The names you will meet

* **PyTorch DDP communication hooks**: `model.register_comm_hook(state, hook)`;
  `torch.distributed.algorithms.ddp_comm_hooks.default_hooks.fp16_compress_hook` /
  `bf16_compress_hook` (our fp16/bf16); `powerSGD_hook.powerSGD_hook` with
  `PowerSGDState(process_group, matrix_approximation_rank=r, start_powerSGD_iter=warm-up,
  use_error_feedback=True, warm_start=True)` (our `powersgd`; `batched_powerSGD_hook` compresses the
  whole flat bucket as one square matrix instead of per parameter). The hook receives a
  `GradBucket` (`bucket.buffer()`, `bucket.parameters()`), which is what our `bind(sync)` recovers.
* **DeepSpeed**: 1-bit Adam (`"optimizer": {"type": "OneBitAdam", "freeze_step": ...}`), 0/1 Adam and
  1-bit LAMB: Adam's momentum compressed to its sign plus a scale, with error compensation on the
  workers *and* on the server side of a compressed all-reduce; `freeze_step` is the uncompressed warm-up.
* **DiLoCo**: torchft's `DiLoCo(manager, model_fragments, inner_optimizer, outer_optimizer,
  sync_every=H, fragment_sync_delay=τ, fragment_update_alpha=α, should_quantize=...)` (its
  streaming form); INTELLECT-1 / Prime Intellect's OpenDiLoCo; the outer optimizer is
  `torch.optim.SGD(lr=0.7, momentum=0.9, nesterov=True)` over the pseudo-gradients. Local SGD
  (Stich 2019) is DiLoCo with plain averaging (outer lr 1, no momentum).
* Also: Horovod's `hvd.Compression.fp16`; "Deep Gradient Compression" (top-k with momentum
  correction); Vogels et al. 2019 (PowerSGD); Stich et al. 2018 and Karimireddy et al. 2019 (error feedback).
''']
