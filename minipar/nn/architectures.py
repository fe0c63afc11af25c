"""The model a config names: ``make_model(cfg)`` builds the architecture ``cfg.arch`` says.

    arch="gpt2"    GPT     (nn/gpt.py: LayerNorm, learned positions, GELU MLP)
    arch="llama"   Llama   (nn/llama.py: RMSNorm, rotary positions, SwiGLU, GQA)

Both take ``GPTConfig`` (nn/gpt.py) and keep GPT's interface.  The choice lives here,
above both files: ``Llama`` builds on ``GPT`` (the same model with another block), so
gpt.py cannot import llama.py without a cycle.
"""
from __future__ import annotations

from minipar.nn.gpt import GPT
from minipar.nn.llama import Llama


def make_model(cfg, seed=0, materialize=True):
    """The model ``cfg.arch`` names: ``GPT`` (gpt2) or ``Llama`` (llama)."""
    if cfg.arch == "llama":
        return Llama(cfg, seed, materialize)
    return GPT(cfg, seed, materialize)
