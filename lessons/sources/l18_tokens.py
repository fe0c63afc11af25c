"""Lesson 18: the cells of lessons/18_tokens.ipynb (``%md`` cells are markdown).

Edit here, then run ``python lessons/make_notebooks.py``."""
from launch import LAUNCH   # the cell that defines mpirun(), ENV and MINE for the lesson's runs

NOTEBOOK = "18_tokens.ipynb"

CELLS = [r'''%md
# 18 · Tokens and data: BPE, shards, streaming, bits per byte

Until now minipar's models read **bytes**: a vocabulary of 256, nothing to train, any text works. Every
system this course points at reads **tokens** instead: GPT-2's 50,257, Llama 3's 128,256. A token is a
frequent run of bytes (`def`, ` self`, `return`), so a sequence of the same length holds ~3.5× more text
and a step of the same cost learns from ~3.5× more of it. The price: a tokenizer to train, a corpus to
encode once, and a loss that no longer compares across vocabularies until it is counted per *byte*.

Plan: (1) byte-pair encoding by hand on a paragraph; **you write** the merge loop with pair counts kept
up to date; (2) BPE on a slice of the standard library — bytes per token against vocabulary size;
(3) the shard format llm.c uses, and **you write** tokenization across ranks under `mpiexec`, where no rank
reads the whole corpus; (4) reading shards through memory maps, and **you write** the window sampler whose
batch of step $k$ is a pure function of $(\text{seed}, k)$; (5) why memory stays flat, measured;
(6) bits per byte against nats per token.

minipar: `minipar/tokenizer/` (split, train, encode, bpe), `minipar/data/` (shards, tokens, build),
`python -m minipar tokenize`, `train --data DIR`. Solutions: `lessons/solutions/18_tokens.py`.
''', r'''
import inspect
import json
import os
import subprocess
import sys
import tempfile
from collections import Counter, defaultdict

import matplotlib.pyplot as plt
import numpy as np

from minipar.data import load_corpus
from minipar.data.shards import HEADER_BYTES, map_tokens, write_shard
from minipar.data.tokens import Shards, TokenDataset
from minipar.tokenizer import Tokenizer, count_chunks, learn_merges, split_text
from minipar.tokenizer.train import merge_pair

%matplotlib inline
''' + LAUNCH + r'''
WORK = tempfile.mkdtemp(prefix="minipar_l18_")
''', r'''%md
## 1. BPE by hand

Byte-level BPE starts from the 256 bytes and repeats one rule: **find the most frequent adjacent pair
of tokens, give it a new id, replace it everywhere.** Merge $i$ makes token $256 + i$; the list of merges
*is* the tokenizer, and encoding replays them in the order they were learned.

First the text is cut into **chunks** that a merge may never cross (a regex in the style of GPT-4's:
words with their leading space or symbol, runs of digits, runs of punctuation, whitespace). So no token
is ever `e the` or `) {`. Each distinct chunk is counted once, with its frequency — a corpus becomes a
small multiset.
''', r'''
paragraph = ("The tokenizer learns the merges that the text uses most. The merges then tokenize the text: "
             "the tokens of the text are the merges the tokenizer learned, then the bytes that are left.")
chunks = split_text(paragraph)
print(chunks[:12])
chunk_counts = count_chunks([paragraph.encode()])
print(len(chunks), "chunks,", len(chunk_counts), "distinct; the most common:", chunk_counts.most_common(4))

# one merge by hand: count every adjacent pair, weighted by its chunk's frequency
pairs = Counter()
for chunk, f in chunk_counts.items():
    for pair in zip(chunk, chunk[1:]):
        pairs[pair] += f
(a, b), n = max(pairs.items(), key=lambda kv: (kv[1], (-kv[0][0], -kv[0][1])))
print(f"most frequent pair: ({a}, {b}) = {bytes([a, b])!r}, {n} times -> token 256")
print("' the' after that merge:", merge_pair(list(b" the"), a, b, 256))
''', r'''%md
Recounting every pair after every merge costs the whole corpus each time: $M$ merges × $N$ chunks.
But a merge of $(a, b)$ changes only the chunks that contain it, and in those only the pairs that touch
an occurrence: $(x, a)$ and $(b, y)$ become $(x, ab)$ and $(ab, y)$. Keep

- `count[pair]` — the pairs' counts over the distinct chunks (each weighted by its frequency), and
- `where[pair]` — the chunks that hold the pair,

and after a merge touch only `where[(a, b)]`: subtract each such chunk's old pairs, merge it
(`merge_pair`), add its new pairs (and note the chunk under them in `where`). minipar keeps the
candidates in a heap; here a scan of `count` is fast enough.

**Exercise — the merge loop.** Write `my_learn_merges(chunk_counts, n_merges)`: `chunk_counts` is
`{chunk bytes: frequency}`; return the list of merged pairs `[(a, b), ...]`, merge $i$ making token
$256 + i$. Pick the pair with the **highest count; on a tie, the smallest pair** (compare the tuples),
and stop early when no pair is left. It is checked merge by merge against minipar's `learn_merges`.
''', r'''%exercise merge_loop
def my_learn_merges(chunk_counts, n_merges):
    raise NotImplementedError("hint: build count and where once; then each merge only revisits the chunks "
                              "in where[pair] - take their old pairs out of count, put the merged chunk's in")
''', r'''
def first_difference(mine, want, chunk_counts):
    """'' if the merges agree, else which merge differs and the pair counts at that point."""
    for i, (m, w) in enumerate(zip(mine, want)):
        if tuple(m) != tuple(w):
            words = [(list(c), f) for c, f in chunk_counts.items()]
            for k, pair in enumerate(want[:i]):
                words = [(merge_pair(t, *pair, 256 + k), f) for t, f in words]
            count = Counter()
            for t, f in words:
                for p in zip(t, t[1:]):
                    count[p] += f
            tie = "; a tie goes to the smaller pair" if count[tuple(m)] == count[w] else ""
            return (f"merge {i} differs: yours {tuple(m)} (count {count[tuple(m)]}), minipar's {w} "
                    f"(count {count[w]}){tie}; the first {i} agree")
    if len(mine) != len(want):
        return f"you made {len(mine)} merges, minipar {len(want)}; the first {min(len(mine), len(want))} agree"
    return ""


corpus = load_corpus("stdlib", max_bytes=200_000).tobytes()
for name, counts, n in (("the paragraph", chunk_counts, 40), ("200 KB of the stdlib", count_chunks([corpus]), 300)):
    want = learn_merges(counts, n)
    problem = first_difference(my_learn_merges(counts, n), want, counts)
    assert not problem, f"{name}: {problem}"
    print(f"{name}: your {len(want)} merges are minipar's")
tok = Tokenizer(want)
print("the first merges:", [tok.decode([256 + i]) for i in range(12)])
print("the last ones:   ", [tok.decode([256 + i]) for i in range(len(want) - 8, len(want))])
''', r'''%md
## 2. On the corpus: bytes per token against vocabulary size

BPE tokenizers are **nested**: the first $k$ merges of a tokenizer trained to $V$ are exactly the tokenizer
trained to $256 + k$. So one training run gives every smaller vocabulary. Train on the first 90 % of a
600 KB slice and encode the last 10 % with each prefix: every merge buys less than the one before.
''', r'''
text = load_corpus("stdlib", max_bytes=600_000).tobytes()
cut = int(len(text) * 0.9)
merges = learn_merges(count_chunks([text[:cut]]), 2048 - 256)
held_out = text[cut:]
sizes = [256, 320, 384, 512, 768, 1024, 1536, 2048]
per_token = [len(held_out) / len(Tokenizer(merges[:v - 256], special_tokens=()).encode_bytes(held_out))
             for v in sizes]
for v, b in zip(sizes, per_token):
    print(f"vocabulary {v:5d}: {b:.2f} bytes/token")
fig, ax = plt.subplots(figsize=(6, 3.2))
ax.semilogx(sizes, per_token, "o-", base=2)
ax.set_xlabel("vocabulary size"); ax.set_ylabel("bytes per token (held-out text)")
ax.set_title("BPE on 540 KB of the standard library")
plt.show()
''', r'''%md
The curve bends: the first merges take the commonest pairs (runs of spaces — Python's indentation —,
`se`, ` i`, `er`), later ones whole identifiers seen a few times. A larger vocabulary also costs: the
embedding and the output head grow as $V \cdot d$, and the softmax over $V$ is paid for every token.
On the full 31.5 MB standard library minipar's 4,096-token BPE reaches 3.7 bytes per token on the
validation text (`benchmarks/tokenizer.py` compares it with Hugging Face `tokenizers` at the same size).

## 3. Shards: llm.c's format

`python -m minipar tokenize` trains a tokenizer, encodes every document (an `<|endoftext|>` token before
each) in worker processes, and writes **shards**: a 1 KiB header of 256 int32 — magic 20240520, version
1, the token count $N$ — then $N$ uint16 tokens. The size is $1024 + 2N$ bytes, so a truncated file is
caught before it is read. A `manifest.json`, written last, lists them and says "done".
''', r'''
slice_file = os.path.join(WORK, "slice.py")
with open(slice_file, "wb") as f:
    f.write(text)
data_dir = os.path.join(WORK, "tokens")
cmd = [sys.executable, "-m", "minipar", "tokenize", "--data", slice_file, "--vocab", "512", "--out", data_dir,
       "--shard-tokens", "60000", "--workers", "1", "--quiet"]
proc = subprocess.run(cmd, cwd=ROOT, env=ENV, capture_output=True, text=True, timeout=300)
assert proc.returncode == 0, proc.stderr
manifest = json.load(open(os.path.join(data_dir, "manifest.json")))
print(sorted(os.listdir(data_dir)))
print({k: manifest[k] for k in ("vocab_size", "train_tokens", "val_tokens", "val_bytes")})
first = os.path.join(data_dir, manifest["train"][0]["file"])
header = np.fromfile(first, dtype="<i4", count=256)
print("header:", header[:4], "... size", os.path.getsize(first), "= 1024 + 2 ·", header[2])
''', r'''%md
### Tokenizing on several ranks: no rank reads the whole corpus

`tokenize` encodes in worker processes of one machine, and one process writes every shard. A corpus of
terabytes is tokenized by many machines at once (each of datatrove's tasks, say, takes its files and
writes its own output), and then no process may read it all, nor gather the tokens in one place. Each
rank takes a **share of the files**, encodes only those, and writes **its own shard**; the only message
is a few integers — how many tokens each shard holds — so that one rank can write the **index** that puts
the shards in order. The order of
the shards is the order of the files, so the result is the one-process token sequence, cut elsewhere.

Two rules from section 3 carry over. A shard is written under another name and renamed when complete, so a
crash never leaves one that looks whole. The index is written last, once every shard is on disk: its
presence says "done".

**Exercise — parallel tokenization.** Write `my_tokenize(comm, paths, tokenizer, out)`, run on every rank:

- `paths` are the corpus's files in order, $T$ bytes laid one after another. Rank $r$ of $p$ owns the files
  whose **first byte** falls in $[rT/p,\ (r+1)T/p)$ — a share of the bytes, not of the files, so the ranks
  finish together. Open only those (a file's size needs no read: `os.path.getsize`).
- Encode each as `tokenizer.eot` followed by `tokenizer.encode_bytes(its bytes)` (what `tokenize` does),
  and write them as one shard `out/train_{r:06d}.bin` in the format above, renamed into place.
- The ranks all-gather their token counts (`minipar.comm.all_gather`); rank 0 writes `out/index.json`,
  `{"train": [{"file": ..., "tokens": ...}, ...]}` in rank order (a manifest's `"train"` list), renamed
  into place too.

`18_yours.py` runs it on 2 ranks over 18 files of the standard library with this notebook's tokenizer, and
checks on every rank: the files it opened (Python's audit hooks report each `open`), that each file was
renamed into place, its shard against minipar's one-process encoding token by token, and the index — read
through minipar's `Shards` — against that encoding byte for byte.
''', r'''%exercise tokenize_share
%%writefile {MINE}/tokenize_share.py
"""Your parallel tokenization (lesson 18): run by 18_yours.py under mpiexec."""
import json
import os

import numpy as np

from minipar.comm import all_gather
from minipar.data.shards import HEADER_INTS, MAGIC, VERSION


def my_tokenize(comm, paths, tokenizer, out):
    # hint: a file's place in the corpus is the sum of the sizes before it; the header is the
    # 256 int32 of section 3.  Which rank may write the index, and when does it know enough?
    pass
''', r'''
proc = mpirun(2, ["18_yours.py", "--file", f"{MINE}/tokenize_share.py",
                  "--tokenizer", os.path.join(data_dir, "tokenizer.json")])
print(proc.stdout)
''', r'''%md
## 4. Reading shards: windows, not files

Training never loads a shard. The training shards are one long sequence of $N$ tokens, shard after
shard; step $k$'s batch is $B$ windows of `seq_len + 1` tokens (inputs, and targets shifted by one), whose
starts are drawn from a generator seeded with $(\text{seed}, k, \text{split})$ only. Nothing is carried
from step to step, so every rank of every layout computes the same global batch and takes its rows, and a
run resumed at step $k$ reads exactly what the uninterrupted run read.

**Exercise — the window sampler.** Write `my_batch(shards, seed, step, batch_size, seq_len)`: `shards` is
a list of uint16 arrays (memory maps of the training shards, in order). Draw the starts as minipar does,
`np.random.default_rng([seed, step, 0]).integers(0, N - seq_len - 1, size=batch_size)` ($N$ = all the
tokens, split 0 = training), read each window of `seq_len + 1` tokens — **a window may cross from one
shard into the next** — and return `(inputs, targets)`, each `(batch_size, seq_len)` int64. It is checked
window by window against `TokenDataset.batch`, steps in a shuffled order.
''', r'''%exercise window_sampler
def my_batch(shards, seed, step, batch_size, seq_len):
    raise NotImplementedError("hint: number every token of the shards 0..N-1, one shard after another; "
                              "a start then says which shard a token is in and where inside it")
''', r'''
seq_len, batch_size = 32, 16
dataset = TokenDataset(data_dir, seq_len)
shards = [map_tokens(p, n) for p, n in zip(dataset.train.paths, dataset.train.counts)]
print(len(shards), "training shards of", dataset.train.counts, "tokens")
for step in np.random.default_rng(1).permutation(30):
    x, y = my_batch(shards, 7, int(step), batch_size, seq_len)
    want_x, want_y = dataset.batch(7, int(step), batch_size)
    assert x.shape == want_x.shape and y.shape == want_y.shape, (x.shape, want_x.shape)
    for i in range(batch_size):
        if not (np.array_equal(x[i], want_x[i]) and np.array_equal(y[i], want_y[i])):
            j = int(np.argmax((x[i] != want_x[i]) | (y[i] != want_y[i])))
            raise AssertionError(f"step {step}, window {i}: token {j} differs (inputs yours {x[i][j]}, "
                                 f"minipar's {want_x[i][j]}); minipar's window starts with {list(want_x[i][:5])}")
print("correct: 30 steps in shuffled order; shard boundaries at", np.cumsum(dataset.train.counts)[:-1].tolist())
print(inspect.getsource(Shards.windows))
''', r'''%md
Nothing in your sampler knows how many ranks there are: that is the point. Under data parallelism every
rank draws the same global batch from $(\text{seed}, k)$ and keeps its own rows (`shard_rows`), with no
message about the data at all — and a rank of any layout, or a run resumed at step $k$, reads the same
windows.

## 5. Why memory stays flat

A memory map costs nothing until it is read: a page comes into the page cache (shared by every process
on the node) when it is touched, and counts in a process's resident memory (RSS) while the process keeps
it mapped. So `Shards.windows` maps, gathers the batch's windows, and drops the map — nanoGPT does the same
for the same reason. Below, a 100 MB shard (the slice tiled), read two ways in a fresh process: loaded
whole, and streamed as 300 batches of 16 windows.
''', r'''
big = os.path.join(WORK, "big.bin")
tokens = np.fromfile(first, dtype="<u2", offset=HEADER_BYTES)
write_shard(big, np.tile(tokens, 50_000_000 // len(tokens) + 1)[:50_000_000])
probe = r"""
import sys, numpy as np
from minipar.data.shards import read_header
from minipar.data.tokens import Shards
def rss():
    return int(next(l for l in open("/proc/self/status") if l.startswith("VmRSS")).split()[1]) / 1024
path, how = sys.argv[1], sys.argv[2]
n = read_header(path)
before = rss()
if how == "load":
    data = np.fromfile(path, dtype="<u2", offset=1024)
    x = data[np.arange(16)[:, None] + np.arange(33)]
else:
    shards = Shards("", [{"file": path, "tokens": n}], 65536)
    for k in range(300):
        starts = np.random.default_rng([0, k, 0]).integers(0, n - 33, size=16)
        x = shards.windows(starts, 33)
print(f"{how:>6}: RSS {before:6.1f} MiB before, {rss():6.1f} MiB after")
"""
for how in ("load", "stream"):
    out = subprocess.run([sys.executable, "-c", probe, big, how], env=ENV, capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr
    print(out.stdout.strip())
os.remove(big)
''', r'''%md
Loading holds the whole file (100 MB here; a 10 B-token corpus is 20 GB, per rank). Streaming holds a
batch: 16 × 33 tokens, plus the few pages mapped while they are copied. `benchmarks/token_streaming.py`
measures whole runs: two ranks training on the stdlib's shards and on the same shards tiled to 1 GB
reach the same peak RSS within a few MiB.

## 6. Bits per byte, not nats per token

The loss is cross-entropy in **nats per token**. A model with a larger vocabulary predicts more text per
token, so its loss per token is larger even when it models the text better; losses of different
tokenizers do not compare. Counted per byte of text they do:

$$\text{bits/byte} = \frac{L_\text{nats/token}}{\ln 2 \cdot \text{bytes per token}}$$

with bytes per token measured on the validation text, which `tokenize` keeps byte for byte the same for
every vocabulary (the byte corpus's last 5 %). A model that knows nothing — uniform over its vocabulary —
scores $\log_2 V / \text{bytes per token}$: 8 bits per byte on bytes, less with BPE before any training.
''', r'''
bytes_per_token = manifest["val_bytes"] / manifest["val_tokens"]
print(f"this slice's validation text: {bytes_per_token:.2f} bytes per token at vocabulary {manifest['vocab_size']}")
for name, V, bpt in (("bytes", 256, 1.0), ("BPE 512 (this slice)", 512, bytes_per_token), ("BPE 4096 (stdlib)", 4096, 3.7)):
    uniform = np.log(V)
    print(f"{name:>22}: a uniform model {uniform:.2f} nats/token = {uniform / np.log(2) / bpt:.2f} bits/byte")
for name, loss, bpt in (("bytes, val 1.66 nats/token", 1.66, 1.0), ("BPE 4096, val 5.0 nats/token", 5.0, 3.7)):
    print(f"{name:>30} -> {loss / np.log(2) / bpt:.2f} bits/byte")
''', r'''%md
The BPE run's loss *looks* three times worse per token and is better per byte. minipar prints both:
the progress bar and the summary in nats per token beside bits per byte, the JSON log's
`bits_per_byte`, `val_bits_per_byte`, and `minipar report` plots bits per byte so runs of different
tokenizers share an axis.

What next: `python -m minipar tokenize --data stdlib --vocab 4096 --out runs/tok` and `train --data
runs/tok` — or just `train`, whose default `--data stdlib` is that dataset, built once and cached.
''', r'''%md
## What changes on GPU nodes and at scale

- Data is rarely the bottleneck of an LLM: at ~400K tokens/s per H100 (llm.c's bf16 GPT-2) a GPU reads
  ~0.8 MB/s of uint16 tokens, which memory maps serve from the page cache; the tokenizer runs once,
  offline (Hugging Face's datatrove library, llm.c's shard writers), on CPUs.
- The vocabulary is a GPU matter: it sets the head's matmul (V × d per token) and the logits' memory
  (b·s·V); GPT-2's 50,257 is padded to 50,304 for the tensor cores, Llama 3 uses 128K tokens, and
  vocabulary-parallel cross-entropy (lesson 07) keeps the logits sharded over tp.
''']
