"""Pipeline parallelism end to end: every schedule reproduces the single-process run,
and a traced run's bubble matches the simulator's prediction for its measured op times."""
import json

import pytest

from tests.cli import train, assert_same_run

DEEP = ["--model", "tiny", "--n-layer", "8", "--d-model", "16", "--n-head", "2", "--seq-len", "8"]


@pytest.fixture(scope="module")
def single(tmp_path_factory):
    return train(tmp_path_factory.mktemp("single"), "single", 1, model=DEEP, batch=8)


# every schedule on 4 stages; on 2, 1F1B and ZB-H1 by default and the rest in the slow run
SCHEDULES = [pytest.param(schedule, pp, id=f"{schedule}-{pp}",
                          marks=[pytest.mark.slow] if pp == 2 and schedule in ("afab", "interleaved") else [])
             for schedule in ("afab", "1f1b", "interleaved", "zb-h1") for pp in (2, 4)]


@pytest.mark.parametrize("schedule,pp", SCHEDULES)
def test_schedule_parity(tmp_path, single, pp, schedule):
    flags = ["--pp", str(pp), "--schedule", schedule, "--microbatches", str(2 * pp if pp == 2 else 4)]
    if schedule == "interleaved":
        flags += ["--chunks", "2"]
    run = train(tmp_path, f"{schedule}{pp}", pp, *flags, model=DEEP, batch=8)
    assert_same_run(run, single)


@pytest.mark.parametrize("flags", [["--schedule", "1f1b", "--zero", "0"],
                                   ["--schedule", "interleaved", "--chunks", "2", "--zero", "1"],
                                   ["--schedule", "zb-h1", "--zero", "2"]])
def test_pipeline_with_data_parallel(tmp_path, single, flags):
    run = train(tmp_path, "pp2dp2", 4, "--pp", "2", "--dp", "2", "--microbatches", "2", *flags,
                model=DEEP, batch=8)
    assert_same_run(run, single)


def test_pipeline_one_rank_many_chunks(tmp_path, single):
    run = train(tmp_path, "pp1v2", 1, "--schedule", "interleaved", "--chunks", "2",
                "--microbatches", "2", model=DEEP, batch=8)
    assert_same_run(run, single)


def test_trace_is_a_timeline_with_its_bubble_and_the_simulators(tmp_path):
    """pp=2 on 2 ranks, AFAB with 4 micro-batches: the trace holds every F and B of both
    ranks with the recvs between them, the logged bubble is the trace's own, and the
    simulator's prediction for the measured op times sits beside it.  (How close the two
    are is a timing, measured by benchmarks/pipeline_bubble.py, never asserted here.)"""
    from minipar.parallel.pipeline import bubble_fraction
    trace = tmp_path / "trace.json"
    model = ["--model", "tiny", "--n-layer", "4", "--d-model", "64", "--seq-len", "64"]
    train(tmp_path, "traced", 2, "--pp", "2", "--schedule", "afab", "--microbatches", "4",
          "--trace", trace, model=model, batch=8, steps=3)
    data = json.load(open(trace))
    events = [e for e in data["traceEvents"] if e.get("ph") == "X"]
    for rank in (0, 1):
        kinds = sorted(e["cat"] for e in events if e["tid"] == rank and e["cat"] in "FB")
        assert kinds == ["B"] * 4 + ["F"] * 4
    assert any(e["cat"] == "recv" for e in events)
    timelines = {}
    for e in events:
        a = e["args"]
        timelines.setdefault(e["tid"], []).append(
            (e["cat"], a["microbatch"], a["chunk"], e["ts"] / 1e6, (e["ts"] + e["dur"]) / 1e6))
    summary = data["metadata"]
    assert abs(bubble_fraction(timelines) - summary["measured_bubble"]) < 1e-6
    assert 0.0 < summary["measured_bubble"] < 1.0 and 0.0 < summary["simulated_bubble"] < 1.0


def _trace_timelines(path):
    data = json.load(open(path))
    timelines = {}
    for e in (e for e in data["traceEvents"] if e.get("ph") == "X"):
        a = e["args"]
        timelines.setdefault(e["tid"], []).append(
            (e["cat"], a["microbatch"], a["chunk"], e["ts"] / 1e6, (e["ts"] + e["dur"]) / 1e6))
    return timelines, data["metadata"]


@pytest.mark.parametrize("microbatches", [4, pytest.param(8, marks=pytest.mark.slow)])
def test_a_slow_stage_shows_as_wait_and_the_bubble_matches_the_simulator(tmp_path, monkeypatch,
                                                                        microbatches):
    """Stage 1 slowed 4x (MINIPAR_SLOW_RANK): no F/B span contains a receive (an op's span
    is its compute only), stage 0's idle time is receive spans, and the measured bubble
    (1 - compute/wall) is within 5 points of the simulator fed with each stage's
    measured op times."""
    monkeypatch.setenv("MINIPAR_SLOW_RANK", "1:4")
    trace = tmp_path / "trace.json"
    model = ["--model", "tiny", "--n-layer", "4", "--d-model", "64", "--seq-len", "64"]
    train(tmp_path, "slow", 2, "--pp", "2", "--schedule", "1f1b", "--microbatches", str(microbatches),
          "--trace", trace, model=model, batch=2 * microbatches, steps=2)
    timelines, summary = _trace_timelines(trace)
    for spans in timelines.values():
        ops = [s for s in spans if s[0] in "FBW"]
        waits = [s for s in spans if s[0] in ("recv", "wait")]
        for op in ops:
            for w in waits:
                assert min(op[4], w[4]) - max(op[3], w[3]) <= 1e-6, (op, w)
    wall = max(s[4] for s in timelines[0]) - min(s[3] for s in timelines[0])
    recv0 = sum(s[4] - s[3] for s in timelines[0] if s[0] == "recv")
    assert recv0 > 0.3 * wall                  # the fast stage waits, and it shows as waiting
    assert abs(summary["measured_bubble"] - summary["simulated_bubble"]) <= 0.05, summary
