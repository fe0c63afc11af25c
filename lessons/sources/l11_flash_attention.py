"""Lesson 11: the cells of lessons/11_flash_attention.ipynb (``%md`` cells are markdown).

Edit here, then run ``python lessons/make_notebooks.py``."""

NOTEBOOK = "11_flash_attention.ipynb"

CELLS = [r'''%md
# Lesson 11 — Flash attention

Attention is $O = \mathrm{softmax}(S)\,V$ with $S = QK^\top/\sqrt d$. Written that way it
materialises $S$ and $P = \mathrm{softmax}(S)$: $N \times N$ numbers per head, which at
$N = 8192$, 16 heads and fp16 is 2 GiB *per sequence per layer* — kept for backward.

FlashAttention computes exactly the same $O$ without ever holding $S$: it walks **tiles**
of queries and keys, keeps a few numbers per query row, and in backward **recomputes**
each tile of $P$ from one saved number per row. Memory drops from $O(N^2)$ to $O(N)$,
and because the tiles live in on-chip memory, it is also much faster on a GPU.

This lesson: (1) the online softmax that makes tiling possible, (2) the tiles drawn,
(3) the tile loop — **exercise**: the forward over key tiles — and minipar's tiled
reference checked against dense attention, forward and backward — **exercise**: the
tiled backward from the saved log-sum-exp, with $D = \mathrm{rowsum}(dO\circ O)$; (4) the
memory measured on CPU, (5) the CUDA kernels — only where a GPU is present, (6) the same
kernels run on the CPU by an emulator, including a race they would hide on one GPU.
''',
r'''
import inspect, math, os, sys, time, tracemalloc
try:
    import minipar
except ImportError:  # running from a checkout: lessons/ is the working directory
    sys.path.insert(0, os.path.abspath(".."))
import numpy as np
import matplotlib.pyplot as plt
from matplotlib.patches import Rectangle
%matplotlib inline

from minipar.backend import cupy_available
from minipar.kernels.flash_reference import (dense_attention, flash_forward_reference,
                                             flash_backward_reference)
from minipar.kernels.flash_attention import flash_attention
from minipar.autograd import Tensor
from minipar.nn.attention import AttentionCore
rng = np.random.default_rng(0)
''',
r'''%md
## 1. The online softmax

For one query row with scores $s_1..s_N$, softmax needs the maximum $m$ (for stability)
and the normaliser $l = \sum_j e^{s_j - m}$ before any output can be formed — apparently
two passes over all $N$ keys. But both can be **updated** block by block. After seeing
blocks $1..t$ keep

$$m^{(t)} = \max\big(m^{(t-1)}, \max_{j \in t} s_j\big), \qquad
l^{(t)} = e^{m^{(t-1)} - m^{(t)}}\, l^{(t-1)} + \sum_{j \in t} e^{s_j - m^{(t)}},$$

$$\text{acc}^{(t)} = e^{m^{(t-1)} - m^{(t)}}\, \text{acc}^{(t-1)} + \sum_{j\in t} e^{s_j - m^{(t)}}\, v_j .$$

The factor $e^{m^{(t-1)} - m^{(t)}} \le 1$ re-expresses everything accumulated so far
relative to the new maximum. By induction $l^{(T)} = \sum_j e^{s_j - m}$ and
$\text{acc}^{(T)} = \sum_j e^{s_j - m} v_j$ with the true maximum $m$, so
$o = \text{acc}^{(T)}/l^{(T)}$ **exactly** — no approximation. Keeping
$L = m + \log l$ (the log-sum-exp) is enough to rebuild any probability later:
$P_{ij} = e^{s_{ij} - L_i}$.
''',
r'''
scores = rng.standard_normal(37) * 3
values = rng.standard_normal((37, 4))

m, l, acc = -np.inf, 0.0, np.zeros(4)
for start in range(0, 37, 8):                      # blocks of 8 keys, the last one partial
    block = slice(start, start + 8)
    m_new = max(m, scores[block].max())
    p = np.exp(scores[block] - m_new)
    l = np.exp(m - m_new) * l + p.sum()
    acc = np.exp(m - m_new) * acc + p @ values[block]
    m = m_new

softmax = np.exp(scores - scores.max()) / np.exp(scores - scores.max()).sum()
print("online  :", acc / l)
print("two-pass:", softmax @ values)
print("log-sum-exp: online %.15f, direct %.15f" % (m + np.log(l), np.log(np.exp(scores).sum())))
assert np.allclose(acc / l, softmax @ values, rtol=1e-14)
assert np.isclose(m + np.log(l), np.log(np.exp(scores).sum()), rtol=1e-14)
''',
r'''%md
## 2. The tiles

FlashAttention-2's forward gives each query tile ($B_r$ rows) to one thread block; the
block loops over key tiles ($B_c$ keys), computing one $B_r \times B_c$ tile of $S$ at a
time in fast memory. With a **causal** mask (query $i$ sees keys $j \le i$) tiles wholly
above the diagonal are never computed, tiles on it are masked element by element, and
tiles below it need no mask. Backward swaps the loops: one block per key tile, walking
query tiles, so $dK$ and $dV$ accumulate privately while $dQ$ is summed across blocks.
''',
r'''
def draw_tiles(ax, n, block_q, block_k, causal, title):
    for q0 in range(0, n, block_q):
        for k0 in range(0, n, block_k):
            q1, k1 = min(q0 + block_q, n), min(k0 + block_k, n)
            if causal and k0 > q1 - 1:
                color, hatch = "white", None           # above the diagonal: skipped
            elif causal and k1 - 1 > q0:
                color, hatch = "#f4b183", "//"          # on the diagonal: masked inside
            else:
                color, hatch = "#9dc3e6", None          # fully visible
            ax.add_patch(Rectangle((k0, q0), k1 - k0, q1 - q0, facecolor=color,
                                   edgecolor="k", hatch=hatch, lw=0.8))
    if causal:
        ax.plot([0, n], [0, n], "r-", lw=1)
    ax.set_xlim(0, n); ax.set_ylim(n, 0); ax.set_aspect("equal")
    ax.set_xlabel("key j  (inner loop: key tiles of $B_c$)"); ax.set_ylabel("query i  (outer loop: $B_r$)")
    ax.set_title(title)

fig, axes = plt.subplots(1, 2, figsize=(11, 5))
draw_tiles(axes[0], 200, 64, 64, False, "non-causal: all 16 tiles")
draw_tiles(axes[1], 200, 64, 64, True, "causal: white skipped, hatched masked")
plt.tight_layout(); plt.show()
starts = range(0, 200, 64)
computed = sum(1 for q0 in starts for k0 in starts if k0 <= min(q0 + 64, 200) - 1)
print(f"causal, N = 200, 64×64 tiles: {computed} of 16 tiles computed, {16 - computed} skipped")
assert computed == 10
''',
r'''%md
## 3. The tile loop

### Exercise 1 — the forward over key tiles

Write `my_flash_forward(q, k, v, causal, block_k)`: attention for arrays of shape
$(B, H, N, d)$, walking the keys in tiles of `block_k` with the running max $m$, sum $l$
and accumulator of section 1 — one query tile holding every row (the outer loop over
query tiles changes nothing in the math), and a score matrix of $N \times B_c$ per
tile, never $N \times N$. With `causal=True`, query $i$ sees key $j$ only if $j \le i$:
put $-\infty$ in the other scores of the tile (every row sees key 0 in the first tile,
so no row's maximum stays $-\infty$). Return $O$ and $L = m + \log l$.

The check compares yours with minipar's `flash_forward_reference` (float64, $N = 157$,
no multiple of the tile) for several tile widths, causal and not.
''', r'''
B, H, N, d = 2, 4, 157, 32
q, k, v, g = (rng.standard_normal((B, H, N, d)) for _ in range(4))
''', r'''%exercise my_flash_forward
def my_flash_forward(q, k, v, causal=False, block_k=32):
    """softmax(q kᵀ/sqrt(d), causal) v over key tiles of block_k keys, every query row at once.
    q, k, v: (B, H, N, d). Returns (out (B, H, N, d), lse (B, H, N))."""
    n, scale = q.shape[-2], 1 / math.sqrt(q.shape[-1])
    m = np.full(q.shape[:-1], -np.inf)      # running max of each query row
    l = np.zeros(q.shape[:-1])              # running sum of exp(s - m)
    acc = np.zeros(q.shape)                 # running sum of exp(s - m) · v
    for k0 in range(0, n, block_k):
        raise NotImplementedError("hint: section 1's three updates, with a tile of keys in place of a "
                                  "block of scores and every query row at once")
    return acc / l[..., None], m + np.log(l)
''', r'''
for causal in (False, True):
    ref_out, ref_lse = flash_forward_reference(q, k, v, causal)
    for block_k in (16, 50, 64, 157):
        out, lse = my_flash_forward(q, k, v, causal, block_k)
        assert out.shape == q.shape and lse.shape == q.shape[:-1], (out.shape, lse.shape)
        err = max(np.abs(out - ref_out).max(), np.abs(lse - ref_lse).max())
        assert err < 1e-12, f"causal={causal}, block_k={block_k}: max difference {err:.2e}"
print("your tile loop equals flash_forward_reference (causal and not, tiles of 16, 50, 64, 157 keys)")
''', r'''%md
The library's version (`minipar/kernels/flash_reference.py`) has the outer loop over
query tiles too, stops each query tile's key loop at the diagonal instead of masking
whole tiles, and guards the rows that see no key at all (possible when there are more
queries than keys); the CUDA kernels of section 5 are this function, line for line:
''', r'''
print(inspect.getsource(flash_forward_reference))
''', r'''%md
### The tiled reference equals dense attention — forward and backward

`flash_forward_reference` is the algorithm above, vectorised over batch and heads and
within a tile; it returns $O$ and $L$. `flash_backward_reference` rebuilds each tile with
$P = e^{S - L}$ and applies, with $D_i = \sum_c dO_{ic} O_{ic}$,

$$dV_j \mathrel{+}= P_{ij}^\top dO_i,\quad dP_{ij} = dO_i V_j^\top,\quad
dS_{ij} = P_{ij}\circ(dP_{ij} - D_i),\quad dQ_i \mathrel{+}= dS_{ij}K_j/\sqrt d,\quad
dK_j \mathrel{+}= dS_{ij}^\top Q_i/\sqrt d .$$

($D_i = \sum_j P_{ij}\,dP_{ij}$ is the softmax Jacobian's correction term, computed from
$O$ instead of from the $N\times N$ matrices.) In float64 the tiled and dense versions
agree to rounding, with $N$ not a multiple of the tile:
''',
r'''
def dense_grads(q, k, v, g, causal):
    # autograd-free dense backward: P from the full matrix, softmax Jacobian applied directly
    s = q @ k.swapaxes(-1, -2) / math.sqrt(d)
    if causal:
        s = np.where(np.triu(np.ones((N, N), bool), 1), -np.inf, s)
    p = np.exp(s - s.max(-1, keepdims=True)); p /= p.sum(-1, keepdims=True)
    dp = g @ v.swapaxes(-1, -2)
    ds = p * (dp - (p * dp).sum(-1, keepdims=True))
    return ds @ k / math.sqrt(d), ds.swapaxes(-1, -2) @ q / math.sqrt(d), p.swapaxes(-1, -2) @ g

for causal in (False, True):
    tq, tk, tv = (Tensor(a, requires_grad=True) for a in (q, k, v))
    out = flash_attention(tq, tk, tv, causal=causal)      # the autograd Function
    out.backward(g)
    err_out = np.abs(out.data - dense_attention(q, k, v, causal)).max()
    err_grad = max(np.abs(t.grad - w).max() for t, w in zip((tq, tk, tv), dense_grads(q, k, v, g, causal)))
    print(f"causal={causal!s:5}  max |O - O_dense| = {err_out:.1e}   max |grad - grad_dense| = {err_grad:.1e}")
    assert err_out < 1e-12 and err_grad < 1e-12
''', r'''%md
### Exercise 2 — the tiled backward, from $O$ and $L$

Forward kept $Q, K, V, O$ and one number per row, $L$. Write
`my_flash_backward(q, k, v, out, lse, dout, causal, block_q, block_k)`: the backward of
FlashAttention-2, walking the same tiles as the forward, with the loops swapped — key tiles
outside (each key tile's $dK_j$ and $dV_j$ add up privately, over the query tiles), query
tiles inside ($dQ_i$ receives a share from every key tile it sees). $D = \mathrm{rowsum}(dO
\circ O)$ is one number per query row, computed once before the loops, from $O$ — not from the
$N\times N$ matrices. Each tile rebuilds its $P$ from $L$ and applies the five formulas above;
with `causal=True` the tiles wholly above the diagonal are **skipped**, not masked, and the
tiles on it are masked as in the forward. Return `(dq, dk, dv, tiles)`, `tiles` the number of
(query tile, key tile) pairs you computed.

The check compares yours with `flash_backward_reference` and with the dense gradients
of the cell above ($10^{-12}$, float64, $N = 157$, several tile shapes, causal and not), counts
your tiles against section 2's picture, and measures (`tracemalloc`) that at $N = 1024$ your
backward never holds anything near one $N\times N$ matrix. It also shows why $D$ may be taken
from $O$: $\sum_j P_{ij}\,dP_{ij} = \sum_j P_{ij}\,(dO_i \cdot V_j) = dO_i \cdot \sum_j P_{ij} V_j
= dO_i \cdot O_i$.
''', r'''%exercise my_flash_backward
def my_flash_backward(q, k, v, out, lse, dout, causal=False, block_q=32, block_k=32):
    """(dq, dk, dv, tiles) of O = softmax(q kᵀ/sqrt(d), causal) v, from the saved out and lse,
    over tiles of block_q queries × block_k keys; tiles: how many tiles were computed."""
    raise NotImplementedError("hint: nothing of the forward's N×N matrices survives: each tile "
                              "rebuilds its own P from L, and dQ, dK, dV are sums over the tiles "
                              "that touch their rows")
''', r'''
def tiles_to_compute(n, block_q, block_k, causal):
    starts_q, starts_k = range(0, n, block_q), range(0, n, block_k)
    return sum(1 for q0 in starts_q for k0 in starts_k if not causal or k0 <= min(q0 + block_q, n) - 1)

for causal in (False, True):
    out, lse = flash_forward_reference(q, k, v, causal)
    ref = flash_backward_reference(q, k, v, out, lse, g, causal)
    dense = dense_grads(q, k, v, g, causal)
    for block_q, block_k in ((32, 32), (64, 16), (50, 157)):
        dq, dk, dv, tiles = my_flash_backward(q, k, v, out, lse, g, causal, block_q, block_k)
        where = f"causal={causal}, tiles of {block_q}×{block_k}"
        for name, mine, theirs, dense_one in zip(("dq", "dk", "dv"), (dq, dk, dv), ref, dense):
            assert mine.shape == theirs.shape, f"{where}: {name} has shape {mine.shape}, want {theirs.shape}"
            err = np.abs(mine - theirs).max()
            assert err < 1e-12, f"{where}: {name} differs from flash_backward_reference by {err:.2e}"
            err = np.abs(mine - dense_one).max()
            assert err < 1e-12, f"{where}: {name} differs from the dense gradients by {err:.2e}"
        want = tiles_to_compute(N, block_q, block_k, causal)
        assert tiles == want, f"{where}: you computed {tiles} tiles, the tiles that hold a visible key are {want}"
    # D from O equals the softmax Jacobian's term from the N×N matrices
    s = q @ k.swapaxes(-1, -2) / math.sqrt(d)
    if causal:
        s = np.where(np.triu(np.ones((N, N), bool), 1), -np.inf, s)
    p = np.exp(s - lse[..., None])
    assert np.allclose((g * out).sum(-1), (p * (g @ v.swapaxes(-1, -2))).sum(-1), rtol=1e-12, atol=1e-12)

n_long = 1024                                         # one head: N×N float64 would be 8 MiB
ql, kl, vl, gl = (rng.standard_normal((1, 1, n_long, 16)) for _ in range(4))
out_long, lse_long = flash_forward_reference(ql, kl, vl, True)
tracemalloc.start()
try:
    my_flash_backward(ql, kl, vl, out_long, lse_long, gl, True, 64, 64)
    held = tracemalloc.get_traced_memory()[1]
finally:
    tracemalloc.stop()
square = n_long * n_long * 8
assert held < square / 4, (f"N={n_long}: your backward held {held / 2**20:.2f} MiB at its peak; "
                           f"one N×N matrix is {square / 2**20:.0f} MiB")
print(f"your tiled backward equals flash_backward_reference and the dense gradients (causal and not, "
      f"three tile shapes); causal skips the tiles above the diagonal; at N = {n_long} it held "
      f"{held / 2**20:.2f} MiB at its peak, against {square / 2**20:.0f} MiB for one N×N matrix; "
      "rowsum(dO∘O) = rowsum(P∘dP)")
''',
r'''%md
## 4. Memory: O(N) vs O(N²), measured

`tracemalloc` records the peak of NumPy's allocations during one forward pass. Dense
attention's peak grows with $N^2$ (the score matrix and its exponentials); the tiled
reference holds $Q, K, V, O$, the statistics and one $B_r\times B_c$ tile, so it grows
linearly.
''',
r'''
def peak_bytes(fn):
    tracemalloc.start()
    try:
        fn()
        return tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()

sizes = [256, 512, 1024, 2048]
dense_peaks, flash_peaks = [], []
for n in sizes:
    q, k, v = (rng.standard_normal((1, 1, n, 32)) for _ in range(3))
    dense_peaks.append(peak_bytes(lambda: dense_attention(q, k, v, True)))
    flash_peaks.append(peak_bytes(lambda: flash_forward_reference(q, k, v, True)))
    print(f"N={n:5d}  dense {dense_peaks[-1] / 2**20:8.2f} MiB   tiled {flash_peaks[-1] / 2**20:6.2f} MiB")

plt.figure(figsize=(6, 4))
plt.loglog(sizes, np.array(dense_peaks) / 2**20, "o-", label="dense (N×N)")
plt.loglog(sizes, np.array(flash_peaks) / 2**20, "s-", label="tiled flash reference")
plt.xlabel("sequence length N"); plt.ylabel("peak MiB (one head, d=32, float64)")
plt.legend(); plt.title("forward peak memory"); plt.show()
ratio_dense = dense_peaks[-1] / dense_peaks[0]; ratio_flash = flash_peaks[-1] / flash_peaks[0]
print(f"N x8 -> dense memory x{ratio_dense:.0f} (N² predicts 64), tiled x{ratio_flash:.1f} (N predicts 8)")
assert ratio_dense > 30 and ratio_flash < 12
''',
r'''%md
## 5. On a GPU: the CUDA kernels

`minipar/kernels/flash_attention.cu` is the reference written as CUDA C, one thread per
row, in fp32 — read it next to `flash_reference.py`. `flash_attention_f16.cu` is the same
algorithm for fp16 on **tensor cores**: each warp owns 16 query rows, `mma.sync` computes
$S = QK^\top$ into registers, the running max and sum are reduced across the four lanes
that share a row, and — because an `mma` output tile has the layout of the next `mma`'s
input — $P$ goes straight from registers into $PV$ without touching memory. On the CuPy
backend `flash_attention` picks these kernels; `flash_attention(..., implementation="reference")`
forces the array code instead (the GPU tests compare the two that way), and a model
chooses per attention layer: `AttentionCore("flash", implementation=...)`. The cell below checks them against the
reference and runs a small benchmark; on a machine without a GPU it only says so.
(`python -m minipar bench attention` runs the full comparison with PyTorch.)
''',
r'''
if cupy_available():
    import cupy
    from minipar.backend import set_backend
    from minipar.kernels import flash_cuda, bench
    set_backend("cupy")
    qh, kh, vh, gh = (cupy.asarray(rng.standard_normal((2, 8, 1000, 64))).astype(cupy.float16) for _ in range(4))
    out, lse = flash_cuda.forward(qh, kh, vh, True)
    ref, _ = flash_forward_reference(*(a.astype(cupy.float64) for a in (qh, kh, vh)), True)
    print("fp16 tensor-core forward, max abs error vs float64 reference:",
          float(cupy.abs(out.astype(cupy.float64) - ref).max()))
    bench.main(["--sizes", "1024,4096", "--head-dims", "64", "--repeats", "5"])
    set_backend("numpy")
else:
    print("No CUDA GPU with CuPy here: the kernels are compiled and tested where one is "
          "(tests/test_flash_gpu.py, benchmarks/gpu_check.py).")
''',
r'''%md
## 6. No GPU? Run the kernel on the CPU

A kernel that compiles can still read the wrong fragment or forget a `__syncthreads`.
`minipar.kernels.emulator` runs the **.cu source itself** on the CPU: every CUDA
thread is a fiber; `__syncthreads` waits for the block; a warp-wide instruction
(`mma.sync`, `ldmatrix`, `shfl`) waits for its 32 lanes, then each lane computes its
result from all 32 lanes' registers, by the layouts of the PTX ISA. It is built with
AddressSanitizer, so a read past a tile stops the run. It is slow — a few thousand
tiles a second — and says nothing about speed, but everything about correctness.

Which lane holds what is the whole difficulty of tensor-core code. For
`mma.m16n8k16`, lane $4g + t$ holds, of the 16×16 operand $A$, the elements
$A[g][2t..2t{+}1]$, $A[g{+}8][2t..]$, $A[g][2t{+}8..]$, $A[g{+}8][2t{+}8..]$, and of the
16×8 result $C$ the elements $C[g][2t..2t{+}1]$ and $C[g{+}8][2t..2t{+}1]$. Two $C$ tiles side
by side therefore hold exactly what one $A$ operand needs: that is why $P$ can go from
$S = QK^\top$ into $PV$ without leaving registers.
''',
r'''
fig, axes = plt.subplots(1, 2, figsize=(10, 4), gridspec_kw={"width_ratios": [2, 2]})
a_owner, c_owner = np.zeros((16, 16), int), np.zeros((16, 16), int)   # C: two 16x8 tiles side by side
for lane in range(32):
    g, t = lane // 4, lane % 4
    for reg in range(4):
        for half in range(2):
            a_owner[g + 8 * (reg % 2), 2 * t + half + 8 * (reg // 2)] = lane
        for tile in range(2):
            c_owner[g + 8 * (reg // 2), 8 * tile + 2 * t + reg % 2] = lane
for ax, owner, title in [(axes[0], a_owner, "A operand (16x16 fp16): lane per element"),
                         (axes[1], c_owner, "two C tiles (16x8 fp32 each): lane per element")]:
    image = ax.imshow(owner % 4, cmap=plt.get_cmap("Pastel1", 4), vmin=-0.5, vmax=3.5)
    for (r, c), lane in np.ndenumerate(owner):
        ax.text(c, r, lane, ha="center", va="center", fontsize=6)
    ax.set_title(title, fontsize=9); ax.set_xticks([0, 7, 8, 15]); ax.set_yticks([0, 7, 8, 15])
    ax.set_xlabel("column"); ax.set_ylabel("row")
    fig.colorbar(image, ax=ax, ticks=range(4), shrink=0.8, label="t = lane mod 4")
plt.tight_layout(); plt.show()
print("same owner everywhere:", np.array_equal(a_owner, c_owner))
''',
r'''%md
The tensor-core kernel, emulated, against the float64 reference — forward and backward,
fp16 inputs, a length that is no multiple of the 64-row tiles:
''',
r'''
from minipar.kernels import emulator, flash_cuda
from minipar.kernels.emulator import EmulatedKernels, EmulatorError

if emulator.compiler():
    q16, k16, v16, g16 = (rng.standard_normal((1, 2, 100, 64)).astype(np.float16) for _ in range(4))
    start = time.time()
    out, lse = flash_cuda.forward(q16, k16, v16, True, kernels=EmulatedKernels())
    dq, dk, dv = flash_cuda.backward(q16, k16, v16, out, lse, g16, True, kernels=EmulatedKernels())
    q64, k64, v64, g64 = (a.astype(np.float64) for a in (q16, k16, v16, g16))
    ref_out, ref_lse = flash_forward_reference(q64, k64, v64, True)
    ref_grads = flash_backward_reference(q64, k64, v64, ref_out, ref_lse, g64, True)
    print(f"emulated fp16 tensor-core kernels ({time.time() - start:.1f} s, the first run includes g++)")
    print("  forward max abs error :", np.abs(out - ref_out).max())
    assert np.abs(out - ref_out).max() < 5e-3                   # fp16 output: ~1 ulp at 1
    for name, got, want in zip(["dq", "dk", "dv"], (dq, dk, dv), ref_grads):
        rel = np.abs(got - want).max() / np.abs(want).max()
        print(f"  {name} max error / max |{name}|:", rel)
        assert rel < 1e-2
else:
    print("no C++ compiler here: the emulator needs g++")
''', r'''%md
The same kernels are one argument away in the autograd Function the model uses:
`flash_attention(q, k, v, implementation="emulated")` runs `flash_cuda`'s launch code
through the emulator on NumPy arrays, forward and backward — a model built with
`AttentionCore("flash", implementation="emulated")` runs the CUDA source without a GPU
(slowly). Same kernels, same inputs: the same bits as the direct calls above.
''', r'''
if emulator.compiler():
    tq, tk, tv = (Tensor(a, requires_grad=True) for a in (q16, k16, v16))
    y = flash_attention(tq, tk, tv, causal=True, implementation="emulated")
    y.backward(g16)
    same = np.array_equal(y.data, out) and all(np.array_equal(t.grad, w) for t, w in zip((tq, tk, tv), (dq, dk, dv)))
    print("flash_attention(..., implementation='emulated'): output and gradients identical to the "
          "direct kernel calls:", same)
    assert same
    core = AttentionCore("flash", causal=True, implementation="emulated")
    assert np.array_equal(core(Tensor(q16), Tensor(k16), Tensor(v16)).data, out)
''',
r'''%md
Now break it: delete the `__syncthreads()` after the backward kernel writes its $dS$ tile
to shared memory. With every warp advancing in lockstep the race is hidden — the answer is
still right. With the *greedy* schedule the last warp runs ahead and reads a tile nobody has
written yet (the emulator fills fresh shared memory with NaN). On a GPU this is the bug that
passes every test on one card and fails on the next.

Schedules only find races they happen to provoke. The `race` build does better: it runs
under ThreadSanitizer, with the only ordering CUDA guarantees (`__syncthreads` orders the
threads of a block, nothing orders two blocks), and reports the two conflicting accesses,
file and line, whatever the schedule.

''',
r'''
if emulator.compiler():
    source = flash_cuda.kernel_source("f16").replace("        __syncthreads();  // ds_tile complete\n", "")
    assert source != flash_cuda.kernel_source("f16")             # the barrier was there, and is gone
    errors = {}
    for schedule in ("lockstep", "greedy"):
        kernels = EmulatedKernels(schedule=schedule, sources={"f16": source})
        dq_broken, _, _ = flash_cuda.backward(q16, k16, v16, out, lse, g16, True, kernels=kernels)
        errors[schedule] = np.abs(dq_broken - ref_grads[0]).max()
        print(f"{schedule:8s}: dq max error", errors[schedule])
    assert errors["lockstep"] < 1e-2 and not errors["greedy"] < 1e-2    # hidden, then exposed (NaN)
    try:
        flash_cuda.backward(q16, k16, v16, out, lse, g16, True,
                            kernels=EmulatedKernels(check="race", sources={"f16": source}))
        raise AssertionError("ThreadSanitizer reported no race")
    except EmulatorError as report:
        lines = [line for line in str(report).splitlines() if "data race" in line or "#0" in line or "Previous" in line]
        print("\n".join(lines[:4]))  # the race, the read, the earlier write not ordered before it
        assert any("data race" in line for line in lines)

''',
r'''%md
## Takeaways

- The online softmax rescales what has been accumulated by $e^{m_{old} - m_{new}}$ whenever
  the running maximum grows; the result is exact.
- Saving only $O$ and $L = m + \log l$ lets backward rebuild every tile of $P$; memory is
  $O(N)$ instead of $O(N^2)$, which is what makes long sequences trainable.
- Causal attention skips the tiles above the diagonal: half the work.
- On a GPU, the tiles live in shared memory and registers; fusing the whole computation
  into one kernel saves the HBM traffic of writing and re-reading $S$ and $P$.
- Tensor-core code lives or dies by which lane holds which element; the CPU emulator runs
  the kernel as written, so a wrong fragment or a missing barrier shows up without a GPU.
''', r'''%md
## What changes on GPU nodes and at scale

- Attention's scores at N = 8K, 12 heads, fp16 are 8192² × 12 × 2 bytes = 1.6 GB per sequence per layer;
  at the H100 profile's 3.35 TB/s (spec sheet) just writing and reading them once costs ~1 ms. Flash
  attention never writes them: its cost is the FLOPs.
- Measured on one H200, an earlier fp16 tensor-core kernel of minipar ran at 0.27–0.42× of PyTorch's
  flash SDPA forward; the present kernels (swizzled shared memory, cp.async double buffering) are
  checked on the CPU emulator and await a GPU measurement (`benchmarks/gpu_check.py`).
- Grouped-query attention's query heads read their KV head in place, in the kernels and the ring.

## In PyTorch / DeepSpeed / Megatron this is …

- **PyTorch**: `torch.nn.functional.scaled_dot_product_attention(q, k, v, is_causal=True)`
  dispatches to a FlashAttention-2 kernel, a memory-efficient one or the plain math
  (our `implementation=` choice); `torch.nn.attention.sdpa_kernel(SDPBackend.FLASH_ATTENTION)`
  forces one, as `implementation="reference"` does here.
- **The `flash-attn` package** (Dao et al.): `flash_attn_func(q, k, v, causal=True)`,
  `flash_attn_varlen_func` for packed sequences; FlashAttention-3 for Hopper. Its causal
  mask is bottom-right aligned since 2.1, as `flash_reference`'s.
- **Megatron-LM / Transformer Engine**: `DotProductAttention` with the flash or cuDNN
  fused-attention backend (`--attention-backend`, older `--use-flash-attn`); the
  selective recomputation of lesson 10 is what flash attention does by construction.
- **DeepSpeed** does not bring its own training kernel for this: models trained under it call
  PyTorch's `scaled_dot_product_attention` or `flash-attn`, and DeepSpeed-Ulysses (sequence
  parallelism) wraps whichever attention the model uses.
- **xFormers** `memory_efficient_attention`, and the Triton tutorial *Fused Attention*: the
  same online softmax in other kernel languages.

''']
