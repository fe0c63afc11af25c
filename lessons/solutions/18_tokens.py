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
    "window_sampler": r'''
%%writefile {MINE}/sampler.py
"""Your window sampler (lesson 18): checked here and by 18_yours.py under mpiexec."""
import numpy as np


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
