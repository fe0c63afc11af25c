"""The GPU-only Python paths, dry-run on the CPU: ``tests/test_flash_gpu.py`` and
``tests/test_gpu_backend.py`` (all but the long-sequence case, and the two largest float16
flash shapes: emulated half precision is slow, and ``test_flash_emulated.py`` already checks
those kernels at 256 × 256, d = 128; the launch path is the same at every shape) run in a subprocess with the
fake ``cupy`` of ``tests/fake_cupy`` first on PYTHONPATH, and must PASS — not skip.  By default
the float16 flash kernels run at one shape (1 × 1, the launch path); their three other shapes
(seconds each, emulated) are the ``slow`` part.

What a pass proves: every Python line those tests reach on a GPU — ``flash_cuda``'s launch
code through ``CupyKernels`` and ``cupy.RawModule``, the autograd Function, the flash
reference through ``xp``, the GPT forward/backward on the cupy backend, the train CLI on
cupy over 2 MPI ranks — runs without a Python error under the CuPy rules the fake models
(no implicit host/device conversion, no NumPy arrays in device operations, 0-d arrays
instead of scalars, ...); and the CUDA kernels, run by the CPU emulator (ASan/UBSan, launch
limits checked) through the very launch code a GPU run uses, match the float64 reference
within the GPU tests' own tolerances.

What it does not prove: anything about a real GPU — that NVRTC compiles the source
(``test_flash_compile.py`` checks that where NVRTC is installed), the hardware's rounding,
speed, memory use, streams and synchronisation, CUDA-aware MPI, or any CuPy behaviour the
fake does not model (its docstring lists them).
"""
import os
import re
import subprocess
import sys

import pytest

from minipar.kernels import emulator

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
FAKE_CUPY = os.path.join(REPO, "tests", "fake_cupy")
GPU_TESTS = ["tests/test_flash_gpu.py", "tests/test_gpu_backend.py"]


# -k selections of the two GPU test files: every case but the long sequence and the two largest
# float16 flash shapes, split so that the float16 kernels' larger shapes are left to the slow run
# (the fp32 kernel's four larger shapes too: test_flash_emulated.py runs them by default)
EVERY_CASE = "not long_sequence and not (float16 and (shape1 or shape2))"
FP16_SHAPES = "test_kernels_match_reference and float16 and (shape0 or shape4 or shape5)"
FP32_SHAPES = "test_kernels_match_reference and float32 and (shape0 or shape1 or shape2 or shape5)"
SELECTIONS = [  # (-k expression, the fewest that must pass)
    pytest.param(f"({EVERY_CASE}) and not ({FP16_SHAPES}) and not ({FP32_SHAPES})", 15, id="launch-paths"),
    pytest.param(FP16_SHAPES, 6, id="float16-shapes", marks=pytest.mark.slow),
    pytest.param(FP32_SHAPES, 8, id="float32-shapes", marks=pytest.mark.slow),
]


@pytest.mark.skipif(emulator.compiler() is None, reason="the CPU emulator needs a C++ compiler")
@pytest.mark.parametrize("selection,fewest", SELECTIONS)
def test_gpu_tests_pass_on_a_fake_cupy(selection, fewest):
    env = dict(os.environ, PYTHONPATH=os.pathsep.join([FAKE_CUPY, REPO]), OMP_NUM_THREADS="1")
    env.pop("MINIPAR_BACKEND", None)
    # fake_cupy_plugin keeps the fake on the path of the MPI ranks tests/mpirun.py starts
    cmd = [sys.executable, "-m", "pytest", "-q", "-rs", "-p", "fake_cupy_plugin", "-p", "no:cacheprovider",
           "-m", "slow or not slow", "-k", selection, *GPU_TESTS]
    proc = subprocess.run(cmd, cwd=REPO, env=env, capture_output=True, text=True, timeout=600)
    report = f"{' '.join(cmd)}\n--- stdout\n{proc.stdout[-8000:]}\n--- stderr\n{proc.stderr[-2000:]}"
    assert proc.returncode == 0, report
    summary = proc.stdout.strip().splitlines()[-1]
    counts = {kind: int(n) for n, kind in re.findall(r"(\d+) (\w+)", summary)}
    assert counts.get("passed", 0) >= fewest and set(counts) <= {"passed", "deselected"}, report
    assert "SKIPPED" not in proc.stdout, report
