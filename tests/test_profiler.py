"""The step profiler (minipar/observe/profiler.py): exact FLOPs of a matmul, op times inside their
phases, phases that add up to the step, and the ``python -m minipar profile`` command."""
import json
import os
import subprocess
import sys

import numpy as np
import pytest

from minipar.observe import profiler
from minipar.autograd import Tensor, function, ops
from minipar.config import TrainConfig
from minipar.observe.profiler import StepProfiler, timed_step
from minipar.observe.profiler_report import summarize

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
TINY = dict(model="tiny", n_layer=2, d_model=32, seq_len=16, batch_size=4, steps=3)


def counted(prof, name, kind):
    calls, _, flops, nbytes = prof.ops[(name, kind, kind)]
    return calls, flops, nbytes


def test_linear_and_matmul_flops_are_2mnk():
    m, k, n = 3, 5, 7
    x = Tensor(np.ones((m, k), np.float32), requires_grad=True)
    w = Tensor(np.ones((k, n), np.float32), requires_grad=True)
    b = Tensor(np.zeros(n, np.float32), requires_grad=True)
    with StepProfiler() as prof:
        with prof.phase("forward"):
            y = ops.linear(x, w)
            z = ops.linear(x, w, b)
        with prof.phase("backward"):
            (ops.sum(y) + ops.sum(z)).backward()
    assert counted(prof, "Linear", "forward")[:2] == (2, 2 * (2 * m * n * k) + m * n)
    # dx and dW: 2mnk each, twice; db: m·n once
    assert counted(prof, "Linear", "backward")[:2] == (2, 2 * (2 * 2 * m * n * k) + m * n)
    one = x.data.nbytes + w.data.nbytes + y.data.nbytes                  # inputs + output
    assert counted(prof, "Linear", "forward")[2] == 2 * one + b.data.nbytes

    a = Tensor(np.ones((2, 3, 4, 5), np.float32), requires_grad=True)    # batched, (m, k) = (4, 5)
    c = Tensor(np.ones((2, 3, 5, 6), np.float32))                        # no gradient wanted
    with StepProfiler() as prof:
        with prof.phase("forward"):
            out = a @ c
        with prof.phase("backward"):
            ops.sum(out).backward()
    flops = 2 * (2 * 3) * 4 * 6 * 5
    assert counted(prof, "MatMul", "forward")[1] == flops
    assert counted(prof, "MatMul", "backward")[1] == flops       # only dA is produced
    assert function._op_observer is None                         # the seam is closed again


def test_a_view_moves_nothing_and_profilers_do_not_nest():
    x = Tensor(np.ones((4, 6), np.float32), requires_grad=True)
    with StepProfiler() as prof:
        with prof.phase("forward"):
            ops.reshape(x, (6, 4))
        with pytest.raises(RuntimeError):
            with StepProfiler():
                pass
    assert counted(prof, "Reshape", "forward")[1:] == (0, 0)


@pytest.fixture(scope="module")
def run():
    from minipar.train import setup
    return setup(TrainConfig(**TINY))


@pytest.fixture(scope="module")
def profiled(run):
    """The profilers of two steps, after a warm-up."""
    timed_step(run, 0, StepProfiler())
    profs = []
    for step in (1, 2):
        with StepProfiler() as prof:
            timed_step(run, step, prof)
        profs.append(prof)
    return profs


def test_op_times_fit_inside_their_phases(profiled):
    for prof in profiled:
        for phase in ("forward", "backward"):
            inside = sum(s for (_, _, ph), (_, s, _, _) in prof.ops.items() if ph == phase)
            assert 0 < inside <= prof.phases[phase]
        assert {ph for (_, _, ph) in prof.ops} <= {"forward", "backward"}
        rep = summarize(prof, 1, gemm_rate=1e10, mem_bw=1e9)
        linear = [o for o in rep["ops"] if o["op"] == "Linear"]
        assert linear and all(o["flops"] > 0 and o["roofline_s"] > 0 for o in linear)
        # forward and backward do work outside their ops (the graph, the walk): > 0, unclamped
        assert all(prof.phases[ph] > sum(s for (_, _, p), (_, s, _, _) in prof.ops.items() if p == ph)
                   for ph in ("forward", "backward"))


class _StepClock:
    """``time`` as ``minipar/observe/profiler.py`` reads it: it moves only where the test moves it."""

    def __init__(self):
        self.now = 0.0

    def perf_counter(self):
        return self.now


def test_phases_add_up_to_the_step_wall_time(run, monkeypatch):
    """Every part of a step's work runs inside a phase, and the profiler's bookkeeping is
    left out of the step and of its phases.  The clock moves only when a piece of the
    step runs: the model's forward 3 s, the backward 5 s, the optimizer 2 s, and each op's
    bookkeeping (its FLOPs and bytes) 1000 s; so the figures are exact, whatever the
    machine's speed or load: a piece run outside its phase, or bookkeeping counted, shows."""
    clock = _StepClock()
    monkeypatch.setattr(profiler, "time", clock)

    def costing(seconds, call):
        def timed(*args, **kwargs):
            clock.now += seconds
            return call(*args, **kwargs)
        return timed
    monkeypatch.setattr(run.parallel.model, "forward", costing(3.0, run.parallel.model.forward))
    monkeypatch.setattr(Tensor, "backward", costing(5.0, Tensor.backward))
    monkeypatch.setattr(run.optimizer, "step", costing(2.0, run.optimizer.step))
    for cost in ("forward_cost", "backward_cost"):
        monkeypatch.setattr(profiler, cost, costing(1000.0, getattr(profiler, cost)))
    with StepProfiler() as prof:
        wall = timed_step(run, 1, prof)
    assert prof.own_s >= 2000.0                          # the bookkeeping did cost, and ...
    assert wall == 10.0                                  # ... is in neither the step ...
    assert (prof.phases["forward"], prof.phases["backward"]) == (3.0, 5.0)   # ... nor a phase
    # the communication the optimizer waited for moves from its phase to comm, summing to 2 s
    assert prof.phases["optimizer"] + prof.phases["comm"] == pytest.approx(2.0, abs=1e-12)
    assert sum(prof.phases.values()) == pytest.approx(wall, abs=1e-12)


def run_cli(*flags, timeout=120):
    env = dict(os.environ, OMP_NUM_THREADS="1", PYTHONPATH=REPO)
    return subprocess.run([sys.executable, "-m", "minipar", "profile", *flags], cwd=REPO, env=env,
                          capture_output=True, text=True, timeout=timeout)


def test_the_command_prints_its_tables_and_the_final_line(tmp_path):
    out = tmp_path / "profile.json"
    proc = run_cli("--model", "tiny", "--steps", "1", "--top", "5", "--json", str(out))
    assert proc.returncode == 0, proc.stderr
    lines = proc.stdout.strip().splitlines()
    assert lines[-1].startswith("profile: step ") and "python overhead" in lines[-1]
    assert "GFLOP/s" in proc.stdout and "achieved/roofline" in proc.stdout
    assert "process peak RSS" in proc.stdout      # what the process held, beside the arrays
    rep = json.loads(out.read_text())
    (memory,) = rep["memory_per_rank"]
    assert memory["peak_rss"] >= memory["steps"] > memory["tracked"] > 0
    assert set(rep["phases"]) == {"forward", "backward", "optimizer", "comm"}
    assert 0 < rep["step_s"] < 60
    assert all(0 <= p["ops_s"] <= p["s"] + 1e-12 for p in rep["phases"].values())
    assert {"Linear", "Optimizer.step"} <= {o["op"] for o in rep["ops"]}


@pytest.mark.parametrize("flags, says", [(["--save", "x"], "--save is not built for profile"),
                                         (["--steps", "0"], "--steps and --top must be >= 1")])
def test_the_command_refuses_what_it_does_not_do(flags, says):
    proc = run_cli("--model", "tiny", *flags, timeout=60)
    assert proc.returncode == 2 and says in proc.stderr
