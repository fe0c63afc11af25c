"""mpiexec script: whole-GPT parity of tensor parallelism (x data parallelism), float64.

    mpiexec -n T·D python tests/scripts/tp_gpt.py T CONFIG [CONFIG ...]

CONFIG is '+'-joined flags: plain, sp (sequence parallel), tie (tied head), drop (dropout
0.1; only without dp, whose ranks draw masks for their own rows).  For each config every
rank trains the single-process reference itself (the oracle), then the tp model sliced
from the same initialisation, for 5 AdamW steps with global-norm clipping, and checks:
losses and clipped norms per step, final parameters (``full_state_dict``), AdamW moments
(gathered), replicated parameters bit-identical across tp ranks, and that
``load_full_state_dict`` round-trips.  Shapes scale with T (heads
2T, vocab 61: uneven slices); global batch 4 rows, split over dp; gradients averaged
over dp here by hand (the DDP wrapper's job in the CLI).
"""
import sys

import numpy as np

from minipar import backend
backend.set_default_dtype(np.float64)

from minipar.comm import Communicator, abort_on_exception, all_reduce  # noqa: E402
from minipar.nn import GPT, GPTConfig  # noqa: E402
from minipar.optim import AdamW, clip_grad_norm  # noqa: E402
from minipar.parallel.grid import ProcessGrid  # noqa: E402
from minipar.parallel.tensor import clip_tp_grad_norm, to_tensor_parallel  # noqa: E402

abort_on_exception()
world = Communicator()
tp = int(sys.argv[1])
grid = ProcessGrid(world, dp=world.size // tp, tp=tp)
STEPS, BATCH, CLIP, SEED = 5, 4, 0.5, 3


def batches(cfg):
    rng = np.random.default_rng(11)
    for _ in range(STEPS):
        yield (rng.integers(0, cfg.vocab_size, (BATCH, cfg.seq_len)),
               rng.integers(0, cfg.vocab_size, (BATCH, cfg.seq_len)))


def rel(a, b):
    return np.abs(np.asarray(a) - np.asarray(b)).max() / max(np.abs(np.asarray(b)).max(), 1e-300)


def reference(cfg):
    model = GPT(cfg, seed=SEED)
    opt = AdamW(model.named_parameters(), lr=1e-2, weight_decay=0.1)
    losses, norms = [], []
    for x, y in batches(cfg):
        _, loss = model(x, y)
        loss.backward()
        norms.append(clip_grad_norm(model.parameters(), CLIP))
        opt.step()
        opt.zero_grad()
        losses.append(loss.item())
    return model, opt, losses, norms


def tensor_parallel(cfg, sp):
    model = to_tensor_parallel(GPT(cfg, seed=SEED), grid, sequence_parallel=sp)
    opt = AdamW(model.named_parameters(), lr=1e-2, weight_decay=0.1)
    dp, r = grid.dp, grid.coords.dp
    losses, norms = [], []
    for x, y in batches(cfg):
        rows = slice(r * BATCH // dp, (r + 1) * BATCH // dp)
        _, loss = model(x[rows], y[rows])
        loss.backward()
        model.reduce_replicated_grads()              # sequence parallel: sum over tp
        for p in model.parameters():                 # data parallel: mean over dp
            all_reduce(grid.dp_comm, p.grad, algorithm="ring")
            p.grad /= dp
        norms.append(clip_tp_grad_norm(model, CLIP))
        opt.step()
        opt.zero_grad()
        losses.append(float(all_reduce(grid.dp_comm, np.array([loss.item()]))[0]) / dp)
    return model, opt, losses, norms


for config in sys.argv[2:]:
    flags = set(config.split("+"))
    cfg = GPTConfig(vocab_size=61, seq_len=4 * tp, n_layer=2, d_model=8 * tp, n_head=2 * tp,
                    dropout=0.1 if "drop" in flags else 0.0, tie_weights="tie" in flags)
    ref, ref_opt, ref_losses, ref_norms = reference(cfg)
    model, opt, losses, norms = tensor_parallel(cfg, "sp" in flags)
    assert max(ref_norms) > CLIP, "clipping must be exercised"
    assert rel(losses, ref_losses) < 1e-11, (config, losses, ref_losses)
    assert rel(norms, ref_norms) < 1e-11, (config, norms, ref_norms)
    full = model.full_state_dict()
    want = ref.state_dict()
    assert list(full) == list(want), "names must be the plain GPT's, in its order"
    worst = max(rel(full[n], want[n]) for n in want)
    assert worst < 1e-10, (config, worst)
    m = model.gather_full_arrays({n: s["m"] for n, s in opt.state.items()})
    worst_m = max(rel(m[n], ref_opt.state[n]["m"]) for n in want)
    assert worst_m < 1e-10, (config, worst_m)
    for name, p in model.named_parameters():      # replicated slices stay bit-identical
        if name not in model.shard_specs:
            hi = all_reduce(grid.tp_comm, p.data.copy(), op="max")
            lo = all_reduce(grid.tp_comm, p.data.copy(), op="min")
            assert np.array_equal(hi, lo), f"{config}: {name} differs across tp ranks"
    x, _ = next(batches(cfg))
    model.eval(), ref.eval()
    assert rel(model.gather_logits(model(x)).data, ref(x).data) < 1e-11, "gathered logits"
    other = to_tensor_parallel(GPT(cfg, seed=SEED + 1), grid, sequence_parallel="sp" in flags)
    other.load_full_state_dict(want)
    assert all(np.array_equal(a, want[n]) for n, a in other.full_state_dict().items())
    if world.rank == 0:
        print(f"dp={grid.dp} tp={tp} {config}: {STEPS} steps, loss {losses[0]:.4f} -> "
              f"{losses[-1]:.4f}, max rel err loss {rel(losses, ref_losses):.1e}, "
              f"params {worst:.1e}; ok", flush=True)
