"""CUDA C as C++ for the CPU emulator (``minipar.kernels.emulator``): the only rewriting it needs.

g++ can compile a kernel as it is once ``emulator.h`` defines the CUDA surface
(``threadIdx``, ``__syncthreads``, ``atomicAdd``...), except for two things:

- inline PTX: ``asm("cvt.rn.f16.f32 %0, %1;" : "=h"(h) : "f"(f))`` becomes
  ``emu::ptx("cvt.rn.f16.f32 %0, %1;", {emu::out('h', &(h)), emu::in('f', (f))})`` —
  the same template and GCC's operand numbering (outputs, then inputs), interpreted by
  ``ptx.h``;
- ``extern __shared__ T name[];`` becomes a pointer to the block's shared memory.

Then a launcher per ``extern "C" __global__`` kernel unpacks arguments from a
``void*`` array (as ``cuLaunchKernel`` does) and ``main.h`` adds ``main``.
"""
from __future__ import annotations

import re


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
        lines_kept = "\n" * source.count("\n", match.start(), end)  # so #line numbers stay right
        out.append(source[pos:match.start()] + f'emu::ptx("{template}", {{{operands}}})' + lines_kept)
        pos = end + 1
    return "".join(out) + source[pos:]


def kernels_of(source):
    """[(name, [(type, name), ...], launch bound or "0")] of every ``extern "C" __global__``
    function (the bound is the C expression in ``__launch_bounds__(...)``)."""
    found = []
    for match in re.finditer(r'extern\s+"C"\s+__global__\s+void\s+(?:__launch_bounds__\s*\(([^),]*)[^)]*\)\s*)?'
                             r'(\w+)\s*\(', source):
        params = source[match.end():_closing(source, match.end() - 1)]
        parsed = []
        for param in _split_top(params, ","):
            ptype, name = re.fullmatch(r"\s*(.*?)\s*(\w+)\s*", param, re.S).groups()
            parsed.append((" ".join(ptype.replace("__restrict__", "").split()), name))
        found.append((match.group(2), parsed, match.group(1) or "0"))
    return found


SCALARS = {"int": "i", "float": "f"}  # what a launch can pass besides pointers


def _launcher(kernels):
    """C++ that calls each kernel with arguments unpacked from ``void* args[]``, and the
    table main() looks kernels up in: name, launcher, parameter kinds, launch bound."""
    lines, table = [], []
    for name, params, bound in kernels:
        unpacked, letters = [], ""
        for i, (ptype, _) in enumerate(params):
            if "*" in ptype:
                unpacked.append(f"({ptype})(*(void**)a[{i}])")
                letters += "p"
            elif ptype in SCALARS:
                unpacked.append(f"*({ptype}*)a[{i}]")
                letters += SCALARS[ptype]
            else:
                raise ValueError(f"{name}: parameter type {ptype!r} is not supported (pointers, int, float)")
        lines.append(f"EMU_UNCHECKED static void run_{name}(void** a) {{ {name}({', '.join(unpacked)}); }}")
        table.append(f'{{"{name}", run_{name}, "{letters}", (unsigned)({bound})}}')
    lines.append('#include "emulator/main.h"')
    lines.append("const emu::Entry emu::entries[] = {" + ", ".join(table) + ", {nullptr, nullptr, nullptr, 0}};")
    return "\n".join(lines) + "\n"


def emulated_source(cuda_source):
    """CUDA C (its local includes pasted in, as ``flash_cuda.kernel_source`` gives it) as
    C++ for the emulator, with a launcher for every ``extern "C" __global__`` kernel."""
    source = re.sub(r"extern\s+__shared__\s+([\w ]+?)\s+(\w+)\s*\[\s*\]\s*;",
                    r"\1* \2 = (\1*)emu::dynamic_shared();", cuda_source)
    if "__shared__" in source:
        raise ValueError("static __shared__ arrays are not modelled; use dynamic shared memory")
    source = _rewrite_asm(source)
    return '#include "emulator/emulator.h"\n' + source + "\n" + _launcher(kernels_of(source))
