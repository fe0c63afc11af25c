"""Gradient compression on 2 ranks: bytes on the wire, step time, val loss, and when it pays.

    python benchmarks/compression.py [--steps K] [--d-model 256 --n-layer 2 --seq-len 64]
                                     [--batch-size 16] [--np 2] --json FILE

Launches ``mpiexec -n 2`` itself.  Every method (none, fp16, bf16, int8, topk 1 %,
PowerSGD rank 4) trains the same GPT from the same weights on the same batches of real
text (the standard library's source, ``minipar.data``), driving ``DDPSync(comm_hook=...)``
directly.  The methods advance in lockstep — step k of every method, then step k+1 — so a
load spike on the shared machine hits them all alike.  Per method:

- ``wire_bytes_per_step``: what rank 0's transport counted in the last step (after the
  warm-up), and the ratio against the uncompressed run's count; ``wire_bytes_mean``
  averages over all steps, warm-up included;
- ``step_time_s``: median step time (the first 2 steps and warm-up steps left out);
- ``val_loss``: the final validation loss (the same val batches for all) and its change
  against uncompressed.

When does it pay?  An α-β model of a step without overlap (pessimistic: overlap hides
part of the transfer, for every method alike):

    T_m(β) = C_m + k_m·α + W_m·β        C_m = measured step − k_m·α_here − W_m·β_here

with W_m the bytes and k_m the messages counted per step, α, β the latency and seconds
per byte of a network (this machine's from ``perf/calibrate_links.calibrate``; 10 Gb/s
Ethernet α = 20 µs; 200 Gb/s InfiniBand α = 3 µs).  C_m is compute plus the method's own
encode/decode work, measured here.  A method is faster than the uncompressed step below
the break-even bandwidth

    B*_m = (W_none − W_m) / (C_m − C_none + (k_m − k_none)·α)        (∞: it always pays)

The compute here is a CPU's; on GPUs C is ~100× smaller and B* correspondingly higher.

Warm-up (``--start``, default 50 of 200 steps): int8, top-k and PowerSGD all-reduce
uncompressed first, as PowerSGD's ``start_powerSGD_iter``, DGC's warm-up and 1-bit Adam's
``freeze_step`` do.  Error feedback under AdamW is what needs it: a residual sent many
steps late is normalised by Adam like a fresh gradient, and in the first steps, when the
loss falls fastest, that delay costs most (measured: top-k 1 % without warm-up ends
+13 % above uncompressed; PowerSGD with 10 warm-up steps +4 %, with 50 +2.5 %).
"""
from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
METHODS = {"none": {}, "fp16": {}, "bf16": {}, "int8": {}, "topk": {"ratio": 0.01},
           "powersgd": {"rank": 4}}
NETWORKS = {"10 GbE": (20e-6, 8 / 10e9), "200 Gb IB": (3e-6, 8 / 200e9)}
WARM_UP = ("int8", "topk", "powersgd")      # methods with error feedback: --start applies
GOALS = {"powersgd": (30, 0.03), "int8": (3.5, 0.01), "topk": (None, 0.05)}


def worker(args):
    """(under mpiexec) train every method in lockstep; rank 0 writes the raw figures."""
    sys.path.insert(0, ROOT)
    import numpy as np
    from minipar.autograd import no_grad
    from minipar.comm import Communicator
    from minipar.data import Dataset, load_corpus, shard_rows
    from minipar.nn import GPT, GPTConfig
    from minipar.parallel.step import Optimizer
    from minipar.parallel.sync import DDPSync
    from minipar.parallel.sync.compression import make_hook
    from minipar.perf.calibrate_links import calibrate

    comm = Communicator()
    cost = calibrate(comm)
    cfg = GPTConfig(n_layer=args.n_layer, d_model=args.d_model, n_head=args.n_head,
                    seq_len=args.seq_len)
    data = Dataset(load_corpus(max_bytes=8_000_000), args.seq_len)
    share = lambda a: shard_rows(a, comm.rank, comm.size)  # noqa: E731
    runs = {}
    for method in args.methods.split(","):
        kw = dict(METHODS[method], **({"start": args.start} if method in WARM_UP else {}))
        model = GPT(cfg, seed=0)
        hook = make_hook(method, **kw)
        sync = DDPSync(model, comm, bucket_bytes=args.bucket_mb * 2**20, algorithm="ring",
                       comm_hook=hook)
        if hook is not None:
            hook.bind(sync)
        runs[method] = dict(model=model, opt=Optimizer(sync, lr=args.lr), hook=hook,
                            times=[], bytes=[], msgs=[], loss=[])
    for step in range(args.steps):
        x, y = (share(a) for a in data.batch(0, step, args.batch_size))
        for method, run in runs.items():
            comm.barrier()
            b0, m0, t0 = comm.bytes_sent, comm.msgs_sent, time.perf_counter()
            _, loss = run["model"](x, y)
            loss.backward()
            run["opt"].step()
            run["times"].append(time.perf_counter() - t0)
            run["bytes"].append(comm.bytes_sent - b0)
            run["msgs"].append(comm.msgs_sent - m0)
            run["loss"].append(loss.item())
        if comm.rank == 0 and step % 20 == 0:
            print(f"step {step}: " + " ".join(f"{m} {r['loss'][-1]:.3f}" for m, r in runs.items()),
                  flush=True)
    out = {"alpha": cost.alpha, "beta": cost.beta,
           "params": runs["none"]["model"].num_parameters()}
    skip = max(2, args.start)
    for method, run in runs.items():
        val = []
        for i in range(args.val_batches):
            x, y = (share(a) for a in data.batch(0, i, args.batch_size, split="val"))
            with no_grad():
                val.append(run["model"](x, y)[1].item())
        val = float(np.mean(comm.mpi.allgather(float(np.mean(val)))))
        out[method] = {"wire_bytes_per_step": run["bytes"][-1], "msgs_per_step": run["msgs"][-1],
                       "wire_bytes_mean": float(np.mean(run["bytes"])),
                       "step_time_s": statistics.median(run["times"][skip:]),
                       "val_loss": val, "train_loss": run["loss"]}
    if comm.rank == 0:
        json.dump(out, open(args.json, "w"))


def analyse(raw, args):
    """Ratios, val-loss changes, the α-β model's step times and break-even bandwidths."""
    alpha, beta = raw["alpha"], raw["beta"]
    nets = {"this machine": (alpha, beta), **NETWORKS}
    base = raw["none"]

    def compute(m):   # C_m: the step without its modelled transfer on this machine
        return m["step_time_s"] - m["msgs_per_step"] * alpha - m["wire_bytes_per_step"] * beta

    result = {}
    for method in args.methods.split(","):
        m = raw[method]
        entry = {k: m[k] for k in ("wire_bytes_per_step", "step_time_s", "val_loss",
                                   "msgs_per_step", "wire_bytes_mean", "train_loss")}
        entry["ratio"] = base["wire_bytes_per_step"] / m["wire_bytes_per_step"]
        entry["val_loss_change"] = m["val_loss"] / base["val_loss"] - 1
        entry["modelled_step_time_s"] = {
            net: compute(m) + m["msgs_per_step"] * a + m["wire_bytes_per_step"] * b
            for net, (a, b) in nets.items()}
        saved = base["wire_bytes_per_step"] - m["wire_bytes_per_step"]
        extra = compute(m) - compute(base) + (m["msgs_per_step"] - base["msgs_per_step"]) * 5e-6
        entry["break_even_bytes_per_s"] = (None if method == "none" else
                                           float("inf") if extra <= 0 else saved / extra)
        result[method] = entry
    return result, nets


def report(result, nets, raw, args):
    print(f"\nGPT n_layer={args.n_layer} d_model={args.d_model} seq={args.seq_len} "
          f"({raw['params']:,} parameters), global batch {args.batch_size}, {args.steps} steps, "
          f"{args.np} ranks, fp32; this machine: α = {raw['alpha'] * 1e6:.1f} µs, "
          f"{1 / raw['beta'] / 1e9:.2f} GB/s\n")
    cols = list(nets)
    print(f"{'method':9} {'bytes/step':>11} {'ratio':>7} {'step s':>7} {'val loss':>9} {'Δval':>7} "
          + " ".join(f"{'T@' + c:>16}" for c in cols) + f" {'break-even':>12}")
    for method, e in result.items():
        be = e["break_even_bytes_per_s"]
        be = "-" if be is None else "always" if be == float("inf") else f"{be * 8 / 1e9:.2f} Gb/s"
        print(f"{method:9} {e['wire_bytes_per_step']:11,d} {e['ratio']:6.1f}x "
              f"{e['step_time_s']:7.3f} {e['val_loss']:9.4f} {e['val_loss_change']:+7.2%} "
              + " ".join(f"{e['modelled_step_time_s'][c]:15.3f}s" for c in cols) + f" {be:>12}")
    print("\ngoals (ratio, val loss within):")
    for method, (ratio, tol) in GOALS.items():
        if method not in result:
            continue
        e = result[method]
        ok = (ratio is None or e["ratio"] >= ratio) and abs(e["val_loss_change"]) <= tol
        print(f"  {method:9} {'' if ratio is None else f'>= {ratio}x, '}within {tol:.0%}: "
              f"{e['ratio']:.1f}x, {e['val_loss_change']:+.2%}  {'met' if ok else 'MISSED'}")


def main():
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--steps", type=int, default=200)
    p.add_argument("--np", type=int, default=2)
    p.add_argument("--n-layer", type=int, default=2)
    p.add_argument("--d-model", type=int, default=256)
    p.add_argument("--n-head", type=int, default=4)
    p.add_argument("--seq-len", type=int, default=64)
    p.add_argument("--batch-size", type=int, default=16)
    p.add_argument("--lr", type=float, default=1e-3)
    p.add_argument("--start", type=int, default=50,
                   help="uncompressed warm-up steps of int8, topk and powersgd")
    p.add_argument("--bucket-mb", type=float, default=25.0)
    p.add_argument("--val-batches", type=int, default=8)
    p.add_argument("--methods", default=",".join(METHODS),
                   help="comma-separated, 'none' first (the baseline)")
    p.add_argument("--json", required=True)
    p.add_argument("--timeout", type=int, default=3600)
    p.add_argument("--worker", action="store_true", help=argparse.SUPPRESS)
    args = p.parse_args()
    if args.worker:
        return worker(args)
    env = dict(os.environ, OMP_NUM_THREADS="1", OPENBLAS_NUM_THREADS="1", MKL_NUM_THREADS="1",
               PYTHONPATH=ROOT + os.pathsep + os.environ.get("PYTHONPATH", ""))
    with tempfile.TemporaryDirectory() as work:
        raw_path = os.path.join(work, "raw.json")
        flags = [f"--{k.replace('_', '-')}={v}" for k, v in vars(args).items()
                 if k not in ("json", "worker", "timeout")]
        subprocess.run(["mpiexec", "-n", str(args.np), sys.executable, os.path.abspath(__file__),
                        "--worker", *flags, "--json", raw_path], cwd=ROOT, env=env, check=True,
                       timeout=args.timeout)
        raw = json.load(open(raw_path))
    result, nets = analyse(raw, args)
    report(result, nets, raw, args)
    json.dump(result, open(args.json, "w"), indent=1)
    print(f"\nwrote {args.json}")


if __name__ == "__main__":
    main()
