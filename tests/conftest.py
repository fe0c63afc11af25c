"""The test session's own caches, and the fixtures every test module shares.

Running the suite writes nothing into the user's home.  Before any test module is
imported, every cache and settings folder that minipar or a library it drives would
write under ``~`` points into one folder of this session, removed when it ends; the
commands and ``mpiexec`` ranks the tests start inherit it.  Set ``MINIPAR_TEST_CACHE=DIR``
to keep that folder between sessions instead (the tokenized stdlib, ~30 s to build, and
the CPU emulator's programs are then built once).
"""
import os
import shutil
import tempfile

import pytest

SESSION_FOLDERS = {   # variable -> its folder inside the session's one
    "XDG_CACHE_HOME": "cache",          # minipar's tokenized corpora (data/named.py); matplotlib's fonts
    "MINIPAR_CACHE": "cache/minipar",   # the CPU emulator's programs (kernels/emulator)
    "XDG_CONFIG_HOME": "config",        # matplotlib's settings
    "XDG_DATA_HOME": "data",            # Jupyter's connection files (the lessons' kernels)
    "IPYTHONDIR": "ipython",            # the lessons' kernels' IPython profile and history
    "CUPY_CACHE_DIR": "cupy",           # CuPy's compiled kernels, where a GPU runs the tests
}
_session = {"made": None, "before": {}}


def pytest_configure(config):
    root = os.environ.get("MINIPAR_TEST_CACHE")
    if not root:
        root = _session["made"] = tempfile.mkdtemp(prefix="minipar-tests-")
    for variable, folder in SESSION_FOLDERS.items():
        _session["before"][variable] = os.environ.get(variable)
        path = os.environ[variable] = os.path.join(os.path.abspath(root), folder)
        os.makedirs(path, exist_ok=True)     # IPython takes a missing one for unwritable


def pytest_unconfigure(config):
    for variable, value in _session["before"].items():
        if value is None:
            os.environ.pop(variable, None)
        else:
            os.environ[variable] = value
    if _session["made"]:
        shutil.rmtree(_session["made"], ignore_errors=True)


@pytest.fixture(scope="session", autouse=True)
def tokenized_stdlib():
    """The default ``--data stdlib`` is the standard library in BPE tokens, built once into
    the cache (minipar/data/named.py): built before the first test, so no test with a
    short timeout pays the ~30 s of a first tokenization."""
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
