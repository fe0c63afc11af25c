"""fp32 master weights behind a half-precision model (see ``minipar.amp``).

The model computes with w_half = round(w32); the optimizer updates w32.  An update
lr·u below half an ulp of w (fp16 at 1.0: ulp 2^-10 ≈ 9.8e-4) would be rounded away
if applied to w_half; applied to w32 it accumulates until it shows in the rounding.

The fp32 master gradients are views of one flat buffer, made at the first backward of a
step and dropped by ``zero_grad`` (the memory of per-parameter arrays, held as long):
the loss scaler's unscale, its overflow check and the norm's squares then take every
gradient in one kernel launch (``flat_grads``; ``kernels/fused_cuda.unscale_check_norm``)
instead of several per parameter, as Megatron's contiguous main-gradient buffer allows.
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
        self.grad_buffer = None      # the masters' gradients, back to back (fp32), this step
        for name, p in named:
            master = Parameter(p.data.astype(xp.float32), name=name)
            p.data = memory.track(p.data.astype(self.dtype))
            p.grad = None
            self.names.append(name)
            self.params.append(p)
            self.masters.append(master)
        sizes = [int(m.data.size) for m in self.masters]
        self.grad_ends = numpy.cumsum(sizes, dtype=numpy.int64)   # where each gradient ends

    def named_masters(self):
        return list(zip(self.names, self.masters))

    def master_grads(self):
        return [m.grad for m in self.masters]

    def grads_to_masters(self):
        """master.grad += fp32(p.grad), then free p.grad.  Call after each backward
        (each micro-batch), so accumulation over micro-batches happens in fp32.  A master's
        first gradient of the step is written into its view of ``grad_buffer``."""
        if self.grad_buffer is None:
            total = int(self.grad_ends[-1]) if len(self.grad_ends) else 0
            self.grad_buffer = memory.track(xp.empty(total, dtype=xp.float32))
        for i, (p, m) in enumerate(zip(self.params, self.masters)):
            if p.grad is None:
                continue
            if m.grad is None:
                m.grad = self._view(i)
                m.grad[...] = p.grad          # half -> fp32: exact, as astype
            else:
                m.grad += p.grad.astype(xp.float32)
            p.grad = None

    def _view(self, i):
        start = int(self.grad_ends[i - 1]) if i else 0
        return self.grad_buffer[start:int(self.grad_ends[i])].reshape(self.masters[i].shape)

    def flat_grads(self):
        """(buffer, ends): every master gradient of this step in one fp32 array, gradient
        i ending before ends[i]; a master no backward reached reads as zeros there (its
        ``grad`` stays None).  None before the first backward of a step."""
        if self.grad_buffer is None:
            return None
        for i, m in enumerate(self.masters):
            if m.grad is None:
                self._view(i)[...] = 0
        return self.grad_buffer, self.grad_ends

    @no_grad()
    def masters_to_model(self):
        """p.data = round-to-nearest half(master.data), in place."""
        for p, m in zip(self.params, self.masters):
            p.data[...] = m.data.astype(self.dtype)

    def zero_grad(self):
        for p, m in zip(self.params, self.masters):
            p.grad = m.grad = None
        self.grad_buffer = None

    def state_dict(self):
        """{name: fp32 host array}: save this, not the model's rounded half weights."""
        return {n: to_host(m.data).copy() for n, m in zip(self.names, self.masters)}

    def load_state_dict(self, state):
        for n, m in zip(self.names, self.masters):
            if tuple(state[n].shape) != tuple(m.shape):
                raise ValueError(f"{n}: checkpoint shape {tuple(state[n].shape)} != {tuple(m.shape)}")
            m.data[...] = to_device(state[n], dtype=m.dtype)
        self.masters_to_model()
