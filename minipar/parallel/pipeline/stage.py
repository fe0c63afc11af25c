"""Cutting a GPT into pipeline stages.

With ``pp`` ranks and ``chunks`` model chunks per rank there are S = pp·chunks
virtual stages; stage s = chunk·pp + rank (Megatron's interleaved layout, see
``schedules.py``).  The blocks are dealt out evenly, L/S per stage; the first
stage also embeds the tokens, the last also applies the final LayerNorm, the
head and the loss.  Every rank builds the same plain model — in training, as
placeholders with no memory (``nn/init.py``) — and keeps only its stages (the other
blocks are dropped); its own weights are drawn afterwards from (seed, name), so they
equal the single-process model's.
"""
from __future__ import annotations

from minipar.nn.module import Module


def check_partition(n_layer, pp, chunks):
    stages = pp * chunks
    if n_layer % stages:
        raise ValueError(f"`n_layer` {n_layer} is not divisible by pp·chunks = {pp}·{chunks}; "
                         f"choose a layer count that is a multiple of {stages}")


class Stage(Module):
    """Virtual stage ``s`` of ``S``: (embed?) → its blocks → (head?)."""

    def __init__(self, model, s, S):
        per = model.config.n_layer // S
        self.index, self.is_first, self.is_last = s, s == 0, s == S - 1
        self.model = model
        self.block_ids = list(range(s * per, (s + 1) * per))

    def forward(self, x):
        m = self.model
        if self.is_first:
            x = m.embed(x)
        for i in self.block_ids:
            x = m.blocks[i](x)
        return m.head(x) if self.is_last else x

    def named_parameters(self, prefix=""):
        """This stage's parameters, under their names in the full model."""
        m = self.model
        if self.is_first:
            yield from m.wte.named_parameters("wte.")
            if m.wpe is not None:              # llama: no table of positions
                yield from m.wpe.named_parameters("wpe.")
        for i in self.block_ids:
            yield from m.blocks[i].named_parameters(f"blocks.{i}.")
        if self.is_last:
            yield from m.ln_f.named_parameters("ln_f.")
            if m.lm_head is not None:
                yield from m.lm_head.named_parameters("lm_head.")


class RankStages(Module):
    """The chunks one rank holds, as one Module for the optimizer and checkpoints."""

    def __init__(self, model, rank, pp, chunks):
        check_partition(model.config.n_layer, pp, chunks)
        if model.config.tie_weights and pp * chunks > 1:
            raise ValueError("`tie_weights` with `pp` > 1 is not supported: the tied embedding "
                             "would live on the first and last stage; drop `tie_weights`")
        S = pp * chunks
        self.config = model.config
        self._flops_per_token = model.flops_per_token()     # of the whole model
        self.stages = [Stage(model, c * pp + rank, S) for c in range(chunks)]
        _drop_other_stages(model, self.stages)

    def named_parameters(self, prefix=""):
        for stage in self.stages:
            yield from stage.named_parameters()

    def flops_per_token(self):
        return self._flops_per_token


def _drop_other_stages(model, stages):
    """Free the weights of the blocks (and embeddings, head) other ranks hold: a stage
    keeps only its own, so a pipeline of p ranks holds ~1/p of the model each."""
    mine = {i for st in stages for i in st.block_ids}
    for i in range(len(model.blocks)):
        if i not in mine:
            model.blocks[i] = None
    if not any(st.is_first for st in stages):
        model.wte = model.wpe = None
    if not any(st.is_last for st in stages):
        model.ln_f = model.lm_head = None
