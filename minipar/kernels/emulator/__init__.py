"""Run the CUDA kernels of this package on the CPU: a CUDA execution model for testing.

A GPU is not always at hand, and a kernel that compiles can still index the wrong
fragment, forget a ``__syncthreads`` or read past a tile.  This package runs the .cu
source itself on the CPU:

1. ``source`` rewrites the two things g++ cannot compile (inline PTX and
   ``extern __shared__``); everything else is the kernel's code as NVRTC sees it.
2. ``emulator.h`` supplies the hardware: one fiber per CUDA thread, ``__syncthreads``
   and warp-wide instructions as barriers (``mma.sync``, ``ldmatrix``, ``shfl`` computed
   from all 32 lanes' operands by the PTX ISA's fragment layouts), the launch limits.
3. g++ builds it under one of two checks:
   ``"memory"`` (AddressSanitizer + UBSan): buffers are exactly as large as the launch
   says, so an out-of-bounds or misaligned access stops the run;
   ``"race"`` (ThreadSanitizer): only what CUDA orders is ordered — __syncthreads within
   a block, nothing between blocks — so a missing barrier or a missing atomicAdd is
   reported, whichever order the threads happened to run in.
4. ``EmulatedKernels`` has the calling convention of ``cupy.RawKernel``, so
   ``flash_cuda.forward(q, k, v, kernels=EmulatedKernels())`` runs ``flash_cuda``'s own
   launch code, on NumPy arrays.

What it cannot show: speed, and the hardware's exact rounding of exp/log and of a
tensor core's accumulation.  It is slow (about 10^5 warp instructions per second), so
tests use small shapes.
"""
from __future__ import annotations

import functools
import hashlib
import os
import shutil
import subprocess
import tempfile
from pathlib import Path

import numpy as np

from minipar.kernels.emulator.source import emulated_source
from minipar.kernels.flash_cuda import KERNEL_DIR, compile_options, kernel_source, kind_of

EMULATOR_DIR = Path(__file__).resolve().parent  # the headers below; the generated C++ includes
HEADERS = ("emulator.h", "cuda_threads.h", "ptx.h", "async_copy.h", "main.h")  # them as "emulator/...", from -I KERNEL_DIR
COMMON_FLAGS = ["-std=c++17", "-O0", "-g", "-fno-strict-aliasing", "-Wno-unknown-pragmas",
                "-fno-omit-frame-pointer"]
CHECKS = {"memory": ["-fsanitize=address,undefined", "-fno-sanitize-recover=all"],
          "race": ["-fsanitize=thread"]}
SCHEDULES = ("lockstep", "greedy", "shuffled")
DEFAULT_SHARED_LIMIT = 48 * 1024  # bytes of dynamic shared memory without opting in
RUN_ENV = {"ASAN_OPTIONS": "detect_leaks=0", "TSAN_OPTIONS": "halt_on_error=1:exitcode=66:report_signal_unsafe=0"}


class EmulatorError(RuntimeError):
    """The kernel did something the hardware would not allow (message from the emulator)."""


@functools.lru_cache(maxsize=None)
def compiler():
    """The C++ compiler, if it can build a fiber program under both checks; else None
    (then the emulated tests are skipped: a machine without g++ or its sanitizer runtimes)."""
    cxx = shutil.which(os.environ.get("CXX", "g++"))
    if cxx is None:
        return None
    probe = "#include <ucontext.h>\nint main() { ucontext_t c; return getcontext(&c); }\n"
    with tempfile.TemporaryDirectory() as tmp:
        (Path(tmp) / "probe.cpp").write_text(probe)
        for flags in CHECKS.values():
            built = subprocess.run([cxx, *flags, "probe.cpp", "-o", "probe"], cwd=tmp, capture_output=True)
            ran = built.returncode == 0 and subprocess.run(["./probe"], cwd=tmp, capture_output=True).returncode == 0
            if not ran:
                return None
    return cxx


@functools.lru_cache(maxsize=None)
def _version(cxx):
    """The compiler's identity, part of every build's cache key (asked once per process)."""
    return subprocess.run([cxx, "--version"], capture_output=True, text=True).stdout


def cache_dir():
    root = os.environ.get("MINIPAR_CACHE") or os.path.join(Path.home(), ".cache", "minipar")
    return Path(root) / "cpu_emulator"


def build(cuda_source, head_dim, label="kernels", check="memory"):
    """Path of the emulator program for this CUDA source, head dim and check, built with
    the ``-D`` options NVRTC gets (``flash_cuda.compile_options``), once: cached by a hash
    of everything that goes into it, the compiler included."""
    if check not in CHECKS:
        raise ValueError(f"check must be one of {sorted(CHECKS)}, got {check!r}")
    cxx = compiler() or "g++"
    source = emulated_source(cuda_source)
    flags = COMMON_FLAGS + CHECKS[check] + [*compile_options(head_dim), f"-I{KERNEL_DIR}"]
    headers = [(EMULATOR_DIR / h).read_text() for h in HEADERS]
    key = hashlib.sha256("\0".join([source, _version(cxx), *flags, *headers]).encode()).hexdigest()[:16]
    exe = cache_dir() / f"{check}_d{head_dim}_{key}"  # by content: one build whatever the label
    if exe.exists():
        return exe
    exe.parent.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory(dir=exe.parent) as tmp:
        cpp = Path(tmp) / f"{label}.cpp"
        cpp.write_text(source)
        result = subprocess.run([cxx, *flags, str(cpp), "-o", str(Path(tmp) / "a.out")],
                                capture_output=True, text=True, cwd=KERNEL_DIR)  # reports name the real files
        if result.returncode != 0:
            raise EmulatorError(f"g++ failed on the emulated {label} source:\n{result.stderr[-4000:]}")
        os.replace(cpp, exe.with_suffix(".cpp"))  # kept beside the program, to read with its reports
        os.replace(Path(tmp) / "a.out", exe)  # atomic: concurrent builds never see half a file
    return exe


def _scalar_line(name, i, arg):
    """CuPy passes numpy.int32/float32 as 4-byte int/float, but a Python int as a long long
    and a Python float as a double: a kernel taking ``int``/``float`` would read garbage.
    So only the 4-byte numpy types are accepted."""
    if isinstance(arg, np.int32):
        return f"arg int32 {int(arg)}"
    if isinstance(arg, np.float32):
        return f"arg float32 {arg.view(np.uint32)}"
    raise TypeError(f"{name}: argument {i} is {type(arg).__name__}; pass numpy.int32 or numpy.float32 "
                    "(CuPy would pass it as a 64-bit value)")


class EmulatedKernel:
    """Callable like ``cupy.RawKernel``: ``kernel(grid, block, args, shared_mem=bytes)``.

    Like a CUDA function, it refuses more than 48 KiB of dynamic shared memory unless
    ``max_dynamic_shared_size_bytes`` was raised first.
    """

    def __init__(self, executable, name, schedule="lockstep", seed=0, fill=0xFF, timeout=300):
        if schedule not in SCHEDULES:
            raise ValueError(f"schedule must be one of {SCHEDULES}, got {schedule!r}")
        self.executable, self.name, self.timeout = executable, name, timeout
        self.schedule, self.seed, self.fill = schedule, seed, fill
        self.max_dynamic_shared_size_bytes = DEFAULT_SHARED_LIMIT

    def __call__(self, grid, block, args, shared_mem=0):
        grid, block = (tuple(grid) + (1, 1))[:3], (tuple(block) + (1, 1))[:3]
        with tempfile.TemporaryDirectory() as tmp:
            spec = [f"kernel {self.name}", "grid %d %d %d" % grid, "block %d %d %d" % block,
                    f"shared {int(shared_mem)}", f"shared_limit {int(self.max_dynamic_shared_size_bytes)}",
                    f"schedule {self.schedule} {int(self.seed)}", f"fill {int(self.fill)}"]
            arrays = []
            for i, arg in enumerate(args):
                if isinstance(arg, np.ndarray):
                    if not arg.flags.c_contiguous:
                        raise ValueError(f"{self.name}: argument {i} is not C-contiguous")
                    path = Path(tmp) / f"arg{i}.bin"
                    arg.tofile(path)
                    arrays.append((arg, path))
                    spec.append(f"arg pointer {path} {arg.nbytes}")
                else:
                    spec.append(_scalar_line(self.name, i, arg))
            (Path(tmp) / "launch.txt").write_text("\n".join(spec) + "\n")
            result = subprocess.run([str(self.executable), str(Path(tmp) / "launch.txt")], capture_output=True,
                                    text=True, timeout=self.timeout, env={**os.environ, **RUN_ENV})
            if result.returncode != 0:
                report = [line for line in (result.stderr + result.stdout).splitlines()
                          if "doesn't fully support makecontext" not in line]  # ASan's notice
                raise EmulatorError(f"{self.name} failed (exit {result.returncode}):\n" + "\n".join(report)[-6000:])
            for array, path in arrays:
                array[...] = np.fromfile(path, dtype=array.dtype).reshape(array.shape)


class EmulatedKernels:
    """What ``flash_cuda`` launches through: NumPy arrays, kernels run by the emulator.

    ``check``: "memory" (ASan/UBSan) or "race" (TSan).  ``schedule``: the order threads
    run in between barriers — "lockstep" (all warps together), "greedy" (the last warp
    first, each to the next __syncthreads), "shuffled" (warps in an order drawn from
    ``seed`` at every __syncthreads).  ``fill``: the byte fresh shared memory holds.
    ``sources`` maps "f32"/"f16"/"bf16" to CUDA text to run instead of the package's files
    (tests run deliberately broken kernels through it).
    """
    xp = np

    def __init__(self, check="memory", schedule="lockstep", seed=0, fill=0xFF, sources=None):
        self.check, self.sources = check, dict(sources or {})
        self.options = dict(schedule=schedule, seed=seed, fill=fill)

    def get(self, name, head_dim):
        kind = kind_of(name)
        source = self.sources.get(kind) or kernel_source(kind)
        return EmulatedKernel(build(source, head_dim, f"flash_{kind}", self.check), name, **self.options)

    @staticmethod
    def address(array):
        return array.ctypes.data
