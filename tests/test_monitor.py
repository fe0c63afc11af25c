"""RunMonitor (minipar/observe/monitor.py): every rank's figures reach rank 0's log in one
gather per step; header, per-step and final records carry the documented keys."""
import io
import json

import pytest

from minipar.observe import monitor
from tests.mpirun import run_mpi

STEP_KEYS = {"step", "loss", "lr", "grad_norm", "tokens_per_s", "samples_per_s", "step_time_s",
             "comm_time_s", "comm_share", "peak_mem_bytes", "peak_mem_bytes_per_rank",
             "model_state_bytes", "mfu", "mfu_basis", "per_rank"}
PER_RANK_KEYS = {"step_time_s", "compute_s", "comm_time_s", "pipeline_wait_s", "optimizer_s",
                 "compute_share", "comm_share", "peak_mem_bytes", "mem_share"}


def read_log(path):
    return [json.loads(line) for line in open(path)]


def test_three_ranks_reach_the_log_and_a_straggler_shows(tmp_path):
    log = tmp_path / "run.json"
    out = run_mpi(3, ["tests/scripts/monitor_run.py", log, "--fp16"], timeout=120).stdout
    header, *steps, final = read_log(log)
    assert header["header"]["layout"] == "dp3" and header["header"]["world_size"] == 3
    assert "threads" in header["header"] and len(header["header"]["mem_budget_bytes_per_rank"]) == 3
    assert [r["step"] for r in steps] == list(range(6))
    for r in steps:
        assert STEP_KEYS <= set(r) and PER_RANK_KEYS <= set(r["per_rank"])
        assert all(len(v) == 3 for v in r["per_rank"].values())
        times = r["per_rank"]["step_time_s"]
        assert times == pytest.approx([0.01, 0.02, 0.09])          # rank 2 is the straggler
        assert r["step_time_s"] == max(times)                       # the step waits for it
        assert r["tokens_per_s"] == pytest.approx(1024 / 0.09)
        assert r["samples_per_s"] == pytest.approx(8 / 0.09)
        assert r["per_rank"]["compute_share"] == pytest.approx([0.6] * 3)
        assert r["comm_share"] == pytest.approx(0.2)
        assert r["peak_mem_bytes_per_rank"] == [1000 + r["step"], 2000 + r["step"], 3000 + r["step"]]
        assert r["peak_mem_bytes"] == 3000 + r["step"]
        assert r["mfu"] == pytest.approx(2e9 / 0.09 / (3 * 0.5e12))
        assert r["mfu_basis"] == "peak-tflops 0.5 per rank"
        assert "pipeline_wait_s" not in r                           # not a pipeline run
        assert "loss_scale" in r and r["skipped"] == (r["step"] == 2)
    f = final["final"]
    assert f["val_loss"] == 2.5 and f["val_bits_per_byte"] == pytest.approx(2.5 / 0.6931471805599453)
    assert f["skipped_steps"] == 1 and f["train_loss"] == pytest.approx(2.5)
    assert f["peak_mem_bytes_per_rank"] == [1005, 2005, 3005]
    assert "nats/byte" in out and "bits/byte" in out and "3 ranks" in out


def collect(val_loss, **mine_extra):
    """One process, no MPI: three steps through a monitor that measures the GEMM rate."""
    out = io.StringIO()
    mon = monitor.RunMonitor(None, header=dict(layout="pp2", params=2e6, tokens_per_step=512,
                                               seq_len=64, backend="numpy", precision="fp32"),
                             flops_per_step=1e9, progress=False, total_steps=3, out=out)
    mon.start()
    recs = [mon.step(s, shared=dict(loss=2.0, lr=1e-3, grad_norm=0.5, model_state_bytes=10),
                     mine=dict(step_time_s=0.1, comm_time_s=0.02, optimizer_s=0.01,
                               peak_mem_bytes=100, **mine_extra)) for s in range(3)]
    final = mon.finish(val_loss=val_loss)
    return out.getvalue(), recs, final


def test_one_process_measures_the_gemm_rate_and_says_so():
    text, recs, final = collect(val_loss=None, pipeline_wait_s=0.03)
    rate = recs[0]["mfu_basis"]
    assert rate.startswith("measured GEMM rate") and "no --peak-tflops" in text
    assert "threads:" in text and "512 tokens/step" in text and "2.00M parameters" in text
    gflops = float(rate.split()[3])
    assert recs[0]["mfu"] == pytest.approx(1e9 / 0.1 / (gflops * 1e9), rel=0.05)
    r = recs[0]
    assert r["samples_per_s"] == pytest.approx(8 / 0.1)
    assert r["pipeline_wait_s"] == pytest.approx(0.03)
    assert r["per_rank"]["compute_s"] == pytest.approx([0.1 - 0.02 - 0.03 - 0.01])  # the rest
    assert 0 < r["per_rank"]["mem_share"][0] < 1e-6                  # 100 B of the RAM budget
    assert final["val_loss"] is None and "not measured" in text
    assert final["comm_share"] == pytest.approx(0.2) and final["steps"] == 3


def test_summary_prints_nats_and_bits():
    text, _, final = collect(val_loss=1.7)
    assert "val loss   1.7000 nats/byte (2.453 bits/byte)" in text
    assert "train loss 2.0000 nats/byte (2.885 bits/byte)" in text
    assert final["tokens_per_s"] == pytest.approx(5120)


def test_memory_budget_and_gemm_rate_are_positive():
    assert monitor.memory_budget_bytes() > 0
    assert monitor.measure_gemm_flops(0.02) > 1e6


def test_cupy_backend_without_nvml_or_memory_query(tmp_path):
    """On the fake CuPy of tests/fake_cupy (no memGetInfo, no NVML) the monitor still
    runs: the GEMM is timed on the "device", memory shares are unknown (null), not an error."""
    import os
    import subprocess
    import sys
    from tests.mpirun import REPO
    code = (
        "import io, json; from minipar import backend; from minipar.observe import monitor;"
        " backend.set_backend('cupy');"
        "m = monitor.RunMonitor(None, header=dict(tokens_per_step=64, batch_size=1), flops_per_step=1e6,"
        " progress=False, out=io.StringIO()); m.start();"
        "r = m.step(0, shared=dict(loss=1.0), mine=dict(step_time_s=0.1, peak_mem_bytes=5));"
        "m.finish(); print(json.dumps(r))")
    env = dict(os.environ, PYTHONPATH=os.pathsep.join([os.path.join(REPO, "tests", "fake_cupy"), REPO]))
    proc = subprocess.run([sys.executable, "-c", code], cwd=REPO, env=env, capture_output=True,
                          text=True, timeout=120)
    assert proc.returncode == 0, proc.stderr
    record = json.loads(proc.stdout.strip().splitlines()[-1])
    assert record["per_rank"]["mem_share"] == [None] and "device_util" not in record["per_rank"]
    assert record["mfu_basis"].startswith("measured GEMM rate")
