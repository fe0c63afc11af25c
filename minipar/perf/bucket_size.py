"""The gradient bucket size, chosen by the performance model for the layout at hand.

DDP and ZeRO-1/2 all-reduce (reduce-scatter) a bucket of gradients the moment backward
has filled it, so communication overlaps the rest of backward.  The size trades two
costs.  With n buckets of b bytes each over a backward of T_b seconds (``comm.
overlapped_buckets``), bucket i is ready at T_b·(i+1)/n and the link works through them
one after another:

    exposed(b) ≈ max(T_b·b/G + n·t(b) − T_b,  t(b))      n = G/b,  t(b) = α' + b·β'

(G the gradient's bytes, α', β' the all-reduce's latency and per-byte cost on the link
the data-parallel group spans).  Large buckets leave the last one, t(b), exposed — the
whole gradient when it fits one bucket, which is why a 25 MiB bucket hides nothing of a
small model's all-reduce across a slow link; small buckets pay α' n times and leave the
link idle between them.  PyTorch's DDP caps its first bucket at 1 MiB for this reason
and keeps 25 MiB for the rest, whatever the link.

Here the step-time model itself (``estimate.predict``, with the profile's α, β, its
measured collective curves and the model's backward time) prices every candidate size
(``estimate.choose_bucket_mb``) and the fastest is kept; among sizes within ``TIE`` of
the fastest, the largest (fewest messages, least sensitive to the α the model
underestimates): ``fastest_bucket_mb``.  The pricing loop lives with ``predict``, since
``predict`` itself chooses the size, as a run does, where the config leaves it open.  Nothing is measured: the
choice depends only on the configuration, the profile (``$MINIPAR_PROFILE`` or the shipped
one) and how many ranks share a node, so it is the same on every rank and on a loaded
machine as on an idle one; the trainer still takes rank 0's answer (one broadcast) and
records it in the log's header and the checkpoint (``bucket_mb`` of the run's config).
"""
from __future__ import annotations

from minipar.parallel.buckets import DEFAULT_BUCKET_MB

CANDIDATES_MB = (0.25, 0.5, 1.0, 2.0, 4.0, 8.0, 16.0, DEFAULT_BUCKET_MB)
TIE = 0.005                       # step times this close count as equal


def fastest_bucket_mb(steps):
    """The bucket size to run with, from ``steps`` = {size in MiB: predicted step seconds}:
    the largest within ``TIE`` of the fastest."""
    best = min(steps.values())
    return max(mb for mb, s in steps.items() if s <= best * (1 + TIE))
