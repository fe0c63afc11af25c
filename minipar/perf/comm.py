"""Communication time of a layout, from the profile's curves or its links' α and β.

A collective over p ranks of S bytes (ring algorithms; α the latency, B the bandwidth
per rank of the slowest link the group crosses):

    all-reduce       2(p-1)·α + 2(p-1)/p · S / B
    all-gather       (p-1)·α  +  (p-1)/p · S / B      (S: the gathered size)
    reduce-scatter   (p-1)·α  +  (p-1)/p · S / B      (S: the input size)
    send/recv        α + S / B

A measured profile has curves ``collectives[kind]["p:placement"]`` (seconds against
bytes), used where present.  Placement: ranks are numbered tp fastest, then dp, then
pp (``parallel/grid.py``), so a group of p ranks ``stride`` apart stays inside a
node of R ranks when p·stride <= R ("intra"), else it crosses nodes ("inter") — with
the launcher's block placement; ``Cyclic`` is the other one.

What counts towards a step (``exposed``):

- tensor parallelism: 2 all-reduces of b·s·h per layer forward and 2 in backward
  (with sequence parallelism an all-gather + reduce-scatter each: the same bytes),
  on the critical path;
- data parallelism: buckets all-reduced as backward produces them; a bucket starts
  when its gradients are ready and the previous one is done, so only what runs past
  the end of backward is exposed (all of it without overlap);
- ZeRO-1: reduce-scatter after backward + all-gather after the step;  ZeRO-2: the
  reduce-scatters overlap like DDP, the all-gather does not;  ZeRO-3: per unit an
  all-gather in forward and in backward (prefetched: hidden behind the previous
  unit's compute) and a reduce-scatter, plus its measured bookkeeping per unit;
- where the ranks fill a CPU's cores a transfer is a core's work taken from compute
  (``Profile.overlaps_comm``): that much of it never hides.  Across nodes a transfer
  is also time on the wire, which costs no core: of each bucket's time across the link
  t_inter, the part beyond the same bucket's time inside a node (t_intra, the copying)
  hides behind backward like any bucket's (``overlapped_buckets``), t_intra does not;
- pipeline: one activation send per stage boundary (the simulator's t_comm).
"""
from __future__ import annotations

from minipar.perf.profile import interp_loglog

FACTOR = {"all_reduce": 2.0, "all_gather": 1.0, "reduce_scatter": 1.0}


class Cyclic(int):
    """Nodes of ``ranks_per_node`` ranks with the ranks dealt round them, rank r on node
    r mod ``nodes`` (``cluster run --placement cyclic``; mpiexec -hosts a:1,b:1,...).  A
    group of p ranks ``stride`` apart then stays inside a node only when the stride is a
    multiple of the node count.  It is an int (the node size), so every other use of
    ``ranks_per_node`` stays as it is."""

    def __new__(cls, ranks_per_node, nodes):
        value = super().__new__(cls, ranks_per_node)
        value.nodes = nodes
        return value


def placement(p, stride, ranks_per_node):
    if isinstance(ranks_per_node, Cyclic):
        return "intra" if p == 1 or stride % ranks_per_node.nodes == 0 else "inter"
    return "intra" if p * stride <= max(ranks_per_node, 1) else "inter"


def collective_seconds(prof, kind, p, nbytes, where="intra", gap_s=None):
    """Seconds of one ``kind`` collective of ``nbytes`` over ``p`` ranks; ``gap_s``: the
    seconds its link idled before it (``burst_seconds``), None: as calibrated."""
    if p <= 1 and kind != "p2p" or nbytes <= 0:
        return 0.0
    curve = prof.curve(kind, p, where)
    if curve:
        t = interp_loglog(curve, nbytes)
        if where == "inter" and gap_s is not None:
            out = nbytes if kind == "p2p" else FACTOR[kind] * (p - 1) / p * nbytes
            t = max(t - burst_seconds(prof, out, gap_s), 0.1 * t)
        return t
    alpha, bw = prof.link(where)
    if kind == "p2p":
        return alpha + nbytes / bw
    f = FACTOR[kind]
    return f * (p - 1) * alpha + f * (p - 1) / p * nbytes / bw


def burst_seconds(prof, out_bytes, gap_s):
    """Seconds a shaped link's burst saves a transfer of ``out_bytes`` across it after
    ``gap_s`` idle seconds, over what it saved in calibration.  A token bucket (tc's
    tbf: the simulated cluster; switches' buffers do the like) earns credit at the
    link's rate while the link idles, up to the burst B, and lets that much through at
    once:

        credit(g) = min(B, g · bw, out_bytes)      saving = (credit(gap) - credit(g_cal)) / bw

    g_cal: the idle time before each call ``calibrate`` timed (``comm_gap_s``, ~1 ms),
    B: ``calibrate_across``'s ``burst_inter``.  tp's all-reduces come a few ms of
    compute apart and a pipeline's sends a micro-batch apart; both earn more than the
    curves' calls did.  0 where the profile lacks any of them (a real cluster's
    profile without a measured burst; profiles from before)."""
    burst = prof.cost_params.get("burst_inter") or 0.0
    g_cal = prof.efficiency.get("comm_gap_s")
    bw = prof.links.get("inter", {}).get("bw")
    if not burst or g_cal is None or not bw:
        return 0.0

    def credit(g):
        return min(burst, max(g, 0.0) * bw, out_bytes)
    return (credit(gap_s) - credit(g_cal)) / bw


def overlapped_buckets(bucket_seconds, backward_s, overlap=True):
    """Exposed seconds of buckets whose gradients become ready evenly through a
    backward of ``backward_s`` (the first bucket after its share of it):

        ready_i = backward_s · (i+1)/n,  start_i = max(ready_i, end_{i-1}),
        exposed = end_last - backward_s         (no overlap: Σ bucket times)
    """
    if not bucket_seconds:
        return 0.0
    if not overlap:
        return sum(bucket_seconds)
    n, end = len(bucket_seconds), 0.0
    for i, t in enumerate(bucket_seconds):
        end = max(backward_s * (i + 1) / n, end) + t
    return max(end - backward_s, 0.0)


def tp_seconds_per_layer(prof, tp, act_bytes, ranks_per_node, sp=False, gaps=(None, None)):
    """(forward, backward) seconds of one layer's tensor-parallel collectives; ``gaps``:
    the compute before each in forward and in backward (half the layer's: attention,
    then the MLP), the link's idle time (``burst_seconds``)."""
    if tp <= 1:
        return 0.0, 0.0
    where = placement(tp, 1, ranks_per_node)

    def one(gap):
        if sp:   # each all-reduce becomes an all-gather before the block half, a reduce-scatter after
            return 2 * (collective_seconds(prof, "all_gather", tp, act_bytes, where, gap)
                        + collective_seconds(prof, "reduce_scatter", tp, act_bytes, where, gap))
        return 2 * collective_seconds(prof, "all_reduce", tp, act_bytes, where, gap)
    return one(gaps[0]), one(gaps[1])


def kv_copies_seconds(prof, tp, n_kv_head, weight_bytes, ranks_per_node):
    """Backward seconds per llama layer of summing the copies' gradients of k_proj and
    v_proj (``weight_bytes`` each) over the tp/n_kv_head ranks sharing a KV head, when
    tp > n_kv_head (``parallel/tensor/llama.py``); 0 otherwise."""
    if tp <= n_kv_head:
        return 0.0
    copies = tp // n_kv_head
    where = placement(copies, 1, ranks_per_node)
    return 2 * collective_seconds(prof, "all_reduce", copies, weight_bytes, where)


def tp_seconds_edges(prof, tp, act_bytes, tokens, ranks_per_node, sp=False, gaps=(None, None)):
    """((forward, backward) of the embeddings, (forward, backward) of the head) in
    tensor-parallel collectives: the vocabulary-parallel lookup's sum (a reduce-scatter
    under SP), the head's input region (its backward all-reduce; under SP an all-gather
    forward, a reduce-scatter backward) and the vocabulary-parallel loss's two small
    all-reduces (the max, then the sums and picked logits: 3 floats per token).
    ``gaps``: the compute before those of forward and of backward, as for a layer's."""
    if tp <= 1:
        return (0.0, 0.0), (0.0, 0.0)
    where = placement(tp, 1, ranks_per_node)
    f = lambda kind, n: collective_seconds(prof, kind, tp, n, where, gaps[0])  # noqa: E731
    b = lambda kind, n: collective_seconds(prof, kind, tp, n, where, gaps[1])  # noqa: E731
    loss = f("all_reduce", 4 * tokens) + f("all_reduce", 8 * tokens)
    if sp:
        return (f("reduce_scatter", act_bytes), b("all_gather", act_bytes)), \
            (f("all_gather", act_bytes) + loss, b("reduce_scatter", act_bytes))
    return (f("all_reduce", act_bytes), 0.0), (loss, b("all_reduce", act_bytes))


def dp_exposed_seconds(prof, zero, dp, bucket_bytes, unit_bytes, backward_s, forward_s,
                       overlap, stride, ranks_per_node, accum=1):
    """Exposed seconds of the gradient synchronisation of one step (see the docstring).
    ``bucket_bytes``: the gradient buckets (ZeRO-3: ``unit_bytes``, the units).  Where
    the ranks fill the cores (``Profile.overlaps_comm``) a transfer's copying never
    hides, only its time on a wire between nodes does (``hidden_part``); ZeRO-3 then
    pays every transfer in full and its measured cost per unit on top."""
    if dp <= 1:
        return 0.0
    where = placement(dp, stride, ranks_per_node)
    hides = prof.overlaps_comm(ranks_per_node)
    memo = {}
    # the link idles between a micro-batch's buckets for its compute over their number
    gap = (forward_s + backward_s) / accum / max(len(unit_bytes if zero == 3 else bucket_bytes), 1)

    def t(kind, n, at=where):   # buckets mostly share one size: time each size once
        if (kind, n, at) not in memo:
            memo[kind, n, at] = collective_seconds(prof, kind, dp, n, at, gap)
        return memo[kind, n, at]

    def overlapped(kind):
        """Exposed seconds of ``kind`` on each bucket, started as backward fills them."""
        full = [t(kind, n) for n in bucket_bytes]
        if hides or where == "intra" or not overlap:
            return overlapped_buckets(full, backward_s / accum, overlap and hides)
        copying = [min(t(kind, n, "intra"), f) for n, f in zip(bucket_bytes, full)]
        wire = [f - c for f, c in zip(full, copying)]
        return sum(copying) + overlapped_buckets(wire, backward_s / accum, True)
    if zero == 0:
        return overlapped("all_reduce")
    if zero in (1, 2):
        ag = sum(t("all_gather", n) for n in bucket_bytes)
        if zero == 1:
            return sum(t("reduce_scatter", n) for n in bucket_bytes) + ag
        return accum * overlapped("reduce_scatter") + ag
    units = [(t("all_gather", n), t("reduce_scatter", n)) for n in unit_bytes]
    per_unit = len(units) * prof.efficiency.get("zero3_unit_overhead_s", 0.0)
    if not hides:
        return accum * (sum(2 * g + r for g, r in units) + per_unit)
    k = max(len(units), 1)
    f_unit, b_unit = forward_s / accum / k, backward_s / accum / k
    fwd = units[0][0] + sum(max(g - f_unit, 0.0) for g, _ in units[1:])
    bwd = units[-1][0] + sum(max(g + r - b_unit, 0.0) for g, r in units[:-1]) + units[0][1]
    return accum * (fwd + bwd + per_unit)


def pp_send_seconds(prof, pp, act_bytes, stride, ranks_per_node, gap_s=None):
    """One activation (or its gradient) between neighbouring stages; ``gap_s``: the
    compute between two sends on the link (a stage's micro-batch)."""
    if pp <= 1:
        return 0.0
    return collective_seconds(prof, "p2p", 2, act_bytes, placement(2, stride, ranks_per_node),
                              gap_s)

