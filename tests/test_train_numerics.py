"""--precision fp16/bf16 and --recompute through the training command."""
import json

import numpy as np
import pytest

from tests.cli import train
from minipar.observe.runlog import step_records
from tests.mpirun import run_mpi
from tests.tolerance import assert_close_normwise

MODEL = ["--model", "tiny", "--n-layer", "2", "--d-model", "32", "--seq-len", "16"]


def losses(tmp_path, name, n, *flags, steps=12):
    log = tmp_path / f"{name}.json"
    run_mpi(n, ["-m", "minipar", "train", *MODEL, "--steps", str(steps), "--batch-size", "8",
                "--quiet", "--eval-batches", "0", "--log-json", log, *flags], timeout=180)
    return step_records(log)


def test_half_precision_tracks_fp32_and_logs_the_scale(tmp_path):
    fp32 = losses(tmp_path, "fp32", 1)
    fp16 = losses(tmp_path, "fp16", 1, "--precision", "fp16")
    bf16 = losses(tmp_path, "bf16", 1, "--precision", "bf16")
    final = lambda run: np.mean([r["loss"] for r in run[-3:]])  # noqa: E731
    assert fp32[-1]["loss"] < fp32[0]["loss"] - 0.5                  # it trains
    assert abs(final(fp16) / final(fp32) - 1) < 0.005   # observed ~1e-4
    assert abs(final(bf16) / final(fp32) - 1) < 0.01    # observed ~1e-3: 8 mantissa bits
    assert all(r["loss_scale"] == 2.0 ** 16 for r in fp16)          # fp16 logs its scale
    assert "loss_scale" not in bf16[0]                               # bf16 needs none


def test_fp16_across_layouts(tmp_path):
    """Data, tensor and pipeline parallel fp16 runs follow the single-process fp16 run
    (not bit-exactly: half-precision rounding happens on differently shaped pieces).  The
    scale starts at 2^10: from 2^16 a replica's gradient of its smaller batch can overflow
    where the whole batch's does not, and that skipped step (correct, but layout-dependent)
    would make the curves differ."""
    fp16 = ["--precision", "fp16", "--initial-loss-scale", "1024"]
    single = [r["loss"] for r in losses(tmp_path, "one", 1, *fp16, steps=6)]
    for n, flags in ((2, ["--dp", "2"]), (4, ["--tp", "2", "--pp", "2", "--microbatches", "2"])):
        run = losses(tmp_path, "many", n, *fp16, *flags, steps=6)
        assert not any(r["skipped"] for r in run)
        run = [r["loss"] for r in run]
        assert_close_normwise(run, single, 2e-3)


@pytest.mark.parametrize("mode", ["full", "selective"])
def test_recompute_is_bit_identical(tmp_path, mode):
    base = losses(tmp_path, "none", 1, "--precision", "fp64", "--dropout", "0.1", steps=4)
    again = losses(tmp_path, mode, 1, "--precision", "fp64", "--dropout", "0.1",
                   "--recompute", mode, steps=4)
    assert [r["loss"] for r in again] == [r["loss"] for r in base]
    assert again[-1]["peak_mem_bytes"] < base[-1]["peak_mem_bytes"]


def test_fp16_checkpoint_keeps_fp32_masters(tmp_path):
    run = train(tmp_path, "amp", 1, "--precision", "fp16", model=MODEL, batch=8, steps=2)
    _, params, _ = run
    assert all(v.dtype == np.float32 for v in params.values())


def test_zero_with_fp16_shards_the_fp32_masters(tmp_path):
    """ZeRO 1/2/3 in fp16 follow the fp16 DDP run, skip nothing at scale 2^10, and hold
    the paper's mixed-precision bytes per rank: params 2Ψ, grads 2Ψ, optimizer (master,
    m, v) 12Ψ/N for stage 1; grads 2Ψ/N for stage 2; params 2Ψ/N too for stage 3."""
    fp16 = ["--precision", "fp16", "--initial-loss-scale", "1024"]
    base = losses(tmp_path, "ddp", 2, *fp16, steps=5)
    n = 2
    for stage in (1, 2, 3):
        run = losses(tmp_path, f"z{stage}", n, *fp16, "--zero", str(stage), steps=5)
        assert not any(r["skipped"] for r in run)
        assert_close_normwise([r["loss"] for r in run], [r["loss"] for r in base], 2e-3)
        mem = run[-1]["model_state_bytes"]
        psi = mem["optimizer"] * n // 12        # every bucket of this model divides evenly by N
        expected = {1: (2 * psi, 2 * psi), 2: (2 * psi, 2 * psi // n),
                    3: (2 * psi // n, 2 * psi // n)}[stage]
        assert (mem["params"], mem["grads"]) == expected, (stage, mem)
    ddp_bytes = base[-1]["model_state_bytes"]
    assert psi == ddp_bytes["optimizer"] // 8        # Ψ from the unsharded run's m and v
