"""RunMonitor on every rank with made-up timings: rank r's step takes (1 + r) * 10 ms,
the last rank is a straggler (3x), so its figures must reach rank 0's log.

    mpiexec -n N python tests/scripts/monitor_run.py LOG [--fp16] [--no-val]
"""
import sys
import time

from minipar.comm import Communicator
from minipar.observe.monitor import RunMonitor

log, flags = sys.argv[1], sys.argv[2:]
comm = Communicator()
rank, size = comm.rank, comm.size
steps = 6
mon = RunMonitor(comm, rank=rank, world_size=size, log_path=log, progress=True,
                 header=dict(layout=f"dp{size}", params=123456, tokens_per_step=1024,
                             batch_size=8, backend="numpy", precision="fp16" if "--fp16" in flags else "fp32"),
                 flops_per_step=2e9, peak_tflops=None if "--measured" in flags else 0.5,
                 total_steps=steps, start_step=0)
mon.start()
for step in range(steps):
    slow = 3.0 if rank == size - 1 and size > 1 else 1.0
    t = 0.01 * (1 + rank) * slow
    time.sleep(t / 10)          # the figures are made up; the run need not be slow
    shared = dict(loss=3.0 - 0.1 * step, lr=1e-3, grad_norm=1.0, model_state_bytes=4096)
    if "--fp16" in flags:
        shared.update(loss_scale=2.0 ** (16 - (step == 2)), skipped=int(step == 2))
    mine = dict(step_time_s=t, compute_s=0.6 * t, comm_time_s=0.2 * t, pipeline_wait_s=None,
                optimizer_s=0.1 * t, peak_mem_bytes=1000 * (rank + 1) + step)
    mon.step(step, shared=shared, mine=mine)
mon.finish(val_loss=None if "--no-val" in flags else 2.5)
