"""A tokenized dataset (``python -m minipar tokenize``), read through memory maps.

Data is addressed, not loaded.  The training shards are one long sequence of N tokens
(shard after shard); step k's global batch is B windows of seq_len + 1 tokens whose
starts are drawn from ``default_rng([seed, k, split])`` - the same rule as the byte
corpus, so the batch is a pure function of (seed, k) under every layout, and a resumed
run reads what the uninterrupted one would have.

A batch maps the shards it needs, copies its windows out and drops the maps (nanoGPT's
trick: a map kept open keeps every page it ever touched in the process's RSS).  So a
rank's memory does not grow with the corpus: it holds B·(seq_len+1) tokens at a time,
and the file's pages live in the page cache, shared by all ranks of the node.

Bits per byte: a loss L in nats per token is L / ln 2 / (bytes per token) bits per byte,
with bytes per token = the validation text's UTF-8 bytes / its tokens.  The validation
text is the same whatever the tokenizer, so runs with different vocabularies compare.

Opening checks everything a run could trip on later, before any message between ranks:
the manifest, the tokenizer, every shard's header and size, and that no token is
outside the vocabulary (one pass over the data, block by block).
"""
from __future__ import annotations

import json
import os

import numpy as np

from minipar.data.shards import ShardError, map_tokens, max_token, read_header

FORMAT = "minipar-tokens-1"             # what a manifest says it is
MANIFEST = "manifest.json"              # written last by ``tokenize``: its presence says "done"
TOKENIZER_FILE = "tokenizer.json"


def is_token_dataset(source):
    return isinstance(source, str) and os.path.isfile(os.path.join(source, MANIFEST))


def read_manifest(directory):
    path = os.path.join(directory, MANIFEST)
    try:
        with open(path) as f:
            manifest = json.load(f)
    except (OSError, UnicodeDecodeError, ValueError) as err:
        raise ValueError(f"`data` {directory}: cannot read {MANIFEST}: {err}") from None
    if not isinstance(manifest, dict) or manifest.get("format") != FORMAT:
        raise ValueError(f"`data` {directory}: {MANIFEST} is not a {FORMAT} manifest "
                         "(make one with python -m minipar tokenize)")
    return manifest


class Shards:
    """Several shards seen as one sequence of tokens."""

    def __init__(self, directory, entries, vocab_size):
        self.paths, counts = [], []
        for entry in entries:
            path = os.path.join(directory, entry["file"])
            n = read_header(path)
            if n != entry["tokens"]:
                raise ShardError(f"shard {path} holds {n} tokens, the manifest says {entry['tokens']}")
            top = max_token(path, n) if n else -1
            if top >= vocab_size:
                raise ShardError(f"shard {path} holds token {top}, outside the vocabulary of "
                                 f"{vocab_size}")
            self.paths.append(path)
            counts.append(n)
        self.starts = np.concatenate([[0], np.cumsum(counts)]).astype(np.int64)
        self.counts = counts
        self.size = int(self.starts[-1])

    def __len__(self):
        return self.size

    def windows(self, starts, length):
        """(len(starts), length) int64: the tokens [s, s+length) for each start.  One
        gather per shard: every position is assigned to the shard holding it, and each
        shard's positions are read through one map, closed again before returning."""
        positions = np.asarray(starts, dtype=np.int64)[:, None] + np.arange(length)
        shard = np.searchsorted(self.starts, positions, side="right") - 1
        out = np.empty(positions.shape, dtype=np.int64)
        for i in np.unique(shard):
            here = shard == i
            tokens = map_tokens(self.paths[i], self.counts[i])
            out[here] = tokens[positions[here] - self.starts[i]]
            del tokens
        return out


class TokenDataset:
    """Train/validation shards of a tokenized corpus, and the batches drawn from them."""

    def __init__(self, directory, seq_len):
        from minipar.tokenizer import Tokenizer
        manifest = read_manifest(directory)
        try:
            self.tokenizer = Tokenizer.load(os.path.join(directory, manifest["tokenizer"]))
            if self.tokenizer.fingerprint() != manifest["tokenizer_fingerprint"]:
                raise ValueError("tokenizer.json is not the one these shards were made with")
            self.vocab_size = self.tokenizer.vocab_size
            self.train = Shards(directory, manifest["train"], self.vocab_size)
            self.val = Shards(directory, manifest["val"], self.vocab_size)
            self.bytes_per_token = manifest["val_bytes"] / max(manifest["val_tokens"], 1)
        except KeyError as err:
            raise ValueError(f"`data` {directory}: {MANIFEST} lacks {err}") from None
        except ValueError as err:
            raise ValueError(f"`data` {directory}: {err}") from None
        self.seq_len, self.directory = seq_len, directory
        if len(self.train) <= seq_len + 1:
            raise ValueError(f"`data` {directory} holds {len(self.train)} training tokens: too "
                             f"few for `seq_len` {seq_len} (it needs more than {seq_len + 1})")
        if len(self.val) <= seq_len + 1:
            self.val = self.train           # as the byte corpus does with a tiny split

    def batch(self, seed: int, step: int, batch_size: int, split="train"):
        """(inputs, targets), each (batch_size, seq_len) int64, targets shifted by one;
        a pure function of (seed, step, split)."""
        from minipar.data import window_starts
        data = self.train if split == "train" else self.val
        starts = window_starts(seed, step, batch_size, len(data), self.seq_len, split)
        chunk = data.windows(starts, self.seq_len + 1)
        return chunk[:, :-1], chunk[:, 1:]


def open_dataset(source, seq_len):
    """A TokenDataset for a tokenized folder, else the byte corpus of ``source``."""
    if is_token_dataset(source):
        return TokenDataset(source, seq_len)
    from minipar.data import Dataset, load_corpus
    return Dataset(load_corpus(source), seq_len)


def vocab_size_of(source):
    """The vocabulary a run on ``source`` needs: the tokenizer's, or 256 for bytes."""
    if is_token_dataset(source):
        manifest = read_manifest(source)
        if not isinstance(manifest.get("vocab_size"), int):
            raise ValueError(f"`data` {source}: {MANIFEST} lacks a vocab_size")
        return manifest["vocab_size"]
    return 256
