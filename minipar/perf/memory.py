"""Model-state memory per rank: parameters, gradients, optimizer state, master weights.

For Ψ parameters on one rank, AdamW (m and v) and a data-parallel group of N ranks
(Rajbhandari et al. 2020), with K bytes of optimizer state per parameter (K = 8: m, v
in fp32; mixed precision adds a 4-byte fp32 master, K = 12):

    ZeRO 0   2Ψ + 2Ψ + KΨ          (half weights, half grads; fp32: 4Ψ + 4Ψ + 8Ψ)
    ZeRO 1   2Ψ + 2Ψ + KΨ/N
    ZeRO 2   2Ψ + (2 + K)Ψ/N
    ZeRO 3   (2 + 2 + K)Ψ/N

``model_state_bytes`` is what ``Optimizer.memory_bytes`` reports, exactly: Ψ is this
rank's share of the model, the ZeRO shards are of *padded* buckets (each bucket's
length rounded up to a multiple of N), and DDP under mixed precision counts the half
model plus its fp32 masters in both ``params`` and ``grads`` (the masters carry the fp32
gradient).  Exact because every count is read from the objects training builds, none
listed here:

    this rank's parameters   the model of placeholders (``nn/gpt.py``, ``nn/llama.py``)
                             cut by the library's own tensor-parallel swaps and
                             pipeline stages (``parallel/shapes.rank_parameters``), each
                             parameter's size its ``Placement.local_size``
    DDP, ZeRO-1/2 buckets    ``parallel/buckets.make_buckets`` over those parameters,
                             in the dtype the gradients travel in
    ZeRO-3's units           ``parallel/sync/zero3.model_units``, each one ``Bucket``

A rank's cut model is built once per (cfg, tp, tp_rank, pp, chunks, pp_rank) and kept:
a layout search asks for the same few ranks many times.
"""
from __future__ import annotations

from functools import lru_cache

from minipar.backend import dtype_of
from minipar.parallel.buckets import Bucket, bucket_bytes, make_buckets
from minipar.parallel.experts import is_expert_weight
from minipar.parallel.shapes import rank_parameters
from minipar.parallel.sync.zero3 import model_units
from minipar.perf.profile import DTYPE_BYTES


def _where(tp=1, tp_rank=0, pp=1, chunks=1, pp_rank=0, ep=1, ep_rank=0):
    """A rank's coordinates as one cache key."""
    return tp, tp_rank, pp, chunks, pp_rank, ep, ep_rank


def _in_part(name, part):
    """Whether parameter ``name`` is in ``part``: None (all), "dense" or "experts" (the
    two sets expert parallelism synchronises over different groups, ``sync/experts.py``)."""
    return part is None or is_expert_weight(name) == (part == "experts")


@lru_cache(maxsize=512)
def _rank(cfg, where):
    return rank_parameters(cfg, *where)


def param_sizes(cfg, part=None, **where):
    """[(name, numel)] of this rank's parameters (of ``part``), in the model's order.
    ``where``: tp, tp_rank, pp, chunks, pp_rank, ep, ep_rank (default one rank holding
    the whole model)."""
    return _param_sizes(cfg, part, _where(**where))


@lru_cache(maxsize=512)
def _param_sizes(cfg, part, where):
    rank = _rank(cfg, where)
    return [(name, rank.placements[name].local_size)
            for name, _ in rank.module.named_parameters() if _in_part(name, part)]


def numel(cfg, part=None, **where):
    """Ψ: this rank's parameter count (of ``part``)."""
    return sum(k for _, k in param_sizes(cfg, part, **where))


def rank_buckets(cfg, bucket_bytes, precision, pad_to, part=None, **where):
    """[(numel, padded)] of the buckets ``make_buckets`` groups this rank's parameters
    (of ``part``) into: ~``bucket_bytes`` each of ``precision`` values, padded to a
    multiple of ``pad_to``."""
    return _rank_buckets(cfg, bucket_bytes, precision, pad_to, part, _where(**where))


@lru_cache(maxsize=4096)
def _rank_buckets(cfg, bucket_bytes, precision, pad_to, part, where):
    params = [p for n, p in _rank(cfg, where).module.named_parameters() if _in_part(n, part)]
    buckets = make_buckets(params, bucket_bytes, pad_to, dtype_of(precision))
    return [(b.numel, b.padded) for b in buckets]


def rank_units(cfg, pad_to, part=None, **where):
    """[(numel, padded)] of ZeRO-3's units on this rank (embeddings, each block, final
    norm and head; of ``part``'s parameters, the empty ones left out), each padded to a
    multiple of ``pad_to``.  ZeRO-3 runs without a pipeline: its units are of the whole
    (tp-cut) model."""
    return _rank_units(cfg, pad_to, part, _where(**where))


@lru_cache(maxsize=512)
def _rank_units(cfg, pad_to, part, where):
    _, _, pp, chunks, *_ = where
    if pp * chunks > 1:
        raise ValueError("ZeRO-3's units are of a model without pipeline stages (pp = chunks = 1)")
    model = _rank(cfg, where).model
    names = {id(p): n for n, p in model.named_parameters()}
    units = [[p for p in unit if _in_part(names[id(p)], part)] for unit in model_units(model)]
    return [(b.numel, b.padded) for b in (Bucket(unit, pad_to) for unit in units if unit)]


def _coordinates(config, coords):
    """``where`` of the rank at (dp, tp, pp) ``coords`` of ``config`` (every expert-parallel
    rank holds E/ep experts of the same shapes: the first stands for them)."""
    _, tp_rank, pp_rank = coords
    return dict(tp=config.tp, tp_rank=tp_rank, pp=config.pp, chunks=config.chunks,
                pp_rank=pp_rank, ep=getattr(config, "ep", 1))


def synchronised_parts(config):
    """[(part, N)]: the parameter sets a synchroniser of their own keeps, each with the
    ranks it spans — every parameter over dp × cp, or under expert parallelism the dense
    ones over dp × cp and the experts over the dp·cp/ep ranks holding the same ones."""
    n, ep = data_parallel_ranks(config), getattr(config, "ep", 1)
    return [(None, n)] if ep == 1 else [("dense", n), ("experts", n // ep)]


def data_parallel_ranks(config):
    """N: the ranks the synchroniser's group holds, dp × cp (context-parallel ranks hold
    the same weights and average their gradients too: ``grid.dp_cp_comm``); under DiLoCo
    those of one group, dp × cp / G."""
    return config.dp * config.cp // diloco_groups(config)


def diloco_groups(config):
    """G: DiLoCo's groups (1 without DiLoCo)."""
    return config.diloco_groups if getattr(config, "outer", "none") == "diloco" else 1


def _pad_to(config, n):
    """ZeRO pads each bucket to a multiple of the N ranks it spans so every rank's shard
    is equal; DDP all-reduces whole buckets and pads nothing (``parallel/sync``)."""
    return n if config.zero else 1


def model_state_bytes(cfg, config, coords=(0, 0, 0)):
    """{"params", "grads", "optimizer"} bytes on the rank at (dp, tp, pp) ``coords`` of
    a *resolved* TrainConfig — what ``Optimizer.memory_bytes()`` reports there."""
    where = _coordinates(config, coords)
    totals = {}
    for part, n in synchronised_parts(config):
        for key, value in _part_state_bytes(cfg, config, where, part, n).items():
            totals[key] = totals.get(key, 0) + value
        if getattr(config, "outer", "none") == "diloco":
            totals["optimizer"] += _outer_state_bytes(cfg, config, where, part, n, coords[0])
    return totals


def _outer_state_bytes(cfg, config, where, part, n, dp_rank):
    """DiLoCo's outer state on this rank (``parallel/outer``): the global weights θ and
    the outer momentum b, in the masters' dtype, for the elements it updates — under
    ZeRO its shard's parameter elements, under DDP its chunk of each fragment (the n
    replicas of a group split each fragment between them)."""
    from minipar.comm.chunks import chunk_sizes
    from minipar.parallel.outer.diloco import fragment_of
    half = config.precision in ("fp16", "bf16")
    full_item = DTYPE_BYTES["fp32" if half else config.precision]
    r = dp_rank % n
    if config.zero == 0:
        sizes = [0] * config.diloco_fragments
        for name, k in param_sizes(cfg, part, **where):
            sizes[fragment_of(name, cfg.n_layer, config.diloco_fragments)] += k
        owned = sum(chunk_sizes(size, n)[r] for size in sizes)
    else:
        got = (rank_units(cfg, n, **where) if config.zero == 3 else
               rank_buckets(cfg, bucket_bytes(config), config.precision, _pad_to(config, n),
                            part, **where))
        owned = sum(max(0, min(k, (r + 1) * (p // n)) - r * (p // n)) for k, p in got)
    return 2 * owned * full_item


def _part_state_bytes(cfg, config, where, part, n):
    """The state of one synchroniser: ``part``'s parameters over ``n`` ranks."""
    half = config.precision in ("fp16", "bf16")
    full_item = DTYPE_BYTES["fp32" if half else config.precision]   # masters, m, v
    item = DTYPE_BYTES[config.precision]                             # model weights
    psi = numel(cfg, part, **where)
    if config.zero == 0:
        model = psi * item
        master = psi * full_item if half else 0
        return {"params": model + master, "grads": model + master,
                "optimizer": 2 * psi * full_item}
    if config.zero == 3:
        got = rank_units(cfg, n, part, **where)
    else:
        got = rank_buckets(cfg, bucket_bytes(config), config.precision, _pad_to(config, n),
                           part, **where)
    padded = [p for _, p in got]
    shard = sum(padded) // n
    params = shard * item if config.zero == 3 else sum(padded) * item
    grads = psi * item if config.zero == 1 else shard * item
    masters = shard * full_item if half else 0
    return {"params": params, "grads": grads, "optimizer": masters + 2 * shard * full_item}


def total(mem):
    return sum(mem.values())


def comm_buffer_bytes(cfg, config, coords=(0, 0, 0)):
    """Bytes of the flat buffers communication packs (not in minipar's live-array count):
    DDP and ZeRO-1/2 one bucket at a time in flight per ≤ 2 buckets; ZeRO-3 four buffers
    as large as its largest (padded) unit, made once (``parallel/sync/zero3.py``): two
    units' full weights (the one computing and the prefetched one) and two units' full
    gradients (the one accumulating and the one being reduce-scattered)."""
    where = _coordinates(config, coords)
    item = DTYPE_BYTES[config.precision]
    if config.zero == 3:     # each synchroniser's four buffers of its largest unit
        return item * 4 * sum(max(p for _, p in rank_units(cfg, n, part, **where))
                              for part, n in synchronised_parts(config))
    got = sorted(p for part, n in synchronised_parts(config)
                 for _, p in rank_buckets(cfg, bucket_bytes(config), config.precision,
                                          _pad_to(config, n), part, **where))
    return item * sum(got[-2:])
