"""The fused elementwise kernels compile: ``nvcc -cubin`` for Ampere (sm_80) and Hopper
(sm_90), and NVRTC — the compiler CuPy uses — with CuPy's options.

Runs where nvcc (or CuPy's NVRTC) exists, GPU or not (skipped elsewhere).  The source is
compiled as ``fused_cuda`` hands it to NVRTC (``kernel_source``: one build per storage
type, chosen by the #define line before the file), with warnings as errors, and ptxas
must not spill registers to local memory.  One nvcc at a time (a few seconds in all).
"""
import itertools
import re
import shutil
import subprocess

import pytest

from minipar.kernels.fused_cuda import KINDS, SOURCE, kernel_source
from tests.test_flash_compile import nvrtc_or_none

NVCC = shutil.which("nvcc")
needs_nvcc = pytest.mark.skipif(NVCC is None, reason="nvcc not found")
BUILDS = list(itertools.product(sorted(KINDS.values()), ["sm_80", "sm_90"]))
KERNELS = ["layernorm_forward", "layernorm_backward", "gelu_forward", "gelu_backward",
           "softmax_forward", "softmax_backward", "adamw_update", "unscale_check",
           "unscale_check_norm"]


def nvcc_cubin(source_path, arch, out_path):
    return subprocess.run(
        [NVCC, f"-arch={arch}", "-cubin", "-Werror", "all-warnings", "-Xptxas", "-v",
         "-o", str(out_path), str(source_path)],
        stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, timeout=120)


@pytest.fixture(scope="module")
def builds(tmp_path_factory):
    tmp = tmp_path_factory.mktemp("fused_cubin")
    results = {}
    for kind, arch in BUILDS:
        source = tmp / f"fused_{kind}.cu"
        source.write_text(kernel_source(kind))
        cubin = tmp / f"fused_{kind}_{arch}.cubin"
        proc = nvcc_cubin(source, arch, cubin)
        results[kind, arch] = (proc.returncode, proc.stdout, cubin)
    return results


@needs_nvcc
@pytest.mark.parametrize("build", BUILDS, ids=lambda b: "%s-%s" % b)
def test_kernels_compile_without_spills(builds, build):
    returncode, output, cubin = builds[build]
    assert returncode == 0, output
    assert cubin.stat().st_size > 0
    for name in KERNELS:  # every kernel is in the binary, under its extern "C" name
        assert re.search(rf"Compiling entry function '{name}'", output), (name, output)
    spills = [int(n) for n in re.findall(r"(\d+) bytes spill (?:stores|loads)", output)]
    assert len(spills) == 2 * len(KERNELS) and not any(spills), output


@needs_nvcc
def test_source_without_a_storage_type_is_refused(tmp_path):
    source = tmp_path / "plain.cu"
    source.write_text(SOURCE.read_text())
    proc = nvcc_cubin(source, "sm_90", tmp_path / "x.cubin")
    assert proc.returncode != 0 and "define exactly one of STORAGE_F32" in proc.stdout


@pytest.mark.skipif(nvrtc_or_none() is None, reason="CuPy's NVRTC not available")
@pytest.mark.parametrize("arch", ["sm_80", "sm_90"])
@pytest.mark.parametrize("kind", sorted(KINDS.values()))
def test_kernels_compile_with_nvrtc_as_cupy_does(kind, arch):
    """The source as ``cupy.RawModule`` hands it to NVRTC: no include path, no options
    but CuPy's own ``--device-as-default-execution-space``."""
    nvrtc = nvrtc_or_none()
    program = nvrtc.createProgram(kernel_source(kind), "fused.cu", [], [])
    try:
        nvrtc.compileProgram(program, [f"-arch={arch}", "--device-as-default-execution-space"])
    except Exception as error:
        raise AssertionError(nvrtc.getProgramLog(program)) from error
    assert len(nvrtc.getCUBIN(program)) > 0
