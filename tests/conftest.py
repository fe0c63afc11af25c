"""The default ``--data stdlib`` is the standard library in BPE tokens, built once per
machine into the user's cache (minipar/data/named.py).  Build it before the first test, so
no test with a short timeout pays the ~30 s of a first tokenization."""
import pytest


@pytest.fixture(scope="session", autouse=True)
def tokenized_stdlib():
    from minipar.data.named import resolve_data
    resolve_data("stdlib", quiet=True)
