"""The tokenizer: pre-split, merges, special tokens; encode, decode, save, load.

    ids 0..255          the bytes themselves (so every string has an encoding)
    ids 256..256+M-1    the M merges, in the order they were learned (rank = id - 256)
    ids after that      special tokens, e.g. <|endoftext|> between documents; they are
                        never produced from text unless asked (``allowed_special``)

``decode(encode(s)) == s`` for every string: the chunks of the pre-split join back to
the text, each chunk's bytes are exactly its UTF-8 (lone surrogates included), and a
merge only ever joins two byte strings.  Decoding arbitrary ids (a model's sample) may
cut a character in half; those bytes decode to U+FFFD.

Saved as a small JSON file: the split pattern, the merges as pairs, the special tokens.
"""
from __future__ import annotations

import hashlib
import json

import numpy as np

from minipar.tokenizer import encode as compiled
from minipar.tokenizer.split import SPLIT_PATTERN, chunk_bytes, compiled as split_regex, text_of

FORMAT = "minipar-bpe-1"
END_OF_TEXT = "<|endoftext|>"
MAX_VOCAB = 65535             # ids are stored as uint16 in the shards


class Tokenizer:
    """Byte-level BPE: ``encode``/``decode`` for text, ``encode_bytes``/``decode_bytes``
    for files, ``save``/``load`` for its JSON.  Built from merges (``train_tokenizer``
    learns them); ``vocab_size`` = 256 + merges + special tokens."""

    def __init__(self, merges, special_tokens=(END_OF_TEXT,), pattern=SPLIT_PATTERN):
        self.merges = [(int(a), int(b)) for a, b in merges]
        self.pattern = pattern
        self.special = {name: 256 + len(self.merges) + i for i, name in enumerate(special_tokens)}
        self.vocab_size = 256 + len(self.merges) + len(self.special)
        _check_merges(self.merges, self.vocab_size)
        self.table = compiled.merge_table(self.merges)
        self.token_bytes = [bytes([i]) for i in range(256)]
        for a, b in self.merges:
            self.token_bytes.append(self.token_bytes[a] + self.token_bytes[b])
        self.token_bytes += [name.encode() for name in self.special]
        self._cache = {}          # chunk bytes -> its tokens (chunks repeat a lot)

    @property
    def eot(self):
        """The id of <|endoftext|>, the separator between documents."""
        return self.special[END_OF_TEXT]

    # ------------------------------------------------------------------ encoding
    def _encode_chunks(self, chunks):
        """Token arrays of ``chunks`` (bytes each): looked up, the missing ones compiled."""
        cache = self._cache
        missing = [c for c in dict.fromkeys(chunks) if c not in cache]
        if len(cache) + len(missing) > 2_000_000:
            cache.clear()
            missing = list(dict.fromkeys(chunks))
        for chunk, ids in zip(missing, compiled.encode_chunks(missing, self.table)):
            cache[chunk] = ids
        return [cache[c] for c in chunks]

    def _ordinary(self, text: str):
        """Text without special tokens; a lone surrogate is kept as its 3 UTF-8 bytes."""
        chunks = [c.encode("utf-8", "surrogatepass") for c in split_regex(self.pattern).findall(text)]
        return _joined(self._encode_chunks(chunks))

    def encode(self, text: str, allowed_special=False) -> np.ndarray:
        """Token ids (int64) of ``text``.  Special tokens in the text are plain text
        unless ``allowed_special`` (True: all of them; or a set of names)."""
        allowed = set(self.special) if allowed_special is True else set(allowed_special or ())
        if not allowed:
            return self._ordinary(text)
        import regex
        splitter = regex.compile("(" + "|".join(regex.escape(s) for s in sorted(allowed)) + ")")
        pieces = []
        for i, piece in enumerate(splitter.split(text)):
            if i % 2:
                pieces.append(np.array([self.special[piece]], dtype=np.int64))
            elif piece:
                pieces.append(self._ordinary(piece))
        return _joined(pieces)

    def encode_bytes(self, data: bytes) -> np.ndarray:
        """Token ids of raw bytes (a file): any bytes, UTF-8 or not, round-trip."""
        chunks = [chunk_bytes(c) for c in split_regex(self.pattern).findall(text_of(data))]
        return _joined(self._encode_chunks(chunks))

    # ------------------------------------------------------------------ decoding
    def decode_bytes(self, ids) -> bytes:
        table = self.token_bytes
        try:
            return b"".join(table[int(i)] for i in ids)
        except IndexError:
            bad = next(int(i) for i in ids if not 0 <= int(i) < self.vocab_size)
            raise ValueError(f"token {bad} is outside the vocabulary of {self.vocab_size}") from None

    def decode(self, ids) -> str:
        data = self.decode_bytes(ids)
        try:
            return data.decode("utf-8", errors="surrogatepass")
        except UnicodeDecodeError:            # a sample that cut a character: show U+FFFD
            return data.decode("utf-8", errors="replace")

    # ------------------------------------------------------------------ files
    def to_dict(self):
        return {"format": FORMAT, "pattern": self.pattern, "merges": [list(m) for m in self.merges],
                "special_tokens": list(self.special)}

    @classmethod
    def from_dict(cls, d):
        if not isinstance(d, dict) or d.get("format") != FORMAT:
            got = d.get("format") if isinstance(d, dict) else type(d).__name__
            raise ValueError(f"not a {FORMAT} tokenizer (format {got!r})")
        try:
            return cls(d["merges"], d["special_tokens"], d["pattern"])
        except (KeyError, TypeError) as err:
            raise ValueError(f"malformed tokenizer: {err!r}") from None

    def save(self, path):
        with open(path, "w") as f:
            json.dump(self.to_dict(), f, separators=(",", ":"))

    @classmethod
    def load(cls, path):
        try:
            with open(path) as f:
                d = json.load(f)
        except (OSError, UnicodeDecodeError, json.JSONDecodeError) as err:
            raise ValueError(f"cannot read tokenizer {path}: {err}") from None
        return cls.from_dict(d)

    def fingerprint(self):
        """A short hash of the tokenizer's content: two tokenizers that encode alike
        have the same one (used to match a checkpoint with a dataset)."""
        text = json.dumps(self.to_dict(), sort_keys=True, separators=(",", ":"))
        return hashlib.sha256(text.encode()).hexdigest()[:16]

    def __eq__(self, other):
        return isinstance(other, Tokenizer) and self.to_dict() == other.to_dict()


def _joined(parts):
    return np.concatenate(parts) if parts else np.zeros(0, dtype=np.int64)


def _check_merges(merges, vocab_size):
    if vocab_size > MAX_VOCAB:
        raise ValueError(f"vocabulary of {vocab_size} ids does not fit in uint16 shards "
                         f"(at most {MAX_VOCAB})")
    for i, (a, b) in enumerate(merges):
        if not (0 <= a < 256 + i and 0 <= b < 256 + i):
            raise ValueError(f"merge {i} ({a}, {b}) uses a token not yet made")
