"""Lesson 09: the cells of lessons/09_mixed_precision.ipynb (``%md`` cells are markdown).

Edit here, then run ``python lessons/make_notebooks.py``."""
from launch import LAUNCH   # the cell that defines mpirun() for the lesson's runs

NOTEBOOK = "09_mixed_precision.ipynb"

CELLS = [r'''%md
# 09 · Mixed precision and loss scaling

A 2-byte number instead of a 4-byte one halves the memory of every activation and
weight copy and, on a GPU, runs matmuls on tensor cores at many times the fp32
rate. The price is a much smaller set of representable numbers. *Mixed* precision
(Micikevicius et al., 2018) keeps that price low with three rules:

1. **compute in half, accumulate in fp32**: a matmul takes fp16/bf16 inputs, sums
   its products in fp32 and rounds the result once; softmax, layer-norm statistics,
   losses and reductions are computed in fp32;
2. **fp32 master weights**: the optimizer updates an fp32 copy `w32` (and keeps
   AdamW's m, v in fp32); the model computes with `round(w32)`;
3. **loss scaling** (fp16 only): multiply the loss by S so small gradients do not
   underflow, divide the fp32 gradients by S before using them, and pick S
   *dynamically*: skip the step and lower S when something overflowed.

Plan: (1) the formats and their range; (2) where gradients live on that scale;
(3) an underflow that scaling rescues; (4) why accumulation must be fp32;
(5) why master weights — **exercise**: a small update on a half weight and on a
master; (6) the dynamic scale — **exercise**: its update rule — and a training run
with overflows and recovery, against fp32 and bf16; (7) skipping agreed across ranks —
**exercise**: the whole mixed-precision step of a data-parallel run, on two ranks.
''', r'''
import inspect
import json
import os
import subprocess
import sys
import time

import matplotlib.pyplot as plt
import ml_dtypes
import numpy as np

import minipar
from minipar import backend
from minipar.amp import MixedPrecision, DynamicLossScaler, make_scaler, amp_train_step
from minipar.amp import amp_optimizer_step
from minipar.autograd import Tensor, ops
from minipar.data import Dataset, load_corpus
from minipar.nn import GPT, GPTConfig, Linear
from minipar.optim import AdamW, clip_grad_norm

%matplotlib inline
backend.set_default_dtype(np.float32)
FP16, BF16 = np.dtype(np.float16), backend.dtype_of("bf16")
''' + LAUNCH, r'''%md
## 1. Three formats

| format | sign · exponent · mantissa bits | largest | smallest normal | spacing at 1 (eps) |
|---|---|---|---|---|
| fp32 | 1 · 8 · 23 | 3.4e38 | 1.2e-38 | 1.2e-7 |
| fp16 | 1 · 5 · 10 | **65504** | **6.1e-5** (subnormals to 6e-8) | 9.8e-4 |
| bf16 | 1 · 8 · 7  | 3.4e38 | 1.2e-38 | **7.8e-3** |

fp16 has precision but little *range*; bf16 has fp32's range but little precision.
The table, from the dtypes themselves:
''', r'''
for name, info in [("fp32", np.finfo(np.float32)), ("fp16", np.finfo(np.float16)),
                   ("bf16", ml_dtypes.finfo(ml_dtypes.bfloat16))]:
    print(f"{name}: max {float(info.max):.4g}  tiny {float(info.tiny):.3g}  "
          f"smallest subnormal {float(info.smallest_subnormal):.3g}  eps {float(info.eps):.3g}")

with np.errstate(over="ignore"):
    for x in [65504.0, 65520.0, 1e-5, 1e-8, 1 + 1e-4]:
        print(f"{x!r:>10} -> fp16 {float(np.float16(x))!r:>12}   bf16 {float(np.array(x).astype(BF16))!r}")
    assert np.isinf(np.float16(65520.0)) and np.float16(1e-8) == 0 and np.float16(1 + 1e-4) == 1
''', r'''%md
65520 becomes **inf** (overflow), 1e-8 becomes **0** (underflow), and 1 + 1e-4 becomes
1 (the increment is below half the spacing). The relative rounding error across
magnitudes shows the usable window of each format: flat at eps/2 inside, 100 % where
values flush to zero, inf beyond the top.
''', r'''
xs = np.logspace(-10, 6, 2000)
plt.figure(figsize=(7, 3.2))
for dtype, label in [(FP16, "fp16"), (BF16, "bf16")]:
    with np.errstate(over="ignore"):
        rounded = xs.astype(np.float32).astype(dtype).astype(np.float64)
    err = np.where(np.isinf(rounded), np.nan, np.abs(rounded - xs) / xs)
    worst = err.reshape(200, 10).max(axis=1)          # the worst case in each small bin
    plt.loglog(xs.reshape(200, 10)[:, 0], worst, label=label)
plt.axvline(65504, color="gray", ls=":"); plt.axvline(6e-8, color="gray", ls=":")
plt.text(1e5, 1e-2, "fp16: inf", fontsize=8); plt.text(1e-10, 0.3, "fp16: 0", fontsize=8)
plt.xlabel("|x|"); plt.ylabel("worst relative rounding error"); plt.legend(loc="lower left")
plt.title("fp16's window")
plt.show()
''', r'''%md
## 2. Where gradients live

Gradients of a language model are small: the loss is a mean over B·N tokens, and
each layer multiplies by weights of size ~0.02. Here are the fp32 gradients of a
tiny GPT after a few steps, against fp16's window.
''', r'''
cfg = GPTConfig(n_layer=2, d_model=32, n_head=2, seq_len=32)
data = Dataset(load_corpus(max_bytes=100_000), cfg.seq_len)
model = GPT(cfg, seed=0)
opt = AdamW(model.named_parameters(), lr=3e-3, weight_decay=0.0)
for step in range(5):
    x, y = data.batch(0, step, 8)
    _, loss = model(x, y)
    loss.backward()
    if step < 4:
        opt.step(); opt.zero_grad()
g = np.concatenate([p.grad.ravel() for p in model.parameters()])
g = np.abs(g[g != 0])
tiny16 = float(np.finfo(np.float16).smallest_subnormal)
lost = {}
for S in (1.0, 2.0 ** 16):
    with np.errstate(over="ignore"):
        lost[S] = np.mean((g * S).astype(np.float16) == 0)
    print(f"S = {S:>7.0f}: {lost[S]:.2%} of the gradient entries become 0 in fp16, largest |g·S| = {g.max() * S:.3g}")
assert lost[2.0 ** 16] < lost[1.0]
plt.figure(figsize=(7, 3))
plt.hist(np.log2(g), bins=80, color="C0")
plt.axvline(np.log2(tiny16), color="C3", label="fp16 smallest subnormal 2^-24")
plt.axvline(np.log2(6.1e-5), color="C1", ls="--", label="smallest normal 2^-14")
plt.axvline(np.log2(65504) - 16, color="C2", ls=":", label="overflow if scaled by 2^16")
plt.xlabel("log2 |gradient|"); plt.ylabel("gradient entries"); plt.legend(fontsize=8); plt.show()
''', r'''%md
Multiplying the loss by S multiplies every gradient by S (the chain rule is linear),
which slides this histogram right by log2 S: out of the flush-to-zero zone, as long
as the largest gradient stays below 65504. That is all loss scaling is.

## 3. An underflow that loss scaling rescues

A linear layer whose true gradient is ~1e-8 (below fp16's smallest subnormal): in
fp16 without scaling the gradient reaching the weights is exactly 0; with S = 2^16
it survives, and dividing the fp32 master gradient by S gives back the fp32 value.
''', r'''
rng = np.random.default_rng(3)
xin = rng.standard_normal((8, 3)).astype(np.float32)
reference = 1e-8 * xin.sum(0)[:, None].repeat(4, 1)     # dL/dW of L = 1e-8 · Σ (x W)

def master_grad(scale):
    layer = Linear(3, 4, np.random.default_rng(0), bias=False)
    amp = MixedPrecision(layer, "fp16")                  # fp16 weights, fp32 masters
    scaler = DynamicLossScaler(init_scale=scale, min_scale=scale)
    loss = ops.sum(layer(Tensor(xin.astype(np.float16)))) * 1e-8
    scaler.scale_loss(loss).backward()                   # backward of loss · S
    amp.grads_to_masters()                               # fp16 grads -> fp32 masters
    scaler.unscale_(amp.master_grads())                  # ... / S
    return amp.master_grads()[0]

rescued = {}
for S in (1.0, 2.0 ** 16):
    g = master_grad(S)
    rescued[S] = np.count_nonzero(g)
    print(f"S = {S:>7.0f}: nonzero {np.count_nonzero(g)}/{g.size}, "
          f"max relative error vs fp32 {np.max(np.abs(g - reference) / np.abs(reference)):.2e}")
assert rescued[1.0] == 0 and rescued[2.0 ** 16] == g.size
''', r'''%md
## 4. Accumulate in fp32

Rounding each partial sum to fp16 loses everything once the sum is large: at 2048 the
fp16 spacing is 2, so adding 1 does nothing. A dot product of length 4096 is a long
sum; that is why tensor cores (and minipar's matmul on half inputs) multiply half
numbers but **accumulate in fp32** and round once at the end.
''', r'''
ones = np.ones(4096, dtype=np.float16)
running = np.float16(0)
for v in ones:
    running = np.float16(running + v)      # every partial sum rounded to fp16
print("4096 ones summed in fp16:", running, "  in fp32:", ones.astype(np.float32).sum())
assert running == 2048

a = rng.standard_normal((64, 512)).astype(np.float16)
b = rng.standard_normal((512, 64)).astype(np.float16)
exact = a.astype(np.float64) @ b.astype(np.float64)
ours = ops.matmul(Tensor(a), Tensor(b)).data             # minipar: fp32 accumulate, round once
assert np.array_equal(ours, (a.astype(np.float32) @ b.astype(np.float32)).astype(np.float16))
naive = np.zeros((64, 64), dtype=np.float16)
for k in range(512):                                     # fp16 accumulation, for contrast
    naive = (naive + np.outer(a[:, k], b[k]).astype(np.float16)).astype(np.float16)
err = lambda m: np.abs(m.astype(np.float64) - exact).mean()
print(f"mean abs error: fp32-accumulated {err(ours):.4f}, fp16-accumulated {err(naive):.4f}")
assert err(ours) < err(naive)
''', r'''%md
## 5. Master weights

An AdamW update is about lr ≈ 1e-4..1e-3 of a weight. For a weight near 1 the fp16
spacing is 2^-10 ≈ 9.8e-4, so an update of 1e-4 rounds away — every step, forever.
The fp32 master accumulates it; the half copy follows once the sum shows.

`MixedPrecision` (`minipar/amp/master.py`) is two loops: gradients go up into the fp32
masters (summed there, so gradient accumulation happens in fp32), and after the
optimizer step the masters are rounded down into the model:
''', r'''
print(inspect.getsource(MixedPrecision.grads_to_masters))
print(inspect.getsource(MixedPrecision.masters_to_model))
''', r'''
layer = Linear(1, 1, np.random.default_rng(0), bias=False)
layer.weight.data[...] = 1.0
amp = MixedPrecision(layer, "fp16")
direct = np.float16(1.0)
trace = []
for _ in range(200):
    direct = np.float16(direct + np.float16(1e-4))       # updating the half weight itself
    amp.masters[0].data += 1e-4                          # updating the fp32 master
    amp.masters_to_model()
    trace.append((float(direct), float(amp.masters[0].data[0, 0]), float(layer.weight.data[0, 0])))
trace = np.array(trace)
plt.figure(figsize=(6, 3))
plt.plot(trace[:, 0], label="fp16 weight updated in fp16")
plt.plot(trace[:, 1], label="fp32 master")
plt.plot(trace[:, 2], label="fp16 copy of the master", ls="--")
plt.xlabel("update"); plt.ylabel("weight"); plt.legend(); plt.show()
assert trace[-1, 0] == 1.0 and trace[-1, 2] > 1.01
''', r'''%md
### Exercise 1 — a small update, on a half weight and on a master

Write `half_weight_after(w0, delta, steps, master)`: the fp16 weight after `steps`
updates `w += delta`, starting from `w0`.

- `master=False`: the update is applied to the fp16 weight itself — each sum is
  rounded to fp16 (`np.float16(w + np.float16(delta))`);
- `master=True`: it is applied to an fp32 master (`np.float32` arithmetic) and the
  fp16 weight is the master rounded at the end, as `MixedPrecision.masters_to_model`
  does.

The check compares your master version with the library's (`MixedPrecision` on a
1×1 layer) and your direct version with the trace above, then prints what each
does to three (w0, delta) pairs.
''', r'''%exercise half_weight_after
def half_weight_after(w0, delta, steps, master):
    """The fp16 weight after `steps` updates of +delta from w0 (see above); a np.float16."""
    raise NotImplementedError("hint: the two cases differ only in the format that holds w "
                              "between one addition and the next; the model reads w in fp16")
''', r'''
def library_half_weight(w0, delta, steps):
    """The same through minipar: an fp16 layer with its fp32 master."""
    layer = Linear(1, 1, np.random.default_rng(0), bias=False)
    layer.weight.data[...] = w0
    amp = MixedPrecision(layer, "fp16")
    for _ in range(steps):
        amp.masters[0].data += np.float32(delta)
        amp.masters_to_model()
    return layer.weight.data[0, 0]

assert half_weight_after(1.0, 1e-4, 200, master=False) == trace[-1, 0]
assert half_weight_after(1.0, 1e-4, 200, master=True) == trace[-1, 2]
print(f"{'w0':>5} {'delta':>7} {'steps':>5} {'exact':>9} {'fp16 direct':>12} {'via master':>11}"
      f"   moved / exact move: direct, master")
for w0, delta, steps in [(1.0, 1e-4, 200), (0.1, 1e-4, 200), (3.0, -1e-3, 50)]:
    direct = half_weight_after(w0, delta, steps, master=False)
    mastered = half_weight_after(w0, delta, steps, master=True)
    assert mastered == library_half_weight(w0, delta, steps), (w0, delta, steps)
    assert isinstance(direct, np.float16) and isinstance(mastered, np.float16)
    exact = w0 + steps * delta
    moved = lambda w: (float(w) - np.float16(w0)) / (exact - w0)
    print(f"{w0:>5} {delta:>7} {steps:>5} {exact:>9.5f} {float(direct):>12.5f} {float(mastered):>11.5f}"
          f"   {moved(direct):6.1%} {moved(mastered):6.1%}")
    assert abs(float(mastered) - exact) <= abs(float(direct) - exact)
print("your master weight matches MixedPrecision's")
''', r'''%md
Read the table: at w0 = 1 the direct update is **lost** (1e-4 is below half the
spacing 2^-10, so the weight never moves: 0 % of the move); at w0 = 0.1 (spacing
2^-14 ≈ 6.1e-5) every 1e-4 is rounded up to 2 spacings = 1.22e-4, so the direct weight
moves 122 % of the way; at w0 = 3 (spacing 2^-9 ≈ 1.95e-3) each −1e-3 becomes a whole
spacing, and it moves almost twice as far. Through the master every case ends within
half a spacing of the exact value. A half weight updated in place is stuck or biased,
by an amount that depends on where the weight happens to sit — whatever the learning
rate says.

## 6. The dynamic loss scale

The rules of `DynamicLossScaler` follow PyTorch's GradScaler (initial 2^16, ×2 after
`growth_interval` = 2000 clean steps, ×0.5 on overflow) with DeepSpeed's
**hysteresis** (S is lowered only at the `hysteresis`-th overflow in a row, 2 by
default) and a floor `min_scale`. Every step with an inf/NaN gradient is **skipped**:
no update of weights or optimizer state. The scaler's state is three numbers:
`scale`, `clean_steps` (clean steps since the last overflow or growth) and
`overflows_left` (overflows still tolerated before a backoff).

### Exercise 2 — the scaler's update

Write `scaler_update(scale, clean_steps, overflows_left, found_inf, ...)`, returning the
new `(scale, clean_steps, overflows_left)` after one step:

- **overflow**: the clean-step count restarts at 0; if this is the `hysteresis`-th
  overflow in a row or later (`overflows_left <= 1`), back off:
  S = max(S · backoff, min_scale), else spend one of `overflows_left`;
- **clean**: the overflow run is forgotten (`overflows_left = hysteresis`); one more
  clean step, and after `growth_interval` of them S grows by `growth_factor` and the
  count restarts.

The check feeds one sequence of overflow flags to yours and to the library's
`DynamicLossScaler` and compares the three numbers after every step.
''', r'''%exercise scaler_update
def scaler_update(scale, clean_steps, overflows_left, found_inf, *, growth_factor=2.0,
                  backoff_factor=0.5, growth_interval=2000, hysteresis=2, min_scale=1.0):
    """One step of the dynamic loss scale: returns (scale, clean_steps, overflows_left)."""
    raise NotImplementedError("hint: the two bullets above, one branch each; the check names "
                              "the first step where your three numbers part from the library's")
''', r'''
rules = dict(growth_factor=2.0, backoff_factor=0.5, growth_interval=3, hysteresis=2,
             min_scale=2.0 ** 10)
flags = [False] * 4 + [True] + [False] * 2 + [True] * 5 + [False] * 7 + [True, False, True, True]
flags += list(np.random.default_rng(0).random(30) < 0.3)       # and 30 random ones
library = DynamicLossScaler(init_scale=2.0 ** 12, **rules)
mine = (library.scale, library.clean_steps, library.overflows_left)
scales = []
for step, found_inf in enumerate(flags):
    library.update(bool(found_inf))
    mine = scaler_update(*mine, bool(found_inf), **rules)
    want = (library.scale, library.clean_steps, library.overflows_left)
    assert tuple(mine) == want, f"step {step} (overflow={found_inf}): yours {mine}, library {want}"
    scales.append(mine[0])
print(f"{len(flags)} steps, {sum(flags)} overflows: your scaler agrees with DynamicLossScaler")

fig, ax = plt.subplots(figsize=(7, 2.6))
ax.step(range(len(flags)), np.log2(scales), where="post", label="log2 S after the step")
over = [i for i, f in enumerate(flags) if f]
ax.scatter(over, np.log2(scales)[over], color="C3", zorder=3, label="overflow")
ax.axhline(np.log2(rules["min_scale"]), color="gray", ls=":", label="min_scale")
ax.set_xlabel("step"); ax.set_ylabel("log2 S"); ax.legend(fontsize=8); plt.show()
''', r'''%md
The library's version (`minipar/amp/scaler.py`) — the same few lines:
''', r'''
print(inspect.getsource(DynamicLossScaler.update))
''', r'''%md
### One step, in order

`amp_optimizer_step` (`minipar/amp/step.py`) is lesson 09's one-process view of the
trainer's step (`minipar/parallel/step.py`, `Optimizer.step`, which does the same on
whatever slots the gradient synchroniser hands it): unscale *before* measuring the
norm and clipping (the clip threshold is about the true gradient), agree on found-inf,
then either step or skip — and update the scale either way.
''', r'''
print(inspect.getsource(amp_optimizer_step))
''', r'''%md
### Training with dynamic loss scaling

First the plain comparison: the same 40 steps in fp32, fp16 (default scaler) and bf16
(no scaling: S = 1). Then, to see the scaler act within a few dozen steps, an fp16
run that starts far too high (S = 2^20, so S·∂L/∂logits passes 65504) and tries to
grow again every 8 clean steps.
''', r'''
cfg = GPTConfig(n_layer=2, d_model=32, n_head=2, seq_len=32)
STEPS = 40

def run(precision, **scaler_options):
    model = GPT(cfg, seed=0)
    if precision == "fp32":
        opt = AdamW(model.named_parameters(), lr=3e-3, weight_decay=0.0)
    else:
        amp = MixedPrecision(model, precision)
        opt = AdamW(amp.named_masters(), lr=3e-3, weight_decay=0.0)
        scaler = make_scaler(precision, **scaler_options)
    log = []
    for step in range(STEPS):
        x, y = data.batch(0, step, 8)
        if precision == "fp32":
            _, loss = model(x, y)
            loss.backward()
            clip_grad_norm(model.parameters(), 1.0)
            opt.step(); opt.zero_grad()
            log.append((loss.item(), False, 1.0))
        else:
            with np.errstate(over="ignore", invalid="ignore"):   # overflows are expected
                loss, norm, skipped, scale = amp_train_step(model, amp, opt, scaler, x, y, 1, 1.0)
            log.append((loss, skipped, scale))
    return log

runs = {p: run(p) for p in ("fp32", "fp16", "bf16")}
final = {p: np.mean([r[0] for r in log[-5:]]) for p, log in runs.items()}
for p in ("fp16", "bf16"):
    rel = (final[p] - final["fp32"]) / final["fp32"]
    print(f"{p}: mean loss of the last 5 steps {final[p]:.4f}, fp32 {final['fp32']:.4f} "
          f"({rel:+.3%}); skipped steps: {sum(r[1] for r in runs[p])}")
    assert abs(rel) < 0.03
''', r'''
hot = run("fp16", init_scale=2.0 ** 20, growth_interval=8, hysteresis=2)
skips = [i for i, r in enumerate(hot) if r[1]]
print("skipped steps:", skips)
fig, (ax1, ax2) = plt.subplots(2, 1, figsize=(7, 5), sharex=True)
ax1.plot([r[0] for r in runs["fp32"]], label="fp32")
ax1.plot([r[0] for r in hot], label="fp16, S from 2^20")
ax1.scatter(skips, [hot[i][0] for i in skips], color="C3", zorder=3, label="skipped step")
ax1.set_ylabel("loss"); ax1.legend()
ax2.step(range(STEPS), [np.log2(r[2]) for r in hot], where="post")
ax2.scatter(skips, [np.log2(hot[i][2]) for i in skips], color="C3", zorder=3)
ax2.set_ylabel("log2 S used in the step"); ax2.set_xlabel("step")
plt.show()
assert skips[:2] == [0, 1] and hot[0][2] == hot[1][2] == 2.0 ** 20   # hysteresis: S kept once
assert hot[2][2] < 2.0 ** 20                                          # then backed off
''', r'''%md
Reading the plot: the first step overflows but S stays (hysteresis absorbs one
overflow); from the 2nd overflow in a row S halves at every step until the gradients
fit. Skipped steps leave the model as it was, so the fp16 curve lags fp32 by as many
updates as were skipped, then follows it. Every 8 clean steps S doubles; if that
overflows once, the step is skipped but S kept (hysteresis); a second overflow in a
row brings it back down. S hovers just below the largest safe value: the point of a
*dynamic* scale. (With the real `growth_interval` of 2000, skips are rare.)

## 7. Skipping is a decision of the whole grid

With tensor or pipeline parallelism, ranks hold *different* parameters, so an
overflow may show up on one rank only. If that rank skipped while the others
stepped, the model would no longer be one model. So the found-inf flag is reduced
with **max over every rank** (`minipar.comm.all_reduce(comm, flag, op="max")`)
before anyone steps: `DynamicLossScaler(comm=world)`:
''', r'''
print(inspect.getsource(DynamicLossScaler.found_inf))
''', r'''%md
`09_mixed_precision.py` runs 3 ranks, each with its own model and data; an inf is
planted in one gradient of the last rank at steps 3 and 4. Each rank reports which
steps it skipped, whether its *own* gradients were non-finite (its un-reduced
verdict), whether the skipped steps left its masters, half weights and AdamW state
untouched, and the scale each step used.
''', r'''
PLANT = (3, 4)
proc = mpirun(3, ["09_mixed_precision.py", "--backend", BACKEND, "--steps", "10",
                  "--plant", ",".join(map(str, PLANT))])
ranks = [json.loads(line) for line in proc.stdout.splitlines() if line.startswith("{")]
print(f"{'rank':>4} {'own inf at':>11} {'skipped':>8} {'untouched':>10} {'optimizer steps':>16}  scales used")
for r in ranks:
    where = lambda key: [s for s, v in enumerate(r[key]) if v]
    print(f"{r['rank']:>4} {str(where('own_inf')):>11} {str(where('skipped')):>8} "
          f"{str(where('untouched')):>10} {r['optimizer_steps']:>16}  {[int(s) for s in r['scales']]}")
assert len(ranks) == 3
for r in ranks:
    assert [s for s, v in enumerate(r["skipped"]) if v] == list(PLANT)     # every rank skips both
    assert r["untouched"] == r["skipped"]                   # a skip changes nothing, a step does
    assert r["scales"][PLANT[0]] == r["scales"][0] and r["scales"][-1] == r["scales"][0] / 2
    assert r["losses"][-1] < r["losses"][1]                 # and training goes on
assert [any(r["own_inf"]) for r in ranks] == [False, False, True]   # only the last rank saw an inf
''', r'''%md
Only rank 2 saw an inf; all three skipped steps 3 and 4 and left their state as it was;
the scale was kept at the first overflow (hysteresis 2) and halved at the second, on
every rank; afterwards every rank stepped again and its loss kept falling.

The trainer's step (`parallel.step.Optimizer`) spends no collective on the flag alone: it
travels in the all-reduce that sums the gradient norm, one sum over every rank of
[Σ w·g² / copies, flag], where copies counts the ranks holding the same part (DDP's
replicas; `parallel/norm.py`). A sum of flags ≥ 0 is > 0 exactly when one is, and the
norm comes out as the sum over the norm's own groups would give it.

### Exercise 3 — the whole step, on two data-parallel ranks

Write `amp_step(comm, model, masters, optimizer, scaler, x, y, max_norm)`: one training step of an
fp16 data-parallel run on this rank's rows, in the order of the trainer's step:

1. forward, then **scale**: backward of the loss times S = `scaler.scale`, which leaves the half
   gradients of S·loss in the model's `p.grad`;
2. **all-reduce the gradients** as DDP does: every half gradient times 1/p, in one flat fp16 buffer,
   summed by one `all_reduce(comm, buffer)` — the mean over the replicas, half the bytes of fp32 on the wire;
3. **unscale into fp32**: the buffer's fp32 copy, times 1/S;
4. **one all-reduce for the norm and the decision**: the two float64 numbers [Σ g²/p, flag] summed over
   the ranks, flag 1 where this rank's fp32 gradient holds an inf or NaN, else 0 (each replica holds the
   whole gradient, so the sum over p of them counts it p times: hence the 1/p);
5. a summed flag above 0: **skip** — nothing is updated, `scaler.update(True)` applies exercise 2's rule,
   return `(loss, None)`;
6. else the norm is the root of the first number; **clip** as minipar does (times max_norm/(norm + 1e-6)
   where norm > max_norm); each master's slice of the gradient goes into its `master.grad`,
   `optimizer.step()` runs AdamW on the fp32 masters (then `optimizer.zero_grad()`); **publish**: each
   half weight becomes its master rounded to fp16; `scaler.update(False)`; return `(loss, norm)`.

Either way the half gradients are dropped (`p.grad = None`) before the next step. `masters` are the fp32
`Parameter`s of `model.parameters()`, in that order; `loss` is `loss.item()` of this rank's rows.

Why the flag rides in the norm's message even here: in DDP the gradients' all-reduce already carries an
inf from one replica to all (inf + x = inf), but under ZeRO or tensor parallelism each rank checks a
different part of the gradient, and the trainer's one step serves every layout; a message of two
numbers costs the latency of a message of one.

The check (`09_yours.py`, 2 ranks) runs your step beside minipar's own — the same GPT under
`DDPSync(half_dtype=float16)` and `parallel.step.Optimizer` with `DynamicLossScaler(comm=world)` — for 6
steps, an inf planted into rank 1's gradient at steps 3 and 4: after every step the decision, the scale,
the norm, the masters and AdamW's m and v by name, the half weights against the rounded masters, and
the bytes and messages of the step (one all-reduce of the N half gradients and one of two numbers:
2(p-1)/p·(2N + 16) bytes). A wrong step is one line that names the rank, the step and what differs.
''', r'''%exercise amp_step
%%writefile {MINE}/my_amp_step.py
import math

import numpy as np
from minipar.comm import all_reduce


def amp_step(comm, model, masters, optimizer, scaler, x, y, max_norm):
    """One fp16 training step of data parallelism; returns (this rank's loss, the norm or None if skipped)."""
    raise NotImplementedError("hint: one stage at a time, in the order above; the check names the "
                              "first step and quantity where your run parts from minipar's")
''', r'''
proc = mpirun(2, ["09_yours.py", "--backend", BACKEND, "--file", os.path.join(MINE, "my_amp_step.py")])
print(proc.stdout)
''', r'''%md
## Summary

- fp16: 5 exponent bits; range 6e-8 .. 65504. bf16: fp32's range, 8 significant bits (7 stored + the implicit 1),
  about 2.4 decimal digits.
- Half inputs, fp32 accumulation: `ops.matmul`/`ops.linear` on half arrays compute in
  fp32 and round once (on NumPy; cuBLAS does the same on a GPU); softmax, layer norm,
  cross-entropy and sums are taken in fp32 and the loss is fp32.
- `MixedPrecision(model, "fp16")`: half parameters, fp32 `masters` for the optimizer;
  an update on a half weight is lost or biased, on the master it accumulates.
- `DynamicLossScaler`: scale, unscale before clipping, skip on inf/NaN on *any* rank,
  backoff after `hysteresis` overflows, growth after `growth_interval` clean steps.
- `amp_train_step(...)` returns `(loss, grad_norm, skipped, scale)`; the trainer's step is
  `parallel.step.Optimizer`, and the training log writes `loss_scale` and `skipped` per
  step: `python -m minipar train --precision fp16`.

''', r'''%md
## What changes on GPU nodes and at scale

- On tensor cores half precision is the point: 989 TFLOP/s of bf16 against 67 of fp32 on an H100
  (spec-sheet profile). bf16 needs no loss scaling (fp32's exponent range); fp16 does.
- The loss scaler's overflow check must not read each gradient back to the host: one fused kernel
  over all gradient buffers writes a flag that is read once per step (PyTorch's GradScaler, minipar's
  `unscale_check_norm`, counted on the fake CuPy: at most 2 host syncs per step).
- Measured on one H200 before those fixes, fp16 ran at 0.35× fp32's tokens/s (8,513 against 24,532).

## In PyTorch / DeepSpeed / Megatron this is …

- **PyTorch**: `torch.autocast(device_type="cuda", dtype=torch.float16)` picks half or fp32
  per op (our rule 1); `torch.amp.GradScaler` is `DynamicLossScaler` without hysteresis
  (`init_scale=65536`, `growth_factor=2`, `backoff_factor=0.5`, `growth_interval=2000`;
  `scaler.scale(loss).backward()`, `scaler.unscale_(optimizer)` before clipping,
  `scaler.step(optimizer)` skips on inf, `scaler.update()`). PyTorch keeps the parameters
  fp32 and casts them per op, so it needs no separate masters; with bf16 no scaler.
- **DeepSpeed**: the `"fp16"` config block — `"loss_scale": 0` (dynamic),
  `"initial_scale_power": 16`, `"loss_scale_window"` (our `growth_interval`),
  `"hysteresis"`, `"min_loss_scale"` — or `"bf16": {"enabled": true}`; its fp16
  optimizer and ZeRO keep the fp32 masters (sharded under ZeRO, as minipar's ZeRO does).
- **Megatron-LM**: `--fp16` / `--bf16`, `--initial-loss-scale`, `--min-loss-scale`,
  `--loss-scale-window`, `--hysteresis`; `DynamicGradScaler` and the mixed-precision
  optimizer that keeps fp32 main parameters behind 16-bit model parameters.
- **NVIDIA Apex** `amp` (`O1`/`O2`) was the first packaging of these rules.
''']
