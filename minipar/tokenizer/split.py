"""The pre-split: text cut into chunks that a merge may never cross.

Byte-level BPE never merges across the boundaries of these chunks, so a token is never
"e the" or ") {": words keep their leading space, numbers come in groups of at most three
digits, punctuation runs stay apart from letters, and a run of spaces ends before the
space that leads the next word.  The pattern follows the style GPT-4's tokenizer made
common; each alternative below is one kind of chunk, tried in order:

    contraction     's 't 're 've 'm 'll 'd  (any case)
    word            an optional non-letter, non-digit lead (" ", "_", "(") + letters
    number          one to three digits
    punctuation     an optional space + symbols, with the line breaks that follow
    line breaks     spaces up to and including line breaks
    spaces          a run of spaces not followed by a non-space (it leaves one for the
                    next word), or any remaining run

Counting: BPE training needs each *distinct* chunk once, with its count, so the corpus
is split once and the pair statistics are built over the distinct chunks.
"""
from __future__ import annotations

from collections import Counter

import regex

SPLIT_PATTERN = "|".join([
    r"'(?i:[sdmt]|ll|ve|re)",
    r"[^\r\n\p{L}\p{N}]?+\p{L}+",
    r"\p{N}{1,3}",
    r" ?[^\s\p{L}\p{N}]++[\r\n]*",
    r"\s*[\r\n]",
    r"\s+(?!\S)",
    r"\s+",
])

_compiled = {}


def compiled(pattern=SPLIT_PATTERN):
    """The compiled pattern (compiled once per process)."""
    if pattern not in _compiled:
        _compiled[pattern] = regex.compile(pattern)
    return _compiled[pattern]


def split_text(text: str, pattern=SPLIT_PATTERN):
    """The chunks of ``text``; ``"".join(split_text(t)) == t`` for every string."""
    return compiled(pattern).findall(text)


def text_of(data: bytes) -> str:
    """Bytes as a string for the splitter.  Bytes that are not UTF-8 become lone
    surrogates (``surrogateescape``) and turn back into the same bytes, so a file in
    Latin-1 still round-trips exactly."""
    return data.decode("utf-8", errors="surrogateescape")


def chunk_bytes(chunk: str) -> bytes:
    return chunk.encode("utf-8", errors="surrogateescape")


def count_chunks(documents, pattern=SPLIT_PATTERN) -> Counter:
    """{chunk bytes: occurrences} over ``documents`` (bytes each)."""
    counts = Counter()
    for data in documents:
        counts.update(split_text(text_of(data), pattern))
    return Counter({chunk_bytes(c): n for c, n in counts.items()})
