"""Two kinds of links, measured: a simulated cluster (minipar/cluster) against the
two-level cost model, MPI's own Allreduce, and the planner.  Needs root, ip and tc.

    sudo python benchmarks/cluster_links.py [--inter-gbps 1] [--max-size 64M] [--skip ...]

Three parts, each on a cluster of its own (brought up, measured, brought down):

  allreduce   2 nodes x 2 ranks: ring, tree, hierarchical and auto from 1 KiB, against
              MPICH's Allreduce in the same rounds and the two-level model's prediction
              with constants calibrated across the link in the same run
              (``bench comm``); the prediction's error at >= 1 MiB
  overlap     2 nodes x 1 rank: data parallelism's step time with the all-reduce
              started from backward's hooks against after backward (median over
              steps and interleaved repeats): across a wire bytes in flight cost no core
  tp          2 nodes x 2 ranks, --tp 2 --dp 2: tp inside a node (block placement)
              against tp across nodes (cyclic), measured step times, and what
              ``plan`` predicts for the layouts with a profile calibrated on the cluster

Figures are medians; time on a shared 2-core machine is noisy, so each part says how
many rounds it took.
"""
from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
PREFIX = "mpb"                  # --prefix: the name the benchmark's clusters carry


def minipar(*args, check=True, timeout=1800, env=None):
    env = dict(os.environ, PYTHONPATH=ROOT, **(env or {}))
    proc = subprocess.run([sys.executable, "-m", "minipar", *map(str, args)], cwd=ROOT, env=env,
                          capture_output=True, text=True, timeout=timeout)
    if check and proc.returncode != 0:
        raise SystemExit(f"minipar {' '.join(map(str, args))} failed:\n{proc.stdout[-2000:]}\n{proc.stderr[-2000:]}")
    return proc


class Cluster:
    prefix = PREFIX

    def __init__(self, nodes, ranks, gbps):
        self.shape = ("--nodes", nodes, "--ranks-per-node", ranks, "--inter-gbps", gbps)

    def __enter__(self):
        minipar("cluster", "down", "--prefix", self.prefix, check=False)
        minipar("cluster", "up", "--prefix", self.prefix, *self.shape)
        return self

    def run(self, *args, placement="block", env=None):
        return minipar("cluster", "run", "--prefix", self.prefix, "--placement", placement, "--",
                       *args, env=env)

    def __exit__(self, *exc):
        minipar("cluster", "down", "--prefix", self.prefix, check=False)


def allreduce(args):
    out = os.path.join(tempfile.mkdtemp(), "bench.json")
    with Cluster(2, 2, args.inter_gbps) as c:
        c.run("bench", "comm", "--algorithms", "ring,tree,hierarchical,auto", "--max-size",
              args.max_size, "--json", out)
    with open(out) as f:
        data = json.load(f)
    cp = data["cost_params"]
    print(f"\n## all-reduce, 2 nodes x 2 ranks, {args.inter_gbps:g} Gbit/s between nodes")
    print(f"calibrated: inside α {cp['alpha'] * 1e6:.1f} µs, β {1 / cp['beta'] / 1e9:.2f} GB/s; "
          f"between α {(cp['alpha_inter'] or 0) * 1e6:.1f} µs, "
          f"β {1 / cp['beta_inter'] / 1e9 if cp['beta_inter'] else float('nan'):.3f} GB/s, "
          f"burst {cp.get('burst_inter', 0.0) / 1e3:.0f} kB")
    print(f"{'size':>6} {'algorithm':<26} {'ms':>9} {'model ms':>9} {'model/meas':>10} {'vs MPI':>7}")
    errors = []
    for r in data["rows"]:
        pred = r["predicted_s"]
        ratio = pred / r["time_s"] if pred else float("nan")
        if pred and r["size"] >= 1 << 20 and r["algorithm"] != "auto":
            errors.append(abs(ratio - 1))
        name = r["algorithm"] if r["algorithm"] != "auto" else f"auto({r['chosen']})"
        print(f"{r['size']:>6} {name:<26} {r['time_s'] * 1e3:9.2f} "
              f"{(pred or float('nan')) * 1e3:9.2f} {ratio:10.2f} {r['vs_mpi']:7.2f}")
    if errors:
        print(f"model error at >= 1 MiB: median {statistics.median(errors):.0%}, "
              f"max {max(errors):.0%} (goal: within 15%)")


def step_times(log):
    from minipar.observe.runlog import step_records
    return [r["step_time_s"] for r in step_records(log)][1:]          # step 0: warm-up


def overlap(args):
    # the bucket size the run chooses (perf/bucket_size.py, told the link by the cluster's
    # profile); the run without overlap takes the same size
    model = ["--model", "small", "--steps", args.steps, "--batch-size", 16, "--eval-batches", 0,
             "--quiet", "--dp", 2]
    times = {"overlap": [], "no overlap": []}
    with Cluster(2, 1, args.inter_gbps) as c:
        for _ in range(args.repeats):
            log = os.path.join(tempfile.mkdtemp(), "log.json")
            c.run("train", *model, "--log-json", log)
            times["overlap"] += step_times(log)
            with open(log) as f:
                size = json.loads(f.readline())["header"]["bucket_mb"]
            log = os.path.join(tempfile.mkdtemp(), "log.json")
            c.run("train", *model, "--no-overlap", "--bucket-mb", size, "--log-json", log)
            times["no overlap"] += step_times(log)
    a, b = statistics.median(times["overlap"]), statistics.median(times["no overlap"])
    print(f"\n## data parallelism across the link, 2 nodes x 1 rank, {args.inter_gbps:g} Gbit/s, "
          f"small model, {size:g} MiB buckets (the run's choice), {args.repeats} interleaved "
          f"repeats of {args.steps} steps")
    print(f"step time: overlap {a * 1e3:.1f} ms, no overlap {b * 1e3:.1f} ms, "
          f"ratio {a / b:.3f} (goal <= 0.9)")


LAYOUTS = [dict(dp=4), dict(dp=4, overlap=False), dict(dp=4, zero=1), dict(dp=2, tp=2),
           dict(dp=2, pp=2, schedule="1f1b", microbatches=4), dict(tp=2, pp=2, schedule="1f1b",
                                                                  microbatches=4), dict(tp=4)]
VOCAB = {"stdlib": None, "stdlib-bytes": 256}       # --data -> vocab (None: the tokenizer's 4,096)


def layout_configs(vocab=None, bucket_mb=None):
    """The tp part's LAYOUTS as resolved 4-rank configs of the small model, batch 16 (the
    vocabulary: ``vocab``, else the default data's); ``bucket_mb`` None: the run's choice."""
    from minipar.config import TrainConfig, preflight
    made = [TrainConfig(model="small", batch_size=16, vocab_size=vocab, bucket_mb=bucket_mb,
                        **kw) for kw in LAYOUTS]
    return [(c if vocab else preflight(c)).resolve(4) for c in made]


def tensor_parallel(args):
    """tp inside against across nodes, and predicted against measured for LAYOUTS."""
    from minipar.perf.comm import Cyclic
    from minipar.perf.estimate import predict
    from minipar.perf.plan import describe
    from minipar.perf.profile import load_profile
    run = ["--model", "small", "--steps", args.steps, "--batch-size", 16, "--eval-batches", 0, "--quiet",
           "--data", args.data]
    vocab = VOCAB[args.data]
    configs = layout_configs(vocab)
    cases = [(describe(c), "block") for c in configs] + [(describe(configs[3]), "cyclic")]
    prof = os.path.join(tempfile.mkdtemp(), "cluster.json")
    measured = {case: [] for case in cases}
    with Cluster(2, 2, args.inter_gbps) as c:
        c.run("calibrate", "--model", "small", "--quick", "--out", prof)
        for i in range(args.repeats):
            for flags, placement in (cases if i % 2 == 0 else cases[::-1]):
                log = os.path.join(tempfile.mkdtemp(), "log.json")
                c.run("train", *run, *flags.split(), "--log-json", log, placement=placement,
                      env={"MINIPAR_PROFILE": prof})   # its bucket size: as predicted
                measured[flags, placement] += step_times(log)
    profile = load_profile(prof)
    print(f"\n## 4 ranks on 2 nodes x 2, {args.inter_gbps:g} Gbit/s between nodes, small model, "
          f"batch 16, --data {args.data}; the profile calibrated on this cluster")
    from minipar.perf.host import compute_slowdown
    eff = profile.efficiency
    print(f"profile {prof}: a waiting rank burns {profile.wait_cpu_share:.2f} CPU s/s, so compute "
          f"counts x{compute_slowdown(profile, profile.ranks_per_node, 4):.2f} (4 ranks, "
          f"{profile.cores_per_node} cores); the model's own pass / the sum of its ops "
          f"{eff.get('model_compute_scale', 1.0):.2f}; curves timed "
          f"{eff.get('comm_gap_s', float('nan')) * 1e3:.1f} ms of idle link apart")
    print(f"{'layout':<58} {'placement':<9} {'measured ms':>11} {'predicted ms':>12} {'error':>6}"
          f"  (critical path ms, shared-core bound ms: perf/host.py)")
    errors = []
    for (flags, placement), config in zip(cases, configs + [configs[3]]):
        got = statistics.median(measured[flags, placement])
        where = profile.ranks_per_node if placement == "block" else Cyclic(profile.ranks_per_node, 2)
        p = predict(config, profile, ranks_per_node=where)
        pred = p.step_s
        errors.append(abs(pred / got - 1))
        print(f"{flags:<58} {placement:<9} {got * 1e3:11.1f} {pred * 1e3:12.1f} {pred / got - 1:6.0%}"
              f"  ({p.breakdown['critical_path_s'] * 1e3:.1f}, {p.breakdown['shared_cores_s'] * 1e3:.1f})")
    print(f"prediction error over {len(errors)} layouts: median {statistics.median(errors):.0%}, "
          f"within 15% for {sum(e <= 0.15 for e in errors)} (goal: at least 6)")
    plan = minipar("plan", "--ranks", 4, "--profile", prof, "--model", "small", "--batch-size", 16,
                   "--top", 5, "--placements", "block,cyclic", *(["--vocab", vocab] if vocab else []))
    print("plan with this profile, both placements:\n" + plan.stdout)


def main():
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--inter-gbps", type=float, default=1.0)
    p.add_argument("--max-size", default="64M")
    p.add_argument("--steps", type=int, default=8)
    p.add_argument("--repeats", type=int, default=3,
                   help="interleaved runs of each layout (a step on 4 ranks over 2 cores can take "
                        "a slow mode for a whole run: dp2 x tp2 block, 8 steps, medians of 162 "
                        "to 210 ms between runs; 3 runs keep one from deciding the median)")
    p.add_argument("--data", default="stdlib", choices=tuple(VOCAB),
                   help="the tp part's data: BPE tokens (4,096, the default) or bytes (256: a "
                        "smaller head, so tp's collectives weigh more in a step)")
    p.add_argument("--skip", default="", help="comma-separated parts to skip: allreduce,overlap,tp")
    p.add_argument("--prefix", default=PREFIX,
                   help=f"the name the clusters carry (default {PREFIX}; another for a second run)")
    args = p.parse_args()
    Cluster.prefix = args.prefix
    if os.geteuid() != 0:
        raise SystemExit("benchmarks/cluster_links.py needs root (network namespaces)")
    skip = set(filter(None, args.skip.split(",")))
    for name, part in (("allreduce", allreduce), ("overlap", overlap), ("tp", tensor_parallel)):
        if name not in skip:
            part(args)


if __name__ == "__main__":
    main()
