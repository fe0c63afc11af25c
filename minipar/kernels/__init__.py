"""Hand-written kernels: attention, and the fused elementwise ops.

- ``dense``: attention with the whole N×N matrix P (forward, and backward from P), the
  baseline every flash implementation is checked against;
- ``flash_reference``: FlashAttention-2 tile by tile in array code (NumPy or CuPy), plus
  ``dense_attention``, the dense output under the tiled version's signature;
- ``flash_attention.cu`` / ``flash_attention_f16.cu`` launched by ``flash_cuda``: the same
  algorithm as CUDA C (fp32, and fp16 on tensor cores), compiled at run time by CuPy;
- ``flash_attention``: the autograd Function that picks one —
  ``from minipar.kernels.flash_attention import flash_attention``;
- ``fused_cuda`` (``fused_elementwise.cu``) and ``fused_cpu`` (numba): LayerNorm, the tanh
  GELU, the causal attention softmax and AdamW's update as one compiled pass each, for CuPy and for
  NumPy; the autograd ops call them once ``minipar.nn`` has imported (registered) them;
- ``emulator``: runs those .cu files on the CPU (g++, one fiber per CUDA thread), to
  test the kernels without a GPU;
- ``bench``: ``python -m minipar bench attention``.

The submodule ``flash_attention`` keeps its name here (the function is not re-exported
under it), so ``minipar.kernels.flash_attention`` is always the module.
"""
from minipar.kernels.flash_attention import FlashAttention, dense_attention
from minipar.kernels.flash_reference import flash_backward_reference, flash_forward_reference

__all__ = ["FlashAttention", "dense_attention", "flash_forward_reference", "flash_backward_reference"]
