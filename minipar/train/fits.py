"""Does the run fit?  The memory model's peak per rank against what a rank may use,
before anything is allocated and before the first message between ranks.

    predicted peak = runtime + data
                     + max(construction, state + activations + buffers + workspace)

    runtime        what this process holds once the code of the run is loaded: the
                   interpreter, NumPy, MPI, minipar and numba's compiled loops (measured
                   now, its resident size; on GPU none of it is on the device)
    data           the corpus, held twice while it is loaded (files read, then joined)
    construction   a rank draws its weights one full tensor at a time (float64, from
                   (seed, name): nn/init.py) and keeps only its part, which is already
                   state: the largest tensor drawn and its cut piece
    state          weights, gradients, AdamW's m and v, fp32 masters (perf/memory.py, exact)
                   and the weight-decay mask beside m (perf/estimate.decay_mask_bytes)
    activations    what the autograd graph holds at the peak, with the chosen recomputation
                   and attention, and the micro-batches in flight (perf/activations.py)
    buffers        the flat buffers gradient communication packs (perf/memory.py)
    workspace      what the autograd graph does not hold but NumPy allocates while an op
                   runs: a backward's input gradient and its temporaries, taken as
                   WORKSPACE_ARRAYS of the step's largest array (attention's b·a·s² scores,
                   the MLP's b·s·4h, the logits' b·s·V)

The limit is ``resources.rank_memory_limit()`` (the GPU's free memory; on CPU the RAM
shared by the ranks of the node), or ``mem_per_rank`` GiB when the run sets it.  A run
over the limit is refused with both numbers and the single changes (recomputation,
flash attention, a ZeRO stage) the same model says would make it fit.
"""
from __future__ import annotations

from dataclasses import dataclass, replace

from minipar import backend
from minipar.config import ConfigError
from minipar.perf.estimate import (compute_dtype, decay_mask_bytes, memory_per_rank, micro_rows,
                                   rank_memory)
from minipar.perf.memory import param_sizes
from minipar.perf.profile import DTYPE_BYTES
from minipar.observe.procmem import peak_rss_bytes, rss_bytes
from minipar.observe.resources import rank_memory_limit


# Measured on this repository's CPU runs (tiny model, naive attention, fp32; peak RSS minus
# the rest of the estimate): 3.4x the scores array at seq 256 (16 MiB), 2.7x at 512 (64 MiB),
# 2.4x at 1024 (128 MiB).  Three covers them; the rest of the estimate is exact accounting.
WORKSPACE_ARRAYS = 3


@dataclass
class PeakEstimate:
    runtime: int
    data: int
    construction: int
    state: int
    activations: int
    buffers: int
    workspace: int

    @property
    def total(self):
        training = self.state + self.activations + self.buffers + self.workspace
        return self.runtime + self.data + max(self.construction, training)


def size(n):
    """Bytes as a person reads them, three digits: 23.5 GiB, 1.08 GiB, 736 MiB."""
    for unit, k in (("TiB", 2 ** 40), ("GiB", 2 ** 30), ("MiB", 2 ** 20), ("KiB", 2 ** 10)):
        if n >= k or unit == "KiB":
            v = n / k
            return f"{v:.0f} {unit}" if v >= 100 else f"{v:.{1 if v >= 10 else 2}f} {unit}"


def largest_array_bytes(config):
    """Bytes of the largest array one step makes on a rank: attention's scores (naive:
    b·(a/t)·(s/c)² per ring step under cp), the MLP's hidden b·(s/c)·4h/t, the logits
    b·(s/c)·V/t (t: tp, c: cp; b: rows of a micro-batch)."""
    cfg, (b, _) = config.model_config(), micro_rows(config)
    s, t = cfg.seq_len // config.cp, config.tp
    scores = b * (cfg.n_head // t) * s * s if config.attention == "naive" else 0
    hidden = b * s * 4 * cfg.d_model // t
    logits = b * s * -(-cfg.padded_vocab_size // t)
    return max(scores, hidden, logits) * DTYPE_BYTES[compute_dtype(config.precision)]


def runtime_bytes():
    """This process's resident size with the run's code loaded (0 on GPU: not device memory)."""
    if backend.backend_name() != "numpy":
        return 0
    import minipar.comm  # noqa: F401  (MPI)
    try:
        import minipar.kernels.cpu_loops  # noqa: F401  (numba and its compiled loops: ~60 MiB)
    except ImportError:                   # no numba: the run uses NumPy's own loops
        pass
    return rss_bytes() or peak_rss_bytes()      # no /proc: the peak so far, an upper bound


def predicted_peak(config, runtime=None, data=None, coords=None):
    """The PeakEstimate of a *resolved* TrainConfig on its fullest rank, or on the rank
    at (dp, tp, pp) ``coords`` (``runtime`` and ``data`` bytes: measured here unless
    given).  The one model of a process's peak: the memory check before a run, the
    run's summary (per rank, with the runtime floor it measured) and
    ``benchmarks/memory_scaling.py`` all use it."""
    from minipar.data import corpus_bytes
    if runtime is None:
        runtime = runtime_bytes()
    if data is None:
        data = 2 * corpus_bytes(config.data) if backend.backend_name() == "numpy" else 0
    _, state, activations, buffers = (memory_per_rank(config) if coords is None
                                      else rank_memory(config, coords))
    largest = max(k for _, k in param_sizes(config.model_config()))
    construction = 2 * largest * DTYPE_BYTES["fp64"]
    state_bytes = sum(state.values()) + decay_mask_bytes(config, state)
    return PeakEstimate(int(runtime), int(data), int(construction), int(state_bytes),
                        int(activations), int(buffers),
                        WORKSPACE_ARRAYS * largest_array_bytes(config))


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
    data_ranks, experts = config.dp * config.cp, config.model_config().moe_experts
    for ep in range(config.ep + 1, data_ranks + 1):     # split the experts over more ranks
        if experts and data_ranks % ep == 0 and experts % ep == 0:
            alt.append((f"`ep` {ep}", dict(ep=ep)))
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
    room = limit - peak.runtime - peak.data         # what is left for the model itself
    if room <= 0:
        fix = "the runtime and the corpus alone take more than that"
    else:
        fixes = fitting_changes(config, limit, peak.runtime, peak.data)
        fix = ("it would fit with " + " or ".join(fixes[:3]) if fixes else
               "no single change of `recompute`, `attention`, `zero` or `ep` makes it fit")
        fix += (f"; more ranks cut it too (`minipar plan --ranks N --mem-per-rank "
                f"{room / 2 ** 30:.3g}` ranks the layouts whose model fits the rest)")
    raise ConfigError(
        f"the memory model predicts a peak of {size(peak.total)} per rank (model state "
        f"{size(peak.state)}, activations {size(peak.activations)}, buffers "
        f"{size(peak.buffers)}, workspace {size(peak.workspace)}, data {size(peak.data)}, "
        f"runtime {size(peak.runtime)}) but a rank may use {size(limit)} ({where}); {fix}; "
        f"`mem_per_rank` GiB sets the limit, `skip_memory_check` runs anyway")
