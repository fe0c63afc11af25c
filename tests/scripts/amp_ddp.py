"""fp16 under data parallelism vs the single-process fp16 run (mpiexec -n N).

Each rank trains a data-parallel replica (``DDPSync`` in fp16 + the one ``Optimizer`` step) on its 1/N share of the
global batch; every rank also runs the single-process oracle on the whole batch.
Replicas must agree exactly with each other (same update everywhere) and with the
oracle up to reduction order and half-precision rounding of the averaged gradients.
(A replica's local loss is a mean over 1/N of the tokens, so its scaled half
gradients are N times the oracle's: the initial scale is set low enough for both.)
Prints "OK <rank> ..." per rank.
"""
import sys

import numpy as np

from minipar import backend
from minipar.amp import MixedPrecision, amp_train_step, make_scaler
from minipar.comm import Communicator, abort_on_exception, all_reduce
from minipar.data import Dataset, load_corpus, shard_rows
from minipar.nn import GPT, GPTConfig
from minipar.optim import AdamW
from minipar.parallel.step import Optimizer
from minipar.parallel.sync import DDPSync
from tests.tolerance import assert_close_normwise

STEPS, BATCH = 4, 12


def main():
    comm = Communicator()
    abort_on_exception()
    cfg = GPTConfig(n_layer=1, d_model=32, n_head=2, seq_len=16)
    data = Dataset(load_corpus(max_bytes=50_000), cfg.seq_len)

    model = GPT(cfg, seed=0)
    sync = DDPSync(model, comm, half_dtype=np.float16)
    opt = Optimizer(sync, scaler=make_scaler("fp16", comm=comm, init_scale=2.0 ** 10),
                    lr=3e-3, weight_decay=0.0)
    oracle = GPT(cfg, seed=0)
    oracle_amp = MixedPrecision(oracle, "fp16")
    oracle_opt = AdamW(oracle_amp.named_masters(), lr=3e-3, weight_decay=0.0)
    oracle_scaler = make_scaler("fp16", init_scale=2.0 ** 10)

    losses, oracle_losses = [], []
    for step in range(STEPS):
        x, y = data.batch(0, step, BATCH)
        xs, ys = shard_rows(x, comm.rank, comm.size), shard_rows(y, comm.rank, comm.size)
        _, loss = model(backend.to_device(xs), backend.to_device(ys))
        opt.scale_loss(loss).backward()
        opt.step(1.0)
        if opt.last_skipped:
            raise AssertionError(f"rank {comm.rank}: step {step} overflowed")
        opt.zero_grad()
        mean = all_reduce(comm, np.array([loss.item()]))[0] / comm.size
        losses.append(float(mean))
        oracle_losses.append(amp_train_step(oracle, oracle_amp, oracle_opt, oracle_scaler,
                                            x, y, 1, 1.0)[0])
    masters = sync.to_named([s.master for s in sync.slots])     # by name, fp32
    mine = np.concatenate([masters[n].ravel() for n in oracle_amp.names])
    low, high = mine.copy(), mine.copy()
    all_reduce(comm, low, op="min")
    all_reduce(comm, high, op="max")
    if not np.array_equal(low, high):
        raise AssertionError(f"rank {comm.rank}: replicas diverged")
    ref = np.concatenate([m.data.ravel() for m in oracle_amp.masters])
    drift = float(np.abs(mine - ref).max())
    # Adam turns tiny gradient differences (half rounding, reduction order) into
    # steps of up to lr where the gradient is ~0, so the weights may drift by lr per step
    if drift > 3e-3 * STEPS:
        raise AssertionError(f"rank {comm.rank}: drift {drift}, {losses} vs {oracle_losses}")
    assert_close_normwise(losses, oracle_losses, 1e-4, err_msg=f"rank {comm.rank}: losses")
    print(f"OK {comm.rank} drift={drift:.2e} losses={losses} oracle={oracle_losses}", flush=True)


if __name__ == "__main__":
    sys.exit(main())
