"""The pipeline's time and bubble: the schedule simulator fed with modelled stage times.

``parallel/pipeline/simulate.py`` times a schedule from per-stage op costs t_f, t_b,
t_w and the transfer t_comm; here they come from the compute and comm models.  For
uniform stages the simulator reproduces the closed forms

    AFAB, 1F1B:        bubble = (p-1)/(m + p - 1)
    interleaved (v):   bubble = (p-1)/(v·m + p - 1)
    ZB-H1:             bubble ≈ (p-1)/(3m + p - 1)   (t_f = t_b = t_w)

which are used, scaled to the stage times, when a schedule has more than
``MAX_SIMULATED`` actions (a 1T-parameter search would otherwise simulate millions).
Results are cached by the cost ratios (to 2 significant digits), so a search simulates
each shape once.

Micro-batches in flight on the first stage (its activation memory): AFAB m,
1F1B min(m, p), ZB-H1 the same (W releases later: ``peak_held``), interleaved
(counted per chunk) — taken from the simulator's ``peak_in_flight``.
"""
from __future__ import annotations

from functools import lru_cache

from minipar.parallel.pipeline.schedules import build_schedule
from minipar.parallel.pipeline.simulate import simulate

MAX_SIMULATED = 200


@lru_cache(maxsize=4096)
def _simulated(kind, pp, m, chunks, rb, rw, rc):
    sched = build_schedule(kind, pp, m, chunks)
    r = simulate(sched, pp, chunks, t_f=1.0, t_b=rb, t_w=rw, t_comm=rc)
    held = r.peak_held if kind == "zb-h1" else r.peak_in_flight
    return r.makespan, max(held.values()) / chunks


def _closed(kind, pp, m, chunks, rb, rw, rc):
    """Closed forms, in units of t_f: m·(F+B+W) of work plus the fill and drain."""
    w = rw or 0.0
    op = 1.0 + rb + w
    if kind == "zb-h1":
        fill = (pp - 1) * max(1.0 + rb - w, 0.0)
    else:
        fill = (pp - 1) * op / (chunks if kind == "interleaved" else 1)
    v = chunks if kind == "interleaved" else 1
    in_flight = m if kind == "afab" else min(m, pp) * (1 + (pp - 1) / (pp * v) if v > 1 else 1)
    return m * op + fill + 2 * (pp - 1) * rc, in_flight


def pipeline_time(kind, pp, m, chunks, t_f, t_b, t_w=None, t_comm=0.0):
    """(makespan seconds, bubble fraction, micro-batches in flight on stage 0)."""
    if pp == 1 and chunks == 1:
        total = m * (t_f + t_b + (t_w or 0.0))
        return total, 0.0, 1.0
    r = lambda x: float(f"{x / t_f:.2g}") if x is not None else None  # noqa: E731 (2 digits)
    key = (kind, pp, m, chunks, r(t_b), r(t_w), r(t_comm))
    actions = pp * m * chunks * (3 if kind == "zb-h1" else 2)
    fn = _simulated if actions <= MAX_SIMULATED else _closed
    span, in_flight = fn(*key)
    makespan = span * t_f
    busy = m * (t_f + t_b + (t_w or 0.0))
    return makespan, max(1.0 - busy / makespan, 0.0), in_flight


@lru_cache(maxsize=1024)
def in_flight(kind, pp, m, chunks=1, rank=0):
    """Micro-batches' worth of a stage's activations rank ``rank`` holds at its peak
    (the schedule's own count for small schedules; AFAB m, 1F1B min(m, pp - rank)).
    ZB-H1's micro-batches whose B has run but not yet their W are not counted here:
    they hold only the weight GEMMs' inputs (``held_for_weights``)."""
    if pp * m * chunks <= MAX_SIMULATED:
        return _peaks(kind, pp, m, chunks)[0][rank] / chunks
    if kind == "afab":
        return float(m)
    v = chunks if kind == "interleaved" else 1
    base = min(m, pp - rank)
    return base * (1 + (pp - 1) / (pp * v)) if v > 1 else float(base)


def held_for_weights(kind, pp, m, chunks=1, rank=0):
    """ZB-H1: micro-batches past B whose W has not run, at the peak (simulated for small
    schedules; 0 in the closed form, which does not track them)."""
    if kind != "zb-h1" or pp * m * chunks > MAX_SIMULATED:
        return 0.0
    in_flight_now, held = _peaks(kind, pp, m, chunks)
    return max(held[rank] - in_flight_now[rank], 0) / chunks


@lru_cache(maxsize=1024)
def _peaks(kind, pp, m, chunks):
    """The simulator's (peak_in_flight, peak_held) per rank for one schedule, once."""
    r = simulate(build_schedule(kind, pp, m, chunks), pp, chunks)
    return r.peak_in_flight, r.peak_held
