"""Lesson 19: the cells of lessons/19_decoder.ipynb (``%md`` cells are markdown).

Edit here, then run ``python lessons/make_notebooks.py``."""
from launch import LAUNCH   # the cell that defines mpirun(), ENV and MINE for the lesson's runs

NOTEBOOK = "19_decoder.ipynb"

CELLS = [r'''%md
# 19 · A modern decoder: RoPE, RMSNorm, SwiGLU, grouped-query attention

Lessons 03–18 trained the 2019 GPT-2 block: learned positions, LayerNorm with biases, a GELU MLP, as
many key/value heads as query heads. The models trained today (LLaMA, Mistral, Qwen, and the defaults
of torchtitan, nanotron and picotron) change four pieces, and each changes the parallel story:

| piece | GPT-2 | llama | what changes for parallelism |
|---|---|---|---|
| positions | a learned table `wpe` | **RoPE**: q and k rotated by the position | context parallelism must rotate each token by its *true* position |
| norm | LayerNorm (mean, variance, gain, bias) | **RMSNorm** (root mean square, gain) | nothing: still replicated, still one reduction per row |
| MLP | GELU(x W₁) W₂, 4d wide | **SwiGLU**: (silu(x W_gate) ∘ x W_up) W_down, 8/3·d wide | tensor parallelism must cut gate and up by the same columns |
| K/V heads | H | **H_kv < H** (grouped-query attention) | tp > H_kv replicates KV heads; ring attention sends only H_kv heads |

Plan: (1) RoPE as rotations; (2) RMSNorm and SwiGLU — **you write** a tensor-parallel rank's share of
SwiGLU; (3) grouped-query attention, and **you write** one context-parallel rank's attention under
`mpiexec`: RoPE at the true positions of its far-apart chunks, the other ranks' K/V gathered with only
their $H_{kv}$ heads, each query head reading its KV head in place; (4) the llama block under every layout,
against the single process. Solutions: `lessons/solutions/19_decoder.py`.
''', r'''
import os
import subprocess
import sys
import tempfile

import matplotlib.pyplot as plt
import numpy as np

from minipar.autograd import Tensor
from minipar.nn.rope import apply_rope, rope_angles

%matplotlib inline
''' + LAUNCH + r'''
WORK = tempfile.mkdtemp(prefix="minipar_l19_runs_")


def first_difference(got, want, axis):
    """The index along ``axis`` (a token, a head) of the first slice where got and want differ."""
    same = np.isclose(got, want, rtol=1e-12, atol=1e-12)
    return int(np.argmin(same.all(axis=tuple(a for a in range(got.ndim) if a != axis % got.ndim))))
''', r'''%md
## 1. RoPE: positions as rotations

Read a query (or key) vector of $d$ features as $d/2$ planes. Plane $i$ holds the features $(i,\ i + d/2)$
— the "rotate_half" layout of Hugging Face's Llama (the paper pairs $(2i, 2i+1)$; the two differ by a
permutation of the weights). At position $m$, plane $i$ turns by the angle $m\theta_i$ with
$\theta_i = \text{base}^{-2i/d}$ (base 10000: the first planes spin fast, the last barely move):

$$\text{rope}(x, m) = x \odot \cos(m\theta) + \text{rotate\_half}(x) \odot \sin(m\theta),\qquad
\text{rotate\_half}([a, b]) = [-b, a]$$

with $\cos$ and $\sin$ of each plane's angle on both of its features. A rotation preserves lengths, and
rotating the query by $m$ and the key by $n$ turns the pair by $m - n$ relative to each other:
$\langle \text{rope}(q, m), \text{rope}(k, n)\rangle$ depends on $m - n$ only. Attention sees **relative**
position, and there is no table to learn or to outgrow.

The rotation needs each token's position, and under context parallelism (lesson 16) a rank's tokens are
not at 0..n-1: with the zig-zag split it holds chunk $r$ and chunk $2C - 1 - r$, far apart. A rank that
rotated its tokens by their local index would compute attention as if its second chunk sat right after its
first: no error, a wrong model. You write RoPE in section 3, inside one context-parallel rank's attention.
''', r'''%md
## 2. RMSNorm and SwiGLU

**RMSNorm** drops LayerNorm's centring and bias: $y = x / \sqrt{\overline{x^2} + \varepsilon}\cdot g$. One
statistic per row instead of two, the same quality in practice. For parallelism nothing changes: the
gain is replicated like LayerNorm's, and under sequence parallelism its gradient is summed over the tp
group as before.

**SwiGLU** gates the MLP: $(\text{silu}(xW_\text{gate}) \odot xW_\text{up})\,W_\text{down}$,
$\text{silu}(z) = z\,\sigma(z)$. Three matrices instead of two, so the hidden width shrinks from $4d$ to
$\frac{8}{3}d$ (rounded up to a multiple of 64) for about the same parameters and FLOPs. Tensor parallelism
cuts gate and up column-wise **with the same bounds**: rank $r$'s slice of the gate must multiply its own
slice of up, elementwise, before down (row-parallel) sums the ranks. Cut them differently and every rank
multiplies the gate of one neuron by the up of another — a model that trains, but not this one.
''', r'''
from minipar.nn.gpt import config_from_preset

for name in ("tiny", "llama-tiny", "medium", "llama-medium"):
    cfg = config_from_preset(name)
    d, w = cfg.d_model, cfg.ffn_width
    mlp = (2 if cfg.arch == "gpt2" else 3) * d * w
    print(f"{name:>12}: d {d}, MLP width {w}, MLP parameters per layer {mlp:,} ({mlp / d / d:.2f}·d²)")
''', r'''%md
**Exercise — a tensor-parallel rank's SwiGLU.** Write `my_swiglu_share(x, w_gate, w_up, w_down, rank, tp)`:
`x` is (B, N, d), the weights are the whole layer's (`w_gate`, `w_up` (d, w), `w_down` (w, d)); return rank
`rank`'s (B, N, d) part of the output when the $w$ hidden neurons are cut into `tp` equal runs, rank $r$
holding run $r$. Summed over the ranks (the all-reduce after the row-parallel `down`), the parts are the
layer's output. It is checked for tp 2 and 4 against minipar's `SwiGLU` module, rank by rank.
''', r'''%exercise swiglu_share
def my_swiglu_share(x, w_gate, w_up, w_down, rank, tp):
    raise NotImplementedError("hint: which neurons are this rank's, and which rows and columns of each "
                              "matrix touch them? silu(z) = z·sigmoid(z)")
''', r'''
from minipar import backend
from minipar.nn.layers import Dropout
from minipar.nn.llama import SwiGLU

backend.set_default_dtype(np.float64)
d, width = 16, 48
layer = SwiGLU(d, width, np.random.default_rng(0), 0.02, Dropout(0.0, None))
w_gate, w_up, w_down = (m.weight.data for m in (layer.gate_proj, layer.up_proj, layer.down_proj))
x = np.random.default_rng(1).standard_normal((2, 5, d))
for tp in (2, 4):
    parts = []
    for rank in range(tp):
        neurons = slice(rank * width // tp, (rank + 1) * width // tp)
        share = SwiGLU(d, width // tp, None, 0.02, Dropout(0.0, None))          # minipar's, on this rank's neurons
        share.gate_proj.weight, share.up_proj.weight, share.down_proj.weight = (
            Tensor(w_gate[:, neurons]), Tensor(w_up[:, neurons]), Tensor(w_down[neurons]))
        want = share(Tensor(x)).data
        got = np.asarray(my_swiglu_share(x, w_gate, w_up, w_down, rank, tp))
        if got.shape != want.shape:
            raise AssertionError(f"tp {tp}, rank {rank}: shape {got.shape}, expected {want.shape}")
        if not np.allclose(got, want, rtol=1e-12, atol=1e-12):
            raise AssertionError(f"tp {tp}, rank {rank}: differs from the SwiGLU of neurons {neurons.start}.."
                                 f"{neurons.stop - 1} first at token {first_difference(got, want, axis=1)}")
        parts.append(got)
    assert np.allclose(sum(parts), layer(Tensor(x)).data, rtol=1e-12, atol=1e-12), f"tp {tp}: the parts do not sum"
    print(f"tp {tp}: every rank's part is its neurons' SwiGLU, and the parts sum to the layer's output")
''', r'''%md
## 3. Grouped-query attention

With $H$ query heads and $H_{kv}$ key/value heads, query head $h$ reads KV head $h \,//\, (H/H_{kv})$: each
KV head serves a **group** of $G = H/H_{kv}$ query heads. The scores cost the same; what shrinks is
everything proportional to K and V — their projections, the KV cache at inference ($2 L H_{kv} d_h$ numbers
per token), and under context parallelism the blocks that travel around the ring.

The tempting implementation repeats each KV head $G$ times and calls ordinary attention. That allocates
$G\times$ the K/V it needs — and a ring that repeats before sending moves $G\times$ the bytes (torchtitan
issue #1283). Reading in place is a matter of shapes: view q as $(B, H_{kv}, G, N, d)$ and k, v as
$(B, H_{kv}, 1, N, d)$; broadcasting does the rest, and in backward the gradient of a KV head is the sum
over its group.

''', r'''
fig, ax = plt.subplots(figsize=(5, 3))
groups = [1, 2, 4, 8, 16, 32]
ax.plot(groups, [2 * 32 * (64 // g) * 128 * 2 / 2**10 for g in groups], "o-")
ax.set_xscale("log", base=2); ax.set_xlabel("group size G = H / H_kv"); ax.set_ylabel("KiB per token")
ax.set_title("KV cache per token, 32 layers, 64 heads of 128, bf16"); plt.show()
''', r'''%md
**Exercise — one context-parallel rank's attention.** In one file, write

- `my_rope(x, positions, base)`: `x` (..., n, d) rotated at the n `positions` of its tokens, in the
  rotate_half layout of section 1;
- `my_cp_attention(comm, q, k, v, positions, base)`, run on every rank of a context-parallel group: rank
  $r$ holds its zig-zag chunks, q (B, H, n, d) and k, v (B, $H_{kv}$, n, d), not yet rotated, whose true
  positions are `positions[r]` (`positions[s]`: rank s's, for every s). Rotate q and k at the true
  positions, get the other ranks' K and V — **their $H_{kv}$ heads only**, e.g. one all-gather through
  `minipar.comm` — and return the causal attention of this rank's queries over the whole sequence,
  (B, H, n, d): query head $h$ reads KV head $h \,//\, G$ in place, and a key is visible when its true
  position is at most the query's.

The cell after it checks `my_rope` against minipar's `apply_rope` in this process; the one after runs
`19_yours.py` on 2 ranks (6 query heads on 2 KV heads), which compares every rank's output with minipar's
one-process llama attention on the same data and counts the bytes each rank received: the K/V of $H_{kv}$
heads, $G$ times less than repeated heads would move (the bug of torchtitan issue #1283).
''', r'''%exercise cp_attention
%%writefile {MINE}/cp_attention.py
"""Your RoPE and grouped-query attention on a context-parallel rank (lesson 19):
checked in the notebook and by 19_yours.py under mpiexec."""
import numpy as np

from minipar.comm import all_gather


def my_rope(x, positions, base=10000.0):
    # hint: one angle per plane and position (an outer product); which two features form
    # plane i in the rotate_half layout?
    return x                                   # not rotated yet: the checks say where it differs


def my_cp_attention(comm, q, k, v, positions, base=10000.0):
    # hint: rotate before you send; a gathered K is in rank order, and so are the rows of
    # positions; section 3 says how a KV head is read in place
    return np.zeros_like(q)
''', r'''
sys.path.insert(0, MINE)
import importlib
import cp_attention as yours
importlib.reload(yours)

rng = np.random.default_rng(0)
x = rng.standard_normal((2, 3, 7, 8))
positions = np.array([0, 1, 2, 9, 10, 11, 40])            # not 0..n-1: a context-parallel rank's
angles = rope_angles(positions, 8, 10000.0)
want = apply_rope(Tensor(x), np.cos(angles), np.sin(angles)).data      # minipar's, as the model runs it
got = np.asarray(yours.my_rope(x, positions, 10000.0))
if got.shape != want.shape:
    raise AssertionError(f"my_rope returned shape {got.shape}, expected {want.shape}")
if not np.allclose(got, want, rtol=1e-12, atol=1e-12):
    token = first_difference(got, want, axis=2)
    raise AssertionError(f"my_rope differs from minipar's RoPE first at token {token} (position {positions[token]}); "
                         f"lengths preserved: {np.allclose(np.linalg.norm(got, axis=-1), np.linalg.norm(x, axis=-1))}")
print("your RoPE equals minipar's")

# relative position survives the dot product: <rope(q, m), rope(k, n)> depends on m - n only
q, k = rng.standard_normal((2, 1, 1, 1, 64))
grid = np.array([[(yours.my_rope(q, [m]) * yours.my_rope(k, [n])).sum() for n in range(48)] for m in range(48)])
fig, ax = plt.subplots(figsize=(4.2, 3.6))
ax.imshow(grid, cmap="RdBu"); ax.set_xlabel("key position n"); ax.set_ylabel("query position m")
ax.set_title("q·k after RoPE: constant along m - n"); plt.show()
assert np.allclose(np.diag(grid, 5), np.diag(grid, 5)[0]), "the dot product should depend on m - n only"
''', r'''
print(mpirun(2, ["19_yours.py", "--file", f"{MINE}/cp_attention.py"]).stdout)
''', r'''%md
## 4. The llama block under every layout

`--arch llama` (or the presets `llama-tiny`, `llama-small`, `llama-medium`) trains this block under every
layout minipar has. Three runs against one process, in fp64: tensor parallelism over 4 ranks with 2 KV
heads (each KV head then lives on 2 ranks — a copy, whose gradients are summed over the ranks that
share it), context parallelism with the zig-zag split (RoPE at true positions), and a pipeline.
''', r'''
import json


def losses(ranks, *flags, name):
    log = f"{WORK}/{name}.json"
    cmd = ["-m", "minipar", "train", "--model", "llama-tiny", "--n-head", 4, "--n-kv-head", 2,
           "--precision", "fp64", "--steps", 4, "--batch-size", 4, "--seq-len", 32, "--eval-batches", 0,
           "--data", "stdlib-bytes", "--quiet", "--log-json", log, *flags]
    mpirun(ranks, cmd, timeout=600)
    return np.array([r["loss"] for r in map(json.loads, open(log)) if "loss" in r])


one = losses(1, name="one")
for name, ranks, flags in (("tp4 (KV heads copied)", 4, ["--tp", 4]), ("cp2 zig-zag", 2, ["--cp", 2]),
                           ("pp2 1f1b", 2, ["--pp", 2])):
    got = losses(ranks, *flags, name=name.split()[0])
    print(f"{name:>22}: max relative loss difference from one process {np.max(np.abs(got - one) / one):.1e}")
    # fp64: a layout adds the same terms in another order, a few units of 1e-16 per sum; 1e-12 leaves
    # four steps room to grow that, and a term lost or counted twice moves the loss by far more
    np.testing.assert_allclose(got, one, rtol=1e-12, atol=0, err_msg=f"{name} against one process")
''', r'''%md
## What changes on GPU nodes and at scale

- Llama 3 70B: 64 query heads, 8 KV heads (G = 8), so its KV cache is an eighth of multi-head attention's;
  with tp = 8 each GPU holds exactly one KV head; beyond tp = 8 (rare) KV heads are copied, as here.
- Fused kernels: RoPE is usually applied inside the attention kernel or a fused q/k kernel, RMSNorm and
  SwiGLU are fused elementwise kernels (Liger, Apex); FlashAttention reads each KV head in place for its
  group, as minipar's flash kernels and ring attention do.
- Long context: RoPE's base is raised (500 000 in Llama 3) or its angles rescaled (YaRN, Llama 3.1's
  scaling) to reach 128K tokens; with context parallelism each rank still rotates by its true positions.
- Names you will meet: HF `LlamaForCausalLM` (`python -m minipar export DIR --format hf` writes one),
  torchtitan's `llama3` model, Megatron's `--group-query-attention --num-query-groups`,
  `--swiglu`, `--normalization RMSNorm`, `--position-embedding-type rope`.
''']
