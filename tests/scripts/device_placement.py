"""Which device each rank's arrays are made on, on the fake CuPy with N devices.

    PYTHONPATH=tests/fake_cupy:. MINIPAR_FAKE_CUPY_DEVICES=4 mpiexec -n 4 \\
        python tests/scripts/device_placement.py [--share-gpus] [--dp 4]

Builds the trainer's own run (``train.setup``: the tiny GPT on the cupy backend, its
optimizer) and prints one JSON object per rank: {"rank", "current" (the device current
after set-up), "weights" (the devices the model's parameters were made on), "made_on"
(the fake's count of arrays made per device, over the whole process: an array made before
the device was chosen shows as one on device 0), "map" (rank 0: the header's GPU line)}.
A refused run exits as the train command does (one line from rank 0, exit 2).
"""
import argparse
import json
import sys

import cupy

from minipar import backend
from minipar.cli_checks import as_flags
from minipar.config import ConfigError
from minipar.observe.monitor_text import gpu_map
from minipar.train import TrainConfig, setup


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--share-gpus", action="store_true")
    ap.add_argument("--dp", type=int, default=None)
    args = ap.parse_args()
    backend.set_backend("cupy")
    config = TrainConfig(model="tiny", n_layer=1, steps=1, batch_size=args.dp or 4, seq_len=16,
                         data="stdlib-bytes", quiet=True, eval_batches=0, backend="cupy",
                         dp=args.dp, share_gpus=args.share_gpus)
    try:
        run = setup(config)
    except ConfigError as err:
        from mpi4py import MPI
        if MPI.COMM_WORLD.Get_rank() == 0:
            print(f"minipar train: {as_flags(err)}", file=sys.stderr)
        sys.exit(2)
    weights = sorted({p.data.device.id for p in run.parallel.module.parameters()})
    report = dict(rank=run.grid.rank, current=cupy.cuda.Device().id, weights=weights,
                  made_on={str(d): n for d, n in sorted(cupy._made_on.items())})
    if run.grid.rank == 0:
        report["map"] = gpu_map(run._monitor().header["gpus"])
    print(json.dumps(report), flush=True)


if __name__ == "__main__":
    main()
