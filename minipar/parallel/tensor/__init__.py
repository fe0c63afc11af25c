"""Tensor parallelism (Megatron-style), with sequence parallelism.

    from minipar.parallel.tensor import to_tensor_parallel
    tp_model = to_tensor_parallel(GPT(cfg, seed), grid, sequence_parallel=True)
    _, loss = tp_model(ids, targets); loss.backward()

Training builds it through ``parallel.parallelize`` (``config.tp > 1``); the one
optimizer step (``parallel/step.py``) sums the sequence-parallel partial gradients of
replicated parameters over tp and takes the global norm over every group
(``parallel/norm.py``).

Modules: regions (the f/g Functions), layers (column/row linear, vocab embedding,
converters for MLP and attention), cross_entropy (vocab-parallel), sharding (how each
parameter is cut, gathering it back), validate, model (TensorParallelGPT,
to_tensor_parallel).
"""
from minipar.parallel.tensor.cross_entropy import (VocabParallelCrossEntropy,
                                                   vocab_parallel_cross_entropy)
from minipar.parallel.tensor.layers import (ColumnParallelLinear, RowParallelLinear,
                                            SequenceParallelDropout, VocabParallelEmbedding,
                                            parallel_attention, parallel_mlp)
from minipar.parallel.tensor.model import TensorParallelGPT, to_tensor_parallel
from minipar.parallel.tensor.regions import (
    CopyToTensorParallelRegion, GatherFromSequenceRegion, ReduceFromTensorParallelRegion,
    ReduceScatterToSequenceRegion, copy_to_tp_region, gather_from_sequence_region,
    reduce_from_tp_region, reduce_scatter_to_sequence_region)
from minipar.parallel.tensor.sharding import Shard, gather_full, shard_table
from minipar.parallel.tensor.validate import check_sequence_length, check_tensor_parallel

__all__ = [
    "to_tensor_parallel", "TensorParallelGPT", "ColumnParallelLinear", "RowParallelLinear",
    "VocabParallelEmbedding", "SequenceParallelDropout", "parallel_attention", "parallel_mlp",
    "VocabParallelCrossEntropy", "vocab_parallel_cross_entropy",
    "CopyToTensorParallelRegion", "ReduceFromTensorParallelRegion", "GatherFromSequenceRegion",
    "ReduceScatterToSequenceRegion", "copy_to_tp_region", "reduce_from_tp_region",
    "gather_from_sequence_region", "reduce_scatter_to_sequence_region",
    "Shard", "gather_full", "shard_table", "check_tensor_parallel", "check_sequence_length",
]
