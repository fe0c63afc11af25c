#!/usr/bin/env python3
"""Every check a lent GPU is for, in one run of at most 8 minutes.

    python3 benchmarks/gpu_check.py                 # on the GPU machine, from the checkout
    python3 benchmarks/gpu_check.py --wheels .whl   # first install the wheels carried there (mpich)
    python3 benchmarks/gpu_check.py --dry-run       # on a CPU, CuPy faked by tests/fake_cupy

A GPU session is short and may be cut off, so the run is built to bring back what it got:

- **Prerequisites first.**  In the first seconds one child process checks Python, NumPy,
  CuPy with a visible GPU, an MPI runtime that mpi4py can load, ``mpiexec``, minipar's own
  imports (optional: PyTorch with CUDA, ml_dtypes for bf16); a missing one stops the run
  with one line saying what to bring.  Nothing is fetched from a registry: wheels carried
  in the checkout (``--wheels DIR``, an ignored folder) are installed into a scratch prefix.
- **Each figure is a JSON row the moment it is measured**, appended to ``rows.jsonl``
  (one line, closed at once: a kill loses only the figure being measured) and printed,
  unbuffered.  minipar and PyTorch rows alternate (one precision or shape at a time),
  each pair followed by its ratio row.  Every child process's output is kept in
  ``log.txt``.  The folder (``$OUT``, else ``--out``, else runs/gpu_check) gets these two
  files and nothing else.
- **A time budget** (``--budget``, 470 s) split over the sections below; a section that
  runs out is stopped and its rows so far stay, a section with no time left writes one row
  saying so.

Sections, in this order (``--sections`` picks some):

    tests       the GPU tests: the kernels against the float64 reference, the GPT and
                the trainer on CuPy against NumPy (tests/test_flash_gpu.py, ...)
    flash       flash attention fp16 and bf16 forward and backward against the float64
                reference and against PyTorch's SDPA, each with its threshold
    throughput  ``minipar train --backend cupy`` tokens/s against PyTorch eager with
                autocast, fp32 / fp16 / bf16, on the GPT-2-small shape; both sides use the
                same attention: flash where minipar has a tensor-core kernel for the
                precision (SDPA on PyTorch's side), else naive on both; fp32 with TF32 off
                on both sides (NVIDIA_TF32_OVERRIDE=0, torch's allow_tf32 False)
    attention   flash fp16 and bf16 forward and backward against SDPA (flash backend),
                causal, d = 64 and 128, N = 1K..8K at B·N = 16K tokens, H·d = 2048; then
                grouped-query attention (4 query heads per K/V head, K/V read in place)
                against SDPA with enable_gqa
    syncs       host syncs, device->host reads and kernel launches per training step,
                counted on the GPU (CUPTI through torch.profiler; the fake's counters in
                a dry run): tests/scripts/count_gpu_step.py
    transport   2 ranks sharing the one GPU: an all-reduce through each of the comm
                package's device transports (pageable and staging host copies, CUDA-aware
                MPI where MPI says it is): correct sums and bytes/s; NCCL needs 2 GPUs
                (NCCL refuses two ranks on one device) and says so where there is one

A feature not built yet (a bf16 flash kernel, the device transports) is detected, not
assumed: its rows say "not built".  ``--dry-run`` runs every section on the fake
CuPy (tests/test_gpu_checks_dry_run.py): tiny shapes, the same code paths and the same
kernel choices (the CUDA kernels run through the CPU emulator), PyTorch's rows marked
not measured.  Its figures mean nothing; what it proves is that the run's plumbing works.
"""
from __future__ import annotations

import argparse
import json
import os
import re
import shutil
import signal
import subprocess
import sys
import tempfile
import threading
import time

HERE = os.path.dirname(os.path.abspath(__file__))
REPO = os.path.dirname(HERE)
FAKE_CUPY = os.path.join(REPO, "tests", "fake_cupy")
ROWS, LOG = "rows.jsonl", "log.txt"
SECTIONS = ("tests", "flash", "throughput", "attention", "syncs", "transport")

# seconds each section may take on the GPU; with the prerequisites they fit in 470 s
LIMITS = {"tests": 100, "flash": 45, "throughput": 170, "attention": 60, "syncs": 35,
          "transport": 30}
# what each run measures: the GPU's sizes, and the dry run's (on the CPU emulator)
FULL = dict(
    tests=["tests/test_flash_gpu.py", "tests/test_gpu_backend.py", "tests/test_fused_gpu.py"],
    flash=dict(batch=2, heads=8, n=1024, head_dims=[64, 128]),
    throughput=dict(layers=12, d_model=768, heads=12, seq=1024, batch=8, steps=12, warmup=4),
    attention=dict(sizes=[1024, 2048, 4096, 8192], head_dims=[64, 128], tokens=16384,
                   width=2048, repeats=5, gqa=dict(batch=4, heads=16, group=4, n=4096, d=128)),
    syncs=["--n-layer", "2", "--d-model", "128", "--seq-len", "128", "--batch-size", "4",
           "--steps", "3", "--data", "stdlib-bytes"],
    transport=dict(mib=64, repeats=5))
DRY = dict(
    tests=["tests/test_flash_gpu.py", "tests/test_gpu_backend.py", "tests/test_fused_gpu.py"],
    flash=dict(batch=1, heads=1, n=64, head_dims=[64]),
    throughput=dict(layers=1, d_model=16, heads=2, seq=16, batch=2, steps=3, warmup=1),
    attention=dict(sizes=[], head_dims=[64], tokens=64, width=64, repeats=1,   # the flash
                   gqa=dict(batch=1, heads=2, group=2, n=64, d=64)),   # section ran d 64, N 64
    syncs=["--n-layer", "1", "--d-model", "16", "--seq-len", "16", "--batch-size", "2",
           "--steps", "2", "--fused-kernels", "optimizer", "--data", "stdlib-bytes"],
    transport=dict(mib=1, repeats=2))
SYNC_PRECISIONS = {"gpu": ("fp16", "bf16"), "dry": ("fp16",)}
DRY_SLOWER = 4          # the dry run's time limits: the GPU's times this (CPU emulator, shared CPUs)
# flash against float64: normwise error max|a - b| / max(max|b|, 1) (tests/tolerance.py);
# fp16 as tests/test_flash_gpu.py, bf16 8x looser (7 stored mantissa bits against 10)
FLASH_THRESHOLD = {"fp16": (2e-3, 4e-3), "bf16": (1.6e-2, 3.2e-2)}   # (forward, gradients)
HALF = {"fp16": "float16", "bf16": "bfloat16"}


# ------------------------------------------------------------------------ rows
def emit(section, **fields):
    """One figure: a JSON line appended to the rows file (opened and closed, so it is on
    disk at once) and printed as ``ROW {...}`` for the parent to read."""
    row = {"section": section, **fields,
           "t": round(time.time() - float(os.environ.get("GPU_CHECK_T0", time.time())), 1)}
    path = os.environ.get("GPU_CHECK_ROWS")
    if path:
        with open(path, "a") as f:
            f.write(json.dumps(row) + "\n")
    print("ROW " + json.dumps(row), flush=True)
    return row


def normwise(a, b):
    """max|a - b| / max(max|b|, 1), both widened to float64 on their device."""
    a, b = a.astype("float64"), b.astype("float64")
    return float(abs(a - b).max() / max(float(abs(b).max()), 1.0))


# ------------------------------------------------------------------------ children
def child_prerequisites(dry_run):
    """Print one JSON object: what is there and what is missing (``missing``: the lines
    that stop the run)."""
    found, missing = {"python": sys.version.split()[0]}, []
    if sys.version_info < (3, 10):
        missing.append(f"Python {found['python']}: minipar needs 3.10 or later")
    try:
        import numpy
        found["numpy"] = numpy.__version__
    except ImportError:
        missing.append("NumPy is not installed")
    try:
        import cupy
        found["cupy"] = cupy.__version__
        found["gpus"] = cupy.cuda.runtime.getDeviceCount()
        if found["gpus"] < 1:
            missing.append("CuPy sees no GPU")
        else:
            props = cupy.cuda.runtime.getDeviceProperties(0)
            found["gpu"] = props["name"].decode() if isinstance(props["name"], bytes) else props["name"]
            version = getattr(cupy.cuda.runtime, "runtimeGetVersion", None)
            found["cuda_runtime"] = version() if version else None
    except Exception as err:   # not installed, or no driver
        missing.append(f"CuPy with a GPU: {type(err).__name__}: {err}".splitlines()[0][:200]
                       + " (pip install cupy-cuda12x or cupy-cuda13x, matching the driver's CUDA)")
    try:
        from mpi4py import MPI
        found["mpi"] = MPI.Get_library_version().splitlines()[0].strip()
    except Exception as err:   # mpi4py without an MPI library to load
        missing.append(f"no MPI runtime for mpi4py ({type(err).__name__}: {str(err)[:120]}): "
                       "carry the mpich wheel and pass --wheels (docs/gpu.md)")
    launcher = shutil.which("mpiexec", path=os.environ.get("PATH", ""))
    found["mpiexec"] = launcher
    if launcher is None:
        missing.append("no mpiexec on PATH: carry the mpich wheel and pass --wheels (docs/gpu.md)")
    if not missing:
        try:
            import minipar.train  # noqa: F401   (numpy, regex, tqdm, threadpoolctl, numba, mpi4py)
        except Exception as err:
            missing.append(f"minipar does not import: {type(err).__name__}: {err}"[:240])
    found["mpi_cuda_aware"], found["transports"] = comm_transports() if not missing else (None, None)
    try:
        import ml_dtypes  # noqa: F401
        found["bf16"] = True
    except ImportError:
        found["bf16"] = False      # bf16 rows say so; not a stop
    # a dry run measures no PyTorch row (no CUDA on a CPU): not even imported, to be quick
    found["torch"] = "not measured: a dry run" if dry_run else torch_status()
    found["dry_run"] = dry_run
    print(json.dumps({"found": found, "missing": missing}), flush=True)


def torch_status():
    """PyTorch's version with CUDA, or why its rows will not be measured (as the
    prerequisites found it, passed on in GPU_CHECK_TORCH: a child need not import it)."""
    if os.environ.get("GPU_CHECK_TORCH"):
        return os.environ["GPU_CHECK_TORCH"]
    try:
        import torch
    except Exception as err:
        return f"not measured: PyTorch does not import ({type(err).__name__})"
    if not torch.cuda.is_available():
        return f"not measured: PyTorch {torch.__version__} has no CUDA here"
    return torch.__version__


def comm_transports():
    """(what MPI says of CUDA buffers, the device transports minipar's comm package has), as
    the package itself answers (``comm/cuda_aware.py``, ``comm/device_paths.py``); (None,
    None) where it has no such modules: the transports are not built."""
    try:
        from minipar.comm.cuda_aware import mpi_says_cuda_aware
        from minipar.comm.device_paths import TRANSPORTS
    except ImportError:
        return None, None
    return mpi_says_cuda_aware(), [t for t in TRANSPORTS if t != "auto"]


def child_flash(sizes):
    """Flash fp16 and bf16, forward and gradients, against float64 and against SDPA."""
    import cupy
    import numpy
    from minipar import backend
    from minipar.kernels import flash_cuda
    from minipar.kernels.flash_reference import flash_backward_reference, flash_forward_reference
    backend.set_backend("cupy")
    torch = torch_cuda()
    rng = numpy.random.default_rng(0)
    b, h, n = sizes["batch"], sizes["heads"], sizes["n"]
    for precision, dtype in HALF.items():
        for d in sizes["head_dims"]:
            if not flash_cuda.supports(dtype, d):
                emit("flash", precision=precision, d=d, status="not built: no flash kernel for "
                     f"{dtype} at d={d} (flash_cuda.supports)")
                continue
            try:
                import ml_dtypes  # noqa: F401  (numpy's bfloat16)
                q, k, v, g = (cupy.asarray(rng.standard_normal((b, h, n, d)).astype(numpy.float32))
                              .astype(numpy.dtype(dtype)) for _ in range(4))
                out, lse = flash_cuda.forward(q, k, v, True)
                grads = flash_cuda.backward(q, k, v, out, lse, g, True)
                wide = [a.astype(numpy.float64) for a in (q, k, v, g)]
                ref_out, ref_lse = flash_forward_reference(*wide[:3], True)
                ref_grads = flash_backward_reference(*wide[:3], ref_out, ref_lse, wide[3], True)
                fwd_limit, bwd_limit = FLASH_THRESHOLD[precision]
                row = dict(precision=precision, d=d, n=n, causal=True,
                           forward_vs_fp64=normwise(out, ref_out),
                           grads_vs_fp64=max(normwise(a, r) for a, r in zip(grads, ref_grads)),
                           forward_threshold=fwd_limit, grads_threshold=bwd_limit)
                ok = row["forward_vs_fp64"] <= fwd_limit and row["grads_vs_fp64"] <= bwd_limit
                if torch is None:
                    row["sdpa"] = torch_status()
                else:
                    sdpa_out, sdpa_grads = sdpa_forward_backward(torch, q, k, v, g)
                    row["forward_vs_sdpa"] = normwise(out, sdpa_out)
                    row["grads_vs_sdpa"] = max(normwise(a, r) for a, r in zip(grads, sdpa_grads))
                    # two roundings of the same sums: each within its threshold of float64
                    ok = ok and row["forward_vs_sdpa"] <= 2 * fwd_limit and row["grads_vs_sdpa"] <= 2 * bwd_limit
                emit("flash", ok=ok, **row)
            except Exception as err:   # one failing shape must not hide the others
                emit("flash", precision=precision, d=d, ok=False, error=f"{type(err).__name__}: {err}"[:300])


def torch_cuda():
    """torch, with TF32 off, when it has CUDA here; else None."""
    if torch_status().startswith("not measured"):
        return None
    try:
        import torch
    except Exception:
        return None
    if not torch.cuda.is_available():
        return None
    torch.backends.cuda.matmul.allow_tf32 = False
    torch.backends.cudnn.allow_tf32 = False
    return torch


def to_torch(torch, a):
    """A CuPy array as a torch tensor on the same memory.  Through 16-bit integers: neither
    side's __cuda_array_interface__ takes bfloat16."""
    import cupy
    if a.dtype.itemsize == 2:
        half = torch.float16 if a.dtype == cupy.float16 else torch.bfloat16
        return torch.as_tensor(a.view(cupy.int16), device="cuda").view(half)
    return torch.as_tensor(a, device="cuda")


def from_torch(torch, t, dtype):
    """A torch tensor as a CuPy array of ``dtype`` on the same memory (as ``to_torch``)."""
    import cupy
    return cupy.asarray(t.detach().view(torch.int16)).view(dtype)


def sdpa_forward_backward(torch, q, k, v, g):
    """PyTorch's SDPA (its flash backend) on the same device arrays; (out, (dq, dk, dv)) as
    CuPy arrays."""
    import torch.nn.functional as F
    from torch.nn.attention import SDPBackend, sdpa_kernel
    tq, tk, tv = (to_torch(torch, a).requires_grad_(True) for a in (q, k, v))
    with sdpa_kernel([SDPBackend.FLASH_ATTENTION]):
        out = F.scaled_dot_product_attention(tq, tk, tv, is_causal=True)
    grads = torch.autograd.grad(out, (tq, tk, tv), to_torch(torch, g))
    return from_torch(torch, out, q.dtype), tuple(from_torch(torch, t, q.dtype) for t in grads)


def child_attention(sizes):
    """Flash against SDPA, fp16 and bf16, causal: a flash row, an SDPA row, their ratio."""
    import cupy
    from minipar import backend
    from minipar.kernels import flash_cuda
    from minipar.kernels.bench import attention_flops, seconds_per_call
    backend.set_backend("cupy")
    torch = torch_cuda()
    sync = cupy.cuda.Device().synchronize
    rng = cupy.random.default_rng(0)
    for precision, dtype in HALF.items():
        if not any(flash_cuda.supports(dtype, d) for d in sizes["head_dims"]):
            emit("attention", precision=precision, status=f"not built: no flash kernel for {dtype}")
            continue
        gqa = sizes["gqa"]
        shapes = [(max(1, sizes["tokens"] // n), sizes["width"] // d, 1, n, d)
                  for d in sizes["head_dims"] for n in sizes["sizes"]]
        gqa_shape = tuple(gqa[k] for k in ("batch", "heads", "group", "n", "d"))
        for batch, heads, group, n, d in shapes + [gqa_shape]:
            shape = dict(precision=precision, d=d, n=n, batch=batch, heads=heads, causal=True,
                         kv_heads=heads // group)
            fwd_flops, bwd_flops = attention_flops(batch, heads, n, d, True)
            try:
                import ml_dtypes  # noqa: F401
                q, g = (rng.standard_normal((batch, heads, n, d), dtype=cupy.float32).astype(dtype)
                        for _ in range(2))
                k, v = (rng.standard_normal((batch, heads // group, n, d), dtype=cupy.float32)
                        .astype(dtype) for _ in range(2))
                out, lse = flash_cuda.forward(q, k, v, True)
                fwd = seconds_per_call(lambda: flash_cuda.forward(q, k, v, True), sizes["repeats"], sync)
                bwd = seconds_per_call(lambda: flash_cuda.backward(q, k, v, out, lse, g, True),
                                       sizes["repeats"], sync)
                emit("attention", impl="minipar flash", fwd_ms=fwd * 1e3, bwd_ms=bwd * 1e3,
                     fwd_tflops=fwd_flops / fwd / 1e12, bwd_tflops=bwd_flops / bwd / 1e12, **shape)
            except Exception as err:
                emit("attention", impl="minipar flash", error=f"{type(err).__name__}: {err}"[:300], **shape)
                continue
            if torch is None:
                emit("attention", impl="torch sdpa", status=torch_status(), **shape)
                continue
            try:
                t_fwd, t_bwd = sdpa_seconds(torch, q, k, v, g, sizes["repeats"], sync, group > 1)
                emit("attention", impl="torch sdpa", fwd_ms=t_fwd * 1e3, bwd_ms=t_bwd * 1e3,
                     fwd_tflops=fwd_flops / t_fwd / 1e12, bwd_tflops=bwd_flops / t_bwd / 1e12, **shape)
                emit("attention", ratio="minipar / torch speed", fwd=t_fwd / fwd, bwd=t_bwd / bwd,
                     targets="fwd >= 0.9, bwd >= 0.8", **shape)
            except Exception as err:
                emit("attention", impl="torch sdpa", error=f"{type(err).__name__}: {err}"[:300], **shape)
            finally:
                torch.cuda.empty_cache()
            cupy.get_default_memory_pool().free_all_blocks()


def sdpa_seconds(torch, q, k, v, g, repeats, sync, grouped=False):
    """Seconds per SDPA forward and per backward (flash backend) on the same inputs
    (``grouped``: K/V with fewer heads, SDPA's enable_gqa, PyTorch >= 2.5)."""
    import torch.nn.functional as F
    from minipar.kernels.bench import seconds_per_call
    from torch.nn.attention import SDPBackend, sdpa_kernel
    tq, tk, tv = (to_torch(torch, a).requires_grad_(True) for a in (q, k, v))
    tg = to_torch(torch, g)

    def forward():
        with sdpa_kernel([SDPBackend.FLASH_ATTENTION]):
            if grouped:
                return F.scaled_dot_product_attention(tq, tk, tv, is_causal=True, enable_gqa=True)
            return F.scaled_dot_product_attention(tq, tk, tv, is_causal=True)
    out = forward()
    backward = lambda: torch.autograd.grad(out, (tq, tk, tv), tg, retain_graph=True)  # noqa: E731
    return seconds_per_call(forward, repeats, sync), seconds_per_call(backward, repeats, sync)


def attention_for(precision, head_dim):
    """flash where minipar has a tensor-core kernel for the precision, else naive: a row
    compares like with like (the fp32 kernel is a scalar one, one thread per query row)."""
    if precision not in HALF:
        return "naive"
    from minipar.kernels import flash_cuda
    return "flash" if flash_cuda.supports(HALF[precision], head_dim) else "naive"


def child_throughput(framework, precision, shape, limit):
    """One tokens/s row: ``minipar train --backend cupy`` (median of its logged steps after
    the warm-up), or benchmarks/train_throughput.py's PyTorch GPT of the same shape.  Both
    read bytes (a 256-token vocabulary: ``--data stdlib-bytes`` on minipar's side), so the
    two models are the same size."""
    import statistics
    import tempfile
    import types
    sys.path.insert(0, HERE)
    attention = attention_for(precision, shape["d_model"] // shape["heads"])
    fields = dict(framework=framework, precision=precision, attention=attention, **shape)
    try:
        if framework == "torch":
            import train_throughput
            if torch_cuda() is None:
                emit("throughput", status=torch_status(), **fields)
                return
            rate = train_throughput.torch_tokens_per_s(
                types.SimpleNamespace(attention=attention, **shape), precision)
        else:
            from minipar.observe.runlog import step_records
            with tempfile.TemporaryDirectory() as tmp:
                log = os.path.join(tmp, "log.json")
                cmd = [sys.executable, "-m", "minipar", "train", "--backend", "cupy", "--model", "gpt2",
                       "--data", "stdlib-bytes", "--n-layer", str(shape["layers"]),
                       "--d-model", str(shape["d_model"]), "--n-head", str(shape["heads"]),
                       "--seq-len", str(shape["seq"]), "--batch-size", str(shape["batch"]),
                       "--steps", str(shape["steps"]), "--precision", precision, "--attention", attention,
                       "--eval-batches", "0", "--quiet", "--log-json", log]
                out = subprocess.run(cmd, cwd=REPO, capture_output=True, text=True, timeout=limit)
                print(out.stdout[-3000:] + out.stderr[-3000:], flush=True)
                if out.returncode != 0:
                    raise RuntimeError(f"minipar train exited {out.returncode}: "
                                       f"{(out.stderr or out.stdout).strip().splitlines()[-1:]}")
                rates = [r["tokens_per_s"] for r in step_records(log)][shape["warmup"]:]
            if not rates:
                raise RuntimeError("no step logged after the warm-up")
            rate = statistics.median(rates)
        emit("throughput", tokens_per_s=rate, **fields)
    except Exception as err:
        emit("throughput", error=f"{type(err).__name__}: {str(err).strip()}"[:300], **fields)


def child_transport(transport, mib, repeats):
    """Under mpiexec, 2 ranks on GPU 0: an all-reduce of ``mib`` MiB of float32 through
    ``transport`` ("host copy" where the comm package has no transports: its one path),
    rank r holding r + 1 everywhere, so every element must come back as Σ(r + 1); its
    bytes/s as nccl-tests' bus bandwidth, 2(n-1)/n · bytes / seconds."""
    import cupy
    from minipar import backend
    from minipar.comm import Communicator, all_reduce
    backend.set_backend("cupy")
    cupy.cuda.Device(0).use()
    comm = Communicator() if transport == "host copy" else Communicator(transport=transport)
    n, count = comm.size, mib * 2 ** 20 // 4
    x = cupy.full(count, comm.rank + 1, dtype=cupy.float32)
    want = n * (n + 1) / 2
    wrong = int((all_reduce(comm, x.copy()) != want).sum())
    cupy.cuda.Device().synchronize()
    comm.barrier()
    start = time.perf_counter()
    for _ in range(repeats):
        all_reduce(comm, x.copy())
    cupy.cuda.Device().synchronize()
    seconds = (time.perf_counter() - start) / repeats
    wrong_anywhere = float(all_reduce(comm, cupy.asarray([wrong], dtype=cupy.float64))[0])
    if comm.rank == 0:
        emit("transport", transport=transport, ranks=n, gpus=cupy.cuda.runtime.getDeviceCount(),
             bytes=count * 4, ok=wrong_anywhere == 0, wrong_elements=wrong_anywhere,
             seconds=seconds, bus_bytes_per_s=2 * (n - 1) / n * count * 4 / seconds)


def syncs_rows(output, precision, counter):
    """count_gpu_step.py's output as one row per step."""
    records = [json.loads(line) for line in output.splitlines() if line.startswith("{")]
    for record in records[:1]:          # rank 0
        for i, spans in enumerate(record["steps"]):
            emit("syncs", precision=precision, step=i, counter=counter, norm=spans.get("norm"),
                 **{f"{span}_{k}": v[k] for span, v in spans.items() if isinstance(v, dict)
                    for k in ("syncs", "d2h", "launches") if k in v})


# ------------------------------------------------------------------------ the parent
class Runner:
    """Runs the children: each in its own process group under a time limit, its output
    line by line to the terminal and the log as it comes, its rows collected."""

    def __init__(self, out_dir, env, deadline, slower=1):
        self.env, self.deadline, self.slower = env, deadline, slower
        self.log = open(os.path.join(out_dir, LOG), "a", buffering=1)
        self.current = None
        self.killed = False

    def left(self):
        return self.deadline - time.time()

    def run(self, cmd, limit):
        """(return code, rows printed, whole output); -9 when the limit stopped it."""
        limit = min(limit * self.slower, self.left())
        self.log.write(f"== {' '.join(cmd)}   (limit {limit:.0f} s)\n")
        print(f"== {' '.join(os.path.relpath(c, REPO) if c.startswith(REPO) else c for c in cmd)}",
              flush=True)
        proc = subprocess.Popen(cmd, cwd=REPO, env=self.env, stdout=subprocess.PIPE,
                                stderr=subprocess.STDOUT, text=True, start_new_session=True)
        self.current, self.killed = proc, False
        timer = threading.Timer(max(limit, 1), self.stop_current)
        timer.daemon = True            # a stopped run does not wait for it
        timer.start()
        rows, lines, started = [], [], time.time()
        for line in proc.stdout:
            self.log.write(line)
            sys.stdout.write(line)
            sys.stdout.flush()
            lines.append(line)
            if line.startswith("ROW "):
                rows.append(json.loads(line[4:]))
        proc.wait()
        timer.cancel()
        self.current = None
        timed_out = self.killed
        self.log.write(f"== exit {proc.returncode}{' (time limit)' if timed_out else ''} after "
                       f"{time.time() - started:.1f} s\n")
        return (-9 if timed_out else proc.returncode), rows, "".join(lines)

    def stop_current(self):
        proc = self.current
        if proc is not None and proc.poll() is None:
            self.killed = True
            try:
                os.killpg(proc.pid, signal.SIGKILL)    # mpiexec's ranks with it
            except ProcessLookupError:
                pass


def child_cmd(*args):
    return [sys.executable, os.path.abspath(__file__), "--child", *map(str, args)]


def section_tests(run, sizes, dry_run, found):
    """The GPU tests, run; a dry run only collects them (CI runs them on the fake CuPy:
    tests/test_gpu_paths_on_cpu.py), sparing the test session's ~30 s tokenization."""
    start = time.time()
    mode = ["--collect-only", "-p", "fake_cupy_plugin"] if dry_run else ["-rs"]
    rc, _, out = run.run([sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", *mode,
                          *sizes["tests"]], LIMITS["tests"])
    counts = {k: int(v) for v, k in re.findall(r"(\d+) (passed|failed|skipped|errors?|tests? collected)", out)}
    done = counts.get("passed", 0) + sum(v for k, v in counts.items() if "collected" in k)
    emit("tests", files=sizes["tests"], ok=rc == 0 and done > 0 and not counts.get("failed"),
         exit_code=rc, seconds=round(time.time() - start, 1), **counts)


def section_flash(run, sizes, dry_run, found):
    rc, rows, _ = run.run(child_cmd("flash", json.dumps(sizes["flash"])), LIMITS["flash"])
    if rc != 0:
        emit("flash", ok=False, exit_code=rc, measured_rows=len(rows))


def section_throughput(run, sizes, dry_run, found):
    """minipar, then PyTorch, then their ratio, one precision at a time; then each half
    precision against fp32 within each framework."""
    shape = sizes["throughput"]
    rates = {}
    share = (LIMITS["throughput"] - 10) / 6     # each run's seconds, of which `minipar train` 5 fewer
    for precision in ("fp32", "fp16", "bf16"):
        for framework in ("minipar", "torch"):
            if run.left() < 5:
                emit("throughput", framework=framework, precision=precision, status="skipped: out of time")
                continue
            if framework == "torch" and found["torch"].startswith("not measured"):
                emit("throughput", framework=framework, precision=precision, status=found["torch"])
                continue
            rc, rows, _ = run.run(child_cmd("throughput", framework, precision, json.dumps(shape),
                                            int((share - 5) * run.slower)), share)
            for row in rows:
                if "tokens_per_s" in row:
                    rates[framework, precision] = row
            if rc != 0 and not rows:
                emit("throughput", framework=framework, precision=precision, exit_code=rc,
                     error="stopped before its row (time limit or crash): see log.txt")
        mine, theirs = rates.get(("minipar", precision)), rates.get(("torch", precision))
        if mine and theirs:
            emit("throughput", ratio="minipar / torch", precision=precision, attention=mine["attention"],
                 value=mine["tokens_per_s"] / theirs["tokens_per_s"], target=">= 0.9")
    for framework in ("minipar", "torch"):
        for precision in ("fp16", "bf16"):
            half, full = rates.get((framework, precision)), rates.get((framework, "fp32"))
            if half and full:
                emit("throughput", ratio=f"{precision} / fp32", framework=framework,
                     value=half["tokens_per_s"] / full["tokens_per_s"], target=">= 1.8",
                     attention=f"{half['attention']} / {full['attention']}")


def section_attention(run, sizes, dry_run, found):
    rc, rows, _ = run.run(child_cmd("attention", json.dumps(sizes["attention"])), LIMITS["attention"])
    if rc != 0:
        emit("attention", exit_code=rc, measured_rows=len(rows),
             error="stopped before the last shape (time limit or crash): see log.txt")


def section_syncs(run, sizes, dry_run, found):
    counter = "fake CuPy counters" if dry_run else "CUPTI (torch.profiler)"
    precisions = SYNC_PRECISIONS["dry" if dry_run else "gpu"]
    for precision in precisions:
        rc, _, out = run.run([sys.executable, "tests/scripts/count_gpu_step.py", precision, *sizes["syncs"]],
                             LIMITS["syncs"] / len(precisions))
        if rc == 0:
            syncs_rows(out, precision, counter)
        else:
            emit("syncs", precision=precision, exit_code=rc, error="count_gpu_step.py failed: see log.txt")


def section_transport(run, sizes, dry_run, found):
    """An all-reduce on 2 ranks sharing GPU 0 through each transport the comm package has;
    the ones this machine cannot run say why (CUDA-aware: MPI says no; NCCL: one GPU)."""
    t = sizes["transport"]
    transports = found.get("transports")
    if transports is None:
        emit("transport", feature="device transports (minipar.comm.device_paths)", status="not built")
        transports = ["host copy"]
    for transport in transports:
        if transport == "cuda-aware" and not found.get("mpi_cuda_aware"):
            emit("transport", transport=transport, mpi=found.get("mpi"), status="not measured: this MPI "
                 "says it is not CUDA-aware (MPIX_Query_cuda_support)")
            continue
        if transport == "nccl" and found.get("gpus", 0) < 2:
            emit("transport", transport=transport, status=f"not measured: NCCL needs 2 GPUs (it refuses "
                 f"two ranks on one device), and its baseline with it; {found.get('gpus', 0)} here")
            continue
        rc, rows, _ = run.run([found["mpiexec"], "-n", "2"] + child_cmd("transport", transport, t["mib"],
                                                                      t["repeats"]),
                              LIMITS["transport"] / len(transports))
        if rc != 0 and not rows:
            emit("transport", transport=transport, ok=False, exit_code=rc, error="see log.txt")


def install_wheels(folder, scratch, env):
    """pip install --no-index the wheels in ``folder`` into ``scratch``; PATH,
    LD_LIBRARY_PATH and PYTHONPATH of the children then reach them."""
    wheels = sorted(f for f in os.listdir(folder) if f.endswith(".whl"))
    if not wheels:
        return []
    subprocess.run([sys.executable, "-m", "pip", "install", "-q", "--no-index", "--no-deps",
                    "--no-compile", "--prefix", scratch] + [os.path.join(folder, w) for w in wheels],
                   check=True, env=env)
    site = os.path.join(scratch, "lib", f"python{sys.version_info[0]}.{sys.version_info[1]}", "site-packages")
    for var, path in (("PATH", os.path.join(scratch, "bin")), ("LD_LIBRARY_PATH", os.path.join(scratch, "lib")),
                      ("PYTHONPATH", site)):
        env[var] = os.pathsep.join(p for p in (path, env.get(var)) if p)
    return wheels


def main(argv=None):
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--out", help="the output folder (default: $OUT, else runs/gpu_check)")
    p.add_argument("--sections", default=",".join(SECTIONS), help="comma-separated, of: " + ", ".join(SECTIONS))
    p.add_argument("--budget", type=float, help="seconds for the whole run (default 470; a dry "
                   f"run {DRY_SLOWER}x that)")
    p.add_argument("--wheels", help="a folder of wheels to install first (no index; e.g. mpich)")
    p.add_argument("--dry-run", action="store_true", help="on the CPU: tests/fake_cupy, tiny shapes")
    p.add_argument("--child", nargs="+", help=argparse.SUPPRESS)
    args = p.parse_args(argv)
    if args.child:
        return run_child(args.child, args.dry_run)
    start = time.time()
    sections = [s for s in args.sections.split(",") if s]
    unknown = sorted(set(sections) - set(SECTIONS))
    if unknown:
        print(f"gpu_check: no section {', '.join(map(repr, unknown))} (sections: {', '.join(SECTIONS)})")
        return 2
    out_dir = os.path.abspath(args.out or os.environ.get("OUT") or os.path.join(REPO, "runs", "gpu_check"))
    os.makedirs(out_dir, exist_ok=True)
    env = dict(os.environ, PYTHONUNBUFFERED="1", GPU_CHECK_T0=str(start),
               GPU_CHECK_ROWS=os.path.join(out_dir, ROWS), NVIDIA_TF32_OVERRIDE="0", CUPY_TF32="0",
               MINIPAR_BACKEND="cupy")
    env.pop("OUT", None)
    path = ([FAKE_CUPY] if args.dry_run else []) + [REPO, os.environ.get("PYTHONPATH")]
    env["PYTHONPATH"] = os.pathsep.join(p for p in path if p)
    if args.dry_run:     # the fused elementwise kernels' array code: each emulated launch is seconds
        env["MINIPAR_CUDA_KERNELS"] = "0"
    os.environ.update(GPU_CHECK_T0=env["GPU_CHECK_T0"], GPU_CHECK_ROWS=env["GPU_CHECK_ROWS"])
    # caches (tokenized data, the emulator's and CuPy's compiled kernels) and wheels go to a
    # scratch folder, not to $OUT, whose files are the run's results
    scratch = tempfile.mkdtemp(prefix="gpu_check-")
    for variable, folder in (("XDG_CACHE_HOME", "cache"), ("MINIPAR_TEST_CACHE", "tests")):
        env.setdefault(variable, os.path.join(scratch, folder))
    if args.wheels:
        installed = install_wheels(args.wheels, os.path.join(scratch, "wheels"), env)
        emit("environment", wheels_installed=installed)
    slower = DRY_SLOWER if args.dry_run else 1
    run = Runner(out_dir, env, start + (args.budget or 470 * slower), slower)

    def stopped(signum, _frame):
        child = run.current
        run.stop_current()
        if child is not None:
            child.wait()           # reaped: gone, not a zombie, when this run ends
            child = child.pid
        emit("run", status=f"stopped by signal {signum}", child_stopped=child)
        sys.exit(128 + signum)
    signal.signal(signal.SIGTERM, stopped)
    signal.signal(signal.SIGINT, stopped)

    rc, _, out = run.run(child_cmd("prerequisites", "dry" if args.dry_run else "gpu"), 60)
    try:
        check = json.loads(out.strip().splitlines()[-1])
    except (ValueError, IndexError):
        check = {"found": {}, "missing": [f"the prerequisite check failed (exit {rc}): see log.txt"]}
    emit("environment", **check["found"])
    if check["missing"]:
        print("gpu_check: " + "; ".join(check["missing"]), flush=True)
        emit("environment", ok=False, missing=check["missing"])
        return 2
    found = check["found"]
    run.env["GPU_CHECK_TORCH"] = found["torch"]
    sizes = DRY if args.dry_run else FULL
    for name in sections:
        if run.left() < 5:
            emit(name, status="skipped: the run's budget is spent")
            continue
        try:
            globals()["section_" + name](run, sizes, args.dry_run, found)
        except Exception as err:    # a broken section must not cost the others their figures
            emit(name, ok=False, error=f"the section itself failed: {type(err).__name__}: {err}"[:300])
    emit("run", status="done", seconds=round(time.time() - start, 1))
    return 0


def run_child(child, dry_run):
    kind, rest = child[0], child[1:]
    if kind == "prerequisites":
        child_prerequisites(rest[0] == "dry")
    elif kind == "flash":
        child_flash(json.loads(rest[0]))
    elif kind == "attention":
        child_attention(json.loads(rest[0]))
    elif kind == "throughput":
        child_throughput(rest[0], rest[1], json.loads(rest[2]), float(rest[3]))
    elif kind == "transport":
        child_transport(rest[0], int(rest[1]), int(rest[2]))
    return 0


if __name__ == "__main__":
    sys.exit(main())
