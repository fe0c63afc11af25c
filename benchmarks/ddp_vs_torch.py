"""Data parallelism: minipar's step against PyTorch DistributedDataParallel (gloo), same GPT.

    python benchmarks/ddp_vs_torch.py [--shape L,D,S,B] [--heads 4] [--steps 10] [--repeats 2]
                                      [--np 2] [--torch-sdpa] [--timeout 600]

Two jobs of 2 ranks each train the same GPT on the same global batch of B sequences (B/2
per rank), in float32 on the CPU, one thread per rank, and are timed alike:

    minipar   ``mpiexec -n 2 python benchmarks/ddp_vs_torch.py --worker minipar``
              (the workers live in ``ddp_workers.py``): the run
              ``python -m minipar train`` builds (``minipar.train.setup``: GPT(seed=0),
              ``parallelize`` -> DDPSync with overlap on, 25 MiB buckets; ``build_optimizer``),
              and its step: ``train.steps.forward_backward`` (the gradient hooks start the
              bucket all-reduces during backward) then ``Optimizer.step(grad_clip)``
              (finish the all-reduces, global norm, clip at 1.0, AdamW, zero_grad).
    PyTorch   ``mpiexec -n 2 python benchmarks/ddp_vs_torch.py --worker torch``: the same GPT
              (``torch_gpt.py``: pre-LN blocks, fused qkv, the same explicit causal softmax
              attention, tanh-GELU, untied head) in ``DistributedDataParallel`` over gloo
              (rank and size from mpiexec's PMI_RANK / PMI_SIZE; DDP's default buckets:
              1 MiB first, then 25 MiB, re-ordered after the first step), forward,
              backward, ``clip_grad_norm_(1.0)``, ``AdamW(foreach=True)``, ``zero_grad``.

Both sides use minipar's hyper-parameters (lr, betas (0.9, 0.95), eps, weight decay 0.1 on
matrices only, clip 1.0) and the same random token batches; the loss is read
(``.item()``) every step on both.  Not timed on either side: making the batch, the
data-loading and logging of ``minipar train`` (and its per-step all-reduce of the loss for
the log), evaluation, checkpoints.

Threads: minipar budgets its own (``minipar/process/threads.py``: 2 ranks on 2 cores -> 1 BLAS
thread each), so its job gets no thread variables at all (any OMP_NUM_THREADS /
OPENBLAS_NUM_THREADS / MKL_NUM_THREADS of the calling shell are removed from its
environment: what is measured is what a user gets without setting any).  The PyTorch
job gets OMP_NUM_THREADS=1 and its worker calls ``torch.set_num_threads(1)``, as
``torchrun`` would.  The header prints what each side ran with.

The two jobs alternate ``--repeats`` times (minipar first in odd repeats, PyTorch first in
even ones), so a load change on a shared machine hits both alike.  Each job reports rank 0's
step times; the first 2 (warm-up; minipar calibrates its collectives' cost model on step 0)
are dropped and the median of the next ``--steps`` is taken.  The table has one line per
shape and repeat, the ratio minipar / PyTorch taken within the repeat, and a median line
per shape (medians of the times, median of the ratios).  The last line,

    ddp_vs_torch: minipar / PyTorch DDP = X.XXx (median of R repeats)

is the shape's median ratio (with several shapes: the largest of their median ratios).
Below 1.00x minipar's step is faster.  The shapes (layers, d_model, seq, global batch) are
the shapes (4,128,128,16), (4,128,128,32), (4,256,256,16); ``--shape`` runs one.  Without
PyTorch installed only minipar's times are printed.  A job that fails or passes
``--timeout`` seconds is killed, with its output, and the benchmark stops with an error.
"""
from __future__ import annotations

import argparse
import importlib.util
import json
import os
import signal
import socket
import statistics
import subprocess
import sys

from ddp_workers import WARMUP, minipar_worker, torch_worker   # beside this file

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(HERE)
SHAPES = [(4, 128, 128, 16), (4, 128, 128, 32), (4, 256, 256, 16)]
THREAD_VARS = ("OMP_NUM_THREADS", "OPENBLAS_NUM_THREADS", "MKL_NUM_THREADS",
               "VECLIB_MAXIMUM_THREADS", "MINIPAR_BLAS_THREADS")


# ------------------------------------------------------------------ the driver
def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def job_env(kind):
    env = {k: v for k, v in os.environ.items() if k not in THREAD_VARS}
    env["PYTHONPATH"] = ROOT + os.pathsep + env.get("PYTHONPATH", "")
    if kind == "torch":
        env["OMP_NUM_THREADS"] = "1"
    return env


def run_job(kind, shape, args):
    """Rank 0's result of one job; a failed or stuck job stops the benchmark, loudly."""
    cmd = ["mpiexec", "-n", str(args.np), sys.executable, os.path.abspath(__file__),
           "--worker", kind, "--shape", ",".join(map(str, shape)), "--heads", str(args.heads),
           "--steps", str(args.steps), "--lr", repr(args.lr), "--weight-decay",
           repr(args.weight_decay), "--grad-clip", repr(args.grad_clip),
           "--timeout", str(args.timeout)]
    if kind == "torch":
        cmd += ["--port", str(free_port())] + (["--torch-sdpa"] if args.torch_sdpa else [])
    if args.fail_worker:
        cmd += ["--fail-worker", args.fail_worker]
    proc = subprocess.Popen(cmd, cwd=ROOT, env=job_env(kind), stdout=subprocess.PIPE,
                            stderr=subprocess.STDOUT, text=True, start_new_session=True)
    try:
        out, _ = proc.communicate(timeout=args.timeout)
    except subprocess.TimeoutExpired:
        os.killpg(proc.pid, signal.SIGTERM)       # mpiexec and its ranks: its own session;
        try:                                      # mpiexec stops its ranks and reaps them
            out, _ = proc.communicate(timeout=10)
        except subprocess.TimeoutExpired:
            os.killpg(proc.pid, signal.SIGKILL)
            out, _ = proc.communicate()
        raise SystemExit(f"ddp_vs_torch: the {kind} job did not finish in {args.timeout} s and was "
                         f"killed:\n  {' '.join(cmd)}\n--- its output (tail) ---\n{out[-3000:]}")
    lines = [line for line in out.splitlines() if line.startswith("RESULT ")]
    if proc.returncode or not lines:
        raise SystemExit(f"ddp_vs_torch: the {kind} job failed (exit {proc.returncode}):\n  "
                         f"{' '.join(cmd)}\n--- its output (tail) ---\n{out[-3000:]}")
    result = json.loads(lines[-1][len("RESULT "):])
    result["median_s"] = statistics.median(result["times"][WARMUP:])
    return result


def parse_shape(text):
    try:
        shape = tuple(int(v) for v in text.split(","))
    except ValueError:
        shape = ()
    if len(shape) != 4:
        raise argparse.ArgumentTypeError(f"--shape wants LAYERS,D_MODEL,SEQ,BATCH, got {text!r}")
    return shape


def minipar_defaults():
    """lr, weight decay and grad clip of ``minipar train`` (TrainConfig's defaults)."""
    import ast
    with open(os.path.join(ROOT, "minipar", "config.py")) as f:   # read, not imported: the
        tree = ast.parse(f.read())                                  # driver budgets no threads
    values = {}
    for node in ast.walk(tree):
        if isinstance(node, ast.AnnAssign) and isinstance(node.target, ast.Name) and node.value:
            if node.target.id in ("lr", "weight_decay", "grad_clip"):
                values[node.target.id] = ast.literal_eval(node.value)
    return values


def main(argv=None):
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--shape", type=parse_shape, help="LAYERS,D_MODEL,SEQ,GLOBAL_BATCH (default: "
                   + " ".join(",".join(map(str, s)) for s in SHAPES) + ")")
    p.add_argument("--heads", type=int, default=4)
    p.add_argument("--steps", type=int, default=10, help=f"timed steps (after {WARMUP} warm-up)")
    p.add_argument("--repeats", type=int, default=2)
    p.add_argument("--np", type=int, default=2)
    p.add_argument("--torch-sdpa", action="store_true",
                   help="PyTorch side: fused scaled_dot_product_attention instead of minipar's "
                        "explicit attention")
    p.add_argument("--timeout", type=int, default=600, help="seconds one job may take")
    defaults = minipar_defaults()
    p.add_argument("--lr", type=float, default=defaults["lr"], help=argparse.SUPPRESS)
    p.add_argument("--weight-decay", type=float, default=defaults["weight_decay"], help=argparse.SUPPRESS)
    p.add_argument("--grad-clip", type=float, default=defaults["grad_clip"], help=argparse.SUPPRESS)
    p.add_argument("--worker", choices=("minipar", "torch"), help=argparse.SUPPRESS)
    p.add_argument("--port", type=int, help=argparse.SUPPRESS)
    p.add_argument("--fail-worker", choices=("crash", "hang"), help=argparse.SUPPRESS)
    args = p.parse_args(argv)
    shapes = [args.shape] if args.shape else SHAPES
    if args.worker:
        return (minipar_worker if args.worker == "minipar" else torch_worker)(args, shapes[0])
    for shape in shapes:
        if shape[3] % args.np:
            p.error(f"global batch {shape[3]} does not split over {args.np} ranks")

    have_torch = importlib.util.find_spec("torch") is not None
    kinds = ["minipar", "torch"] if have_torch else ["minipar"]
    print(f"GPT data parallelism on {args.np} ranks, float32, {args.heads} heads, "
          f"fwd+bwd+all-reduce+clip {args.grad_clip}+AdamW;\nrank 0's median of {args.steps} steps "
          f"after {WARMUP} warm-up; {args.repeats} repeat{'s' if args.repeats != 1 else ''}, "
          f"minipar and PyTorch alternating", flush=True)
    if not have_torch:
        print("PyTorch not installed: minipar's times only (pip install torch)")
    rows = {shape: [] for shape in shapes}
    threads, buckets = {}, {}
    for r in range(args.repeats):
        order = kinds if r % 2 == 0 else kinds[::-1]
        for shape in shapes:
            results = {kind: run_job(kind, shape, args) for kind in order}
            threads.update({kind: res["threads"] for kind, res in results.items()})
            buckets[shape] = results["minipar"]["buckets"]
            rows[shape].append({kind: res["median_s"] for kind, res in results.items()})
    print(f"threads: minipar {threads['minipar']}" + (f"; PyTorch {threads['torch']}" if have_torch else ""))
    print("minipar's gradient buckets (<= 25 MiB): " + ", ".join(
        f"{','.join(map(str, shape))}: {n}" for shape, n in buckets.items()))
    print(f"\n{'layers':>6} {'d_model':>7} {'seq':>5} {'batch':>5} {'repeat':>7} {'minipar ms':>11} "
          f"{'PyTorch DDP ms':>15} {'minipar/PyTorch':>16}")
    medians = {}
    for shape, reps in rows.items():
        lead = "".join(f"{v:>{w}} " for v, w in zip(shape, (6, 7, 5, 5)))
        ratios = [rep["minipar"] / rep["torch"] for rep in reps] if have_torch else []
        for i, rep in enumerate(reps):
            torch_ms = f"{rep['torch'] * 1e3:15.1f}" if have_torch else f"{'-':>15}"
            ratio = f"{ratios[i]:15.2f}x" if have_torch else f"{'-':>16}"
            print(f"{lead}{i + 1:>7} {rep['minipar'] * 1e3:11.1f} {torch_ms} {ratio}")
        mini = statistics.median(rep["minipar"] for rep in reps)
        if have_torch:
            medians[shape] = statistics.median(ratios)
            torch_ms = statistics.median(rep["torch"] for rep in reps) * 1e3
            print(f"{lead}{'median':>7} {mini * 1e3:11.1f} {torch_ms:15.1f} {medians[shape]:15.2f}x")
        else:
            print(f"{lead}{'median':>7} {mini * 1e3:11.1f} {'-':>15} {'-':>16}")
    if not have_torch:
        return
    worst = max(medians.values())
    several = f"; the largest of {len(medians)} shapes" if len(medians) > 1 else ""
    print(f"\nddp_vs_torch: minipar / PyTorch DDP = {worst:.2f}x "
          f"(median of {args.repeats} repeats{several})")


if __name__ == "__main__":
    main()
