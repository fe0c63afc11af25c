"""The default ``--data stdlib`` is the standard library in BPE tokens, built once per
machine into the user's cache (minipar/data/named.py).  Build it before the first test, so
no test with a short timeout pays the ~30 s of a first tokenization."""
import pytest


@pytest.fixture(scope="session", autouse=True)
def tokenized_stdlib():
    from minipar.data.named import resolve_data
    resolve_data("stdlib", quiet=True)


@pytest.fixture
def fp64():
    """Arrays minipar creates default to float64 while the test runs (gradient checks and
    parity to 1e-12 need it); the previous default comes back after."""
    import numpy as np
    from minipar import backend
    previous = backend.default_dtype()
    backend.set_default_dtype(np.float64)
    yield
    backend.set_default_dtype(previous)
