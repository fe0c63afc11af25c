"""Goodput of a supervised run with one failure, against the checkpoint interval.

    python benchmarks/goodput.py [--np 2] [--every 2,5,10,20] [--fail-at 17] [--steps 40]
                                 [--mtbf 3600] [--d-model 64] [--seq-len 64] [--batch-size 16]

For each ``--save-every K`` it runs ``python -m minipar launch --np N --fault 1:F:kill``
(rank 1 SIGKILLed after step F, first attempt only) and reads the merged log's final
record (``minipar/elastic/goodput.py``): the measured checkpoint cost C, the median step,
the steps redone (F - the last multiple of K), the seconds lost (from the end of the
checkpoint resumed from to the start of the new attempt's first step: redone work,
detection, teardown and restart) and the goodput (step time / wall time).  The last
column is Young's interval sqrt(2·C·MTBF) for the measured C, in steps.

On a toy model the restart (starting Python, MPI and NumPy again: seconds) dwarfs
everything else, so the goodput hardly depends on K here; the point of the table is
the measured terms the Young/Daly formula needs.
"""
from __future__ import annotations

import argparse
import os
import subprocess
import sys
import tempfile

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, ROOT)


def supervised(run_dir, a, every):
    flags = ["--model", "tiny", "--n-layer", "4", "--d-model", str(a.d_model), "--seq-len",
             str(a.seq_len), "--batch-size", str(a.batch_size), "--steps", str(a.steps),
             "--precision", "fp32", "--quiet", "--eval-batches", "0", "--save-every", str(every),
             "--log-json", os.path.join(run_dir, "merged.json")]
    cmd = [sys.executable, "-m", "minipar.elastic", "--np", str(a.np), "--run-dir", run_dir,
           "--hang-timeout", "60", "--mtbf", str(a.mtbf), "--fault", f"1:{a.fail_at}:kill",
           "--", "train", *flags]
    env = dict(os.environ, PYTHONPATH=ROOT, OMP_NUM_THREADS="1")
    proc = subprocess.run(cmd, cwd=ROOT, env=env, capture_output=True, text=True, timeout=900)
    if proc.returncode:
        raise SystemExit(f"{' '.join(cmd)} failed:\n{proc.stdout[-3000:]}\n{proc.stderr[-2000:]}")
    from minipar.elastic.log import read_merged
    _, _, events, final = read_merged(os.path.join(run_dir, "merged.json"))
    return events, final["goodput"]


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--np", type=int, default=2)
    ap.add_argument("--every", default="2,5,10,20")
    ap.add_argument("--fail-at", type=int, default=17)
    ap.add_argument("--steps", type=int, default=40)
    ap.add_argument("--mtbf", type=float, default=3600.0)
    ap.add_argument("--d-model", type=int, default=64)
    ap.add_argument("--seq-len", type=int, default=64)
    ap.add_argument("--batch-size", type=int, default=16)
    a = ap.parse_args(argv)
    print(f"{a.np} ranks, rank 1 killed after step {a.fail_at} of {a.steps}; MTBF {a.mtbf:g} s")
    print(f"{'save every':>10} {'C ms':>7} {'step ms':>8} {'redone':>7} {'lost s':>7} "
          f"{'of which restart s':>18} {'goodput':>8} {'Young/Daly steps':>17}")
    with tempfile.TemporaryDirectory() as tmp:
        for every in map(int, a.every.split(",")):
            events, g = supervised(os.path.join(tmp, f"every{every}"), a, every)
            e = events[0]
            restart = e["seconds_lost"] - e["since_checkpoint_s"]
            print(f"{every:>10} {g['checkpoint_s'] * 1e3:7.1f} {g['step_s'] * 1e3:8.1f} "
                  f"{e['steps_redone']:>7} {e['seconds_lost']:7.2f} {restart:18.2f} "
                  f"{g['goodput']:8.1%} {g['young_daly_interval_steps']:17.0f}")


if __name__ == "__main__":
    main()
