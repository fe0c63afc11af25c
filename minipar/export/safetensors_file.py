"""A ``.safetensors`` file written one tensor at a time.

The format (Hugging Face's, read by ``transformers``, ``safetensors``, vLLM, llama.cpp's
converters) is three parts:

    8 bytes      N, the header's length (unsigned 64-bit little-endian)
    N bytes      JSON: {name: {"dtype": "F32", "shape": [...], "data_offsets": [begin, end]}, ...}
                 (offsets relative to the end of the header; "__metadata__": {str: str})
    the data     every tensor's bytes, little-endian, C order, one after another

So the header needs only names, shapes and dtypes, all known before any value is read: the
writer lays out the offsets first, writes the header, then streams each tensor in as it is
produced and drops it.  At most one tensor is in memory, whatever the model's size (the
``safetensors`` package's ``save_file`` takes every tensor at once).  Written under a
temporary name and renamed: a crash never leaves a half file under the final name.
"""
from __future__ import annotations

import json
import os
import struct

import numpy as np

DTYPES = {np.dtype(np.float64): "F64", np.dtype(np.float32): "F32", np.dtype(np.float16): "F16",
          np.dtype(np.int64): "I64", np.dtype(np.int32): "I32", np.dtype(np.uint8): "U8"}


def header(entries, metadata=None):
    """The header bytes for [(name, shape, dtype)], in that order, padded with spaces
    to a multiple of 8 (so the data starts aligned)."""
    table, offset = {}, 0
    if metadata:
        table["__metadata__"] = {str(k): str(v) for k, v in metadata.items()}
    for name, shape, dtype in entries:
        dtype = np.dtype(dtype)
        if dtype not in DTYPES:
            raise ValueError(f"{name}: dtype {dtype} has no safetensors name")
        size = int(np.prod(shape, dtype=np.int64)) * dtype.itemsize
        table[name] = {"dtype": DTYPES[dtype], "shape": [int(n) for n in shape],
                       "data_offsets": [offset, offset + size]}
        offset += size
    text = json.dumps(table, separators=(",", ":")).encode()
    text += b" " * (-len(text) % 8)
    return struct.pack("<Q", len(text)) + text


def write(path, entries, produce, metadata=None):
    """Write ``path`` from ``entries`` [(name, shape, dtype)] and ``produce(name)``, which
    returns that tensor (called once per name, in order).  Returns the file's size."""
    tmp = f"{path}.tmp-{os.getpid()}"
    try:
        with open(tmp, "wb") as f:
            f.write(header(entries, metadata))
            for name, shape, dtype in entries:
                array = np.ascontiguousarray(produce(name), dtype=np.dtype(dtype).newbyteorder("<"))
                if tuple(array.shape) != tuple(shape):
                    raise ValueError(f"{name}: produced shape {array.shape}, declared {tuple(shape)}")
                f.write(array.tobytes())
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, path)
    except BaseException:
        if os.path.exists(tmp):
            os.remove(tmp)
        raise
    return os.path.getsize(path)


def read(path):
    """{name: array} of a safetensors file (memory-mapped; for tests and small files)."""
    with open(path, "rb") as f:
        (n,) = struct.unpack("<Q", f.read(8))
        table = json.loads(f.read(n))
    names = {v: k for k, v in DTYPES.items()}
    data = np.memmap(path, dtype=np.uint8, mode="r", offset=8 + n)
    out = {}
    for name, entry in table.items():
        if name == "__metadata__":
            continue
        begin, end = entry["data_offsets"]
        out[name] = data[begin:end].view(names[entry["dtype"]].newbyteorder("<")).reshape(entry["shape"])
    return out
