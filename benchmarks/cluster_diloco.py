"""DDP against DiLoCo across a slow link, on the simulated cluster.  Needs root, ip and tc
(``minipar/cluster``).

    sudo python benchmarks/cluster_diloco.py [--steps 60] [--mbit 100] [--model llama-small]
        [--only NAME] [--out DIR]

2 nodes x 2 ranks, the link between them shaped to ``--mbit`` Mbit/s; the model on the
standard library's BPE tokens (``--data stdlib``), 8 sequences a step, equal tokens for
every run (``--steps`` steps of the same global batch):

    DDP                 --dp 4: every step all-reduces the gradients over the link
    DiLoCo H=10         2 groups (one per node, dp 2 inside), an outer step every 10
    DiLoCo H=50         ... every 50
    streaming F=4 int8  H=50 in 4 fragments, tau 1, alpha 0.5, int8 with error feedback

Per run: wall time, the bytes that crossed the link (the cluster's counters of the link
between the nodes, before and after), val bits per byte after the run.  Then **equal wall
time**: each DiLoCo run again for as many steps as fit in DDP's wall time at its measured
pace (steps · t_DDP / t_run; its LR schedule spans them), and its val bits per byte.
Writes the logs and ``report``'s figures (the equal-token runs) to ``--out``.  Time on a
shared machine is noisy: one run each, whatever they show.
"""
from __future__ import annotations

import argparse
import json
import math
import os
import re
import sys
import tempfile

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

from cluster_links import Cluster, minipar   # noqa: E402

RUNS = {
    "DDP": ["--dp", "4"],
    "DiLoCo H=10": ["--outer", "diloco", "--diloco-groups", "2", "--inner-steps", "10"],
    "DiLoCo H=50": ["--outer", "diloco", "--diloco-groups", "2", "--inner-steps", "50"],
    "streaming F=4 int8": ["--outer", "diloco", "--diloco-groups", "2", "--inner-steps", "50",
                           "--diloco-fragments", "4", "--outer-compression", "int8"],
}


def link_bytes(prefix):
    """Bytes that left the nodes over their links (``cluster status``), summed."""
    out = minipar("cluster", "status", "--prefix", prefix).stdout
    return sum(float(m) for m in re.findall(r"([\d.]+) MiB out", out)) * 2 ** 20, out


def main():
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--mbit", type=float, default=100.0)
    p.add_argument("--steps", type=int, default=60)
    p.add_argument("--model", default="llama-small")
    p.add_argument("--prefix", default="mpd")
    p.add_argument("--only", action="append", help="run only these (names of RUNS)")
    p.add_argument("--out", default=tempfile.mkdtemp())
    args = p.parse_args()
    os.makedirs(args.out, exist_ok=True)
    common = ["--model", args.model, "--data", "stdlib", "--batch-size", 8, "--quiet",
              "--eval-batches", 4]
    rows, logs = [], []
    Cluster.prefix = args.prefix
    with Cluster(2, 2, args.mbit / 1000) as c:
        def train(name, flags, steps):
            log = os.path.join(args.out, re.sub(r"\W+", "_", name).strip("_") + f"_{steps}.json")
            before, _ = link_bytes(args.prefix)
            proc = c.run("train", *common, "--steps", steps, *flags, "--log-json", log)
            after, _ = link_bytes(args.prefix)
            val = re.search(r"val loss\s+[\d.]+ nats/\S+ \(([\d.]+) bits/byte\)", proc.stdout)
            wall = re.search(r"done: \d+ steps in ([\d.]+) s wall", proc.stdout)
            return dict(name=name, steps=steps, wall_s=float(wall.group(1)),
                        link_bytes=after - before,
                        val_bpb=float(val.group(1)) if val else math.nan, log=log)

        for name, flags in RUNS.items():
            if not args.only or name in args.only:
                rows.append(train(name, flags, args.steps))
                logs.append((name, rows[-1]["log"]))
        budget = next((r["wall_s"] for r in rows if r["name"] == "DDP"), None)
        timed = [train(r["name"], RUNS[r["name"]], round(args.steps * budget / r["wall_s"]))
                 for r in rows if budget and r["name"] != "DDP"]
    print(f"## {args.model} on stdlib tokens, 2 nodes x 2 ranks, {args.mbit:g} Mbit/s between "
          f"nodes; 8 sequences a step; one run each on a shared 2-core machine")
    print(f"\nequal tokens: {args.steps} steps each")
    print(f"{'run':<22} {'wall s':>8} {'link MB':>9} {'val bits/byte':>14}")
    for r in rows:
        print(f"{r['name']:<22} {r['wall_s']:8.1f} {r['link_bytes'] / 1e6:9.1f} {r['val_bpb']:14.3f}")
    if timed:
        print(f"\nequal wall time: as many steps as fit in DDP's {budget:.1f} s at each run's pace")
        print(f"{'run':<22} {'steps':>6} {'wall s':>8} {'link MB':>9} {'val bits/byte':>14}")
        for r in [next(r for r in rows if r["name"] == "DDP")] + timed:
            print(f"{r['name']:<22} {r['steps']:6d} {r['wall_s']:8.1f} {r['link_bytes'] / 1e6:9.1f} "
                  f"{r['val_bpb']:14.3f}")
    rows += timed
    with open(os.path.join(args.out, "results.json"), "w") as f:
        json.dump(rows, f, indent=1)
    minipar("report", *[log for _, log in logs], *[x for n, _ in logs for x in ("--label", n)],
            "--out", os.path.join(args.out, "report"))


if __name__ == "__main__":
    main()
