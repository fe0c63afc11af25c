"""A hardware profile: what one rank can do and what its links cost, as JSON.

Every number the performance model uses comes from here, so a prediction is only as
good as its profile.  Two kinds exist:

- *measured* (``minipar calibrate``): curves of this machine — GEMM seconds against
  FLOPs per dtype, elementwise bandwidth, attention, the optimizer per parameter,
  the per-op overhead, and collective curves per group size and placement;
- *spec sheet* (``profiles/a100.json``, ``h100.json``, ``h200.json``): peak rates from
  the vendor's data sheet times efficiency factors, each written down in the file.

The format (all SI units: seconds, bytes, FLOP/s)::

    {"name", "description", "kind": "measured" | "spec",
     "peak_flops":   {dtype: FLOP/s}            spec peak (dense)
     "efficiency":   {"gemm": f, "memory": f, "intra": f, "inter": f,
                      "gemm_half_size_flops": F}   fractions of peak reached
     "gemm_curve":   {dtype: [[flops, seconds], ...]}   measured; overrides peak·eff
     "mem_bw":       bytes/s of elementwise work (spec: HBM bandwidth)
     "elementwise_curve": {dtype: [[bytes, fwd_s, bwd_s], ...]}  measured; overrides mem_bw
                     (a CPU has no bf16 arithmetic: NumPy emulates it element by element)
     "op_overhead_s": seconds per autograd op (forward or backward): launch + Python
     "attention":    {"naive"|"flash"[":" dtype]: [[b·a·s²·d, fwd_s, bwd_s], ...]}  measured
                     (no dtype suffix: fp32)
     "optimizer_s_per_param": {dtype: seconds}  AdamW step per parameter
     "mem_per_rank_bytes", "ranks_per_node", "cores_per_node",
     "nodes_per_host": nodes whose ranks share one host's cores_per_node cores (1 on a
                     real cluster; the simulated cluster's namespaces all share one)
     "wait_cpu_share": CPU seconds per second of a rank waiting in a receive (about 1
                     where MPI polls: then ranks sharing cores slow each other all
                     step, ``host.compute_slowdown``)
     "links":        {"intra"|"inter": {"alpha": s, "bw": bytes/s per rank}}
     "collectives":  {kind: {"<p>:<placement>": [[bytes, seconds], ...]}}  measured
     "cost_params":  the comm cost model's constants (``comm.cost_params.CostParams``)
     "notes":        [str, ...]}

``load_profile("a100")`` finds a shipped profile by name, anything else is a path.
"""
from __future__ import annotations

import bisect
import copy
import json
import math
import os
import statistics
from dataclasses import dataclass, field

HERE = os.path.join(os.path.dirname(os.path.abspath(__file__)), "profiles")
DTYPE_BYTES = {"fp64": 8, "fp32": 4, "bf16": 2, "fp16": 2}


def shipped():
    """Names of the profiles that come with minipar."""
    return sorted(os.path.splitext(f)[0] for f in os.listdir(HERE) if f.endswith(".json"))


def interp_loglog(points, x):
    """y at x on the piecewise-linear log-log curve through ``points`` [[x, y], ...];
    beyond the ends, proportional to x (rate of the nearest end)."""
    pts = sorted((float(a), float(b)) for a, b in points if a > 0 and b > 0)
    if not pts or x <= 0:
        return 0.0
    xs = [p[0] for p in pts]
    i = bisect.bisect_left(xs, x)
    if i == 0:
        return pts[0][1] * max(x / pts[0][0], 0.0) if x < pts[0][0] else pts[0][1]
    if i == len(pts):
        return pts[-1][1] * x / pts[-1][0]
    (x0, y0), (x1, y1) = pts[i - 1], pts[i]
    w = math.log(x / x0) / math.log(x1 / x0)
    return math.exp(math.log(y0) + w * (math.log(y1) - math.log(y0)))


@dataclass
class Profile:
    name: str
    description: str = ""
    kind: str = "spec"
    peak_flops: dict = field(default_factory=dict)
    efficiency: dict = field(default_factory=dict)
    gemm_curve: dict = field(default_factory=dict)
    mem_bw: float = 1e11
    elementwise_curve: dict = field(default_factory=dict)
    op_overhead_s: float = 0.0
    attention: dict = field(default_factory=dict)
    optimizer_s_per_param: dict = field(default_factory=dict)
    mem_per_rank_bytes: float = 0.0
    ranks_per_node: int = 8
    cores_per_node: int = 0
    nodes_per_host: int = 1
    wait_cpu_share: float = 0.0
    links: dict = field(default_factory=dict)
    collectives: dict = field(default_factory=dict)
    cost_params: dict = field(default_factory=dict)
    notes: list = field(default_factory=list)

    # ------------------------------------------------------------ compute
    def gemm_seconds(self, flops, dtype, nbytes=0.0):
        """One GEMM of ``flops`` FLOPs moving ``nbytes``: the measured curve, else the
        roofline max(F / (peak·eff(F)), bytes / bw), eff(F) = eff·F/(F + F_half)."""
        curve = self.gemm_curve.get(dtype) or self.gemm_curve.get("fp32")
        if curve:
            return interp_loglog(curve, flops)
        eff = self.efficiency.get("gemm", 1.0)
        half = self.efficiency.get("gemm_half_size_flops", 0.0)
        rate = self.peak(dtype) * eff * (flops / (flops + half) if half else 1.0)
        return max(flops / rate, nbytes / self.memory_bw())

    def peak(self, dtype):
        return self.peak_flops.get(dtype) or self.peak_flops.get("fp32") or 1e12

    def memory_bw(self):
        return self.mem_bw * self.efficiency.get("memory", 1.0)

    def elementwise_seconds(self, nbytes, dtype=None, backward=False):
        """Seconds of memory-bound work whose forward moves ``nbytes`` of ``dtype`` values,
        forward or its backward: the measured curve (its size matters: what fits in cache
        runs faster), else bytes / bandwidth, a backward moving twice the bytes."""
        curve = self.elementwise_curve.get(dtype or "fp32")
        if curve:
            return interp_loglog([[p[0], p[2 if backward else 1]] for p in curve], nbytes)
        return (2 if backward else 1) * nbytes / self.memory_bw()

    def attention_curve(self, kind, dtype):
        """The measured attention curve of ``kind`` for ``dtype`` (else fp32's), or None."""
        return self.attention.get(f"{kind}:{dtype}") or self.attention.get(kind)

    def optimizer_seconds(self, params, dtype):
        per = self.optimizer_s_per_param.get(dtype) or self.optimizer_s_per_param.get("fp32")
        return params * (per if per else 16 * DTYPE_BYTES.get(dtype, 4) / self.memory_bw())

    def overlaps_comm(self, ranks_per_node):
        """Whether communication can hide behind compute.  On a GPU the copies run on
        their own engines; on a CPU a transfer is a core's work, so it hides only when
        each rank has a core beyond its compute thread (``sync/hooks.spare_core``) —
        counting every rank on the host's cores (``nodes_per_host`` nodes of them)."""
        if self.kind == "spec" or not self.cores_per_node:
            return True
        return self.cores_per_node >= 2 * max(ranks_per_node, 1) * max(self.nodes_per_host, 1)

    # ------------------------------------------------------------ links
    def link(self, placement):
        d = self.links.get(placement) or self.links.get("intra") or {"alpha": 1e-5, "bw": 1e9}
        eff = self.efficiency.get(placement, 1.0)
        return d["alpha"], d["bw"] * eff

    def curve(self, kind, p, placement):
        """The measured curve of ``kind`` over ``p`` ranks at ``placement``; an intra-node
        curve stands in for a missing inter one only where no inter link is known (then
        the link's α and β price it instead)."""
        c = self.collectives.get(kind, {})
        found = c.get(f"{p}:{placement}")
        if found or (placement == "inter" and "inter" in self.links):
            return found
        return c.get(f"{p}:intra")

    def to_dict(self):
        return {k: getattr(self, k) for k in self.__dataclass_fields__}

    def save(self, path):
        with open(path, "w") as f:
            json.dump(self.to_dict(), f, indent=1)


def load_profile(name_or_path=None) -> Profile:
    """A shipped profile by name (``a100``, ``h100``, ``h200``, ``cpu``), or a JSON path.
    None: ``$MINIPAR_PROFILE``, else the shipped ``cpu`` profile."""
    if isinstance(name_or_path, Profile):
        return name_or_path
    name_or_path = name_or_path or os.environ.get("MINIPAR_PROFILE") or "cpu"
    path = os.path.join(HERE, f"{name_or_path}.json")
    if not os.path.isfile(path):
        path = name_or_path
    if not os.path.isfile(path):
        raise FileNotFoundError(f"no profile {name_or_path!r}: shipped ones are "
                                f"{', '.join(shipped())}, or give a path to a JSON file")
    with open(path) as f:
        data = json.load(f)
    return Profile(**{k: v for k, v in data.items() if k in Profile.__dataclass_fields__})


def _median_curve(curves):
    """Point-wise median of curves measured at the same x: [[x, y...], ...] each."""
    return [[pts[0][0]] + [statistics.median(p[j] for p in pts) for j in range(1, len(pts[0]))]
            for pts in zip(*curves)]


def median_profile(profiles):
    """One profile from several calibrations of the same machine: the median of every
    measured number (a shared machine has slow spells of seconds; one calibration taken
    in one would skew every prediction).  The profiles must hold the same curves."""
    med = statistics.median
    first = copy.deepcopy(profiles[0])
    first.op_overhead_s = med([p.op_overhead_s for p in profiles])
    first.mem_bw = med([p.mem_bw for p in profiles])
    first.wait_cpu_share = med([p.wait_cpu_share for p in profiles])
    for k in first.efficiency:
        first.efficiency[k] = med([p.efficiency.get(k, 0.0) for p in profiles])
    for name in ("optimizer_s_per_param", "peak_flops"):
        table = getattr(first, name)
        for k in table:
            table[k] = med([getattr(p, name)[k] for p in profiles])
    for name in ("gemm_curve", "attention", "elementwise_curve"):
        table = getattr(first, name)
        for k in table:
            table[k] = _median_curve([getattr(p, name)[k] for p in profiles])
    for kind, curves in first.collectives.items():
        for key in curves:
            curves[key] = _median_curve([p.collectives[kind][key] for p in profiles])
    first.notes.append(f"the median of {len(profiles)} calibrations")
    return first
