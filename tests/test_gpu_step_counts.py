"""What a mixed-precision training step would cost on a GPU, counted on the fake CuPy:
device->host waits, CuPy's upcasting batched half ``matmul``, silent upcasts.

The trainer's step runs in a subprocess with ``tests/fake_cupy`` first on PYTHONPATH
(``tests/scripts/count_gpu_step.py``), whose counters see every array operation.  A GPU
runs ahead of Python until Python reads something back; each read drains the queue.
Budgets held here, per optimizer step, for fp16 and bf16:

- a step reads the device once: the overflow flag, ||g||² and the loss for the log
  together, at the end of ``Optimizer.step`` (unscale, overflow check agreed by all ranks,
  global norm, clip, AdamW, publish); the trainer then waits once more for the queue to
  drain, to time the step — 2 syncs in all (reading the flag and the norm per parameter
  would cost two syncs per parameter, and reading the loss on its own a third a step);
- the optimizer's unscale, overflow check and squares are one kernel launch over the
  master gradients' one buffer (``fused_cuda.unscale_check_norm``), not passes per
  parameter: that kernel is the only fused kernel left registered here;
- no half-precision GEMM goes through CuPy's batched ``matmul`` (fp32 casts, no tensor
  cores; crashes on bf16): every half GEMM is a cuBLAS ``gemmEx``/``gemmStridedBatchedEx``;
- no result of activation size is silently wider than its half inputs;
- under ZeRO (2 ranks) the same one launch over every shard's gradient and one read, and
  no launch per parameter in the optimizer step (the slow cases add a layer).

The other fused CUDA kernels (LayerNorm, GELU, softmax, AdamW) are left out (their array
code runs): on the fake each launch is a CPU-emulator process, seconds each; they never
read the device, and ``test_fused_emulated.py`` checks them.  The model reads bytes (a
256-token vocabulary, not the 4,096 BPE tokens): the emulated optimizer kernel runs one
CPU fiber per parameter, and the counts do not depend on the vocabulary (a 2-step run
took 64 s with 4,096 tokens, 5 s with 256, the same counts).
"""
import json
import os
import subprocess
import sys

import pytest

from tests.mpirun import run_mpi

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
SCRIPT = os.path.join(REPO, "tests", "scripts", "count_gpu_step.py")
PRECISIONS = ("fp16", "bf16")


@pytest.fixture(scope="module")
def counts():
    pytest.importorskip("ml_dtypes")
    env = dict(os.environ, OMP_NUM_THREADS="1",
               PYTHONPATH=os.pathsep.join([os.path.join(REPO, "tests", "fake_cupy"), REPO]))
    env.pop("MINIPAR_BACKEND", None)
    procs = {p: subprocess.Popen([sys.executable, SCRIPT, p, "--steps", "2", "--fused-kernels", "optimizer",
                                  "--n-layer", "1", "--d-model", "16", "--seq-len", "16",
                                  "--batch-size", "2", "--data", "stdlib-bytes"],
                                 cwd=REPO, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                                 text=True) for p in PRECISIONS}
    out = {}
    for p, proc in procs.items():
        try:
            stdout, stderr = proc.communicate(timeout=300)
        except subprocess.TimeoutExpired:
            for other in procs.values():     # none left running after the test
                other.kill()
            raise
        assert proc.returncode == 0, stderr[-3000:]
        out[p] = json.loads(stdout.strip().splitlines()[-1])
    return out


@pytest.mark.parametrize("precision", PRECISIONS)
def test_a_step_reads_the_device_once(counts, precision):
    for step in counts[precision]["steps"]:
        assert step["forward_backward"]["syncs"] == 0, step["forward_backward"]   # loss unread
        assert step["optimizer"]["d2h"] == step["optimizer"]["syncs"] == 1, step["optimizer"]
        assert step["step"]["d2h"] == 1 and step["step"]["syncs"] <= 2, step["step"]


@pytest.mark.parametrize("precision", PRECISIONS)
def test_unscale_check_and_norm_are_one_launch(counts, precision):
    for step in counts[precision]["steps"]:
        assert step["optimizer"]["raw_kernels"] == {"unscale_check_norm": 1}, step["optimizer"]


@pytest.mark.parametrize("precision", PRECISIONS)
def test_half_gemms_go_to_cublas_with_fp32_accumulation(counts, precision):
    for step in counts[precision]["steps"]:
        fb = step["forward_backward"]
        assert fb["batched_half_matmuls"] == 0, fb
        # per layer: 4 Linear (qkv, proj, fc, fc2) and 2 attention GEMMs forward, twice that
        # backward; plus the head's 3: 21 cuBLAS calls for one layer — every half GEMM, so a
        # 2-D one slipping back to CuPy's own matmul shows as one fewer
        assert fb["cublas_gemms"] == 18 * 1 + 3, fb


@pytest.mark.parametrize("precision", PRECISIONS)
def test_no_activation_is_silently_upcast(counts, precision):
    for step in counts[precision]["steps"]:
        for span in ("forward_backward", "optimizer"):
            assert step[span]["upcasts"] == 0, step[span]["upcast_examples"]


CONTROLS = """
import json, numpy, cupy
from cupy import _counts
a = cupy.ones((4, 8, 8), dtype=numpy.float16)
checks = {}
m = _counts.mark(); a * numpy.float32(2); a * cupy.asarray(numpy.float32(2)); a * 2.0
a.astype(numpy.float32); a.sum(dtype=numpy.float32)
checks["upcasts"] = _counts.summary(since=m)["upcasts"]
m = _counts.mark(); a @ a; a[0] @ a[0]
checks["batched_half_matmuls"] = _counts.summary(since=m)["batched_half_matmuls"]
m = _counts.mark(); float(a.sum()); a.get(); bool(a.any()); cupy.cuda.get_current_stream().synchronize()
checks["syncs"], checks["d2h"] = _counts.summary(since=m)["syncs"], _counts.summary(since=m)["d2h"]
print(json.dumps(checks))
"""


def test_the_counters_see_what_they_count():
    """Positive controls, so that the zeros above mean something: a float32 scalar and a 0-d
    float32 array upcast an fp16 array (a Python float, ``astype`` and ``dtype=`` do not); a
    3-D fp16 matmul is CuPy's batched path (a 2-D one is not); ``float``, ``get``, ``bool``
    read the device and ``synchronize`` waits for it."""
    env = dict(os.environ, PYTHONPATH=os.pathsep.join([os.path.join(REPO, "tests", "fake_cupy"), REPO]))
    out = subprocess.run([sys.executable, "-c", CONTROLS], env=env, cwd=REPO, capture_output=True,
                         text=True, timeout=120)
    assert out.returncode == 0, out.stderr[-3000:]
    assert json.loads(out.stdout) == {"upcasts": 2, "batched_half_matmuls": 1, "syncs": 4, "d2h": 3}


def zero_counts(stage, n_layer):
    """count_gpu_step.py under ZeRO on 2 ranks (fake GPUs, CUDA-aware MPI stood in for, so
    that reads are the step's own, not the staging transport's), fp16: rank 0's record."""
    env = dict(MINIPAR_FAKE_CUPY_DEVICES="2", MINIPAR_CUDA_AWARE="1", MINIPAR_BACKEND="numpy",
               PYTHONPATH=os.pathsep.join([os.path.join(REPO, "tests", "fake_cupy"), REPO]))
    proc = run_mpi(2, [SCRIPT, "fp16", "--steps", "2", "--fused-kernels", "optimizer", "--zero", str(stage),
                       "--n-layer", str(n_layer), "--d-model", "16", "--seq-len", "16",
                       "--batch-size", "2", "--data", "stdlib-bytes"], env=env, timeout=300)
    return json.loads(proc.stdout.strip().splitlines()[0])


def test_zero_unscales_checks_and_squares_every_shard_in_one_launch(counts):
    """ZeRO-1's fp16 step: its shards' fp32 gradients are one buffer, so unscale, overflow
    check and squares are one launch (as DDP's), the step reads the device once, and the norm
    is the one-process DDP run's on the same global batch (fp16 gradients summed in another
    order: within fp16's rounding)."""
    zero = zero_counts(1, 1)
    for step in zero["steps"]:
        assert step["optimizer"]["raw_kernels"] == {"unscale_check_norm": 1}, step["optimizer"]
        assert step["optimizer"]["d2h"] == 1, step["optimizer"]
    ddp = counts["fp16"]["steps"][0]["norm"]
    assert abs(zero["steps"][0]["norm"] - ddp) <= 1e-3 * ddp, (zero["steps"][0]["norm"], ddp)


@pytest.mark.slow
@pytest.mark.parametrize("stage", [1, 2])
def test_zero_optimizer_launches_do_not_grow_with_the_parameters(stage):
    """One more layer (12 more parameters, in the same bucket): the same launches in the
    optimizer step — a cast, AdamW, a cast down and a gather per bucket, none per parameter
    (ZeRO-1 packed each gradient with a copy of its own: 62 launches, 74 with two layers)."""
    one, two = (zero_counts(stage, n)["steps"][-1]["optimizer"]["launches"] for n in (1, 2))
    assert one == two, (one, two)
