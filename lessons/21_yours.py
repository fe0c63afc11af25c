"""Lesson 21's exercise on every rank: your expert-parallel MoE layer, against one process.

    mpiexec -n 4 python lessons/21_yours.py --file MINE.py

``MINE.py`` defines ``moe_layer(comm, moe, x)``: the output (T, d) of the MoE layer
``moe`` on this rank's tokens ``x`` (T, d), with the experts split over the ranks of
``comm`` (rank q holds experts q·E/ep .. (q+1)·E/ep − 1; the others are None).  Every
rank draws the same layer (float64, E = 8 experts, top-2, dropless) and its own tokens;
the check runs it at ep 4 (all four ranks) and ep 2 (ranks {0, 1} and {2, 3}).

The reference is the library's layer with every expert, in one process, on this rank's
tokens (``minipar.nn.moe``): its output and its input's and router's gradients are this
rank's own, and an expert's weight gradient is this rank's part of it — the ep group's
sum is what the expert's owner must hold.  Checked, in order:

- **output**, token by token: the first token whose row differs is named with its
  experts, and the difference is explained where it can be (an expert's part missing,
  not weighted, from another expert, another token's output in its place);
- **gradients** after backward of Σ out·c (c a fixed random cotangent): each token's
  input gradient, the router's, and each held expert's weights against the sum over the
  ep group of the one-process gradients;
- **bytes**: what this rank's ``comm`` sent in forward and backward, against

      2 · (rows_to + rows_from) · d · 8           the token rows, there and back, twice
      + (ep − 1) · (E/ep) · 8                     the counts per expert, once
      + 5 · one all-to-all's own count exchange   (the counts', and two each way)

  where rows_to are this rank's assignments to experts of other ranks and rows_from the
  other ranks' assignments to this rank's experts (a row to oneself is a local copy).
"""
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
from minipar.comm import all_to_all
from minipar.nn import GPTConfig
from minipar.nn.layers import Dropout
from minipar.nn.llama import SwiGLU
from minipar.nn.moe import MoE
from minipar.parallel.experts import apply_expert_parallel
from yours import main

E, K, D, WIDTH, T = 8, 2, 6, 5, 12       # experts, top-k, model width, expert width, tokens per rank
EP_SIZES = (4, 2)
RANKS = 4


def layer():
    """The MoE layer every rank draws: the same float64 weights everywhere (seed 0)."""
    cfg = GPTConfig(arch="llama", d_model=8, n_head=2, moe_experts=E, moe_top_k=K, moe_balance="none")
    moe = MoE(D, lambda: SwiGLU(D, WIDTH, None, 0.02, Dropout(0.0, None)), None, cfg)
    rng = np.random.default_rng(0)
    for _, p in moe.named_parameters():
        p.data = to_device(rng.normal(size=p.shape))
    return moe


def tokens_of(rank):
    """Rank ``rank``'s tokens and the cotangent its output is multiplied by."""
    rng = np.random.default_rng(100 + rank)
    return rng.normal(size=(T, D)), rng.normal(size=(T, D))


class Reference:
    """The one-process layer on this rank's tokens: output, gradients, and what the
    diagnosis needs — each token's experts and weights, and every expert's output on
    every rank's tokens (``every[e, rank, t]``)."""

    def __init__(self, x, cotangent, rank):
        moe, self.rank = layer(), rank
        xt = Tensor(to_device(x), requires_grad=True)
        out = moe(ops.reshape(xt, (1, T, D)))
        ops.sum(ops.mul(out, Tensor(to_device(cotangent[None])))).backward()
        self.out, self.dx = to_host(out.data)[0], to_host(xt.grad)
        self.grads = {n: to_host(p.grad) for n, p in moe.named_parameters()}
        probs = to_host(moe.router_probs(Tensor(to_device(x))).data)
        self.chosen = np.argsort(-probs, axis=-1, kind="stable")[:, :K]
        top = np.take_along_axis(probs, self.chosen, axis=-1)
        self.top, self.weights = top, top / top.sum(axis=-1, keepdims=True)
        self.every = every_output(moe)                          # [expert, rank, token]


def close(a, b):
    return a.shape == b.shape and np.allclose(a, b, rtol=1e-10, atol=1e-12)


def every_output(moe):
    """(E, ranks, T, D): every expert's output on every rank's tokens (the mix-ups the
    diagnosis recognises may bring another rank's token)."""
    xs = np.stack([tokens_of(r)[0] for r in range(RANKS)])
    return np.stack([to_host(expert(Tensor(to_device(xs))).data) for expert in moe.experts])


def candidate_parts(ref, t, j):
    """What choice j of token t may have contributed, as (array, story) pairs: its part
    right, missing, unweighted, weighted by the raw probability, or any expert's output
    of any token weighted by w_j."""
    e, w, p = ref.chosen[t, j], ref.weights[t, j], ref.top[t, j]
    mine = ref.every[e, ref.rank, t]
    found = [(w * mine, None), (np.zeros(D), "its part is missing"),
             (mine, f"its part is not multiplied by its weight w = {w:.3f}"),
             (p * mine, f"its part is weighted by the router's probability {p:.3f}, not renormalised "
                        f"(the k weights of a token sum to 1)")]
    for other in range(E):
        for r in range(RANKS):
            for s in range(T):
                if (other, r, s) == (e, ref.rank, t):
                    continue
                if r == ref.rank and s == t:
                    story = (f"its part is expert {other}'s output instead: the row went to, or came back "
                             f"from, the wrong expert")
                elif r == ref.rank:
                    story = (f"its part is expert {other}'s output of token {s}: the rows came back, but "
                             f"were not put back in (token, choice) order")
                else:
                    story = (f"its part is expert {other}'s output of rank {r}'s token {s}: rows went back "
                             f"to the wrong rank")
                found.append((w * ref.every[other, r, s], story))
    return found


def explain_row(got, ref, t, owner):
    """Why token t's output row differs, naming the token's expert whose part is wrong:
    the closest sum of one candidate part per choice (``candidate_parts``)."""
    experts = ref.chosen[t]
    name = [f"expert {e} (choice {j + 1} of {K}, w = {ref.weights[t, j]:.3f}, on ep rank {owner(e)})"
            for j, e in enumerate(experts)]
    first, second = candidate_parts(ref, t, 0), candidate_parts(ref, t, 1)
    second_rows = np.stack([part for part, _ in second])
    best = None
    for a, story_a in first:
        miss = np.abs(got - a - second_rows).max(axis=1)
        b = int(np.argmin(miss))
        if close(got, a + second_rows[b]):
            stories = [story_a, second[b][1]]
            wrong = sum(s is not None for s in stories)
            if best is None or wrong < best[0]:
                best = (wrong, stories)
    if best is None:
        if close(got, sum(ref.every[e, ref.rank, t] for e in experts)):
            best = (2, ["its part is not multiplied by its weight"] * 2)
        else:
            return (f"token {t}, {name[0]}: the row differs from the one-process layer's by "
                    f"{np.abs(got - ref.out[t]).max():.1e}, and is no mix-up of expert outputs that the "
                    f"check recognises (routed to {' and '.join(name)})")
    said = [f"{name[j]}: {story}" for j, story in enumerate(best[1]) if story is not None]
    right = [name[j] for j, story in enumerate(best[1]) if story is None]
    return f"token {t}, " + "; and ".join(said) + (f" ({right[0]} is right)" if right else "")


def check_output(got, ref, owner, what):
    if got.shape != (T, D):
        raise AssertionError(f"{what}: moe_layer returned shape {got.shape}, want ({T}, {D}): one row per token")
    for t in range(T):
        if not close(got[t], ref.out[t]):
            raise AssertionError(f"{what}: the output of {explain_row(got[t], ref, t, owner)}"
                                 + (f"; tokens 0..{t - 1} are right" if t else ""))


def expected_bytes(comm, ref, per):
    """The bytes formula of the module docstring for this rank, and its parts."""
    ep, me = comm.size, comm.rank
    to_rank = np.bincount(ref.chosen.reshape(-1) // per, minlength=ep)          # rows per owner
    matrix = np.array(comm.mpi.allgather(to_rank))                              # [from, to]
    rows_to = int(to_rank.sum() - to_rank[me])
    rows_from = int(matrix[:, me].sum() - matrix[me, me])
    comm.reset_counters()
    all_to_all(comm, to_device(np.zeros((0, 1))), [0] * ep)
    exchange = comm.bytes_sent
    rows, counts = 2 * (rows_to + rows_from) * D * 8, (ep - 1) * per * 8
    return rows + counts + 5 * exchange, (rows_to, rows_from, rows, counts, exchange)


def check_one(world, fn, ep):
    rank = world.rank
    comm = world.split(color=rank // ep, key=rank % ep)
    per = E // ep
    owner = lambda e: e // per                                     # noqa: E731  (ep rank of expert e)
    what = f"ep {ep} (this rank is ep rank {comm.rank} of ranks {[rank // ep * ep + i for i in range(ep)]}, " \
           f"holding experts {comm.rank * per}..{(comm.rank + 1) * per - 1})"
    x, cotangent = tokens_of(rank)
    ref = Reference(x, cotangent, rank)
    summed = {}
    for name, g in ref.grads.items():                              # an expert's: the ep group's sum
        if name.startswith("experts."):
            total = np.zeros_like(g)
            comm.mpi.Allreduce(np.ascontiguousarray(g), total)
            summed[name] = total
        else:
            summed[name] = g
    want_bytes, parts = expected_bytes(comm, ref, per)

    moe = layer()
    apply_expert_parallel(moe, comm)
    xt = Tensor(to_device(x), requires_grad=True)
    comm.reset_counters()
    out = fn(comm, moe, xt)
    if not isinstance(out, Tensor):
        raise AssertionError(f"{what}: moe_layer returned a {type(out).__name__}, not a Tensor: build the "
                             f"output with autograd ops, so that backward reaches the router and the experts")
    check_output(to_host(out.data), ref, owner, what)
    ops.sum(ops.mul(out, Tensor(to_device(cotangent)))).backward()
    sent = comm.bytes_sent

    params = dict(moe.named_parameters())
    router = params["router.weight"].grad
    if router is None or not close(to_host(router), summed["router.weight"]):
        found = "none" if router is None else f"one that differs by {np.abs(to_host(router) - summed['router.weight']).max():.1e}"
        raise AssertionError(f"{what}: the router's weight gradient is {found}: the weights w_j must be "
                             f"computed from the router's probabilities as a Tensor, so the gradient reaches it")
    if xt.grad is None:
        raise AssertionError(f"{what}: no gradient reached the tokens x: build the output from x with "
                             f"autograd ops (and the given AllToAll), not from its .data")
    dx = to_host(xt.grad)
    for t in range(T):
        if not close(dx[t], ref.dx[t]):
            experts = ", ".join(f"{e} (ep rank {owner(e)})" for e in ref.chosen[t])
            raise AssertionError(f"{what}: the input gradient of token {t} (experts {experts}) differs from the "
                                 f"one-process layer's by {np.abs(dx[t] - ref.dx[t]).max():.1e}; the output is right")
    for name, p in params.items():
        if name.startswith("experts."):
            e = int(name.split(".")[1])
            got = None if p.grad is None else to_host(p.grad)
            if got is None or not close(got, summed[name]):
                alone = got is not None and close(got, ref.grads[name])
                story = ("only this rank's tokens' part: the rows of the other ranks of the group did not "
                         "reach it") if alone else ("none" if got is None else
                                                    f"off by {np.abs(got - summed[name]).max():.1e}")
                raise AssertionError(f"{what}: expert {e}'s gradient {name} must be the sum over the ep "
                                     f"group's ranks of their tokens' gradients; it is {story}")

    rows_to, rows_from, rows, counts, exchange = parts
    if sent != want_bytes:
        whole_vector = (ep - 1) * (E - per) * 8
        story = (f"; the excess, {sent - want_bytes} = (ep-1)·(E - E/ep)·8, is every expert's count sent to every "
                 f"rank: an owner needs only its own experts' counts") if sent - want_bytes == whole_vector else ""
        exchanges = f"; and five all-to-alls' own count exchanges, 5·{exchange}" if exchange else ""
        raise AssertionError(
            f"{what}: output and gradients are right, but this rank sent {sent} bytes in forward and backward; "
            f"it should send {want_bytes}: its {rows_to} rows for experts of other ranks and the {rows_from} "
            f"rows other ranks sent for its experts, there and back, in forward and again in backward, "
            f"2·({rows_to} + {rows_from})·{D}·8 = {rows}; the counts per expert once, (ep-1)·(E/ep)·8 = "
            f"{counts}{exchanges}{story}")
    return sent, parts


def check(world, fn):
    backend.set_default_dtype(np.float64)
    if world.size != 4:
        raise AssertionError(f"run it on 4 ranks (mpiexec -n 4), not {world.size}")
    for ep in EP_SIZES:
        sent, (rows_to, rows_from, rows, counts, exchange) = check_one(world, fn, ep)
        every = world.mpi.gather((sent, rows_to, rows_from), root=0)
        if world.rank == 0:
            print(f"ep {ep}: output, input, router and expert gradients equal one process's; bytes sent per "
                  "rank (rows to other ranks' experts, rows from them): "
                  + ", ".join(f"rank {r} {s} ({a}, {b})" for r, (s, a, b) in enumerate(every)), flush=True)
    if world.rank == 0:
        print(f"correct on 4 ranks at ep {' and '.join(map(str, EP_SIZES))}: every token's output and "
              "gradients, every expert's gradient summed over its ep group, and the bytes", flush=True)


if __name__ == "__main__":
    main(__doc__, check, "moe_layer")
