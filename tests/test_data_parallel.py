"""Data parallelism and ZeRO: parity with one process, mechanics, memory, resharding."""
import json

import pytest

from tests.cli import train, assert_same_run
from tests.mpirun import run_mpi


@pytest.fixture(scope="module")
def single(tmp_path_factory):
    return train(tmp_path_factory.mktemp("single"), "single", 1)


# By default every ZeRO stage on 3 ranks (shards of uneven size), plain DP on 2 and ZeRO-3 on 4;
# dp 4 without ZeRO also runs in test_grad_accumulation_equals_data_parallel. The rest: slow.
DEFAULT_PARITY = {(3, 0), (3, 1), (3, 2), (3, 3), (2, 0), (4, 3)}
PARITY = [pytest.param(dp, zero, id=f"{zero}-{dp}", marks=[] if (dp, zero) in DEFAULT_PARITY else [pytest.mark.slow])
          for zero in (0, 1, 2, 3) for dp in (2, 3, 4)]


@pytest.mark.parametrize("dp,zero", PARITY)
def test_parity_with_single_process(tmp_path, single, dp, zero):
    buckets = [] if zero == 3 else ["--bucket-mb", "0.02"]   # ZeRO-3's units are the layers
    run = train(tmp_path, f"dp{dp}z{zero}", dp, "--zero", str(zero), *buckets)
    assert_same_run(run, single)


def test_grad_accumulation_equals_data_parallel(tmp_path, single):
    accum = train(tmp_path, "accum", 1, "--grad-accum", "4")
    dp4 = train(tmp_path, "dp4", 4, "--bucket-mb", "0.02")
    assert_same_run(accum, single)
    assert_same_run(accum, dp4)
    mixed = train(tmp_path, "dp2acc2", 2, "--grad-accum", "2", "--zero", "2", "--bucket-mb", "0.02")
    assert_same_run(mixed, single)


def test_broadcast_buckets_overlap_and_memory():
    out = run_mpi(4, ["tests/scripts/dp_check.py"], timeout=120).stdout
    report = json.loads(out.split("REPORT ", 1)[1])
    assert report["broadcast_ok"]
    assert report["buckets"] > 3
    assert report["launched_before_backward_ended"]
    assert report["shards_own_memory2"] and report["shards_own_memory3"]
    assert report["zero3_units_in_buffers"]
    psi, n = report["psi"], 4
    for stage in (0, 1, 2, 3):
        # fp32 AdamW bytes (params, grads, optimizer states), the paper's formulas with
        # sharded terms counted on the padded size (each bucket rounded up to a multiple of N)
        padded = report.get(f"psi_padded{stage}", psi)
        assert padded - psi < n * 40                       # padding: < N elements per bucket
        full, shard = 4 * psi, 4 * padded // n
        flat = 4 * padded             # ZeRO-1/2 parameters live in padded flat buckets
        expected = {0: (full, full, 2 * full), 1: (flat, full, 2 * shard),
                    2: (flat, shard, 2 * shard), 3: (shard, shard, 2 * shard)}[stage]
        mem = report[f"mem{stage}"]
        assert (mem["params"], mem["grads"], mem["optimizer"]) == expected, (stage, mem)
    # the totals, as the paper writes them: 16Ψ, 8Ψ + 8Ψ/N, 4Ψ + 12Ψ/N, 16Ψ/N
    totals = {s: sum(report[f"mem{s}"].values()) for s in range(4)}
    assert totals[0] == 16 * psi
    for stage, formula in ((1, 8 * psi + 8 * psi / n), (2, 4 * psi + 12 * psi / n), (3, 16 * psi / n)):
        assert 0 <= totals[stage] - formula <= 16 * (report[f"psi_padded{stage}"] - psi)


@pytest.mark.slow     # resharding across ZeRO stages by default: test_checkpoint_reshard.py's chain
def test_checkpoint_dp4_zero2_resumes_on_dp2_zero3(tmp_path):
    full = train(tmp_path, "full", 1, steps=8)
    train(tmp_path, "first", 4, "--zero", "2", "--stop-at", "4", steps=8)
    resumed = train(tmp_path, "second", 2, "--zero", "3", "--resume", tmp_path / "first", steps=8)
    losses, params, _ = resumed
    assert len(losses) == 4
    import numpy as np
    np.testing.assert_allclose(losses, full[0][4:], rtol=1e-12)
    for name in params:
        np.testing.assert_allclose(params[name], full[1][name], rtol=1e-11, atol=1e-14)
