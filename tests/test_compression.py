"""Gradient-compression hooks (minipar/parallel/sync/compression).

Multi-rank checks run in ONE mpiexec launch per world size
(``tests/scripts/compression_cases.py``): 2 ranks for everything, 3 ranks (uneven ring
chunks, sums of three) for the hook-level cases.  The rest are one-process checks of
the pure functions.
"""
import json

import numpy as np
import pytest

from minipar.parallel.buckets import Bucket
from minipar.nn import Parameter
from minipar.parallel.sync.compression import METHODS, make_hook
from minipar.parallel.sync.compression.int8 import dequantise, quantise
from minipar.parallel.sync.compression.topk import topk_indices
from minipar.parallel.sync.compression.wire import ring_all_reduce_bytes
from tests.mpirun import run_mpi

SCRIPT = "tests/scripts/compression_cases.py"
HOOK_CASES = ["cast", "int8_exact", "error_feedback", "bytes"]


def _launch(tmp_path_factory, n, cases=()):
    out = tmp_path_factory.mktemp(f"compression{n}") / "out.json"
    run_mpi(n, [SCRIPT, out, *cases], timeout=240)
    result = json.load(open(out))
    assert result["ranks"] == n
    return result["per_rank"]


@pytest.fixture(scope="module")
def two(tmp_path_factory):
    return _launch(tmp_path_factory, 2)


@pytest.fixture(scope="module")
def three(tmp_path_factory):
    return _launch(tmp_path_factory, 3, HOOK_CASES)


@pytest.fixture(params=["two", "three"])
def ranks(request):
    """Both launches' per-rank results, for the cases both ran."""
    return request.getfixturevalue(request.param)


def test_half_hooks_equal_the_all_reduce_of_rounded_gradients(ranks):
    for rank in ranks:
        assert rank["cast"] == {"fp16": True, "bf16": True}


def test_full_topk_and_full_rank_powersgd_reproduce_the_uncompressed_steps(two):
    for rank in two:
        parity = rank["dense_parity"]
        for name in ("topk100", "topk100_no_overlap"):         # float64, several buckets
            assert parity[name]["buckets"] > 1 and parity[name]["steps"] == 3
            assert parity[name]["loss_rel"] == 0.0 and parity[name]["weight_rel"] == 0.0, name
        # QR and re-association of M = P (Pᵀ M): float64 rounding, amplified a little by AdamW
        assert parity["powersgd_full"]["loss_rel"] < 1e-11
        assert parity["powersgd_full"]["weight_rel"] < 1e-8


def test_int8_on_exactly_representable_values_is_the_all_reduce(ranks):
    for rank in ranks:
        case = rank["int8_exact"]
        assert case["residual"] == 0.0
        if len(ranks) == 2:
            assert case["equal"]                    # a + b: one rounding, either order
        else:
            assert case["max_rel"] < 1e-15          # three addends: ring vs rank order


def test_error_feedback_invariant(ranks):
    """Σ_t applied_t + mean_r residual_r = Σ_t mean_r g_r,t (float64, 5 steps, 2 buckets)."""
    for rank in ranks:
        for method, case in rank["error_feedback"].items():
            assert case["steps"] == 5
            assert case["residual"] > 0, method     # something was held back...
            assert case["gap"] < 1e-12, method      # ...and nothing was lost


def test_counted_bytes_equal_each_methods_formula(ranks):
    for rank in ranks:
        for method, steps in rank["bytes"].items():
            for step in steps:
                assert step["hook"] == step["comm"] == step["formula"], method
                assert step["ratio"] == pytest.approx(step["dense"] / step["hook"])
        assert all(s["ratio"] == 2.0 for s in rank["bytes"]["fp16"])
        assert rank["bytes"]["powersgd"][0]["ratio"] == 1.0     # warm-up step: dense
        assert rank["bytes"]["powersgd"][1]["ratio"] > 3


def test_resume_with_compression_state_is_exact(two):
    for rank in two:
        for method, case in rank["resume"].items():
            assert case["exact"], method
            assert case["differs_without_state"], method        # the state matters
        assert rank["resume"]["powersgd"]["keys"] == ["powersgd_q", "residual", "step"]


def test_powersgd_compresses_after_its_warm_up(two):
    for rank in two:
        ratios = rank["warmup"]["ratios"]
        assert ratios[:2] == [1.0, 1.0] and min(ratios[2:]) > 5


# ----------------------------------------------------------------------- one process
def test_quantise_keeps_each_value_within_half_a_level():
    x = np.random.default_rng(0).standard_normal(1000) * np.repeat([1e-3, 1.0, 50.0, 0.0], 250)
    q, scale = quantise(x, 256)
    assert q.dtype == np.int8 and scale.dtype == np.float32 and scale.size == 4
    back = dequantise(q, scale, 256, x.dtype)
    per = np.repeat(scale, 256)[:1000]
    assert np.all(np.abs(back - x) <= 0.5 * per * (1 + 1e-6) + 1e-12)
    assert np.abs(q).max() == 127 and np.all(back[750:] == 0)


def test_topk_indices_pick_the_largest_magnitudes():
    x = np.array([0.1, -5.0, 3.0, -0.2, 4.0])
    assert sorted(topk_indices(x, 2).tolist()) == [1, 4]
    assert sorted(topk_indices(x, 9).tolist()) == [0, 1, 2, 3, 4]


def test_make_hook_knows_its_methods():
    assert METHODS == ("none", "fp16", "bf16", "int8", "topk", "powersgd")
    assert make_hook("none") is None
    assert make_hook("powersgd").start == 10 and make_hook("int8").start == 0
    with pytest.raises(ValueError, match="choose one of"):
        make_hook("int4")
    with pytest.raises(ValueError, match="ratio"):
        make_hook("topk", ratio=0.0)


def test_a_stateful_hook_must_be_bound_first():
    with pytest.raises(RuntimeError, match=r"hook.bind\(sync\)"):
        make_hook("topk")(None, np.zeros(4))


def test_state_dict_round_trip_and_foreign_keys():
    bucket = Bucket([Parameter(np.zeros((3, 4))), Parameter(np.zeros(5))], 1)
    hook = make_hook("powersgd", rank=2).bind([bucket])
    hook.residual[0] = np.arange(17.0)
    hook.q[(0, 0)] = np.ones((4, 2))
    state = hook.state_dict()
    assert set(state) == {"step", "residual.bucket0.param0", "residual.bucket0.param1",
                          "powersgd_q.bucket0.param0"}
    assert state["residual.bucket0.param0"].shape == (3, 4)
    other = make_hook("powersgd", rank=2).bind([bucket])
    other.load_state_dict(state)
    assert np.array_equal(other.residual[0], np.arange(17.0)) and (0, 0) in other.q
    with pytest.raises(KeyError, match="unexpected state"):
        make_hook("topk").bind([bucket]).load_state_dict(state)


def test_ring_bytes_formula_is_the_textbook_volume():
    # 2(n-1)/n·S when chunks are even; uneven chunks: each rank skips its own two
    assert ring_all_reduce_bytes(1000, 4, 4, 0) == 2 * 3 / 4 * 4000
    assert ring_all_reduce_bytes(10, 4, 3, 0) == 4 * (20 - 4 - 3)
    assert ring_all_reduce_bytes(10, 4, 1, 0) == 0
