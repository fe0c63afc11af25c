"""Solutions of lesson 13's exercises (put into the notebook's exercise cells by the tests)."""

SOLUTIONS = {
    "my_flops_per_token": r'''
def my_flops_per_token(n_layer, d_model, vocab_size, seq_len, tie_weights=False):
    """Training FLOPs per token, 6N + 12·L·h·s, with N counted from the shapes (see above)."""
    h = d_model
    block = (3 * h * h + 3 * h) + (h * h + h) + (4 * h * h + 4 * h) + (4 * h * h + h) + 2 * 2 * h
    n = n_layer * block + vocab_size * h + 2 * h     # the head's matmul; the embeddings are lookups
    return 6 * n + 12 * n_layer * h * seq_len
''',
    "layer_bytes": r'''
def layer_bytes(s, b, h, a, t, sp):
    """Activation bytes one rank keeps of one layer, tensor parallelism of degree t (and, if sp,
    sequence parallelism over the same t ranks), 16-bit."""
    sbh = s * b * h
    inside = 4 * sbh + 2 * sbh + 2 * sbh + 16 * sbh + 5 * a * s * s * b   # between the tp linears
    outside = 2 * sbh + sbh + 2 * sbh + sbh + 4 * sbh                     # LayerNorms, inputs, dropouts
    return inside / t + outside / (t if sp else 1)
''',
    "ring_all_reduce_s": r'''
def ring_all_reduce_s(p, S, alpha, bw):
    """Seconds of a ring all-reduce of S bytes over p ranks (latency alpha, bandwidth bw bytes/s)."""
    return 2 * (p - 1) * (alpha + S / p / bw)
''',
    "my_step_time": r'''
def my_step_time(config, prof):
    """The step of resolved ``config`` on profile ``prof``, term by term (see above): a dict of
    t_f, t_b, t_w, t_comm (one micro-batch on the last stage, seconds), pipeline_s, bubble,
    dp_exposed_s and step_s."""
    cfg = config.model_config()
    s, h, V, layers = cfg.seq_len, cfg.d_model, cfg.vocab_size, cfg.n_layer // config.pp
    dp, t, p, nodes = config.dp, config.tp, config.pp, prof.ranks_per_node
    m = config.microbatches if p > 1 else config.grad_accum
    b = config.batch_size // (dp * m)
    dtype = config.precision if config.precision in DTYPE_BYTES else "fp32"
    e, rate = DTYPE_BYTES[dtype], prof.peak(dtype) * prof.efficiency.get("gemm", 1.0)
    # one layer on one tp rank, one micro-batch: FLOPs at the GEMM rate
    weights = 24 * b * s * h * h / t / rate
    core = 4 * b * s * s * h / t / rate
    head = 2 * b * s * h * -(-V // t) / rate
    activation = b * s * h * e
    tp = 2 * pcomm.collective_seconds(prof, "all_reduce", t, activation, pcomm.placement(t, 1, nodes))
    redo = {"none": 0.0, "selective": core, "full": weights + core + tp}[config.recompute]
    t_f = layers * (weights + core + tp) + head
    t_b = layers * (weights + 2 * core + tp + redo) + 2 * head
    t_w = layers * weights
    # the pipeline: 1F1B's fill and drain, one send per stage boundary each way
    sent = activation / (t if config.sequence_parallel else 1)
    t_comm = pcomm.collective_seconds(prof, "p2p", 2, sent, pcomm.placement(2, dp * t, nodes)) if p > 1 else 0.0
    busy = m * (t_f + t_b + t_w)
    pipeline = busy + (p - 1) * (t_f + t_b + t_w) + 2 * (p - 1) * t_comm
    # data parallelism: buckets all-reduced as the last backward completes them
    backward, buckets = t_b + t_w, gradient_buckets(config)
    end = 0.0
    for i, nbytes in enumerate(buckets if dp > 1 else []):
        ready = backward * (i + 1) / len(buckets) if config.overlap else backward
        end = max(ready, end) + pcomm.collective_seconds(prof, "all_reduce", dp, nbytes,
                                                         pcomm.placement(dp, t, nodes))
    dp_exposed = max(end - backward, 0.0)
    return dict(t_f=t_f, t_b=t_b, t_w=t_w, t_comm=t_comm, pipeline_s=pipeline,
                bubble=1 - busy / pipeline, dp_exposed_s=dp_exposed, step_s=pipeline + dp_exposed)
''',
}
