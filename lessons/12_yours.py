"""Lesson 12's capstone on every rank: your pieces composed into one 3D training step.

    mpiexec -n 8 python lessons/12_yours.py --file MINE/step3d.py [--layout dp2-tp2-pp2]

Both layouts in one launch unless ``--layout`` names one.  The pieces of the earlier
lessons are read from the folder of ``--file`` (the course folder); a missing one is
named in one line before any message.

``step3d.py`` (the exercise) defines

- ``wire(grid, module, bucket_bytes)``: once per run, your DDP (lesson 05) over the
  ranks that hold the same weights and see different data; returns it;
- ``gradients_3d(grid, ddp, stage, actions, held, sequence_parallel)``: one step's
  forward and backward through your 1F1B executor (lesson 08), your DDP's finish and
  the tensor-parallel rule; afterwards each held parameter's ``.grad`` is this rank's
  piece of the gradient of the global batch's mean loss;
- ``norm_and_overflow(grid, held)``: (‖g‖ of the whole model, whether any rank's
  gradient holds inf or NaN), agreed by every rank.

The other pieces are plugged in by this script: your f and g, sequence parallelism's
all-gather and reduce-scatter and the vocabulary-parallel cross-entropy (lesson 07's
``my_regions.py`` and ``my_sequence_parallel.py``) replace the library's in its
tensor-parallel layers and loss, your ring attention (lesson 16's ``ring.py``) its
attention cores under context parallelism.
The model is a tiny GPT (2 blocks, d = 16, 4 heads, 16 tokens), global batch 8 rows in
4 micro-batches, float64, 3 AdamW steps with clipping; beside it the library's own
training step of the same layout (``parallelize`` + ``build_optimizer`` +
``train_step``, what ``minipar train`` runs) and one process on the whole batch.
Every step it checks, naming the rank, step, parameter and rule when one fails:

- the pipeline ran all 4 micro-batches' forwards and backwards on this stage;
- every gradient equals one process's (its tp piece; relative 1e-10), else which rule
  would make it so: the mean over dp × cp, the sum over tp of a replicated weight's
  sequence-parallel parts, no sum where a replicated weight's gradient is whole;
- the norm equals one process's (relative 1e-10), else which count is off: a weight
  replicated over tp counted tp times, a replica's gradient counted dp × cp times;
- the step's loss equals the library's (relative 1e-9; from the second step on it carries
  the earlier updates, which the check makes with your norm): rank 0 prints both, and
  the bytes each sent over dp × cp for the gradients (lesson 05's DDP, which knows no
  pipeline, all-reduces at every micro-batch's backward; the library's synchroniser once,
  after the last).

Then, on its own, the found-inf rule in float16: the gradients cast to fp16, the
norm's float64 sum; then one rank's gradient overflowing (an inf in one element) must
make every rank's ``norm_and_overflow`` say so, through one all-reduce over every rank
([Σ w·g² / copies, flag]): no more messages than one all-reduce of 2 numbers sends.
"""
import os
import sys
import types
from contextlib import contextmanager
from dataclasses import dataclass

try:
    import minipar  # noqa: F401
except ImportError:  # run from a checkout without installing: use the repository root
    sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

import numpy as np

from minipar import backend
from minipar.autograd import Function, Tensor
from minipar.autograd.ops import raw
from minipar.backend import to_device, to_host, xp
from minipar.comm import all_reduce
from minipar.data import shard_rows
from minipar.nn import GPT
from minipar.optim import adamw_update
from yours import main

LAYOUTS = {"dp2-tp2-pp2": dict(dp=2, tp=2, pp=2, cp=1, sequence_parallel=False),
           "cp2-tp2-pp2": dict(dp=1, tp=2, pp=2, cp=2, sequence_parallel=True)}
MODEL = dict(model="tiny", n_layer=2, d_model=16, n_head=4, seq_len=16, vocab_size=64)
ROWS, MICRO, STEPS, LR, CLIP, BUCKET_BYTES = 8, 4, 3, 3e-3, 0.05, 16 * 1024
OVERFLOWING_RANK = 5
# what each piece is, the lesson that writes it, and the exercise cell that saves it
PIECES = {"ddp.py": "lesson 05's exercise cell (my_ddp)",
          "my_regions.py": "lesson 07's exercise cell (megatron_f_g)",
          "my_sequence_parallel.py": "lesson 07's exercise cell (sequence_parallel)",
          "stage.py": "lesson 08's exercise cell (stage_executor)",
          "ring.py": "lesson 16's exercise cell (ring_loop)"}


def missing_piece(folder):
    """One line naming the first of your earlier pieces that ``folder`` lacks, else None."""
    for name, cell in PIECES.items():
        if not os.path.exists(os.path.join(folder, name)):
            return f"no {name} in {folder}: run {cell} first"
    return None


@dataclass
class Held:
    """One parameter this rank holds: its name in the whole model, the Parameter (its
    ``.grad``), and whether every tp rank holds all of it (LayerNorms, biases after a
    row-parallel layer, positions) or only its slice."""
    name: str
    param: object
    replicated_over_tp: bool


def global_batch(step, cfg):
    """The step's (inputs, targets): ROWS random sequences, the same on every rank."""
    ids = np.random.default_rng(1200 + step).integers(0, cfg.vocab_size, (ROWS, cfg.seq_len + 1))
    return ids[:, :-1], ids[:, 1:]


class ModelStage:
    """This rank's pipeline stage of the tensor-parallel model, in lesson 08's interface:
    ``first``, ``last``, ``shape`` (what stages exchange), ``input(i)``,
    ``forward(x, i) -> (y, saved)``, ``loss(i, y) -> dL/dy``, ``backward(saved, dy, i) -> dL/dx``."""

    def __init__(self, module, x, y, shape):
        self.stage = module.stages[0]
        self.loss_fn = self.stage.model.loss
        self.first, self.last, self.shape = self.stage.is_first, self.stage.is_last, shape
        self.x, self.y, self.rows = x, y, x.shape[0] // MICRO
        self.outputs, self.losses, self.ran = {}, {}, {"F": 0, "B": 0}

    def _rows(self, array, i):
        return array[i * self.rows:(i + 1) * self.rows]

    def input(self, i):
        return to_device(self._rows(self.x, i))

    def forward(self, x, i):
        inp = x if self.first else Tensor(x, requires_grad=True)
        out = self.stage(inp)
        self.outputs[i] = out
        self.ran["F"] += 1
        return xp.ascontiguousarray(out.data), (inp, out)   # what your executor sends

    def loss(self, i, y):
        logits = Tensor(self.outputs[i].data, requires_grad=True)
        loss = self.loss_fn(logits, to_device(self._rows(self.y, i))) * (1.0 / MICRO)
        loss.backward()
        self.losses[i] = loss.item()
        return logits.grad

    def backward(self, saved, dy, i):
        inp, out = saved
        out.backward(dy)
        self.outputs.pop(i, None)
        self.ran["B"] += 1
        return None if self.first else xp.ascontiguousarray(inp.grad)


def your_tp_functions(lesson07):
    """{(module, name): yours}: the functions of the library's tensor-parallel layers
    (``layers``) and model (``model``) that your pieces of lesson 07 (``lesson07``, their classes) replace."""
    f = lambda x, comm: lesson07.MyCopyToTP.apply(x, comm=comm)                    # noqa: E731
    g = lambda x, comm: lesson07.MyReduceFromTP.apply(x, comm=comm)                # noqa: E731
    gather = lambda x, comm: lesson07.MyGatherFromSequence.apply(x, comm=comm)     # noqa: E731
    scatter = lambda x, comm: lesson07.MyReduceScatterToSequence.apply(x, comm=comm)   # noqa: E731

    def cross_entropy(logits, targets, comm, vocab_start, vocab_size=None):
        return lesson07.MyVocabParallelCrossEntropy.apply(logits, to_device(raw(targets)), comm=comm,
                                                      vocab_start=vocab_start)
    return {("layers", "copy_to_tp_region"): f, ("model", "copy_to_tp_region"): f,
            ("layers", "reduce_from_tp_region"): g,
            ("layers", "gather_from_sequence_region"): gather, ("model", "gather_from_sequence_region"): gather,
            ("layers", "reduce_scatter_to_sequence_region"): scatter,
            ("model", "vocab_parallel_cross_entropy"): cross_entropy}


@contextmanager
def your_tensor_parallel(lesson07):
    """Meanwhile the library's tensor-parallel layers and loss call your pieces of lesson
    07: f and g, the sequence's all-gather and reduce-scatter, the vocabulary-parallel
    cross-entropy."""
    from minipar.parallel.tensor import layers, model
    modules = {"layers": layers, "model": model}
    yours = your_tp_functions(lesson07)
    saved = {key: getattr(modules[key[0]], key[1]) for key in yours}
    for (module, name), function in yours.items():
        setattr(modules[module], name, function)
    try:
        yield
    finally:
        for (module, name), function in saved.items():
            setattr(modules[module], name, function)


def your_ring_cores(model, ring_attention):
    """Every attention core becomes ring attention whose forward is yours (lesson 16);
    its backward is the library's, from your output and log-sum-exp."""
    from minipar.nn.module import Module
    from minipar.parallel.context.ring import RingAttention

    class YourRing(Function):
        @staticmethod
        def forward(ctx, q, k, v, core):
            q, k, v = (xp.ascontiguousarray(a) for a in (q, k, v))   # as lesson 16 gave them
            out, lse = ring_attention(core.comm, q, k, v)
            ctx.save_for_backward(q, k, v, out, lse)
            ctx.core = core
            return out

        backward = RingAttention.backward

    class YourRingCore(Module):
        def __init__(self, core):     # zigzag False: your ring's rank r holds block r of the sequence
            self.comm, self.kind, self.zigzag, self.implementation = (
                core.comm, core.kind, False, core.implementation)

        def forward(self, q, k, v):
            return YourRing.apply(q, k, v, self)

    for block in model.blocks:
        block.attn.core = YourRingCore(block.attn.core)


def build_yours(config, grid, cfg, ring_file):
    """Your side: the tensor-parallel model (where your lesson 07 pieces go), your ring attention
    under cp, this rank's stage; returns (its module, the tensor-parallel model, the
    held parameters, the placements that cut one process's tensors to this rank's piece)."""
    from minipar.parallel.context import apply_context_parallel
    from minipar.parallel.pipeline.stage import RankStages
    from minipar.parallel.placement import tp_placements
    from minipar.parallel.tensor import to_tensor_parallel
    from yours import load
    model = GPT(cfg, seed=0)
    shapes = {n: tuple(p.shape) for n, p in model.named_parameters()}
    tp_model = to_tensor_parallel(model, grid, config.sequence_parallel)
    if grid.cp > 1:
        apply_context_parallel(tp_model, grid.cp_comm, zigzag=False)
        your_ring_cores(tp_model, load(ring_file, "ring_attention"))
    module = RankStages(tp_model, grid.coords.pp, grid.pp, 1)
    table = tp_placements(shapes, tp_model, grid.tp_comm, config.sequence_parallel, module)
    held = [Held(n, p, table[n].tp is None) for n, p in module.named_parameters()]
    return module, tp_model, held, table


def build_library(config, cfg, world):
    """The library's training step of the same layout, on a grid of its own."""
    from minipar.parallel.grid import ProcessGrid
    from minipar.parallel.parallelize import build_optimizer, parallelize
    grid = ProcessGrid(world, dp=config.dp, tp=config.tp, pp=config.pp, cp=config.cp)
    parallel = parallelize(GPT(cfg, seed=0), config, grid)
    return grid, parallel, build_optimizer(parallel, config, grid)


class OneProcess:
    """The whole model on the whole batch, with the same clipped AdamW: the gradients
    and norm every rank's pieces must equal."""

    def __init__(self, cfg):
        self.model = GPT(cfg, seed=0)
        self.params = dict(self.model.named_parameters())
        self.m = {n: xp.zeros_like(p.data) for n, p in self.params.items()}
        self.v = {n: xp.zeros_like(p.data) for n, p in self.params.items()}

    def gradients(self, x, y):
        for p in self.params.values():
            p.grad = None
        _, loss = self.model(to_device(x), to_device(y))
        loss.backward()
        grads = {n: to_host(p.grad) for n, p in self.params.items()}
        return grads, float(np.sqrt(sum(np.sum(g * g) for g in grads.values())))

    def update(self, norm, step):
        clip_and_update(((p.data, p.grad, self.m[n], self.v[n]) for n, p in self.params.items()),
                        norm, step)


def clip_and_update(slots, norm, step):
    """The library's update (``parallel/step.py``): g *= CLIP/‖g‖ when ‖g‖ > CLIP, AdamW."""
    clip = CLIP / (norm + 1e-6) if norm > CLIP else 1.0
    for w, g, m, v in slots:
        adamw_update(w, g * clip, m, v, step, LR, 0.9, 0.95, 1e-8, 0.0)


def close(a, b, rtol=1e-10):
    return a.shape == b.shape and np.abs(a - b).max() <= rtol * max(np.abs(b).max(), 1e-300)


def check_gradients(grid, held, table, want, where, sequence_parallel):
    """Each held gradient against one process's piece; when it differs, which rule would
    have made it equal (the collectives below run on every rank, before any verdict)."""
    for h in held:
        if h.param.grad is None:
            raise AssertionError(f"{where}: {h.name} has no gradient after gradients_3d")
    grads = [to_host(h.param.grad).astype(np.float64) for h in held]
    flat = np.concatenate([g.reshape(-1) for g in grads])
    ends = np.cumsum([g.size for g in grads])[:-1]

    def over(comm, scale):
        summed = to_host(all_reduce(comm, to_device(flat.copy()))) * scale
        return [part.reshape(g.shape) for part, g in zip(np.split(summed, ends), grads)]
    mean_dp_cp, sum_tp = over(grid.dp_cp_comm, 1.0 / grid.dp_cp_comm.size), over(grid.tp_comm, 1.0)
    n_data = grid.dp * grid.cp
    for h, got, avg, summed in zip(held, grads, mean_dp_cp, sum_tp):
        ref = table[h.name].piece(want[h.name])
        if close(got, ref):
            continue
        kind = ("replicated over tp" if h.replicated_over_tp else "split over tp") + (
            ", sequence-parallel" if sequence_parallel else "")
        if h.replicated_over_tp and sequence_parallel and close(summed, ref):
            why = ("it is this tp rank's positions' part only: under sequence parallelism a weight "
                   "replicated over tp sees only its rank's tokens (rule 2: the sum over the tp ranks)")
        elif h.replicated_over_tp and not sequence_parallel and close(got, grid.tp * ref):
            why = (f"it is {grid.tp}x one process's: without sequence parallelism a replicated weight "
                   f"sees every position, its gradient is whole on each tp rank (rule 2 is for "
                   f"sequence parallelism only)")
        elif close(avg, ref):
            why = (f"it is this rank's share only (its rows and positions): rule 1, the mean over the "
                   f"dp x cp = {n_data} ranks that hold this weight and see other data")
        elif n_data > 1 and close(got, n_data * ref):
            why = f"it is {n_data}x one process's: a sum over dp x cp, where rule 1 takes the mean"
        else:
            why = (f"it differs by {np.abs(got - ref).max() / np.abs(ref).max():.1e} relative, which no "
                   f"missing rule explains: look at the pieces (lesson 07's, the executor, the ring)")
        raise AssertionError(f"{where}, {h.name} ({kind}): your gradient is not one process's: {why}")


def check_norm(grid, held, norm, want, where):
    """Your norm against one process's; when it differs, which count is off: the squares
    of the replicated and of the split weights, summed over every rank, tell (the
    all-reduce runs on every rank, before the verdict)."""
    squares = [sum(float(np.sum(to_host(h.param.grad) ** 2)) for h in held if h.replicated_over_tp == r)
               for r in (True, False)]
    replicated, split = to_host(all_reduce(grid.world, to_device(np.array(squares)))) / (grid.dp * grid.cp)
    if abs(norm - want) <= 1e-10 * want:
        return
    miscounts = {"rule 3: a weight replicated over tp counted tp times, not once (w = 1/tp)":
                 split + replicated,
                 f"rule 3: each replica's copy counted, dp x cp = {grid.dp * grid.cp} times, not once "
                 "(divide by the copies)": grid.dp * grid.cp * (split + replicated / grid.tp)}
    why = next((k for k, sq in miscounts.items() if abs(norm - np.sqrt(sq)) <= 1e-9 * want),
               "none of the usual miscounts (w = 1/tp, copies = dp x cp)")
    raise AssertionError(f"{where}: your norm {norm!r}, one process's {want!r}: {why}")


def check_found_inf(grid, held, norm_and_overflow):
    """fp16, on its own: the norm of fp16 gradients summed in float64, and one rank's
    overflow agreed by every rank in one all-reduce."""
    from minipar.parallel.norm import GlobalNorm, sum_of_squares
    half = [Held(h.name, types.SimpleNamespace(grad=h.param.grad.astype(xp.float16)), h.replicated_over_tp)
            for h in held]
    groups = GlobalNorm([grid.tp_comm, grid.pp_comm], world=grid.world)
    local = sum(sum_of_squares(h.param.grad, 1.0 / grid.tp if h.replicated_over_tp else 1.0) for h in half)
    want = float(np.sqrt(to_host(groups.summed_with_flag(local, xp.zeros(1)))[0]))
    norm, overflow = norm_and_overflow(grid, half)
    assert not overflow, "fp16 gradients, all finite: your norm_and_overflow says overflow"
    assert abs(norm - want) <= 1e-9 * want, (
        f"fp16 gradients: your norm {norm!r}, the library's summed in float64 {want!r}: square and sum "
        f"in float64 (fp16 squares of small gradients underflow, of large ones overflow)")
    comms = {"world": grid.world, "tp": grid.tp_comm, "cp": grid.cp_comm, "dp": grid.dp_comm,
             "pp": grid.pp_comm}
    for c in comms.values():
        c.reset_counters()
    all_reduce(grid.world, xp.zeros(2))                # what one all-reduce of 2 numbers sends
    one = grid.world.msgs_sent
    for c in comms.values():
        c.reset_counters()
    if grid.rank == OVERFLOWING_RANK:
        half[0].param.grad = half[0].param.grad.copy()
        half[0].param.grad.reshape(-1)[0] = xp.inf
    norm, overflow = norm_and_overflow(grid, half)
    sent = {k: c.msgs_sent for k, c in comms.items() if c.msgs_sent}
    assert overflow, (f"rank {OVERFLOWING_RANK}'s gradient holds an inf, and your norm_and_overflow "
                      f"says no overflow here: every rank must skip the step (rule 4)")
    assert sum(sent.values()) <= one, (
        f"your norm_and_overflow sent {sum(sent.values())} messages ("
        + ", ".join(f"{n} on {k}" for k, n in sent.items()) + f"); one all-reduce of "
        f"[Σ w·g²/copies, flag] over every rank sends {one} from this rank (rule 4: one collective)")
    return want


def train_layout(comm, layout, wire, gradients_3d, norm_and_overflow, folder):
    """STEPS steps of your composition beside the library's and one process's, checked
    step by step; then the found-inf rule in fp16."""
    from minipar.config import TrainConfig
    from minipar.parallel.grid import ProcessGrid
    from minipar.parallel.pipeline import build_schedule
    from minipar.train.steps import global_loss, train_step
    from yours import load
    shape = LAYOUTS[layout]
    config = TrainConfig(**MODEL, **shape, precision="fp64", batch_size=ROWS, microbatches=MICRO,
                         schedule="1f1b", cp_split="contiguous" if shape["cp"] > 1 else "zigzag",
                         lr=LR, weight_decay=0.0, grad_clip=CLIP, seed=0).resolve(comm.size)
    cfg = config.model_config()
    grid = ProcessGrid(comm, dp=config.dp, tp=config.tp, pp=config.pp, cp=config.cp)
    lesson07 = types.SimpleNamespace(**{name: load(os.path.join(folder, file), name) for file, names in (
        ("my_regions.py", ("MyCopyToTP", "MyReduceFromTP")),
        ("my_sequence_parallel.py", ("MyGatherFromSequence", "MyReduceScatterToSequence",
                                     "MyVocabParallelCrossEntropy"))) for name in names})
    module, tp_model, held, table = build_yours(config, grid, cfg, os.path.join(folder, "ring.py"))
    ddp = wire(grid, module, BUCKET_BYTES)
    lib_grid, parallel, optimizer = build_library(config, cfg, comm)
    one = OneProcess(cfg)
    actions = list(build_schedule("1f1b", grid.pp, MICRO)[grid.coords.pp])
    positions = getattr(tp_model, "token_positions", None)
    n_tokens = cfg.seq_len // grid.cp // (grid.tp if config.sequence_parallel else 1)
    m = {h.name: xp.zeros_like(h.param.data) for h in held}
    v = {h.name: xp.zeros_like(h.param.data) for h in held}
    for step in range(STEPS):
        x, y = global_batch(step, cfg)
        xr, yr = shard_rows(x, grid.coords.dp, grid.dp), shard_rows(y, grid.coords.dp, grid.dp)
        if positions is not None:
            xr, yr = xr[:, positions], yr[:, positions]
        stage = ModelStage(module, xr, yr, (ROWS // grid.dp // MICRO, n_tokens, cfg.d_model))
        for h in held:
            h.param.grad = None
        grid.dp_cp_comm.reset_counters()
        with your_tensor_parallel(lesson07):
            gradients_3d(grid, ddp, stage, actions, held, config.sequence_parallel)
        dp_bytes = grid.dp_cp_comm.bytes_sent
        assert stage.ran == {"F": MICRO, "B": MICRO}, (
            f"{layout}, step {step}: stage {grid.coords.pp} ran {stage.ran['F']} of {MICRO} forwards "
            f"and {stage.ran['B']} of {MICRO} backwards: the micro-batches go through your 1F1B "
            f"executor (stage.py, lesson 08) over the pipeline's group")
        want, want_norm = one.gradients(x, y)
        check_gradients(grid, held, table, want, f"{layout}, step {step}", config.sequence_parallel)
        norm, overflow = norm_and_overflow(grid, held)
        assert not overflow, (f"{layout}, step {step}: every gradient is finite, and your "
                              f"norm_and_overflow says overflow")
        check_norm(grid, held, norm, want_norm, f"{layout}, step {step}")
        clip_and_update(((h.param.data, h.param.grad, m[h.name], v[h.name]) for h in held), norm, step + 1)
        one.update(want_norm, step + 1)
        your_loss = global_loss(grid, sum(stage.losses.values()) if stage.last else 0.0)
        rows = [parallel.local_tokens(shard_rows(a, lib_grid.coords.dp, lib_grid.dp)) for a in (x, y)]
        lib_grid.dp_cp_comm.reset_counters()
        library_step = train_step(parallel, optimizer, *rows, grad_clip=CLIP)
        lib_dp_bytes = lib_grid.dp_cp_comm.bytes_sent      # its gradient sync
        lib = global_loss(lib_grid, library_step.local_loss)
        assert abs(your_loss - lib) <= 1e-9 * abs(lib), (
            f"{layout}, step {step}: your loss {your_loss!r}, the library's {lib!r}")
        if comm.rank == 0:
            print(f"{layout} step {step}: loss yours {your_loss:.15f}, library's {lib:.15f} (|diff| "
                  f"{abs(your_loss - lib):.1e}); norm = one process's; rank 0 sent over dp x cp {dp_bytes} "
                  f"bytes, the library {lib_dp_bytes}", flush=True)
    fp16_norm = check_found_inf(grid, held, norm_and_overflow)
    if comm.rank == 0:
        print(f"{layout} fp16: norm {fp16_norm:.6f} summed in float64; rank {OVERFLOWING_RANK}'s inf "
              f"made every rank skip, in one all-reduce over the {comm.size} ranks", flush=True)


def check(comm, wire, layout):
    backend.set_default_dtype(np.float64)
    folder = os.path.dirname(os.path.abspath(wire.__globals__["__file__"]))
    functions = [wire.__globals__.get(name) for name in ("gradients_3d", "norm_and_overflow")]
    for name, function in zip(("gradients_3d", "norm_and_overflow"), functions):
        if function is None:
            raise AssertionError(f"step3d.py defines no {name}: keep the names the exercise gives")
    for name in (LAYOUTS if layout in (None, "all") else [layout]):     # refusal() checked it
        train_layout(comm, name, wire, *functions, folder)


def refusal(argv):
    """One line for what cannot run, said before any message: a layout not known, or a
    piece of an earlier lesson missing beside ``--file``; None when all is there."""
    layout = argv[argv.index("--layout") + 1] if "--layout" in argv[:-1] else "all"
    if layout not in ("all", *LAYOUTS):
        return f"--layout {layout}: choose one of {', '.join(LAYOUTS)}, or all"
    if "--file" in argv[:-1]:
        return missing_piece(os.path.dirname(os.path.abspath(argv[argv.index("--file") + 1])))
    return None


if __name__ == "__main__":
    if (refused := refusal(sys.argv)) is not None:
        if os.environ.get("PMI_RANK", "0") == "0":      # one line, not one per rank
            print(refused, file=sys.stderr, flush=True)
        sys.exit(1)
    main(__doc__, check, "wire",
         ("--layout", f"one of {', '.join(LAYOUTS)}, or all (the default) (optional)"))
