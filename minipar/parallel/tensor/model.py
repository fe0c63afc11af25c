"""A GPT (or Llama: ``tensor/llama.py``) in tensor-parallel form, made by slicing the
plain model of the same seed.

    tp_model = to_tensor_parallel(GPT(cfg, seed), grid, sequence_parallel=True)
    logits_r, loss = tp_model(ids, targets)    # my vocabulary shard, the full-model loss

Every rank builds the plain GPT (same seed, so the same weights) — or, in training, the
plain GPT's placeholders, which are cut here and drawn afterwards slice by slice
(``nn/init.py``, ``parallel/placement.py``) — then keeps its slices:
wte by vocabulary rows, qkv/fc by columns, attention proj/MLP proj by rows, lm_head by
vocabulary columns; LayerNorms, row biases and wpe stay replicated.  Parameter names are
the plain GPT's (``blocks.0.attn.qkv.weight`` …) with local shapes, so an optimizer keyed
by name works unchanged and a checkpoint's pieces are placed by name and slice
(``parallel/placement.py``).

Data flow (t ranks; "seq" = sequence parallel, tokens split s/t per rank):

    ids ─ VocabParallelEmbedding ─g─> + wpe ─ dropout ─ blocks ─ ln_f ─f─> lm_head (V/t cols)
                                 (seq: reduce-scatter; wpe rows and dropout masks of my tokens)
    loss = vocab_parallel_cross_entropy(logits_r)   (never gathers the V logits)
"""
from __future__ import annotations

import copy
from collections import OrderedDict


from minipar.backend import to_device, to_host
from minipar.autograd import ops
from minipar.comm import chunk_bounds
from minipar.nn.gpt import GPT
from minipar.nn.init import is_unmade
from minipar.nn.module import Module
from minipar.nn.moe import MoE, add_balancing_losses
from minipar.parallel.tensor.cross_entropy import vocab_parallel_cross_entropy
from minipar.parallel.tensor.layers import (ColumnParallelLinear, SequenceParallelDropout,
                                            VocabParallelEmbedding, parallel_attention,
                                            parallel_mlp)
from minipar.parallel.tensor.llama import (kv_replicas, parallel_llama_attention, parallel_moe,
                                           parallel_swiglu, replica_comm)
from minipar.parallel.tensor.regions import copy_to_tp_region, gather_from_sequence_region
from minipar.parallel.tensor.sharding import gather_full, shard_table
from minipar.parallel.tensor.validate import check_sequence_length, check_tensor_parallel


def _tp_comm(grid_or_comm):
    return getattr(grid_or_comm, "tp_comm", grid_or_comm)


class TensorParallelGPT(Module):
    """The tensor-parallel GPT; build it with :func:`to_tensor_parallel`."""

    def __init__(self, model, comm, sequence_parallel=False):
        cfg = model.config
        check_tensor_parallel(cfg, comm.size, sequence_parallel)   # before any message
        sp = bool(sequence_parallel)
        full_shapes = OrderedDict((n, tuple(p.shape)) for n, p in model.named_parameters())
        flops = model.flops_per_token()
        if not is_unmade(model):
            model = copy.deepcopy(model)      # the caller's model stays untouched
        # (a model of placeholders is used up instead: copying them would allocate them)
        self.wte = VocabParallelEmbedding.from_embedding(model.wte, comm, sp)
        self.wpe = model.wpe                       # None for llama (rotary positions)
        self.rope = getattr(model, "rope", None)   # llama: shared by its attention layers
        self.drop = SequenceParallelDropout.from_dropout(model.drop, comm) if sp else model.drop
        if cfg.arch == "llama":
            replicas = kv_replicas(cfg.kv_heads, comm.size)
            kv_comm = replica_comm(comm, replicas)       # collective, after every check
            for block in model.blocks:
                parallel_llama_attention(block.attn, comm, sp, kv_comm)
                if isinstance(block.mlp, MoE):
                    parallel_moe(block.mlp, comm, sp)
                else:
                    parallel_swiglu(block.mlp, comm, sp)
        else:
            for block in model.blocks:
                parallel_attention(block.attn, comm, sp)
                parallel_mlp(block.mlp, comm, sp)
        self.blocks = model.blocks
        self.ln_f = model.ln_f
        self.lm_head = None if model.lm_head is None else \
            ColumnParallelLinear.from_linear(model.lm_head, comm, sp)
        self.config, self.comm, self.sequence_parallel = cfg, comm, sp
        self.dropout_rng = model.dropout_rng
        self.vocab_bounds = chunk_bounds(cfg.padded_vocab_size, comm.size)   # padding: the last ranks
        self.full_shapes = full_shapes
        self.shard_specs = shard_table(self)   # tied head: reuses wte's vocabulary slice
        self._flops_per_token = flops

    # ------------------------------------------------------------------ forward
    def embed(self, ids):
        ids = ops.raw(ids)
        n = ids.shape[-1]
        if n > self.config.seq_len:
            raise ValueError(f"sequence of {n} tokens is longer than seq_len {self.config.seq_len}")
        positions = GPT.positions(self, n)      # 0..n-1, or this cp rank's positions
        if self.sequence_parallel:
            check_sequence_length(n, self.comm.size)
            b = chunk_bounds(n, self.comm.size)
            positions = positions[b[self.comm.rank]:b[self.comm.rank + 1]]
        if self.wpe is None:                    # llama: positions enter through RoPE
            return self.drop(self.wte(ids))
        return self.drop(self.wte(ids) + self.wpe(to_device(positions)))

    def head(self, x):
        """Logits of my vocabulary slice, (B, N, V_r), for every token."""
        x = self.ln_f(x)
        if self.lm_head is not None:
            return self.lm_head(x)
        if self.sequence_parallel:
            x = gather_from_sequence_region(x, self.comm)
        else:
            x = copy_to_tp_region(x, self.comm)
        return ops.linear(x, ops.transpose(self.wte.weight))

    def loss(self, logits, targets):
        """The full-model mean cross-entropy from my vocabulary shard of the logits (the
        same value on every tp rank, equal to the single-process loss), plus the MoE
        layers' balancing losses as the plain model adds them."""
        start = self.vocab_bounds[self.comm.rank]
        return add_balancing_losses(self, vocab_parallel_cross_entropy(
            logits, targets, self.comm, start, vocab_size=self.config.vocab_size))

    # embed -> blocks -> head -> loss, exactly as the plain model (logits: my shard)
    forward = GPT.forward
    token_positions = GPT.token_positions    # cp's positions, handed on to the rope
    _token_positions = None

    # ------------------------------------------------------------------ training helpers
    def flops_per_token(self):
        """Of the whole model (as the plain GPT), not of this rank's slice."""
        return self._flops_per_token

    # ------------------------------------------------------------------ checkpoints
    def gather_full_arrays(self, arrays):
        """Collective: {name: local array} -> {name: full host array}, for parameters or
        per-parameter optimizer state (AdamW's m, v).  Every rank gets the result."""
        out = OrderedDict()
        for name, local in arrays.items():
            spec = self.shard_specs.get(name)
            full = local if spec is None else gather_full(self.comm, spec, to_device(local),
                                                          self.full_shapes[name])
            out[name] = to_host(full).copy()
        return out


def to_tensor_parallel(model, grid_or_tp_comm, sequence_parallel=False):
    """The tensor-parallel form of a plain ``GPT`` over a ProcessGrid's ``tp_comm`` (or a
    Communicator): same initialisation, sliced.  The plain model is copied, not changed.
    Raises ValueError (what to change) for layouts that cannot work, before any message."""
    return TensorParallelGPT(model, _tp_comm(grid_or_tp_comm), sequence_parallel)
