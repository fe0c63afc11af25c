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


DTYPES = ["float16", "float32", "float64", "int8", "int16", "int32", "int64", "uint8", "uint16",
          "uint32", "uint64", "complex64", "complex128", "bool"]
small = st.lists(st.integers(0, 9), max_size=3)             # 0-d to 3-D, empty axes too
medium = st.integers(0, 3000).map(lambda n: [n])            # odd and prime lengths
big = st.sampled_from([[(1 << 18) + 3], [7, 1 << 15]])       # > 1 MiB of float32: segments
shapes = st.one_of(small, small, small, medium, medium, big)  # (repeats weight the draw)


def case_strategy(nprocs):
    return st.fixed_dictionaries({
        "k": st.integers(1, nprocs),
        "coll": st.sampled_from(["all_reduce", "all_reduce", "reduce_scatter", "all_gather",
                                 "broadcast", "reduce"]),
        "shape": shapes, "step": st.sampled_from([1, 1, 2, 3]),
        "out": st.sampled_from(["none", "contig", "strided"]),
        "dtype": st.sampled_from(DTYPES), "op": st.sampled_from(["sum", "max", "min"]),
        "root": st.integers(0, 7), "alg": st.integers(0, 7),
        "async": st.booleans(), "sizes": st.booleans(),
    })


def generated_cases(nprocs, examples=4):
    """The case list hypothesis draws (several examples pooled into one batch: one launch
    per batch keeps it affordable on 2 cores; a failure is reported in full, not shrunk)."""
    batches = []

    @settings(max_examples=examples, deadline=None, derandomize=True, database=None)
    @given(cases=st.lists(case_strategy(nprocs), min_size=8, max_size=14))
    def collect(cases):
        batches.append(cases)

    collect()
    return [c for batch in batches for c in batch]


@pytest.mark.parametrize("nprocs,ranks_per_node", [(4, "2"), (8, "3")])
def test_generated_cases_on_mpi(nprocs, ranks_per_node, tmp_path):
    # sub-communicators of 1..nprocs ranks; sizes 0 to 2^18, 0-d to 3-D, strided inputs and
    # outputs, every dtype, op, root and algorithm, blocking and non-blocking
    cases = generated_cases(nprocs)
    assert len({c["k"] for c in cases}) >= nprocs // 2  # many communicator sizes, not one
    path = tmp_path / "cases.json"
    path.write_text(json.dumps(cases))
    proc = run_mpi(nprocs, ["tests/scripts/comm_cases.py", path], timeout=150,
                   env={"MINIPAR_COMM_CHECK": "1", "MINIPAR_HANG_TIMEOUT": "60",
                        "MINIPAR_RANKS_PER_NODE": ranks_per_node})
    assert f"OK {len(cases)} generated cases" in proc.stdout
