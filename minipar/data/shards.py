"""Token shards in llm.c's format: a 1 KiB header, then the tokens as uint16.

    header   256 int32 (little-endian): [0] magic 20240520, [1] version 1,
             [2] the number of tokens N, the rest 0
    body     N uint16 token ids              file size = 1024 + 2·N bytes

uint16 holds ids up to 65,535, enough for GPT-2's 50,257 tokens.  A shard is read by
memory-mapping the body: the bytes stay in the page cache, shared by every process on
the node, and a process reads only the pages of the windows it asks for.

Writing streams the tokens: a header with N = 0 first, the body appended as it comes,
then the true N written over the header and the file renamed into place, so a crash
never leaves a shard that looks complete.
"""
from __future__ import annotations

import os

import numpy as np

MAGIC = 20240520
VERSION = 1
HEADER_INTS = 256
HEADER_BYTES = 4 * HEADER_INTS
TOKEN_DTYPE = np.dtype("<u2")
MAX_TOKEN = 65535


class ShardError(ValueError):
    """A shard that cannot be read as tokens; the message is one line."""


def _header(n_tokens):
    header = np.zeros(HEADER_INTS, dtype="<i4")
    header[:3] = MAGIC, VERSION, n_tokens
    return header.tobytes()


class ShardWriter:
    """Stream tokens into one shard: ``add(tokens)`` any number of times, then ``close()``."""

    def __init__(self, path):
        self.path, self.tmp, self.count = path, f"{path}.tmp-{os.getpid()}", 0
        self.file = open(self.tmp, "wb")
        self.file.write(_header(0))

    def add(self, tokens):
        tokens = np.asarray(tokens)
        if tokens.size and (tokens.min() < 0 or tokens.max() > MAX_TOKEN):
            raise ShardError(f"{self.path}: token {int(tokens.max())} does not fit in uint16")
        self.file.write(tokens.astype(TOKEN_DTYPE).tobytes())
        self.count += int(tokens.size)

    def close(self):
        if self.count >= 2 ** 31:
            raise ShardError(f"{self.path}: {self.count} tokens exceed the int32 header")
        self.file.seek(0)
        self.file.write(_header(self.count))
        self.file.close()
        os.replace(self.tmp, self.path)
        return self.count


def write_shard(path, tokens):
    writer = ShardWriter(path)
    writer.add(tokens)
    return writer.close()


def read_header(path):
    """The number of tokens in shard ``path``; ShardError for a file that is not one
    (wrong magic or version, truncated, or longer than its header says)."""
    try:
        size = os.path.getsize(path)
        with open(path, "rb") as f:
            raw = f.read(HEADER_BYTES)
    except OSError as err:
        raise ShardError(f"shard {path}: cannot read it: {err.strerror or err}") from None
    if len(raw) < HEADER_BYTES:
        raise ShardError(f"shard {path} is {size} bytes, shorter than the {HEADER_BYTES}-byte header")
    magic, version, n = (int(v) for v in np.frombuffer(raw, dtype="<i4")[:3])
    if magic != MAGIC:
        raise ShardError(f"shard {path} has magic {magic}, not {MAGIC}: not an llm.c token shard")
    if version != VERSION:
        raise ShardError(f"shard {path} is version {version}; only version {VERSION} (uint16) is read")
    expected = HEADER_BYTES + 2 * n
    if n < 0 or size != expected:
        what = "truncated" if size < expected else "longer than its header says"
        raise ShardError(f"shard {path} is {what}: {size} bytes, the header's {n} tokens need {expected}")
    return n


def map_tokens(path, n_tokens):
    """The shard's tokens as a read-only memory map (nothing is read until indexed)."""
    return np.memmap(path, dtype=TOKEN_DTYPE, mode="r", offset=HEADER_BYTES, shape=(n_tokens,))


def max_token(path, n_tokens, block=1 << 20):
    """The largest token in the shard, read block by block through short-lived maps (a
    scan of a large file leaves no pages mapped in this process)."""
    top = -1
    for start in range(0, n_tokens, block):
        view = np.memmap(path, dtype=TOKEN_DTYPE, mode="r", offset=HEADER_BYTES + 2 * start,
                         shape=(min(block, n_tokens - start),))
        top = max(top, int(view.max()))
        del view
    return top
