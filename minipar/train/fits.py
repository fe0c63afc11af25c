"""Does the run fit?  The memory model's peak per rank against what a rank may use,
before anything is allocated and before the first message between ranks.

    predicted peak = runtime + data + max(construction, state + activations + buffers)

    runtime        what this process holds once the code of the run is loaded: the
                   interpreter, NumPy, MPI, minipar and numba's compiled loops (measured
                   now, its resident size; on GPU none of it is on the device)
    data           the corpus, held twice while it is loaded (files read, then joined)
    construction   every rank first builds the whole plain model, then ``parallelize``
                   cuts its share out (tensor slices, pipeline stages)
    state          weights, gradients, AdamW's m and v, fp32 masters (perf/memory.py, exact)
    activations    what the autograd graph holds at the peak, with the chosen recomputation
                   and attention, and the micro-batches in flight (perf/activations.py)
    buffers        the flat buffers gradient communication packs (perf/memory.py)

The limit is ``resources.rank_memory_limit()`` (the GPU's free memory; on CPU the RAM
shared by the ranks of the node), or ``mem_per_rank`` GiB when the run sets it.  A run
over the limit is refused with both numbers and the single changes (recomputation,
flash attention, a ZeRO stage) the same model says would make it fit.
"""
from __future__ import annotations

from dataclasses import dataclass, replace

from minipar import backend
from minipar.config import ConfigError
from minipar.perf.estimate import compute_dtype, memory_per_rank
from minipar.perf.memory import numel
from minipar.perf.profile import DTYPE_BYTES
from minipar.resources import process_rss_bytes, rank_memory_limit


@dataclass
class PeakEstimate:
    runtime: int
    data: int
    construction: int
    state: int
    activations: int
    buffers: int

    @property
    def total(self):
        training = self.state + self.activations + self.buffers
        return self.runtime + self.data + max(self.construction, training)


def size(n):
    """Bytes as a person reads them: 23.5 GiB, 101.2 MiB."""
    for unit, k in (("TiB", 2 ** 40), ("GiB", 2 ** 30), ("MiB", 2 ** 20)):
        if n >= k:
            return f"{n / k:.1f} {unit}"
    return f"{n / 2 ** 10:.1f} KiB"


def runtime_bytes():
    """This process's resident size with the run's code loaded (0 on GPU: not device memory)."""
    if backend.backend_name() != "numpy":
        return 0
    import minipar.comm  # noqa: F401  (MPI)
    try:
        import minipar.kernels.cpu_loops  # noqa: F401  (numba and its compiled loops: ~60 MiB)
    except ImportError:                   # no numba: the run uses NumPy's own loops
        pass
    return process_rss_bytes()


def predicted_peak(config, runtime=None, data=None):
    """The PeakEstimate of a *resolved* TrainConfig on its fullest rank (``runtime`` and
    ``data`` bytes: measured here unless given)."""
    from minipar.data import corpus_bytes
    if runtime is None:
        runtime = runtime_bytes()
    if data is None:
        data = 2 * corpus_bytes(config.data) if backend.backend_name() == "numpy" else 0
    _, state, activations, buffers = memory_per_rank(config)
    built = "fp32" if config.precision in ("fp16", "bf16") else compute_dtype(config.precision)
    construction = numel(config.model_config()) * DTYPE_BYTES[built]
    return PeakEstimate(int(runtime), int(data), int(construction), int(sum(state.values())),
                        int(activations), int(buffers))


def _alternatives(config):
    """Single changes that cut memory, as (flags, changes) — each still checked by resolve."""
    alt = []
    if config.attention == "naive":
        alt.append(("`attention` flash", dict(attention="flash")))
    for kind in ("selective", "full"):
        if config.recompute in ("none", "selective") and kind != config.recompute:
            alt.append((f"`recompute` {kind}", dict(recompute=kind)))
    if config.dp > 1:
        for stage in range(config.zero + 1, 4):
            alt.append((f"`zero` {stage}", dict(zero=stage, bucket_mb=None if stage == 3
                                               else config.bucket_mb)))
    if config.attention == "naive" and config.recompute != "full":
        alt.append(("`attention` flash `recompute` full",
                    dict(attention="flash", recompute="full")))
    return alt


def fitting_changes(config, limit, runtime, data):
    """["`flag` value (peak)", ...]: the alternatives predicted to fit in ``limit``."""
    out = []
    for flags, changes in _alternatives(config):
        try:
            other = replace(config, **changes).resolve(config.world_size)
        except ConfigError:
            continue
        peak = predicted_peak(other, runtime, data).total
        if peak <= limit:
            out.append(f"{flags} ({size(peak)})")
    return out


def check_fits(config):
    """Raise ConfigError when the predicted peak per rank exceeds what a rank may use;
    returns (PeakEstimate, limit bytes, where the limit comes from) otherwise."""
    if config.mem_per_rank is not None:
        limit, where = int(config.mem_per_rank * 2 ** 30), "`mem_per_rank`"
    else:
        limit, where = rank_memory_limit()
    peak = predicted_peak(config)
    if config.skip_memory_check or not limit or peak.total <= limit:
        return peak, limit, where
    fixes = fitting_changes(config, limit, peak.runtime, peak.data)
    fix = ("it would fit with " + " or ".join(fixes[:3]) if fixes else
           "no single change of `recompute`, `attention` or `zero` makes it fit")
    raise ConfigError(
        f"the memory model predicts a peak of {size(peak.total)} per rank (model state "
        f"{size(peak.state)}, activations {size(peak.activations)}, buffers {size(peak.buffers)}, "
        f"data {size(peak.data)}, runtime {size(peak.runtime)}) but a rank may use {size(limit)} ({where}); {fix}; "
        f"more ranks cut it too (`minipar plan --ranks N --mem-per-rank {limit / 2 ** 30:.1f}` "
        f"ranks the layouts that fit); `mem_per_rank` GiB sets the limit, "
        f"`skip_memory_check` runs anyway")
