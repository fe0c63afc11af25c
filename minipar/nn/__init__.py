"""Layers and the models (GPT-2, Llama), written on minipar.autograd."""
from minipar.nn.module import Module, Parameter, Wrapper, unwrap
from minipar.nn.layers import Linear, Embedding, LayerNorm, Dropout, MLP
from minipar.nn.attention import AttentionCore, CausalSelfAttention, naive_attention, attention_core
from minipar.nn.gpt import GPT, GPTConfig, Block, PRESETS, config_from_preset
from minipar.nn.llama import Llama, LlamaBlock
from minipar.nn.architectures import make_model
# the compiled versions of LayerNorm, GELU and the attention softmax: importing registers
# them with the autograd ops, CUDA for the CuPy backend and numba's for NumPy; half_gemm
# registers cuBLAS's fp16/bf16 GEMMs for CuPy (autograd cannot import kernels)
from minipar.kernels import fused_cuda, fused_cpu, half_gemm  # noqa: F401,E402

__all__ = ["Module", "Parameter", "Wrapper", "unwrap", "AttentionCore", "Linear", "Embedding", "LayerNorm", "Dropout", "MLP",
           "CausalSelfAttention", "naive_attention", "attention_core", "GPT", "GPTConfig",
           "Block", "PRESETS", "config_from_preset", "make_model", "Llama", "LlamaBlock"]
