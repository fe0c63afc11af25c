"""Lesson 03: the cells of lessons/03_gpt.ipynb (``%md`` cells are markdown).

Edit here, then run ``python lessons/make_notebooks.py``."""

NOTEBOOK = "03_gpt.ipynb"

CELLS = [r'''%md
# 03 · A GPT on one process

This is the model every later lesson parallelises, and the **single-process run every parallel
configuration must reproduce**. We take it apart piece by piece, check the parameter-count formula
behind "175B", train it for a few seconds on the Python standard library's source, and sample.

$$
\begin{aligned}
x_0 &= W_{te}[\text{ids}] + W_{pe}[0..N)                    &&\text{embedding}\\
x &\leftarrow x + \text{Attn}(\text{LN}_1(x))                &&\text{each of } L \text{ blocks}\\
x &\leftarrow x + \text{MLP}(\text{LN}_2(x))\\
\text{logits} &= \text{LN}_f(x)\, W_{head}                     &&\text{head}
\end{aligned}
$$

Two exercises: **you write** a whole transformer block's forward — layer norms, causal
attention, MLP, residuals — from minipar's elementary ops, checked against minipar's `Block`
(output and every gradient, to $10^{-12}$ in float64); and the AdamW step, checked against
minipar's optimizer (solutions: `lessons/solutions/03_gpt.py`).
''', r'''
import inspect
import json
import math
import os
import subprocess
import sys
import tempfile
import time

import matplotlib.pyplot as plt
import numpy as np

from minipar import backend
from minipar.autograd import Tensor, no_grad, ops
from minipar.data import Dataset, decode, encode, load_corpus
from minipar.nn import GPT, config_from_preset, naive_attention
from minipar.observe.runlog import read_log, step_records
from minipar.optim import AdamW, clip_grad_norm, lr_at
from minipar.sample import generate

%matplotlib inline
backend.set_default_dtype(np.float32)
cfg = config_from_preset("tiny")
model = GPT(cfg, seed=0)
print(cfg)
''', r'''%md
The whole model, as minipar writes it (`minipar/nn/gpt.py`) — the equations above, line by line:
''', r'''
from minipar.nn.gpt import Block

print(inspect.getsource(GPT.forward))
print(inspect.getsource(Block.forward))
''', r'''%md
## 1. Embedding

Tokens are bytes (vocabulary V = 256, no tokenizer to train). Token $i$ at position $t$ becomes
$W_{te}[i] + W_{pe}[t]$, a vector of width d. The embedding is a table lookup, so its backward is a
**scatter-add**: a byte that occurs 10 times in the batch receives the sum of 10 gradients.
''', r'''
text = "def add(a, b):\n    return a + b\n"
ids = encode(text)[None, :]                       # (B=1, N)
x0 = model.embed(ids)
print("ids", ids.shape, "->", x0.shape)
manual = model.wte.weight.data[ids[0]] + model.wpe.weight.data[: ids.shape[1]]
assert np.allclose(x0.data[0], manual)
''', r'''%md
## 2. Causal self-attention

Each head projects the normalised stream to queries, keys and values
($q = xW_q,\ k = xW_k,\ v = xW_v$, width $d_h = d/H$) and mixes values along the sequence:

$$P = \text{softmax}\!\Big(\frac{qk^\top}{\sqrt{d_h}} + M\Big),\qquad
M_{ts} = \begin{cases}0 & s \le t\\ -\infty & s > t\end{cases},\qquad y = P\,v.$$

The causal mask $M$ makes position $t$ see only positions $\le t$, so one forward trains all N
next-token predictions at once without peeking. $P$ has $H N^2$ entries per sequence — the
quadratic memory that flash attention avoids. minipar's module (`minipar/nn/attention.py`):
''', r'''
from minipar.nn.attention import CausalSelfAttention

print(inspect.getsource(CausalSelfAttention.forward))
print(inspect.getsource(naive_attention))
''', r'''
block = model.blocks[0]
h = block.ln_1(x0)
q, k, v = block.attn.split_heads(block.attn.qkv(h))           # each (B, H, N, d_head)
print("q, k, v:", q.shape, "  scores and P per sequence:", (q @ ops.transpose(k, (0, 1, 3, 2))).shape[1:])
N = q.shape[2]
y = block.attn.proj(ops.reshape(ops.transpose(naive_attention(q, k, v), (0, 2, 1, 3)), (1, N, cfg.d_model)))
assert np.allclose(block.attn(h).data, y.data, atol=1e-6)
print("the module = heads split, attention per head, heads merged side by side, then proj")
''', r'''%md
## 3. MLP, residuals and LayerNorm

- **MLP**: $\text{GELU}(x W_1 + b_1) W_2 + b_2$ with a 4× wider hidden layer — two thirds of a
  block's parameters.
- **LayerNorm** over the feature axis: $\hat x = (x - \mu)/\sqrt{\sigma^2 + \epsilon}$, then
  $\gamma \hat x + \beta$. GPT-2 normalises *before* each sublayer (pre-LN), so the residual stream
  $x$ itself is never normalised: gradients flow straight through the $+$ of each residual.
- **Initialisation**: all weights $\sim \mathcal N(0, 0.02)$, except the two projections that write
  into the residual stream, which get $0.02/\sqrt{2L}$: the stream receives $2L$ such additions,
  and variances add, so its variance stays $\approx 0.02^2$ instead of growing with depth.
''', r'''
b = model.blocks[0]
ln = b.ln_2(x0).data                              # γ = 1, β = 0 at init
var = x0.data.var(-1)                              # std of x̂ is sqrt(var / (var + eps)): ε matters
assert np.allclose(ln.mean(-1), 0, atol=1e-5)      # for inputs as small as these embeddings
assert np.allclose(ln.std(-1), np.sqrt(var / (var + 1e-5)), atol=1e-4)
hidden = ops.gelu(b.mlp.fc(b.ln_2(x0)))
print("MLP hidden", hidden.shape, "(4·d =", 4 * cfg.d_model, ")")

stds = {name: float(p.data.std()) for name, p in model.named_parameters() if p.ndim == 2}
for name in ("blocks.0.attn.qkv.weight", "blocks.0.mlp.fc.weight",
             "blocks.0.attn.proj.weight", "blocks.0.mlp.proj.weight", "wte.weight"):
    print(f"{name:28s} std {stds[name]:.4f}")
target = 0.02 / math.sqrt(2 * cfg.n_layer)
assert abs(stds["blocks.0.mlp.fc.weight"] - 0.02) < 0.002
assert abs(stds["blocks.0.attn.proj.weight"] - target) < 0.1 * target
assert abs(stds["blocks.3.mlp.proj.weight"] - target) < 0.1 * target

# the variance argument: 2L random residual writes of std s add up to std s·sqrt(2L)
rng = np.random.default_rng(0)
for std in (0.02, target):
    stream = sum(rng.normal(0, std, size=100_000) for _ in range(2 * cfg.n_layer))
    print(f"per-write std {std:.4f} -> residual std after {2 * cfg.n_layer} writes {stream.std():.4f}")
''', r'''%md
### Exercise: a whole block

You have seen every part; now assemble them. Write `my_block_forward(block, x)`: the forward of a
GPT block on `x` of shape $(B, N, d)$, using `block`'s parameters (`block.ln_1.weight`,
`block.attn.qkv.weight`, …, `block.mlp.proj.bias`; `block.attn.n_head` heads; `ln.eps`) and
minipar's elementary ops — `@`, `+`, `*`, `/`, `ops.mean`, `ops.pow`, `ops.reshape`,
`ops.transpose`, indexing, `ops.masked_fill`, `ops.softmax`, `ops.gelu` — so that autograd
differentiates your forward. Not allowed: the block's modules themselves, `ops.layer_norm`,
`ops.linear` and `naive_attention` (each is one of the things you write).

1. LayerNorm from its definition (section 3): the mean and the (biased) variance over the feature
   axis, then $\gamma\hat x + \beta$;
2. attention (section 2): one projection to $[q \mid k \mid v]$, split into heads the way
   `split_heads` orders the columns, scores scaled by $1/\sqrt{d_h}$, the causal mask, softmax,
   $Pv$, the heads merged back side by side, the output projection;
3. the MLP: fc, GELU, proj; and the two residual additions.

The check runs it in float64 on a small block whose parameters are all random (so a LayerNorm
$\gamma$ that is left out, or a bias, shows), and compares the output and the gradient of every
parameter and of $x$ with minipar's `Block`, to $10^{-12}$.
''', r'''%exercise my_block_forward
def my_block_forward(block, x):
    """One pre-LN GPT block on x (B, N, d), built from minipar's ops and block's parameters:
    x + attention(LN_1(x)), then that + MLP(LN_2(that))."""
    raise NotImplementedError("hint: follow the two equations of the block at the top of the lesson, "
                              "one sublayer at a time; the check names the first output or gradient "
                              "that differs")
''', r'''
backend.set_default_dtype(np.float64)
small = config_from_preset("tiny", n_layer=2, d_model=16, n_head=4, seq_len=8)
test_block = GPT(small, seed=3).blocks[1]
rng = np.random.default_rng(5)
for name, p in test_block.named_parameters():                # nothing left at 1 or 0
    p.data[...] = rng.normal(scale=0.5, size=p.shape)
backend.set_default_dtype(np.float32)
x_test = rng.normal(size=(2, small.seq_len, small.d_model))
upstream = rng.normal(size=x_test.shape)                      # dL/d(output)

def output_and_gradients(forward):
    test_block.zero_grad()
    x = Tensor(x_test.copy(), requires_grad=True)
    out = forward(x)
    if not isinstance(out, Tensor) or not out.requires_grad:
        return out, None
    out.backward(upstream)
    return out.data, {"x": x.grad, **{n: p.grad for n, p in test_block.named_parameters()}}

def first_difference(what, mine, ref):
    """None if mine == ref to 1e-12 (relative to ref's largest entry), else one line saying where."""
    if mine is None:
        return f"{what} is None: no gradient reached it"
    if np.shape(mine) != ref.shape:
        return f"{what} has shape {np.shape(mine)}, the Block's {ref.shape}"
    err = np.nan_to_num(np.abs(mine - ref), nan=np.inf)
    if err.max() <= 1e-12 * (1 + np.abs(ref).max()):
        return None
    i = np.unravel_index(err.argmax(), err.shape)
    return f"{what}{[int(j) for j in i]} is {mine[i]:+.10g}, the Block's {ref[i]:+.10g}"

def check_my_block():
    """One line naming the first output or gradient that differs from minipar's Block, or None."""
    ref_out, ref_grads = output_and_gradients(test_block)
    out, grads = output_and_gradients(lambda x: my_block_forward(test_block, x))
    if grads is None:
        return "your output is not a Tensor recorded by autograd: build it from minipar's ops"
    if problem := first_difference("output", out, ref_out):
        return problem
    for name in ref_grads:
        if problem := first_difference(f"dL/d {name}", grads[name], ref_grads[name]):
            return problem
    return None

problem = check_my_block()
assert problem is None, problem
print(f"my_block_forward == minipar's Block (float64, 1e-12): the output and the gradients of x "
      f"and of all {len(list(test_block.parameters()))} parameters")
''', r'''%md
## 4. Counting parameters

Per block: attention $W_{qkv}$ ($d \times 3d$) and $W_o$ ($d\times d$) → $4d^2$; MLP $d\times 4d$ and
$4d\times d$ → $8d^2$; biases $3d + d + 4d + d$; two LayerNorms $4d$:

$$P_{block} = 12d^2 + 13d,\qquad
P = L(12d^2 + 13d) + \underbrace{Vd + Nd}_{\text{embeddings}} + \underbrace{2d}_{LN_f} + \underbrace{dV}_{\text{head, unless tied}}.$$

For large models $12Ld^2$ is everything: GPT-3 with $L=96,\ d=12288$ gives 174B of its 175B.
''', r'''
def param_count(c):
    n = c.n_layer * (12 * c.d_model ** 2 + 13 * c.d_model)
    n += c.vocab_size * c.d_model + c.seq_len * c.d_model + 2 * c.d_model
    return n + (0 if c.tie_weights else c.d_model * c.vocab_size)

print(f"tiny: formula {param_count(cfg):,}   model.num_parameters() {model.num_parameters():,}")
assert param_count(cfg) == model.num_parameters()
for name, overrides in [("small", {}), ("tiny", dict(tie_weights=True, n_layer=2, d_model=32, n_head=2))]:
    c = config_from_preset(name, **overrides)
    assert param_count(c) == GPT(c).num_parameters(), name
print(f"gpt2 preset (byte vocabulary, untied): {param_count(config_from_preset('gpt2')) / 1e6:.1f} M")
print(f"GPT-3: 12·L·d² = {12 * 96 * 12288 ** 2 / 1e9:.1f} B")
''', r'''%md
## 5. Training

The loop is the same one `python -m minipar train` runs: batch → forward → cross-entropy
$\ell = -\frac{1}{BN}\sum \log p(\text{next byte})$ → backward → clip the global gradient norm
to 1 → AdamW with linear warm-up and cosine decay. An untrained model predicts ~uniformly over
256 bytes, so the loss starts near $\ln 256 \approx 5.55$.

AdamW: $m \leftarrow \beta_1 m + (1-\beta_1) g$, $v \leftarrow \beta_2 v + (1-\beta_2) g^2$,
$\theta \leftarrow \theta - \eta_t\big(\hat m / (\sqrt{\hat v} + \epsilon) + \lambda\theta\big)$.
Note the state: two more arrays the size of the parameters (plus fp32 master weights in mixed
precision) — what ZeRO will shard (lesson 06).

**Exercise.** Write `adamw_step(p, g, m, v, t, lr, ...)`: one step, in place on `p`, `m` and `v`
(`t` counts from 1). minipar writes it on plain arrays, not parameters, so that ZeRO can run the
very same function on a flat shard.
''', r'''%exercise adamw_step
def adamw_step(p, g, m, v, t, lr, beta1=0.9, beta2=0.95, eps=1e-8, weight_decay=0.0):
    """One AdamW step on arrays, in place on p, m and v; t counts from 1."""
    raise NotImplementedError("hint: the update rule above, term by term; m and v start at zero, "
                              "which is what the (1 - beta**t) corrections undo; the arrays must "
                              "change in place, since the caller keeps them")
''', r'''
from minipar.optim import adamw_update

rng = np.random.default_rng(11)
p0 = rng.normal(size=(4, 6))
mine = [p0.copy(), np.zeros_like(p0), np.zeros_like(p0)]     # p, m, v
lib = [p0.copy(), np.zeros_like(p0), np.zeros_like(p0)]
for t in range(1, 6):
    g = rng.normal(size=p0.shape) * 10.0 ** rng.uniform(-3, 1)
    adamw_step(mine[0], g, mine[1], mine[2], t, 1e-2, weight_decay=0.1)
    adamw_update(lib[0], g, lib[1], lib[2], t, 1e-2, weight_decay=0.1)
    for a, b in zip(mine, lib):
        np.testing.assert_allclose(a, b, rtol=1e-12, atol=1e-15)
print("adamw_step == minipar.optim.adamw_update over 5 steps (p, m and v)")

# Adam's first step moves every weight by lr, whatever the size of its gradient (m̂/sqrt(v̂) = g/|g|,
# as long as |g| is well above eps): here gradients from 1e-5 to 1e2
p, m, v = p0.copy(), np.zeros_like(p0), np.zeros_like(p0)
g = np.sign(rng.normal(size=p0.shape)) * 10.0 ** rng.uniform(-5, 2, size=p0.shape)
adamw_step(p, g, m, v, 1, 1e-2)
print(f"first step, |g| from {np.abs(g).min():.1e} to {np.abs(g).max():.1e}: "
      f"|Δp| from {np.abs(p - p0).min():.6f} to {np.abs(p - p0).max():.6f} (lr = 0.01)")
assert np.allclose(np.abs(p - p0), 1e-2, rtol=2e-3)
print(inspect.getsource(adamw_update))
''', r'''
corpus = load_corpus("stdlib")
data = Dataset(corpus, cfg.seq_len)
print(f"corpus: {len(corpus):,} bytes of the standard library; e.g.\n{decode(data.train[1000:1120])}")

model = GPT(cfg, seed=0)
steps, batch_size, base_lr, warmup = 50, 8, 5e-3, 5   # the CLI defaults for 50 steps
opt = AdamW(model.named_parameters(), lr=base_lr, weight_decay=0.1)
losses, lrs = [], []
t0 = time.perf_counter()
for step in range(steps):
    opt.lr = lr_at(step, base_lr, warmup, steps)
    x, y = data.batch(seed=0, step=step, batch_size=batch_size)
    _, loss = model(x, y)
    loss.backward()
    clip_grad_norm(model.parameters(), 1.0)
    opt.step()
    opt.zero_grad()
    losses.append(loss.item()); lrs.append(opt.lr)
elapsed = time.perf_counter() - t0
print(f"{steps} steps in {elapsed:.1f} s; loss {losses[0]:.3f} -> {np.mean(losses[-5:]):.3f}")
assert abs(losses[0] - math.log(256)) < 0.3
assert np.mean(losses[-5:]) < 0.8 * math.log(256)
state = sum(s["m"].nbytes + s["v"].nbytes for s in opt.state.values())
print(f"AdamW state: {state / model.num_parameters():.0f} bytes per parameter, "
      f"on top of 4 for the weight and 4 for its gradient")
assert state == 8 * model.num_parameters()
''', r'''
fig, (ax1, ax2) = plt.subplots(1, 2, figsize=(9, 3.2))
ax1.plot(losses, label="train loss")
ax1.axhline(math.log(256), color="gray", ls=":", label="ln 256 (uniform)")
ax1.set_xlabel("step"); ax1.set_ylabel("cross-entropy (nats/byte)"); ax1.legend(); ax1.grid(alpha=0.3)
ax2.plot(lrs); ax2.set_xlabel("step"); ax2.set_ylabel("learning rate"); ax2.grid(alpha=0.3)
ax2.set_title("warm-up + cosine"); ax1.set_title("tiny GPT on the stdlib")
plt.show()
''', r'''%md
### What a head looks at

The attention probabilities $P$ of each head of the first block, on a line of Python. Everything
above the diagonal is exactly zero (the causal mask); each row is a distribution over the past.
''', r'''
snippet = "    def __init__(self, name):\n        self.name = name\n"
ids = encode(snippet)[None, : cfg.seq_len]
with no_grad():
    blk = model.blocks[0]
    q, k, v = blk.attn.split_heads(blk.attn.qkv(blk.ln_1(model.embed(ids))))
    scores = q @ ops.transpose(k, (0, 1, 3, 2))
    P = ops.attention_softmax(scores, 1 / math.sqrt(q.shape[-1])).numpy()[0]
n = P.shape[-1]
assert np.allclose(np.triu(P, k=1), 0) and np.allclose(P.sum(-1), 1, atol=1e-5)

print("positions:", " ".join(f"{t}:{repr(chr(c))[1:-1]}" for t, c in enumerate(ids[0][:24])), "...")
fig, axes = plt.subplots(1, cfg.n_head, figsize=(3.6 * cfg.n_head, 3.3))
for hd, ax in enumerate(axes):
    top = np.quantile(P[hd][P[hd] > 0], 0.98)          # a few large weights would wash out the rest
    im = ax.imshow(P[hd], cmap="magma", vmin=0, vmax=top)
    ax.set_title(f"block 0, head {hd}"); ax.set_xlabel("key position s"); ax.set_ylabel("query position t")
    ax.set_xticks(range(0, n, 8)); ax.set_yticks(range(0, n, 8))
    fig.colorbar(im, ax=ax, fraction=0.046, pad=0.04, label="P[t, s] (top 2% clipped)")
plt.tight_layout(); plt.show()
''', r'''%md
## 6. Sampling

Generation is the forward run repeatedly: take the logits of the last position, divide by a
temperature, keep the top-k, sample a byte, append it. After a few seconds of training the model
has learnt which bytes are common (spaces above all: indentation) — not yet Python.
''', r'''
out = generate(model, encode("def "), tokens=120, temperature=0.8, top_k=40, seed=0)
sample = decode(out)
print(sample)
assert len(out) == 4 + 120 and sample.startswith("def ")
spaces = sample[4:].count(" ") / 120
print(f"spaces: {spaces:.0%} of the sampled bytes, {np.mean(np.asarray(corpus[:1_000_000]) == ord(' ')):.0%} "
      f"of the corpus, {1 / 256:.1%} for uniform bytes")
assert spaces > 10 / 256
''', r'''%md
## 7. The same run from the command line

`python -m minipar train` is this loop plus logging, checkpoints and (in later lessons) parallel
layouts. `--log-json` writes one JSON line per step — the numbers every later lesson plots —
between a first line `{"header": …}` (the resolved configuration) and a last one `{"final": …}`
(the evaluation and totals); `minipar.observe.runlog.read_log(path)` returns the three parts and
`step_records(path)` the steps. With the same seed, batch size and step count — and the same
bytes: `--data stdlib-bytes`, since `train`'s default `stdlib` is the same text in BPE tokens
(lesson 18) — it must reproduce our loop exactly: this "single-process oracle" is what every parallel layout is later compared against.
''', r'''
with tempfile.TemporaryDirectory() as tmp:
    log_path = os.path.join(tmp, "log.jsonl")
    cmd = [sys.executable, "-m", "minipar", "train", "--data", "stdlib-bytes", "--model", "tiny",
           "--steps", "50", "--batch-size", "8", "--log-json", log_path, "--quiet", "--eval-batches", "1"]
    print("$", " ".join(["python"] + cmd[1:]))
    t0 = time.perf_counter()
    result = subprocess.run(cmd, capture_output=True, text=True, timeout=300, cwd=tmp)
    print(result.stdout.strip() or result.stderr[-2000:])
    assert result.returncode == 0, result.stderr[-2000:]
    header, records, final = read_log(log_path)
    assert records == step_records(log_path)
print(f"({time.perf_counter() - t0:.1f} s)")
print("header keys:", sorted(header)[:12], "...")
print("first step:", {k: records[0][k] for k in ("step", "loss", "lr", "grad_norm", "tokens_per_s",
                                                  "peak_mem_bytes", "model_state_bytes")})
print("final:", final)
assert records[0]["model_state_bytes"]["optimizer"] == state    # the AdamW state measured above
cli_losses = [r["loss"] for r in records]
assert len(records) == 50 and {"step", "loss", "lr", "tokens_per_s", "peak_mem_bytes"} <= set(records[0])
# same seed, same data (the batch of step k is a function of (seed, k)), same schedule:
# the CLI run reproduces the notebook's loop step for step
assert np.allclose(cli_losses, losses, rtol=1e-4), np.abs(np.array(cli_losses) - losses).max()
print("CLI losses == notebook losses; max difference", np.abs(np.array(cli_losses) - losses).max())

plt.figure(figsize=(5, 3))
plt.plot(cli_losses, lw=3, alpha=0.5, label="CLI --log-json"); plt.plot(losses, "--", label="notebook loop")
plt.xlabel("step"); plt.ylabel("loss"); plt.legend(); plt.grid(alpha=0.3); plt.show()
''', r'''%md
## Takeaways

- A GPT block is LN → attention (causal softmax over $qk^\top/\sqrt{d_h}$) → residual, LN → 4×
  MLP → residual; GPT-2 init scales the residual writes by $1/\sqrt{2L}$.
- $P \approx 12Ld^2$: parameter count is dominated by the blocks' matrices — that is what tensor
  parallelism splits (lesson 07) and pipeline parallelism distributes by layer (lesson 08).
- This single-process run is the oracle: every parallel layout must reproduce its losses.
''', r'''%md
## What changes on GPU nodes and at scale

- Measured on one H200: a GPT-2-small step (12 layers, d 768, seq 1024, batch 8, fp32) takes 150 ms
  on minipar's CuPy backend, about 55K tokens/s. Tuned bf16 trainers (llm.c, nanoGPT) reach roughly
  375–460K tokens/s per H100: tensor cores, fused kernels, flash attention.
- The model here has a byte or 4,096-token vocabulary; GPT-2's 50,257 (padded to 50,304 for the tensor
  cores) makes the head one of the largest matmuls, and Llama 3's 128K makes it larger still.

## In PyTorch / DeepSpeed / Megatron this is …

| here | there |
|---|---|
| `GPT`, `Block`, `CausalSelfAttention`, `MLP` | nanoGPT's classes of the same names; Hugging Face `GPT2LMHeadModel`; Megatron-Core's `GPTModel` built from `TransformerBlock` / `TransformerLayer` |
| the attention inside your `my_block_forward`, `naive_attention` | `torch.nn.functional.scaled_dot_product_attention(q, k, v, is_causal=True)` (which dispatches to flash kernels: lesson 11) |
| your `adamw_step`, `adamw_update` on plain arrays | `torch.optim.AdamW` (`foreach=True` / `fused=True` run it over many tensors at once); DeepSpeed's `FusedAdam` / `DeepSpeedCPUAdam`; ZeRO applies it to a flat shard (lesson 06) |
| `clip_grad_norm(params, 1.0)` | `torch.nn.utils.clip_grad_norm_` (with sharded parameters the norm needs an all-reduce: lesson 06) |
| `lr_at` (warm-up + cosine) | `torch.optim.lr_scheduler.LambdaLR` / `CosineAnnealingLR`; Megatron's `--lr-warmup-iters`, `--lr-decay-style cosine` |
| `--log-json` records, `step_records` | what a training framework logs per step (loss, lr, grad norm, tokens/s, memory): Megatron's `--log-interval` lines, DeepSpeed's `wall_clock_breakdown` |
''']
