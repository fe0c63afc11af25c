"""Lesson 17: the cells of lessons/17_memory.ipynb (``%md`` cells are markdown).

Edit here, then run ``python lessons/make_notebooks.py``."""
from launch import LAUNCH   # the cell that defines mpirun(), ENV and MINE for the lesson's runs

NOTEBOOK = "17_memory.ipynb"

CELLS = [r'''%md
# 17 · Memory at scale: nothing whole on one rank

ZeRO-3, tensor and pipeline parallelism exist for one reason: a model whose training state does not
fit on one device. Lessons 06–08 cut the *steps*; this lesson follows every byte a rank holds through
a whole run — while the model is **built**, while it **steps**, while it is **saved** and **loaded** —
because a run that builds the whole model on every rank before cutting it, or gathers it onto rank 0
to write a checkpoint, fails at the first of those moments, however well its steps are sharded.

Plan: (1) the bytes of training state and the bytes no formula names, measured per phase; (2) building
only your part — **you write** the per-name initialisation that makes it possible; (3) a checkpoint
written by every rank and read back under another layout — **you write** the slice intersection a
reshard reads. Solutions: `lessons/solutions/17_memory.py`.
''', r'''
import hashlib
import json
import os
import subprocess
import sys
import tempfile

import numpy as np

from minipar.nn import init
from minipar.parallel.tensor.sharding import Shard
''' + LAUNCH + r'''
WORK = tempfile.mkdtemp(prefix="minipar_l17_")
MiB = 2 ** 20
# one BLAS thread per rank on any machine: BLAS threads' stacks and buffers count in the RSS measured below
ONE_THREAD = {"OMP_NUM_THREADS": "1", "OPENBLAS_NUM_THREADS": "1"}


def train(ranks, *flags, name):
    """mpiexec -n RANKS python -m minipar train FLAGS; returns the run's final record."""
    log = f"{WORK}/{name}.json"
    mpirun(ranks, ["-m", "minipar", "train", "--quiet", "--log-json", log, *flags], timeout=600, env=ONE_THREAD)
    return [json.loads(line) for line in open(log)][-1]["final"]
''', r'''%md
## 1. Where the bytes are

Per parameter, an fp32 run with Adam holds 4 bytes of weight, 4 of gradient and 8 of moments: **16
bytes**. Mixed precision keeps the same 16 (2 half weight + 2 half gradient + 4 fp32 master + 8 of
moments; the ZeRO paper's $16\Psi$). ZeRO-3 over $p$ ranks holds $16\Psi/p$ of it; tensor parallelism
over $t$ holds $16\Psi/t$ of the matrices and all of the small vectors; a pipeline stage holds its layers.

That is the state. The operating system counts more: the interpreter and its libraries (the
**runtime floor**, measured by minipar as the peak of a run too small to matter), MPI's buffers, the
activations of a step, NumPy's temporaries, and whatever a phase briefly holds whole. The run's log
gives, per rank, the process's peak resident memory in each phase (`minipar/observe/procmem.py`: Linux's `VmHWM`, reset
when a phase starts). Three layouts of the same 6.4M-parameter model (`--model medium`, 100 MB of fp32
state), one step and one save each:
''', r'''
LAYOUTS = {"1 process": (1, []), "dp2 ZeRO-3": (2, ["--zero", 3]), "tp2": (2, ["--tp", 2])}
corpus = f"{WORK}/corpus.txt"             # a small corpus, so the model's bytes stand out
with open(corpus, "w") as f:
    f.write(open(os.path.join(ROOT, "minipar", "nn", "gpt.py")).read() * 20)
common = ["--model", "medium", "--seq-len", 64, "--batch-size", 4, "--steps", 1, "--eval-batches", 0,
          "--data", corpus]
finals = {}
for name, (ranks, flags) in LAYOUTS.items():
    finals[name] = train(ranks, *common, *flags, "--save", f"{WORK}/ck-{name[:3]}", name=name.replace(" ", "_"))

print(f"{'layout':>11} {'floor':>7} {'construction':>13} {'steps':>7} {'save':>7} {'model needs':>12}   MiB, rank 0")
for name, f in finals.items():
    pm = f["process_memory"]
    phase = {k: v["rss"][0] / MiB for k, v in pm["phases"].items()}
    print(f"{name:>11} {pm['floor_bytes_per_rank'][0] / MiB:7.0f} {phase['construction']:13.0f} "
          f"{phase['steps']:7.0f} {phase['save']:7.0f} {pm['predicted_bytes_per_rank'][0] / MiB:12.0f}")
''', r'''%md
Read the table by differences, against the 100 MB of state. *Construction minus floor* is what
building cost: the single process's weights, the code it loaded to build them, the corpus; a rank
that drew the whole model and then cut it would show the single process's figure in every row,
and here each rank draws one tensor at a time and keeps its part. *Steps minus construction* is
gradients, Adam's moments (made at the first step), activations and the step's temporaries.
*Save* is the checkpoint: a rank that writes only what it owns pays little more than its step,
while a checkpoint gathered onto one rank costs that rank the whole model again. The last column is
the memory model's prediction (`train/fits.py`: floor + corpus + this rank's state + activations +
buffers + workspace — the one model the summary, `profile` and `plan` use), which `train`
checks against the machine's memory before the first step, refusing in one line when it will not fit;
the gap between it and the measured peak is what no formula names (NumPy's temporaries, the allocator's
free lists) — on a GPU, where the caching allocator keeps freed blocks, that gap is fragmentation.

## 2. Building only your part

A model drawn from one random generator in construction order gets weights that depend on the
order. A pipeline stage that skips the layers of other stages would draw different numbers, and a
tensor-parallel rank that builds only its slice would too: no layout would start from the single
process's weights, and parity — the oracle of every earlier lesson — would be lost. The fix is to
give each parameter **a generator of its own**, keyed by the run's seed and its global name:

$$\text{key}(s, \text{name}) = \big(s,\ w_0, w_1, w_2, w_3\big),\qquad w_i = \text{the $i$-th little-endian 32-bit word of } \mathrm{sha256}(\text{name})$$

$$W_\text{name} = \mathcal N(0, \sigma^2) \text{ drawn by } \texttt{Generator(PCG64(SeedSequence(key)))} \text{ in the global shape}$$

(sha256, not Python's `hash()`: that one is salted per process.) A rank draws one full tensor, keeps its
slice, drops the rest: one full tensor on the host at a time, never the model.

**Exercise — per-name initialisation.** Write `my_initial_value(seed, name, shape, std)` returning the
full float64 array. It is checked against minipar's `init.initial_value` for every parameter name of a
GPT, and then used to build a tensor-parallel rank's slice on its own.
''', r'''%exercise initial_value
def my_initial_value(seed, name, shape, std):
    raise NotImplementedError("hint: the key is the seed followed by four words of the name's digest; "
                              "a NumPy Generator built from that key draws the normal values")
''', r'''
from minipar.nn.gpt import GPT, config_from_preset

names = [n for n, _ in GPT(config_from_preset("tiny"), materialize=False).named_parameters()]
for seed in (0, 1234):
    for name in names:
        want = init.initial_value(seed, name, (3, 5), init.Normal(0.02))
        got = np.asarray(my_initial_value(seed, name, (3, 5), 0.02))
        if got.shape != want.shape:
            raise AssertionError(f"{name}: shape {got.shape}, expected {want.shape}")
        if not np.array_equal(got, want):
            same = np.isclose(got, want).mean()
            raise AssertionError(f"{name} (seed {seed}): values differ ({same:.0%} equal) — "
                                 "check the key's word order and byte order, and the generator")
print(f"correct for {len(names)} names and two seeds")

# A tp rank builds its slice alone, the single process builds the whole: the same numbers.
shape, shard = (64, 192), Shard(axis=1, groups=3)        # the qkv weight of d=64, cut by heads
whole = my_initial_value(7, "blocks.0.attn.qkv.weight", shape, 0.02)
pieces = [shard.local(my_initial_value(7, "blocks.0.attn.qkv.weight", shape, 0.02), r, 2, module=np)
          for r in range(2)]
assert np.array_equal(np.concatenate([p.reshape(64, 3, 32) for p in pieces], axis=2).reshape(shape), whole)
print("two tp ranks, each drawing alone, hold exactly the single process's qkv weight")
''', r'''%md
The price: every tp rank draws the whole tensor to keep $1/t$ of it ($t\times$ the random numbers), for
exact parity with no stream that depends on the layout. Megatron draws each rank's slice from its own
stream instead (cheaper, but the weights then depend on $t$); PyTorch builds on the `meta` device —
shapes, no bytes — and fills each shard afterwards, like minipar's placeholders (`init.placeholder`).

## 3. A checkpoint every rank writes, read under another layout

Gathering the model onto rank 0 to write it costs rank 0 the whole model and the run the slowest
single writer. Instead every rank writes **what it owns**, and one small index says, for every tensor,
its global shape and which **box** of it (an offset and a length per dimension) each file holds.
Loading under another layout is then a question about boxes: for the box this rank needs, which saved
boxes overlap it, and where? Each overlap is read straight from its file (a memory map reads only
those pages) into its place; nothing is gathered, and a rank reads exactly the bytes it will hold.

A box is `(offsets, lengths)`, as minipar's placements write them (`Placement.boxes()`).

**Exercise — the slice intersection of a reshard.** Write `my_intersect(a, b)`, the box common to two
boxes (or `None`), and `my_read(pieces, want)`: `pieces` is a list of `(box, array)` as saved, `want`
the box to assemble; return the array of `want`'s shape, every element copied from the piece that
holds it, and raise an error if some element of `want` is in no piece.
''', r'''%exercise reshard
%%writefile {MINE}/reshard.py
"""Your reshard read (lesson 17): checked in the notebook and by 17_yours.py under mpiexec."""
import numpy as np


def my_intersect(a, b):
    # hint: in each dimension the overlap of two intervals starts at the later start and
    # ends at the earlier end; empty in any dimension means none
    return None


def my_read(pieces, want):
    # hint: for each piece that overlaps, the overlap sits at one offset inside the piece
    # and another inside the result; count what you fill
    return np.zeros(want[1])
''', r'''
sys.path.insert(0, MINE)
import importlib
import reshard as yours
importlib.reload(yours)
my_intersect, my_read = yours.my_intersect, yours.my_read


def cut(full, axis, parts):
    """Boxes and arrays of `full` split along `axis` into `parts` (np.array_split's rule)."""
    edges = np.cumsum([0] + [len(c) for c in np.array_split(np.arange(full.shape[axis]), parts)])
    out = []
    for lo, hi in zip(edges[:-1], edges[1:]):
        offsets = [0] * full.ndim; lengths = list(full.shape)
        offsets[axis], lengths[axis] = int(lo), int(hi - lo)
        index = tuple(slice(o, o + n) for o, n in zip(offsets, lengths))
        out.append(((tuple(offsets), tuple(lengths)), full[index]))
    return out


if my_intersect(((0, 0), (4, 4)), ((2, 6), (4, 4))) is not None:
    raise AssertionError("boxes at (0, 0) and (2, 6), both 4 x 4, do not overlap: expected None")
rng = np.random.default_rng(0)
for trial in range(300):
    full = rng.standard_normal(tuple(int(n) for n in rng.integers(1, 9, size=int(rng.integers(1, 4)))))
    saved = cut(full, int(rng.integers(full.ndim)), int(rng.integers(1, 5)))     # layout A
    for box, _ in cut(full, int(rng.integers(full.ndim)), int(rng.integers(1, 5))):   # layout B
        got = np.asarray(my_read(saved, box))
        index = tuple(slice(o, o + n) for o, n in zip(*box))
        if got.shape != full[index].shape:
            raise AssertionError(f"trial {trial}: the box at offsets {box[0]}, lengths {box[1]} came back "
                                 f"with shape {got.shape}")
        if not np.array_equal(got, full[index]):
            wrong = np.argwhere(got != full[index])
            first = tuple(int(i) for i in wrong[0] + np.array(box[0]))
            holder = next(j for j, (b, _) in enumerate(saved)
                          if all(o <= i < o + n for i, o, n in zip(first, *b)))
            raise AssertionError(f"trial {trial}: reading the box at offsets {box[0]}, lengths {box[1]} of a "
                                 f"{full.shape} tensor saved in {len(saved)} pieces, {len(wrong)} of "
                                 f"{got.size} elements are wrong; the first, global index {first}, "
                                 f"is in saved piece {holder} (offsets {saved[holder][0][0]})")
try:
    my_read(saved[1:], ((0,) * full.ndim, full.shape))
except Exception:
    pass
else:
    raise AssertionError(f"the whole {full.shape} tensor was read from {len(saved) - 1} of its "
                         f"{len(saved)} pieces without an error: its first piece is missing")
print("correct: 300 random reshards, and a missing piece is refused")
''', r'''%md
Under ZeRO-3 a rank's bytes are a flat range of the (tp piece of the) tensor rather than a box; minipar's
checkpoint cuts each such range into the few boxes it covers (`checkpoint/boxes.py: flat_to_boxes` — a
partial first row, whole rows, a partial last row), so the index holds boxes only and one read serves every
layout. Part 1 saved a checkpoint under dp2 ZeRO-3. Below, 2 ranks play a tensor-parallel layout: each wants
the r-th slice of every tensor's last axis and reads it **with your `my_read`**, from the saved pieces as
memory-mapped views of the rank files — only the overlapping bytes are touched, nothing is gathered. Each
slice is checked against the library's read, and one all-reduce checks that the ranks read every element
exactly once.
''', r'''
print(mpirun(2, ["17_yours.py", "--file", f"{MINE}/reshard.py", "--checkpoint", f"{WORK}/ck-dp2"]).stdout)
print(subprocess.run([sys.executable, "-m", "minipar", "checkpoint", "inspect", f"{WORK}/ck-dp2"], cwd=ROOT,
                     env=ENV, capture_output=True, text=True).stdout[-1500:])
''', r'''%md
The library does the same for every tensor and every layout (dp, ZeRO stage, tp, sp, pp, chunks, cp, world
size); the test suite resumes runs saved under one layout in several others and checks the loss curve
against the uninterrupted single process.

## What changes on GPU nodes and at scale

- The runtime floor on a GPU is the CUDA context (~0.5 GB per device) plus NCCL's buffers; the state
  lives in device memory, and `procmem` reports the CuPy pool's high-water mark and the device's used
  memory beside the host's RSS.
- At 100B parameters the state is 1.6 TB: 64 H100s under ZeRO-3 hold 25 GB each before activations.
  A checkpoint of that size written by one rank at 2 GB/s takes over 13 minutes; written by every rank
  in parallel it is limited by the file system, and an **asynchronous** save (copy to host memory, write
  in a background thread while training continues) hides most of it — PyTorch DCP's `async_save`,
  Megatron's `dist_checkpointing` (`--async-save`), DeepSpeed's Nebula and FastPersist do this.
  DeepSpeed's *universal checkpoints* answer the other question of §3: an offline conversion of a
  ZeRO/TP/PP checkpoint into a form that another layout loads.
- Names you will meet: PyTorch's `torch.device("meta")` and `DTensor`, `torch.distributed.checkpoint`
  (a `.metadata` index and one file per rank), Megatron's `ShardedTensor`, DeepSpeed's `zero.Init`.
''']
