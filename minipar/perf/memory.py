"""Model-state memory per rank: parameters, gradients, optimizer state, master weights.

For Ψ parameters on one rank, AdamW (m and v) and a data-parallel group of N ranks
(Rajbhandari et al. 2020), with K bytes of optimizer state per parameter (K = 8: m, v
in fp32; mixed precision adds a 4-byte fp32 master, K = 12):

    ZeRO 0   2Ψ + 2Ψ + KΨ          (half weights, half grads; fp32: 4Ψ + 4Ψ + 8Ψ)
    ZeRO 1   2Ψ + 2Ψ + KΨ/N
    ZeRO 2   2Ψ + (2 + K)Ψ/N
    ZeRO 3   (2 + 2 + K)Ψ/N

minipar's accounting (``Optimizer.memory_bytes``) is reproduced exactly, byte for byte:
Ψ is this rank's share of the model (tensor-parallel slices, its pipeline stages),
ZeRO shards are of *padded* buckets (each bucket's length rounded up to a multiple of
N), and DDP under mixed precision counts the half model plus its fp32 masters in
both ``params`` and ``grads`` (the masters carry the fp32 gradient).

The llama block (``nn/llama.py``) has no biases, RMSNorm gains only, SwiGLU's three
matrices of d × d_ff, and K/V projections of n_kv_head heads (a tp rank holding a
copy of one head when tp > n_kv_head).

``param_sizes`` lists this rank's parameters in the model's order; ``buckets`` groups
them as ``parallel/buckets.make_buckets`` does (reverse order, ~bucket_bytes each).
"""
from __future__ import annotations

from functools import lru_cache

from minipar.comm.chunks import chunk_bounds
from minipar.parallel.buckets import bucket_bytes
from minipar.perf.profile import DTYPE_BYTES


def _block(cfg, t):
    if cfg.arch == "llama":
        return _llama_block(cfg, t)
    h = cfg.d_model
    ht, h4 = h // t, 4 * h // t
    return [("ln_1.weight", h), ("ln_1.bias", h), ("attn.qkv.weight", h * 3 * ht),
            ("attn.qkv.bias", 3 * ht), ("attn.proj.weight", ht * h), ("attn.proj.bias", h),
            ("ln_2.weight", h), ("ln_2.bias", h), ("mlp.fc.weight", h * h4),
            ("mlp.fc.bias", h4), ("mlp.proj.weight", h4 * h), ("mlp.proj.bias", h)]


def kv_columns(cfg, t):
    """Columns of k_proj (and of v_proj) on one tp rank: its n_kv_head/t heads, or the
    one head it holds a copy of when t > n_kv_head (``parallel/tensor/llama.py``)."""
    d = cfg.d_model // cfg.n_head
    return d * max(cfg.kv_heads // t, 1)


def _llama_block(cfg, t):
    """RMSNorm gains, q/k/v/o, gate/up/down: no biases; K and V of the KV heads only."""
    h, f = cfg.d_model, cfg.ffn_width
    kv = kv_columns(cfg, t)
    return [("ln_1.weight", h), ("attn.q_proj.weight", h * h // t),
            ("attn.k_proj.weight", h * kv), ("attn.v_proj.weight", h * kv),
            ("attn.o_proj.weight", h // t * h), ("ln_2.weight", h),
            ("mlp.gate_proj.weight", h * f // t), ("mlp.up_proj.weight", h * f // t),
            ("mlp.down_proj.weight", f // t * h)]


@lru_cache(maxsize=512)
def units(cfg, tp=1, tp_rank=0, pp=1, chunks=1, pp_rank=0):
    """This rank's parameters as ZeRO-3's units: [[(name, numel), ...], ...] —
    embeddings (first stage), one unit per block, final norm + head (last stage)."""
    h, V = cfg.d_model, cfg.padded_vocab_size
    vb = chunk_bounds(V, tp)
    v_mine = vb[tp_rank + 1] - vb[tp_rank]
    S, per = pp * chunks, cfg.n_layer // (pp * chunks)
    out = []
    for c in range(chunks):
        s = c * pp + pp_rank
        if s == 0:
            embed = [("wte.weight", v_mine * h)]
            if cfg.arch == "gpt2":                  # llama: no table of positions
                embed.append(("wpe.weight", cfg.seq_len * h))
            out.append(embed)
        for i in range(s * per, (s + 1) * per):
            out.append([(f"blocks.{i}.{n}", k) for n, k in _block(cfg, tp)])
        if s == S - 1:
            head = [("ln_f.weight", h)] + ([("ln_f.bias", h)] if cfg.arch == "gpt2" else [])
            if not cfg.tie_weights:
                head.append(("lm_head.weight", h * v_mine))
            out.append(head)
    return out


def param_sizes(cfg, **where):
    """[(name, numel)] of this rank's parameters, in the model's order."""
    return _flat(cfg, tuple(sorted(where.items())))


@lru_cache(maxsize=512)
def _flat(cfg, where):
    return [p for unit in units(cfg, **dict(where)) for p in unit]


def rank_buckets(cfg, bucket_bytes, itemsize, pad_to, **where):
    """``buckets`` of this rank's parameters (cached: a search asks many times)."""
    return _rank_buckets(cfg, bucket_bytes, itemsize, pad_to, tuple(sorted(where.items())))


@lru_cache(maxsize=4096)
def _rank_buckets(cfg, bucket_bytes, itemsize, pad_to, where):
    return buckets(param_sizes(cfg, **dict(where)), bucket_bytes, itemsize, pad_to)


def numel(cfg, **where):
    """Ψ: this rank's parameter count."""
    return _numel(cfg, tuple(sorted(where.items())))


@lru_cache(maxsize=512)
def _numel(cfg, where):
    return sum(k for _, k in param_sizes(cfg, **dict(where)))


def buckets(sizes, bucket_bytes, itemsize, pad_to=1):
    """Element counts (numel, padded) of the buckets ``make_buckets`` would build."""
    out, current, size = [], 0, 0
    for _, n in reversed(sizes):
        nbytes = n * itemsize
        if current and size + nbytes > bucket_bytes:
            out.append(current)
            current, size = 0, 0
        current += n
        size += nbytes
    if current:
        out.append(current)
    return [(n, -(-n // pad_to) * pad_to) for n in out]


def model_state_bytes(cfg, config, coords=(0, 0, 0)):
    """{"params", "grads", "optimizer"} bytes on the rank at (dp, tp, pp) ``coords`` of
    a *resolved* TrainConfig — what ``Optimizer.memory_bytes()`` reports there."""
    _, tp_rank, pp_rank = coords
    where = dict(tp=config.tp, tp_rank=tp_rank, pp=config.pp, chunks=config.chunks,
                 pp_rank=pp_rank)
    half = config.precision in ("fp16", "bf16")
    full_item = DTYPE_BYTES["fp32" if half else config.precision]   # masters, m, v
    item = 2 if half else full_item                                  # model weights
    n, psi = config.dp, numel(cfg, **where)
    if config.zero == 0:
        model = psi * item
        master = psi * full_item if half else 0
        return {"params": model + master, "grads": model + master,
                "optimizer": 2 * psi * full_item}
    if config.zero == 3:
        parts = [sum(k for _, k in u) for u in units(cfg, **where)]
        shards = [-(-k // n) for k in parts]
        padded = [s * n for s in shards]
    else:
        bb = bucket_bytes(config)
        got = rank_buckets(cfg, bb, item, n, **where)
        padded = [p for _, p in got]
        shards = [p // n for p in padded]
    shard = sum(shards)
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
    _, tp_rank, pp_rank = coords
    where = dict(tp=config.tp, tp_rank=tp_rank, pp=config.pp, chunks=config.chunks,
                 pp_rank=pp_rank)
    item = 2 if config.precision in ("fp16", "bf16") else DTYPE_BYTES[config.precision]
    if config.zero == 3:
        n = config.dp
        return item * 4 * max(-(-sum(k for _, k in u) // n) * n for u in units(cfg, **where))
    bb = bucket_bytes(config)
    got = sorted(p for _, p in rank_buckets(cfg, bb, item, config.dp, **where))
    return item * sum(got[-2:])
