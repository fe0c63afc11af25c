"""The timeline format shared by the simulator, the engine's trace and the drawings.

A *timeline* maps each rank to the spans of work it did:

    {rank: [Span(kind, microbatch, chunk, start, end), ...]}

* ``kind``: "F", "B", "W" for compute; a measured trace may add "send", "recv"
  (or any other label) for communication and waiting;
* ``microbatch``, ``chunk``: which micro-batch / model chunk the span served
  (chunk 0 unless interleaved);
* ``start``, ``end``: times on a clock shared by all ranks (seconds for a
  measured run, e.g. ``time.perf_counter() - t0`` after a barrier; abstract
  units in the simulator).

`Span` is a NamedTuple, so a plain tuple ``(kind, microbatch, chunk, start,
end)`` is the same thing; `as_timelines` also accepts dicts with those keys and
a list indexed by rank instead of a dict.

The bubble fraction is the share of rank-time not spent computing:

    bubble = 1 - sum_r busy_r / (pp * makespan),

busy_r being the time rank r spends in compute spans and makespan the time from
the earliest start to the latest end over all ranks.
"""
from __future__ import annotations

from typing import NamedTuple

COMPUTE_KINDS = ("F", "B", "W")


class Span(NamedTuple):
    """One piece of work on one rank, from `start` to `end`."""

    kind: str
    microbatch: int
    chunk: int
    start: float
    end: float


def _as_span(item) -> Span:
    if isinstance(item, Span):
        return item
    if isinstance(item, dict):
        return Span(item["kind"], int(item["microbatch"]), int(item.get("chunk", 0)),
                    float(item["start"]), float(item["end"]))
    kind, microbatch, chunk, start, end = item
    return Span(kind, int(microbatch), int(chunk), float(start), float(end))


def as_timelines(timelines) -> dict[int, list[Span]]:
    """Normalise ``{rank: spans}`` or ``[spans_of_rank0, ...]`` whose spans are
    Spans, 5-tuples or dicts into ``{rank: [Span, ...]}`` sorted by start."""
    if not isinstance(timelines, dict):
        timelines = dict(enumerate(timelines))
    return {int(rank): sorted((_as_span(s) for s in spans), key=lambda s: (s.start, s.end))
            for rank, spans in sorted(timelines.items())}


def _union_length(intervals: list[tuple[float, float]]) -> float:
    """Total length covered by possibly overlapping intervals."""
    total, reach = 0.0, float("-inf")
    for start, end in sorted(intervals):
        if end <= reach:
            continue
        total += end - max(start, reach)
        reach = end
    return total


def busy_time(spans, kinds=COMPUTE_KINDS) -> float:
    """Time covered by spans of the given kinds (overlaps counted once)."""
    return _union_length([(s.start, s.end) for s in map(_as_span, spans) if s.kind in kinds])


def makespan(timelines) -> float:
    """Latest end minus earliest start over all ranks."""
    spans = [s for rank_spans in as_timelines(timelines).values() for s in rank_spans]
    if not spans:
        return 0.0
    return max(s.end for s in spans) - min(s.start for s in spans)


def bubble_fraction(timelines, kinds=COMPUTE_KINDS) -> float:
    """Idle share of the ranks' time: 1 - sum_r busy_r / (pp * makespan).

    Spans whose kind is not in `kinds` (send, recv, ...) count as idle, which
    is what the pipeline bubble means: time a rank is not computing.
    """
    timelines = as_timelines(timelines)
    total = makespan(timelines) * len(timelines)
    if total == 0:
        return 0.0
    busy = sum(busy_time(spans, kinds) for spans in timelines.values())
    return 1.0 - busy / total
