"""RMSNorm (Zhang & Sennrich, 2019): LayerNorm without the mean and without the bias.

    y = x / sqrt(mean(x²) + eps) · g            (over the last axis, gain g starts at 1)

LayerNorm centres then scales; RMSNorm only scales, which is one statistic fewer and
works as well in practice (LLaMA, Mistral, Qwen use it).  Written in ordinary ops, so
autograd derives its backward (checked against finite differences in the tests).
In fp16/bf16 the statistic is taken in float32 and the normalised value is rounded
back before the gain, as Hugging Face's ``LlamaRMSNorm`` does.
"""
from __future__ import annotations

from minipar.autograd import ops
from minipar.backend import is_half, xp
from minipar.nn.init import Constant
from minipar.nn.layers import constant
from minipar.nn.module import Module


def rms_norm(x, weight, eps=1e-5):
    """x / sqrt(mean(x²) + eps) · weight, over the last axis."""
    wide = ops.cast(x, xp.float32) if is_half(x.dtype) else x
    inverse_rms = ops.pow(ops.mean(wide * wide, axis=-1, keepdims=True) + eps, -0.5)
    y = wide * inverse_rms
    if wide is not x:
        y = ops.cast(y, x.dtype)
    return y * weight


class RMSNorm(Module):
    def __init__(self, dim, eps=1e-5):
        self.weight = constant(1.0, (dim,))
        self.eps = eps
        self.inits = {"weight": Constant(1.0)}

    def forward(self, x):
        return rms_norm(x, self.weight, self.eps)
