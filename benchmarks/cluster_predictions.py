"""The simulated cluster's step-time predictions, offline: the 8 layouts of
``benchmarks/cluster_links.py``'s tp part predicted from a profile calibrated on the
cluster, beside step times measured there (no cluster needed).

    python benchmarks/cluster_predictions.py PROFILE.json [--measured FILE] [--vocab 256]
        [--bucket-mb 25] [--nodes-per-host 2]

The recorded runs below ran with 25 MiB gradient buckets, the size every run used before
runs chose theirs (``perf/bucket_size.py``): replay them with ``--bucket-mb 25``.

``benchmarks/recorded/cluster_2026-12-07`` holds two profiles calibrated on the cluster
(``profile_a`` before a 4,096-token run, ``profile_b`` before a byte run) and five runs'
tables (``runN_tokens.txt``, ``runN_bytes.txt``: pass ``--vocab 256``), measured one after
another on the quiet machine: every profile can be set against every run.  Those profiles
predate ``wait_cpu_share``, ``model_compute_scale`` and ``comm_gap_s``, so they replay the
model without them.  ``benchmarks/recorded/cluster_2026-12-07b`` holds a clean clone's
run as a newcomer runs it (``env -i``, nothing set): its two profiles, calibrated by the
code that has them, and their runs (``run_tokens.txt``, ``run_bytes.txt``), 7 of 8
within 15% each.  ``benchmarks/recorded/cluster_2026-12-07c``: the same once
the links' model knew the idle link before each timed all-reduce and the ring's copies
in segments across nodes (3 runs of each layout): 8 of 8 on tokens, 6 of 8 on bytes.

``--measured``: a file holding the bottom table that ``cluster_links.py`` printed (its
``layout placement measured predicted error`` rows); by default the figures recorded on
a quiet machine (2 nodes x 2 ranks on one 2-core host, 1 Gbit/s link, small model,
batch 16) in ``RECORDED`` below.  Prints each layout's prediction, its parts (the rank's
critical path and the host's shared-core bound, ``estimate.shared_core_bound``) and
the error against the measurement.
"""
from __future__ import annotations

import argparse
import os
import re
import statistics
import sys

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

from minipar.perf.comm import Cyclic            # noqa: E402
from minipar.perf.estimate import predict       # noqa: E402
from minipar.perf.plan import describe          # noqa: E402
from minipar.perf.profile import load_profile   # noqa: E402

from cluster_links import layout_configs        # noqa: E402  (the tp part's layouts)

# cluster_links.py's tp part on a quiet machine: (layout flags, placement) -> measured ms
RECORDED = """
--dp 4 --tp 1                                              block           266.2
--dp 4 --tp 1 --no-overlap                                 block           266.7
--dp 4 --tp 1 --zero 1                                     block           261.9
--dp 2 --tp 2                                              block           265.8
--dp 2 --tp 1 --pp 2 --schedule 1f1b --microbatches 4      block           276.1
--dp 1 --tp 2 --pp 2 --schedule 1f1b --microbatches 4      block           305.5
--dp 1 --tp 4                                              block           355.2
--dp 2 --tp 2                                              cyclic          258.3
"""


def read_measured(text):
    """{(flags, placement): seconds} from rows ``FLAGS  block|cyclic  MEASURED_MS ...``."""
    out = {}
    for line in text.splitlines():
        m = re.match(r"\s*(--.*?)\s+(block|cyclic)\s+([\d.]+)", line)
        if m:
            out[" ".join(m[1].split()), m[2]] = float(m[3]) / 1e3
    return out


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("profile", help="a profile calibrated on the cluster (minipar calibrate)")
    ap.add_argument("--measured", help="a file with cluster_links.py's bottom table")
    ap.add_argument("--vocab", type=int, default=None,
                    help="the runs' vocabulary (256 for cluster_links.py --data stdlib-bytes; "
                         "default the BPE tokenizer's 4,096)")
    ap.add_argument("--bucket-mb", type=float, default=None,
                    help="the runs' gradient bucket size (25 for runs recorded before runs chose "
                         "it; default: what a run chooses now)")
    ap.add_argument("--nodes", type=int, default=2)
    ap.add_argument("--nodes-per-host", type=int, default=None,
                    help="set the profile's nodes_per_host (for a profile calibrated before "
                         "calibrate recorded it; the simulated cluster: --nodes)")
    args = ap.parse_args()
    prof = load_profile(args.profile)
    if args.nodes_per_host:
        prof.nodes_per_host = args.nodes_per_host
    measured = read_measured(open(args.measured).read() if args.measured else RECORDED)
    configs = layout_configs(args.vocab, args.bucket_mb)
    cases = [(c, "block") for c in configs] + [(configs[3], "cyclic")]
    print(f"profile {args.profile}: {prof.ranks_per_node} ranks per node, "
          f"{prof.cores_per_node} cores shared by {prof.nodes_per_host} node(s)")
    print(f"{'layout':<56} {'place':<6} {'meas ms':>8} {'pred ms':>8} {'path ms':>8} "
          f"{'cores ms':>8} {'error':>6}")
    errors = []
    for config, where in cases:
        flags = describe(config)
        rpn = prof.ranks_per_node if where == "block" else Cyclic(prof.ranks_per_node, args.nodes)
        p = predict(config, prof, ranks_per_node=rpn)
        got = measured.get((" ".join(flags.split()), where))
        err = p.step_s / got - 1 if got else float("nan")
        if got:
            errors.append(abs(err))
        print(f"{flags:<56} {where:<6} {(got or float('nan')) * 1e3:8.1f} {p.step_s * 1e3:8.1f} "
              f"{p.breakdown['critical_path_s'] * 1e3:8.1f} {p.breakdown['shared_cores_s'] * 1e3:8.1f} "
              f"{err:6.0%}")
    if errors:
        print(f"error over {len(errors)} layouts: median {statistics.median(errors):.0%}, "
              f"max {max(errors):.0%}, within 15% for {sum(e <= 0.15 for e in errors)} (goal: >= 6)")


if __name__ == "__main__":
    main()
