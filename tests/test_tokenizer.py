"""Byte-level BPE: incremental training against a recount-everything reference, the
compiled encoder against merges applied one by one, exact round trips, files."""
import json
from collections import Counter

import numpy as np
import pytest
from hypothesis import given, settings, strategies as st

from minipar.tokenizer import Tokenizer, count_chunks, split_text, train_tokenizer

TEXT = ("def add(a, b):\n    return a + b\n\n\nclass Point:\n    def __init__(self, x, y):\n"
        "        self.x = x  # café, naïve, 東京\n        self.y = y\n\n") * 3 + \
    "x = 12345 + 0.5e-3  # numbers\nprint('hello world', \"it's\")\n\t\r\n  \n"
DOCS = [TEXT.encode(), b"caf\xe9 latin-1 bytes \xff\xfe, not UTF-8", b"   \n\n   spaces", b"x"]


def merged(tokens, a, b, new):
    """Every (a, b), left to right and not overlapping, replaced by ``new``: a token that
    follows an unconsumed ``a`` joins it (``new`` is never ``a``, so a consumed pair is
    never joined again — (a, a, a) becomes (new, a))."""
    out = []
    for token in tokens:
        if out and out[-1] == a and token == b:
            out[-1] = new
        else:
            out.append(token)
    return out


def test_the_references_merge():
    assert merged([1, 1, 1], 1, 1, 9) == [9, 1] and merged([1, 1, 1, 1], 1, 1, 9) == [9, 9]
    assert merged([1, 2, 1, 2, 2], 1, 2, 9) == [9, 9, 2] and merged([2, 1], 1, 2, 9) == [2, 1]


def reference_merges(chunk_counts, n_merges):
    """BPE the slow way: recount every pair of every chunk before each merge."""
    words = {bytes(c): list(c) for c in chunk_counts}
    merges = []
    for k in range(n_merges):
        counts = Counter()
        for chunk, word in words.items():
            for pair in zip(word, word[1:]):
                counts[pair] += chunk_counts[chunk]
        if not counts:
            break
        best = max(counts.values())
        pair = min(p for p, c in counts.items() if c == best)    # ties: the smallest pair
        merges.append(pair)
        words = {c: merged(w, *pair, 256 + k) for c, w in words.items()}
    return merges


def reference_encode(merges, data):
    """Each merge, in rank order, applied to the chunk's tokens."""
    out = []
    for chunk in split_text(data.decode("utf-8", "surrogateescape")):
        tokens = list(chunk.encode("utf-8", "surrogateescape"))
        for rank, (a, b) in enumerate(merges):
            tokens = merged(tokens, a, b, 256 + rank)
        out += tokens
    return out


@pytest.fixture(scope="module")
def tok():
    return train_tokenizer(count_chunks(DOCS), vocab_size=340)


def test_split_joins_back_and_keeps_words_whole():
    chunks = split_text("    def f(x):\n        return x12345")
    assert "".join(chunks) == "    def f(x):\n        return x12345"
    assert " def" in chunks and " return" in chunks and "12345" not in chunks


def test_incremental_merges_equal_the_recounting_reference():
    counts = count_chunks(DOCS)
    assert train_tokenizer(counts, vocab_size=300).merges == reference_merges(counts, 300 - 257)


def test_compiled_encoding_equals_merges_applied_in_order(tok):
    for doc in DOCS:
        assert tok.encode_bytes(doc).tolist() == reference_encode(tok.merges, doc)
    assert len(tok.encode(TEXT)) < len(TEXT.encode()) / 2      # the merges do compress


def test_round_trip_of_text_and_of_bytes_that_are_not_utf8(tok):
    for doc in DOCS:
        assert tok.decode_bytes(tok.encode_bytes(doc)) == doc
    assert tok.decode(tok.encode(TEXT)) == TEXT
    assert tok.decode(tok.encode("")) == "" and tok.encode("").size == 0
    assert tok.decode(tok.encode("lone \ud800 surrogate")) == "lone \ud800 surrogate"


@settings(max_examples=300, deadline=None)
@given(st.text(alphabet=st.characters(codec=None)))
def test_round_trip_of_any_unicode(tok, text):
    ids = tok.encode(text)
    assert tok.decode(ids) == text
    assert ids.min(initial=0) >= 0 and ids.max(initial=0) < tok.eot    # never a special token


def test_special_tokens_only_when_allowed(tok):
    text = "a<|endoftext|>b"
    plain, special = tok.encode(text), tok.encode(text, allowed_special=True)
    assert tok.eot not in plain.tolist() and tok.decode(plain) == text
    assert special.tolist().count(tok.eot) == 1 and tok.decode(special) == text
    assert tok.vocab_size == 340 and tok.eot == 339


def test_save_load_and_fingerprint(tok, tmp_path):
    path = tmp_path / "tok.json"
    tok.save(path)
    again = Tokenizer.load(path)
    assert again == tok and again.fingerprint() == tok.fingerprint()
    assert again.encode(TEXT).tolist() == tok.encode(TEXT).tolist()
    other = train_tokenizer(count_chunks(DOCS), vocab_size=300)
    assert other.fingerprint() != tok.fingerprint()
    path.write_text(json.dumps({"format": "something else"}))
    with pytest.raises(ValueError, match="not a minipar-bpe-1 tokenizer"):
        Tokenizer.load(path)
    d = tok.to_dict()
    d["merges"][3] = [999, 1]
    with pytest.raises(ValueError, match="merge 3"):
        Tokenizer.from_dict(d)


def test_vocabulary_bounds():
    with pytest.raises(ValueError, match="vocabulary"):
        train_tokenizer(Counter({b"ab": 1}), vocab_size=100)
    with pytest.raises(ValueError, match="vocabulary"):
        train_tokenizer(Counter({b"ab": 1}), vocab_size=70_000)
    tiny = train_tokenizer(Counter({b"ab": 3}), vocab_size=1000)   # runs out of pairs
    assert tiny.merges == [(97, 98)] and tiny.vocab_size == 258
    assert np.array_equal(tiny.encode("abab"), [256, 256])
