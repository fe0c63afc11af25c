"""Learning the merges of byte-level BPE, with pair counts kept up to date.

Start from bytes (ids 0..255).  Repeat: find the most frequent adjacent pair (a, b)
over the corpus, give it the next id, and replace every occurrence of a, b by it.
Merge i creates token 256 + i; its *rank* is i, the order in which encoding applies it.

Rescanning the corpus for every merge costs O(corpus) per merge.  Two facts make it cheap:

* the corpus is a multiset of pre-split chunks (``split.py``), and chunks repeat:
  count each distinct chunk once, with its frequency f; a pair seen in a chunk counts f.
* merging (a, b) only changes the chunks that contain it, and in those only the pairs
  that touch an occurrence: (x, a) and (b, y) become (x, ab) and (ab, y).  An index
  ``where[pair] -> chunks that hold it`` finds them, and their pairs are recounted:

      count[p] += f · (pairs of the new chunk - pairs of the old chunk)[p]

The most frequent pair comes from a heap of (-count, pair) entries.  A count that
changed pushes a fresh entry; an entry whose count no longer matches is stale and is
dropped when popped (lazy deletion).  Ties go to the smallest pair, so training is
deterministic.
"""
from __future__ import annotations

import heapq
from collections import defaultdict


def merge_pair(tokens, a, b, new):
    """``tokens`` with every non-overlapping (a, b), left to right, replaced by ``new``."""
    out, i, n = [], 0, len(tokens)
    while i < n:
        if i + 1 < n and tokens[i] == a and tokens[i + 1] == b:
            out.append(new)
            i += 2
        else:
            out.append(tokens[i])
            i += 1
    return out


def _pair_counts(tokens):
    counts = {}
    for pair in zip(tokens, tokens[1:]):
        counts[pair] = counts.get(pair, 0) + 1
    return counts


class PairStatistics:
    """Pair counts over distinct chunks, their index and the heap of candidates."""

    def __init__(self, chunk_counts):
        self.words = [list(chunk) for chunk in chunk_counts]       # bytes -> list of ids
        self.freqs = list(chunk_counts.values())
        self.count = defaultdict(int)
        self.where = defaultdict(set)
        for i, (word, f) in enumerate(zip(self.words, self.freqs)):
            for pair in zip(word, word[1:]):
                self.count[pair] += f
                self.where[pair].add(i)
        self.heap = [(-c, pair) for pair, c in self.count.items()]
        heapq.heapify(self.heap)

    def most_frequent(self):
        """The pair with the highest count (ties: the smallest pair), or None."""
        while self.heap:
            negative, pair = heapq.heappop(self.heap)
            if self.count.get(pair, 0) == -negative and negative < 0:
                return pair
        return None

    def apply(self, pair, new):
        """Merge ``pair`` into ``new`` in every chunk holding it; update the counts of
        the pairs that changed, and only those."""
        a, b = pair
        changed = {}
        for i in self.where.pop(pair, ()):
            old = self.words[i]
            merged = merge_pair(old, a, b, new)
            if len(merged) == len(old):
                continue                          # a stale index entry
            self.words[i] = merged
            f = self.freqs[i]
            before, after = _pair_counts(old), _pair_counts(merged)
            for p, k in before.items():
                delta = after.get(p, 0) - k
                if delta:
                    changed[p] = changed.get(p, 0) + delta * f
            for p, k in after.items():
                if p not in before:
                    changed[p] = changed.get(p, 0) + k * f
                    self.where[p].add(i)
        for p, delta in changed.items():
            c = self.count[p] + delta
            if c > 0:
                self.count[p] = c
                heapq.heappush(self.heap, (-c, p))
            else:
                self.count.pop(p, None)
        self.count.pop(pair, None)


def learn_merges(chunk_counts, n_merges, progress=None):
    """The first ``n_merges`` merges [(a, b), ...] of ``chunk_counts`` ({bytes: count}).
    Stops early when no pair is left (every chunk is a single token).  ``progress(k)``,
    if given, is called after each merge."""
    stats = PairStatistics(chunk_counts)
    merges = []
    while len(merges) < n_merges:
        pair = stats.most_frequent()
        if pair is None:
            break
        stats.apply(pair, 256 + len(merges))
        merges.append(pair)
        if progress is not None:
            progress(len(merges))
    return merges
