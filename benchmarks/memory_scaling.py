"""What a rank really holds: peak resident memory per rank against what it should hold.

    python benchmarks/memory_scaling.py [--model gpt2] [--seq-len 64] [--batch-size 4]
                                        [--root DIR] [--only single,dp2-zero3,...]

For each layout (1 process, dp2 and dp4 under ZeRO-3, tp2, tp2×pp2), with and without a
checkpoint save, one training step

    mpiexec -n R /usr/bin/time -f maxrss_kb=%M python -m minipar train --model gpt2 ...

and per rank, the largest over ranks of:

    peak RSS     what the operating system counted over the whole run (``/usr/bin/time``:
                 ru_maxrss).  The runs set ``MINIPAR_KEEP_PEAK_RSS=1``: a run resets the
                 kernel's high-water mark at each phase to measure phases apart, and
                 ru_maxrss would then be the last phase's peak only (``observe/procmem.py``)
    reported     the run's own "process peak (RSS)" (``observe/procmem.py``; older code: the steps'
                 ``peak_rss_bytes``; '-' if none) and its tracked arrays (``peak_mem_bytes``)
    need         the memory model's peak for the rank (``train/fits.predicted_peak``: the
                 model the run's memory check and summary use) with its runtime measured
                 here: the peak RSS of a 1-step run of ``tiny`` on as many ranks (MPI's
                 shared-memory buffers grow with the ranks; that run loads the same corpus,
                 so the model's corpus term is 0 here) + this rank's model state and
                 weight-decay mask + activations + communication buffers + NumPy's workspace
                 (or, if larger, the construction's one full tensor)
    ratio        peak RSS / need (goal: <= 1.15; reported within 10% of RSS)

``--root`` runs another checkout's code (e.g. the main branch, for the "before" table;
code older than ``MINIPAR_KEEP_PEAK_RSS`` shows its last phase's peak as "peak RSS");
the need is always computed by this checkout's model.  Memory is not noisy on a shared
machine; time is, and is not measured.
"""
from __future__ import annotations

import argparse
import json
import os
import re
import subprocess
import sys
import tempfile

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
LAYOUTS = {                               # name: (ranks, flags)
    "single": (1, []),
    "dp2-zero3": (2, ["--zero", "3"]),
    "dp4-zero3": (4, ["--zero", "3"]),
    "tp2": (2, ["--tp", "2"]),
    "tp2-pp2": (4, ["--tp", "2", "--pp", "2"]),
}
MiB = 2 ** 20


def run(root, ranks, flags, workdir, name):
    """One training run under /usr/bin/time; (peak RSS per rank, the run's final record)."""
    log = os.path.join(workdir, f"{name}.json")
    rss_file = os.path.join(workdir, f"{name}.rss")     # + .RANK: one file per rank, as ranks
    # writing to one stderr at once interleave their lines ("mmaxrss_kb=1924\naxrss_kb=...")
    timed = f'exec /usr/bin/time -f maxrss_kb=%M -o {rss_file}.$PMI_RANK "$0" "$@"'
    cmd = ["mpiexec", "-n", str(ranks), "sh", "-c", timed, sys.executable,
           "-m", "minipar", "train", "--quiet", "--eval-batches", "0", "--log-json", log, *flags]
    env = dict(os.environ, OMP_NUM_THREADS="1", OPENBLAS_NUM_THREADS="1", MKL_NUM_THREADS="1",
               PYTHONPATH=root, PYTHONDONTWRITEBYTECODE="1", MINIPAR_KEEP_PEAK_RSS="1")
    proc = subprocess.run(cmd, cwd=root, env=env, capture_output=True, text=True, timeout=1800)
    if proc.returncode != 0:
        raise SystemExit(f"{' '.join(cmd)} failed:\n{proc.stdout[-2000:]}\n{proc.stderr[-2000:]}")
    text = "".join(open(f"{rss_file}.{r}").read() for r in range(ranks))
    rss = [int(k) * 1024 for k in re.findall(r"maxrss_kb=(\d+)", text)]
    if len(rss) != ranks:
        raise SystemExit(f"{' '.join(cmd)}: {len(rss)} peak RSS figures for {ranks} ranks:\n{text}")
    final = {}
    with open(log) as f:
        for line in f:
            final = json.loads(line).get("final", final)
    return rss, final


def need(args, ranks, flags, runtime):
    """The memory model's process peak (``train/fits.py``), largest over the layout's ranks."""
    sys.path.insert(0, ROOT)
    from minipar.config import TrainConfig, preflight
    from minipar.parallel.grid import coordinates
    from minipar.train.fits import predicted_peak
    values = dict(zip(flags[::2], flags[1::2]))
    config = preflight(TrainConfig(model=args.model, seq_len=args.seq_len, batch_size=args.batch_size,
                         steps=1, tp=int(values.get("--tp", 1)), pp=int(values.get("--pp", 1)),
                         zero=int(values.get("--zero", 0)))).resolve(ranks)
    coords = [coordinates(r, config.dp, config.tp, config.pp) for r in range(ranks)]
    return max(predicted_peak(config, runtime=runtime, data=0, coords=(c.dp, c.tp, c.pp)).total
               for c in coords)


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--model", default="gpt2")
    ap.add_argument("--seq-len", type=int, default=64)
    ap.add_argument("--batch-size", type=int, default=4)
    ap.add_argument("--root", default=ROOT, help="the checkout whose code runs")
    ap.add_argument("--only", help="comma-separated layouts (default: all)")
    ap.add_argument("--no-save", action="store_true", help="skip the runs with a save")
    args = ap.parse_args()
    names = args.only.split(",") if args.only else list(LAYOUTS)
    model = ["--model", args.model, "--seq-len", str(args.seq_len), "--batch-size",
             str(args.batch_size), "--steps", "1"]
    with tempfile.TemporaryDirectory() as workdir:
        floors = {}
        for ranks in sorted({LAYOUTS[name][0] for name in names}):
            tiny = ["--model", "tiny", "--steps", "1", "--batch-size", "4"]
            floors[ranks] = max(run(args.root, ranks, tiny, workdir, f"floor{ranks}")[0])
        print(f"code: {args.root}\nruntime floor (peak RSS of a 1-step tiny run), MiB: "
              + ", ".join(f"{floors[r] / MiB:.0f} on {r} rank{'s' * (r > 1)}" for r in floors)
              + "\n")
        print(f"{'layout':<11} {'save':<4} {'peak RSS':>9} {'reported':>9} {'tracked':>8} "
              f"{'need':>8} {'RSS/need':>8} {'rep/RSS':>7}   (MiB, largest rank)")
        for name in names:
            ranks, flags = LAYOUTS[name]
            expected = need(args, ranks, flags, floors[ranks])   # this checkout's model
            for save in ([False] if args.no_save else [False, True]):
                extra = ["--save", os.path.join(workdir, f"{name}_ckpt")] if save else []
                rss, final = run(args.root, ranks, model + flags + extra, workdir, name)
                process = final.get("process_memory") or {}
                reported = max(v or 0 for v in process.get("peak_rss_bytes_per_rank")
                               or final.get("peak_rss_bytes_per_rank") or [0])  # older logs
                tracked = max(final.get("peak_mem_bytes_per_rank") or [0])
                peak = max(rss)
                rep = f"{reported / MiB:9.0f}" if reported else f"{'-':>9}"
                rep_ratio = f"{reported / peak:7.2f}" if reported else f"{'-':>7}"
                print(f"{name:<11} {'yes' if save else 'no':<4} {peak / MiB:9.0f} {rep} "
                      f"{tracked / MiB:8.0f} {expected / MiB:8.0f} {peak / expected:8.2f} "
                      f"{rep_ratio}", flush=True)


if __name__ == "__main__":
    main()
