"""Models beyond minipar's byte vocabulary, for planning only, and the published runs.

``TrainConfig`` trains on bytes (vocab 256); planning a GPT-3-class model needs its
vocabulary (51200 in Megatron).  ``with_vocab(config, V)`` is the same config whose
``model_config()`` has ``vocab_size`` V — good for ``plan``, never for ``train``.

``KORTHIKANTI`` lists Table 5 of Korthikanti et al. 2022 ("Reducing Activation
Recomputation in Large Transformer Models"): seq 2048, vocab 51200, bf16 on A100s,
measured seconds per iteration with full recomputation, and with sequence parallelism
plus selective recomputation.
"""
from __future__ import annotations

from dataclasses import dataclass, replace
from typing import Optional

from minipar.config import TrainConfig


@dataclass(frozen=True)
class PlanConfig(TrainConfig):
    vocab_size: Optional[int] = None

    def model_config(self):
        cfg = super().model_config()
        return replace(cfg, vocab_size=self.vocab_size) if self.vocab_size else cfg


def with_vocab(config, vocab_size):
    return PlanConfig(**{**config.to_dict(), "vocab_size": vocab_size})


# name: (h, a, L, t, p, B, b, interleave, full_s, selective_s)
KORTHIKANTI = {
    "22B": (6144, 64, 48, 8, 1, 4, 4, 1, 1.42, 1.10),
    "175B": (12288, 96, 96, 8, 8, 64, 1, 3, 18.13, 13.75),
    "530B": (20480, 128, 105, 8, 35, 280, 1, 3, 49.05, 37.83),
    "1T": (25600, 160, 128, 8, 64, 512, 1, 1, 94.42, 71.49),
}


def korthikanti_config(name, recompute):
    """(the paper's layout as a resolved config, world size)."""
    h, a, L, t, p, B, b, v, _, _ = KORTHIKANTI[name]
    sp = recompute == "selective"
    base = PlanConfig(model="gpt2", n_layer=L, d_model=h, n_head=a, seq_len=2048,
                      vocab_size=51200, batch_size=B, precision="bf16", tp=t, pp=p,
                      sequence_parallel=sp, recompute=recompute, attention="naive",
                      chunks=v, schedule=("interleaved" if v > 1 else ("1f1b" if p > 1 else None)),
                      microbatches=(B // b if p > 1 else None), grad_accum=(B // b if p == 1 else 1))
    world = t * p
    return base.resolve(world), world
