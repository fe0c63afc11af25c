"""What the process holds: its peak resident memory, and on CuPy the pool and the device.

``backend.memory`` counts the arrays autograd tracks during a step.  The process holds
more: the interpreter and its libraries (the runtime floor, ~0.2 GB), MPI's buffers,
the model while it is built, a checkpoint while it is written, the allocator's free
lists, temporaries nobody tracked.  What decides an out-of-memory kill is the operating
system's count, so a run reports it beside the tracked arrays:

    VmHWM in /proc/self/status   peak resident set size since start, or since a reset
    ru_maxrss of getrusage       the same peak, never reset (off Linux)
    "5" written to /proc/self/clear_refs resets VmHWM to the current resident size

A run measures each *phase* — construction (``setup``), steps, saves — by resetting the
peak when the phase starts and reading it when it ends.  Where the reset is refused
(not Linux) a phase's figure is the peak so far: an upper bound, said so in the log.
The reset also resets what ``getrusage`` (and ``/usr/bin/time``'s %M) reports at exit:
the peak since the last reset only.  ``MINIPAR_KEEP_PEAK_RSS=1`` makes a run skip the
resets (phases then read "peak so far"), so that an outside measurement sees the whole
run's peak — how ``benchmarks/memory_scaling.py`` checks the run's own figure.

On CuPy the pool keeps freed blocks, so its ``total_bytes()`` after ``free_all_blocks()``
at a phase's start is the phase's high-water mark on the device; the device's used
memory (``memGetInfo``: every process on it) is read at the phase's end.
"""
from __future__ import annotations

import contextlib
import os
import resource
import sys

from minipar import backend

PHASES = ("construction", "steps", "save")


def _status_kib(field):
    try:
        with open("/proc/self/status") as f:
            for line in f:
                if line.startswith(field + ":"):
                    return int(line.split()[1])
    except OSError:
        pass
    return None


def peak_rss_bytes():
    """The process's peak resident memory since it started or since ``reset_peak_rss``."""
    kib = _status_kib("VmHWM")
    if kib is not None:
        return kib * 1024
    maxrss = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    return maxrss if sys.platform == "darwin" else maxrss * 1024   # bytes on macOS, KiB else


def rss_bytes():
    """The process's resident memory now (0 where /proc is missing)."""
    return (_status_kib("VmRSS") or 0) * 1024


def reset_peak_rss():
    """Reset the peak to the current resident size; True if the system did (False too
    when ``MINIPAR_KEEP_PEAK_RSS`` is set: see the module docstring)."""
    if os.environ.get("MINIPAR_KEEP_PEAK_RSS"):
        return False
    try:
        with open("/proc/self/clear_refs", "w") as f:
            f.write("5")
    except OSError:
        return False
    return True


def device_memory(reset=False):
    """(pool high-water bytes, device used bytes) on CuPy, (None, None) on NumPy.
    ``reset``: free the pool's cached blocks so its total restarts at what is in use."""
    if backend.backend_name() != "cupy":
        return None, None
    pool = backend.xp.get_default_memory_pool()
    if reset:
        pool.free_all_blocks()
    try:
        free, total = backend.xp.cuda.runtime.memGetInfo()
        used = int(total - free)
    except Exception:                      # no device query: unknown
        used = None
    return int(pool.total_bytes()), used


class ProcessMemory:
    """Per-phase peaks of this process: ``with memory.phase("steps"): ...``.  A phase met
    several times (every step, every save) keeps its largest peak."""

    def __init__(self):
        self.peaks = {}          # phase -> {"rss": bytes, "pool": bytes, "device": bytes}
        self.exact = True        # False where the peak could not be reset between phases
        self.floor = rss_bytes()  # made before construction: the runtime's own memory

    def begin(self, name=None):
        """A phase starts: reset the peaks it will be measured by.  The CuPy pool is
        emptied only when the phase is first met: its blocks stay allocated after that,
        so its high-water mark needs no reset, and freeing it before every step would
        make every step allocate its device memory anew."""
        self.exact = reset_peak_rss() and self.exact
        device_memory(reset=name not in self.peaks)

    def record(self, name):
        """Fold the peak since ``begin`` into ``name``'s figures; returns this time's."""
        pool, device = device_memory()
        now = {"rss": peak_rss_bytes(), "pool": pool, "device": device}
        old = self.peaks.get(name, {})
        self.peaks[name] = {k: v if old.get(k) is None else max(v or 0, old[k]) for k, v in now.items()}
        return now

    @contextlib.contextmanager
    def phase(self, name):
        self.begin(name)
        try:
            yield self
        finally:
            self.record(name)

    def of(self, name, key="rss"):
        """One figure of one phase (None if the phase did not happen or on NumPy's pool)."""
        return self.peaks.get(name, {}).get(key)

    def vector(self):
        """[rss, pool, device] of each phase, in ``PHASES`` order, NaN where unknown: what
        the monitor gathers from every rank."""
        nan = float("nan")
        return [nan if self.of(p, k) is None else float(self.of(p, k))
                for p in PHASES for k in ("rss", "pool", "device")]


# ---------------------------------------------------------------- the run's summary

def summarize(rows, exact=True, floor=None, predicted=None):
    """Rank 0: {"peak_rss_bytes_per_rank", "phases": {phase: {"rss"|"pool"|"device":
    [per rank]}}, "exact", "floor_bytes_per_rank", "predicted_bytes_per_rank"} from every
    rank's ``vector()`` (rows: ranks x values) and the memory model's figure per rank
    (``train/fits.predicted_peak``)."""
    def column(j):
        values = [None if v != v else int(v) for v in (row[j] for row in rows)]  # NaN: None
        return values if any(v is not None for v in values) else None
    phases = {}
    for i, p in enumerate(PHASES):
        figures = {k: column(3 * i + j) for j, k in enumerate(("rss", "pool", "device"))}
        if figures["rss"] is not None:
            phases[p] = {k: v for k, v in figures.items() if v is not None}
    peaks = [max((ph["rss"][r] or 0) for ph in phases.values()) for r in range(len(rows))] \
        if phases else []
    out = {"peak_rss_bytes_per_rank": peaks, "phases": phases, "exact": bool(exact)}
    if floor is not None:
        out["floor_bytes_per_rank"] = [int(v) for v in floor]
    if predicted is not None and all(v == v for v in predicted):      # no NaN
        out["predicted_bytes_per_rank"] = [int(v) for v in predicted]
    return out


def summary_lines(process, fmt):
    """The summary's lines about the process's memory (``fmt``: bytes -> text)."""
    if not process or not process.get("phases"):
        return []
    lines = ["  process peak (RSS) per rank: " + ", ".join(map(fmt, process["peak_rss_bytes_per_rank"]))
             + ("" if process.get("exact", True) else " (phases not separable here: peaks so far)")]
    for name, figures in process["phases"].items():
        text = f"    {name:<12} RSS " + ", ".join(fmt(v) for v in figures["rss"] if v is not None)
        if figures.get("pool"):
            text += " | CuPy pool " + ", ".join(fmt(v) for v in figures["pool"] if v is not None)
        if figures.get("device"):
            text += " | device used " + ", ".join(fmt(v) for v in figures["device"] if v is not None)
        lines.append(text)
    predicted = process.get("predicted_bytes_per_rank")
    if predicted:
        ratios = [f"{a / b:.2f}" for a, b in zip(process["peak_rss_bytes_per_rank"], predicted) if b]
        lines.append("    memory model (runtime floor + corpus + state + activations + buffers + "
                     "workspace) " + ", ".join(map(fmt, predicted)) + "; peak RSS / model "
                     + ", ".join(ratios))
    checked = process.get("checked_peak_bytes")
    if checked:                 # train/fits.py: the same model for the fullest rank
        lines.append(f"    memory check before the run (the same model, fullest rank) "
                     f"{fmt(checked)}; largest peak RSS / check "
                     f"{max(process['peak_rss_bytes_per_rank']) / checked:.2f}")
    return lines
