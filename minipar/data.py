"""Corpora and batches.

Tokens are bytes (vocabulary 256), so any text works with no tokenizer to train.
The default corpus is the running Python's own standard library: every ``.py``
file under ``sysconfig``'s stdlib path (site-packages excluded), read in sorted
path order, joined by a blank line.  It is always present and needs no download.

The last ``val_fraction`` of the tokens is the validation split.  The global batch
of step ``k`` is a pure function of ``(seed, k)``: every rank of any parallel
layout can compute it and take its slice, and a resumed run sees the same data.
"""
from __future__ import annotations

import os
import sysconfig

import numpy as np

VOCAB_SIZE = 256


def encode(text: str) -> np.ndarray:
    return np.frombuffer(text.encode("utf-8"), dtype=np.uint8).astype(np.int64)


def decode(ids) -> str:
    return bytes(int(i) for i in ids).decode("utf-8", errors="replace")


def stdlib_files():
    root = sysconfig.get_paths()["stdlib"]
    files = []
    for dirpath, dirnames, filenames in os.walk(root):
        dirnames[:] = sorted(d for d in dirnames if d not in ("site-packages", "__pycache__"))
        files += [os.path.join(dirpath, f) for f in sorted(filenames) if f.endswith(".py")]
    return sorted(files)


def _read_files(paths, max_bytes):
    """The files' bytes joined by a blank line (between files, not after the last)."""
    chunks, total = [], 0
    for path in paths:
        with open(path, "rb") as f:
            data = f.read()
        chunks.append(data)
        total += len(data) + 2
        if max_bytes and total >= max_bytes:
            break
    return b"\n\n".join(chunks)[:max_bytes or None]


def corpus_bytes(source="stdlib"):
    """The size of a corpus before reading it (0 when it cannot be read: load_corpus says
    why).  Loading holds it twice at its peak: the files read, then joined."""
    if source == "stdlib":
        paths = stdlib_files()
    elif os.path.isdir(source):
        paths = [os.path.join(d, f) for d, _, fs in os.walk(source) for f in fs]
    else:
        paths = [source]
    try:
        return sum(os.path.getsize(p) for p in paths)
    except OSError:
        return 0


def load_corpus(source="stdlib", max_bytes=None) -> np.ndarray:
    """Bytes of the corpus as a uint8 array: ``"stdlib"``, a text file, or a folder
    (its files read recursively in sorted order).  Raises ValueError with one clear
    line for a missing, unreadable or empty source."""
    try:
        if source == "stdlib":
            raw = _read_files(stdlib_files(), max_bytes)
        elif os.path.isdir(source):
            paths = sorted(os.path.join(d, f) for d, _, fs in os.walk(source) for f in fs)
            raw = _read_files(paths, max_bytes)
        elif os.path.isfile(source):
            raw = _read_files([source], max_bytes)
        else:
            raw = None
    except OSError as err:
        raise ValueError(f"`data` {source!r}: cannot read {err.filename or source}: "
                         f"{err.strerror or err}") from None
    if raw is None:
        raise FileNotFoundError(f"`data` {source!r}: no such file or folder (give 'stdlib', a "
                                "text file or a folder)")
    if len(raw) < 2:
        raise ValueError(f"`data` {source!r} holds {len(raw)} bytes: nothing to train on")
    return np.frombuffer(raw, dtype=np.uint8)


class Dataset:
    """Train/validation splits of one corpus, and the batches drawn from them."""

    def __init__(self, tokens: np.ndarray, seq_len: int, val_fraction=0.05):
        n_val = int(len(tokens) * val_fraction)
        self.train = tokens[: len(tokens) - n_val]
        self.val = tokens[len(tokens) - n_val:] if n_val > seq_len + 1 else self.train
        self.seq_len = seq_len
        if len(self.train) <= seq_len + 1:
            raise ValueError(f"corpus of {len(tokens)} bytes is too short for `seq_len` {seq_len} "
                             f"(it needs more than {seq_len + 1} bytes of training text)")

    def batch(self, seed: int, step: int, batch_size: int, split="train"):
        """(inputs, targets), each (batch_size, seq_len) int64: random windows of the
        split, targets shifted by one.  Depends only on (seed, step, split)."""
        data = self.train if split == "train" else self.val
        rng = np.random.default_rng([seed, step, 0 if split == "train" else 1])
        starts = rng.integers(0, len(data) - self.seq_len - 1, size=batch_size)
        window = starts[:, None] + np.arange(self.seq_len + 1)
        chunk = data[window].astype(np.int64)
        return chunk[:, :-1], chunk[:, 1:]


def shard_rows(array, index, count):
    """Rows [index·B/count, (index+1)·B/count) of a batch: one data-parallel share."""
    rows = array.shape[0]
    if rows % count:
        raise ValueError(f"batch of {rows} sequences cannot be split evenly over {count} replicas")
    per = rows // count
    return array[index * per:(index + 1) * per]
