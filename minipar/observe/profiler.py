"""``python -m minipar profile``: where a training step's time goes, by op and by phase,
against this machine's roofline: measure before optimising.

While a ``StepProfiler`` is active, autograd hands it every op: the forward from
``Function.apply``, the backward from the engine's walk (``function._op_observer``; with
no profiler that is one ``is None`` check).  It times each call, exclusive of the ops
nested in it (a recomputed block re-runs its forward inside its backward), and counts

    bytes   what the op reads and writes: forward, its array inputs + its output;
            backward, dL/d(out) + the arrays saved for it + the gradients it returns.
            A view (an output sharing memory with an input) moves 0; Embedding reads
            only the rows it gathers.
    FLOPs   C = A·B, A (..., m, k), B (..., k, n): 2·m·n·k per batch entry (MatMul,
            Linear; + m·n for Linear's bias); backward 2·m·n·k per input gradient it
            returns (dA and dB: twice the forward).  Flash attention 4·B·H·Nq·Nk·d
            forward, 10·B·H·Nq·Nk·d backward (S recomputed; the causal mask's skipped
            half is not subtracted); naive attention is its two MatMuls.  Any other op
            ~1 FLOP per element of the largest array it touches: a floor (LayerNorm,
            softmax, GELU do several), but those ops are bound by their bytes.

The roofline of an op is the least time this machine needs for it,

    roofline_s = max(FLOPs / gemm_rate, bytes / mem_bw)

gemm_rate: the best FLOP/s of this process's matmuls at the model's shapes
(``perf.calibrate.gemm_curve`` through autograd's own ``matmul``, or ``--peak-tflops``);
mem_bw: the bytes/s of c = a + b at the largest activation's size, b·s × 4h, on the rank's
threads (``calibrate.stream_rate``).  achieved/roofline = roofline_s / measured_s: 1.0 is
as fast as the machine goes, 0.1 leaves 10x on the table, above 1 the arrays stayed in a
faster cache.  Printed beside: LayerNorm + GELU + add through autograd (``elementwise_rate``).

A step is cut into phases: forward (the model and its loss), backward (``loss.backward()``),
optimizer (``opt.step``: norm, clipping, AdamW, publish, zero_grad; one row of the op table,
its bytes 8 × the fp32 master weights' bytes: the norm reads g, AdamW reads p, g, m, v
and writes p, m, v) and comm (the communication the step waited for, ``opt.exposed_comm_s``, taken out
of the optimizer).  Python overhead = forward + backward time - the time inside their ops:
building the graph, wrapping Tensors, the backward walk, accumulating .grad, the hooks
(a recomputed block's re-run walk counts in its Checkpoint row).  Its own bookkeeping is
measured and left out; a step without the profiler is timed too.
"""
from __future__ import annotations

import contextlib
import json
import statistics
import time

import numpy as np

from minipar import backend
from minipar.autograd import function
from minipar.config import ConfigError
from minipar.observe.profiler_report import PHASES, format_report, summarize

MATMULS = ("MatMul", "Linear")
NOT_PROFILED = {   # train flags that mean nothing here: refused, never ignored
    "stop_at": "it runs --steps steps after one warm-up", "save": "it keeps no checkpoint",
    "save_every": "it keeps no checkpoint", "keep": "it keeps no checkpoint",
    "save_async": "it keeps no checkpoint", "resume": "a step's time does not depend on weights",
    "log_json": "--json FILE writes its tables", "trace": "pipelines are not profiled",
    "eval_batches": "it evaluates nothing", "quiet": "it shows no progress bar",
    "balance": "every replica gets an even share of the batch here"}


def _arrays(values):
    return [v for v in values if hasattr(v, "nbytes") and hasattr(v, "shape")]


def _nbytes(arrays):
    return sum({id(a): a.nbytes for a in arrays}.values())   # an array read twice counts once


def _is_view(outs, ins):
    return bool(outs) and all(any(backend.xp.may_share_memory(o, a) for a in ins) for o in outs)


def forward_cost(name, inputs, out):
    """(FLOPs, bytes) of one forward call; see the module docstring."""
    ins, outs = _arrays(inputs), _arrays(out if isinstance(out, tuple) else (out,))
    if _is_view(outs, ins):
        return 0, 0
    if name in MATMULS:            # out (..., m, n) = a (..., m, k) @ b: 2·m·n·k per entry
        flops = 2 * outs[0].size * ins[0].shape[-1] + (outs[0].size if len(ins) > 2 else 0)
    elif name == "FlashAttention":
        flops = 4 * ins[0].size * ins[1].shape[-2]
    else:
        flops = max((a.size for a in ins + outs), default=0)     # ~1 per element
    if name == "Embedding":        # (weight, ids): the gathered rows, not the whole table
        return flops, ins[1].nbytes + 2 * outs[0].nbytes
    return flops, _nbytes(ins + outs)


def backward_cost(name, ctx, grad, grads):
    """(FLOPs, bytes) of one backward call, from the gradients it actually returned."""
    saved, outs = _arrays(ctx.saved), _arrays(grads)
    if _is_view(outs, [grad]):     # dL/dx is dL/dy itself (reshape, add): nothing moved
        return 0, 0
    if name in MATMULS:            # 2·m·n·k per produced dA, dB (dW); + m·n for db
        k, made = saved[0].shape[-1], sum(g is not None for g in grads[:2])
        bias = grad.size if len(grads) > 2 and grads[2] is not None else 0
        flops = 2 * grad.size * k * made + bias
    elif name == "FlashAttention":
        flops = 10 * saved[0].size * saved[1].shape[-2]
    else:
        flops = max((a.size for a in [grad] + saved + outs), default=0)
    return flops, _nbytes([grad] + saved + outs)


class StepProfiler:
    """``with StepProfiler() as prof:`` times every autograd op; ``with prof.phase(name):``
    names the part of the step that runs (forward, backward, optimizer)."""

    def __init__(self):
        self.ops = {}        # (op, pass, phase) -> [calls, seconds, FLOPs, bytes]
        self.phases = dict.fromkeys(PHASES, 0.0)   # seconds, bookkeeping left out
        self.current = "other"
        self.own_s = 0.0     # the profiler's own bookkeeping
        self._nested = []    # per open op: the time of the ops nested in it

    def __enter__(self):
        if function._op_observer is not None:
            raise RuntimeError("a StepProfiler is already active")
        function._op_observer = self
        return self

    def __exit__(self, *exc):
        function._op_observer = None

    @contextlib.contextmanager
    def phase(self, name):
        outer, self.current = self.current, name
        own, t0 = self.own_s, time.perf_counter()
        try:
            yield
        finally:
            backend.sync()
            seconds = time.perf_counter() - t0 - (self.own_s - own)
            self.phases[name] = self.phases.get(name, 0.0) + seconds
            self.current = outer

    def _timed(self, call, *args, **kwargs):
        self._nested.append(0.0)
        t0 = time.perf_counter()
        out = call(*args, **kwargs)
        backend.sync()       # a GPU op is timed to its end, not to its launch
        t1 = time.perf_counter()
        return out, t1 - t0 - self._nested.pop(), t0, t1

    def _record(self, name, kind, seconds, cost, t0, t1):
        key = (name, kind, self.current)
        calls, total, flops, nbytes = self.ops.get(key, (0, 0.0, 0, 0))
        self.ops[key] = (calls + 1, total + seconds, flops + cost[0], nbytes + cost[1])
        t2 = time.perf_counter()
        self.own_s += t2 - t1
        if self._nested:     # the enclosing op's own time excludes this one's
            self._nested[-1] += t2 - t0

    def forward(self, ctx, arrays, kwargs):
        """``Function.apply`` calls this instead of ``ctx.fn.forward``."""
        out, seconds, t0, t1 = self._timed(ctx.fn.forward, ctx, *arrays, **kwargs)
        cost = forward_cost(ctx.fn.__name__, arrays, out)
        self._record(ctx.fn.__name__, "forward", seconds, cost, t0, t1)
        return out

    def backward(self, ctx, grad):
        """The engine calls this instead of ``ctx.fn.backward``."""
        in_grads, seconds, t0, t1 = self._timed(ctx.fn.backward, ctx, grad)
        grads = in_grads if isinstance(in_grads, tuple) else (in_grads,)
        name = ctx.fn.__name__
        self._record(name, "backward", seconds, backward_cost(name, ctx, grad, grads), t0, t1)
        return in_grads

    def backward_into(self, ctx, grad, into):
        """The engine calls this instead of ``ctx.fn.backward_into`` (a slice's backward)."""
        out, seconds, t0, t1 = self._timed(ctx.fn.backward_into, ctx, grad, into)
        name = ctx.fn.__name__
        self._record(name, "backward", seconds, backward_cost(name, ctx, grad, (out,)), t0, t1)
        return out


def machine_rates(cfg, rows, dtype):
    """(GEMM FLOP/s, stream bytes/s, minipar's elementwise bytes/s) of this process now,
    at the model's shapes (rows = b·s)."""
    from minipar.autograd.rows import matmul
    from minipar.perf.calibrate import elementwise_rate, gemm_curve, stream_rate
    h = cfg.d_model
    shapes = [(rows, 3 * h, h), (rows, h, h), (rows, 4 * h, h), (rows, h, 4 * h),
              (rows, cfg.vocab_size, h)]
    gemm = max(f / t for f, t in gemm_curve(shapes, dtype, matmul=matmul))
    return gemm, stream_rate(rows * 4 * h, dtype), elementwise_rate(rows, h, dtype)


def timed_step(run, step, prof):
    """The training step ``train`` runs (``train/steps.train_step``) on batch ``step``,
    in ``prof``'s phases; returns its wall seconds, the bookkeeping left out."""
    from minipar.train.steps import train_step
    c, opt = run.config, run.optimizer
    x, y = (run.parallel.local_tokens(run.balancer.my_rows(a))    # this replica's share
            for a in run.dataset.batch(c.seed, step, c.batch_size))
    own, t0 = prof.own_s, time.perf_counter()
    with np.errstate(all="ignore"):    # fp16 overflows are the scaler's to handle
        train_step(run.parallel, opt, x, y, c.grad_accum, c.grad_clip, read_loss_now=True,
                   phase=prof.phase)
    backend.sync()
    wall = time.perf_counter() - t0 - (prof.own_s - own)
    prof.phases["optimizer"] -= opt.exposed_comm_s
    prof.phases["comm"] += opt.exposed_comm_s
    return wall


def profile_run(config, steps=3, top=15, json_path=None):
    """Set up ``config`` (prepared: ``config.prepare``) as ``train`` does, 1 warm-up step,
    ``steps`` profiled steps and ``steps`` without the profiler; rank 0 prints the tables
    (and writes ``json_path``)."""
    from minipar.process.threads import describe_threads
    from minipar.train import setup
    if config.pipelined:
        raise ConfigError("`pp` and `chunks`: a pipeline interleaves the forward and backward "
                          "of micro-batches, which profile cannot cut into phases")
    run = setup(config, prepared=True)
    c, cfg, grid = run.config, run.cfg, run.grid
    rows = c.batch_size // (c.dp * c.grad_accum) * (cfg.seq_len // c.cp)
    half = c.precision in ("fp16", "bf16") and backend.backend_name() == "numpy"   # fp32 GEMMs
    gemm, mem_bw, fused_bw = machine_rates(cfg, rows, "fp32" if half else c.precision)
    gemm = c.peak_tflops * 1e12 if c.peak_tflops else gemm
    backend.memory.reset_peak()
    with run.process_memory.phase("steps"):                     # its peak RSS (procmem)
        timed_step(run, 0, StepProfiler())                      # warm-up: allocations, pools
        with StepProfiler() as prof:
            walls = [timed_step(run, 1 + i, prof) for i in range(steps)]
        plain = statistics.fmean(timed_step(run, 1 + steps + i, StepProfiler())
                                 for i in range(steps))
    memory = _memory_per_rank(run)                              # collective
    opt_bytes = 8 * sum(s.master.nbytes for s in run.optimizer.sync.slots)
    rep = summarize(prof, steps, gemm, mem_bw, opt_bytes)
    rep.update(wall_s=sum(walls) / steps, unprofiled_step_s=plain, profiler_own_s=prof.own_s / steps,
               gemm_flops=gemm, mem_bw=mem_bw, elementwise_bw=fused_bw, model=cfg.to_dict(),
               layout=c.layout_name(), precision=c.precision, backend=backend.backend_name(),
               threads=describe_threads(), steps=steps, rows=rows, params=run.n_params,
               memory_per_rank=memory)
    if grid.rank == 0 and json_path:
        with open(json_path, "w") as f:
            json.dump(rep, f, indent=1)
    if grid.rank == 0:
        print(f"minipar profile: {c.model} ({cfg.arch}, {cfg.n_layer} layers, d_model {cfg.d_model}, "
              f"{cfg.n_head} heads, seq {cfg.seq_len}, vocab {cfg.vocab_size}; {run.n_params:,} "
              f"params), batch {c.batch_size} x {cfg.seq_len}, {c.precision}, "
              f"{backend.backend_name()}, layout {c.layout_name()}" +
              (f" (rank 0 of {grid.world.size})" if grid.world.size > 1 else "") +
              f"\nthreads: {describe_threads()}")
        print(f"machine: GEMM {gemm / 1e9:.1f} GFLOP/s ("
              f"{'--peak-tflops' if c.peak_tflops else 'best at the model shapes, measured now'}), "
              f"memory {mem_bw / 1e9:.2f} GB/s (c = a + b, {rows} x {4 * cfg.d_model}); "
              f"LayerNorm + GELU + add through autograd reach {fused_bw / 1e9:.2f} GB/s")
        print(f"{steps} profiled step(s) after 1 warm-up; a step without the profiler: "
              f"{1e3 * plain:.2f} ms (mean), with it {1e3 * rep['wall_s']:.2f} ms "
              f"(+ {1e6 * rep['profiler_own_s']:.0f} us of its own bookkeeping, left out)\n")
        mib = lambda key: ", ".join(f"{m[key] / 2 ** 20:.0f}" for m in memory)  # noqa: E731
        print(f"memory per rank, MiB: tracked arrays {mib('tracked')} | process peak RSS "
              f"{mib('peak_rss')} (construction {mib('construction')}, steps {mib('steps')}) | "
              f"memory model {mib('predicted')}\n")
        print(format_report(rep, top), flush=True)
    return rep


def _memory_per_rank(run):
    """Collective: [{tracked, peak_rss, construction, steps, predicted}] per rank (bytes)
    on rank 0: the tracked arrays' peak beside what the process held (``procmem.py``)."""
    pm = run.process_memory
    mine = {"tracked": backend.memory.peak, "predicted": run._predicted_peak(pm.floor),
            **{phase: pm.of(phase) or 0 for phase in ("construction", "steps")}}
    mine["peak_rss"] = max(mine["construction"], mine["steps"])
    world = run.grid.world
    return world.mpi.gather(mine, root=0) if world.size > 1 else [mine]
