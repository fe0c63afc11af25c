"""mpiexec script: every compression-hook check, one launch (tests/test_compression.py).

    mpiexec -n N python tests/scripts/compression_cases.py OUT.json [CASE ...]

Each case returns a dict of findings; rank 0 writes {case: findings or {"error": text}}.
The pytest side asserts on them, so one launch serves many tests.
"""
import json
import sys
import traceback

import numpy as np

from minipar import backend
from minipar.comm import Communicator, all_reduce
from minipar.nn import GPT, GPTConfig, Parameter
from minipar.parallel.buckets import Bucket
from minipar.parallel.step import Optimizer
from minipar.parallel.sync import DDPSync
from minipar.parallel.sync.compression import make_hook

backend.set_default_dtype(np.float64)
comm = Communicator()
N, RANK = comm.size, comm.rank
CFG = GPTConfig(vocab_size=64, seq_len=16, n_layer=2, d_model=32, n_head=4)


def fake_buckets(*shape_lists, dtype=np.float64):
    """Buckets of fresh parameters (shapes as given), for calling a hook by hand."""
    return [Bucket([Parameter(np.zeros(s, dtype=dtype)) for s in shapes], 1) for shapes in shape_lists]


def call(hook, bucket, flat):
    """Call the hook as DDP does (bucket complete, handle unset) and wait."""
    bucket.ready = len(bucket.params)
    out = hook(comm, flat).wait()
    bucket.ready = 0
    return out


def batch(step, rows):
    rng = np.random.default_rng(1000 + step)
    ids = rng.integers(0, CFG.vocab_size, (rows, CFG.seq_len + 1))
    per = rows // N
    return ids[RANK * per:(RANK + 1) * per, :-1], ids[RANK * per:(RANK + 1) * per, 1:]


def build(method=None, bucket_bytes=8 * 1024, overlap=True, **kw):
    model = GPT(CFG, seed=0)
    hook = make_hook(method, algorithm="ring", **kw) if method else None
    sync = DDPSync(model, comm, bucket_bytes=bucket_bytes, overlap=overlap, comm_hook=hook)
    if hook is not None:
        hook.bind(sync)
    return model, Optimizer(sync, lr=3e-3), hook


def train(model, opt, steps, first=0):
    losses = []
    for step in range(first, first + steps):
        x, y = batch(step, 2 * N)
        _, loss = model(x, y)
        loss.backward()
        opt.step()
        losses.append(float(np.mean(comm.mpi.allgather(loss.item()))))
    return losses


def weights(model):
    return np.concatenate([p.data.reshape(-1) for p in model.parameters()])


def max_rel(a, b):
    return float(np.max(np.abs(a - b)) / np.max(np.abs(b)))


# ----------------------------------------------------------------------------- cases
def case_cast():
    """fp16/bf16 hook == the ring all-reduce of half(g/n), bit for bit."""
    g = np.random.default_rng(RANK).standard_normal(1001).astype(np.float32)
    out = {}
    for precision in ("fp16", "bf16"):
        got = make_hook(precision)(comm, g.copy()).wait()
        half = (g * (1.0 / N)).astype(backend.dtype_of(precision))
        want = all_reduce(comm, half, algorithm="ring").astype(np.float32)
        out[precision] = bool(np.array_equal(got, want)) and got.dtype == np.float32
    return out


def case_dense_parity():
    """top-k at 100 % and PowerSGD at full rank (start 0) reproduce the plain DDP run;
    several buckets, overlap on and off."""
    base_model, base_opt, _ = build()
    base = train(base_model, base_opt, 3)
    out = {}
    for name, method, kw in (("topk100", "topk", dict(ratio=1.0)),
                             ("topk100_no_overlap", "topk", dict(ratio=1.0, overlap=False)),
                             ("powersgd_full", "powersgd", dict(rank=10**6, start=0))):
        model, opt, hook = build(method, **kw)
        losses = train(model, opt, 3)
        out[name] = {"loss_rel": max_rel(np.array(losses), np.array(base)),
                     "weight_rel": max_rel(weights(model), weights(base_model)),
                     "buckets": len(hook.buckets), "steps": hook.step}
    return out


def case_int8_exact():
    """int8 on values it represents (q·2^-e, |q| ≤ 127, 127 in every chunk) == all-reduce,
    with a zero residual."""
    (bucket,) = fake_buckets([(3, 200), (100,)])
    rng = np.random.default_rng(RANK)
    q = rng.integers(-127, 128, bucket.padded)
    q[::256] = 127                                      # every chunk reaches the top level
    g = q * 2.0 ** -rng.integers(3, 9, bucket.padded // 256 + 1).repeat(256)[:bucket.padded]
    hook = make_hook("int8").bind([bucket])
    got = call(hook, bucket, g.copy())
    want = all_reduce(comm, g * (1.0 / N), algorithm="ring")
    return {"equal": bool(np.array_equal(got, want)), "max_rel": max_rel(got, want),
            "residual": hook.residual_norm()}


def case_error_feedback():
    """Σ_t applied_t + mean_r e_r = Σ_t mean_r g_r,t for int8, top-k 10 %, PowerSGD r=1."""
    out = {}
    for method, kw in (("int8", {}), ("topk", dict(ratio=0.1)), ("powersgd", dict(rank=1, start=1))):
        buckets = fake_buckets([(20, 30), (30,)], [(7, 11, 3), (50,)])
        hook = make_hook(method, **kw).bind(buckets)
        applied, true = 0.0, 0.0
        for t in range(5):
            for i, b in enumerate(buckets):
                gs = [np.random.default_rng([r, t, i]).standard_normal(b.padded) for r in range(N)]
                applied = applied + np.sum(call(hook, b, gs[RANK].copy()))
                true = true + np.sum(np.mean(gs, axis=0))
        residual = np.array([sum(np.sum(e) for e in hook.residual.values())])
        all_reduce(comm, residual)
        gap = abs(applied + residual[0] / N - true)
        out[method] = {"gap": float(gap), "residual": hook.residual_norm(), "steps": hook.step}
    return out


def case_bytes():
    """Counted bytes (the hook's and the communicator's) == each method's formula."""
    out = {}
    for method, kw in (("fp16", {}), ("bf16", {}), ("int8", {}), ("topk", dict(ratio=0.05)),
                       ("powersgd", dict(rank=3, start=1))):
        buckets = fake_buckets([(33, 17), (17,)], [(5,)], [(64, 9, 2), (40, 3), (9,)],
                               dtype=np.float32)
        hook = make_hook(method, **kw).bind(buckets)
        steps = []
        for t in range(2):
            comm.reset_counters()
            expect = 0
            for i, b in enumerate(buckets):
                compressing = hook.step >= hook.start
                call(hook, b, np.random.default_rng([RANK, t, i]).standard_normal(b.padded)
                     .astype(np.float32))
                expect += (hook.expected_wire_bytes(b, N, RANK) if compressing else
                           hook_dense_bytes(b))
            stats = hook.pop_stats()
            steps.append({"hook": stats["wire_bytes"], "comm": comm.bytes_sent, "formula": expect,
                          "dense": stats["dense_bytes"], "ratio": stats["compression_ratio"]})
        out[method] = steps
    return out


def hook_dense_bytes(bucket):
    from minipar.parallel.sync.compression.wire import ring_all_reduce_bytes
    return ring_all_reduce_bytes(bucket.padded, 4, N, RANK)


def case_resume():
    """K steps, save (model, optimizer, hook), K more == rebuild + load + K more, exactly;
    and without the hook's state the continuation differs."""
    out = {}
    for method, kw in (("int8", {}), ("topk", dict(ratio=0.05)), ("powersgd", dict(rank=2, start=1))):
        model, opt, hook = build(method, **kw)
        train(model, opt, 3)
        saved = (opt.model_state_dict(), opt.state_dict(), hook.state_dict())
        train(model, opt, 3, first=3)
        finals = []
        for load_hook in (True, False):
            m2, o2, h2 = build(method, **kw)
            named = saved[0]
            for n, p in m2.named_parameters():
                p.data[...] = named[n]
            o2.load_state_dict(saved[1])
            if load_hook:
                h2.load_state_dict(saved[2])
            train(m2, o2, 3, first=3)
            finals.append(weights(m2))
        out[method] = {"exact": bool(np.array_equal(finals[0], weights(model))),
                       "differs_without_state": not np.array_equal(finals[1], weights(model)),
                       "keys": sorted({k.split(".")[0] for k in saved[2]})}
    return out


def case_warmup():
    """PowerSGD's first `start` steps are plain all-reduces (ratio 1), then it compresses."""
    model, opt, hook = build("powersgd", rank=2, start=2)
    ratios = []
    for step in range(4):
        train(model, opt, 1, first=step)
        ratios.append(hook.pop_stats()["compression_ratio"])
    return {"ratios": ratios}


CASES = {k[5:]: v for k, v in dict(globals()).items() if k.startswith("case_")}
results = {}
for name, fn in CASES.items():
    if sys.argv[2:] and name not in sys.argv[2:]:
        continue
    try:
        results[name] = fn()
    except Exception:                 # the other ranks may be blocked in a collective
        print(f"rank {RANK}: case {name} failed\n{traceback.format_exc()}", file=sys.stderr,
              flush=True)
        comm.mpi.Abort(1)
gathered = comm.mpi.gather(results, root=0)
if RANK == 0:
    json.dump({"ranks": N, "per_rank": gathered}, open(sys.argv[1], "w"), indent=1)
