"""Property tests (hypothesis): chunking, the cost model, and generated MPI cases."""
import json
import math

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from minipar.comm import chunk_bounds, chunk_sizes
from minipar.comm import cost_model as cm
from minipar.comm.bench import fmt_size, parse_size
from tests.mpirun import run_mpi


@given(n=st.integers(0, 10_000), p=st.integers(1, 64))
def test_chunks_are_numpy_array_split(n, p):
    b = chunk_bounds(n, p)
    parts = np.array_split(np.arange(n), p)
    assert [len(x) for x in parts] == chunk_sizes(n, p) == list(np.diff(b))
    assert b[0] == 0 and b[-1] == n
    assert max(chunk_sizes(n, p)) - min(chunk_sizes(n, p)) <= 1


params = st.builds(cm.CostParams, alpha=st.floats(1e-7, 1e-3), beta=st.floats(1e-12, 1e-8),
                   gamma=st.floats(1e-12, 1e-8))


@given(c=params, p=st.integers(2, 64), n=st.integers(1, 1 << 28))
def test_cost_model_shapes(c, p, n):
    t = {a: cm.predict(a, p, n, c) for a in ("ring", "recursive_doubling", "rabenseifner", "tree")}
    assert all(v > 0 for v in t.values())
    assert cm.choose(p, n, c) == min(t, key=t.get)
    # ring's bandwidth term is the optimal 2(p-1)/p·S: never more than tree's 2·log2(p)·S
    bw = 2 * (p - 1) / p * n * c.beta
    assert bw <= 2 * math.ceil(math.log2(p)) * n * c.beta + 1e-18
    assert cm.predict("ring", p, 2 * n, c) >= cm.predict("ring", p, n, c)


def test_cost_model_picks_latency_then_bandwidth_algorithms():
    c = cm.CostParams(alpha=5e-6, beta=1e-10, gamma=1e-10)
    assert cm.choose(8, 1024, c) in ("recursive_doubling", "tree")
    assert cm.choose(8, 64 << 20, c) in ("ring", "rabenseifner")
    assert cm.predict("ring", 1, 100, c) == 0.0


@given(text=st.sampled_from(["1K", "64M", "1KiB", "4096", "2G", "512B"]))
def test_sizes_round_trip(text):
    assert parse_size(fmt_size(parse_size(text))) == parse_size(text)


case = st.tuples(st.integers(0, 300), st.sampled_from(["float16", "float32", "float64", "int32", "int64"]),
                 st.sampled_from(["sum", "max", "min"]),
                 st.sampled_from(["auto", "ring", "recursive_doubling", "rabenseifner", "tree",
                                  "hierarchical"]))


@pytest.mark.parametrize("nprocs", [3, 4])
@settings(max_examples=2, deadline=None, derandomize=True)
@given(cases=st.lists(case, min_size=10, max_size=25))
def test_generated_cases_on_mpi(nprocs, cases):
    # many generated cases, one launch: keeps hypothesis affordable on 2 cores
    proc = run_mpi(nprocs, ["tests/scripts/comm_cases.py", json.dumps(cases)], timeout=90,
                   env={"MINIPAR_COMM_CHECK": "1", "MINIPAR_RANKS_PER_NODE": "2"})
    assert f"OK {len(cases)} generated cases" in proc.stdout
