"""Ring attention against Ulysses and the hybrid on a simulated cluster: step times measured
and predicted, and what ``plan`` picks.  Needs root, ip and tc (``minipar/cluster``).

    sudo python benchmarks/cluster_ulysses.py [--inter-gbps 1] [--seq-len 2048] [--steps 6]
        [--repeats 2] [--prefix mpu]

2 nodes x 2 ranks, a link of ``--inter-gbps`` between them; a small model (2 layers,
d_model 64, 4 heads) on sequences of ``--seq-len`` bytes, 4 sequences a step, context
parallelism over all 4 ranks three ways:

    ring      --cp 4                                 K/V blocks round the 4 ranks (zig-zag)
    ulysses   --cp 4 --cp-kind ulysses               two all-to-alls over the 4 ranks each way
    hybrid    --cp 4 --cp-kind ulysses --cp-ulysses 2   Ulysses inside each node, the ring across

First ``calibrate`` on the cluster writes the profile the predictions use, at
``--calibrate-seq-len`` (512: its attention curve, over b·a·s²·d for 1, 4 and 16
sequences, spans what the runs compute — the ring's 256-token chunk pairs on 4 heads,
Ulysses' whole sequence on one head — where calibrating at 2,048 tokens would time
16 sequences' 2,048² scores, gigabytes a matrix); then each layout trains ``--steps`` steps, ``--repeats`` times,
interleaved (the first step of each run is a warm-up and is dropped); the median step
is set against ``estimate.predict``'s, and ``plan`` ranks every 4-rank layout with the
same profile.  Time on a shared 2-core machine is noisy: the figures are medians.
"""
from __future__ import annotations

import argparse
import os
import shutil
import statistics
import sys
import tempfile
from dataclasses import replace

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

from cluster_links import Cluster, minipar, step_times   # noqa: E402

MODEL = dict(model="tiny", n_layer=2, d_model=64, n_head=4)
LAYOUTS = {"ring": dict(cp=4), "ulysses": dict(cp=4, cp_kind="ulysses"),
           "hybrid U=2": dict(cp=4, cp_kind="ulysses", cp_ulysses=2)}


def flags(fields):
    return [x for k, v in fields.items() for x in (f"--{k.replace('_', '-')}", v)]


def main():
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--inter-gbps", type=float, default=1.0)
    p.add_argument("--seq-len", type=int, default=2048)
    p.add_argument("--batch-size", type=int, default=4)
    p.add_argument("--steps", type=int, default=6)
    p.add_argument("--calibrate-seq-len", type=int, default=512)
    p.add_argument("--calibrate-repeat", type=int, default=3,
                   help="calibrations to take the median of (default 3: on a loaded 2-core machine "
                        "one calibration's attention curve can be off by 2x at a point)")
    p.add_argument("--repeats", type=int, default=2)
    p.add_argument("--prefix", default="mpu", help="the name the cluster carries (default mpu)")
    p.add_argument("--keep-profile", default=None, help="copy the calibrated profile here")
    args = p.parse_args()

    from minipar.config import TrainConfig
    from minipar.perf.estimate import predict
    from minipar.perf.plan import describe, plan
    from minipar.perf.profile import load_profile

    model = dict(MODEL, seq_len=args.seq_len)
    load_before = os.getloadavg()[0]
    run = ["--data", "stdlib-bytes", "--steps", args.steps, "--batch-size", args.batch_size,
           "--eval-batches", 0, "--quiet", *flags(model)]
    prof_path = os.path.join(tempfile.mkdtemp(), "cluster.json")
    measured = {name: [] for name in LAYOUTS}
    Cluster.prefix = args.prefix
    with Cluster(2, 2, args.inter_gbps) as c:
        c.run("calibrate", *flags(dict(model, seq_len=args.calibrate_seq_len)), "--quick",
              "--repeat", args.calibrate_repeat, "--out", prof_path)
        for i in range(args.repeats):
            for name in (list(LAYOUTS) if i % 2 == 0 else list(LAYOUTS)[::-1]):
                log = os.path.join(tempfile.mkdtemp(), "log.json")
                c.run("train", *run, *flags(LAYOUTS[name]), "--log-json", log,
                      env={"MINIPAR_PROFILE": prof_path})
                measured[name] += step_times(log)
    prof = load_profile(prof_path)
    base = TrainConfig(**model, batch_size=args.batch_size, data="stdlib-bytes", vocab_size=256)
    print(f"## context parallelism on 2 nodes x 2 ranks, {args.inter_gbps:g} Gbit/s between "
          f"nodes: {args.seq_len}-token sequences, {args.batch_size} a step, 2 layers, d_model 64, "
          f"4 heads, fp32, naive attention; {args.repeats} interleaved runs of {args.steps} steps "
          f"each (first step dropped); the profile calibrated on this cluster; load average "
          f"{load_before:.1f} before, {os.getloadavg()[0]:.1f} after, on {os.cpu_count()} cores")
    print(f"{'layout':<12} {'flags':<46} {'measured ms':>11} {'predicted ms':>12} {'error':>6}")
    errors, rows = [], []
    for name, fields in LAYOUTS.items():
        config = replace(base, **fields).resolve(4)
        got = statistics.median(measured[name])
        pred = predict(config, prof, ranks_per_node=2).step_s
        errors.append(abs(pred / got - 1))
        rows.append((got, name))
        print(f"{name:<12} {' '.join(map(str, flags(fields))):<46} {got * 1e3:11.1f} "
              f"{pred * 1e3:12.1f} {pred / got - 1:+6.0%}")
    print(f"prediction error: median {statistics.median(errors):.0%}, max {max(errors):.0%}, "
          f"within 15% for {sum(e <= 0.15 for e in errors)} of {len(errors)}")
    print(f"fastest measured: {min(rows)[1]}")
    pl = plan(base, 4, prof_path, nodes=2)
    cp4 = [p for p in pl.ranked if p.config.cp == 4 and p.config.dp == 1 and p.config.zero == 0
           and p.config.recompute == "none" and p.config.grad_accum == 1]
    print("plan, the three cp4 layouts as measured (no ZeRO, recomputation or accumulation):")
    for p in cp4:
        print(f"   {describe(p.config):<60} {p.step_s * 1e3:9.1f} ms")
    print("plan's top 5 of every 4-rank layout:")
    for p in pl.ranked[:5]:
        print(f"   {describe(p.config):<60} {p.step_s * 1e3:9.1f} ms")
    print(f"plan picks among the three: {cp4[0].config.cp_kind}"
          f"{' U=' + str(cp4[0].config.cp_ulysses) if cp4[0].config.cp_ulysses else ''}")
    if args.keep_profile:
        shutil.copy(prof_path, args.keep_profile)


if __name__ == "__main__":
    main()
