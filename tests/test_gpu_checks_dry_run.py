"""``benchmarks/gpu_check.py`` dry-run on the CPU with the fake CuPy.

The run a lent GPU gets — prerequisites, then each section's children, each figure a JSON
row appended to ``rows.jsonl`` the moment it is measured — runs here on tiny shapes with the
same code paths and kernel choices (the flash kernels through the CPU emulator; PyTorch's
rows marked not measured, it has no CUDA here).  What a pass proves: the run's plumbing, the
rows each section writes, that a run stopped half-way keeps every row measured before the
stop, and that a missing prerequisite stops it in one line.  Not the speed.

By default: one run of four sections stopped (SIGTERM) once the last of them has begun, the
refusals.  Slow: the whole dry run, every section.
"""
import json
import os
import signal
import subprocess
import sys
import time

import pytest

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
SCRIPT = os.path.join(REPO, "benchmarks", "gpu_check.py")
MAX_FILES = 8          # what a device run brings back from its $OUT


def rows_of(folder):
    path = folder / "rows.jsonl"
    return [json.loads(line) for line in path.read_text().splitlines()] if path.exists() else []


def dry_run(tmp_path, *flags):
    env = dict(os.environ, OMP_NUM_THREADS="1", OUT=str(tmp_path))
    return subprocess.Popen([sys.executable, SCRIPT, "--dry-run", *flags], cwd=REPO, env=env,
                            stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)


def check_measured_sections(rows):
    """The rows of flash, throughput and transport, as a dry run writes them."""
    env = [r for r in rows if r["section"] == "environment"]
    assert env and env[0]["gpus"] == 1 and env[0]["mpiexec"], env
    flash = [r for r in rows if r["section"] == "flash" and r.get("precision") == "fp16"]
    assert flash and all(r["ok"] for r in flash), flash
    assert flash[0]["forward_vs_fp64"] <= flash[0]["forward_threshold"], flash
    bf16 = [r for r in rows if r["section"] == "flash" and r.get("precision") == "bf16"]
    assert bf16 and all(r.get("ok") or r["status"].startswith("not built") for r in bf16), bf16
    rates = {r["precision"]: r for r in rows
             if r["section"] == "throughput" and r.get("framework") == "minipar" and "tokens_per_s" in r}
    assert sorted(rates) == ["bf16", "fp16", "fp32"] and all(r["tokens_per_s"] > 0 for r in rates.values()), rows
    assert rates["fp32"]["attention"] == "naive"     # the fp32 flash kernel is a scalar one
    torch_rows = [r for r in rows if r["section"] == "throughput" and r.get("framework") == "torch"]
    assert len(torch_rows) == 3 and all(r["status"].startswith("not measured") for r in torch_rows)
    order = [(r.get("framework"), r.get("precision")) for r in rows if r["section"] == "throughput"
             and "framework" in r and "ratio" not in r]   # minipar and PyTorch alternate
    assert order == [(f, p) for p in ("fp32", "fp16", "bf16") for f in ("minipar", "torch")], order
    ratios = {r["ratio"] + " " + r.get("framework", "") for r in rows if r.get("ratio")}
    assert {"fp16 / fp32 minipar", "bf16 / fp32 minipar"} <= ratios, ratios
    staging = [r for r in rows if r["section"] == "transport" and r.get("transport") == "staging"]
    assert staging and staging[0]["ok"] and staging[0]["wrong_elements"] == 0 and staging[0]["ranks"] == 2
    nccl = [r for r in rows if r["section"] == "transport" and r.get("transport") == "nccl"]
    assert nccl and "2 GPUs" in nccl[0]["status"], nccl


def test_a_dry_run_stopped_half_way_keeps_its_rows(tmp_path):
    """Four sections, stopped by SIGTERM once the last one (attention) has begun: every row
    measured before is in rows.jsonl, the stop is a row of its own, the child it stopped
    is gone, no 'done' row; the log holds every child's output."""
    pytest.importorskip("ml_dtypes")   # bf16 on the (fake) CuPy
    proc = dry_run(tmp_path, "--sections", "flash,throughput,transport,attention")
    try:
        deadline = time.monotonic() + 600   # a hung run fails here instead of hanging CI
        while not any(r.get("transport") == "nccl" for r in rows_of(tmp_path)):  # transport's last
            assert proc.poll() is None, proc.stdout.read()[-3000:]
            assert time.monotonic() < deadline, rows_of(tmp_path)
            time.sleep(0.2)
        proc.send_signal(signal.SIGTERM)
        output, _ = proc.communicate(timeout=60)
    finally:
        proc.kill()
    assert proc.returncode == 128 + signal.SIGTERM, output[-3000:]
    rows = rows_of(tmp_path)
    check_measured_sections(rows)
    assert rows[-1]["section"] == "run" and rows[-1]["status"] == "stopped by signal 15", rows[-1]
    assert not any(r.get("status") == "done" for r in rows)
    child = rows[-1]["child_stopped"]      # None: the signal came between two children
    assert child is None or subprocess.run(["kill", "-0", str(child)], capture_output=True).returncode
    log = (tmp_path / "log.txt").read_text()   # every child's output, the stopped one's too
    assert log.count("== exit") >= 6 and "--child transport staging" in log, log[-2000:]
    assert len(os.listdir(tmp_path)) <= MAX_FILES


@pytest.mark.slow
def test_the_whole_dry_run(tmp_path):
    """Every section on the fake CuPy, to the end: the GPU tests collected, flash against
    float64, tokens/s, flash timings, host syncs and launches per step (fp16: the step reads
    the device once), the staging transport, in at most 8 files."""
    pytest.importorskip("ml_dtypes")
    proc = dry_run(tmp_path)
    output, _ = proc.communicate(timeout=1200)
    assert proc.returncode == 0, output[-3000:]
    rows = rows_of(tmp_path)
    check_measured_sections(rows)
    tests = [r for r in rows if r["section"] == "tests"]
    assert tests and tests[0]["ok"] and tests[0]["tests collected"] > 0, tests
    flash_times = [r for r in rows if r["section"] == "attention" and r.get("impl") == "minipar flash"]
    assert flash_times and all(r["fwd_ms"] > 0 and r["bwd_ms"] > 0 for r in flash_times), flash_times
    syncs = [r for r in rows if r["section"] == "syncs"]
    assert syncs and all(r["optimizer_d2h"] == 1 and r["step_syncs"] <= 2 for r in syncs), syncs
    assert rows[-1]["status"] == "done" and len(os.listdir(tmp_path)) <= MAX_FILES


def test_a_missing_prerequisite_stops_the_run_in_one_line(tmp_path):
    """No mpiexec on PATH (a GPU image without the mpich wheel): one line naming it and
    what to bring, exit 2, before any section runs."""
    env = dict(os.environ, OUT=str(tmp_path), PATH=os.pathsep.join(["/usr/bin", "/bin"]))
    out = subprocess.run([sys.executable, SCRIPT, "--dry-run"], cwd=REPO, env=env,
                         capture_output=True, text=True, timeout=300)
    stops = [line for line in out.stdout.splitlines() if line.startswith("gpu_check:")]
    assert out.returncode == 2 and len(stops) == 1 and "mpiexec" in stops[0], out.stdout[-3000:]
    assert [r["section"] for r in rows_of(tmp_path)] == ["environment", "environment"]


def test_an_unknown_section_is_refused(tmp_path):
    out = subprocess.run([sys.executable, SCRIPT, "--dry-run", "--sections", "nonesuch"], cwd=REPO,
                         env=dict(os.environ, OUT=str(tmp_path)), capture_output=True, text=True,
                         timeout=120)
    assert out.returncode == 2 and "no section 'nonesuch'" in out.stdout, out.stdout + out.stderr
