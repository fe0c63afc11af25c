"""Tensor parallelism of the llama block (``nn/llama.py``), on t ranks.

    x ─ TensorParallelInput (f, or the all-gather of the sequence: one for q, k, v) ─┐
      q_proj, k_proj, v_proj column-parallel ─ rope ─ attention of my heads ─ o_proj row-parallel ─g─>
    x ─ TensorParallelInput (one for gate and up) ─ gate_proj, up_proj column-parallel
      ─ silu(gate) ∘ up ─ down_proj row-parallel ─g─>

SwiGLU: gate and up are cut by the same column bounds (``chunk_bounds(d_ff, t)``), so
rank r's gate features meet exactly its up features in silu(gate) ∘ up, elementwise,
with no message; down is row-parallel over the same features.  RMSNorm gains are
replicated (with sequence parallelism their partial gradients are summed over tp like
LayerNorm's, in the optimizer step: ``parallel/step.py``).  RoPE needs nothing: each
rank rotates its own heads at the sequence's positions.

Grouped-query attention: rank r computes query heads r·H/t … (r+1)·H/t − 1, and query
head h reads key/value head h // (H/Hkv).

- Hkv divisible by t: k_proj and v_proj are cut by columns like q_proj: rank r holds
  KV heads r·Hkv/t …, exactly those its query heads read.
- t > Hkv (t divisible by Hkv): a KV head serves the query heads of t/Hkv ranks, so
  each of those ranks holds a copy of its columns (``Shard(replicas=t/Hkv)``: rank r
  holds KV head r // (t/Hkv)).  Each copy's gradient is only its rank's share,
  dW = xᵀ·dk_r (the rank's query heads' part of dk), so the copies' gradients are
  summed over the t/Hkv ranks that share the head, in backward, by an all-reduce on
  a sub-communicator of the tp group (Megatron's f, ``copy_to_tp_region``, applied to the
  weight before its use: identity forward, all-reduce backward; its gradient arrives summed, identical on the replicas, and the input gradient
  dx = dk_r·Wᵀ stays each rank's own share, summed by f as usual).  In the gradient
  norm each copy counts 1/(t/Hkv) (``Placement.norm_weight``); checkpoints read one
  copy (``Shard.join``).  (picotron, nanotron and torchtitan refuse t > Hkv instead.)
  Under ZeRO-3 the identity's output keeps the gathered k/v weights alive from forward
  to backward (the values are the same; 2·h·d per layer of memory is not freed early).
"""
from __future__ import annotations

from minipar.autograd import ops
from minipar.parallel.tensor.layers import (ColumnParallelLinear, RowParallelLinear,
                                            SequenceParallelDropout, TensorParallelInput)
from minipar.parallel.tensor.regions import copy_to_tp_region


class ReplicatedColumnLinear(ColumnParallelLinear):
    """A column-parallel layer whose parts live on ``replicas`` ranks each; the copies'
    gradients are summed over ``replica_comm`` (the ranks sharing my part)."""

    def __init__(self, *args, replica_comm=None, **kwargs):
        super().__init__(*args, **kwargs)
        self.replica_comm = replica_comm

    @classmethod
    def from_linear(cls, linear, comm, sequence_parallel=False, replicas=1, replica_comm=None):
        layer = super().from_linear(linear, comm, sequence_parallel, replicas=replicas,
                                    entered=True)
        layer.replica_comm = replica_comm
        return layer

    def forward(self, x):
        return ops.linear(x, copy_to_tp_region(self.weight, self.replica_comm))


def kv_replicas(n_kv_head, tp):
    """Ranks holding each key/value head: 1 when tp divides n_kv_head, else tp/n_kv_head."""
    return 1 if n_kv_head % tp == 0 else tp // n_kv_head


def replica_comm(comm, replicas):
    """Collective over ``comm``: the sub-communicator of the ranks sharing my KV head."""
    return comm.split(comm.rank // replicas, key=comm.rank) if replicas > 1 else None


def parallel_llama_attention(attn, comm, sequence_parallel=False, replicas_comm=None):
    """Swap a GroupedQueryAttention's layers, in place (see the module docstring)."""
    t, sp = comm.size, sequence_parallel
    replicas = kv_replicas(attn.n_kv_head, t)
    attn.enter = TensorParallelInput(comm, sp)
    attn.q_proj = ColumnParallelLinear.from_linear(attn.q_proj, comm, sp, entered=True)
    if replicas == 1:
        attn.k_proj = ColumnParallelLinear.from_linear(attn.k_proj, comm, sp, entered=True)
        attn.v_proj = ColumnParallelLinear.from_linear(attn.v_proj, comm, sp, entered=True)
    else:
        attn.k_proj = ReplicatedColumnLinear.from_linear(attn.k_proj, comm, sp, replicas, replicas_comm)
        attn.v_proj = ReplicatedColumnLinear.from_linear(attn.v_proj, comm, sp, replicas, replicas_comm)
    attn.o_proj = RowParallelLinear.from_linear(attn.o_proj, comm, sp)
    attn.n_head //= t
    attn.n_kv_head = max(attn.n_kv_head // t, 1)
    if sp:
        attn.drop = SequenceParallelDropout.from_dropout(attn.drop, comm)
    return attn


def parallel_swiglu(mlp, comm, sequence_parallel=False):
    """gate and up column-parallel with the same bounds, down row-parallel; in place."""
    sp = sequence_parallel
    mlp.enter = TensorParallelInput(comm, sp)
    mlp.gate_proj = ColumnParallelLinear.from_linear(mlp.gate_proj, comm, sp, entered=True)
    mlp.up_proj = ColumnParallelLinear.from_linear(mlp.up_proj, comm, sp, entered=True)
    mlp.down_proj = RowParallelLinear.from_linear(mlp.down_proj, comm, sp)
    if sp:
        mlp.drop = SequenceParallelDropout.from_dropout(mlp.drop, comm)
    return mlp


def parallel_moe(moe, comm, sequence_parallel=False):
    """A MoE MLP under tensor parallelism with sequence parallelism (as Megatron requires
    for experts): each tp rank routes its own positions of the sequence through the
    router and the routed experts, both whole on every tp rank (replicated weights under
    sequence parallelism: their gradients are this rank's positions' part, summed over
    tp by the step); the shared experts, which see every token, are split as the dense
    SwiGLU is.  The per-sequence statistics gather over the tp ranks
    (``parallel/moe_split.py``).  Without sequence parallelism (training refuses it:
    ``config/rules.py``; the memory model cuts shapes this way) every tp rank would route
    the whole sequence, redundantly."""
    for expert in moe.shared:
        parallel_swiglu(expert, comm, sequence_parallel)
    return moe
