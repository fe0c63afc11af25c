"""Lesson 21 — expert parallelism's all-to-all on 4 ranks, measured.

    mpiexec -n 4 python lessons/21_experts.py [--backend numpy|cupy] --json FILE [--tokens T] [--d-model D]

For ep = 1, 2 and 4 (the 4 ranks in groups of ep), the library's MoE layer (E = 8 SwiGLU
experts, top-2, dropless, float64) made expert-parallel (``apply_expert_parallel``), one
forward and backward on this rank's T tokens.  Per rank:

- the bytes its ep communicator sent (``bytes_sent``), and the token rows in them: the
  rows it sent to experts of other ranks and the rows it received for its own experts
  (each crosses once to the expert and once back, in forward and again in backward);
- the output's largest difference from the same layer with every expert on this one
  process (expert parallelism changes where an expert runs, not what it computes).

Under uniform routing a row goes to another rank with probability (ep − 1)/ep, so a
rank sends about 4·k·T·d·8·(ep − 1)/ep bytes of rows per MoE layer, forward and backward.
Rank 0 writes everything to the JSON file.
"""
import argparse
import json
import os
import sys

try:
    import minipar  # noqa: F401
except ImportError:  # run from a checkout without installing: use the repository root
    sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

import numpy as np

from minipar import backend
from minipar.autograd import Tensor, ops
from minipar.backend import to_device, to_host
from minipar.comm import Communicator, abort_on_exception
from minipar.nn import GPTConfig
from minipar.nn.layers import Dropout
from minipar.nn.llama import SwiGLU
from minipar.nn.moe import MoE
from minipar.parallel.experts import apply_expert_parallel

E, K = 8, 2


def layer(d_model):
    """The same float64 MoE layer on every rank (seed 0), experts 2·d wide."""
    cfg = GPTConfig(arch="llama", d_model=8, n_head=2, moe_experts=E, moe_top_k=K, moe_balance="none")
    moe = MoE(d_model, lambda: SwiGLU(d_model, 2 * d_model, None, 0.02, Dropout(0.0, None)), None, cfg)
    rng = np.random.default_rng(0)
    for _, p in moe.named_parameters():
        p.data = to_device(rng.normal(size=p.shape) / np.sqrt(p.shape[0]))
    return moe


def forward_backward(moe, x, cotangent):
    out = moe(Tensor(to_device(x[None]), requires_grad=True))
    ops.sum(ops.mul(out, Tensor(to_device(cotangent[None])))).backward()
    return to_host(out.data)[0]


def measure(world, ep, tokens, d_model):
    rank = world.rank
    comm = world.split(color=rank // ep, key=rank % ep)
    rng = np.random.default_rng(100 + rank)
    x, cotangent = rng.normal(size=(tokens, d_model)), rng.normal(size=(tokens, d_model))
    whole = forward_backward(layer(d_model), x, cotangent)
    moe = layer(d_model)
    apply_expert_parallel(moe, comm)
    comm.reset_counters()
    out = forward_backward(moe, x, cotangent)
    sent = comm.bytes_sent
    per = E // ep
    owner = np.repeat(np.arange(E) // per, to_host(moe.load["received"]))     # each assignment's rank
    to_rank = np.bincount(owner, minlength=ep)
    matrix = np.array(comm.mpi.allgather(to_rank))                             # rows [from, to]
    mine = comm.rank
    return {"ep": ep, "bytes_sent": int(sent),
            "rows_to_others": int(to_rank.sum() - to_rank[mine]),
            "rows_from_others": int(matrix[:, mine].sum() - matrix[mine, mine]),
            "rows_for_my_experts": int(matrix[:, mine].sum()),
            "max_abs_diff": float(np.abs(out - whole).max())}


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--backend", default="numpy", choices=["numpy", "cupy"])
    parser.add_argument("--json", required=True, help="where rank 0 writes the results")
    parser.add_argument("--tokens", type=int, default=256, help="tokens per rank")
    parser.add_argument("--d-model", type=int, default=64)
    args = parser.parse_args()
    abort_on_exception()
    backend.set_backend(args.backend)
    backend.set_default_dtype(np.float64)
    world = Communicator()
    if world.size != 4:
        raise SystemExit(2 if world.rank else f"21_experts.py runs on 4 ranks (mpiexec -n 4), not {world.size}")
    result = {"experts": E, "top_k": K, "tokens": args.tokens, "d_model": args.d_model, "itemsize": 8,
              "runs": [world.mpi.gather(measure(world, ep, args.tokens, args.d_model), root=0)
                       for ep in (1, 2, 4)]}
    if world.rank == 0:
        with open(args.json, "w") as f:
            json.dump(result, f)
        print(f"rank 0 wrote {args.json}")


if __name__ == "__main__":
    main()
