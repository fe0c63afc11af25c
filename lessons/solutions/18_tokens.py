"""Solutions of lesson 18's exercises (the test suite runs the notebook with them)."""

SOLUTIONS = {
    "merge_loop": r'''
def my_learn_merges(chunk_counts, n_merges):
    """BPE merges with pair counts updated only where a merge changes them."""
    words = [list(chunk) for chunk in chunk_counts]
    freqs = list(chunk_counts.values())
    count, where = Counter(), defaultdict(set)
    for i, word in enumerate(words):
        for pair in zip(word, word[1:]):
            count[pair] += freqs[i]
            where[pair].add(i)
    merges = []
    while len(merges) < n_merges and count:
        pair = min(count, key=lambda p: (-count[p], p))      # highest count, then smallest pair
        new = 256 + len(merges)
        touched = set()
        for i in where.pop(pair):
            old, f = words[i], freqs[i]
            for p in zip(old, old[1:]):
                count[p] -= f
                touched.add(p)
            words[i] = merge_pair(old, *pair, new)
            for p in zip(words[i], words[i][1:]):
                count[p] += f
                where[p].add(i)
                touched.add(p)
        for p in touched:
            if count[p] <= 0:
                del count[p]
        merges.append(pair)
    return merges
''',
    "tokenize_share": r'''
%%writefile {MINE}/tokenize_share.py
"""Your parallel tokenization (lesson 18): run by 18_yours.py under mpiexec."""
import json
import os

import numpy as np

from minipar.comm import all_gather
from minipar.data.shards import HEADER_INTS, MAGIC, VERSION


def write_atomically(path, data):
    """data to path.tmp, then renamed: a reader sees the old file or the whole new one."""
    tmp = f"{path}.tmp"
    with open(tmp, "wb") as f:
        f.write(data)
    os.replace(tmp, path)


def my_tokenize(comm, paths, tokenizer, out):
    """Rank r encodes the files that start in its r-th of the corpus's bytes into one
    shard; rank 0 writes the index once every rank has said how many tokens it wrote."""
    p, r = comm.size, comm.rank
    sizes = np.array([os.path.getsize(path) for path in paths], dtype=np.int64)   # stat, no read
    first = np.cumsum(sizes) - sizes                       # each file's first byte in the corpus
    mine = [path for path, b in zip(paths, first) if b * p // sizes.sum() == r]
    ids = []
    for path in mine:
        with open(path, "rb") as f:
            ids += [tokenizer.eot, *tokenizer.encode_bytes(f.read())]
    header = np.zeros(HEADER_INTS, dtype="<i4")
    header[:3] = MAGIC, VERSION, len(ids)
    tokens = np.array(ids, dtype="<u2")
    write_atomically(os.path.join(out, f"train_{r:06d}.bin"), header.tobytes() + tokens.tobytes())
    counts = all_gather(comm, np.array([len(ids)], dtype=np.int64))     # every shard is on disk now
    if r == 0:
        index = {"train": [{"file": f"train_{s:06d}.bin", "tokens": int(n)} for s, n in enumerate(counts)]}
        write_atomically(os.path.join(out, "index.json"), json.dumps(index, indent=1).encode())
''',
    "window_sampler": r'''
def my_batch(shards, seed, step, batch_size, seq_len):
    """Step `step`'s windows: starts from (seed, step) alone, read across shard boundaries."""
    first = np.cumsum([0] + [len(s) for s in shards])        # the global index of each shard's token 0
    rng = np.random.default_rng([seed, step, 0])
    starts = rng.integers(0, first[-1] - seq_len - 1, size=batch_size)
    chunk = np.empty((batch_size, seq_len + 1), dtype=np.int64)
    for row, start in enumerate(starts):
        for j, position in enumerate(range(start, start + seq_len + 1)):
            shard = np.searchsorted(first, position, side="right") - 1
            chunk[row, j] = shards[shard][position - first[shard]]
    return chunk[:, :-1], chunk[:, 1:]
''',
}
