"""Named datasets: ``--data stdlib`` is the standard library cut into BPE tokens.

    stdlib          the stdlib's .py files, tokenized with a STDLIB_VOCAB-token BPE the
                    first time (trained here: 11 s on the 2-core machine at load ~2) and
                    cached: later runs reuse the shards
    stdlib-bytes    the same text, one token per byte (vocabulary 256, no tokenizer)
    anything else   a text file or folder (bytes), or a ``minipar tokenize`` folder

Why tokens by default: a BPE step of the same model costs ~1.3x a byte step and reads
~3.5x more text, and the loss per byte falls faster: the first command's 1,500 steps
end at 1.74 val bits per byte where 1,800 byte steps ended at 2.39
(``benchmarks/first_command.py``, ``benchmarks/first_run.py``).  Bytes stay one flag away.

Where the cache lives: ``$XDG_CACHE_HOME/minipar/tokens`` (``~/.cache/minipar/tokens``),
one folder per (corpus, vocabulary): ``stdlib-4096-<hash>``, the hash over the stdlib's
file names, sizes and modification times, so another Python or an edited stdlib gets
its own folder (delete a folder to rebuild it).  Every rank of a job resolves the name:
the first takes a file lock and builds the folder, the others wait on the lock and then
find it built.  No message between ranks is needed, so a bad cache stops each rank
before the job's first one.
"""
from __future__ import annotations

import contextlib
import hashlib
import os

STDLIB_VOCAB = 4096


def cache_root():
    base = os.environ.get("XDG_CACHE_HOME") or os.path.join(os.path.expanduser("~"), ".cache")
    return os.path.join(base, "minipar", "tokens")


def corpus_key(paths):
    """A short hash of a corpus's files: their names, sizes and modification times."""
    h = hashlib.sha256()
    for path in paths:
        st = os.stat(path)
        h.update(f"{path}\0{st.st_size}\0{st.st_mtime_ns}\n".encode())
    return h.hexdigest()[:12]


@contextlib.contextmanager
def _locked(path):
    """Hold an exclusive lock on ``path`` (made if missing) for the block."""
    import fcntl
    with open(path, "a") as f:
        fcntl.flock(f, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(f, fcntl.LOCK_UN)


# the stdlib's folder per (vocab, root), once found built in this process: walking and
# hashing its ~1,600 files costs ~10 ms, and `plan` resolves thousands of configs (a
# folder of the user's own is hashed every time: it may be edited while a process runs)
_FOUND = {}


def tokenized(source="stdlib", vocab=STDLIB_VOCAB, quiet=False, root=None):
    """The folder of ``source`` (a ``corpus_paths`` name) tokenized at ``vocab``, under
    ``root`` (default ``cache_root()``); built first, under a lock, if not cached."""
    from argparse import Namespace
    from minipar.data import corpus_paths
    from minipar.data.build import SHARD_TOKENS, cached, tokenize
    root = root or cache_root()
    found = _FOUND.get((source, vocab, root))
    if found is not None and os.path.isdir(found):
        return found
    paths = corpus_paths(source)
    name = "stdlib" if source == "stdlib" else os.path.basename(os.path.abspath(source))
    out = os.path.join(root, f"{name}-{vocab}-{corpus_key(paths)}")
    if cached(out) is not None:
        if source == "stdlib":
            _FOUND[(source, vocab, root)] = out
        return out
    os.makedirs(root, exist_ok=True)
    with _locked(out + ".lock"):          # another rank may be building it: wait, then reuse
        if cached(out) is None:
            tokenize(Namespace(data=source, vocab=vocab, out=out, tokenizer=None,
                               val_fraction=0.05, shard_tokens=SHARD_TOKENS,
                               workers=os.cpu_count() or 1, quiet=quiet))
    if source == "stdlib":
        _FOUND[(source, vocab, root)] = out
    return out


def resolve_data(source, quiet=False):
    """The concrete source a ``--data`` name stands for: ``stdlib`` -> its cached token
    folder; anything else unchanged (``stdlib-bytes`` is read by ``load_corpus``)."""
    if source == "stdlib":
        return tokenized("stdlib", STDLIB_VOCAB, quiet=quiet)
    return source
