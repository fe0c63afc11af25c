"""``minipar calibrate``: measure this machine into a hardware profile (``profile.py``).

    python -m minipar.perf.calibrate [--model tiny ...] [--out profile.json]
    mpiexec -n 2 python -m minipar.perf.calibrate --out p.json     (+ the link curves)

What is timed (medians of a few repetitions, and the whole calibration ``--repeat``
times, 3 by default, with the median of each number kept; the load is written down):

- GEMM seconds against FLOPs, per dtype, at the model's own matmul shapes
  (b·s × h · h × 3h, ... for a few micro-batch sizes b);
- the per-op overhead and the optimizer step's fixed cost, on a miniature of the model
  (``miniature_overheads``: its ops and tensors, no arithmetic to speak of);
- elementwise bandwidth *as minipar's ops reach it*: LayerNorm, GELU and an add,
  forward and backward through autograd on (b·s, h), over the bytes the compute
  model counts for them (``compute.elementwise_bytes``) — a curve against size per
  dtype (on a CPU, bf16 and fp16 arithmetic is emulated and several times slower);
- attention (naive and flash), forward and backward, against b·a·s²·d (naive also
  per dtype), and ring attention's chunk pair (``calibrate_attention.py``);
- AdamW per parameter (fp32, fp64);
- with ranks, for the world group: all-reduce, all-gather, reduce-scatter and send/recv
  curves, each timed right after compute (``calibrate_curves.py``; placement ``intra``:
  one machine; ranks sharing cores when there are more ranks than cores), ZeRO-3's cost
  per unit over ZeRO-2 (``calibrate_model.py``), and the comm cost model's constants and
  winners (``calibrate_links.py``);
- the model's own forward + backward of one micro-batch against the sum of its ops
  (``calibrate_model.model_compute_scale``);
- the cores: ``cores_per_node`` is this machine's, ``nodes_per_host`` how many of the
  nodes found share them (ranks on the same kernel: the simulated cluster's namespaces).
  Where the host runs more ranks than cores, rank 0 times the compute alone while the
  others sleep, then every rank runs the model's pass at once (``core_sharing_excess``);
  and whether a rank waiting in a receive burns its core (``wait_cpu_share``): both
  feed ``host.compute_slowdown``.
"""
from __future__ import annotations

import os
import statistics

from minipar.cli_checks import CommandError, OneLineParser, as_flags, at_least, output_file
from minipar import backend
from minipar.backend import xp
from minipar.perf import host
from minipar.perf.calibrate_curves import SIZES, comm_curves
from minipar.perf.calibrate_attention import attention_curve, ring_pair_curve
from minipar.perf.calibrate_model import median_seconds as _time
from minipar.perf.calibrate_model import (miniature_overheads, model_compute_scale,
                                          model_pass_seconds, zero3_unit_overhead)
from minipar.perf.profile import Profile, median_profile
from minipar.process import setup_process


def _dtype(name):
    return backend.dtype_of(name)


def gemm_curve(shapes, dtype, matmul=None):
    """[[flops, seconds]] of x @ w for each (m, n, k).  ``matmul``: the product to time;
    by default the model's own (``autograd.ops_reduce._mm``: split over the rank's thread
    pool when it has several, half precision through fp32 with its casts), so the rate is
    the one training gets."""
    if matmul is None:
        from minipar.autograd.ops_reduce import _mm as matmul
    pts = []
    for m, n, k in shapes:
        a = xp.ones((m, k), dtype=_dtype(dtype))
        w = xp.ones((k, n), dtype=_dtype(dtype))
        pts.append([2.0 * m * n * k, _time(lambda: matmul(a, w))])
    return sorted(pts)


def op_overhead():
    from minipar.autograd import Tensor
    x = Tensor(xp.ones(1), requires_grad=True)

    def one():
        (x + x).sum().backward()
    return _time(one, 50) / 4        # add and sum, forward and backward each


def elementwise_curve(rows, h, dtype="fp32"):
    """[[bytes, forward s, backward s]] of a layer's memory-bound work at each token count
    in ``rows``: ``compute.elementwise_bytes`` of the layer against the measured time of
    ``elementwise_rate``'s ops, forward alone and the backward that follows.  A curve,
    not one rate: a small batch's activations stay in cache, a large one's stream from
    memory.  Forward and backward apart: minipar's fused backwards take about as long as
    their forwards here (not twice, as counting their bytes would say)."""
    from minipar.perf.compute import LayerShape, elementwise_bytes
    pts = []
    for n in rows:
        nbytes = elementwise_bytes(LayerShape(1, n, h, 1, 1, dtype=dtype))
        fwd, both = _elementwise_times(n, h, dtype)
        pts.append([nbytes, fwd, max(both - fwd, 0.5 * fwd)])
    return sorted(pts)


def _elementwise_times(N, h, dtype):
    """(forward s, forward + backward s) of LN + GELU + adds through autograd, each net of
    its ops' fixed per-op cost (counted apart, as ``op_overhead_s``)."""
    from minipar.autograd import Tensor, ops
    x = Tensor(xp.ones((N, h), dtype=_dtype(dtype)), requires_grad=True)
    w, bias = Tensor(xp.ones(h, dtype=_dtype(dtype))), Tensor(xp.zeros(h, dtype=_dtype(dtype)))
    x4 = Tensor(xp.ones((N, 4 * h), dtype=_dtype(dtype)), requires_grad=True)

    def forward():
        y = ops.layer_norm(x, w, bias, 1e-5)
        z = ops.layer_norm(y + x, w, bias, 1e-5) + y
        return ops.gelu(x4).sum() + z.sum()
    over = 8 * op_overhead()            # 8 ops: 2 LayerNorms, 3 adds, GELU, 2 sums
    fwd = _time(forward) - over
    both = _time(lambda: forward().backward()) - 2 * over
    return max(fwd, 1e-9), max(both, 2e-9)


def elementwise_rate(N, h, dtype="fp32"):
    """Effective bytes/s of LN + GELU + adds through autograd, forward and backward, over
    3x the forward's bytes (the bandwidth view: a backward moves about twice as much)."""
    from minipar.perf.compute import LayerShape, elementwise_bytes
    _, both = _elementwise_times(N, h, dtype)
    return 3 * elementwise_bytes(LayerShape(1, N, h, 1, 1, dtype=dtype)) / both


def stream_rate(n, dtype="fp32"):
    """Memory bytes/s of c = a + b over ``n`` elements (3·n·itemsize bytes: two arrays
    read, one written), on the rank's threads (``autograd.rows``): the bandwidth ceiling
    of an elementwise op, against which ``elementwise_rate`` is what minipar's ops reach."""
    from minipar.autograd.rows import for_row_blocks
    a, b, c = (xp.ones(n, dtype=_dtype(dtype)) for _ in range(3))

    def add():
        for_row_blocks(n, lambda lo, hi: xp.add(a[lo:hi], b[lo:hi], out=c[lo:hi]), n)
    return 3 * a.nbytes / max(_time(add, 9), 1e-9)


def optimizer_per_param(dtype, n=1 << 20):
    from minipar.optim import adamw_update
    p, g, m, v = (xp.ones(n, dtype=_dtype(dtype)) for _ in range(4))
    return _time(lambda: adamw_update(p, g, m, v, 1, 1e-3, 0.9, 0.95, 1e-8, 0.1)) / n


def model_pass(cfg, micro_rows):
    """(rows, seconds) of the model's own forward + backward on the middle micro-batch of
    ``micro_rows``: the pass ``model_compute_scale`` and ``sharing_excess`` compare with."""
    rows = micro_rows[len(micro_rows) // 2]
    return rows, model_pass_seconds(cfg, rows, reps=9)


COMPUTE_FIELDS = ("gemm_curve", "op_overhead_s", "efficiency", "attention", "elementwise_curve",
                  "mem_bw", "optimizer_s_per_param", "peak_flops")


def measure_compute(prof, cfg, micro_rows, dtypes):
    """Fill ``prof``'s COMPUTE_FIELDS: what one rank's arithmetic costs.  Returns the
    seconds of the model's own pass on the middle micro-batch (``model_compute_scale``)."""
    h, s, V, a = cfg.d_model, cfg.seq_len, cfg.vocab_size, cfg.n_head
    shapes = []
    for b in micro_rows:
        m = b * s
        shapes += [(m, 3 * h, h), (m, h, h), (m, 4 * h, h), (m, h, 4 * h), (m, V, h), (m, h // 2, h)]
    for dt in dtypes:
        try:
            prof.gemm_curve[dt] = gemm_curve(shapes, dt)
        except (TypeError, ValueError):
            continue
    prof.op_overhead_s, prof.efficiency["step_overhead_s"] = miniature_overheads(cfg)
    rows = [b * s for b in micro_rows]
    att = [(b, a, s, h // a) for b in micro_rows]
    prof.attention = {"flash": attention_curve("flash", att)}
    for dt in prof.gemm_curve:          # each dtype at NumPy's own speed (bf16 emulated)
        prof.elementwise_curve[dt] = elementwise_curve(rows, h, dt)
        prof.attention["naive" if dt == "fp32" else f"naive:{dt}"] = attention_curve("naive", att, dt)
    # the ring's chunk pairs in fp32 (other dtypes: priced as the model's attention op)
    prof.attention["ring:naive:fp32"] = ring_pair_curve("naive", att, "fp32")
    nbytes, fwd, bwd = prof.elementwise_curve["fp32"][len(rows) // 2]
    prof.mem_bw = 3 * nbytes / (fwd + bwd)   # one rate, the bandwidth view: backward moves 2x
    prof.optimizer_s_per_param = {dt: optimizer_per_param(dt) for dt in ("fp32", "fp64")}
    prof.peak_flops = {dt: max(f / t for f, t in c) for dt, c in prof.gemm_curve.items()}
    pass_rows, pass_s = model_pass(cfg, micro_rows)
    prof.efficiency["model_compute_scale"] = model_compute_scale(prof, cfg, pass_rows, pass_s)
    return pass_s


def calibrate(cfg, micro_rows=(1, 4, 16), dtypes=("fp32", "fp64", "bf16", "fp16"), comm=None):
    """A measured Profile of this machine for the shapes of model ``cfg``.  Where the host
    runs more ranks than it has cores, rank 0 times the compute alone while the others
    sleep (a core's rates; ``host.compute_slowdown`` prices the sharing) and sends it to
    them."""
    prof = Profile(name="measured", kind="measured", description="minipar calibrate on "
                   f"{os.uname().nodename}, load {os.getloadavg()[0]:.1f} on {os.cpu_count()} cores")
    if comm is not None and comm.size > 1 and host.oversubscribed(comm.mpi, os.cpu_count() or 1):
        def rates():
            pass_s = measure_compute(prof, cfg, micro_rows, dtypes)
            return pass_s, {k: getattr(prof, k) for k in COMPUTE_FIELDS}
        alone_s, fields = host.on_rank0_alone(comm.mpi, rates)
        for k, v in fields.items():
            setattr(prof, k, v)
        prof.efficiency["core_sharing_excess"] = host.sharing_excess(
            comm.mpi, os.cpu_count() or 1, lambda: model_pass(cfg, micro_rows)[1], alone_s)
    else:
        measure_compute(prof, cfg, micro_rows, dtypes)
    prof.cores_per_node = os.cpu_count() or 1
    prof.ranks_per_node = max(comm.size if comm else 1, 1)
    prof.links = {"intra": {"alpha": 3e-5, "bw": 1e9}}
    if comm is not None and comm.size > 1:
        from minipar.perf import calibrate_links
        ctx = comm.context("coll")
        prof.wait_cpu_share = host.wait_cpu_share(ctx.mpi)
        prof.collectives = comm_curves(ctx)
        prof.efficiency["zero3_unit_overhead_s"] = zero3_unit_overhead(cfg, ctx)
        c, _ = calibrate_links.measure_winners(ctx, SIZES, calibrate_links.calibrate(ctx))
        prof.cost_params = c.to_dict()
        prof.links = {"intra": {"alpha": c.alpha, "bw": 1 / (c.beta_large or c.beta)}}
        if c.alpha_inter is not None:           # ranks on several nodes: both kinds of link
            q = prof.ranks_per_node = c.ranks_per_node
            prof.nodes_per_host = host.nodes_per_host(ctx, q)
            prof.links["inter"] = {"alpha": c.alpha_inter, "bw": 1 / c.beta_inter}
            node = ctx.split(ctx.rank // q, ctx.rank)            # a node's ranks
            across = ctx.split(ctx.rank % q, ctx.rank)           # one rank of every node
            gaps = []                   # the link's idle time before each timed call
            prof.collectives = comm_curves(ctx, placement="inter", peer_distance=q, gaps=gaps)
            for group, where in ((node, "intra"), (across, "inter")):
                for kind, curves in comm_curves(group, placement=where,
                                                gaps=gaps if where == "inter" else None).items():
                    prof.collectives[kind].update(curves)
            prof.efficiency["comm_gap_s"] = statistics.median(gaps)
            prof.notes = [f"measured for {cfg}", f"nodes of {q} ranks: the whole group's and "
                          "one-rank-per-node groups' curves cross nodes (inter), a node's stay "
                          "inside (intra)"]
            return prof
    prof.notes = [f"measured for {cfg}", "placement intra: every rank on this machine"]
    return prof


def _checked_model(args, config_from_preset):
    """The model to calibrate for, or CommandError before any measurement: a size below 1,
    a model that cannot be built, an --out that cannot be written."""
    for flag in ("n_layer", "d_model", "n_head", "seq_len", "repeat"):
        at_least("--" + flag.replace("_", "-"), getattr(args, flag), 1)
    output_file("--out", args.out)
    try:
        return config_from_preset(args.model, n_layer=args.n_layer, d_model=args.d_model,
                                  n_head=args.n_head, seq_len=args.seq_len)
    except ValueError as err:
        raise CommandError(as_flags(err)) from None


def calibrate_main(argv=None):
    """The ``minipar calibrate`` command: flags of the model, ``--out``."""
    from minipar.nn import config_from_preset
    ap = OneLineParser(prog="minipar calibrate", description=__doc__.split("\n")[0])
    ap.add_argument("--model", default="small")
    for f in ("n_layer", "d_model", "n_head", "seq_len"):
        ap.add_argument("--" + f.replace("_", "-"), type=int, default=None)
    ap.add_argument("--out", default="profile.json")
    ap.add_argument("--quick", action="store_true", help="fp32, fp64 and bf16 only (no fp16)")
    ap.add_argument("--repeat", type=int, default=3,
                    help="calibrations to take the median of (default 3)")
    args = ap.parse_args(argv)
    cfg = _checked_model(args, config_from_preset)
    comm = None
    if int(os.environ.get("PMI_SIZE", os.environ.get("OMPI_COMM_WORLD_SIZE", "1"))) > 1:
        from minipar.comm import Communicator
        comm = Communicator()
    setup_process(comm)       # rates measured with the threads and allocator training uses
    dtypes = ("fp32", "fp64", "bf16") if args.quick else ("fp32", "fp64", "bf16", "fp16")
    prof = median_profile([calibrate(cfg, dtypes=dtypes, comm=comm) for _ in range(args.repeat)])
    if comm is None or comm.rank == 0:
        prof.save(args.out)
        print(f"wrote {args.out}: {prof.description}")
    return 0


if __name__ == "__main__":
    raise SystemExit(calibrate_main())
