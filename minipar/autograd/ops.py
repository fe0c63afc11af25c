"""The op vocabulary as plain functions of Tensors (and constants).

Each function is a one-line call of the Function that implements it; the Tensor
operators (``a + b``, ``a @ b``, ``a[i]``) call these.
"""
from __future__ import annotations

import builtins

from minipar.autograd import ops_math as M, ops_shape as S, ops_reduce as R, ops_nn as N
from minipar.autograd import ops_attention as A
from minipar.autograd import ops_llama as L


def raw(x):
    """The array inside a Tensor (constants such as masks and ids are passed as arrays)."""
    from minipar.autograd.tensor import Tensor
    return x.data if isinstance(x, Tensor) else x


def add(a, b): return M.Add.apply(a, b)
def sub(a, b): return M.Sub.apply(a, b)
def mul(a, b): return M.Mul.apply(a, b)
def div(a, b): return M.Div.apply(a, b)
def neg(a): return M.Neg.apply(a)
def pow(a, exponent): return M.Pow.apply(a, exponent)
def exp(a): return M.Exp.apply(a)
def log(a): return M.Log.apply(a)
def tanh(a): return M.Tanh.apply(a)
def relu(a): return M.Relu.apply(a)
def gelu(a): return M.Gelu.apply(a)
def silu(a): return M.Silu.apply(a)
def where(cond, a, b): return M.Where.apply(raw(cond), a, b)
def masked_fill(x, mask, value): return where(mask, value, x)
def cast(a, dtype): return M.Cast.apply(a, dtype)

def reshape(a, shape): return S.Reshape.apply(a, tuple(shape))
def transpose(a, axes=None): return S.Transpose.apply(a, axes)
def getitem(a, index): return S.GetItem.apply(a, raw(index))
def concat(tensors, axis=0): return S.Concat.apply(*tensors, axis=axis)


def split(a, sections, axis=0):
    """Split into pieces of the given sizes (a list) or into ``sections`` equal parts."""
    n = a.shape[axis]
    sizes = [n // sections] * sections if isinstance(sections, int) else list(sections)
    if builtins.sum(sizes) != n:
        raise ValueError(f"cannot split an axis of {n} into {sections}")
    pieces, start = [], 0
    for size in sizes:
        index = [slice(None)] * a.ndim
        index[axis] = slice(start, start + size)
        pieces.append(getitem(a, tuple(index)))
        start += size
    return pieces


def sum(a, axis=None, keepdims=False): return R.Sum.apply(a, axis, keepdims)
def max(a, axis=None, keepdims=False): return R.Max.apply(a, axis, keepdims)


def mean(a, axis=None, keepdims=False):
    shape = a.shape
    axes = range(len(shape)) if axis is None else ((axis,) if isinstance(axis, int) else axis)
    count = 1
    for ax in axes:
        count *= shape[ax]
    return mul(sum(a, axis, keepdims), 1.0 / count)


def matmul(a, b): return R.MatMul.apply(a, b)
def linear(x, weight, bias=None): return R.Linear.apply(x, weight, bias)

def softmax(a, axis=-1): return N.Softmax.apply(a, axis)
def log_softmax(a, axis=-1): return N.LogSoftmax.apply(a, axis)
def layer_norm(x, weight, bias, eps=1e-5): return N.LayerNorm.apply(x, weight, bias, eps)
def rms_norm(x, weight, eps=1e-5): return L.RMSNorm.apply(x, weight, eps)
def rotary(x, cos, sin): return L.Rotary.apply(x, cos, sin)
def swiglu(gate, up): return L.SwiGLU.apply(gate, up)
def embedding(weight, ids): return N.Embedding.apply(weight, raw(ids))


def cross_entropy(logits, targets, ignore_index=-100):
    return N.CrossEntropy.apply(logits, raw(targets), ignore_index)


def dropout(x, p, generator, training=True):
    if not training or p == 0.0:
        return x
    return N.Dropout.apply(x, p, generator)


def attention_softmax(scores, scale, causal=True):
    return A.AttentionSoftmax.apply(scores, scale, causal)
