"""``--data stdlib`` is the stdlib's BPE shards, built once and cached; ``stdlib-bytes`` the bytes.

The cache is exercised on a small folder (the stdlib itself takes ~30 s to tokenize, paid
once per machine by tests/conftest.py): built the first time, reused the second, rebuilt
under another key when a file changes, and built once when two processes ask at once.
"""
import os
import subprocess
import sys

import pytest

from minipar.config import TrainConfig, preflight
from minipar.data.named import STDLIB_VOCAB, cache_root, resolve_data, tokenized
from minipar.data.tokens import read_manifest

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


@pytest.fixture
def corpus(tmp_path):
    folder = tmp_path / "corpus"
    folder.mkdir()
    for i in range(6):
        (folder / f"m{i}.py").write_text("".join(f"def f{i}_{k}(x):\n    return x + {k}\n\n"
                                                 for k in range(60)))
    return folder


def test_built_once_then_reused(corpus, tmp_path):
    root = tmp_path / "cache"
    out = tokenized(str(corpus), 300, quiet=True, root=str(root))
    assert read_manifest(out)["vocab_size"] == 300
    stamp = os.stat(os.path.join(out, "manifest.json")).st_mtime_ns
    assert tokenized(str(corpus), 300, quiet=True, root=str(root)) == out
    assert os.stat(os.path.join(out, "manifest.json")).st_mtime_ns == stamp     # not rebuilt
    assert tokenized(str(corpus), 280, quiet=True, root=str(root)) != out       # vocabulary in the key
    (corpus / "m0.py").write_text("def changed():\n    pass\n" * 50)
    changed = tokenized(str(corpus), 300, quiet=True, root=str(root))
    assert changed != out and read_manifest(changed)["train_bytes"] != read_manifest(out)["train_bytes"]


def test_two_processes_at_once_build_one_folder(corpus, tmp_path):
    """As two ranks of a job do: one builds under the lock, the other waits and reuses."""
    root = str(tmp_path / "cache")
    code = ("import sys; from minipar.data.named import tokenized; "
            f"print(tokenized({str(corpus)!r}, 300, root={root!r}))")
    procs = [subprocess.Popen([sys.executable, "-c", code], stdout=subprocess.PIPE, text=True,
                              env=dict(os.environ, PYTHONPATH=ROOT)) for _ in range(2)]
    outputs = [p.communicate(timeout=120)[0] for p in procs]
    assert [p.returncode for p in procs] == [0, 0]
    lines = [o.strip().splitlines() for o in outputs]
    a, b = lines[0][-1], lines[1][-1]
    assert a == b and read_manifest(a)["vocab_size"] == 300
    assert sum("tokenize:" in line for o in lines for line in o) == 1     # built once
    assert sorted(os.listdir(root)) == sorted([os.path.basename(a), os.path.basename(a) + ".lock"])


def test_names_resolve():
    assert resolve_data("stdlib-bytes") == "stdlib-bytes"
    assert preflight(TrainConfig(data="stdlib-bytes")).vocab_size == 256
    config = preflight(TrainConfig())                     # the default: the cached BPE stdlib
    assert config.data.startswith(cache_root()) and config.vocab_size == STDLIB_VOCAB
    assert read_manifest(config.data)["source"] == "stdlib"
