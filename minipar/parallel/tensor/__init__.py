"""Tensor parallelism (Megatron-style), with sequence parallelism.

    from minipar.parallel.tensor import to_tensor_parallel, clip_tp_grad_norm
    tp_model = to_tensor_parallel(GPT(cfg, seed), grid, sequence_parallel=True)
    _, loss = tp_model(ids, targets); loss.backward()
    tp_model.reduce_replicated_grads()      # sequence parallel only; else a no-op
    clip_tp_grad_norm(tp_model, 1.0); optimizer.step()

Modules: regions (the f/g Functions), layers (column/row linear, vocab embedding,
converters for MLP and attention), cross_entropy (vocab-parallel), sharding (how each
parameter is cut, gathering it back), grads (replicated grads, global norm), validate,
model (TensorParallelGPT, to_tensor_parallel).
"""
from minipar.parallel.tensor.cross_entropy import (VocabParallelCrossEntropy,
                                                   vocab_parallel_cross_entropy)
from minipar.parallel.tensor.grads import clip_tp_grad_norm, reduce_replicated_grads, tp_grad_norm
from minipar.parallel.tensor.layers import (ColumnParallelLinear, RowParallelLinear,
                                            SequenceParallelDropout, VocabParallelEmbedding,
                                            parallel_attention, parallel_mlp)
from minipar.parallel.tensor.model import TensorParallelGPT, to_tensor_parallel
from minipar.parallel.tensor.regions import (
    CopyToTensorParallelRegion, GatherFromSequenceRegion, GatherFromTensorParallelRegion,
    ReduceFromTensorParallelRegion, ReduceScatterToSequenceRegion, ScatterToSequenceRegion,
    copy_to_tp_region, gather_from_sequence_region, gather_from_tp_region,
    reduce_from_tp_region, reduce_scatter_to_sequence_region, scatter_to_sequence_region)
from minipar.parallel.tensor.sharding import Shard, gather_full, shard_table
from minipar.parallel.tensor.validate import check_sequence_length, check_tensor_parallel

__all__ = [
    "to_tensor_parallel", "TensorParallelGPT", "ColumnParallelLinear", "RowParallelLinear",
    "VocabParallelEmbedding", "SequenceParallelDropout", "parallel_attention", "parallel_mlp",
    "VocabParallelCrossEntropy", "vocab_parallel_cross_entropy",
    "CopyToTensorParallelRegion", "ReduceFromTensorParallelRegion",
    "GatherFromTensorParallelRegion", "GatherFromSequenceRegion",
    "ReduceScatterToSequenceRegion", "ScatterToSequenceRegion", "copy_to_tp_region",
    "reduce_from_tp_region", "gather_from_tp_region", "gather_from_sequence_region",
    "reduce_scatter_to_sequence_region", "scatter_to_sequence_region",
    "tp_grad_norm", "clip_tp_grad_norm", "reduce_replicated_grads",
    "Shard", "gather_full", "shard_table", "check_tensor_parallel", "check_sequence_length",
]
