"""Expert parallelism's dispatch against the one-process MoE layer, and its bytes (run
under mpiexec; raises on a mismatch).

Every rank draws the same layer (fp64, E experts) and its own tokens.  The reference is
the layer with every expert, on this rank's tokens: its output and its input's and
router's gradients are this rank's own; an expert's weight gradient in the reference
is this rank's part of it.  Under ep (the ranks in groups of ``ep``), each rank keeps
E/ep experts and must give the same output and input/router gradients, and for each
of its experts the sum of the reference gradients over its ep group's ranks.

Bytes: rank r's ep communicator sends, in one forward and backward, the rows of its
two all-to-alls each way and the per-expert counts once (``parallel/experts.py``):

    2 · (rows r sends to other ranks + rows other ranks sent r) · d · 8
    + (ep - 1) · (E/ep) · 8                                        counts per expert
    + 5 · what one all-to-all's own count exchange sends (measured on an empty one)
"""
import sys

import numpy as np
from mpi4py import MPI

from minipar.autograd import Tensor, ops
from minipar.comm import Communicator, abort_on_exception, all_to_all
from minipar.nn import GPTConfig
from minipar.nn.layers import Dropout
from minipar.nn.llama import SwiGLU
from minipar.nn.moe import MoE
from minipar.parallel.experts import apply_expert_parallel

D, WIDTH, E, TOKENS = 6, 5, 8, 7


def layer(capacity_factor):
    cfg = GPTConfig(arch="llama", d_model=8, n_head=2, moe_experts=E, moe_top_k=2,
                    moe_aux_coef=0.5, moe_capacity_factor=capacity_factor)
    moe = MoE(D, lambda: SwiGLU(D, WIDTH, None, 0.02, Dropout(0.0, None)), None, cfg)
    rng = np.random.default_rng(0)                      # the same weights on every rank
    for _, p in moe.named_parameters():
        p.data = rng.normal(size=p.shape)
    return moe


def run(moe, x, cotangent):
    """Output, and the gradients of Σ out·cotangent (+ the aux loss) by parameter name."""
    xt = Tensor(x, requires_grad=True)
    out = moe(xt)
    loss = ops.sum(ops.mul(out, Tensor(cotangent)))
    moe.seed.value = 1.0
    loss.backward()
    grads = {n: p.grad.copy() for n, p in moe.named_parameters()}
    return out.numpy(), xt.grad.copy(), grads


def check(ep, capacity_factor, world):
    rank = world.rank
    ep_comm = world.split(color=rank // ep, key=rank % ep)
    rng = np.random.default_rng(100 + rank)             # this rank's own tokens
    x = rng.normal(size=(1, TOKENS, D))
    cotangent = rng.normal(size=(1, TOKENS, D))
    ref_out, ref_dx, ref_grads = run(layer(capacity_factor), x, cotangent)
    moe = layer(capacity_factor)
    apply_expert_parallel(moe, ep_comm)
    ep_comm.reset_counters()
    out, dx, grads = run(moe, x, cotangent)
    sent = ep_comm.bytes_sent
    what = f"rank {rank}, ep {ep}, capacity {capacity_factor}"
    np.testing.assert_allclose(out, ref_out, rtol=1e-12, atol=1e-13, err_msg=f"output, {what}")
    np.testing.assert_allclose(dx, ref_dx, rtol=1e-12, atol=1e-13, err_msg=f"input grad, {what}")
    held = sorted({int(n.split(".")[1]) for n in grads if n.startswith("experts.")})
    assert held == list(range(ep_comm.rank * E // ep, (ep_comm.rank + 1) * E // ep)), \
        f"{what}: holds experts {held}"
    for name, ref in ref_grads.items():              # an expert's: summed over the ep group
        if name.startswith("experts."):
            summed = np.zeros_like(ref)
            ep_comm.mpi.Allreduce(np.ascontiguousarray(ref), summed)
            ref = summed
        if name in grads:
            np.testing.assert_allclose(grads[name], ref, rtol=1e-11, atol=1e-12,
                                       err_msg=f"{name}, {what}")
    # bytes: the rows there and back, the counts per expert, the count exchanges
    owner = np.array([e // (E // ep) for e in range(E)])
    per_dest = np.bincount(owner[_kept_experts(moe)], minlength=ep)
    rows_to = per_dest.sum() - per_dest[ep_comm.rank]
    matrix = np.array(ep_comm.mpi.allgather(per_dest))
    rows_from = matrix[:, ep_comm.rank].sum() - matrix[ep_comm.rank, ep_comm.rank]
    ep_comm.reset_counters()
    all_to_all(ep_comm, np.zeros((0, 1)), [0] * ep)
    per_exchange = ep_comm.bytes_sent
    expected = 2 * (rows_to + rows_from) * D * 8 + (ep - 1) * (E // ep) * 8 + 5 * per_exchange
    assert sent == expected, f"{what}: sent {sent} bytes, formula {expected}"
    return sent


def _kept_experts(moe):
    """The expert of every kept assignment of the last forward (from the layer's load)."""
    return np.repeat(np.arange(E), np.asarray(moe.load["received"]))


def main():
    abort_on_exception()
    world = Communicator(check=True)
    for ep in sorted({1, 2, world.size} - {0}):
        if world.size % ep == 0:
            for capacity_factor in (0.0, 1.0):
                check(ep, capacity_factor, world)
    if world.rank == 0:
        print("expert dispatch OK")
    MPI.COMM_WORLD.Barrier()
    return 0


if __name__ == "__main__":
    sys.exit(main())
