"""Check a pipeline schedule before any message is sent.

`validate(schedule, pp, microbatches, chunks)` raises `ScheduleError` (a
ValueError) naming the offending rank and action when

* the ranks are not exactly 0 .. pp-1, or an action's micro-batch / chunk is
  out of range;
* on some rank a (micro-batch, chunk) has no F or B, or two of them; W is
  present for some B but not others (a schedule splits all backwards or none);
* a B comes before its own F, or a W before its own B, in a rank's list;
* the cross-rank dependencies cannot be met: it replays the schedule, letting
  each rank run its next action as soon as the actions it depends on (see
  `schedules.dependencies`) have run anywhere. If every rank is blocked while
  work remains, that is a deadlock, and the error lists each rank's stuck
  action and what it waits for.

The replay assumes sends do not block (the engine posts `isend` and waits on it
later), so only data dependencies order the ranks. On success `validate`
returns that replay order, a list of (rank, Action) in which every action comes
after everything it depends on; the simulator times the schedule in that order.
"""
from __future__ import annotations

from collections import Counter

from .schedules import Action, dependencies


class ScheduleError(ValueError):
    """A pipeline schedule that cannot run as written."""


def _check_shape(schedule: dict, pp: int, microbatches: int, chunks: int) -> None:
    if sorted(schedule) != list(range(pp)):
        raise ScheduleError(f"schedule must have ranks 0..{pp - 1}, got ranks {sorted(schedule)}")
    for rank, actions in schedule.items():
        for pos, a in enumerate(actions):
            if not isinstance(a, Action):
                raise ScheduleError(f"rank {rank} position {pos}: expected an Action, got {a!r}")
            if not 0 <= a.microbatch < microbatches:
                raise ScheduleError(
                    f"rank {rank} position {pos}: {a!r} has microbatch {a.microbatch}, "
                    f"outside 0..{microbatches - 1}")
            if not 0 <= a.chunk < chunks:
                raise ScheduleError(
                    f"rank {rank} position {pos}: {a!r} has chunk {a.chunk}, outside 0..{chunks - 1}")


def _check_counts(schedule: dict, microbatches: int, chunks: int) -> None:
    split = any(a.kind == "W" for actions in schedule.values() for a in actions)
    wanted = {"F": 1, "B": 1, "W": 1 if split else 0}
    for rank, actions in schedule.items():
        counts = Counter(actions)
        for mb in range(microbatches):
            for c in range(chunks):
                for kind, n in wanted.items():
                    got = counts[Action(kind, mb, c)]
                    if got == n:
                        continue
                    what = Action(kind, mb, c)
                    if got == 0:
                        why = "is missing" if kind != "W" else \
                            "is missing (other backwards are split into B and W, so every B needs a W)"
                        raise ScheduleError(f"rank {rank}: {what!r} (microbatch {mb}, chunk {c}) {why}")
                    raise ScheduleError(
                        f"rank {rank}: {what!r} (microbatch {mb}, chunk {c}) appears {got} times, "
                        f"expected {n}")


def _check_local_order(schedule: dict) -> None:
    for rank, actions in schedule.items():
        position = {a: i for i, a in enumerate(actions)}
        for i, a in enumerate(actions):
            before = {"B": "F", "W": "B"}.get(a.kind)
            if before is None:
                continue
            need = Action(before, a.microbatch, a.chunk)
            if position[need] > i:
                raise ScheduleError(
                    f"rank {rank}: {a!r} at position {i} comes before its {need!r} at "
                    f"position {position[need]}; a {a.kind} needs its {before} first")


def replay(schedule: dict, pp: int, chunks: int) -> list[tuple[int, Action]]:
    """Run the schedule as data: each rank advances while its next action's
    dependencies are done. Returns the order; raises on deadlock."""
    pos = {rank: 0 for rank in schedule}
    done: set[tuple[int, Action]] = set()
    order: list[tuple[int, Action]] = []
    remaining = sum(len(actions) for actions in schedule.values())
    while remaining:
        progressed = False
        for rank, actions in schedule.items():
            while pos[rank] < len(actions):
                action = actions[pos[rank]]
                if not all(d in done for d in dependencies(rank, action, pp, chunks)):
                    break
                done.add((rank, action))
                order.append((rank, action))
                pos[rank] += 1
                remaining -= 1
                progressed = True
        if not progressed:
            stuck = []
            for rank, actions in schedule.items():
                if pos[rank] < len(actions):
                    action = actions[pos[rank]]
                    waits = [f"{a!r} on rank {r}" for r, a in dependencies(rank, action, pp, chunks)
                             if (r, a) not in done]
                    stuck.append(f"rank {rank} stuck at {action!r} (position {pos[rank]}), "
                                 f"waiting for {', '.join(waits)}")
            raise ScheduleError("deadlock: no rank can make progress:\n  " + "\n  ".join(stuck))
    return order


def validate(schedule: dict, pp: int, microbatches: int, chunks: int = 1) -> list[tuple[int, Action]]:
    """Raise `ScheduleError` unless `schedule` runs to completion; return the
    dependency-respecting order of (rank, Action) found by `replay`."""
    _check_shape(schedule, pp, microbatches, chunks)
    _check_counts(schedule, microbatches, chunks)
    _check_local_order(schedule)
    return replay(schedule, pp, chunks)
