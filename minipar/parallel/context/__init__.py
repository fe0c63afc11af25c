"""Context parallelism: the sequence itself split over the C ranks of a cp group.

Everything in a transformer but attention works token by token, so with S/C positions
per rank the embeddings, LayerNorms, MLPs and the loss need no communication, and their
activations shrink by C.  Attention needs every earlier key: **ring attention** passes
the K/V blocks round the ring (rank r -> r+1), C - 1 hops, while each rank attends its
queries to the block it holds and merges the partial results with the online-softmax
rule (``ring.py``); backward sends the blocks round again, with their dK/dV
accumulators, so every key's gradient arrives back at its owner.

The causal mask makes a plain split unfair: the rank holding the last S/C positions
attends to everything, the first to one block only (C× less work).  The **zig-zag**
split (``split.py``) cuts the sequence into 2C chunks and gives rank r chunks r and
2C-1-r: an early and a late one, the same work on every rank.

The loss of a rank is the mean over its positions, so the gradients of the global-batch
loss are the mean over dp × cp of the ranks' gradients: data and context parallelism
synchronise as one group (``grid.dp_cp_comm``).

The second family, **Ulysses** (``ulysses.py``), moves the layout instead of the keys:
an all-to-all turns "my positions, all heads" into "all positions, my heads" around
attention; its degree is capped by the heads.  The hybrid runs Ulysses inside groups
of U ranks and the ring across the cp/U groups (``--cp-kind ulysses --cp-ulysses U``).
"""
from minipar.parallel.context.split import chunks_of, check_context_parallel, positions_of
from minipar.parallel.context.ring import RingAttention, RingAttentionCore
from minipar.parallel.context.apply import apply_context_parallel
from minipar.parallel.context.ulysses import (UlyssesAttentionCore, check_ulysses, ulysses_groups,
                                              ulysses_positions)

__all__ = ["chunks_of", "positions_of", "check_context_parallel", "RingAttention",
           "RingAttentionCore", "apply_context_parallel", "UlyssesAttentionCore", "check_ulysses",
           "ulysses_groups", "ulysses_positions"]
