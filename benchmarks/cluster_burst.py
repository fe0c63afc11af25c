"""The two-level all-reduce model with and without a shaped link's burst credit, beside the
all-reduce times ``benchmarks/cluster_links.py`` recorded on the simulated cluster (2 nodes
x 2 ranks, 1 Gbit/s, each call on a link that had idled), offline:

    python benchmarks/cluster_burst.py PROFILE.json [--burst-kb 500]

The constants: PROFILE's ``cost_params`` (a calibration on the cluster) with α and β of
both links replaced by those the recorded run calibrated (its header line), so only the
burst differs between the two model columns.  ``--burst-kb``: the credit per node link
(default: the profile's ``burst_inter``, else tbf's bucket, 4 ms at 1 Gbit/s = 500 kB).
"""
from __future__ import annotations

import argparse
import json
import os
import sys
from dataclasses import replace

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

from minipar.comm import two_level                 # noqa: E402
from minipar.comm.cost_params import CostParams    # noqa: E402

# cluster_links.py's all-reduce part in benchmarks/recorded/cluster_2026-12-07c (each call
# after the link idled): its calibrated constants (inside α 12.4 µs, β 5.08 GB/s; between
# α 13.4 µs, β 0.120 GB/s) and measured ms
RECORDED_LINKS = dict(alpha=12.4e-6, beta=1 / 5.08e9, alpha_inter=13.4e-6, beta_inter=1 / 0.120e9)
RECORDED_MS = {
    ("ring", 1 << 18): 0.91, ("tree", 1 << 18): 0.62, ("hierarchical", 1 << 18): 1.00,
    ("ring", 1 << 20): 9.54, ("tree", 1 << 20): 10.28, ("hierarchical", 1 << 20): 5.80,
    ("ring", 1 << 22): 50.94, ("tree", 1 << 22): 65.51, ("hierarchical", 1 << 22): 33.87,
    ("ring", 1 << 24): 211.05, ("tree", 1 << 24): 283.28, ("hierarchical", 1 << 24): 152.02,
}


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("profile", help="a profile calibrated on the cluster (minipar calibrate)")
    ap.add_argument("--burst-kb", type=float, default=None)
    args = ap.parse_args()
    with open(args.profile) as f:
        c = replace(CostParams.from_dict(json.load(f)["cost_params"]), **RECORDED_LINKS)
    burst = args.burst_kb * 1e3 if args.burst_kb is not None else (c.burst_inter or 500e3)
    plain, shaped = replace(c, burst_inter=0.0), replace(c, burst_inter=burst)
    print(f"burst credit {burst / 1e3:.0f} kB per node link; model / measured")
    print(f"{'size':>9} {'algorithm':<13} {'measured ms':>11} {'no burst':>15} {'burst':>15}")
    for (algorithm, size), ms in sorted(RECORDED_MS.items(), key=lambda kv: (kv[0][1], kv[0][0])):
        a, b = (two_level.predict(algorithm, 4, size, k, 2) * 1e3 for k in (plain, shaped))
        print(f"{size:>9} {algorithm:<13} {ms:11.2f} {a:8.2f} ({a / ms:.2f}) {b:8.2f} ({b / ms:.2f})")


if __name__ == "__main__":
    main()
