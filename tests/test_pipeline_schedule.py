"""Pipeline schedules as data: validator, simulator (bubble formulas, peak memory), drawing.

No MPI. Every op costs the same per stage (t_f = t_b [= t_w]) unless stated, so the
bubble fractions must equal the closed forms to 1e-12.
"""
import json

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from minipar.parallel.pipeline import (Action, ScheduleError, Span, bubble_fraction,
                                       build_schedule, dependencies, draw_timeline, peers,
                                       simulate, splits_backward, to_chrome_trace, validate)


def grid():
    """(kind, pp, microbatches, chunks) over pp 1..8, m from 1 to >> pp."""
    for pp in range(1, 9):
        for m in sorted({1, 2, pp, pp + 1, 2 * pp, 4 * pp + 3}):
            for kind in ("afab", "1f1b", "zb-h1"):
                yield kind, pp, m, 1
        for chunks in (2, 3):
            for m in (pp, 2 * pp, 4 * pp):
                yield "interleaved", pp, m, chunks


def split_costs(kind):
    return {"t_w": 1.0} if kind == "zb-h1" else {}


# ------------------------------------------------------------------ validator
def test_validator_accepts_every_schedule_on_grid():
    for kind, pp, m, v in grid():
        schedule = build_schedule(kind, pp, m, v)
        order = validate(schedule, pp, m, v)
        assert len(order) == sum(len(a) for a in schedule.values())
        ops_per_pair = 3 if kind == "zb-h1" else 2
        assert all(len(a) == ops_per_pair * m * v for a in schedule.values())
        assert splits_backward(schedule) == (kind == "zb-h1")


def _replace(actions, old, new):
    return [new if a == old else a for a in actions]


def test_rejects_missing_op():
    s = build_schedule("1f1b", 4, 8)
    s[1] = [a for a in s[1] if a != Action("B", 3)]
    with pytest.raises(ScheduleError, match=r"rank 1: B3 .*missing"):
        validate(s, 4, 8)


def test_rejects_duplicate_forward():
    s = build_schedule("afab", 2, 3)
    s[0] = _replace(s[0], Action("F", 2), Action("F", 1))
    with pytest.raises(ScheduleError, match="rank 0: F1 .* appears 2 times|rank 0: F2 .*missing"):
        validate(s, 2, 3)


def test_rejects_backward_before_forward():
    s = build_schedule("1f1b", 2, 4)
    i, j = s[1].index(Action("F", 2)), s[1].index(Action("B", 2))
    s[1][i], s[1][j] = s[1][j], s[1][i]
    with pytest.raises(ScheduleError, match="rank 1: B2 at position .* before its F2"):
        validate(s, 2, 4)


def test_rejects_w_before_b():
    s = build_schedule("zb-h1", 3, 6)
    i, j = s[2].index(Action("B", 4)), s[2].index(Action("W", 4))
    s[2][i], s[2][j] = s[2][j], s[2][i]
    with pytest.raises(ScheduleError, match="rank 2: W4 .* before its B4"):
        validate(s, 3, 6)


def test_rejects_partly_split_backward():
    s = build_schedule("zb-h1", 2, 4)
    s[0] = [a for a in s[0] if a != Action("W", 1)]
    with pytest.raises(ScheduleError, match="W1 .*missing.*every B needs a W"):
        validate(s, 2, 4)


def test_rejects_deadlock_and_names_stuck_ops():
    # rank 0 waits for B0 from rank 1, while rank 1 first wants F1 from rank 0.
    s = {0: [Action("F", 0), Action("B", 0), Action("F", 1), Action("B", 1)],
         1: [Action("F", 0), Action("F", 1), Action("B", 0), Action("B", 1)]}
    with pytest.raises(ScheduleError, match="deadlock") as err:
        validate(s, 2, 2)
    assert "rank 0 stuck at B0" in str(err.value) and "B0 on rank 1" in str(err.value)
    assert "rank 1 stuck at F1" in str(err.value) and "F1 on rank 0" in str(err.value)


def test_rejects_wrong_ranks_and_ranges():
    s = build_schedule("1f1b", 2, 2)
    with pytest.raises(ScheduleError, match="ranks 0..2"):
        validate(s, 3, 2)
    with pytest.raises(ScheduleError, match="microbatch 1, outside 0..0"):
        validate(s, 2, 1)
    with pytest.raises(ScheduleError, match="chunk 1, outside"):
        validate({0: [Action("F", 0, 1), Action("B", 0, 1)]}, 1, 1, 1)


# ------------------------------------------------------------------ build_schedule
@pytest.mark.parametrize("args, message", [
    (("gpipe", 2, 4), "unknown schedule 'gpipe'"),
    (("1f1b", 0, 4), "pp must be an integer >= 1"),
    (("1f1b", 2, 0), "microbatches must be an integer >= 1"),
    (("afab", 2, 4, 2), "use chunks=1, or kind='interleaved'"),
    (("zb-h1", 2, 4, 3), "use chunks=1"),
    (("interleaved", 2, 4, 1), "chunks >= 2"),
    (("interleaved", 4, 6, 2), "divisible by pp.*e.g. 4 or 8"),
    (("interleaved", 4, 2, 2), "e.g. 4 or 8"),
])
def test_build_schedule_refuses_bad_args(args, message):
    with pytest.raises(ValueError, match=message):
        build_schedule(*args)


def test_peers_follow_virtual_stages():
    pp, v = 4, 2  # rank r holds stages r and r + 4
    assert peers(3, Action("F", 0, 0), pp, v) == ((2, 0), (0, 1))
    assert peers(0, Action("F", 0, 1), pp, v) == ((3, 0), (1, 1))
    assert peers(0, Action("B", 0, 1), pp, v) == ((1, 1), (3, 0))
    assert peers(0, Action("F", 0, 0), pp, v) == (None, (1, 0))
    assert peers(3, Action("B", 5, 1), pp, v) == (None, (2, 1))
    assert peers(2, Action("W", 5, 1), pp, v) == (None, None)
    assert dependencies(0, Action("B", 2, 1), pp, v) == [(0, Action("F", 2, 1)), (1, Action("B", 2, 1))]


# ------------------------------------------------------------------ simulator
@pytest.mark.parametrize("kind", ["afab", "1f1b"])
def test_bubble_afab_1f1b_is_p_minus_1_over_m_plus_p_minus_1(kind):
    for pp in range(1, 9):
        for m in sorted({1, 2, pp, 2 * pp, 4 * pp + 3}):
            r = simulate(build_schedule(kind, pp, m), pp, t_f=1.0, t_b=1.0)
            assert r.bubble_fraction == pytest.approx((pp - 1) / (m + pp - 1), abs=1e-12)
            assert r.makespan == pytest.approx(2 * (m + pp - 1), abs=1e-12)


def test_bubble_interleaved_is_p_minus_1_over_v_m_plus_p_minus_1():
    for pp in range(1, 9):
        for v in (2, 3, 4):
            for m in (pp, 2 * pp, 3 * pp):
                r = simulate(build_schedule("interleaved", pp, m, v), pp, v)
                assert r.bubble_fraction == pytest.approx((pp - 1) / (v * m + pp - 1), abs=1e-12)


def test_bubble_zb_h1_is_a_third_of_1f1b():
    """With t_f = t_b = t_w each rank idles p-1 in ZB-H1 against 3(p-1) in 1F1B
    (whose full backward costs t_b + t_w): exactly a third of the idle time. As
    fractions of wall time the ratio is (m+p-1)/(3m+p-1), which exceeds 1/3 by
    2(p-1)/(3(3m+p-1)) <= 0.03 once m >= 8p: that is the tolerance."""
    for pp in range(2, 9):
        for m in (pp, 2 * pp, 8 * pp):
            zb = simulate(build_schedule("zb-h1", pp, m), pp, t_f=1.0, t_b=1.0, t_w=1.0)
            base = simulate(build_schedule("1f1b", pp, m), pp, t_f=1.0, t_b=1.0, t_w=1.0)
            assert zb.bubble_fraction == pytest.approx((pp - 1) / (3 * m + pp - 1), abs=1e-12)
            idle = lambda r: r.makespan * pp - sum(r.busy.values())
            assert idle(zb) == pytest.approx(idle(base) / 3, abs=1e-12)
            ratio = zb.bubble_fraction / base.bubble_fraction
            assert ratio == pytest.approx((m + pp - 1) / (3 * m + pp - 1), abs=1e-12)
            if m >= 8 * pp:
                assert abs(ratio - 1 / 3) < 0.03


def test_peak_in_flight():
    for pp in range(1, 9):
        for m in (pp, 3 * pp + 1):
            afab = simulate(build_schedule("afab", pp, m), pp)
            assert all(n == m for n in afab.peak_in_flight.values())
            for kind in ("1f1b", "zb-h1"):
                r = simulate(build_schedule(kind, pp, m), pp)
                assert r.peak_in_flight == {rank: pp - rank for rank in range(pp)}
            # ZB-H1 holds what W still needs a little longer, but never beyond 1F1B's peak p.
            zb = simulate(build_schedule("zb-h1", pp, m), pp)
            assert max(zb.peak_held.values()) == pp


def test_comm_latency_adds_two_hops_per_stage_to_afab():
    pp, m, c = 4, 8, 0.25
    r = simulate(build_schedule("afab", pp, m), pp, t_comm=c)
    assert r.makespan == pytest.approx(2 * (m + pp - 1) + 2 * (pp - 1) * c)


@settings(max_examples=60, deadline=None)
@given(kind=st.sampled_from(["afab", "1f1b", "interleaved", "zb-h1"]),
       pp=st.integers(1, 6), groups=st.integers(1, 4), extra=st.integers(0, 5),
       chunks=st.integers(2, 4),
       t_f=st.floats(0.1, 3.0), t_b=st.floats(0.1, 3.0), t_w=st.floats(0.1, 3.0),
       t_comm=st.floats(0.0, 1.0))
def test_property_schedules_are_valid_and_timelines_consistent(kind, pp, groups, extra, chunks,
                                                               t_f, t_b, t_w, t_comm):
    m = groups * pp if kind == "interleaved" else groups + extra
    v = chunks if kind == "interleaved" else 1
    schedule = build_schedule(kind, pp, m, v)
    validate(schedule, pp, m, v)
    r = simulate(schedule, pp, v, t_f=t_f, t_b=t_b, t_w=t_w, t_comm=t_comm)
    end = {}
    for rank, spans in r.timelines.items():
        assert [Action(s.kind, s.microbatch, s.chunk) for s in spans] == schedule[rank]
        for prev, nxt in zip(spans, spans[1:]):
            assert nxt.start >= prev.end - 1e-12  # one op at a time per rank
        for s in spans:
            end[(rank, Action(s.kind, s.microbatch, s.chunk))] = s.end
    for rank, spans in r.timelines.items():
        for s in spans:
            for d in dependencies(rank, Action(s.kind, s.microbatch, s.chunk), pp, v):
                assert s.start >= end[d] + (t_comm if d[0] != rank else 0) - 1e-9
    # every rank does the same work: m·(t_f + t_b + t_w)
    for busy in r.busy.values():
        assert busy == pytest.approx(m * (t_f + t_b + t_w))
    assert 0 <= r.bubble_fraction < 1
    assert r.bubble_fraction == pytest.approx(bubble_fraction(r.timelines), abs=1e-9)
    if kind in ("1f1b", "zb-h1"):
        assert all(r.peak_in_flight[k] <= pp - k for k in range(pp))


# ------------------------------------------------------------------ drawing and traces
def test_draw_simulated_and_measured_timelines():
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    sim = simulate(build_schedule("interleaved", 2, 4, 2), 2, 2)
    ax = draw_timeline(sim.timelines, title="interleaved")
    assert "bubble" in ax.get_title()
    measured = [  # rank 0 as tuples, rank 1 as dicts, with a send/recv span
        [("F", 0, 0, 0.0, 0.01), ("send", 0, 0, 0.01, 0.011), ("B", 0, 0, 0.03, 0.05)],
        [{"kind": "recv", "microbatch": 0, "start": 0.01, "end": 0.012},
         {"kind": "F", "microbatch": 0, "chunk": 0, "start": 0.012, "end": 0.02},
         {"kind": "B", "microbatch": 0, "chunk": 0, "start": 0.02, "end": 0.03}],
    ]
    fig, ax = plt.subplots()
    assert draw_timeline(measured, ax=ax) is ax
    plt.close("all")
    # busy 0.03 + 0.018 over 2 ranks x 0.05 s
    assert bubble_fraction(measured) == pytest.approx(1 - 0.048 / 0.1)


def test_chrome_trace():
    timelines = {0: [Span("F", 3, 1, 0.5, 0.75)], 1: [("B", 2, 0, 1.0, 2.0)]}
    trace = json.loads(json.dumps(to_chrome_trace(timelines)))
    spans = [e for e in trace["traceEvents"] if e["ph"] == "X"]
    assert spans[0] == {"name": "F3.1", "cat": "F", "ph": "X", "pid": 0, "tid": 0,
                        "ts": 500000.0, "dur": 250000.0, "args": {"microbatch": 3, "chunk": 1}}
    assert spans[1]["tid"] == 1 and spans[1]["name"] == "B2" and spans[1]["dur"] == 1e6
    names = {e["tid"]: e["args"]["name"] for e in trace["traceEvents"] if e["ph"] == "M"}
    assert names == {0: "rank 0", 1: "rank 1"}
