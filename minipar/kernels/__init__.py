"""Hand-written attention kernels.

- ``flash_reference``: FlashAttention-2 tile by tile in array code (NumPy or CuPy), plus
  ``dense_attention``, the N×N baseline;
- ``flash_attention.cu`` / ``flash_attention_f16.cu`` launched by ``flash_cuda``: the same
  algorithm as CUDA C (fp32, and fp16 on tensor cores), compiled at run time by CuPy;
- ``flash_attention``: the autograd Function that picks one —
  ``from minipar.kernels.flash_attention import flash_attention``;
- ``bench``: ``python -m minipar bench attention``.

The submodule ``flash_attention`` keeps its name here (the function is not re-exported
under it), so ``minipar.kernels.flash_attention`` is always the module.
"""
from minipar.kernels.flash_attention import FlashAttention, dense_attention
from minipar.kernels.flash_reference import flash_backward_reference, flash_forward_reference

__all__ = ["FlashAttention", "dense_attention", "flash_forward_reference", "flash_backward_reference"]
