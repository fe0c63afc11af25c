"""``python -m minipar tokenize --data stdlib|PATH --vocab V --out DIR``: a corpus -> shards.

    1. the documents: the standard library's .py files, a folder's files, or one file
    2. the split: the last ``val_fraction`` of the corpus's bytes (joined as ``train``
       joins them for bytes, so the validation text is the same whatever the tokenizer)
    3. the tokenizer: learned from the training documents (or ``--tokenizer FILE``)
    4. encoding: every document, in parallel worker processes, <|endoftext|> before each
    5. DIR/train_000000.bin ..., DIR/val_000000.bin (llm.c format, ``data/shards.py``),
       DIR/tokenizer.json, and DIR/manifest.json written last: its presence says "done"

The manifest carries a fingerprint of the inputs (files with sizes and times, vocabulary,
tokenizer, split); a re-run with the same fingerprint and intact shards does nothing.
"""
from __future__ import annotations

import argparse
import contextlib
import hashlib
import json
import multiprocessing
import os
import re
import sys
import time

import numpy as np

from minipar.cli_checks import OneLineParser

from minipar.data.tokens import FORMAT, MANIFEST, TOKENIZER_FILE

SHARD_TOKENS = 100_000_000        # llm.c's shard size


class TokenizeError(ValueError):
    """A bad input or flag of ``tokenize``; the message is one line."""


def document_paths(source):
    from minipar.data import corpus_paths
    try:
        return corpus_paths(source)
    except FileNotFoundError as err:
        raise TokenizeError(f"--data {err}") from None


def fingerprint(paths, args, tokenizer_text):
    h = hashlib.sha256(json.dumps([FORMAT, args.data, args.vocab, args.val_fraction,
                                   args.shard_tokens]).encode())
    for path in paths:
        st = os.stat(path)
        h.update(f"{path}\0{st.st_size}\0{st.st_mtime_ns}\n".encode())
    h.update(tokenizer_text or b"")
    return h.hexdigest()[:24]


def cached(out, fp=None):
    """The manifest of DIR if it is complete (and has fingerprint ``fp``), else None."""
    from minipar.data.shards import HEADER_BYTES
    try:
        with open(os.path.join(out, MANIFEST)) as f:
            manifest = json.load(f)
    except (OSError, ValueError):
        return None
    if fp is not None and manifest.get("fingerprint") != fp:
        return None
    for shard in manifest.get("train", []) + manifest.get("val", []):
        path = os.path.join(out, shard["file"])
        if not os.path.isfile(path) or os.path.getsize(path) != HEADER_BYTES + 2 * shard["tokens"]:
            return None
    return manifest


def remove_previous(out):
    """Before writing: the old manifest first (no reader may pair it with new shards),
    then the old shards, so a dataset of fewer shards leaves none behind."""
    os.makedirs(out, exist_ok=True)
    for name in [MANIFEST] + sorted(os.listdir(out)):
        if name == MANIFEST or re.fullmatch(r"(train|val)_\d{6}\.bin", name):
            try:
                os.remove(os.path.join(out, name))
            except FileNotFoundError:
                pass


def split_documents(documents, val_fraction):
    """(train documents, validation documents) at the byte where the byte-level corpus
    (documents joined by a blank line) starts its last ``val_fraction``; a document cut
    in two is cut at a character boundary."""
    total = sum(len(d) for d in documents) + 2 * max(len(documents) - 1, 0)
    cut = total - int(total * val_fraction)
    pos = 0
    for i, doc in enumerate(documents):
        if cut <= pos + len(doc):
            at = cut - pos
            while 0 < at < len(doc) and doc[at] & 0xC0 == 0x80:   # inside a character
                at += 1
            return _nonempty(documents[:i] + [doc[:at]]), _nonempty([doc[at:]] + documents[i + 1:])
        pos += len(doc) + 2
        if cut < pos:                     # the cut falls in the blank line after doc i
            return _nonempty(documents[:i + 1]), _nonempty(documents[i + 1:])
    return _nonempty(documents), []


def _nonempty(documents):
    return [d for d in documents if d]


# ---------------------------------------------------------------- worker processes
_WORK = {}          # set before the pool forks: the workers inherit the documents


def _count(indices):
    from minipar.tokenizer.split import count_chunks
    return count_chunks(_WORK["docs"][i] for i in indices)


def _encode(i):
    tok = _WORK["tokenizer"]
    ids = tok.encode_bytes(_WORK["docs"][i])
    return np.concatenate([[tok.eot], ids]).astype(np.uint16), len(_WORK["docs"][i])


@contextlib.contextmanager
def _mapper(workers):
    """``imap(fn, items)`` over ``workers`` forked processes, in order (or here, for 1)."""
    if workers == 1:
        yield map
        return
    with multiprocessing.get_context("fork").Pool(workers) as pool:
        yield lambda fn, items: pool.imap(fn, items, chunksize=4)


def learn(docs, vocab, workers, quiet):
    from collections import Counter
    from minipar.observe.progress import progress
    from minipar.tokenizer import train_tokenizer
    _WORK["docs"] = docs
    batches = [list(range(i, len(docs), workers * 8)) for i in range(workers * 8)]
    counts = Counter()
    with _mapper(workers) as imap:
        for part in imap(_count, batches):
            counts.update(part)
    bar = None if quiet else progress(total=vocab - 1, initial=256, desc="merges", unit="tok")
    tok = train_tokenizer(counts, vocab, progress=(lambda k: bar.update(1)) if bar else None)
    if bar:
        bar.close()
    return tok


def encode_split(name, docs, tok, out, workers, shard_tokens, bar):
    """Encode ``docs`` into ``out/{name}_000000.bin`` and on; returns the shard list."""
    from minipar.data.shards import ShardWriter
    _WORK.update(docs=docs, tokenizer=tok)
    shards, writer = [], None
    with _mapper(workers) as imap:
        for ids, n_bytes in imap(_encode, range(len(docs))):
            while ids.size:
                if writer is None:
                    writer = ShardWriter(os.path.join(out, f"{name}_{len(shards):06d}.bin"))
                take = min(ids.size, shard_tokens - writer.count)
                writer.add(ids[:take])
                ids = ids[take:]
                if writer.count == shard_tokens:
                    shards.append({"file": os.path.basename(writer.path), "tokens": writer.close()})
                    writer = None
            if bar:
                bar.update(n_bytes)
    if writer is not None:
        shards.append({"file": os.path.basename(writer.path), "tokens": writer.close()})
    return shards


def tokenize(args):
    """Build (or find cached) the tokenized dataset of ``args``; returns its manifest."""
    from minipar.data.shards import HEADER_INTS, MAGIC, VERSION
    from minipar.observe.progress import progress
    from minipar.tokenizer import Tokenizer
    paths = document_paths(args.data)
    tokenizer_text = tok = None
    if args.tokenizer:
        try:
            with open(args.tokenizer, "rb") as f:
                tokenizer_text = f.read()
            tok = Tokenizer.from_dict(json.loads(tokenizer_text))
        except OSError as err:
            raise TokenizeError(f"--tokenizer {args.tokenizer}: {err.strerror or err}") from None
        except ValueError as err:          # JSON, UTF-8 or the tokenizer's own checks
            raise TokenizeError(f"--tokenizer {args.tokenizer}: {err}") from None
    fp = fingerprint(paths, args, tokenizer_text)
    manifest = cached(args.out, fp=fp)
    if manifest is not None:
        if not args.quiet:
            print(f"tokenize: {args.out} is up to date ({manifest['train_tokens']:,} training "
                  f"tokens, vocabulary {manifest['vocab_size']}); nothing to do", flush=True)
        return manifest
    t0 = time.perf_counter()
    docs = []
    for path in paths:
        try:
            with open(path, "rb") as f:
                docs.append(f.read())
        except OSError as err:
            raise TokenizeError(f"--data {args.data!r}: cannot read {path}: {err.strerror or err}") from None
    train_docs, val_docs = split_documents(docs, args.val_fraction)
    if not train_docs or not val_docs:
        raise TokenizeError(f"--data {args.data!r} holds {sum(map(len, docs))} bytes in "
                            f"{len(docs)} files: too little for a training and a validation split")
    if tok is None:
        tok = learn(train_docs, args.vocab, args.workers, args.quiet)
    remove_previous(args.out)
    bar = None if args.quiet else progress(total=sum(map(len, docs)), desc="encode", unit="B",
                                           unit_scale=True)
    train = encode_split("train", train_docs, tok, args.out, args.workers, args.shard_tokens, bar)
    val = encode_split("val", val_docs, tok, args.out, args.workers, args.shard_tokens, bar)
    if bar:
        bar.close()
    tok.save(os.path.join(args.out, TOKENIZER_FILE))
    val_bytes = sum(map(len, val_docs))
    manifest = {
        "format": FORMAT, "fingerprint": fp, "source": args.data, "documents": len(docs),
        "vocab_size": tok.vocab_size, "tokenizer": TOKENIZER_FILE,
        "tokenizer_fingerprint": tok.fingerprint(), "eot": tok.eot,
        "train": train, "val": val,
        "train_tokens": sum(s["tokens"] for s in train), "val_tokens": sum(s["tokens"] for s in val),
        "train_bytes": sum(map(len, train_docs)), "val_bytes": val_bytes,
        "shard_format": {"magic": MAGIC, "version": VERSION, "header_int32": HEADER_INTS,
                         "dtype": "uint16"},
        "seconds": round(time.perf_counter() - t0, 2)}
    manifest["val_bytes_per_token"] = val_bytes / manifest["val_tokens"]
    tmp = os.path.join(args.out, MANIFEST + ".tmp")
    with open(tmp, "w") as f:
        json.dump(manifest, f, indent=1)
    os.replace(tmp, os.path.join(args.out, MANIFEST))
    if not args.quiet:
        print(f"tokenize: {manifest['train_tokens']:,} training and {manifest['val_tokens']:,} "
              f"validation tokens, vocabulary {tok.vocab_size}, "
              f"{manifest['train_bytes'] / manifest['train_tokens']:.2f} bytes/token, in "
              f"{manifest['seconds']:.1f} s -> {args.out}", flush=True)
    return manifest


def build_parser():
    p = OneLineParser(prog="python -m minipar tokenize", description=__doc__,
                      formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--data", default="stdlib", help="'stdlib', a text file or a folder")
    p.add_argument("--vocab", type=int, default=4096, help="vocabulary size (bytes + merges + "
                   "<|endoftext|>), at most 65535; --tokenizer brings its own")
    p.add_argument("--out", required=True, help="folder for the shards and the manifest")
    p.add_argument("--tokenizer", help="a tokenizer.json to use instead of training one")
    p.add_argument("--val-fraction", type=float, default=0.05,
                   help="the corpus's last share of bytes for validation (default 0.05, as train)")
    p.add_argument("--shard-tokens", type=int, default=SHARD_TOKENS,
                   help=f"tokens per shard (default {SHARD_TOKENS:,}, as llm.c)")
    p.add_argument("--workers", type=int, default=os.cpu_count() or 1,
                   help="encoding processes (default: one per core)")
    p.add_argument("--quiet", action="store_true")
    return p


def check_args(args):
    from minipar.tokenizer import MAX_VOCAB
    if not 257 <= args.vocab <= MAX_VOCAB:
        raise TokenizeError(f"--vocab must be in [257, {MAX_VOCAB}], got {args.vocab}")
    if not 0 < args.val_fraction < 1:
        raise TokenizeError(f"--val-fraction must be in (0, 1), got {args.val_fraction}")
    if args.shard_tokens < 1 or args.workers < 1:
        raise TokenizeError("--shard-tokens and --workers must be >= 1")
    if os.path.exists(args.out) and not os.path.isdir(args.out):
        raise TokenizeError(f"--out {args.out} exists and is not a folder")
    from minipar.data import corpus_bytes
    from minipar.paths import PathError, probe_output_dir
    document_paths(args.data)            # a missing --data is refused before --out is made
    try:        # room for the shards: 2 bytes a token, at most a token a byte of text
        probe_output_dir(args.out, need_bytes=2 * corpus_bytes(args.data))
    except PathError as err:
        raise TokenizeError(f"--out {args.out}: {err}") from None


def main(argv=None):
    args = build_parser().parse_args(argv)
    try:
        check_args(args)
        tokenize(args)
    except TokenizeError as err:
        sys.stderr.write(f"minipar tokenize: {err}\n")
        return 2
    return 0
