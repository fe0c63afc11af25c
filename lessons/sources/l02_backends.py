"""Lesson 02: the cells of lessons/02_backends.ipynb (``%md`` cells are markdown).

Edit here, then run ``python lessons/make_notebooks.py``."""

NOTEBOOK = "02_backends.ipynb"

CELLS = [r'''%md
# 02 · Array backends: NumPy and CuPy, dtypes, and memory

minipar never imports NumPy or CuPy for compute outside one file, `minipar/backend.py`. Everything
else writes `xp.exp(...)`, `xp.zeros(...)`, and `xp` forwards to whichever library was selected
with `set_backend("numpy" | "cupy")` (or `MINIPAR_BACKEND`). CuPy mirrors the NumPy API, so the
**same model code** runs on a laptop CPU and on a GPU node.

This lesson covers the three things a training framework needs around that seam:

1. **where** an array lives (host vs device) and how to move it: `to_host`, `to_device`;
2. **in what precision** it is stored: fp64 / fp32 / fp16 / bf16 and their limits;
3. **how many bytes** are alive: the memory counter that ZeRO, recomputation and the training log
   read — you write it — used here to measure and predict the activation memory of a GPT forward.

Three exercises: **you write** the float32 → bfloat16 rounding; the memory counter itself (live
bytes per dtype and their peak, as arrays are made, viewed and freed); and the count of every byte
a GPT's forward keeps for backward. Each is checked against what minipar does, bit for bit or to
the byte (solutions: `lessons/solutions/02_backends.py`).
''', r'''
import inspect
import time

import matplotlib.pyplot as plt
import numpy as np

from minipar import backend
from minipar.backend import xp, to_host, to_device

%matplotlib inline
print("backend:", backend.backend_name(), "  xp ->", xp)
print("CuPy + GPU available:", backend.cupy_available())
''', r'''%md
## 1. The seam

This is all of it (`minipar/backend.py`): `xp` is an object whose every attribute look-up is
forwarded to the module `set_backend` chose, and `to_device` is the one place that copies to a GPU.
''', r'''
print(inspect.getsource(backend._ArrayModuleProxy))
print(inspect.getsource(backend.to_device))
''', r'''%md
A function written against `xp` does not know where it runs. Below: a GELU MLP block written once.
On the NumPy backend `to_device` is a no-op that returns a NumPy array; on CuPy it copies to GPU
memory, and `to_host` copies back (a `cudaMemcpy` — in real training such copies are kept off the
hot path).
''', r'''
def mlp_block(x, w1, w2):
    """GPT-2's tanh-GELU MLP on raw arrays, written only against xp."""
    h = x @ w1
    h = 0.5 * h * (1 + xp.tanh(0.7978845608 * (h + 0.044715 * h ** 3)))
    return h @ w2

rng = np.random.default_rng(0)
x_host = rng.normal(size=(16, 32)).astype(np.float32)
w1_host = rng.normal(scale=0.1, size=(32, 128)).astype(np.float32)
w2_host = rng.normal(scale=0.1, size=(128, 32)).astype(np.float32)

out = mlp_block(to_device(x_host), to_device(w1_host), to_device(w2_host))
print(type(out).__module__, out.shape, out.dtype, "device array:", backend.is_device_array(out))

# the reference in plain NumPy (float64)
h = x_host.astype(np.float64) @ w1_host
h = 0.5 * h * (1 + np.tanh(np.sqrt(2 / np.pi) * (h + 0.044715 * h ** 3)))
reference = h @ w2_host
assert np.allclose(to_host(out), reference, atol=1e-4)
''', r'''%md
## 2. Dtypes: what each precision can hold

A float is sign · mantissa · 2^exponent. The exponent bits decide the **range**, the mantissa bits
the **precision** (relative spacing ε = 2^-mantissa_bits):

| name | bits | exponent | mantissa | max | ε (spacing at 1) |
|---|---|---|---|---|---|
| fp64 | 64 | 11 | 52 | 1.8e308 | 2.2e-16 |
| fp32 | 32 | 8 | 23 | 3.4e38 | 1.2e-7 |
| fp16 | 16 | 5 | 10 | **65504** | 9.8e-4 |
| bf16 | 16 | 8 | 7 | 3.4e38 | **7.8e-3** |

bf16 keeps fp32's exponent (same range, so no loss scaling needed) and gives up precision;
fp16 keeps more precision but overflows at 65504 and underflows small gradients — which is why
fp16 training needs dynamic loss scaling (lesson 09). minipar names them through
`dtype_of("fp64" | "fp32" | "fp16" | "bf16")`; bf16 on NumPy comes from `ml_dtypes`.
''', r'''
import ml_dtypes

dtypes = {p: backend.dtype_of(p) for p in ("fp64", "fp32", "fp16", "bf16")}
print(f"{'name':5s} {'bytes':>5s} {'max':>12s} {'eps':>10s} {'smallest normal':>16s}")
for p, dt in dtypes.items():
    fi = ml_dtypes.finfo(dt) if p == "bf16" else np.finfo(dt)
    print(f"{p:5s} {dt.itemsize:5d} {float(fi.max):12.4g} {float(fi.eps):10.3g} {float(fi.tiny):16.3g}")

fp16, bf16 = dtypes["fp16"], dtypes["bf16"]
assert float(np.finfo(fp16).max) == 65504.0
assert float(ml_dtypes.finfo(bf16).eps) == 2.0 ** -7
''', r'''%md
The limits, concretely:

- **fp16 range**: 65504 is the largest value; 65520 already rounds to `inf`. An attention logit or
  an un-scaled sum of squares overflows easily.
- **fp16 precision**: between 2048 and 4096 the spacing is 2, so 2048 + 1 = 2048. A weight of 1.0
  receiving an update of 1e-4 does not change at all — which is why optimizers keep **fp32 master
  weights** and accumulate in fp32.
- **fp16 underflow**: 1e-8 (a typical small gradient) becomes 0.
- **bf16**: 256 + 1 = 256 (spacing 2 at 256), but 1e-30 and 1e30 are fine.
''', r'''
with np.errstate(over="ignore"):
    assert np.float16(65504) == 65504 and np.isinf(np.float16(65520))
assert np.float16(2048) + np.float16(1) == 2048            # the +1 is rounded away
assert np.float16(2049) == 2048 and np.float16(2050) == 2050
assert np.float16(1.0) + np.float16(1e-4) == 1.0           # an update lost entirely
assert np.float16(1e-8) == 0                               # underflow
b = lambda v: np.array(v, dtype=bf16)
assert b(256) + b(1) == b(256)
assert float(b(1e30)) > 0.99e30 and float(b(1e-30)) > 0     # fp32's range
print("float16(2048) + 1 =", float(np.float16(2048) + np.float16(1)),
      "  bf16(256) + 1 =", b(256) + b(1))

# accumulate 2000 updates of 2e-4 to a weight of 1.0 (each below half the spacing at 1)
for name, dt in [("fp32", np.float32), ("fp16", fp16), ("bf16", bf16)]:
    w = np.array(1.0, dtype=dt)
    step = np.array(2e-4, dtype=dt)
    for _ in range(2000):
        w = (w + step).astype(dt)
    print(f"{name}: 1 + 2000·2e-4 = {float(w):.4f}   (exact: 1.4)")
    assert (float(w) == 1.0) == (name != "fp32")
''', r'''%md
### How a float32 becomes a bf16

bf16 is the **upper half** of a float32: the same sign bit and 8 exponent bits, and the top 7 of the
23 mantissa bits. A cast therefore drops the low 16 bits — but *rounds* them rather than cutting
them off: to the nearest bf16, and on an exact tie (low half `0x8000`) to the one whose last kept
bit is 0 ("round half to even"), so that rounding errors do not drift in one direction.

Adding `0x7FFF` to the 32-bit pattern carries into bit 16 exactly when the low half is above
`0x8000`; adding the kept last bit on top breaks the tie towards even. The carry can run into the
exponent — that is correct: 1.9961 rounds up to 2.0, and the largest float32 rounds to `inf`.

**Exercise.** Write `to_bf16(x)`: round a float32 array to bfloat16, returned as float32 values
(the low 16 bits zero), with integer operations on `x.view(np.uint32)`.
''', r'''%exercise to_bf16
def to_bf16(x):
    """float32 array -> float32 array of the nearest bfloat16 values (ties to even)."""
    raise NotImplementedError("hint: work on the 32-bit patterns (a uint32 view); rounding to nearest "
                              "is an addition that carries into the kept bits exactly when the dropped "
                              "half is past halfway, and a tie must leave the last kept bit 0")
''', r'''
rng = np.random.default_rng(5)
x = (rng.normal(size=100_000) * 10.0 ** rng.uniform(-40, 38, size=100_000)).astype(np.float32)
ties = np.array([1 + 2**-8, 1 + 3 * 2**-8, 257, 259, -1 - 2**-8], dtype=np.float32)   # exactly halfway
edges = np.array([1.9961, 3.3895e38, np.finfo(np.float32).max, 1e-40, 0.0, -0.0], dtype=np.float32)
for sample in (x, ties, edges):
    mine = np.asarray(to_bf16(sample), dtype=np.float32)
    ref = sample.astype(bf16).astype(np.float32)              # minipar's cast: dtype_of("bf16")
    assert np.array_equal(mine.view(np.uint32), ref.view(np.uint32)), sample[mine != ref][:5]
print("to_bf16 == astype(bf16), bit for bit, on", x.size + ties.size + edges.size, "values;",
      "ties:", ties, "->", to_bf16(ties))

# why round instead of cutting the bits off: truncation is biased towards zero
normal = np.abs(x[(np.abs(x) > 1e-30) & (np.abs(x) < 1e30)])
cut = (normal.view(np.uint32) & np.uint32(0xFFFF0000)).view(np.float32)
rel_round = float(np.mean((to_bf16(normal) - normal) / normal))
rel_cut = float(np.mean((cut - normal) / normal))
print(f"mean relative error: rounding {rel_round:+.1e}, truncation {rel_cut:+.1e}")
assert abs(rel_round) < 1e-4 < -rel_cut
''', r'''%md
The relative rounding error of a format is the same (≈ε/2) at every magnitude inside its normal
range; what differs is where the range ends. Below: the spacing between neighbouring representable
numbers, divided by the number, over 80 decades.
''', r'''
mags = 2.0 ** np.arange(-150, 131)          # at powers of two the gap is exactly ε·x

def relative_spacing(dt, x):
    """Gap to the next representable number, over x: 2^(e - mantissa bits) / x for normal x,
    the fixed subnormal step below the smallest normal; NaN outside the range."""
    fi = ml_dtypes.finfo(dt) if dt == bf16 else np.finfo(dt)
    tiny, sub, big = float(fi.tiny), float(fi.smallest_subnormal), float(fi.max)
    gap = np.where(x >= tiny, 2.0 ** (np.floor(np.log2(x)) - fi.nmant), sub)
    return np.where((x >= sub) & (x <= big), gap / x, np.nan)

assert np.isclose(relative_spacing(fp16, np.array(2048.0)), np.spacing(np.float16(2048)) / 2048)
fig, ax = plt.subplots(figsize=(7, 3.4))
for name, dt in [("fp32", np.dtype(np.float32)), ("fp16", fp16), ("bf16", bf16)]:
    ax.loglog(mags, relative_spacing(dt, mags), label=name, lw=2 if name == "fp32" else 1.5)
ax.axvline(65504, color="gray", ls=":", lw=1); ax.text(1e5, 1e-6, "fp16 max\n65504", fontsize=8)
ax.set_xlabel("|x|"); ax.set_ylabel("spacing / |x|"); ax.legend(); ax.grid(alpha=0.3)
ax.set_title("relative precision vs magnitude")
plt.show()
''', r'''%md
### The same model in four precisions

We build the tiny GPT in fp64, copy its weights into fp32, fp16 and bf16 models
(`set_default_dtype` decides the dtype new parameters get), and compare logits with the fp64 ones.
The errors follow ε: ~1e-7, ~1e-3, ~1e-2 relative. (minipar's fused softmax / layer norm /
cross-entropy compute their statistics in fp32 even for half inputs — the mixed-precision rule.)
''', r'''
from minipar.nn import GPT, config_from_preset

cfg = config_from_preset("tiny", seq_len=32)
ids = np.random.default_rng(0).integers(0, 256, size=(2, 32))
backend.set_default_dtype(np.float64)
reference = GPT(cfg, seed=0)
logits64 = reference(ids).numpy()
state = reference.state_dict()

errors = {}
for p in ("fp32", "fp16", "bf16"):
    backend.set_default_dtype(backend.dtype_of(p))
    model = GPT(cfg, seed=0)
    model.load_state_dict(state)
    logits = model(ids).numpy().astype(np.float64)
    errors[p] = np.abs(logits - logits64).max() / np.abs(logits64).max()
    print(f"{p}: logits dtype {model(ids[:, :4]).dtype}, max relative error {errors[p]:.2e}")
backend.set_default_dtype(np.float32)

assert errors["fp32"] < 1e-5 < errors["fp16"] < 1e-2 and errors["bf16"] < 5e-2
assert errors["fp16"] < errors["bf16"]      # 10 mantissa bits beat 7
''', r'''%md
## 3. Measuring activation memory

Every `Tensor`'s data, every gradient and every array a `Function` saves for backward is
registered with `backend.memory`, a counter of **live bytes** and their **peak** — the figure ZeRO,
recomputation and the training log (`peak_mem_bytes`) are judged by. You write it.

**Exercise.** Write `MyMemoryCounter`: `track(a)` registers an array and returns it unchanged;
`live` is the number of bytes of all registered arrays still alive, `live_by_dtype` the same per
dtype name (`"float32"`, …), `peak` the largest `live` since the last `reset_peak()`, which sets
it to `live`. Three facts decide what a byte is:

- an array is **freed** when Python drops its last reference, not when the program says so — so
  the counter must hear of it then, without itself keeping the array alive (the standard library
  has exactly the tool: a reference that does not count, with a callback when its target dies);
- a **view** (a transpose, a slice, `q, k, v` cut from one `qkv`) has no memory of its own: it
  reads its base's (`a.base`, perhaps through several views), and the base lives as long as any
  view does — count the memory's owner, once, however many views of it are registered;
- some things passed in are not arrays with memory of their own to watch (a Python float, a NumPy
  scalar): they are not counted.

The check registers a sequence of arrays, views and scalars with yours and with minipar's
`MemoryCounter`, deletes some, and then watches every array a tiny GPT's training forward and
backward registers, comparing `live`, `peak` and the bytes per dtype after each step — to the byte.
''', r'''%exercise MyMemoryCounter
import weakref


class MyMemoryCounter:
    """Bytes held by live tracked arrays, in all and per dtype, and the peak since the last reset."""

    def __init__(self):
        self.live = 0
        self.peak = 0
        self.live_by_dtype = {}        # dtype name -> live bytes

    def track(self, a):
        """Count the bytes of the array that owns a's memory, once; uncount them when it is freed."""
        raise NotImplementedError("hint: who owns a view's memory, and how can the counter learn "
                                  "that an array was freed without keeping it alive itself?")

    def reset_peak(self):
        raise NotImplementedError("hint: the peak since now")
''', r'''
import gc


def by_dtype(counter):
    """Live bytes per dtype of a minipar MemoryCounter, from the arrays it holds weak references to."""
    out = {}
    for ref in list(counter._seen.values()):
        a = ref()
        if a is not None:
            out[str(a.dtype)] = out.get(str(a.dtype), 0) + a.nbytes
    return out


def compare(step, mine, lib):
    """One line naming what differs between the two counters after `step`, or None."""
    for what, m, r in (("live", mine.live, lib.live), ("peak", mine.peak, lib.peak)):
        if m != r:
            return f"after {step}: your {what} is {m:,} bytes, minipar's {r:,}"
    ref = by_dtype(lib)
    for dt in sorted(set(ref) | {k for k, v in mine.live_by_dtype.items() if v}):
        if mine.live_by_dtype.get(dt, 0) != ref.get(dt, 0):
            return (f"after {step}: your live {dt} bytes are {mine.live_by_dtype.get(dt, 0):,}, "
                    f"minipar's {ref.get(dt, 0):,}")
    return None


def check_counter():
    mine, lib = MyMemoryCounter(), backend.MemoryCounter()
    both = lambda a: (mine.track(a), lib.track(a))[1]
    arrays = {}
    steps = [
        ("tracking a float32 (64, 64)", lambda: arrays.update(w=both(np.ones((64, 64), np.float32)))),
        ("tracking it again", lambda: both(arrays["w"])),
        ("tracking its transpose (a view)", lambda: arrays.update(wT=both(arrays["w"].T))),
        ("tracking a slice of that view", lambda: both(arrays["wT"][3:9, ::2])),
        ("tracking a float16 (100,) and an int64 (7,)",
         lambda: arrays.update(h=both(np.zeros(100, np.float16)), i=both(np.arange(7)))),
        ("tracking a flattened copy of the transpose", lambda: arrays.update(c=both(arrays["wT"].reshape(-1)))),
        ("tracking a NumPy scalar and a Python float", lambda: (both(np.float32(2.0)), both(3.0))),
        ("deleting the (64, 64) array (its transpose still holds it)", lambda: arrays.pop("w")),
        ("deleting the transpose too", lambda: arrays.pop("wT")),
        ("reset_peak()", lambda: (mine.reset_peak(), lib.reset_peak())),
        ("deleting the float16 array", lambda: arrays.pop("h")),
    ]
    for step, do in steps:
        do()
        if problem := compare(step, mine, lib):
            return problem
    # then every array minipar registers while it builds, runs and trains a tiny GPT
    library_track = backend.memory.track
    backend.memory.track = lambda a: (mine.track(a), lib.track(a), library_track(a))[2]
    try:
        model = GPT(config_from_preset("tiny"), seed=0)
        if problem := compare("building the tiny GPT", mine, lib):
            return problem
        ids = np.random.default_rng(0).integers(0, 256, size=(2, 64))
        _, loss = model(ids, ids)
        if problem := compare("a training forward", mine, lib):
            return problem
        loss.backward()
        if problem := compare("its backward", mine, lib):
            return problem
        del loss, _, model
        gc.collect()
        return compare("freeing the model, its graph and its gradients", mine, lib)
    finally:
        del backend.memory.track          # minipar's own method again


problem = check_counter()
assert problem is None, problem
print("MyMemoryCounter == minipar's MemoryCounter (live, peak and bytes per dtype), to the byte, "
      "on views, scalars and frees and through a tiny GPT's forward and backward")
''', r'''%md
minipar's counter (`minipar/backend.py`) is the same idea without the per-dtype split:
''', r'''
print(inspect.getsource(backend.MemoryCounter.track))
''', r'''%md
During a training forward, every Tensor an op produces stays alive until backward (the next op's
graph node holds it as an input), together with what ops save beyond their inputs and outputs.
Views — a transpose, the split of qkv into q, k, v — share their base's memory; reshaping a
*transposed* array (merging the heads back) is a copy. Per token of one transformer block
(d = model width, H heads, N sequence length, fp32 = 4 bytes):

| what | floats per token |
|---|---|
| 2 LayerNorms: output, normalised x̂, 1/σ | 2·(2d + 1) |
| qkv projection | 3d |
| attention scores S and probabilities P (B·H·N² per block) | 2·H·N |
| P·V, the merged heads (a copy), attention output projection, residual sum | 4d |
| MLP: fc output, tanh term saved by GELU, GELU output | 3·4d = 12d |
| MLP projection, residual sum | 2d |
| **block total** | **25d + 2HN + 2** |

Outside the blocks: the token lookup and its sum with the position embedding (2d per token), the
position lookup itself (one (N, d) array, shared by the batch), the final LayerNorm (2d + 1), the
logits (V) and what cross-entropy saves, its exponentials and their sum (V + 1) — and the loss, one
4-byte scalar.

**Exercise.** Write `activation_bytes(B, N, L, d, H, V)`: the bytes a float32 training forward of
the GPT keeps, from this table. It is checked against the counter's measured peak — to the byte.
''', r'''%exercise activation_bytes
def activation_bytes(B, N, L, d, H, V):
    """Bytes a float32 training forward keeps alive: B sequences of N tokens, L blocks."""
    raise NotImplementedError("hint: 4 bytes x (B·N·(L·(25d + 2HN + 2) + the per-token floats outside the "
                              "blocks) + the shared (N, d) position lookup) + the 4-byte loss")
''', r'''
from minipar.autograd import no_grad
from minipar.perf.activations import minipar_peak_activation_bytes

cfg = config_from_preset("tiny")
model = GPT(cfg, seed=0)
L, d, H, N, V = cfg.n_layer, cfg.d_model, cfg.n_head, cfg.seq_len, cfg.vocab_size

def forward_bytes(B, grad=True):
    """Peak bytes added by one forward (graph kept alive until we drop it)."""
    ids = np.random.default_rng(B).integers(0, V, size=(B, N))
    gc.collect()
    base = backend.memory.live
    backend.memory.reset_peak()
    if grad:
        _, loss = model(ids, ids)
    else:
        with no_grad():
            _, loss = model(ids, ids)
    peak = backend.memory.peak - base
    del loss
    gc.collect()
    return peak

batches = [1, 2, 4, 8]
measured = [forward_bytes(B) for B in batches]
inference = [forward_bytes(B, grad=False) for B in batches]
for B, m, i in zip(batches, measured, inference):
    mine = activation_bytes(B, N, L, d, H, V)
    print(f"B={B}  training forward {m / 2**20:6.3f} MiB  (= {m:,} bytes; yours {mine:,})"
          f"   no_grad forward {i / 2**20:5.2f} MiB")
    assert mine == m, f"B={B}: yours is {mine - m:+,} bytes off = {(mine - m) / (4 * B * N * L):+.2f} floats per token per block"
    # the performance model (lesson 13) counts the same arrays, all but the loss
    assert minipar_peak_activation_bytes(B, N, d, H, V, L) + 4 == m

slope = np.polyfit(batches, measured, 1)[0]
per_sequence = activation_bytes(2, N, L, d, H, V) - activation_bytes(1, N, L, d, H, V)
assert abs(slope / per_sequence - 1) < 1e-9                      # exactly linear in B
assert all(i < m / 3 for i, m in zip(inference, measured))       # no graph: little is kept
old = 4 * 8 * N * L * d           # what a 24d count (forgetting the merged-heads copy) misses
print(f"a 24d-per-block count would miss {old:,} bytes at B=8: {old / measured[-1]:.1%} of the total")
params = model.num_parameters() * 4
print(f"parameters: {params / 2**20:.2f} MiB; activations at B={batches[-1]} are {measured[-1] / params:.1f}x that")
''', r'''
fig, ax = plt.subplots(figsize=(6, 3.4))
ax.plot(batches, np.array(measured) / 2**20, "o-", label="measured (memory.peak)")
ax.plot(batches, [activation_bytes(B, N, L, d, H, V) / 2**20 for B in batches], "--",
        label="4·(B·N·[L(25d+2HN+2) + 4d+2V+2] + N·d) + 4")
ax.plot(batches, np.array(inference) / 2**20, "s-", label="forward under no_grad")
ax.axhline(params / 2**20, color="gray", ls=":", label="parameters (fp32)")
ax.set_xlabel(f"batch size B (sequences of {N} tokens)"); ax.set_ylabel("MiB")
ax.set_title("activation memory of the tiny GPT's forward"); ax.legend(fontsize=8); ax.grid(alpha=0.3)
plt.show()
''', r'''%md
Even for this toy, a batch of 8 keeps far more bytes of activations than the model has
parameters (the ratio printed above). Two lessons hide in the formula. It is **linear in batch
size** — that is what data parallelism and micro-batching split. And the $2HN$ term is **quadratic
in sequence length** — that is what flash attention (lesson 11) removes and what recomputation
(lesson 10) trades for compute.

At GPT-3 scale (L=96, d=12288, H=96, N=2048, fp16) the same count, from the performance model, and
Megatron's count for its own layers (Korthikanti et al. 2022, $sbh(34 + 5as/h)$ bytes per layer):
''', r'''
from minipar.perf.activations import korthikanti_layer_bytes

L3, d3, N3, H3, V3 = 96, 12288, 2048, 96, 50257
ours = minipar_peak_activation_bytes(1, N3, d3, H3, V3, L3, dtype="fp16")
megatron = L3 * korthikanti_layer_bytes(N3, 1, d3, H3)
weights = 12 * L3 * d3 ** 2 * 2
print(f"GPT-3 activations per sequence (fp16): minipar's count {ours / 2**30:.0f} GiB, "
      f"Megatron's {megatron / 2**30:.0f} GiB;  parameters alone (fp16): {weights / 2**30:.0f} GiB")
assert ours > weights / 2 and 0.5 < ours / megatron < 2
''', r'''%md
No single GPU holds either; splitting them is the rest of this course.

## 4. On a GPU (runs only where CuPy and a GPU exist)

The same `mlp_block` and the same GPT run on CuPy after `set_backend("cupy")`; a model must be
built *after* switching, so that its parameters are created on the device. We compare with the
NumPy results and time a forward (`backend.sync()` waits for the GPU, otherwise we would time only
the kernel launches).
''', r'''
if backend.cupy_available():
    backend.set_backend("cupy")
    try:
        out_gpu = mlp_block(to_device(x_host), to_device(w1_host), to_device(w2_host))
        assert backend.is_device_array(out_gpu)
        assert np.allclose(to_host(out_gpu), reference, atol=1e-4)

        gpu_model = GPT(cfg, seed=0)                 # parameters created on the GPU
        ids = np.random.default_rng(0).integers(0, V, size=(8, N))
        logits_gpu = to_host(gpu_model(to_device(ids)).data)
        backend.set_backend("numpy")
        logits_cpu = GPT(cfg, seed=0)(ids).numpy()  # same seed -> same weights on both
        backend.set_backend("cupy")
        assert np.allclose(logits_gpu, logits_cpu, atol=1e-4)

        for _ in range(2):                            # warm-up: kernels compile on first use
            gpu_model(to_device(ids)); backend.sync()
        t0 = time.perf_counter()
        for _ in range(10):
            gpu_model(to_device(ids))
        backend.sync()
        print(f"GPU forward: {(time.perf_counter() - t0) / 10 * 1e3:.2f} ms; results match NumPy")
    finally:
        backend.set_backend("numpy")
else:
    print("No CuPy + GPU here: the GPU section is skipped. "
          "On a GPU machine: pip install -e '.[gpu]' and re-run this notebook.")
''', r'''%md
## Takeaways

- One seam (`xp`) keeps the model code identical on NumPy and CuPy; only transfers
  (`to_device`, `to_host`) and `sync()` know the difference.
- fp16: 65504 max, 2048 + 1 = 2048, tiny gradients vanish → loss scaling and fp32 master weights.
  bf16: fp32's range with 8 significant bits (7 stored, 1 implicit): about 2.4 decimal digits.
- A bf16 is the top half of a float32, rounded to nearest, ties to even.
- Activation memory is 4·B·N·L·(25d + 2HN + 2) bytes in fp32 plus the embeddings and the head —
  counted to the byte: linear in batch, quadratic in sequence length, and usually larger than the
  parameters.
''', r'''%md
## What changes on GPU nodes and at scale

- The dtype decides the speed there, not only the memory: the H100 profile (spec sheet) gives 989
  TFLOP/s for fp16/bf16 tensor cores against 67 for fp32, and 3.35 TB/s of HBM (A100 2.0, H200 4.8).
- NumPy-2 promotion rules follow you to CuPy: an fp16 array times a float32 scalar is float32, a silent
  upcast of a whole activation; minipar's CPU checks count such upcasts on a fake CuPy.
- The traps are real: an earlier minipar ran fp16 training *slower* than fp32 on one H200 (8,513
  against 24,532 tokens/s), through CuPy's upcasting batched matmul and one host sync per tensor —
  the reasons the GPU path is checked on the CPU (`tests/test_gpu_step_counts.py`).

## In PyTorch / DeepSpeed / Megatron this is …

| here | there |
|---|---|
| `xp` (NumPy or CuPy behind one name) | one `torch` API on every device: `torch.device("cuda")`; for NumPy-style code the array API standard (`array_api_compat.array_namespace(x)`) |
| `to_device`, `to_host` | `tensor.to("cuda", non_blocking=True)`, `tensor.cpu()` (pinned memory: `pin_memory()`) |
| `backend.sync()` | `torch.cuda.synchronize()`; CUDA events (`torch.cuda.Event(enable_timing=True)`) to time without stalling |
| `dtype_of("bf16")`, `ml_dtypes.finfo` | `torch.bfloat16`, `torch.finfo(torch.float16).max`; casts round to nearest even, as your `to_bf16` |
| `set_default_dtype` | `torch.set_default_dtype`; per region: `torch.autocast("cuda", dtype=torch.bfloat16)` (lesson 09) |
| `backend.memory.live / .peak / reset_peak()` | `torch.cuda.memory_allocated()`, `torch.cuda.max_memory_allocated()`, `torch.cuda.reset_peak_memory_stats()`; a timeline of every allocation: `torch.cuda.memory._record_memory_history()`; DeepSpeed's `see_memory_usage` |
| your `activation_bytes` | Korthikanti et al. 2022's per-layer $sbh(34 + 5as/h)$ — the count behind Megatron's `--recompute-granularity selective` and `--sequence-parallel` (lessons 07, 10) |
''']