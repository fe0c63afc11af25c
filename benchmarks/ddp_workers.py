"""The two timed jobs of ``ddp_vs_torch.py``, one per side, each run under ``mpiexec``
by the driver (``ddp_vs_torch.py --worker minipar|torch``): the same GPT, the same
global batch split over the ranks, the same hyper-parameters; rank 0 prints
``RESULT {"times": [...], "losses": [...], ...}`` (see the driver's docstring).
"""
import json
import os
import sys
import time

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(HERE)
WARMUP = 2
BETAS, EPS = (0.9, 0.95), 1e-8          # minipar.parallel.step.Optimizer's (checked by the worker)


def random_batch(step, batch, seq):
    """The global batch of step ``step``: random bytes, the same for both jobs."""
    import numpy as np
    rng = np.random.default_rng([0, step])
    tokens = rng.integers(0, 256, (batch, seq + 1))
    return np.ascontiguousarray(tokens[:, :-1]), np.ascontiguousarray(tokens[:, 1:])


def my_rows(array, rank, size):
    per = array.shape[0] // size
    return array[rank * per:(rank + 1) * per]


def minipar_worker(args, shape):
    sys.path.insert(0, ROOT)
    from minipar.config import TrainConfig
    from minipar.nn import GPTConfig
    from minipar.process.threads import describe_threads
    from minipar.train import setup
    from minipar.train.steps import forward_backward
    layers, d, seq, batch = shape
    config = TrainConfig(n_layer=layers, d_model=d, n_head=args.heads, seq_len=seq,
                         batch_size=batch, steps=WARMUP + args.steps, precision="fp32", seed=0,
                         lr=args.lr, weight_decay=args.weight_decay, grad_clip=args.grad_clip,
                         data=os.path.join(ROOT, "minipar"), eval_batches=0, quiet=True)
    run = setup(config)           # what `python -m minipar train` builds, overlap on
    expected = GPTConfig(vocab_size=256, seq_len=seq, n_layer=layers, d_model=d, n_head=args.heads)
    assert run.cfg == expected, f"minipar built {run.cfg}, not {expected}"
    model, opt, grid, c = run.parallel.model, run.optimizer, run.grid, run.config
    assert (tuple(opt.betas), opt.eps) == (BETAS, EPS), "minipar's AdamW changed: update BETAS, EPS"
    times, losses = [], []
    for step in range(WARMUP + args.steps):
        x, y = (my_rows(a, grid.coords.dp, grid.dp) for a in random_batch(step, batch, seq))
        t0 = time.perf_counter()
        losses.append(forward_backward(model, opt, x, y, c.grad_accum))   # hooks: all-reduces
        opt.step(c.grad_clip)                        # finish, norm, clip, AdamW, zero_grad
        times.append(time.perf_counter() - t0)
        fail_here(args, grid.rank, step)
    if grid.rank == 0:
        print("RESULT " + json.dumps({"times": times, "losses": losses, "threads": describe_threads(),
                                      "buckets": len(opt.sync.buckets)}), flush=True)


def torch_worker(args, shape):
    from datetime import timedelta

    import torch
    import torch.distributed as dist
    from torch.nn.parallel import DistributedDataParallel
    from torch_gpt import build_torch_gpt
    torch.set_num_threads(1)
    rank, size = int(os.environ["PMI_RANK"]), int(os.environ["PMI_SIZE"])
    dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{args.port}", rank=rank,
                            world_size=size, timeout=timedelta(seconds=args.timeout))
    layers, d, seq, batch = shape
    torch.manual_seed(0)
    model = DistributedDataParallel(build_torch_gpt(layers, d, args.heads, seq, args.torch_sdpa))
    params = list(model.parameters())
    groups = [{"params": [p for p in params if p.ndim >= 2], "weight_decay": args.weight_decay},
              {"params": [p for p in params if p.ndim < 2], "weight_decay": 0.0}]
    opt = torch.optim.AdamW(groups, lr=args.lr, betas=BETAS, eps=EPS, foreach=True)
    times, losses = [], []
    for step in range(WARMUP + args.steps):
        x, y = (torch.from_numpy(my_rows(a, rank, size)) for a in random_batch(step, batch, seq))
        t0 = time.perf_counter()
        loss = model(x, y)
        loss.backward()                              # DDP's bucket all-reduces overlap it
        torch.nn.utils.clip_grad_norm_(params, args.grad_clip, foreach=True)
        opt.step()
        opt.zero_grad(set_to_none=True)
        losses.append(loss.item())
        times.append(time.perf_counter() - t0)
        fail_here(args, rank, step)
    if rank == 0:
        print("RESULT " + json.dumps({"times": times, "losses": losses,
                                      "threads": f"torch.get_num_threads()={torch.get_num_threads()}, "
                                                 f"OMP_NUM_THREADS={os.environ.get('OMP_NUM_THREADS')}"}),
              flush=True)
    dist.destroy_process_group()


def fail_here(args, rank, step):
    """``--fail-worker crash|hang`` (hidden): rank 1 fails after step 0, to check that the
    driver reports a failed or stuck job instead of waiting for it."""
    if args.fail_worker and rank == 1 and step == 0:
        if args.fail_worker == "hang":
            time.sleep(10**6)
        raise RuntimeError("--fail-worker crash: rank 1 stops here on purpose")
