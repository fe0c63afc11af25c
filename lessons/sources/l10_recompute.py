"""Lesson 10: the cells of lessons/10_recompute.ipynb (``%md`` cells are markdown).

Edit here, then run ``python lessons/make_notebooks.py``."""

NOTEBOOK = "10_recompute.ipynb"

CELLS = [r'''%md
# 10 · Activation recomputation

Backward needs what forward computed: dW = xᵀ·dy needs the layer's input x, the
GELU derivative needs its input, softmax's backward needs its output P. So training
keeps the **activations** of every layer alive from its forward until its backward.
For long sequences they outgrow the weights: Korthikanti et al. (2022, *Reducing
Activation Recomputation in Large Transformer Models*) count, per transformer layer,
with s = sequence, b = batch, h = hidden, a = heads, 2-byte activations and 1-byte
dropout masks,

$$\text{bytes per layer} \approx s\,b\,h\left(34 + 5\,\frac{a\,s}{h}\right)$$

The 5as/h part is the attention core — scores/softmax output (2as²b bytes), its
dropout mask (as²b) and dropout output (2as²b) — quadratic in s.

**Recomputation** (checkpointing) keeps less and computes again: a checkpointed
function runs forward *without* recording its graph, keeps only its inputs, and in
backward runs forward once more, with the graph, to back-propagate through it.

- `--recompute full`: checkpoint each whole block: 2sbh bytes per layer remain, at the
  price of one extra forward of the blocks (≈ +33 % compute: forward 1, backward 2);
- `--recompute selective`: checkpoint only the attention core q, k, v → y: the 5as/h
  term disappears, and the re-run costs no weight matmul.

Plan: (1) `checkpoint` on a small function; (2) why the random state must be
restored — **exercise**: write the checkpoint, forward and backward, and run a GPT
block with dropout through it; (3) memory measured per layer against a
per-op count — **exercise**: Korthikanti's formula; (4) memory vs sequence length;
(5) the compute price, measured with its noise; (6) bit-identity on a GPT.
''', r'''
import gc
import inspect
import time

import matplotlib.pyplot as plt
import numpy as np

from minipar import backend
from minipar.amp import MixedPrecision
from minipar.autograd import Function, Tensor, ops, set_grad_enabled
from minipar.backend import memory
from minipar.nn import GPT, GPTConfig
from minipar.perf.activations import korthikanti_layer_bytes
from minipar.recompute import (Checkpoint, Recompute, apply_recompute, checkpoint, rng_state,
                               set_rng_state)

%matplotlib inline
backend.set_default_dtype(np.float64)      # float64: bit-identity is then a strong statement
''', r'''%md
## 1. `checkpoint(fn, *inputs)`

A chain of tanh layers. Without checkpointing every intermediate is kept until
backward; with it, only the input. `memory` is the backend's counter of live tracked
arrays (tensors and saved activations).
''', r'''
rng = np.random.default_rng(0)
weights = [Tensor(rng.standard_normal((256, 256)) / 16, requires_grad=True) for _ in range(8)]
x0 = rng.standard_normal((64, 256))

def chain(x):
    for w in weights:
        x = ops.tanh(x @ w)
    return x

def held_after_forward(wrap=None):
    """Bytes held between forward and backward, and the gradients, of chain or wrap(chain, x)."""
    gc.collect()
    start = memory.live
    x = Tensor(x0, requires_grad=True)
    y = wrap(chain, x) if wrap else chain(x)
    held = memory.live - start
    ops.sum(y * y).backward()
    grads = [w.grad.copy() for w in weights] + [x.grad]
    for w in weights:
        w.grad = None
    return held, grads

plain, ckpt = held_after_forward(), held_after_forward(checkpoint)
print(f"held after forward: {plain[0] / 1e6:.2f} MB plain, {ckpt[0] / 1e6:.2f} MB checkpointed "
      f"(the input alone is {x0.nbytes / 1e6:.2f} MB)")
same = all(np.array_equal(a, b) for a, b in zip(plain[1], ckpt[1]))
print("gradients identical:", same)
assert same and ckpt[0] < plain[0] / 4
''', r'''%md
## 2. Dropout: restore the random state

The re-run must draw the *same* dropout masks, or backward differentiates a different
function than forward computed. `checkpoint(..., generator=g)` saves `g`'s state
before the forward (`g.bit_generator.state` for a NumPy Generator), restores it for the
re-run, and afterwards puts `g` back where backward found it, so later draws are not
disturbed. Without the generator the gradients are simply wrong:
''', r'''
gen = np.random.default_rng(7)
w = Tensor(rng.standard_normal((16, 16)), requires_grad=True)
a = rng.standard_normal((4, 16))
fn = lambda x: ops.dropout(ops.tanh(x @ w), 0.5, gen)
start = rng_state(gen)

def grad_of_w(mode):
    set_rng_state(gen, start)
    x = Tensor(a, requires_grad=True)
    y = fn(x) if mode == "plain" else checkpoint(fn, x, generator=gen if mode == "restored" else None)
    ops.sum(y).backward()
    g, w.grad = w.grad, None
    return g

reference = grad_of_w("plain")
restored, forgotten = grad_of_w("restored"), grad_of_w("forgotten")
print("state restored:     identical =", np.array_equal(reference, restored))
print("state not restored: identical =", np.array_equal(reference, forgotten))
assert np.array_equal(reference, restored) and not np.array_equal(reference, forgotten)
''', r'''%md
### Exercise 1 — a checkpoint, forward and backward

Write the checkpoint yourself: an autograd `Function` (lesson 01) with two halves.

- **forward**`(ctx, fn, generator, *arrays)`: run `fn` on Tensors of `arrays` with the graph
  switched off (`set_grad_enabled(False)`), so nothing inside is kept; keep what backward will need
  to run it again — the inputs, saved with `ctx.save_for_backward` so that the memory counter sees
  them, and, when a `generator` is given, its state (`rng_state`); return the output's array.
- **backward**`(ctx, g)`: run `fn` again on fresh Tensors of the saved inputs — with the graph this
  time, the inputs asking for a gradient where `ctx.needs_input_grad` does (its first two entries
  are `fn`'s and `generator`'s), and the generator set back to the saved state for the re-run, then
  returned to where backward found it; back-propagate `g` through that copy (the parameters inside
  `fn` receive their `.grad` right there) and return one gradient per forward argument: `None` for
  `fn` and for `generator`, then each input's.

The check runs the tanh chain through it, and then a GPT block with dropout 0.1 in float64: the
gradients of every block parameter and of the input must equal plain autograd's **bit for bit**,
the bytes held between forward and backward must be exactly those of minipar's `checkpoint` (and
far below the plain block's), and the generator must end where plain training leaves it.
''', r'''%exercise my_checkpoint
class MyCheckpoint(Function):
    """out = fn(*inputs), keeping only the inputs (and the random state) for backward;
    backward runs fn again, with the graph, and back-propagates through that copy."""

    @staticmethod
    def forward(ctx, fn, generator, *arrays):
        raise NotImplementedError("hint: which of fn's arrays does backward need, and which can it "
                                  "make again? keep only the first kind (the input, and where the "
                                  "random draws started)")

    @staticmethod
    def backward(ctx, g):
        raise NotImplementedError("hint: recreate the forward exactly, with the graph this time, and "
                                  "back-propagate g through the copy; the check names what differs")


def my_checkpoint(fn, *inputs, generator=None):
    return MyCheckpoint.apply(fn, generator, *inputs)
''', r'''
def differs(mine, ref):
    """One line naming the first gradient not bit-identical to plain autograd's, or None."""
    for name, r in ref.items():
        m = mine.get(name)
        if m is None or np.shape(m) != r.shape:
            return f"the gradient of {name} is {'missing' if m is None else f'of shape {np.shape(m)}'}"
        if not np.array_equal(m, r):
            i = np.unravel_index(np.argmax(np.abs(m - r)), r.shape)
            return f"the gradient of {name}{[int(j) for j in i]} is {float(m[i])!r}, plain autograd's {float(r[i])!r}"
    return None

gen_net = GPT(GPTConfig(n_layer=2, d_model=32, n_head=4, seq_len=32, dropout=0.1), seed=0)
block, block_generator = gen_net.blocks[0], gen_net.dropout_rng
x_block = rng.standard_normal((4, 32, 32))
upstream = rng.standard_normal(x_block.shape)
generator_start = rng_state(block_generator)

def block_run(wrap=None):
    """A block's forward and backward: bytes held in between (beyond its input), gradients, and
    where the generator ends."""
    set_rng_state(block_generator, generator_start)
    block.zero_grad()
    gc.collect()
    start = memory.live
    x = Tensor(x_block.copy(), requires_grad=True)
    y = wrap(block, x, generator=block_generator) if wrap else block(x)
    held = memory.live - start - x.data.nbytes
    block_generator.random(3)             # the later blocks' dropout draws, between forward and backward
    y.backward(upstream)
    grads = {"x": x.grad, **{n: p.grad.copy() for n, p in block.named_parameters()}}
    return held, grads, rng_state(block_generator)

(plain_held, plain_grads, plain_end), (lib_held, _, _) = block_run(), block_run(checkpoint)

def check_my_checkpoint():
    held, grads = held_after_forward(my_checkpoint)
    names = [f"weights[{i}]" for i in range(len(weights))] + ["x"]
    if problem := differs(dict(zip(names, grads)), dict(zip(names, plain[1]))):
        return f"tanh chain: {problem}"
    if held != ckpt[0]:
        return f"tanh chain: yours holds {held:,} bytes after forward, minipar's checkpoint {ckpt[0]:,}"
    held, grads, end = block_run(my_checkpoint)
    if problem := differs(grads, plain_grads):
        return f"GPT block with dropout: {problem}"
    if held != lib_held:
        return (f"GPT block: yours holds {held:,} bytes between forward and backward, minipar's "
                f"checkpoint {lib_held:,} (the plain block {plain_held:,})")
    if end != plain_end:
        return ("GPT block: after your backward the generator is not where plain training leaves it "
                "(the draws made after this block's forward would repeat)")
    return None

problem = check_my_checkpoint()
assert problem is None, problem
assert lib_held < plain_held / 10
print(f"your checkpoint: gradients bit-identical to plain autograd on the tanh chain and on a GPT block "
      f"with dropout; the block holds {lib_held / 1e3:.0f} kB between forward and backward, "
      f"against {plain_held / 1e3:.0f} kB without a checkpoint (as minipar's checkpoint)")
''', r'''%md
The library's version (`minipar/recompute.py`) is yours, plus the weight-gradient deferral of a
zero-bubble pipeline (lesson 08) handed on to the re-run:
''', r'''
print(inspect.getsource(Checkpoint))
''', r'''%md
## 3. Memory per layer, measured

`apply_recompute(model, mode)` switches a GPT's blocks between `"none"`, `"full"`
and `"selective"`. It changes no class and patches no method: `"full"` replaces each
`model.blocks[i]` by a `Recompute(block)` wrapper, `"selective"` replaces each
block's attention core, `attn.core = Recompute(attn.core)`; the wrapper has the same
parameters under the same names, and `"none"` unwraps again. The wrapper is four lines:
''', r'''
print(inspect.getsource(Recompute))
''', r'''%md
To isolate one layer we measure a 2-layer and a 4-layer model and halve the
difference of the bytes **held after forward** (everything kept for backward). With
two sequence lengths we can split it into c₁·sbh + c₂·as²b.
''', r'''
B, H, A = 4, 32, 4

def held_per_layer(mode, precision="fp16", seq=32, dropout=0.0):
    held = []
    backend.set_default_dtype(np.float32)
    for layers in (2, 4):
        model = GPT(GPTConfig(n_layer=layers, d_model=H, n_head=A, seq_len=seq, dropout=dropout), seed=0)
        if precision == "fp16":
            MixedPrecision(model, precision)     # half parameters: half activations
        apply_recompute(model, mode)
        ids = np.random.default_rng(0).integers(0, 256, (B, seq))
        gc.collect(); gc.disable()
        start = memory.live
        logits, loss = model(ids, ids)
        held.append(memory.live - start)
        loss.backward()
        del logits, loss, model
        gc.enable()
    return (held[1] - held[0]) / 2

def coefficients(mode, precision="fp16", dropout=0.0):
    """Fit bytes = c1·sbh + c2·as²b from s = 32 and 64."""
    s1, s2 = 32, 64
    m1, m2 = (held_per_layer(mode, precision, s, dropout) for s in (s1, s2))
    M = np.array([[s1 * B * H, A * s1 * s1 * B], [s2 * B * H, A * s2 * s2 * B]], dtype=float)
    c1, c2 = np.linalg.solve(M, [m1, m2])
    return c1, (0.0 if abs(c2) < 1e-6 else c2)

rows = []
for precision in ("fp16", "fp32"):
    for dropout in (0.0, 0.1):
        for mode in ("none", "selective", "full"):
            c1, c2 = coefficients(mode, precision, dropout)
            rows.append((precision, dropout, mode, c1, c2))
print(f"{'precision':>9} {'dropout':>7} {'mode':>9}   bytes per layer")
for precision, dropout, mode, c1, c2 in rows:
    print(f"{precision:>9} {dropout:>7} {mode:>9}   sbh·({c1:6.2f} + {c2:4.1f}·as/h)")
print(f"{'Korthikanti':>9} {'0.1':>7} {'none':>9}   sbh·( 34.00 +  5.0·as/h)   (fp16, 1-byte masks)")
''', r'''%md
What of the estimate applies here, term by term (e = bytes per activation: 2 in fp16,
4 in fp32):

- **Attention core, c₂.** Megatron keeps softmax output (2), attention-dropout mask (1)
  and its output (2) = 5. minipar's GPT has no dropout on the attention probabilities,
  but keeps both the raw scores and P: **2e** (4 in fp16). Selective recomputation
  removes the whole term — the measured c₂ is 0.
- **The rest, c₁.** Megatron counts only what the backward math needs: 34 (fp16).
  minipar keeps more, for reasons worth knowing:
  - the graph node of every op holds its *input tensors* (to route gradients back),
    so every intermediate stays alive until backward — including outputs PyTorch
    would free (residual sums, projection outputs, the head-merge copy): 23 arrays of
    e·sbh per layer (y₁, qkv 3, P·v, merged heads, proj, residual, y₂, fc 4, tanh 4,
    GELU 4, mlp-proj, residual);
  - LayerNorm keeps its normalised x̂ in **fp32** even for half inputs (statistics in
    fp32): 2 × 4 = 8, plus 1/σ (8/h);
  - dropout adds a 1-byte mask and an e-byte output per dropout layer (2 per block):
    +6 in fp16, +10 in fp32; with dropout = 0 there are no masks at all.
  So fp16: 23·2 + 8 + 0.25 = **54.25** (+6 with dropout), fp32: **100.25** (+10).
- **Full recomputation** keeps one e·sbh input per block (the measured c₁ = e;
  Megatron's 2sbh is the same in fp16).

In fp32 every term doubles except the 1-byte masks and the fp32 x̂ — so half precision
and recomputation compound. The per-op count, checked against every measured row:
''', r'''
def predicted(precision, dropout, mode):
    e = 2 if precision == "fp16" else 4
    if mode == "full":
        return e, 0.0
    c1 = 23 * e + 8 + 8 / H + ((2 + 2 * e) if dropout else 0)
    return c1, (0.0 if mode == "selective" else 2 * e)

for precision, dropout, mode, c1, c2 in rows:
    p1, p2 = predicted(precision, dropout, mode)
    assert abs(c1 - p1) < 0.5 and abs(c2 - p2) < 0.1, (precision, dropout, mode, c1, c2, p1, p2)
print(f"measured coefficients match the per-op count in all {len(rows)} rows")
''', r'''%md
### Exercise 2 — Korthikanti's formula, per recomputation mode

Write `layer_activation_bytes(s, b, h, a, recompute)`: the bytes one Megatron layer
keeps for backward (16-bit activations, no tensor parallelism), for
`recompute = "none"` (the formula above), `"selective"` (the attention core's 5as/h
term is gone: the 34 remains) and `"full"` (only the layer's 2-byte input: 2sbh). The
check compares it with `minipar.perf.activations.korthikanti_layer_bytes` — the
function `minipar plan` uses to decide what fits (lesson 13) — over a grid of sizes,
and its `"full"` with what minipar measured above in fp16.
''', r'''%exercise layer_activation_bytes
def layer_activation_bytes(s, b, h, a, recompute="none"):
    """Bytes of one transformer layer's activations (Korthikanti et al. 2022, 16-bit, t = 1)."""
    raise NotImplementedError("hint: s·b·h·(34 + 5·a·s/h) without recomputation; selective "
                              "drops the 5·a·s/h term; full keeps only the 2-byte layer input")
''', r'''
for s in (128, 2048, 8192):
    for b, h, a in ((1, 768, 12), (4, 12288, 96)):
        for mode in ("none", "selective", "full"):
            mine, theirs = layer_activation_bytes(s, b, h, a, mode), korthikanti_layer_bytes(s, b, h, a, recompute=mode)
            assert np.isclose(mine, theirs), f"s={s} b={b} h={h} a={a} {mode}: yours {mine}, library {theirs}"
full_fp16 = [c1 for p, d, m, c1, _ in rows if p == "fp16" and m == "full"]
assert all(np.isclose(c * B * 64 * H, layer_activation_bytes(64, B, H, A, "full")) for c in full_fp16)
gpt3 = {m: layer_activation_bytes(2048, 1, 12288, 96, m) / 2 ** 30 for m in ("none", "selective", "full")}
print("matches korthikanti_layer_bytes; GPT-3 (s=2048, h=12288, a=96), one sequence, one layer: "
      + ", ".join(f"{m} {v:.2f} GiB" for m, v in gpt3.items()))
print(f"the attention core's share without recomputation: {1 - gpt3['selective'] / gpt3['none']:.0%}")
''', r'''%md
At GPT-3's size the attention term is 5·96·2048/12288 = 80 against 34: without
recomputation 70 % of a layer's activations are the as²b part (printed above), which selective
recomputation throws away at the price of re-running softmax and two batched matmuls.

## 4. Memory against sequence length

Per layer, fp16, dropout 0.1, b = 4, h = 32, a = 4: measured (dots) and the per-op
count (lines), with Korthikanti's estimate for the same sizes (your function, dashed).
The quadratic attention term dominates as s grows — exactly the part selective
recomputation removes at little cost.
''', r'''
seqs = [16, 48, 96]
grid = np.linspace(16, 96, 50)
plt.figure(figsize=(7, 3.5))
for mode, color in (("none", "C0"), ("selective", "C1"), ("full", "C2")):
    measured = [held_per_layer(mode, "fp16", s, 0.1) for s in seqs]
    c1, c2 = predicted("fp16", 0.1, mode)
    counted = lambda s: s * B * H * (c1 + c2 * A * s / H)
    assert np.allclose(measured, [counted(s) for s in seqs], rtol=0.02), (mode, measured)
    plt.plot(grid, counted(grid) / 1e3, color=color, alpha=0.5)
    plt.plot(seqs, np.array(measured) / 1e3, "o", color=color, label=f"{mode} (measured)")
    plt.plot(grid, [layer_activation_bytes(s, B, H, A, mode) / 1e3 for s in grid], "--", color=color,
             lw=0.8, label=f"{mode}, Korthikanti")
plt.xlabel("sequence length s"); plt.ylabel("kB per layer"); plt.legend(fontsize=7, ncol=2)
plt.title("activations kept per layer (fp16, dropout 0.1)")
plt.show()
''', r'''%md
## 5. The price: compute

Full recomputation runs every block's forward a second time in backward; selective
re-runs only q·kᵀ, softmax and P·v. What does that cost here? A single timing on a
shared 2-core machine moves by ±10 % from one run to the next (other processes, the
memory allocator, caches), more than selective recomputation's whole price: an earlier
version of this lesson printed a *negative* overhead for it, which was that noise. So we
measure like this:

- the clock is this process's **CPU time** (`time.process_time`), which other
  processes' load does not inflate the way it inflates wall time;
- every repeat times one step (forward + backward, fp32, dropout 0.1) of **each** mode,
  in a rotating order, so slow moments and warm caches hit all modes alike;
- per repeat, the ratio of a mode's time to the baseline's time of the same repeat;
  the **median** over 24 repeats is the overhead, and the middle half of the ratios
  (25th to 75th percentile) is its noise band. When the band contains 0 %, the
  difference is **within noise**: it says nothing, whatever its sign;
- a control: a second, identical baseline model ("none, again"). Its true overhead is
  0; what it shows is the noise alone.

What to expect, measured too: full recomputation adds one forward of the blocks run
*without* a graph (the checkpoint's first pass; the re-run with the graph replaces the
forward plain training does), so its price is that no-graph forward of the blocks
against the baseline step. The peak memory of a whole step, parameter gradients and one
layer's recomputed activations included, is measured alongside.
''', r'''
backend.set_default_dtype(np.float32)
cfg = GPTConfig(n_layer=4, d_model=64, n_head=4, seq_len=64, dropout=0.1)
ids = np.random.default_rng(1).integers(0, 256, (4, cfg.seq_len))
MODES = ("none", "selective", "full")
TIMED = ("none", "none, again", "selective", "full")     # "none, again": the noise alone
models = {name: apply_recompute(GPT(cfg, seed=0), name.split(",")[0]) for name in TIMED}
clock = time.process_time        # this process's CPU time: other processes' load does not count

def step_seconds(model):
    model.zero_grad(); gc.collect(); gc.disable()
    t0 = clock()
    _, loss = model(ids, ids)
    loss.backward()
    seconds = clock() - t0
    del loss, _
    gc.enable()
    return seconds

def forward_seconds(model, blocks_only=False):
    """The whole forward with its graph, or the blocks alone without one (what the
    checkpoint's first pass costs)."""
    gc.collect(); gc.disable()
    with set_grad_enabled(not blocks_only):
        x = model.embed(ids) if blocks_only else ids
        t0 = clock()
        if blocks_only:
            for block in model.blocks:
                x = block(x)
        else:
            x = model(ids, ids)
        seconds = clock() - t0
    del x
    gc.enable()
    return seconds

peaks = {}
for mode in MODES:                          # warm-up, and the peak (the same every step)
    step_seconds(models[mode])
    model = models[mode]; model.zero_grad(); gc.collect()
    start = memory.live; memory.reset_peak()
    _, loss = model(ids, ids); loss.backward()
    peaks[mode] = memory.peak - start
    del loss, _

REPEATS = 24
times = {name: [] for name in TIMED}
extra_forward, forward = [], []
for r in range(REPEATS):
    for name in TIMED[r % 4:] + TIMED[:r % 4]:           # a rotating order
        times[name].append(step_seconds(models[name]))
    extra_forward.append(forward_seconds(models["none"], blocks_only=True))
    forward.append(forward_seconds(models["none"]))
base = np.array(times["none"])
expected_full = np.median(np.array(extra_forward) / base)
forward_share = np.median(np.array(forward) / base)
overhead = {}
for name in TIMED:
    lo, mid, hi = np.percentile(np.array(times[name]) / base - 1, [25, 50, 75])
    overhead[name] = (lo, mid, hi)
    peak = f";  peak {peaks[name] / 1e6:5.2f} MB ({peaks[name] / peaks['none'] - 1:+5.0%})" if name in peaks else ""
    print(f"{name:>11}: step {np.median(times[name]) * 1e3:6.1f} ms CPU, vs baseline {mid:+6.1%} "
          f"(middle half {lo:+6.1%} .. {hi:+6.1%}){peak}")
print(f"\na forward is {forward_share:.0%} of a step here (the textbook's 1 : 2 split says 33 %)")
for name in TIMED[1:]:
    lo, mid, hi = overhead[name]
    if lo <= 0 <= hi:
        print(f"{name}: {mid:+.1%} is WITHIN NOISE (its band {lo:+.1%} .. {hi:+.1%} contains 0): "
              "no measurable difference in this run, whatever the sign of the median")
    else:
        print(f"{name}: {mid:+.1%}, beyond the noise (band {lo:+.1%} .. {hi:+.1%})")
print(f"full, expected: one no-graph forward of the blocks = {expected_full:+.1%} of a step; "
      f"measured {overhead['full'][1]:+.1%}")
assert peaks["full"] < peaks["selective"] < peaks["none"]

fig, ax = plt.subplots(figsize=(6.5, 3))
for i, name in enumerate(TIMED[1:]):
    ax.scatter(np.full(REPEATS, i) + np.linspace(-0.15, 0.15, REPEATS),
               100 * (np.array(times[name]) / base - 1), s=10, color=f"C{i}")
    lo, mid, hi = overhead[name]
    ax.errorbar(i + 0.3, 100 * mid, yerr=[[100 * (mid - lo)], [100 * (hi - mid)]], fmt="o",
                color="k", capsize=4)
ax.axhline(0, color="gray", lw=0.8)
ax.axhline(100 * expected_full, color="C2", ls="--", lw=0.8, label="expected for full")
ax.set_xticks([0, 1, 2]); ax.set_xticklabels(TIMED[1:])
ax.set_ylabel("step time vs baseline (%)"); ax.legend(fontsize=8)
ax.set_title("paired ratios per repeat; median and middle half in black"); plt.show()
''', r'''%md
How to read it. Each dot is one repeat; the black bar is the median and the middle
half. The control shows how far two identical models drift apart on this machine.
**A median whose band contains 0 % is not a measurement of a price** — a negative one
is not a speed-up (recomputation only ever adds work); the run says so above when it
happens. Selective recomputation re-runs only the attention core, a small part of the
step: from run to run its median lands inside the noise or some percent above it, so
compare its band with the control's before concluding anything.
Full recomputation stands clearly out, near the price expected from the blocks'
no-graph forward measured on its own; the two differ by the noise and by what the
estimate leaves out (the re-run's allocations land in warm caches, the two passes of a
block are timed together).

The textbook's +33 % assumes a backward twice as long as the forward and the whole
forward re-run. Here neither holds exactly: at these tiny sizes much of every op is
Python overhead, which forward and backward pay alike (the forward's share of a step is
printed above), the embedding, final norm, head and loss are not re-run, and the first
pass builds no graph. On a GPU at scale the 1 : 2 split is close, full recomputation
costs about a third more compute, and selective recomputation — where flash attention
re-runs the core anyway — is nearly free (Korthikanti et al. report 2–4 % for
GPT-3-size models). The memory numbers do not wobble: they are counts.

## 6. Bit-identical

Recomputation must not change a single bit: same inputs, same ops in the same order,
same dropout masks. Two optimizer-free steps of a GPT with dropout 0.1, in float64:
losses and every gradient compared with `==`.
''', r'''
backend.set_default_dtype(np.float64)
cfg = GPTConfig(n_layer=2, d_model=32, n_head=4, seq_len=32, dropout=0.1)

def losses_and_grads(mode):
    model = apply_recompute(GPT(cfg, seed=0), mode)
    out = []
    for step in range(2):
        ids = np.random.default_rng(step).integers(0, 256, (4, cfg.seq_len))
        _, loss = model(ids, ids)
        loss.backward()
        out.append((loss.item(), [p.grad.copy() for p in model.parameters()]))
        model.zero_grad()
    return out

reference = losses_and_grads("none")
for mode in ("full", "selective"):
    got = losses_and_grads(mode)
    same = all(a[0] == b[0] and all(np.array_equal(x, y) for x, y in zip(a[1], b[1]))
               for a, b in zip(reference, got))
    print(f"{mode}: bit-identical = {same}")
    assert same
backend.set_default_dtype(np.float32)
''', r'''%md
## Summary

- `checkpoint(fn, *inputs, generator=g)`: forward without a graph, inputs and the RNG
  state kept; backward re-runs `fn` and back-propagates through it.
- `apply_recompute(model, "none" | "full" | "selective")` wraps blocks or attention
  cores in `Recompute`; the training loop takes `--recompute`, and `peak_mem_bytes` in
  the log is the backend counter's peak per step.
- Per layer (fp16): Korthikanti's sbh(34 + 5as/h); minipar keeps sbh(54.25 + 4as/h)
  (+6 with dropout) because its graph holds every op's input and LayerNorm's x̂ is
  fp32. Selective removes the as/h term, full leaves 2sbh — for one extra forward.
- Timing a small difference needs paired repeats, a median and its spread; a negative
  overhead inside the noise band is noise.
- CuPy caveat: restoring dropout needs a generator whose state can be read and set;
  `rng_state` raises a clear error where a CuPy generator does not expose it.

''', r'''%md
## What changes on GPU nodes and at scale

- Priced with the A100 profile (a model, not a measurement; lesson 13): a 175B model on 1024 GPUs
  needs 84.9 GiB per GPU without recomputation — over the 80 GB — 62.4 GiB with selective recomputation
  at almost no extra time, and 53.4 GiB with full recomputation at +34% step time.
- Megatron recomputes nothing unless asked; selective recomputation is opt-in
  (`--recompute-granularity selective`) and the choice Korthikanti et al. recommend at scale:
  attention's N²-sized tensors are the cheapest to recompute per byte saved; flash attention
  (lesson 11) removes them altogether.

## In PyTorch / DeepSpeed / Megatron this is …

- **PyTorch**: `torch.utils.checkpoint.checkpoint(fn, *args, use_reentrant=False)` (the
  reentrant variant is our `Checkpoint`: a Function that re-runs `fn` in backward;
  `preserve_rng_state=True` is our `generator=`), `checkpoint_sequential` for a stack of
  layers; FSDP/`torch.distributed` wrap modules with `checkpoint_wrapper` /
  `apply_activation_checkpointing` — our `Recompute` wrapper.
- **Megatron-LM**: `--recompute-granularity full|selective`, `--recompute-method
  uniform|block`, `--recompute-num-layers`; `CheckpointFunction` and its
  `tensor_parallel.random.CudaRNGStatesTracker`, which restores each tensor-parallel
  rank's RNG state for the re-run.
- **DeepSpeed**: `deepspeed.checkpointing.checkpoint` and the config block
  `"activation_checkpointing"` (`partition_activations`, `cpu_checkpointing`,
  `contiguous_memory_optimization`).
''']
