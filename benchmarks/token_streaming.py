"""Per-rank memory does not grow with the corpus: peak RSS of the same run on a small and
a large tokenized dataset.

    python benchmarks/token_streaming.py --small DIR [--gb 1] [--ranks 2] [--steps 50]

``--small`` is a dataset made by ``python -m minipar tokenize`` (e.g. the standard
library's).  The large one is the same tokenizer with the training shards repeated up
to ``--gb`` GB (100M-token shards, as llm.c), written beside it once.  Both runs are
``mpiexec -n RANKS python -m minipar train --data D`` with the same flags; each rank
reports its peak RSS (``getrusage``'s ru_maxrss) when it exits.
"""
from __future__ import annotations

import argparse
import json
import os
import resource
import shutil
import subprocess
import sys

import numpy as np

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, REPO)


def tile_dataset(small, big, gigabytes, shard_tokens=100_000_000):
    """``big``: ``small``'s tokenizer, validation shard and manifest, its training tokens
    repeated to ``gigabytes`` GB."""
    from minipar.data.shards import HEADER_BYTES, ShardWriter
    with open(os.path.join(small, "manifest.json")) as f:
        manifest = json.load(f)
    target = int(gigabytes * 1e9) // 2
    if os.path.isfile(os.path.join(big, "manifest.json")):
        return big
    os.makedirs(big, exist_ok=True)
    for name in [manifest["tokenizer"]] + [s["file"] for s in manifest["val"]]:
        shutil.copy(os.path.join(small, name), os.path.join(big, name))
    tokens = np.concatenate([np.fromfile(os.path.join(small, s["file"]), dtype="<u2",
                                         offset=HEADER_BYTES) for s in manifest["train"]])
    shards, written = [], 0
    while written < target:
        writer = ShardWriter(os.path.join(big, f"train_{len(shards):06d}.bin"))
        while writer.count < min(shard_tokens, target - written):
            writer.add(tokens[:min(len(tokens), shard_tokens - writer.count, target - written - writer.count)])
        written += writer.count
        shards.append({"file": os.path.basename(writer.path), "tokens": writer.close()})
    manifest.update(train=shards, train_tokens=written, fingerprint="tiled-" + manifest["fingerprint"])
    with open(os.path.join(big, "manifest.json"), "w") as f:
        json.dump(manifest, f, indent=1)
    return big


def peak_rss(data, ranks, flags):
    cmd = ["mpiexec", "-n", str(ranks), sys.executable, __file__, "--rank-run", "--", "train",
           "--data", data, "--quiet", *flags]
    env = dict(os.environ, PYTHONPATH=REPO, OMP_NUM_THREADS="1")
    proc = subprocess.run(cmd, capture_output=True, text=True, env=env, timeout=1800)
    if proc.returncode:
        raise SystemExit(proc.stderr[-3000:])
    return sorted(int(line.split()[1]) for line in proc.stderr.splitlines() if line.startswith("maxrss"))


def main():
    if "--rank-run" in sys.argv:                  # one rank: minipar, then its peak RSS
        import atexit
        atexit.register(lambda: print(f"maxrss {resource.getrusage(resource.RUSAGE_SELF).ru_maxrss}",
                                      file=sys.stderr, flush=True))
        from minipar.cli import main as minipar_main
        sys.exit(minipar_main(sys.argv[sys.argv.index("--") + 1:]))
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--small", required=True)
    p.add_argument("--big", help="where the large dataset goes (default: SMALL_<gb>gb)")
    p.add_argument("--gb", type=float, default=1.0)
    p.add_argument("--ranks", type=int, default=2)
    p.add_argument("--steps", type=int, default=50)
    args = p.parse_args()
    big = tile_dataset(args.small, args.big or f"{args.small.rstrip('/')}_{args.gb:g}gb", args.gb)
    flags = ["--model", "small", "--steps", str(args.steps), "--eval-batches", "4"]
    rows = []
    for data in (args.small, big):
        size = sum(os.path.getsize(os.path.join(data, f)) for f in os.listdir(data))
        rss = peak_rss(data, args.ranks, flags)
        rows.append(rss)
        print(f"{data}: {size / 1e6:8.1f} MB on disk; peak RSS per rank "
              + ", ".join(f"{kb / 1024:.1f} MiB" for kb in rss), flush=True)
    growth = max(b - a for a, b in zip(*rows)) / 1024
    print(f"largest growth of a rank's peak RSS: {growth:+.1f} MiB (the bound: <= 30 MB)")


if __name__ == "__main__":
    main()
