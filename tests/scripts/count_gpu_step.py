"""Count what the trainer's steps would cost on a GPU, on the fake CuPy.

    PYTHONPATH=tests/fake_cupy:. python tests/scripts/count_gpu_step.py fp16 [--steps 3]
    PYTHONPATH=tests/fake_cupy:. mpiexec -n 4 python tests/scripts/count_gpu_step.py fp16 --tp 2

Builds the trainer's own run (``train.setup``: the tiny GPT, DDP on one rank or the layout
of ``--tp/--pp/--zero`` under mpiexec, the optimizer with its loss scaler) on the cupy
backend and, per step, reads the fake's counters (``tests/fake_cupy/cupy/_counters.py``)
over three spans: ``forward_backward``, ``optimizer`` (``Optimizer.step``: unscale,
overflow check, norm, clip, AdamW, publish) and ``step`` (the whole ``Run.step``, the loss
for the log included).  Each span also lists its collectives over more than one rank,
"name/ranks/elements" -> calls (a staged device array costs a sync per message, so they
show in ``syncs`` too).  Prints one JSON object per rank: {"rank", "precision",
"min_upcast_size", "steps": [{span: summary, "norm": the step's gradient norm}]}.  Only
long-standing APIs are used (but ``--fused-kernels optimizer``), so the same script measures
the trainer before and after a change.

On a real GPU (no fake on the path) the same spans are counted by the GPU's own tracer,
CUPTI, through ``torch.profiler`` (``CuptiCounts``): each step is traced, and a span's
``syncs`` are the blocking CUDA calls made inside it (stream, device and event
synchronisations, synchronous copies), its ``d2h`` the device->host copies the GPU ran, its
``launches`` the kernels the GPU ran that were launched inside it.  ``benchmarks/gpu_check.py``
runs it there.
"""
import argparse
import contextlib
import json
import os
import tempfile
import types
from collections import Counter

try:
    from cupy import _counts   # the fake's counters; a real CuPy has none
except ImportError:
    _counts = None

from minipar import backend
from minipar.comm import collectives
from minipar.train import TrainConfig, setup
import minipar.train.steps as train_steps   # train_step calls its forward_backward


BLOCKING = {"cudaStreamSynchronize", "cudaDeviceSynchronize", "cudaEventSynchronize", "cudaMemcpy",
            "cuStreamSynchronize", "cuCtxSynchronize", "cuEventSynchronize", "cuMemcpyDtoH",
            "cuMemcpyDtoH_v2", "cuMemcpy", "cuMemcpy_v2"}


class CuptiCounts:
    """The spans of one step counted from a CUPTI trace (``torch.profiler``, Chrome format):
    ``span(name)`` marks a span (a ``record_function`` range), ``trace()`` wraps the step,
    ``summaries()`` then gives {span: {"syncs", "d2h", "launches"}} for the spans marked.
    A CUDA call belongs to a span if it starts inside it; a kernel or copy the GPU ran, to
    the span of the call that launched it (CUPTI's correlation id)."""

    def __init__(self):
        import torch
        torch.zeros(1, device="cuda")     # CUDA initialised before the tracer starts
        self.torch, self.path = torch, None

    def span(self, name):
        return self.torch.profiler.record_function("span:" + name)

    @contextlib.contextmanager
    def trace(self):
        from torch.profiler import ProfilerActivity, profile
        with profile(activities=[ProfilerActivity.CPU, ProfilerActivity.CUDA]) as prof:
            yield
        fd, self.path = tempfile.mkstemp(suffix=".json")
        os.close(fd)
        prof.export_chrome_trace(self.path)

    def summaries(self):
        with open(self.path) as f:
            events = [e for e in json.load(f)["traceEvents"] if e.get("ph") == "X"]
        os.remove(self.path)
        spans = {e["name"][5:]: (e["ts"], e["ts"] + e["dur"]) for e in events
                 if e["name"].startswith("span:")}
        calls = [e for e in events if e.get("cat") in ("cuda_runtime", "cuda_driver")]
        where = {}                         # correlation id -> the start of its call
        for e in calls:
            where[e.get("args", {}).get("correlation")] = e["ts"]
        out = {}
        for name, (lo, hi) in spans.items():
            inside = lambda ts: ts is not None and lo <= ts <= hi   # noqa: E731
            launched = lambda e: inside(where.get(e.get("args", {}).get("correlation")))  # noqa: E731
            out[name] = {
                "syncs": sum(e["name"] in BLOCKING and inside(e["ts"]) for e in calls),
                "d2h": sum(e.get("cat") == "gpu_memcpy" and "DtoH" in e["name"] and launched(e)
                           for e in events),
                "launches": sum(e.get("cat") == "kernel" and launched(e) for e in events)}
        return out


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("precision", choices=["fp16", "bf16", "fp32"])
    ap.add_argument("--steps", type=int, default=3)
    ap.add_argument("--fused-kernels", choices=["on", "off", "optimizer"], default="on",
                    help="off: the array code instead of the CUDA kernels LayerNorm, GELU, softmax "
                         "and AdamW launch (on the fake each launch is a CPU-emulator process, "
                         "seconds; the counts of syncs and GEMMs do not depend on it); optimizer: "
                         "only the optimizer step's one-launch unscale, check and norm")
    ap.add_argument("--n-layer", type=int, default=4)
    ap.add_argument("--d-model", type=int, default=None, help="default: the tiny preset's 64")
    ap.add_argument("--seq-len", type=int, default=32)
    ap.add_argument("--batch-size", type=int, default=4)
    ap.add_argument("--tp", type=int, default=1)
    ap.add_argument("--pp", type=int, default=1)
    ap.add_argument("--zero", type=int, default=0)
    ap.add_argument("--data", default="stdlib", help="stdlib-bytes: a 256-token vocabulary, so 16x fewer "
                    "embedding rows for the emulated optimizer kernel to walk (one CPU fiber per element)")
    args = ap.parse_args()
    backend.set_backend("cupy")
    if args.fused_kernels != "on":
        import minipar.nn  # noqa: F401  (importing registers the kernels: unregister after)
        from minipar.autograd.ops_math import use_fused_kernels
        from minipar.kernels import fused_cuda
        only = types.SimpleNamespace(OPS=("unscale_check_norm",), supports=fused_cuda.supports,
                                     unscale_check_norm=fused_cuda.unscale_check_norm)
        use_fused_kernels(only if args.fused_kernels == "optimizer" else None, "cupy")
    scale = {"initial_loss_scale": 2.0 ** 10} if args.precision == "fp16" else {}  # no overflow:
    config = TrainConfig(model="tiny", precision=args.precision, steps=args.steps,  # clean steps
                         batch_size=args.batch_size, seq_len=args.seq_len, n_layer=args.n_layer,
                         d_model=args.d_model, tp=args.tp, pp=args.pp, zero=args.zero,
                         quiet=True, eval_batches=0, backend="cupy", warmup=1, data=args.data, **scale)
    run = setup(config)
    run.warmup = 1
    # an activation: at least one d_model row per token of the batch
    min_size = config.batch_size * run.cfg.seq_len * run.cfg.d_model
    spans, calls = {}, []
    check = collectives.check

    def noted(ctx, name, local):     # every collective checks its arguments here first
        def local_noted():
            fields, elements, *rest = local()
            if ctx.size > 1:
                calls.append(f"{name}/{ctx.size}/{elements}")
            return (fields, elements, *rest)
        return check(ctx, name, local_noted)
    collectives.check = noted

    cupti = CuptiCounts() if _counts is None else None
    norms = []

    def counted(name, fn):
        def call(*a, **k):
            mark, first = _counts.mark() if cupti is None else None, len(calls)
            try:
                with cupti.span(name) if cupti else contextlib.nullcontext():
                    result = fn(*a, **k)
                if name == "optimizer":
                    norms.append(result)
                return result
            finally:
                spans[name] = {} if cupti else _counts.summary(min_size, since=mark)
                spans[name]["collectives"] = dict(sorted(Counter(calls[first:]).items()))
        return call

    train_steps.forward_backward = counted("forward_backward", train_steps.forward_backward)
    run.optimizer.step = counted("optimizer", run.optimizer.step)
    steps = []
    for step in range(args.steps):
        spans.clear()
        with cupti.trace() if cupti else contextlib.nullcontext():
            counted("step", run.step)(step)
        if cupti:
            for name, summary in cupti.summaries().items():
                spans[name].update(summary)
        steps.append(dict(spans, norm=norms[-1] if norms else None))
    line = json.dumps({"rank": run.grid.rank, "precision": args.precision,
                       "fused_kernels": args.fused_kernels, "min_upcast_size": min_size,
                       "steps": steps})
    for rank in range(run.grid.world.size):    # one whole line per rank, in rank order
        if rank == run.grid.rank:
            print(line, flush=True)
        run.grid.world.barrier()


if __name__ == "__main__":
    main()
