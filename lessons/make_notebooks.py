"""Build lessons 01-03 as notebooks without outputs: ``python lessons/make_notebooks.py``.

The lessons are written here as plain Python strings so a review sees ordinary diffs;
the ``.ipynb`` files are generated from them (and executed by ``tests/test_lessons.py``).
A cell that starts with ``%md`` is markdown, every other cell is code.
"""
from __future__ import annotations

import os

import nbformat

HERE = os.path.dirname(os.path.abspath(__file__))


def build(cells):
    nb = nbformat.v4.new_notebook()
    nb.metadata["kernelspec"] = {"name": "python3", "display_name": "Python 3", "language": "python"}
    nb.metadata["language_info"] = {"name": "python"}
    for text in cells:
        text = text.strip("\n")
        if text.startswith("%md"):
            nb.cells.append(nbformat.v4.new_markdown_cell(text[3:].strip("\n")))
        else:
            nb.cells.append(nbformat.v4.new_code_cell(text))
    for i, cell in enumerate(nb.cells):
        cell["id"] = f"cell-{i:02d}"  # stable ids: regenerating gives no spurious diff
    return nb


# --------------------------------------------------------------------------- 01
L01 = [r'''%md
# 01 · Autograd from scratch

Training a 100B-parameter model is, at its core, the same loop as training a toy:
compute a loss, get **dL/dθ for every parameter**, update. Every kind of parallelism later in
this course (data, tensor, pipeline, ZeRO) is a way of *splitting this gradient computation*
across devices — so first we need to know exactly how it is computed.

Reverse-mode automatic differentiation ("backprop") is the chain rule applied to a recorded
graph. If $y = f(x)$ and the loss $L$ depends on $y$, then

$$\frac{\partial L}{\partial x} = \frac{\partial L}{\partial y}\,\frac{\partial y}{\partial x}.$$

A node that feeds several consumers **sums** the gradients coming back from each of them.
Walking the graph once from the loss back to the inputs, in *reverse topological order* (a node
only after everything that used it), gives every gradient for about the cost of one more forward.

Plan: (1) a scalar autograd in a page; (2) the same idea on arrays with minipar's `Tensor` and
`Function`; (3) a new op of our own, checked against finite differences; (4) broadcasting;
(5) the two hooks distributed training is built on: leaf gradient hooks and `backward(grad)`.
''', r'''
import math

import matplotlib.pyplot as plt
import numpy as np

%matplotlib inline
''', r'''%md
## 1. A scalar autograd in one page

Each `Value` holds a number, its gradient, the values it was made from, and a closure that
pushes its gradient to those parents (the *local* chain rule):

| op | forward | backward (with upstream gradient $\bar y$) |
|---|---|---|
| $y = a + b$ | | $\bar a \mathrel{+}= \bar y,\ \bar b \mathrel{+}= \bar y$ |
| $y = a \cdot b$ | | $\bar a \mathrel{+}= b\,\bar y,\ \bar b \mathrel{+}= a\,\bar y$ |
| $y = \tanh a$ | | $\bar a \mathrel{+}= (1 - y^2)\,\bar y$ |

`backward()` sorts the graph topologically, seeds $\partial L/\partial L = 1$ and calls the
closures from the loss backwards.
''', r'''
class Value:
    def __init__(self, data, parents=(), op=""):
        self.data = float(data)
        self.grad = 0.0
        self.parents = parents
        self.op = op
        self._backward = lambda: None

    def __add__(self, other):
        other = other if isinstance(other, Value) else Value(other)
        out = Value(self.data + other.data, (self, other), "+")

        def backward():
            self.grad += out.grad
            other.grad += out.grad
        out._backward = backward
        return out

    def __mul__(self, other):
        other = other if isinstance(other, Value) else Value(other)
        out = Value(self.data * other.data, (self, other), "*")

        def backward():
            self.grad += other.data * out.grad
            other.grad += self.data * out.grad
        out._backward = backward
        return out

    __radd__ = __add__
    __rmul__ = __mul__

    def tanh(self):
        t = math.tanh(self.data)
        out = Value(t, (self,), "tanh")

        def backward():
            self.grad += (1 - t * t) * out.grad
        out._backward = backward
        return out

    def backward(self):
        order, seen = [], set()

        def visit(v):                      # post-order DFS = topological order
            if id(v) not in seen:
                seen.add(id(v))
                for p in v.parents:
                    visit(p)
                order.append(v)
        visit(self)
        self.grad = 1.0                    # dL/dL
        for v in reversed(order):          # every node after all of its consumers
            v._backward()

    def __repr__(self):
        return f"Value({self.data:.4f}, grad={self.grad:.4f})"
''', r'''%md
A one-neuron "network" $L = \tanh(w_1 x_1 + w_2 x_2 + b)\cdot x_1$ — note $x_1$ is used twice,
so its gradient is the sum of two paths. We check every gradient against a central finite
difference $\frac{L(\theta+\varepsilon) - L(\theta-\varepsilon)}{2\varepsilon}$, whose error is
$O(\varepsilon^2)$.
''', r'''
def neuron(x1, x2, w1, w2, b):
    return (w1 * x1 + w2 * x2 + b).tanh() * x1

inputs = dict(x1=0.7, x2=-1.3, w1=0.4, w2=0.9, b=0.2)
vals = {k: Value(v) for k, v in inputs.items()}
L = neuron(**vals)
L.backward()

eps = 1e-6
for name in inputs:
    plus = dict(inputs, **{name: inputs[name] + eps})
    minus = dict(inputs, **{name: inputs[name] - eps})
    numeric = (neuron(**{k: Value(v) for k, v in plus.items()}).data
               - neuron(**{k: Value(v) for k, v in minus.items()}).data) / (2 * eps)
    print(f"dL/d{name:2s}  autograd {vals[name].grad:+.8f}   finite diff {numeric:+.8f}")
    assert abs(vals[name].grad - numeric) < 1e-8
''', r'''%md
That is all of backprop. What a real framework adds is (a) **arrays** instead of scalars — one
graph node per *matrix* op, so Python overhead is paid per layer, not per number; (b) hand-written
backward rules for fused ops (softmax, layer norm, cross-entropy); (c) memory management (free
each saved activation as soon as backward has used it); and (d) hooks for distributed training.

## 2. The same idea on arrays: minipar's `Tensor` and `Function`

In minipar an op is a `Function` with two static methods on **raw arrays** (NumPy or CuPy):
`forward(ctx, *arrays)` and `backward(ctx, grad)` returning one gradient per input.
`Fn.apply(...)` runs the forward and, if any input requires a gradient, records `ctx` as the graph
node. `Tensor.backward()` walks those nodes in reverse topological order (`minipar/autograd/engine.py`).

The scalar example again, vectorised:
''', r'''
from minipar.autograd import Function, Tensor, ops
from minipar.backend import xp

x1 = Tensor(np.array([0.7, 0.1, -2.0]), requires_grad=True)
x2 = Tensor(np.array([-1.3, 0.5, 0.3]), requires_grad=True)
w1, w2, b = 0.4, 0.9, 0.2
L = (ops.tanh(x1 * w1 + x2 * w2 + b) * x1).sum()
L.backward()

# element 0 is exactly the scalar example above
print("dL/dx1 =", x1.grad, " scalar version:", vals["x1"].grad)
assert np.isclose(x1.grad[0], vals["x1"].grad)
assert np.isclose(x2.grad[0], vals["x2"].grad)
''', r'''%md
## 3. Writing a new op: `Sigmoid`

$\sigma(x) = \frac{1}{1 + e^{-x}}$ has the convenient derivative
$\sigma'(x) = \sigma(x)\,(1 - \sigma(x))$, so the forward saves its *output* (not its input)
for backward — a typical choice: what you save is activation memory, and lesson 10 is about
trading it for recomputation.

We write it for the stable form: for $x<0$ use $e^{x}/(1+e^{x})$ so `exp` never overflows.
Only `xp` is used, so the op runs unchanged on a GPU.
''', r'''
class Sigmoid(Function):
    """y = 1 / (1 + exp(-x));  dx = dy · y · (1 - y)."""

    @staticmethod
    def forward(ctx, x):
        e = xp.exp(-xp.abs(x))                      # in (0, 1]: never overflows
        y = xp.where(x >= 0, 1 / (1 + e), e / (1 + e))
        ctx.save_for_backward(y)
        return y

    @staticmethod
    def backward(ctx, grad):
        (y,) = ctx.saved
        return grad * y * (1 - y)


def sigmoid(x):
    return Sigmoid.apply(x)

print(sigmoid(Tensor(np.array([-1000.0, 0.0, 1000.0]))).data)   # no overflow warnings
''', r'''%md
### Gradient check

For a tensor-valued op we check the gradient of a random projection $s = \sum_i R_i\, f(x)_i$:
autograd gives $\partial s/\partial x$ in one backward (`out.backward(R)`), central differences
give it one coordinate at a time. In float64 with $\varepsilon=10^{-6}$ they agree to ~$10^{-9}$.
This is the oracle every op in minipar is tested against (`tests/gradcheck.py`).
''', r'''
def finite_difference_grad(f, x, eps=1e-6):
    """d f(x) / dx by central differences, one coordinate at a time (f: array -> float)."""
    g = np.zeros_like(x)
    for i in np.ndindex(x.shape):
        old = x[i]
        x[i] = old + eps
        plus = f(x)
        x[i] = old - eps
        minus = f(x)
        x[i] = old
        g[i] = (plus - minus) / (2 * eps)
    return g


def gradcheck(fn, x, seed=0):
    rng = np.random.default_rng(seed)
    x = np.array(x, dtype=np.float64)
    R = rng.normal(size=fn(Tensor(x)).shape)
    t = Tensor(x.copy(), requires_grad=True)
    fn(t).backward(R)                                        # upstream gradient R
    numeric = finite_difference_grad(lambda a: float((fn(Tensor(a)).data * R).sum()), x)
    err = np.abs(t.grad - numeric).max()
    return t.grad, numeric, err

x = np.random.default_rng(1).normal(scale=3.0, size=(4, 5))
_, _, err = gradcheck(sigmoid, x)
print(f"Sigmoid: max |autograd - finite diff| = {err:.2e}")
assert err < 1e-8

# composed with minipar's own ops, the chain rule does the rest
_, _, err = gradcheck(lambda t: ops.tanh(sigmoid(t) * t) @ Tensor(np.ones((5, 2))), x)
print(f"tanh(sigmoid(x)·x) @ W: max error = {err:.2e}")
assert err < 1e-8
''', r'''%md
A picture of the same check: the function, its autograd derivative (one backward for all points,
since each output depends only on its own input) and finite differences.
''', r'''
xs = np.linspace(-6, 6, 241)
t = Tensor(xs.copy(), requires_grad=True)
y = sigmoid(t)
y.backward(np.ones_like(xs))
numeric = finite_difference_grad(lambda a: float(sigmoid(Tensor(a)).data.sum()), xs.copy())
assert np.allclose(t.grad, numeric, atol=1e-8)

fig, ax = plt.subplots(figsize=(6, 3.2))
ax.plot(xs, y.data, label="σ(x)")
ax.plot(xs, t.grad, label="dσ/dx  (autograd)")
ax.plot(xs[::12], numeric[::12], "o", ms=4, label="finite differences")
ax.set_xlabel("x"); ax.legend(); ax.grid(alpha=0.3)
ax.set_title("Sigmoid and its derivative σ·(1−σ)")
plt.show()
''', r'''%md
## 4. Broadcasting forwards = summing backwards

A bias $b$ of shape $(d,)$ added to activations $X$ of shape $(B, N, d)$ is *broadcast*: each
$b_j$ is used $B \cdot N$ times. A value used $k$ times gets the sum of its $k$ gradients, so

$$\frac{\partial L}{\partial b_j} = \sum_{b,n} \frac{\partial L}{\partial Y_{b,n,j}}.$$

minipar's elementwise ops do this with `unbroadcast` (sum over the axes that were added or
stretched from size 1). Note what it means for distributed training: the bias gradient is itself
a **reduction over the batch** — which is why data parallelism must all-reduce gradients.
''', r'''
from minipar.autograd.ops_math import unbroadcast

X = Tensor(np.random.default_rng(2).normal(size=(2, 3, 4)), requires_grad=True)
bias = Tensor(np.zeros(4), requires_grad=True)
col = Tensor(np.ones((3, 1)), requires_grad=True)           # stretched along the last axis
G = np.random.default_rng(3).normal(size=(2, 3, 4))          # an upstream gradient
((X + bias) * col).backward(G)

print("bias.grad shape", bias.grad.shape, " col.grad shape", col.grad.shape)
assert np.allclose(bias.grad, G.sum(axis=(0, 1)))
assert np.allclose(col.grad, (G * X.data).sum(axis=(0, 2))[:, None])
assert np.allclose(unbroadcast(G, (3, 1)), G.sum(axis=(0, 2), keepdims=True)[0])
''', r'''%md
## 5. Leaf hooks: "this gradient is ready"

A *leaf* is a tensor nobody computed (a parameter). When the engine accumulates a gradient into a
leaf's `.grad` it fires the leaf's hooks. Backward visits layers **in reverse**, so the last
layer's gradients are ready first. Data parallelism exploits this: group parameters into buckets
and start the all-reduce of a full bucket *while backward is still computing earlier layers*
(lesson 05). ZeRO-2 uses the same event to reduce-scatter and free gradients early (lesson 06).
''', r'''
from minipar.nn import Linear

rng = np.random.default_rng(0)
layers = [Linear(8, 8, rng) for _ in range(3)]
ready = []
for i, layer in enumerate(layers):
    for name, p in layer.named_parameters():
        p.register_hook(lambda p, tag=f"layer{i}.{name}": ready.append(tag))

h = Tensor(rng.normal(size=(5, 8)).astype(np.float32))
for layer in layers:
    h = ops.tanh(layer(h))
h.sum().backward()
print(" -> ".join(ready))
assert ready[0].startswith("layer2") and ready[-1].startswith("layer0")
assert len(ready) == 6 and all(p.grad is not None for l in layers for p in l.parameters())
''', r'''%md
## 6. `backward(grad)`: backprop that starts in the middle

A pipeline splits the model into stages on different devices. Stage 1 computes $h = f_1(x)$ and
*sends* $h$; stage 2 treats the received $h$ as a fresh leaf, computes the loss and its backward,
which leaves $\partial L / \partial h$ in `h.grad`; that is sent back, and stage 1 resumes
its own backward with it: `h.backward(grad)`. By the chain rule this equals one backward
through the whole model — which we check.
''', r'''
rng = np.random.default_rng(4)
W1 = Tensor(rng.normal(size=(6, 5)), requires_grad=True)
W2 = Tensor(rng.normal(size=(5, 1)), requires_grad=True)
x = Tensor(rng.normal(size=(3, 6)))

# the whole model in one process
(ops.tanh(x @ W1) @ W2).sum().backward()
full_W1, full_W2 = W1.grad.copy(), W2.grad.copy()
W1.zero_grad(); W2.zero_grad()

# stage 1 (device A)
h = ops.tanh(x @ W1)
# --- "send" h: stage 2 only sees its values, as a new leaf ---
h_received = Tensor(h.data.copy(), requires_grad=True)
(h_received @ W2).sum().backward()          # stage 2 (device B)
# --- "send" dL/dh back ---
h.backward(h_received.grad)                 # stage 1 resumes with the upstream gradient

assert np.allclose(W1.grad, full_W1) and np.allclose(W2.grad, full_W2)
print("pipelined backward == single backward;  |dL/dh| =", np.abs(h_received.grad).sum().round(4))
''', r'''%md
## Takeaways

- Backward = the chain rule over a recorded graph, visited in reverse topological order; a value
  used several times sums its gradients (broadcasting is the array version of this).
- An op is a forward and a backward on raw arrays; what forward saves is activation memory.
- Central finite differences in float64 are the ground truth for every backward.
- Gradient-ready hooks and `backward(upstream_grad)` are the two entry points that data
  parallelism and pipeline parallelism will plug into.
''']


# --------------------------------------------------------------------------- 02
L02 = [r'''%md
# 02 · Array backends: NumPy and CuPy, dtypes, and memory

minipar never imports NumPy or CuPy for compute outside one file, `minipar/backend.py`. Everything
else writes `xp.exp(...)`, `xp.zeros(...)`, and `xp` forwards to whichever library was selected
with `set_backend("numpy" | "cupy")` (or `MINIPAR_BACKEND`). CuPy mirrors the NumPy API, so the
**same model code** runs on a laptop CPU and on a GPU node.

This lesson covers the three things a training framework needs around that seam:

1. **where** an array lives (host vs device) and how to move it: `to_host`, `to_device`;
2. **in what precision** it is stored: fp64 / fp32 / fp16 / bf16 and their limits;
3. **how many bytes** are alive: the memory counter that ZeRO, recomputation and the training log
   read, used here to measure and predict the activation memory of a GPT forward.
''', r'''
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
registered with `backend.memory`, a counter of **live bytes** (freed arrays are subtracted via weak
references) and their **peak**. Views share their base's memory and are not counted twice.

During a training forward, every intermediate is kept alive by the graph until backward uses it.
Counting what one transformer block keeps per token (d = model width, H heads, N sequence length,
fp32 = 4 bytes):

| what | floats per token |
|---|---|
| 2 LayerNorms: output, normalised x̂, 1/σ | 2·(2d + 1) |
| qkv projection | 3d |
| attention scores S and probabilities P (B·H·N² per block) | 2·H·N |
| P·V, attention output projection, residual sum | 3d |
| MLP: fc output, tanh term saved by GELU, GELU output | 3·4d = 12d |
| MLP projection, residual sum | 2d |
| **block total** | **24d + 2HN + 2** |

Plus embeddings (token lookup + sum: 2d), the final LayerNorm (2d + 1), logits (V) and the
softmax cross-entropy saves (V + 1), and one (N, d) position embedding shared by the batch:

$$\text{bytes} \approx 4\Big(B N\big[L(24d + 2HN + 2) + 4d + 2V + 2\big] + N d\Big).$$

Two lessons hide in that formula. It is **linear in batch size** — that is what data parallelism
and micro-batching split. And the $2HN$ term is **quadratic in sequence length** — that is what
flash attention (lesson 11) removes and what recomputation (lesson 10) trades for compute. (The
merged-heads reshape copy, d per token, is a view of a temporary and not counted here.)
''', r'''
import gc

from minipar.autograd import no_grad

cfg = config_from_preset("tiny")
model = GPT(cfg, seed=0)
L, d, H, N, V = cfg.n_layer, cfg.d_model, cfg.n_head, cfg.seq_len, cfg.vocab_size

def estimate(B):
    return 4 * (B * N * (L * (24 * d + 2 * H * N + 2) + 4 * d + 2 * V + 2) + N * d)

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
    print(f"B={B:2d}  training forward {m / 2**20:6.2f} MiB   estimate {estimate(B) / 2**20:6.2f} MiB"
          f"   ratio {m / estimate(B):.3f}   no_grad forward {i / 2**20:5.2f} MiB")

params = model.num_parameters() * 4
print(f"parameters: {params / 2**20:.2f} MiB; activations at B={batches[-1]} are {measured[-1] / params:.0f}x that")
for B, m in zip(batches, measured):
    assert abs(m / estimate(B) - 1) < 0.05, (B, m, estimate(B))
slope = np.polyfit(batches, measured, 1)[0]
assert abs(slope / (estimate(2) - estimate(1)) - 1) < 0.05      # linear in B, with our slope
assert all(i < m / 3 for i, m in zip(inference, measured))       # no graph: little is kept
''', r'''
fig, ax = plt.subplots(figsize=(6, 3.4))
ax.plot(batches, np.array(measured) / 2**20, "o-", label="measured (memory.peak)")
ax.plot(batches, [estimate(B) / 2**20 for B in batches], "--", label="estimate 4·B·N·[L(24d+2HN+2)+…]")
ax.plot(batches, np.array(inference) / 2**20, "s-", label="forward under no_grad")
ax.axhline(params / 2**20, color="gray", ls=":", label="parameters (fp32)")
ax.set_xlabel("batch size B (sequences of 64 tokens)"); ax.set_ylabel("MiB")
ax.set_title("activation memory of the tiny GPT's forward"); ax.legend(); ax.grid(alpha=0.3)
plt.show()
''', r'''%md
Even for this toy, a modest batch keeps far more bytes of activations than the model has
parameters (see the ratio printed above). At GPT-3 scale (L=96, d=12288, N=2048, H=96) the same formula gives, per sequence,
$2048 \cdot 96 \cdot (24 \cdot 12288 + 2 \cdot 96 \cdot 2048) \cdot 2$ bytes in fp16:
''', r'''
L3, d3, N3, H3 = 96, 12288, 2048, 96
per_seq = N3 * L3 * (24 * d3 + 2 * H3 * N3) * 2
print(f"GPT-3 activations per sequence (fp16): {per_seq / 2**30:.0f} GiB;"
      f"  parameters alone (fp16): {12 * L3 * d3**2 * 2 / 2**30:.0f} GiB")
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
  bf16: fp32's range with 3 significant digits.
- Activation memory is ≈ 4·B·N·L·(24d + 2HN) bytes in fp32: linear in batch, quadratic in
  sequence length, and usually larger than the parameters.
''']


# --------------------------------------------------------------------------- 03
L03 = [r'''%md
# 03 · A GPT on one process

This is the model every later lesson parallelises, and the **single-process run every parallel
configuration must reproduce**. We take it apart piece by piece, check the parameter-count formula
behind "175B", train it for a few seconds on the Python standard library's source, and sample.

$$
\begin{aligned}
x_0 &= W_{te}[\text{ids}] + W_{pe}[0..N)                    &&\text{embedding}\\
x &\leftarrow x + \text{Attn}(\text{LN}_1(x))                &&\text{each of } L \text{ blocks}\\
x &\leftarrow x + \text{MLP}(\text{LN}_2(x))\\
\text{logits} &= \text{LN}_f(x)\, W_{head}                     &&\text{head}
\end{aligned}
$$
''', r'''
import json
import math
import os
import subprocess
import sys
import tempfile
import time

import matplotlib.pyplot as plt
import numpy as np

from minipar import backend
from minipar.autograd import no_grad, ops
from minipar.data import Dataset, decode, encode, load_corpus
from minipar.nn import GPT, config_from_preset, naive_attention
from minipar.optim import AdamW, clip_grad_norm, lr_at
from minipar.sample import generate

%matplotlib inline
backend.set_default_dtype(np.float32)
cfg = config_from_preset("tiny")
model = GPT(cfg, seed=0)
print(cfg)
''', r'''%md
## 1. Embedding

Tokens are bytes (vocabulary V = 256, no tokenizer to train). Token $i$ at position $t$ becomes
$W_{te}[i] + W_{pe}[t]$, a vector of width d. The embedding is a table lookup, so its backward is a
**scatter-add**: a byte that occurs 10 times in the batch receives the sum of 10 gradients.
''', r'''
text = "def add(a, b):\n    return a + b\n"
ids = encode(text)[None, :]                       # (B=1, N)
x0 = model.embed(ids)
print("ids", ids.shape, "->", x0.shape)
manual = model.wte.weight.data[ids[0]] + model.wpe.weight.data[: ids.shape[1]]
assert np.allclose(x0.data[0], manual)
''', r'''%md
## 2. Causal self-attention

Each head projects the normalised stream to queries, keys and values
($q = xW_q,\ k = xW_k,\ v = xW_v$, width $d_h = d/H$) and mixes values along the sequence:

$$P = \text{softmax}\!\Big(\frac{qk^\top}{\sqrt{d_h}} + M\Big),\qquad
M_{ts} = \begin{cases}0 & s \le t\\ -\infty & s > t\end{cases},\qquad y = P\,v.$$

The causal mask $M$ makes position $t$ see only positions $\le t$, so one forward trains all N
next-token predictions at once without peeking. $P$ has $H N^2$ entries per sequence — the
quadratic memory that flash attention avoids. Below we recompute the first block's attention
by hand from its weights and check it against the module.
''', r'''
block = model.blocks[0]
h = block.ln_1(x0)
q, k, v = block.attn.split_heads(block.attn.qkv(h))           # each (B, H, N, d_head)
print("q, k, v:", q.shape)

# by hand, in NumPy
Q, K, Vv = q.data[0], k.data[0], v.data[0]
S = Q @ K.transpose(0, 2, 1) / math.sqrt(Q.shape[-1])
N = S.shape[-1]
S = np.where(np.triu(np.ones((N, N), bool), k=1), -np.inf, S)
P = np.exp(S - S.max(-1, keepdims=True)); P /= P.sum(-1, keepdims=True)
assert np.allclose(naive_attention(q, k, v).data[0], P @ Vv, atol=1e-6)
assert np.allclose(np.triu(P, k=1), 0) and np.allclose(P.sum(-1), 1)    # causal, rows sum to 1
assert np.allclose(block.attn(h).data, block.attn.proj(
    ops.reshape(ops.transpose(naive_attention(q, k, v), (0, 2, 1, 3)), (1, N, cfg.d_model))).data, atol=1e-6)
''', r'''%md
## 3. MLP, residuals and LayerNorm

- **MLP**: $\text{GELU}(x W_1 + b_1) W_2 + b_2$ with a 4× wider hidden layer — two thirds of a
  block's parameters.
- **LayerNorm** over the feature axis: $\hat x = (x - \mu)/\sqrt{\sigma^2 + \epsilon}$, then
  $\gamma \hat x + \beta$. GPT-2 normalises *before* each sublayer (pre-LN), so the residual stream
  $x$ itself is never normalised: gradients flow straight through the $+$ of each residual.
- **Initialisation**: all weights $\sim \mathcal N(0, 0.02)$, except the two projections that write
  into the residual stream, which get $0.02/\sqrt{2L}$: the stream receives $2L$ such additions,
  and variances add, so its variance stays $\approx 0.02^2$ instead of growing with depth.
''', r'''
b = model.blocks[0]
ln = b.ln_2(x0).data                              # γ = 1, β = 0 at init
var = x0.data.var(-1)                              # std of x̂ is sqrt(var / (var + eps)): ε matters
assert np.allclose(ln.mean(-1), 0, atol=1e-5)      # for inputs as small as these embeddings
assert np.allclose(ln.std(-1), np.sqrt(var / (var + 1e-5)), atol=1e-4)
hidden = ops.gelu(b.mlp.fc(b.ln_2(x0)))
print("MLP hidden", hidden.shape, "(4·d =", 4 * cfg.d_model, ")")

stds = {name: float(p.data.std()) for name, p in model.named_parameters() if p.ndim == 2}
for name in ("blocks.0.attn.qkv.weight", "blocks.0.mlp.fc.weight",
             "blocks.0.attn.proj.weight", "blocks.0.mlp.proj.weight", "wte.weight"):
    print(f"{name:28s} std {stds[name]:.4f}")
target = 0.02 / math.sqrt(2 * cfg.n_layer)
assert abs(stds["blocks.0.mlp.fc.weight"] - 0.02) < 0.002
assert abs(stds["blocks.0.attn.proj.weight"] - target) < 0.1 * target
assert abs(stds["blocks.3.mlp.proj.weight"] - target) < 0.1 * target

# the variance argument: 2L random residual writes of std s add up to std s·sqrt(2L)
rng = np.random.default_rng(0)
for std in (0.02, target):
    stream = sum(rng.normal(0, std, size=100_000) for _ in range(2 * cfg.n_layer))
    print(f"per-write std {std:.4f} -> residual std after {2 * cfg.n_layer} writes {stream.std():.4f}")
''', r'''%md
## 4. Counting parameters

Per block: attention $W_{qkv}$ ($d \times 3d$) and $W_o$ ($d\times d$) → $4d^2$; MLP $d\times 4d$ and
$4d\times d$ → $8d^2$; biases $3d + d + 4d + d$; two LayerNorms $4d$:

$$P_{block} = 12d^2 + 13d,\qquad
P = L(12d^2 + 13d) + \underbrace{Vd + Nd}_{\text{embeddings}} + \underbrace{2d}_{LN_f} + \underbrace{dV}_{\text{head, unless tied}}.$$

For large models $12Ld^2$ is everything: GPT-3 with $L=96,\ d=12288$ gives 174B of its 175B.
''', r'''
def param_count(c):
    n = c.n_layer * (12 * c.d_model ** 2 + 13 * c.d_model)
    n += c.vocab_size * c.d_model + c.seq_len * c.d_model + 2 * c.d_model
    return n + (0 if c.tie_weights else c.d_model * c.vocab_size)

print(f"tiny: formula {param_count(cfg):,}   model.num_parameters() {model.num_parameters():,}")
assert param_count(cfg) == model.num_parameters()
for name, overrides in [("small", {}), ("tiny", dict(tie_weights=True, n_layer=2, d_model=32, n_head=2))]:
    c = config_from_preset(name, **overrides)
    assert param_count(c) == GPT(c).num_parameters(), name
print(f"gpt2 preset (byte vocabulary, untied): {param_count(config_from_preset('gpt2')) / 1e6:.1f} M")
print(f"GPT-3: 12·L·d² = {12 * 96 * 12288 ** 2 / 1e9:.1f} B")
''', r'''%md
## 5. Training

The loop is the same one `python -m minipar train` runs: batch → forward → cross-entropy
$\ell = -\frac{1}{BN}\sum \log p(\text{next byte})$ → backward → clip the global gradient norm
to 1 → AdamW with linear warm-up and cosine decay. An untrained model predicts ~uniformly over
256 bytes, so the loss starts near $\ln 256 \approx 5.55$.

AdamW: $m \leftarrow \beta_1 m + (1-\beta_1) g$, $v \leftarrow \beta_2 v + (1-\beta_2) g^2$,
$\theta \leftarrow \theta - \eta_t\big(\hat m / (\sqrt{\hat v} + \epsilon) + \lambda\theta\big)$.
Note the state: two more arrays the size of the parameters (plus fp32 master weights in mixed
precision) — 12–16 bytes per parameter that ZeRO will shard.
''', r'''
corpus = load_corpus("stdlib")
data = Dataset(corpus, cfg.seq_len)
print(f"corpus: {len(corpus):,} bytes of the standard library; e.g.\n{decode(data.train[1000:1120])}")

model = GPT(cfg, seed=0)
steps, batch_size, base_lr, warmup = 50, 8, 3e-3, 5   # the CLI defaults for 50 steps
opt = AdamW(model.named_parameters(), lr=base_lr, weight_decay=0.1)
losses, lrs = [], []
t0 = time.perf_counter()
for step in range(steps):
    opt.lr = lr_at(step, base_lr, warmup, steps)
    x, y = data.batch(seed=0, step=step, batch_size=batch_size)
    _, loss = model(x, y)
    loss.backward()
    clip_grad_norm(model.parameters(), 1.0)
    opt.step()
    opt.zero_grad()
    losses.append(loss.item()); lrs.append(opt.lr)
elapsed = time.perf_counter() - t0
print(f"{steps} steps in {elapsed:.1f} s; loss {losses[0]:.3f} -> {np.mean(losses[-5:]):.3f}")
assert abs(losses[0] - math.log(256)) < 0.3
assert np.mean(losses[-5:]) < 0.8 * math.log(256)
''', r'''
fig, (ax1, ax2) = plt.subplots(1, 2, figsize=(9, 3.2))
ax1.plot(losses, label="train loss")
ax1.axhline(math.log(256), color="gray", ls=":", label="ln 256 (uniform)")
ax1.set_xlabel("step"); ax1.set_ylabel("cross-entropy (nats/byte)"); ax1.legend(); ax1.grid(alpha=0.3)
ax2.plot(lrs); ax2.set_xlabel("step"); ax2.set_ylabel("learning rate"); ax2.grid(alpha=0.3)
ax2.set_title("warm-up + cosine"); ax1.set_title("tiny GPT on the stdlib")
plt.show()
''', r'''%md
### What a head looks at

The attention probabilities $P$ of each head of the first block, on a line of Python. Everything
above the diagonal is exactly zero (the causal mask); each row is a distribution over the past.
''', r'''
snippet = "    def __init__(self, name):\n        self.name = name\n"
ids = encode(snippet)[None, : cfg.seq_len]
with no_grad():
    blk = model.blocks[0]
    q, k, v = blk.attn.split_heads(blk.attn.qkv(blk.ln_1(model.embed(ids))))
    scores = q @ ops.transpose(k, (0, 1, 3, 2))
    P = ops.attention_softmax(scores, 1 / math.sqrt(q.shape[-1])).numpy()[0]
n = P.shape[-1]
assert np.allclose(np.triu(P, k=1), 0) and np.allclose(P.sum(-1), 1, atol=1e-5)

fig, axes = plt.subplots(1, cfg.n_head, figsize=(3 * cfg.n_head, 3.2))
labels = [repr(chr(c))[1:-1] for c in ids[0]]
for hd, ax in enumerate(axes):
    ax.imshow(P[hd], cmap="magma", vmin=0, vmax=np.quantile(P[hd][P[hd] > 0], 0.98))
    ax.set_title(f"block 0, head {hd}"); ax.set_xlabel("key position s")
    ax.set_xticks(range(0, n, 8)); ax.set_yticks(range(0, n, 8))
axes[0].set_ylabel("query position t")
plt.tight_layout(); plt.show()
''', r'''%md
## 6. Sampling

Generation is the forward run repeatedly: take the logits of the last position, divide by a
temperature, keep the top-k, sample a byte, append it. After a few seconds of training the model
has learnt spaces, indentation and common byte pairs — not yet Python.
''', r'''
out = generate(model, encode("def "), tokens=120, temperature=0.8, top_k=40, seed=0)
sample = decode(out)
print(sample)
assert len(out) == 4 + 120 and sample.startswith("def ")
''', r'''%md
## 7. The same run from the command line

`python -m minipar train` is this loop plus logging, checkpoints and (in later lessons) parallel
layouts. `--log-json` writes one JSON object per step — the numbers every later lesson plots.
With the same seed, batch size and step count it must reproduce our loop exactly: this
"single-process oracle" is what every parallel layout is later compared against.
''', r'''
with tempfile.TemporaryDirectory() as tmp:
    log_path = os.path.join(tmp, "log.jsonl")
    cmd = [sys.executable, "-m", "minipar", "train", "--model", "tiny", "--steps", "50",
           "--batch-size", "8", "--log-json", log_path, "--quiet", "--eval-batches", "1"]
    print("$", " ".join(["python"] + cmd[1:]))
    t0 = time.perf_counter()
    result = subprocess.run(cmd, capture_output=True, text=True, timeout=300, cwd=tmp)
    print(result.stdout.strip() or result.stderr[-2000:])
    assert result.returncode == 0, result.stderr[-2000:]
    with open(log_path) as f:
        records = [json.loads(line) for line in f]
print(f"({time.perf_counter() - t0:.1f} s)  first record:", records[0])
cli_losses = [r["loss"] for r in records]
assert len(records) == 50 and {"step", "loss", "lr", "tokens_per_s", "peak_mem_bytes"} <= set(records[0])
# same seed, same data (the batch of step k is a function of (seed, k)), same schedule:
# the CLI run reproduces the notebook's loop step for step
assert np.allclose(cli_losses, losses, rtol=1e-4), np.abs(np.array(cli_losses) - losses).max()
print("CLI losses == notebook losses; max difference", np.abs(np.array(cli_losses) - losses).max())

plt.figure(figsize=(5, 3))
plt.plot(cli_losses, lw=3, alpha=0.5, label="CLI --log-json"); plt.plot(losses, "--", label="notebook loop")
plt.xlabel("step"); plt.ylabel("loss"); plt.legend(); plt.grid(alpha=0.3); plt.show()
''', r'''%md
## Takeaways

- A GPT block is LN → attention (causal softmax over $qk^\top/\sqrt{d_h}$) → residual, LN → 4×
  MLP → residual; GPT-2 init scales the residual writes by $1/\sqrt{2L}$.
- $P \approx 12Ld^2$: parameter count is dominated by the blocks' matrices — that is what tensor
  parallelism splits (lesson 07) and pipeline parallelism distributes by layer (lesson 08).
- This single-process run is the oracle: every parallel layout must reproduce its losses.
''']


NOTEBOOKS = {"01_autograd.ipynb": L01, "02_backends.ipynb": L02, "03_gpt.ipynb": L03}


def main():
    for name, cells in NOTEBOOKS.items():
        path = os.path.join(HERE, name)
        nbformat.write(build(cells), path)
        print("wrote", os.path.relpath(path))


if __name__ == "__main__":
    main()
