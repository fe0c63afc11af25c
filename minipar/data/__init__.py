"""Corpora and batches.

Here tokens are bytes (vocabulary 256), so any text works with no tokenizer to train.
The default corpus is the running Python's own standard library: every ``.py``
file under ``sysconfig``'s stdlib path (site-packages excluded), read in sorted
path order, joined by a blank line.  It is always present and needs no download.

The last ``val_fraction`` of the tokens is the validation split.  The global batch
of step ``k`` is a pure function of ``(seed, k)``: every rank of any parallel
layout can compute it and take its slice, and a resumed run sees the same data.

Tokens instead of bytes: ``build.py`` (``python -m minipar tokenize``) writes a corpus as
llm.c-format shards (``shards.py``); ``tokens.py`` reads them through memory maps with the
same batch rule, and ``open_dataset`` picks bytes or tokens for ``--data``.  ``named.py``:
``--data stdlib`` is the stdlib tokenized once and cached, ``stdlib-bytes`` these bytes.
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


def corpus_paths(source="stdlib"):
    """The files of a text corpus, in the order they are joined: the standard library's
    ``.py`` files (``stdlib``, or ``stdlib-bytes`` as ``--data`` names it), a folder's
    files (recursively, sorted by path), or one file.
    FileNotFoundError with one line for anything else."""
    if source in ("stdlib", "stdlib-bytes"):
        return stdlib_files()
    if os.path.isdir(source):
        return sorted(os.path.join(d, f) for d, _, fs in os.walk(source) for f in fs)
    if os.path.isfile(source):
        return [source]
    raise FileNotFoundError(f"{source!r}: no such file or folder (give 'stdlib', "
                            "'stdlib-bytes', a text file or a folder)")


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
    from minipar.data.tokens import is_token_dataset
    if is_token_dataset(source):
        return 0            # a tokenized dataset: memory-mapped, only a batch's windows are copied
    try:
        return sum(os.path.getsize(p) for p in corpus_paths(source))
    except OSError:
        return 0


def load_corpus(source="stdlib", max_bytes=None) -> np.ndarray:
    """Bytes of the corpus as a uint8 array (``corpus_paths`` says which files).  Raises
    ValueError with one clear line for a missing, unreadable or empty source."""
    try:
        paths = corpus_paths(source)
    except FileNotFoundError as err:
        raise FileNotFoundError(f"`data` {err}") from None
    try:
        raw = _read_files(paths, max_bytes)
    except OSError as err:
        raise ValueError(f"`data` {source!r}: cannot read {err.filename or source}: "
                         f"{err.strerror or err}") from None
    if len(raw) < 2:
        raise ValueError(f"`data` {source!r} holds {len(raw)} bytes: nothing to train on")
    return np.frombuffer(raw, dtype=np.uint8)


def window_starts(seed, step, batch_size, n_tokens, seq_len, split="train"):
    """The first token of each of the ``batch_size`` windows of step ``step``: drawn
    from ``default_rng([seed, step, split])`` over [0, n_tokens - seq_len - 1), so a
    window of seq_len + 1 tokens always fits.  A pure function of its arguments: every
    rank of every layout, and a resumed run, computes the same batch."""
    rng = np.random.default_rng([seed, step, 0 if split == "train" else 1])
    return rng.integers(0, n_tokens - seq_len - 1, size=batch_size)


class Dataset:
    """Train/validation splits of one corpus, and the batches drawn from them."""

    tokenizer, vocab_size, bytes_per_token = None, VOCAB_SIZE, 1.0    # bytes are the tokens

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
        starts = window_starts(seed, step, batch_size, len(data), self.seq_len, split)
        chunk = data[starts[:, None] + np.arange(self.seq_len + 1)].astype(np.int64)
        return chunk[:, :-1], chunk[:, 1:]


def shard_rows(array, index, count):
    """Rows [index·B/count, (index+1)·B/count) of a batch: one data-parallel share."""
    rows = array.shape[0]
    if rows % count:
        raise ValueError(f"batch of {rows} sequences cannot be split evenly over {count} replicas")
    per = rows // count
    return array[index * per:(index + 1) * per]
