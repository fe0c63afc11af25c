"""Run the CUDA kernels of this package on the CPU: a CUDA execution model for testing.

A GPU is not always at hand, and a kernel that compiles can still index the wrong
fragment, forget a ``__syncthreads`` or read past a tile.  This module runs the .cu
source itself on the CPU:

1. ``emulated_source`` rewrites the few things g++ cannot compile: each inline-PTX
   ``asm(...)`` statement becomes ``emu::ptx("template", {operands})`` (same text, same
   operand numbering) and each ``extern __shared__`` array a pointer to the block's
   shared memory.  Everything else is the kernel's code as NVRTC sees it.
2. ``cpu_emulator.h`` supplies the hardware: one fiber per CUDA thread, ``__syncthreads``
   and warp-wide instructions as barriers (``mma.sync``, ``ldmatrix``, ``shfl`` computed
   from all 32 lanes' operands, by the PTX ISA's fragment layouts), see its header comment.
3. The program is built with g++ under AddressSanitizer and UBSan: buffers are exactly
   as large as the launch says, so any out-of-bounds or misaligned access stops the run.
4. ``EmulatedKernels`` has the calling convention of a ``cupy.RawKernel``, so
   ``flash_cuda.forward(q, k, v, kernels=EmulatedKernels())`` runs the launch code of
   ``flash_cuda`` unchanged, on NumPy arrays.

What it cannot show: speed, the GPU's memory model (fibers never run at the same time),
and the exact rounding of the hardware's exp/log and tensor-core accumulation order.
It is slow (~10^5 emulated warp instructions per second): tests use small shapes.
"""
from __future__ import annotations

import hashlib
import os
import re
import shutil
import subprocess
import tempfile
from pathlib import Path

import numpy as np

from minipar.kernels.flash_cuda import KERNEL_DIR, kernel_source

HEADERS = ("cpu_emulator.h", "cpu_emulator_ptx.h")
FLAGS = ["-std=c++17", "-O1", "-g", "-fno-strict-aliasing", "-Wno-unknown-pragmas",
         "-fsanitize=address,undefined", "-fno-sanitize-recover=all", "-fno-omit-frame-pointer"]


class EmulatorError(RuntimeError):
    """The kernel did something the hardware would not allow (message from the emulator)."""


def compiler():
    """The C++ compiler, or None (then the emulated tests are skipped)."""
    return shutil.which(os.environ.get("CXX", "g++"))


def _closing(text, start, open_char="(", close_char=")"):
    """Index of the bracket closing the one at ``start``, skipping string literals."""
    depth, i = 0, start
    while i < len(text):
        ch = text[i]
        if ch == '"':
            i = text.index('"', i + 1)
        elif ch == open_char:
            depth += 1
        elif ch == close_char:
            depth -= 1
            if depth == 0:
                return i
        i += 1
    raise ValueError(f"unbalanced {open_char!r} at {start}")


def _split_top(text, sep):
    """Split at ``sep`` outside parentheses and string literals."""
    parts, depth, current, in_string = [], 0, "", False
    for ch in text:
        in_string ^= ch == '"'
        if not in_string:
            depth += (ch == "(") - (ch == ")")
        if ch == sep and depth == 0 and not in_string:
            parts.append(current)
            current = ""
        else:
            current += ch
    return parts + [current]


def _operand(spec):
    """``"+f"(c[0])`` -> ``emu::inout('f', &(c[0]))``."""
    match = re.fullmatch(r'\s*"([=+]?)(\w)"\s*\((.*)\)\s*', spec, re.S)
    if not match:
        raise ValueError(f"asm operand not understood: {spec!r}")
    mode, kind, expr = match.groups()
    if mode == "=":
        return f"emu::out('{kind}', &({expr}))"
    if mode == "+":
        return f"emu::inout('{kind}', &({expr}))"
    return f"emu::in('{kind}', ({expr}))"


def _rewrite_asm(source):
    out, pos = [], 0
    for match in re.finditer(r"\basm\s*(?:volatile\s*)?\(", source):
        if match.start() < pos:
            continue
        end = _closing(source, match.end() - 1)
        sections = _split_top(source[match.end():end], ":")
        template = "".join(re.findall(r'"((?:[^"\\]|\\.)*)"', sections[0]))
        outputs = [s for s in _split_top(sections[1], ",") if s.strip()] if len(sections) > 1 else []
        inputs = [s for s in _split_top(sections[2], ",") if s.strip()] if len(sections) > 2 else []
        operands = ", ".join(_operand(s) for s in outputs + inputs)
        out.append(source[pos:match.start()] + f'emu::ptx("{template}", {{{operands}}})')
        pos = end + 1
    return "".join(out) + source[pos:]


def _kernels(source):
    """[(name, [(type, name), ...])] of every ``extern "C" __global__`` function."""
    found = []
    for match in re.finditer(r'extern\s+"C"\s+__global__\s+void\s+(?:__launch_bounds__\s*\([^)]*\)\s*)?(\w+)\s*\(',
                             source):
        params = source[match.end():_closing(source, match.end() - 1)]
        parsed = []
        for param in _split_top(params, ","):
            ptype, name = re.fullmatch(r"\s*(.*?)\s*(\w+)\s*", param, re.S).groups()
            parsed.append((" ".join(ptype.replace("__restrict__", "").split()), name))
        found.append((match.group(1), parsed))
    return found


def _launcher(kernels):
    """C++ that calls each kernel with arguments unpacked from ``void* args[]``."""
    lines, table = [], []
    for name, params in kernels:
        unpacked = []
        for i, (ptype, _) in enumerate(params):
            if "*" in ptype:
                unpacked.append(f"({ptype})(*(void**)a[{i}])")
            elif ptype in ("int", "float", "unsigned", "long long"):
                unpacked.append(f"*({ptype}*)a[{i}]")
            else:
                raise ValueError(f"{name}: parameter type {ptype!r} is not supported")
        lines.append(f"static void run_{name}(void** a) {{ {name}({', '.join(unpacked)}); }}")
        table.append(f'{{"{name}", run_{name}, "{"".join("p" if "*" in t else t[0] for t, _ in params)}"}}')
    lines.append("#include \"cpu_emulator_main.h\"")
    lines.append("const emu::Entry emu::entries[] = {" + ", ".join(table) + ", {nullptr, nullptr, nullptr}};")
    return "\n".join(lines) + "\n"


def emulated_source(cuda_source):
    """CUDA C (its local includes pasted in, as ``flash_cuda.kernel_source`` gives it) as
    C++ for the emulator, with a launcher for every ``extern "C" __global__`` kernel."""
    source = re.sub(r"extern\s+__shared__\s+([\w ]+?)\s+(\w+)\s*\[\s*\]\s*;",
                    r"\1* \2 = (\1*)emu::dynamic_shared();", cuda_source)
    if "__shared__" in source:
        raise ValueError("static __shared__ arrays are not modelled; use dynamic shared memory")
    source = _rewrite_asm(source)
    return '#include "cpu_emulator.h"\n' + source + "\n" + _launcher(_kernels(source))


def cache_dir():
    root = os.environ.get("MINIPAR_CACHE") or os.path.join(Path.home(), ".cache", "minipar")
    return Path(root) / "cpu_emulator"


def build(cuda_source, head_dim, label="kernels"):
    """Path of the emulator program for this CUDA source and ``-DHEAD_DIM`` (built once,
    cached by a hash of everything that goes into it)."""
    source = emulated_source(cuda_source)
    key = hashlib.sha256("\0".join([source, *FLAGS, str(head_dim)] +
                                   [(KERNEL_DIR / h).read_text() for h in HEADERS + ("cpu_emulator_main.h",)])
                         .encode()).hexdigest()[:16]
    exe = cache_dir() / f"{label}_d{head_dim}_{key}"
    if exe.exists():
        return exe
    exe.parent.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory(dir=exe.parent) as tmp:
        cpp = Path(tmp) / f"{label}.cpp"
        cpp.write_text(source)
        result = subprocess.run([compiler() or "g++", *FLAGS, f"-DHEAD_DIM={head_dim}", f"-I{KERNEL_DIR}",
                                 str(cpp), "-o", str(Path(tmp) / "a.out")], capture_output=True, text=True)
        if result.returncode != 0:
            raise EmulatorError(f"g++ failed on the emulated {label} source:\n{result.stderr[-4000:]}")
        os.replace(Path(tmp) / "a.out", exe)  # atomic: concurrent builds never see half a file
    return exe


class EmulatedKernel:
    """Callable like ``cupy.RawKernel``: ``kernel(grid, block, args, shared_mem=bytes)``."""

    def __init__(self, executable, name, order=0):
        self.executable, self.name, self.order = executable, name, order

    def __call__(self, grid, block, args, shared_mem=0):
        grid, block = (tuple(grid) + (1, 1))[:3], (tuple(block) + (1, 1))[:3]
        with tempfile.TemporaryDirectory() as tmp:
            spec = [f"kernel {self.name}", "grid %d %d %d" % grid, "block %d %d %d" % block,
                    f"shared {int(shared_mem)}", f"order {self.order}"]
            arrays = []
            for i, arg in enumerate(args):
                if isinstance(arg, np.ndarray):
                    if not arg.flags.c_contiguous:
                        raise ValueError(f"{self.name}: argument {i} is not C-contiguous")
                    path = Path(tmp) / f"arg{i}.bin"
                    arg.tofile(path)
                    arrays.append((arg, path))
                    spec.append(f"arg pointer {path} {arg.nbytes}")
                elif isinstance(arg, (np.integer, int)):
                    spec.append(f"arg int {int(arg)}")
                elif isinstance(arg, (np.floating, float)):
                    spec.append(f"arg float {np.float32(arg).view(np.uint32)}")
                else:
                    raise TypeError(f"{self.name}: argument {i} of type {type(arg).__name__}")
            (Path(tmp) / "launch.txt").write_text("\n".join(spec) + "\n")
            env = dict(os.environ, ASAN_OPTIONS="detect_leaks=0:abort_on_error=0")
            result = subprocess.run([str(self.executable), str(Path(tmp) / "launch.txt")],
                                    capture_output=True, text=True, timeout=600, env=env)
            if result.returncode != 0:
                report = [line for line in (result.stderr + result.stdout).splitlines()
                          if "doesn't fully support makecontext" not in line]  # ASan's notice
                raise EmulatorError(f"{self.name} failed (exit {result.returncode}):\n" +
                                    "\n".join(report)[-6000:])
            for array, path in arrays:
                array[...] = np.fromfile(path, dtype=array.dtype).reshape(array.shape)


class EmulatedKernels:
    """What ``flash_cuda`` launches through: NumPy arrays, kernels run by the emulator.

    ``order`` picks the schedule of the threads (0 lockstep, 1 greedy from the last warp,
    2+ random, see ``cpu_emulator.h``): a race between warps shows up as results that
    depend on it.  ``sources`` maps "f32"/"f16" to CUDA text to run instead of the
    package's files (tests run deliberately broken kernels through it).
    """
    xp = np

    def __init__(self, order=0, sources=None):
        self.order, self.sources = order, dict(sources or {})

    def get(self, name, head_dim):
        kind = name.rsplit("_", 1)[1]
        source = self.sources.get(kind) or kernel_source(kind)
        return EmulatedKernel(build(source, head_dim, f"flash_{kind}"), name, self.order)

    @staticmethod
    def address(array):
        return array.ctypes.data
