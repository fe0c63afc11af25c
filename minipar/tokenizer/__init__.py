"""Byte-level BPE, written here: pre-split, learn merges, encode with a compiled loop.

    split.py    the regex that cuts text into chunks no merge may cross
    train.py    learning merges with incrementally kept pair counts
    encode.py   applying the merges to chunks (numba)
    bpe.py      Tokenizer: encode / decode / special tokens / JSON save and load

    tok = train_tokenizer(count_chunks(documents), vocab_size=4096)
    ids = tok.encode("def f(x):\\n    return x")
    assert tok.decode(ids) == "def f(x):\\n    return x"

``minipar/data/build.py`` (``python -m minipar tokenize``) uses it to write token shards.
"""
from __future__ import annotations

from minipar.tokenizer.bpe import END_OF_TEXT, MAX_VOCAB, Tokenizer
from minipar.tokenizer.split import count_chunks, split_text
from minipar.tokenizer.train import learn_merges


def train_tokenizer(chunk_counts, vocab_size, special_tokens=(END_OF_TEXT,), progress=None):
    """A Tokenizer of ``vocab_size`` ids (bytes + merges + special tokens) learned from
    ``chunk_counts`` ({chunk bytes: count}, ``count_chunks``).  Fewer merges when the
    corpus runs out of pairs."""
    n_merges = vocab_size - 256 - len(special_tokens)
    if n_merges < 0 or vocab_size > MAX_VOCAB:
        raise ValueError(f"vocabulary must be in [{256 + len(special_tokens)}, {MAX_VOCAB}] "
                         f"(256 bytes + merges + {len(special_tokens)} special), got {vocab_size}")
    return Tokenizer(learn_merges(chunk_counts, n_merges, progress), special_tokens)


__all__ = ["Tokenizer", "train_tokenizer", "count_chunks", "split_text", "learn_merges",
           "END_OF_TEXT", "MAX_VOCAB"]
