"""The CUDA sources compile: ``nvcc -cubin`` for Ampere (sm_80) and Hopper (sm_90), and
NVRTC — the compiler CuPy actually uses — with CuPy's options.

Runs where nvcc (or CuPy's NVRTC) exists, GPU or not (skipped elsewhere).  The kernels are compiled the
way ``flash_cuda`` has NVRTC compile them — one build per head dim, ``nvrtc_options(kind, d)`` —
with warnings as errors, and ptxas must not spill registers to local memory.  The f16
source is compiled as NVRTC receives it (``kernel_source``: its header pasted in).
All builds run at once, so the check takes a few seconds of wall time.
"""
import itertools
import re
import shutil
import subprocess

import pytest

from minipar.kernels.flash_cuda import compile_options, kernel_source, nvrtc_options

NVCC = shutil.which("nvcc")
needs_nvcc = pytest.mark.skipif(NVCC is None, reason="nvcc not found")
BUILDS = list(itertools.product(["f32", "f16"], ["sm_80", "sm_90"], [64, 128]))


def nvcc_cubin(source_path, kind, arch, head_dim, out_path):
    return subprocess.Popen(
        [NVCC, f"-arch={arch}", "-cubin", *nvrtc_options(kind, head_dim), "-Werror", "all-warnings",
         "-Xptxas", "-v", "-o", str(out_path), str(source_path)],
        stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)


@pytest.fixture(scope="module")
def builds(tmp_path_factory, request):
    """The selected builds, compiled at once (nvcc in parallel)."""
    tmp = tmp_path_factory.mktemp("cubin")
    sources = {}
    for kind in ("f32", "f16"):
        sources[kind] = tmp / f"flash_{kind}.cu"
        sources[kind].write_text(kernel_source(kind))
    selected = {item.callspec.params["build"] for item in request.session.items
                if item.module is request.module and hasattr(item, "callspec") and "build" in item.callspec.params}
    running = {b: nvcc_cubin(sources[b[0]], b[0], b[1], b[2], tmp / ("%s_%s_%d.cubin" % b)) for b in selected}
    results = {}
    for build, proc in running.items():
        output, _ = proc.communicate(timeout=120)
        results[build] = (proc.returncode, output, tmp / ("%s_%s_%d.cubin" % build))
    return results


@needs_nvcc
@pytest.mark.parametrize("build", [pytest.param(b, marks=[pytest.mark.slow] if b[1] == "sm_80" else [])
                                   for b in BUILDS], ids=lambda b: "%s-%s-d%d" % b)   # sm_80: slow run
def test_kernels_compile_without_spills(builds, build):
    returncode, output, cubin = builds[build]
    assert returncode == 0, output
    assert cubin.stat().st_size > 0
    spills = [int(n) for n in re.findall(r"(\d+) bytes spill (?:stores|loads)", output)]
    assert spills and not any(spills), output


@needs_nvcc
def test_tensor_core_kernel_rejects_unsupported_head_dim(tmp_path):
    source = tmp_path / "f16.cu"
    source.write_text(kernel_source("f16"))
    output, _ = nvcc_cubin(source, "f16", "sm_90", 16, tmp_path / "x.cubin").communicate(timeout=120)
    assert "HEAD_DIM must be" in output


@needs_nvcc
def test_tensor_core_kernel_refuses_a_build_without_its_key_tile(tmp_path):
    """The forward's key tile comes from ``compile_options``; a build given only HEAD_DIM
    stops with a message naming it, rather than picking a tile the launch does not size."""
    source = tmp_path / "f16.cu"
    source.write_text(kernel_source("f16"))
    built = subprocess.run([NVCC, "-arch=sm_90", "-cubin", "-DHEAD_DIM=64", "-o", str(tmp_path / "x.cubin"), str(source)],
                           capture_output=True, text=True, timeout=120)
    assert built.returncode != 0 and "TC_FWD_BLOCK_K is not defined" in built.stderr, built.stderr


def nvrtc_or_none():
    """CuPy's binding of NVRTC (needs cupy and the NVRTC library, not a GPU)."""
    try:
        from cupy_backends.cuda.libs import nvrtc
        nvrtc.getVersion()
        return nvrtc
    except Exception:  # cupy missing, or its NVRTC library missing
        return None


@pytest.mark.skipif(nvrtc_or_none() is None, reason="CuPy's NVRTC not available")
@pytest.mark.parametrize("arch", ["sm_80", "sm_90"])
@pytest.mark.parametrize("head_dim", [32, 64, 96, 128])
@pytest.mark.parametrize("kind", ["f32", "f16"])
def test_kernels_compile_with_nvrtc_as_cupy_does(kind, head_dim, arch):
    """The source as ``cupy.RawModule`` hands it to NVRTC: no include path, CuPy's
    ``--device-as-default-execution-space``, one build per head dim."""
    nvrtc = nvrtc_or_none()
    program = nvrtc.createProgram(kernel_source(kind), "kern.cu", [], [])
    try:
        nvrtc.compileProgram(program, [*compile_options(head_dim), f"-arch={arch}",
                                       "--device-as-default-execution-space"])
    except Exception as error:
        raise AssertionError(nvrtc.getProgramLog(program)) from error
    assert len(nvrtc.getCUBIN(program)) > 0
