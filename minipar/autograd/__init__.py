"""A small reverse-mode autograd engine over NumPy/CuPy arrays.

    from minipar.autograd import Tensor, ops, no_grad
    x = Tensor(xp.ones((2, 3)), requires_grad=True)
    loss = ops.sum(ops.tanh(x) * 2)
    loss.backward()          # x.grad == 2 · (1 - tanh(1)²)
"""
from minipar.autograd.function import Function, no_grad, set_grad_enabled, is_grad_enabled
from minipar.autograd.tensor import Tensor, tensor
from minipar.autograd import ops
from minipar.autograd.deferral import WeightGradDeferral

__all__ = ["Function", "Tensor", "tensor", "ops", "no_grad", "set_grad_enabled",
           "is_grad_enabled", "WeightGradDeferral"]
