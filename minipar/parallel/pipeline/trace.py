"""A measured pipeline step as a trace: gathered from the stages, written as
Chrome trace JSON (opens in Perfetto), with its bubble fraction and the
simulator's prediction for the measured mean op times alongside."""
from __future__ import annotations

import json
import os
import statistics

from minipar.parallel.pipeline.draw import to_chrome_trace
from minipar.parallel.pipeline.schedules import build_schedule
from minipar.parallel.pipeline.simulate import simulate
from minipar.parallel.pipeline.timeline import bubble_fraction


def gather_spans(pp_comm, spans):
    """{stage rank: spans} on pp rank 0 (pickled: once per step, off the hot path)."""
    everyone = pp_comm.mpi.gather([tuple(s) for s in spans], root=0)
    return None if everyone is None else dict(enumerate(everyone))


def summarize(timelines, kind, pp, microbatches, chunks):
    """Measured bubble and the simulator's, given the measured mean F/B/W times."""
    def mean(k):
        d = [s[4] - s[3] for spans in timelines.values() for s in spans if s[0] == k]
        return statistics.mean(d) if d else None
    t_f, t_b, t_w = mean("F"), mean("B"), mean("W")
    sim = simulate(build_schedule(kind, pp, microbatches, chunks), pp, chunks,
                   t_f=t_f * chunks, t_b=t_b * chunks, t_w=None if t_w is None else t_w * chunks)
    return {"measured_bubble": bubble_fraction(timelines), "simulated_bubble": sim.bubble_fraction,
            "mean_op_s": {"F": t_f, "B": t_b, "W": t_w}}


def write_trace(path, timelines, summary):
    trace = to_chrome_trace(timelines)
    trace["metadata"] = summary
    tmp = f"{path}.tmp-{os.getpid()}"
    with open(tmp, "w") as f:          # written whole, then renamed: never read half-done
        json.dump(trace, f)
    os.replace(tmp, path)
