"""Lesson 09's exercise on every rank: your mixed-precision step of a dp run, against minipar's.

    mpiexec -n 2 python lessons/09_yours.py --file MINE.py

``MINE.py`` defines ``amp_step(comm, model, masters, optimizer, scaler, x, y, max_norm)``:
one training step of fp16 data parallelism on this rank's rows ``x, y`` (the lesson's
notebook says what it must do), returning ``(loss, norm)``: this rank's loss (a float) and
the global gradient norm before clipping, or None for a skipped step.  Beside it, on the
same data, minipar's own step: the same GPT under ``DDPSync(half_dtype=float16)`` (fp16
buckets, fp32 master flats) and ``parallel.step.Optimizer`` with a
``DynamicLossScaler(comm=world)``.  Six steps; at steps 3 and 4 the last rank writes an
inf into one of its gradients (a hook on ``wpe.weight``, on both models), so the scale
grows after three clean steps, is kept at the first overflow (hysteresis 2), halved at
the second, and steps again.  After every step, on every rank:

- **the decision**: skipped or not, as minipar's; the loss scale after it, as minipar's;
- **the norm** before clipping, as minipar's (relative 1e-5);
- **the masters, AdamW's m and v** against minipar's by name (relative 1e-5 of each
  tensor's largest entry), and the model's half weights equal to the masters rounded;
- **the messages**: what this rank sent in the step must be one all-reduce of the fp16
  gradients and one of the two float64 numbers [Σg²/p, flag] — measured on this rank's
  own ``all_reduce`` of arrays of those sizes, and against 2(p-1)/p·(2N + 16) bytes.

Two ranks exactly: on two, an fp16 sum a + b rounds the same whichever way it is added,
so your step and minipar's agree to the bit; on more, the rounding depends on the order
the all-reduce adds in.
"""
import os
import sys

try:
    import minipar  # noqa: F401
except ImportError:  # run from a checkout without installing: use the repository root
    sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

import numpy as np

from minipar import backend
from minipar.amp import DynamicLossScaler, MixedPrecision
from minipar.backend import to_device, to_host
from minipar.comm import all_reduce
from minipar.data import shard_rows
from minipar.nn import GPT, GPTConfig
from minipar.optim import AdamW
from minipar.parallel.step import Optimizer
from minipar.parallel.sync import DDPSync
from yours import main

CFG = GPTConfig(vocab_size=64, seq_len=16, n_layer=1, d_model=32, n_head=2)
STEPS, PLANT, PLANTED_IN = 6, (3, 4), "wpe.weight"
LR, WEIGHT_DECAY, MAX_NORM = 3e-3, 0.1, 0.5
SCALER = dict(init_scale=2.0 ** 12, growth_interval=3, hysteresis=2)
TOLERANCE = 1e-5


def global_batch(step, rows):
    ids = np.random.default_rng(2000 + step).integers(0, CFG.vocab_size, (rows, CFG.seq_len + 1))
    return ids[:, :-1], ids[:, 1:]


def plant_inf(comm, param, step_now):
    """A hook on ``param``: the last rank writes an inf into its gradient at the PLANT steps."""
    def hook(p):
        if comm.rank == comm.size - 1 and step_now[0] in PLANT:
            p.grad.reshape(-1)[0] = np.inf
    param.register_hook(hook)


def relative(got, want):
    got, want = to_host(got).astype(np.float64), to_host(want).astype(np.float64)
    if got.shape != want.shape:
        return np.inf
    return float(np.abs(got - want).max() / max(np.abs(want).max(), 1e-30))


def expected_traffic(comm, n_grads):
    """(bytes, messages) this rank sends for one all-reduce of n_grads fp16 numbers and one
    of two float64 ones, by the same all_reduce the learner calls."""
    comm.reset_counters()
    all_reduce(comm, to_device(np.zeros(n_grads, dtype=np.float16)))
    all_reduce(comm, to_device(np.zeros(2)))
    return comm.bytes_sent, comm.msgs_sent


def check_state(comm, step, model, masters, optimizer, oracle_sync, oracle_opt):
    """Masters, m, v by name against minipar's; the half weights = the masters rounded."""
    names = [n for n, _ in model.named_parameters()]
    theirs = {"master": oracle_sync.to_named([s.master for s in oracle_sync.slots]),
              "AdamW's m": oracle_sync.to_named(oracle_opt.m), "AdamW's v": oracle_sync.to_named(oracle_opt.v)}
    mine = {"master": {n: m.data for n, m in zip(names, masters)},
            "AdamW's m": {n: s["m"] for n, s in optimizer.state.items()},
            "AdamW's v": {n: s["v"] for n, s in optimizer.state.items()}}
    for what in theirs:
        for name in names:
            off = relative(mine[what][name], theirs[what][name])
            assert off <= TOLERANCE, (f"step {step}: {name}'s {what} differs from minipar's by {off:.1e} "
                                      f"of its largest entry")
    for name, p, m in zip(names, model.parameters(), masters):
        half = to_host(m.data).astype(np.float16)
        assert to_host(p.data).dtype == np.float16 and np.array_equal(to_host(p.data), half), (
            f"step {step}: the model's {name} is not its fp32 master rounded to fp16: publish the masters "
            "into the half weights after the update")


def check(comm, amp_step):
    p, r = comm.size, comm.rank
    assert p == 2, (f"this check runs on 2 ranks (mpiexec -n 2), not {p}: on more, an fp16 sum rounds by the "
                    "order its all-reduce adds in, and yours need not add in DDP's order")
    backend.set_default_dtype(np.float32)
    step_now = [0]
    oracle_model = GPT(CFG, seed=0)
    plant_inf(comm, dict(oracle_model.named_parameters())[PLANTED_IN], step_now)   # before DDP's hooks
    oracle_sync = DDPSync(oracle_model, comm, half_dtype=np.float16)
    oracle_opt = Optimizer(oracle_sync, lr=LR, weight_decay=WEIGHT_DECAY,
                           scaler=DynamicLossScaler(comm=comm, **SCALER))
    model = GPT(CFG, seed=0)
    plant_inf(comm, dict(model.named_parameters())[PLANTED_IN], step_now)
    amp = MixedPrecision(model, "fp16")
    optimizer = AdamW(amp.named_masters(), lr=LR, weight_decay=WEIGHT_DECAY)
    scaler = DynamicLossScaler(**SCALER)          # its rule (exercise 2), no messages of its own
    n_grads = sum(int(q.data.size) for q in model.parameters())
    want_bytes, want_msgs = expected_traffic(comm, n_grads)
    formula = 2 * (p - 1) * (2 * n_grads + 16) / p
    clipped, log = 0, []
    for step in range(STEPS):
        step_now[0] = step
        planted = f" (an inf planted in rank {p - 1}'s gradient)" if step in PLANT else ""
        where = f"step {step}{planted}"
        x, y = global_batch(step, 4 * p)
        x, y = to_device(shard_rows(x, r, p)), to_device(shard_rows(y, r, p))
        with np.errstate(over="ignore", invalid="ignore"):
            _, oracle_loss = oracle_model(x, y)
            oracle_opt.scale_loss(oracle_loss).backward()
            want_norm = oracle_opt.step(MAX_NORM)
            comm.reset_counters()
            try:
                loss, norm = amp_step(comm, model, amp.masters, optimizer, scaler, x, y, MAX_NORM)
            except NotImplementedError as err:
                wanted = (f"minipar's step: loss {oracle_loss.item():.6f}, " + (
                    f"skipped at scale {oracle_opt.last_scale:g}" if want_norm is None else
                    f"norm {want_norm:.6f}, stepped at scale {oracle_opt.last_scale:g}"))
                raise AssertionError(f"{where}: your code raised NotImplementedError ({err}); {wanted}")
        sent, msgs = comm.bytes_sent, comm.msgs_sent
        want_loss = oracle_loss.item()
        assert abs(loss - want_loss) <= TOLERANCE * abs(want_loss), (
            f"{where}: your loss {loss!r}, minipar's {want_loss!r}: the model's half weights before the step differ")
        mean_sent = to_host(comm.mpi.allreduce(np.array([sent], dtype=np.int64)))[0] / p
        assert sent == want_bytes and msgs == want_msgs, (
            f"{where}: sent {sent} bytes in {msgs} messages; one all-reduce of the {n_grads} fp16 gradients and "
            f"one of the two float64 numbers [Σg²/p, flag] send {want_bytes} bytes in {want_msgs} (on average "
            f"over the ranks 2(p-1)/p·(2N + 16) = {formula:.0f}; yours {mean_sent:.0f})")
        skipped = want_norm is None
        assert (norm is None) == skipped, (
            f"{where}: you {'stepped' if norm is not None else 'skipped'}, minipar "
            f"{'skipped: some rank found an inf or NaN' if skipped else 'stepped: every gradient was finite'}")
        assert scaler.scale == oracle_opt.loss_scale, (
            f"{where}: your loss scale after the step is {scaler.scale:g}, minipar's {oracle_opt.loss_scale:g}")
        if not skipped:
            ratio = norm / want_norm
            why = next((text for factor, text in ((p, "the sum over the ranks, not their mean"),
                                                  (oracle_opt.last_scale, "the scaled gradient, not divided by S"))
                        if abs(ratio - factor) <= 1e-3 * factor), "")
            assert abs(norm - want_norm) <= TOLERANCE * want_norm, (
                f"{where}: your gradient norm {norm!r}, minipar's {want_norm!r} (the norm of the mean gradient, "
                f"unscaled, before clipping)" + (f": yours is {ratio:g} times it, {why}" if why else ""))
            clipped += want_norm > MAX_NORM
        check_state(comm, step, model, amp.masters, optimizer, oracle_sync, oracle_opt)
        log.append(f"{step}:{'skip' if skipped else 'step'}@{oracle_opt.last_scale:g}")
    assert clipped, f"no step was clipped at max_norm {MAX_NORM}: the check needs a smaller max_norm"
    if r == 0:
        print(f"{p} ranks, {STEPS} fp16 steps (step:decision@scale used) {' '.join(log)}: your masters, AdamW "
              f"state, norms, skips and scales equal minipar's DDP step; {clipped} steps clipped; each step "
              f"sent {want_bytes} bytes in {want_msgs} messages: one all-reduce of the {n_grads} half gradients "
              f"and one of [Σg²/p, flag] (2(p-1)/p·(2N + 16) = {formula:.0f} on average)", flush=True)


if __name__ == "__main__":
    main(__doc__, check, "amp_step")
