"""Reading a sharded checkpoint: any box of any tensor, from memory-mapped rank files.

    ckpt = open_checkpoint(DIR)          DIR: the --save directory (its ``latest``) or a
                                         step directory; reads index.json only
    ckpt.meta                            step, model, seed, precision, tokenizer, ...
    ckpt.names(kind="param")             the tensors of one kind (param, adam_m, adam_v, hook)
    ckpt.read(kind, name, box)           the elements of one global box, read from the
                                         pieces it intersects (``boxes.intersect``) and
                                         nothing else: a reshard never gathers
    ckpt.tensor(name, kind="param")      one whole tensor (sample, consolidate, exporters)

Files are opened as ``np.memmap`` once and sliced, so a read touches only the pages of
the bytes it copies.
"""
from __future__ import annotations

import os
from collections.abc import Mapping

import numpy as np

from minipar.checkpoint import layout
from minipar.checkpoint.boxes import intersect, relative, size

KINDS = ("param", "adam_m", "adam_v", "hook", "moe_bias")


class Checkpoint:
    def __init__(self, path):
        self.path = path
        self.index = layout.read_index(path)
        self.meta = self.index["meta"]
        self.tensors = self.index["tensors"]
        self._maps = {}

    def names(self, kind="param"):
        return [t["name"] for t in self.tensors.values() if t["kind"] == kind]

    def entry(self, kind, name):
        try:
            return self.tensors[f"{kind}/{name}"]
        except KeyError:
            raise ValueError(f"the checkpoint has no {kind} {name!r}") from None

    def shape(self, kind, name):
        return tuple(self.entry(kind, name)["shape"])

    def dtype(self, kind, name):
        return np.dtype(self.entry(kind, name)["dtype"])

    def _file(self, file):
        if file not in self._maps:
            path = os.path.join(self.path, file)
            self._maps[file] = np.memmap(path, dtype=np.uint8, mode="r") \
                if os.path.getsize(path) else np.zeros(0, np.uint8)
        return self._maps[file]

    def piece_values(self, piece, dtype):
        """The saved values of one piece, a read-only view of its file (no copy)."""
        lengths = tuple(piece["box"][1])
        n = int(np.prod(lengths)) * dtype.itemsize
        raw = self._file(piece["file"])[piece["offset"]:piece["offset"] + n]
        if raw.size != n:
            raise ValueError(f"checkpoint {self.path}: {piece['file']} is truncated")
        return raw.view(dtype).reshape(lengths)

    def read(self, kind, name, box):
        """A new array holding box ``box`` = (offsets, lengths) of the global tensor."""
        t = self.entry(kind, name)
        dtype = np.dtype(t["dtype"])
        box = (tuple(box[0]), tuple(box[1]))
        out = np.empty(box[1], dtype=dtype)
        covered = 0
        for piece in t["pieces"]:
            saved = (tuple(piece["box"][0]), tuple(piece["box"][1]))
            common = intersect(box, saved)
            if common is not None:
                out[relative(common, box)] = self.piece_values(piece, dtype)[relative(common, saved)]
                covered += size(common)
        if covered != size(box):
            raise ValueError(f"checkpoint {self.path}: {kind} {name} box {box} is not "
                             "covered by its pieces")
        return out

    def tensor(self, name, kind="param"):
        """The whole tensor ``name`` (one tensor in memory, whatever the model's size)."""
        shape = self.shape(kind, name)
        return self.read(kind, name, ((0,) * len(shape), shape))

    def tensors_of(self, kind="param"):
        """{name: tensor} of one kind, each read only when looked up (a lazy mapping):
        ``model.load_state_dict(ckpt.tensors_of("param"))`` holds one extra tensor at a time."""
        return _Lazy(self, kind)

    def nonfinite(self, kind="param", block=1 << 22):
        """The first tensor of ``kind`` with an inf or nan, or None: every piece is
        scanned in blocks of ``block`` elements (no tensor is held whole)."""
        for t in self.tensors.values():
            if t["kind"] != kind or np.dtype(t["dtype"]).kind != "f":
                continue
            for piece in t["pieces"]:
                flat = self.piece_values(piece, np.dtype(t["dtype"])).reshape(-1)
                for i in range(0, flat.size, block):
                    if not np.isfinite(flat[i:i + block]).all():
                        return t["name"]
        return None

    def close(self):
        self._maps.clear()


def open_checkpoint(directory):
    """The checkpoint ``--resume directory`` means (``layout.resolve``), index read."""
    return Checkpoint(layout.resolve(directory))


def load_full(directory):
    """(params, optimizer state, meta) as whole arrays by name — the whole model in
    memory, for tests and small tools; training and ``sample`` read piece by piece.
    state: {"step", "m": {name: array}, "v": {...}, "hook": {rank: {key: array}}}."""
    ckpt = open_checkpoint(directory)
    params = {n: ckpt.tensor(n) for n in ckpt.names("param")}
    state = {"step": ckpt.meta.get("optimizer_step", 0),
             "m": {n: ckpt.tensor(n, "adam_m") for n in ckpt.names("adam_m")},
             "v": {n: ckpt.tensor(n, "adam_v") for n in ckpt.names("adam_v")}}
    for name in ckpt.names("hook"):
        rank, key = name.split("/", 1)
        state.setdefault("hook", {}).setdefault(int(rank), {})[key] = ckpt.tensor(name, "hook")
    return params, state, ckpt.meta


class _Lazy(Mapping):
    """name -> ckpt.tensor(name, kind), read on each lookup."""

    def __init__(self, ckpt, kind):
        self.ckpt, self.kind, self._names = ckpt, kind, ckpt.names(kind)

    def __getitem__(self, name):
        return self.ckpt.tensor(name, self.kind)

    def __iter__(self):
        return iter(self._names)

    def __len__(self):
        return len(self._names)
