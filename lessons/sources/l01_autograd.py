"""Lesson 01: the cells of lessons/01_autograd.ipynb (``%md`` cells are markdown).

Edit here, then run ``python lessons/make_notebooks.py``."""

NOTEBOOK = "01_autograd.ipynb"

CELLS = [r'''%md
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
`Function`; (3) **you write** the backward of a linear layer and of softmax, checked against
minipar's; (4) a new op of our own, checked against finite differences; (5) broadcasting — **you
write** `unbroadcast`; (6) the two hooks distributed training is built on: leaf gradient hooks and
`backward(grad)`; (8) **you write** the engine itself — the walk that `loss.backward()` runs —
checked against minipar's on a small MLP, to $10^{-12}$, and against finite differences.

Cells tagged *exercise* are yours: each starts as a stub that fails with a hint; the cell after it
checks your version against the library's (solutions: `lessons/solutions/01_autograd.py`).
''', r'''
import inspect
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
### What `apply` records, and how the engine walks it

This is minipar's real code (`minipar/autograd/function.py`): `apply` unwraps the Tensors, runs
`forward` on raw arrays and, only when some input wants a gradient, hangs the `Context` on the
output — that context *is* the graph node.
''', r'''
from minipar.autograd import engine
from minipar.autograd.function import Function as _F

print(inspect.getsource(_F.apply))
''', r'''%md
`backward` first orders the graph (`minipar/autograd/engine.py`): a depth-first search that
appends a node after everything it was made from, then reverses the list — so each node comes
before its inputs, and every consumer of a value is processed before the value itself. It also
counts how many edges lead into each leaf, so the leaf's gradient can be added up *completely*
before it is announced (section 6). Here is the order it finds for the graph above (you write
this walk yourself in section 8):
''', r'''
L2 = (ops.tanh(x1 * w1 + x2 * w2 + b) * x1).sum()   # a fresh graph: backward freed L's
order, leaf_uses = engine._topological_order(L2)
print("nodes in the order backward visits them:", [t.ctx.fn.__name__ for t in order])
print("edges into x1:", leaf_uses[id(x1)], "  into x2:", leaf_uses[id(x2)])
assert order[0] is L2                                  # the loss first
position = {id(t): i for i, t in enumerate(order)}
for t in order:                                        # every node before the nodes it was made from
    assert all(position[id(p)] > position[id(t)] for p in t.ctx.inputs if id(p) in position)
assert leaf_uses[id(x1)] == 2 and leaf_uses[id(x2)] == 1   # x1 is used inside tanh and outside
''', r'''%md
## 3. Backward rules: your turn

### 3a. A linear layer

$y = xW + b$ with $x$ of shape $(\dots, d_{in})$, $W$ of shape $(d_{in}, d_{out})$. Flatten every
batch axis into rows ($X$: $n \times d_{in}$, $G = \partial L/\partial Y$: $n \times d_{out}$). Each
output $Y_{ij} = \sum_k X_{ik}W_{kj} + b_j$, so

$$\frac{\partial L}{\partial X} = G\,W^\top,\qquad
\frac{\partial L}{\partial W} = X^\top G,\qquad
\frac{\partial L}{\partial b} = \textstyle\sum_i G_{i\cdot}.$$

Two GEMMs the size of the forward's: that is why a backward costs about twice a forward. Lesson 07
splits exactly these products across GPUs (a column-parallel $W$ needs a sum of partial $dX$).

**Exercise.** Write `linear_backward(x, W, g)` returning `(dx, dW, db)` on NumPy arrays; `dx` must
have `x`'s shape.
''', r'''%exercise linear_backward
def linear_backward(x, W, g):
    """x: (..., d_in), W: (d_in, d_out), g = dL/dy: (..., d_out)  ->  (dx, dW, db)."""
    raise NotImplementedError("hint: the batch axes are only more rows; differentiate "
                              "Y_ij = sum_k X_ik W_kj + b_j by X, W and b, and let the shapes "
                              "tell you which operand is transposed")
''', r'''
rng = np.random.default_rng(7)
x = rng.normal(size=(2, 3, 5))
W, b = rng.normal(size=(5, 4)), rng.normal(size=4)
g = rng.normal(size=(2, 3, 4))                              # an upstream gradient dL/dy

xt, Wt, bt = (Tensor(a.copy(), requires_grad=True) for a in (x, W, b))
ops.linear(xt, Wt, bt).backward(g)                          # minipar's Linear.backward
dx, dW, db = linear_backward(x, W, g)
for mine, lib in [(dx, xt.grad), (dW, Wt.grad), (db, bt.grad)]:
    assert np.shape(mine) == lib.shape, (np.shape(mine), lib.shape)
    np.testing.assert_allclose(mine, lib, rtol=1e-12, atol=1e-12)
print("linear_backward == minipar's Linear.backward (float64, to 1e-12)")
''', r'''%md
minipar's version is the same three lines, plus one thing you will need in lesson 08: a zero-bubble
pipeline may *defer* `dW` (`ctx.deferral`) because nothing downstream waits for it, while `dx` is
needed at once by the previous stage.
''', r'''
from minipar.autograd.ops_reduce import Linear as LinearFn

print(inspect.getsource(LinearFn.backward))
''', r'''%md
### 3b. Softmax

$y_i = e^{x_i} / \sum_j e^{x_j}$ along the last axis has the Jacobian
$\partial y_i / \partial x_j = y_i(\delta_{ij} - y_j)$. Never build that $d\times d$ matrix: contracted
with the upstream gradient $g$,

$$\frac{\partial L}{\partial x_j} = \sum_i g_i\, y_i(\delta_{ij} - y_j) = y_j\Big(g_j - \sum_i g_i y_i\Big).$$

Only the output $y$ is needed — that is what the forward saves.

**Exercise.** Write `softmax_backward(y, g)`: the gradient with respect to the input, for softmax
along the last axis, from the forward's output `y` and the upstream gradient `g` (any leading axes).
''', r'''%exercise softmax_backward
def softmax_backward(y, g):
    """y = softmax(x) along the last axis, g = dL/dy  ->  dL/dx (same shape)."""
    raise NotImplementedError("hint: contract the Jacobian y_i(delta_ij - y_j) with g on paper "
                              "first; what remains needs one number per row, not a d x d matrix")
''', r'''
rng = np.random.default_rng(8)
xs_ = rng.normal(size=(3, 4, 6)) * 3
g = rng.normal(size=xs_.shape)
t = Tensor(xs_.copy(), requires_grad=True)
y = ops.softmax(t)                                           # minipar's Softmax
y.backward(g)
mine = softmax_backward(y.data, g)
np.testing.assert_allclose(mine, t.grad, rtol=1e-10, atol=1e-13)
assert np.allclose(mine.sum(-1), 0)      # softmax is shift-invariant: gradients sum to 0 per row
print("softmax_backward == minipar's Softmax.backward;  row sums of dx:", np.abs(mine.sum(-1)).max())
''', r'''
from minipar.autograd.ops_nn import Softmax

print(inspect.getsource(Softmax))
''', r'''%md
## 4. Writing a new op: `Sigmoid`

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
give it one coordinate at a time. In float64 with $\varepsilon=10^{-6}$ they agree to about
$10^{-10}$ (printed below; the check allows $10^{-8}$).
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
## 5. Broadcasting forwards = summing backwards

A bias $b$ of shape $(d,)$ added to activations $X$ of shape $(B, N, d)$ is *broadcast*: each
$b_j$ is used $B \cdot N$ times. A value used $k$ times gets the sum of its $k$ gradients, so

$$\frac{\partial L}{\partial b_j} = \sum_{b,n} \frac{\partial L}{\partial Y_{b,n,j}}.$$

In general an input of shape `shape` was stretched to the gradient's shape in two ways: axes were
**added in front** (NumPy aligns shapes from the right), and axes of size 1 were **stretched**. Its
gradient sums over both. Note what this means for distributed training: the bias gradient is itself
a **reduction over the batch** — split the batch over GPUs and that sum needs an all-reduce.

**Exercise.** Write `unbroadcast(grad, shape)`: `grad` summed down to `shape`.
''', r'''%exercise unbroadcast
def unbroadcast(grad, shape):
    """Sum grad (the gradient of a broadcast result) down to the input's shape."""
    raise NotImplementedError("hint: a value used k times receives the sum of its k gradients; "
                              "list the two ways broadcasting reused the input's values (the "
                              "markdown above) and undo each")
''', r'''
from minipar.autograd.ops_math import unbroadcast as lib_unbroadcast

rng = np.random.default_rng(9)
G = rng.normal(size=(2, 3, 4))
for shape in [(2, 3, 4), (4,), (3, 1), (1, 4), (2, 1, 4), (1, 1, 1), (), (3, 4), (2, 3, 1)]:
    mine = unbroadcast(G, shape)
    np.testing.assert_allclose(mine, lib_unbroadcast(G, shape), rtol=1e-12)
    assert np.shape(mine) == shape, (shape, np.shape(mine))
print("unbroadcast == minipar's on 9 shapes")

# and inside autograd: bias (4,) and a column (3, 1) broadcast against (2, 3, 4)
X = Tensor(rng.normal(size=(2, 3, 4)), requires_grad=True)
bias = Tensor(np.zeros(4), requires_grad=True)
col = Tensor(np.ones((3, 1)), requires_grad=True)
((X + bias) * col).backward(G)
assert np.allclose(bias.grad, unbroadcast(G, (4,)))
assert np.allclose(col.grad, unbroadcast(G * X.data, (3, 1)))
print("bias.grad", bias.grad.shape, "= G summed over batch and positions;  col.grad", col.grad.shape)
''', r'''%md
## 6. Leaf hooks: "this gradient is ready"

A *leaf* is a tensor nobody computed (a parameter). When the engine accumulates a gradient into a
leaf's `.grad` it fires the leaf's hooks. Backward visits layers **in reverse**, so the last
layer's gradients are ready first. Data parallelism exploits this: group parameters into buckets
and start the all-reduce of a full bucket *while backward is still computing earlier layers*
(lesson 05). ZeRO-2 uses the same event to reduce-scatter and free gradients early (lesson 06).

The engine sums a leaf's contributions first (it counted its edges in `_topological_order`) and
calls this once, after the leaf's last use:
''', r'''
print(inspect.getsource(engine.accumulate_leaf_grad))
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
## 7. `backward(grad)`: backprop that starts in the middle

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
## 8. The engine: your turn

Everything above rests on one function, the walk `loss.backward()` runs. Write it.

`my_backward(root, grad)` gets the output of a recorded graph and $\partial L/\partial\,\text{root}$,
and must leave in every leaf's `.grad` what minipar's engine leaves there. What you can read on a
`Tensor` `t`:

- `t.ctx` — its graph node, or `None` for a leaf (a parameter, an input);
- `t.ctx.inputs` — the forward's positional arguments (Tensors or constants), and
  `t.ctx.needs_input_grad` — for each, whether a gradient must flow into it;
- `t.ctx.fn.backward(t.ctx, g)` — the op's backward rule: from $\partial L/\partial t$, one gradient
  per input (a tuple, or a single array for a one-input op; `None` where none is needed);
- `t.grad`, `t.hooks` — a leaf's accumulated gradient and its gradient-ready hooks.

What it must get right, each the idea of a section above: a node's backward runs only when its
gradient is complete, i.e. after **every** node that used it (section 2); gradients arriving at the
same tensor from several uses **add** (sections 1 and 5); a leaf's gradient is **added** to what
`.grad` already holds (gradient accumulation over micro-batches), and its hooks fire **once**, as
soon as its last contribution is in — not at the end of the walk, or data parallelism could not
overlap its all-reduce with backward (section 6). Optionally, free each node once it is used
(`ctx.release()`, `t.ctx = None`), as minipar does: that is why backward's memory falls as it goes.

The check runs a small MLP whose graph has all three hazards — a layer applied twice (its weights
are leaves used twice), residual streams (a node used twice) and broadcast biases — and compares
every gradient with minipar's, to $10^{-12}$ in float64, the hooks' timing, accumulation over two
backwards, and finite differences.
''', r'''%exercise my_backward
def my_backward(root, grad):
    """Back-propagate grad = dL/d(root) through the graph recorded under root: every leaf
    that needs a gradient gets it added to .grad, and its hooks fire once it is complete."""
    raise NotImplementedError("hint: first decide an order in which every node comes after all the "
                              "nodes that used it (section 2); then walk it, handing each node the "
                              "sum of the gradients its consumers sent")
''', r'''
rng = np.random.default_rng(12)
start = {"W_in": rng.normal(size=(4, 6)) / 2, "b_in": rng.normal(size=6),
         "W_shared": rng.normal(size=(6, 6)) / 2, "b_shared": rng.normal(size=(1, 6)),
         "W_out": rng.normal(size=(6, 3)) / 2}
x_batch, targets = Tensor(rng.normal(size=(5, 4))), rng.integers(0, 3, size=5)

def mlp_loss(P):
    """A shared layer applied twice (leaves used twice), residuals (nodes used twice), broadcasts."""
    h = ops.tanh(x_batch @ P["W_in"] + P["b_in"])
    for _ in range(2):
        h = h + ops.tanh(h @ P["W_shared"] + P["b_shared"])
    return ops.cross_entropy(h @ P["W_out"], targets)

def gradients_and_hooks(backward_fn, backwards=1):
    """Each leaf's .grad after `backwards` passes (not zeroed between), and for every hook call:
    (leaf, its .grad then, the leaves that had no .grad yet)."""
    P = {name: Tensor(a.copy(), requires_grad=True) for name, a in start.items()}
    fired = []
    for name, p in P.items():
        p.register_hook(lambda p, name=name: fired.append(
            (name, None if p.grad is None else p.grad.copy(), {n for n, q in P.items() if q.grad is None})))
    for _ in range(backwards):
        loss = mlp_loss(P)
        backward_fn(loss, np.ones_like(loss.data))
    return {name: p.grad for name, p in P.items()}, fired

def first_difference(name, mine, ref):
    """None if mine == ref to 1e-12 (relative to ref's largest entry), else one line saying where."""
    if mine is None:
        return f"{name}.grad is None: no gradient reached it"
    if np.shape(mine) != ref.shape:
        return f"{name}.grad has shape {np.shape(mine)}, minipar's {ref.shape}"
    err = np.abs(mine - ref)
    if err.max() <= 1e-12 * (1 + np.abs(ref).max()):
        return None
    i = np.unravel_index(err.argmax(), err.shape)
    return f"{name}.grad{[int(j) for j in i]} is {mine[i]:+.10g}, minipar's {ref[i]:+.10g}"

def check_my_backward():
    """One line naming the first thing that differs from minipar's engine, or None."""
    ref, _ = gradients_and_hooks(lambda root, g: root.backward(g))
    mine, fired = gradients_and_hooks(my_backward)
    for name in start:
        if problem := first_difference(name, mine[name], ref[name]):
            return problem
    for name in start:
        if (n := [f[0] for f in fired].count(name)) != 1:
            return f"{name}'s hooks fired {n} times in one backward; want once, after its last use"
    for name, grad_then, _ in fired:
        if problem := first_difference(name, grad_then, ref[name]):
            return f"{name}'s hook fired before its gradient was complete: {problem}"
    if "W_in" not in dict((f[0], f[2]) for f in fired)["W_out"]:
        return ("W_out's hook fired after W_in had its gradient: the first layer is processed last, "
                "so a hook that waits for the end of the walk fires too late to overlap anything")
    twice, _ = gradients_and_hooks(my_backward, backwards=2)
    for name in start:
        if problem := first_difference(name, twice[name], 2 * ref[name]):
            return f"after two backwards without zero_grad: {problem} (each backward adds to .grad)"
    return None

problem = check_my_backward()
assert problem is None, problem

mine, _ = gradients_and_hooks(my_backward)
numeric = {name: finite_difference_grad(
    lambda a, name=name: float(mlp_loss({n: Tensor(a if n == name else v) for n, v in start.items()}).data),
    start[name].copy()) for name in start}
worst = max(np.abs(mine[name] - numeric[name]).max() for name in start)
print(f"my_backward == minipar's engine on every leaf (float64, 1e-12), hooks once and on time; "
      f"max |yours - finite differences| = {worst:.1e}")
assert worst < 1e-8
''', r'''%md
minipar's engine is your walk plus three things a real model needs: an iterative search (no
recursion limit on a 96-layer model), additions done in place where the engine owns the array
(the residual stream's gradient is summed from every block), and a slice's gradient written into
its input's instead of a zero-padded copy (`_scatter`):
''', r'''
print(inspect.getsource(engine.backward))
''', r'''%md
## Takeaways

- Backward = the chain rule over a recorded graph, visited in reverse topological order; a value
  used several times sums its gradients (broadcasting is the array version of this).
- An op is a forward and a backward on raw arrays; what forward saves is activation memory.
- Central finite differences in float64 are the ground truth for every backward.
- Gradient-ready hooks and `backward(upstream_grad)` are the two entry points that data
  parallelism and pipeline parallelism will plug into.
''', r'''%md
## What changes on GPU nodes and at scale

- The engine is the same on a GPU: `xp` is CuPy, each op a kernel launch. A launch costs a few
  microseconds (the repository's A100/H100/H200 profiles take 4 µs, a spec-sheet figure), so a small
  model's step is bound by launches, not FLOPs: measured on one H200, at 4 layers and d = 256
  minipar's Python costs 2× PyTorch's per step, while at GPT-2 small's shape the two are level
  (150 ms against 152 ms, docs/benchmarks.md, "GPU").
- PyTorch removes that cost by capturing the graph (CUDA graphs, `torch.compile` fusing ops into fewer
  kernels); the backward walk you wrote here is what they capture.

## In PyTorch / DeepSpeed / Megatron this is …

| here | there |
|---|---|
| `Function` with `forward(ctx, …)` / `backward(ctx, grad)`, `ctx.save_for_backward`, `ctx.needs_input_grad` | `torch.autograd.Function` — the same names (`ctx.saved_tensors` to read them back) |
| `gradcheck` above, `tests/gradcheck.py` | `torch.autograd.gradcheck(fn, inputs)` (float64, central differences) |
| `unbroadcast` | what autograd does for every broadcasting op; by hand: `Tensor.sum_to_size(shape)` |
| `Parameter.register_hook` (fires after `.grad` was accumulated) | `Tensor.register_post_accumulate_grad_hook` (PyTorch ≥ 2.1); DDP's C++ `Reducer` hooks each parameter's `AccumulateGrad` node to mark buckets ready; DeepSpeed ZeRO reduces gradients from the same event |
| `h.backward(received_grad)` | `torch.autograd.backward(tensors, grad_tensors=…)`; the pipeline schedules of `torch.distributed.pipelining` and Megatron (`megatron/core/pipeline_parallel/schedules.py`) resume backward from a received gradient |
| `no_grad()`, `detach()` | `torch.no_grad()`, `Tensor.detach()` |
| what `forward` saves = activation memory | `torch.autograd.graph.saved_tensors_hooks` (to offload or compress what is saved), `torch.utils.checkpoint` (lesson 10) |
''']
