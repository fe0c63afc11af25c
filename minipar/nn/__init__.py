"""Layers and the GPT model, written on minipar.autograd."""
from minipar.nn.module import Module, Parameter
from minipar.nn.layers import Linear, Embedding, LayerNorm, Dropout, MLP
from minipar.nn.attention import CausalSelfAttention, naive_attention, attention_core
from minipar.nn.gpt import GPT, GPTConfig, Block, PRESETS, config_from_preset

__all__ = ["Module", "Parameter", "Linear", "Embedding", "LayerNorm", "Dropout", "MLP",
           "CausalSelfAttention", "naive_attention", "attention_core", "GPT", "GPTConfig",
           "Block", "PRESETS", "config_from_preset"]
