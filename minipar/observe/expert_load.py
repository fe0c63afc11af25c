"""The expert load of a mixture-of-experts run, per step and per MoE layer, for the log.

Each rank counts what its own tokens routed in the step (``nn/moe.StepLoad``: every
micro-batch once).  The ranks that hold different tokens — data and context parallel
ranks, and tensor-parallel ones under sequence parallelism, where each routes its own
positions — each count their share; pipeline stages hold different layers, and a rank
puts zeros for the layers it does not hold.  So the sum over all ranks counts every
assignment of the global batch once.  (Tensor parallelism without sequence parallelism
routes the same tokens on every tp rank: only tp rank 0 counts.)

The sum rides the monitor's one gather of step timings (``monitor.py``): this rank's
numbers are appended to its vector, L·(E + 3) more floats, and rank 0 adds the rows.  No
collective is added, and a dense model appends nothing.

The step record's ``experts``, one entry per MoE layer in block order:

    block          the block's index
    received       (E,) assignments each expert took this step (after capacity drops)
    dropped_share  dropped / (k · tokens of the step)
    load_max_mean  max_e received_e / mean_e received_e: 1 is perfect balance, E is
                   every assignment on one expert
    balance_loss   the layer's aux loss (coef included), mean over the step's sequences;
                   null without ``--moe-balance aux``

so Σ_e received_e + dropped = k · tokens of the step.
"""
from __future__ import annotations

import numpy as np

from minipar.backend import to_host

FIELDS_AFTER_RECEIVED = 3     # dropped, aux_sum, sequences


class ExpertLoadLog:
    """This rank's part of the expert-load vector, and the log fields from everyone's.
    ``blocks``: every MoE block of the model (all ranks agree on them); ``local``:
    {block: MoE} of the ones this rank holds; ``counts_own_tokens``: False on a rank
    that routes tokens another rank also counts (tp without sequence parallelism)."""

    def __init__(self, blocks, n_experts, top_k, balance, local, counts_own_tokens=True):
        self.blocks, self.n_experts, self.top_k = list(blocks), n_experts, top_k
        self.has_aux = balance == "aux"
        self.local, self.counts_own_tokens = local, counts_own_tokens

    @classmethod
    def of(cls, module, cfg, counts_own_tokens=True):
        """The log of ``module``'s MoE layers (model config ``cfg``), or None if dense."""
        if not cfg.moe_experts:
            return None
        from minipar.nn.moe import moe_layers
        local = {int(name.split(".")[1]): moe for name, moe in moe_layers(module)}
        blocks = [i for i in range(cfg.n_layer) if cfg.is_moe_block(i)]
        return cls(blocks, cfg.moe_experts, cfg.moe_top_k, cfg.moe_balance, local,
                   counts_own_tokens)

    @property
    def width(self):
        return self.n_experts + FIELDS_AFTER_RECEIVED

    def vector(self):
        """This rank's counts of the step, L·(E + 3) floats: per block, received (E),
        dropped, aux_sum, sequences (zeros for a block held elsewhere)."""
        out = np.zeros((len(self.blocks), self.width))
        if not self.counts_own_tokens:
            return out.reshape(-1).tolist()
        for row, block in enumerate(self.blocks):
            moe = self.local.get(block)
            if moe is None:
                continue
            load = moe.step_load
            out[row, :self.n_experts] = to_host(load.received)
            out[row, self.n_experts:] = (load.dropped, float(to_host(load.aux_sum)),
                                         load.sequences)
        return out.reshape(-1).tolist()

    def fields(self, rows):
        """The step record's ``experts`` from every rank's ``vector`` (rows, one per rank)."""
        total = np.asarray(rows).sum(axis=0).reshape(len(self.blocks), self.width)
        entries = []
        for block, counts in zip(self.blocks, total):
            received = counts[:self.n_experts]
            dropped, aux_sum, sequences = counts[self.n_experts:]
            assignments = received.sum() + dropped
            mean = received.mean()
            entries.append({
                "block": block, "received": [int(round(v)) for v in received],
                "dropped_share": float(dropped / assignments) if assignments else 0.0,
                "load_max_mean": float(received.max() / mean) if mean > 0 else None,
                "balance_loss": float(aux_sum / sequences) if self.has_aux and sequences else None,
            })
        return entries
