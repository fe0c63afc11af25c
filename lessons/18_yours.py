"""Lesson 18's exercise on every rank: your parallel tokenization.

    mpiexec -n 2 python lessons/18_yours.py --file MINE.py [--tokenizer TOKENIZER.json]

``MINE.py`` defines ``my_tokenize(comm, paths, tokenizer, out)``.  The corpus is 18 small
files of the standard library; rank r of p owns the files whose first byte, in the files
laid one after another (T bytes), falls in [r·T/p, (r+1)·T/p).  Your function encodes its
files, writes them as shard ``out/train_{r:06d}.bin`` and rank 0 writes ``out/index.json``
once it knows every rank's count.  Checked on every rank:

- **reads**: the rank opened exactly its own files (Python's audit hook ``open`` reports
  every file a process opens, ``sys.addaudithook``), never another rank's;
- **writes**: every file was written under another name and renamed into place;
- **tokens**: the rank's shard equals, token for token, minipar's one-process encoding
  (``minipar.data.build.encode_split``, <|endoftext|> before each file) of its files;
- **index**: rank 0's index lists the ranks' shards in rank order with their counts, and
  read through minipar's ``Shards`` they are minipar's token sequence, byte for byte.

Without ``--tokenizer`` the ranks learn 200 merges from the corpus first.
"""
import json
import os
import shutil
import sys

try:
    import minipar  # noqa: F401
except ImportError:  # run from a checkout without installing: use the repository root
    sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

import numpy as np

from minipar.comm import barrier
from minipar.data import stdlib_files
from minipar.data.build import encode_split
from minipar.data.shards import ShardError, map_tokens, read_header
from minipar.data.tokens import Shards
from minipar.tokenizer import Tokenizer, count_chunks, learn_merges
from yours import main

FILES, MAX_FILE_BYTES = 18, 12_000


def corpus():
    """The exercise's files, in order: the standard library's first small ones."""
    return [p for p in stdlib_files() if os.path.getsize(p) < MAX_FILE_BYTES][:FILES]


def shares(paths, p):
    """owner[i]: the rank whose byte range holds file i's first byte; and first[i]."""
    sizes = np.array([os.path.getsize(path) for path in paths], dtype=np.int64)
    first = np.cumsum(sizes) - sizes
    return first * p // sizes.sum(), first


class FileLog:
    """Every file opened, and every rename, while ``recording``: an audit hook."""

    def __init__(self):
        self.recording, self.opened, self.written, self.renamed = False, [], [], []
        sys.addaudithook(self.hook)

    def hook(self, event, args):
        if not self.recording or not isinstance(args[0], (str, bytes, os.PathLike)):
            return
        if event == "open":
            path, flags = os.path.realpath(os.fsdecode(args[0])), args[2]
            (self.written if flags & (os.O_WRONLY | os.O_RDWR) else self.opened).append(path)
        elif event == "os.rename":
            self.renamed.append(os.path.realpath(os.fsdecode(args[1])))


def read(path):
    with open(path, "rb") as f:
        return f.read()


def body(path):
    return np.asarray(map_tokens(path, read_header(path)))


def check_reads(r, paths, owner, first, log):
    name = {os.path.realpath(path): i for i, path in enumerate(paths)}
    mine = {i for i in range(len(paths)) if owner[i] == r}
    opened = {name[p] for p in log.opened if p in name}
    if opened - mine:
        i = min(opened - mine)
        raise AssertionError(f"opened {os.path.basename(paths[i])} (file {i}, corpus bytes from {first[i]}), "
                             f"rank {owner[i]}'s file: a rank reads only the files that start in its share")
    if mine - opened:
        i = min(mine - opened)
        raise AssertionError(f"never opened {os.path.basename(paths[i])} (file {i}), one of its own files")


def check_writes(r, out, log):
    for path in (os.path.join(out, f"train_{r:06d}.bin"),) + ((os.path.join(out, "index.json"),) if r == 0 else ()):
        path = os.path.realpath(path)
        if not os.path.exists(path):
            raise AssertionError(f"wrote no {os.path.basename(path)} in {out}")
        if path in log.written or path not in log.renamed:
            raise AssertionError(f"wrote {os.path.basename(path)} in place: write another name and rename it, "
                                 f"so no reader ever sees half a file")


def check_tokens(r, paths, owner, out, reference, eot):
    docs = np.split(reference, np.flatnonzero(reference == eot)[1:])     # each file's tokens, eot first
    want = np.concatenate([docs[i] for i in range(len(paths)) if owner[i] == r] or [np.zeros(0, np.uint16)])
    name = f"train_{r:06d}.bin"
    try:
        got = body(os.path.join(out, name))
    except ShardError as err:
        raise AssertionError(str(err)) from None
    n = min(got.size, want.size)
    differ = np.flatnonzero(got[:n] != want[:n])
    if differ.size:
        j = int(differ[0])
        starts = np.flatnonzero(want[:j + 1] == eot)                 # where each of its files begins
        file = [i for i in range(len(paths)) if owner[i] == r][starts.size - 1]
        what = " (<|endoftext|>)" if want[j] == eot else ""
        raise AssertionError(f"{name}: token {j} is {got[j]}, minipar's is {want[j]}{what}: token {j - starts[-1]} "
                             f"of {os.path.basename(paths[file])} (token 0 is the <|endoftext|> before it)")
    if got.size != want.size:
        raise AssertionError(f"{name} holds {got.size} tokens, minipar's encoding of this rank's files "
                             f"{want.size} (the first {n} agree)")


def check_index(p, out, vocab_size, reference):
    try:
        with open(os.path.join(out, "index.json")) as f:
            entries = json.load(f)["train"]
        want = [{"file": f"train_{s:06d}.bin", "tokens": read_header(os.path.join(out, f"train_{s:06d}.bin"))}
                for s in range(p)]
    except (OSError, ValueError, KeyError, TypeError) as err:
        raise AssertionError(f"index.json: {err}") from None
    if entries != want:
        raise AssertionError(f"index.json lists {entries}; every rank's shard in rank order: {want}")
    together = Shards(out, entries, vocab_size).windows([0], len(reference))[0]
    assert together.astype("<u2").tobytes() == reference.tobytes(), \
        "the shards of the index, one after another, are not minipar's token sequence"


def minipar_tokens(comm, paths, tok, out):
    """A fresh folder ``out`` for your shards, and beside it minipar's one-process encoding of
    the files as one shard (rank 0 writes it); its tokens."""
    reference = os.path.join(os.path.dirname(out), "minipar_one_process")
    if comm.rank == 0:
        for folder in (out, reference):
            shutil.rmtree(folder, ignore_errors=True)
            os.makedirs(folder)
        encode_split("train", [read(path) for path in paths], tok, reference, 1, 10 ** 9, None)
    barrier(comm)
    return body(os.path.join(reference, "train_000000.bin"))


def check(comm, my_tokenize, tokenizer_path):
    p, r = comm.size, comm.rank
    assert not tokenizer_path or os.path.isfile(tokenizer_path), f"--tokenizer {tokenizer_path}: no such file"
    out = os.path.join(os.path.dirname(my_tokenize.__code__.co_filename), "shards")   # beside your file
    paths = corpus()
    owner, first = shares(paths, p)
    if tokenizer_path:
        tok = Tokenizer.load(tokenizer_path)
    else:
        tok = Tokenizer(learn_merges(count_chunks(map(read, paths)), 200))
    reference = minipar_tokens(comm, paths, tok, out)
    log = FileLog()
    log.recording = True
    my_tokenize(comm, list(paths), tok, out)
    log.recording = False
    barrier(comm)
    check_reads(r, paths, owner, first, log)
    check_writes(r, out, log)
    check_tokens(r, paths, owner, out, reference, tok.eot)
    if r == 0:
        check_index(p, out, tok.vocab_size, reference)
    barrier(comm)
    if r == 0:
        sizes = [os.path.getsize(path) for path in paths]
        each = "; ".join(f"rank {s}: {int(np.sum(owner == s))} files, {sum(np.where(owner == s, sizes, 0)):,} bytes"
                         for s in range(p))
        print(f"{p} ranks tokenized {len(paths)} files ({sum(sizes):,} bytes) reading only their own ({each}); "
              f"their shards are minipar's one-process tokens, and the index joins them into its "
              f"{len(reference):,}-token sequence byte for byte", flush=True)


if __name__ == "__main__":
    main(__doc__, check, "my_tokenize",
         ("--tokenizer", "a tokenizer.json; default: 200 merges learned here (optional)"))
