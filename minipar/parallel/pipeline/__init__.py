"""Pipeline parallelism: schedules as data, checked, timed and drawn without MPI.

    schedule = build_schedule("1f1b", pp=4, microbatches=8)   # {rank: [Action]}
    validate(schedule, pp=4, microbatches=8)                  # raises ScheduleError
    result = simulate(schedule, pp=4)                         # bubble, peak memory
    draw_timeline(result.timelines)                           # the bubble, drawn
"""
from .draw import draw_timeline, to_chrome_trace
from .schedules import (KINDS, SCHEDULES, Action, build_schedule, dependencies, peers,
                        splits_backward, stage_location, virtual_stage)
from .simulate import SimResult, simulate
from .timeline import COMPUTE_KINDS, Span, as_timelines, bubble_fraction, busy_time, makespan
from .validate import ScheduleError, replay, validate

__all__ = [
    "Action", "KINDS", "SCHEDULES", "build_schedule", "dependencies", "peers",
    "splits_backward", "stage_location", "virtual_stage",
    "ScheduleError", "replay", "validate",
    "SimResult", "simulate",
    "COMPUTE_KINDS", "Span", "as_timelines", "bubble_fraction", "busy_time", "makespan",
    "draw_timeline", "to_chrome_trace",
]
