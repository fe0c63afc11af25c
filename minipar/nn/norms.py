"""RMSNorm (Zhang & Sennrich, 2019): LayerNorm without the mean and without the bias.

    y = x / sqrt(mean(x²) + eps) · g            (over the last axis, gain g starts at 1)

LayerNorm centres then scales; RMSNorm only scales, which is one statistic fewer and
works as well in practice (LLaMA, Mistral, Qwen use it).  The op and its hand-derived
backward are ``autograd/ops_llama.py`` (checked against finite differences in the
tests); in fp16/bf16 it normalises in float32 and rounds once.
"""
from __future__ import annotations

from minipar.autograd import ops
from minipar.nn.init import Constant
from minipar.nn.layers import constant
from minipar.nn.module import Module


class RMSNorm(Module):
    def __init__(self, dim, eps=1e-5):
        self.weight = constant(1.0, (dim,))
        self.eps = eps
        self.inits = {"weight": Constant(1.0)}

    def forward(self, x):
        return ops.rms_norm(x, self.weight, self.eps)
