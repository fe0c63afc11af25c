"""fp32 master weights behind a half-precision model (see ``minipar.amp``).

The model computes with w_half = round(w32); the optimizer updates w32.  An update
lr·u below half an ulp of w (fp16 at 1.0: ulp 2^-10 ≈ 9.8e-4) would be rounded away
if applied to w_half; applied to w32 it accumulates until it shows in the rounding.
"""
from __future__ import annotations

import numpy

from minipar.backend import xp, memory, dtype_of, is_half, to_host, to_device
from minipar.autograd import no_grad
from minipar.nn.module import Parameter


class MixedPrecision:
    """Hold a model's parameters in half precision with fp32 master copies.

    ``MixedPrecision(model, "fp16")`` rounds every parameter's data to fp16 in place
    (``p.data`` is replaced: wrap the model before building DDP/ZeRO/optimizers on
    it) and keeps ``masters``: fp32 ``Parameter``s, one per model parameter, same
    names and order.  Build the optimizer on ``named_masters()``.
    """

    def __init__(self, model, precision="fp16"):
        self.dtype = dtype_of(precision) if isinstance(precision, str) else numpy.dtype(precision)
        if not is_half(self.dtype):
            raise ValueError(f"mixed precision needs fp16 or bf16, got {self.dtype}")
        named = model.named_parameters() if hasattr(model, "named_parameters") else model
        self.names, self.params, self.masters = [], [], []
        for name, p in named:
            master = Parameter(p.data.astype(xp.float32), name=name)
            p.data = memory.track(p.data.astype(self.dtype))
            p.grad = None
            self.names.append(name)
            self.params.append(p)
            self.masters.append(master)

    def named_masters(self):
        return list(zip(self.names, self.masters))

    def master_grads(self):
        return [m.grad for m in self.masters]

    def grads_to_masters(self):
        """master.grad += fp32(p.grad), then free p.grad.  Call after each backward
        (each micro-batch), so accumulation over micro-batches happens in fp32."""
        for p, m in zip(self.params, self.masters):
            if p.grad is None:
                continue
            g = p.grad.astype(xp.float32)
            if m.grad is None:
                m.grad = memory.track(g)
            else:
                m.grad += g
            p.grad = None

    @no_grad()
    def masters_to_model(self):
        """p.data = round-to-nearest half(master.data), in place."""
        for p, m in zip(self.params, self.masters):
            p.data[...] = m.data.astype(self.dtype)

    def zero_grad(self):
        for p, m in zip(self.params, self.masters):
            p.grad = m.grad = None

    def state_dict(self):
        """{name: fp32 host array}: save this, not the model's rounded half weights."""
        return {n: to_host(m.data).copy() for n, m in zip(self.names, self.masters)}

    def load_state_dict(self, state):
        for n, m in zip(self.names, self.masters):
            if tuple(state[n].shape) != tuple(m.shape):
                raise ValueError(f"{n}: checkpoint shape {tuple(state[n].shape)} != {tuple(m.shape)}")
            m.data[...] = to_device(state[n], dtype=m.dtype)
        self.masters_to_model()
